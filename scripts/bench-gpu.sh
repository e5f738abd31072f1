#!/usr/bin/env bash
# vkllm on a lent GPU machine that has no packages and no network (the device machine of
# docs/performance.md, "On a GPU"). Everything it needs travels in one folder made here:
#
#   scripts/bench-gpu.sh pack [DIR]   here, after a build: DIR (default .gpu, git-ignored) gets
#                                     vkllm, make_model, the shared libraries they load beyond
#                                     glibc (the Vulkan loader among them; libstdc++ as a fallback)
#                                     and the vocabulary the models are made with (about 6 MiB, xz);
#                                     the Vulkan test programs with the part of ../shared they read
#                                     (SHARED_MODELS; about 7 MiB, xz); and, where the anchor is
#                                     installed (ANCHOR_DIR, default its setup.sh folder), node and
#                                     the anchor without its CPU-only package (about 38 MiB, xz).
#   scripts/bench-gpu.sh check [DIR]  there: the packed test programs, each under a time limit, with
#                                     ../shared and vkllm where they were built to look; one line each.
#   scripts/bench-gpu.sh all [DIR]    there: all of a lease's work (see all() below).
#   scripts/bench-gpu.sh ab [DIR]     there: decode of every model of MODELS and `bench --ops` by
#                                     this build and by the one packed from BASE_VKLLM (another
#                                     build's vkllm, packed as bin/vkllm.base), taking turns.
#   scripts/bench-gpu.sh models [DIR] there: only makes the models of MODELS (see run).
#   scripts/bench-gpu.sh tune [DIR]   there: decode of every model of MODELS under each of matvec's
#                                     GPU tunings in TUNINGS (VKLLM_MATVEC), one row each.
#   scripts/bench-gpu.sh parallel [DIR]  there: bench --parallel 1 and 4 on the first and last
#                                     models, 4 columns per matvec workgroup against 1.
#   scripts/bench-gpu.sh run [DIR]    there: makes the benchmark models in $MODELS_DIR (default
#                                     /tmp/vkllm-gpu-models), runs `vkllm bench` on each and prints
#                                     one table: prefill and decode tok/s, decode GB/s and its share
#                                     of the card's memory bandwidth where the card is known (or
#                                     PEAK_GBS is set). With node and the anchor's folder in ANCHOR,
#                                     llama.cpp's Vulkan backend runs on each model too, with ratios.
#
# MODELS: which models, as NAME-TYPE words (default "1b-q4_0 1b-q4_k 1b-q8_0 1b-q6_k 8b-q4_0"):
# 1b is make_model's preset, 8b the 8B shape (LAYERS of them, default 32: 4,096 wide, 14,336
# feed-forward, 32/8 heads), tiny a 2-layer 256-wide model for trying the script out. PP (512) and
# TG (128) set the test sizes, REPS (1) the repetitions. OPS_SIZE (12288) is `bench --ops`' matrix
# size: at 4,096 a Q4_0 matrix (9 MiB) sits in a large GPU's L2 cache, at 12,288 (81 MiB) it does not.
set -euo pipefail
mode=${1:-}
dir=${2:-.gpu}
models_dir=${MODELS_DIR:-/tmp/vkllm-gpu-models}
models=${MODELS:-1b-q4_0 1b-q4_k 1b-q8_0 1b-q6_k 8b-q4_0}
ops_size=${OPS_SIZE:-12288}
here="$(cd "$(dirname "$0")/.." && pwd)"
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
name=bench-gpu

pack() {
  local vkllm="$here/build/vkllm" make_model="$here/build/tests/tools/make_model"
  local vocab="${VKLLM_SHARED_DIR:-$here/../shared}/vocab/ggml-vocab-llama-spm.gguf"
  for f in "$vkllm" "$make_model" "$vocab"; do [ -f "$f" ] || { echo "$name: $f is missing (build first)" >&2; exit 1; }; done
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib" "$dir/lib-fallback"
  cp "$vkllm" "$make_model" "$dir/bin/"
  if [ -n "${BASE_VKLLM:-}" ]; then cp "$BASE_VKLLM" "$dir/bin/vkllm.base"; fi
  cp "$vocab" "$dir/"
  cp "$here/scripts/bench-gpu.sh" "$dir/"
  # Every library the two load except glibc's own; the C++ runtime only as a fallback (the
  # machine's own is newer, and its GPU driver may need that one).
  ldd "$vkllm" "$make_model" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*) ;;
      libstdc++.so.*|libgcc_s.so.*) cp -L "$lib" "$dir/lib-fallback/" ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
  # The programs and libraries as one archive (a third of their size), unpacked by setup_env.
  tar -C "$dir" -cf - bin lib lib-fallback | xz -T0 -6 >"$dir/programs.tar.xz"
  rm -rf "$dir/bin" "$dir/lib" "$dir/lib-fallback"
  pack_tests
  pack_anchor
  echo "$name: packed $(du -sh "$dir" | cut -f1) into $dir; on the GPU machine: bash $dir/bench-gpu.sh all $dir" >&2
}

# The test programs that drive the device (not the parsers', the CLI's or the server's), the paths
# they were built to find ../shared and vkllm at, and the part of ../shared they read: the
# references, the vocabulary and the models in SHARED_MODELS (the others' cases skip, naming them).
test_programs=${TEST_PROGRAMS:-test_vulkan_runtime test_ops_elementwise test_kv_cache test_session test_engine_reference test_ops_matmul test_ops_attention}
pack_tests() {
  local shared="${VKLLM_SHARED_DIR:-$here/../shared}"
  tar -C "$here/build/tests" -cf - $test_programs | xz -T0 -6 >"$dir/tests.tar.xz"
  {
    echo "shared=$(sed -n 's/.*-DVKLLM_SHARED_DIR=\\"\([^\\]*\)\\".*/\1/p' "$here/build/build.ninja" | head -1)"
    echo "binary=$(sed -n 's/.*-DVKLLM_BINARY=\\"\([^\\]*\)\\".*/\1/p' "$here/build/build.ninja" | head -1)"
  } >"$dir/paths.txt"
  local files=()
  for m in ${SHARED_MODELS:-stories260K synth-llama-q4_0 synth-llama-q4_k_m synth-llama-q2_k}; do
    files+=("models/$m.gguf")
  done
  tar -C "$shared" -cf - reference vocab/ggml-vocab-llama-spm.gguf "${files[@]}" | xz -T0 -6 >"$dir/shared.tar.xz"
}

# node and the anchor (../shared/anchor/setup.sh's folder) for llama.cpp's side of the table.
pack_anchor() {
  local anchor=${ANCHOR_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vkllm-anchor}
  if [ ! -f "$anchor/bench.mjs" ] || ! command -v node >/dev/null; then
    echo "$name: no anchor at $anchor (../shared/anchor/setup.sh installs it): llama.cpp will not run there" >&2
    return
  fi
  xz -T0 -6 -c "$(readlink -f "$(command -v node)")" >"$dir/node.xz"
  tar -C "$anchor" -cf - --exclude='node_modules/@node-llama-cpp/linux-x64' --exclude='gitRelease.bundle' \
    bench.mjs package.json node_modules | xz -T0 -6 >"$dir/anchor.tar.xz"
}

# Unpacks what pack_anchor packed into /tmp/vkllm-anchor and points ANCHOR and PATH at it.
unpack_anchor() {
  [ -f "$dir/anchor.tar.xz" ] || return 0
  local a=/tmp/vkllm-anchor
  if [ ! -x "$a/bin/node" ]; then
    mkdir -p "$a/bin"
    xz -dc "$dir/node.xz" >"$a/bin/node" && chmod +x "$a/bin/node"
    tar -C "$a" -xJf "$dir/anchor.tar.xz"
  fi
  export ANCHOR=$a PATH="$a/bin:$PATH"
}

setup_env() {
  dir="$(cd "$dir" && pwd)"
  # (Under a lock: two modes started at once, `models &` and `check`, must not unpack over each other.)
  (flock 9; [ -x "$dir/bin/vkllm" ] || tar -C "$dir" -xJf "$dir/programs.tar.xz") 9>"$dir/.unpack.lock"
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! "$dir/bin/vkllm" --version >/dev/null 2>&1; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dir/lib-fallback"; fi
  # NVIDIA's driver files where the lent machines keep them, if the loader finds none by itself.
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES=$icd; fi
}

check() {
  setup_env
  local t=/tmp/vkllm-tests shared binary
  mkdir -p "$t"
  tar -C "$t" -xJf "$dir/tests.tar.xz"
  shared=$(sed -n 's/^shared=//p' "$dir/paths.txt")
  binary=$(sed -n 's/^binary=//p' "$dir/paths.txt")
  mkdir -p "$shared" "$(dirname "$binary")"
  tar -C "$shared" -xJf "$dir/shared.tar.xz"
  [ -e "$binary" ] || ln -s "$dir/bin/vkllm" "$binary"
  local prog rc failed=0
  for prog in $test_programs; do
    local t0=$SECONDS
    set +e
    # (Line-buffered where stdbuf exists: a program stopped at its limit still leaves its log.)
    $(command -v stdbuf >/dev/null && echo stdbuf -oL) timeout "${TEST_TIMEOUT:-120}" "$t/$prog" >"$t/$prog.log" 2>&1
    rc=$?
    set -e
    echo "$name: $prog: rc $rc in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \] [0-9]+ test' "$t/$prog.log" | tr '\n' ' ')"
    if [ $rc -ne 0 ]; then failed=1; grep -E '^\[  FAILED  \]|Failure|rror' "$t/$prog.log" | head -40 || true; fi
  done
  return $failed
}

# The card's memory bandwidth in GB/s, from its name (0: unknown).
peak_gbs() {
  case "$1" in
    *H200*) echo 4800 ;;
    *H100*SXM*|*H100\ 80GB\ HBM3*) echo 3350 ;;
    *H100*) echo 2000 ;;
    *A100*) echo 2039 ;;
    *"RTX 4090"*) echo 1008 ;;
    *) echo 0 ;;
  esac
}

# Makes every model of MODELS that $models_dir lacks, all at once (one process each).
make_models() {
  local m make_model="$dir/bin/make_model" vocab="$dir/ggml-vocab-llama-spm.gguf" layers=${LAYERS:-32} pids=()
  mkdir -p "$models_dir"
  for m in $models; do
    local shape=${m%%-*} type=${m#*-} file="$models_dir/$m.gguf" args
    [ -f "$file" ] && continue
    case "$shape" in
      1b) args=(--preset 1b) ;;
      8b) args=(--layers "$layers" --embd 4096 --ff 14336 --heads 32 --kv-heads 8) ;;
      tiny) args=(--layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2) ;;
      *) echo "$name: unknown model shape '$shape' in '$m' (1b, 8b, tiny)" >&2; exit 1 ;;
    esac
    (t0=$SECONDS; "$make_model" "${args[@]}" --type "$type" --vocab-from "$vocab" -o "$file.part" >/dev/null &&
      mv "$file.part" "$file" && echo "$name: made $m in $((SECONDS - t0)) s" >&2) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}

run() {
  setup_env
  unpack_anchor
  local vkllm="$dir/bin/vkllm"
  "$vkllm" devices >&2 || { echo "$name: vkllm finds no Vulkan device" >&2; exit 1; }
  local device
  device=$("$vkllm" devices 2>/dev/null | sed -n 's/^device 0: //p' | head -1)
  local peak=${PEAK_GBS:-$(peak_gbs "$device")}
  local pp=${PP:-512} tg=${TG:-128} reps=${REPS:-1}
  local anchor_ok=0
  if [ -n "${ANCHOR:-}" ] && [ -f "${ANCHOR}/bench.mjs" ] && command -v node >/dev/null; then anchor_ok=1; fi
  echo "$(date -u +%Y-%m-%d) · ${device:-device 0} · pp$pp, tg$tg, median of $reps$( ((peak > 0)) && echo " · bandwidth $peak GB/s")"
  printf '| %-12s | %10s | %10s | %10s | %8s |%s\n' model "pp tok/s" "tg tok/s" "tg GB/s" "of peak" \
    "$( ((anchor_ok)) && printf ' %10s | %10s | %6s | %6s |' "llama pp" "llama tg" "pp ×" "tg ×")"
  printf '|--------------|-----------:|-----------:|-----------:|---------:|%s\n' "$( ((anchor_ok)) && echo '-----------:|-----------:|-------:|-------:|')"
  make_models
  for m in $models; do
    local file="$models_dir/$m.gguf"
    local v
    v=$("$vkllm" bench -m "$file" -p "$pp" -n "$tg" -r "$reps" --json 2>/dev/null)
    local vpp vtg vgb
    vpp=$(json_num "$v" prefill.tok_s)
    vtg=$(json_num "$v" decode.tok_s)
    vgb=$(json_num "$v" decode.effective_gb_s)
    local row
    row=$(awk -v n="$m" -v a="$vpp" -v c="$vtg" -v g="$vgb" -v p="$peak" \
      'BEGIN { printf "| %-12s | %10.2f | %10.2f | %10.1f | %8s |", n, a, c, g, (p > 0 ? sprintf("%.0f%%", 100 * g / p) : "-") }')
    if ((anchor_ok)); then
      local a app atg
      a=$(node "$ANCHOR/bench.mjs" "$file" --gpu vulkan -p "$pp" -n "$tg" --reps "$reps" --warmup 1 2>/dev/null | tail -1)
      app=$(json_num "$a" llama_perf_pp_tok_s)
      atg=$(json_num "$a" llama_perf_tg_tok_s)
      row+=$(awk -v a="$vpp" -v b="$app" -v c="$vtg" -v d="$atg" \
        'BEGIN { printf " %10.2f | %10.2f | %5.2fx | %5.2fx |", b, d, a / b, c / d }')
    fi
    echo "$row"
  done
}

# json_num JSON PATH: the number at a dotted PATH of a JSON object ("nan" when absent), with
# whatever the machine has (python3 on the lent machines, node here).
json_num() {
  if command -v python3 >/dev/null; then
    python3 -c 'import json, sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."): v = v.get(k) if isinstance(v, dict) else None
print("nan" if v is None else v)' "$1" "$2"
  else
    node -e 'let v = JSON.parse(process.argv[1]); for (const k of process.argv[2].split(".")) v = v == null ? v : v[k]; console.log(v == null ? "nan" : v)' "$1" "$2"
  fi
}

# Everything one lease should do, in the order that keeps the GPU busy and what matters first: the
# models are made while the tests run (the quick programs first; on an H200 test_ops_matmul took
# ≈ 80 s and test_ops_attention ≈ 170 s, most of it the NVIDIA compiler building the CPU drivers'
# unrolled kernels); then `tune` (matvec's shapes and 8-bit x); then the table with the best tuning
# (VKLLM_MATVEC) and `parallel` under it; then, on the largest model, decode over a 4,096-token
# cache (--profile: which op grows with depth) and `bench --ops` under the same tuning. Each step
# has a time limit, so that one hang costs only its own. About 9 minutes on an H200
# (docs/performance.md): a call's 600 s cut what runs past them.
all() {
  setup_env
  local vkllm="$dir/bin/vkllm"
  make_models >"$models_dir.log" 2>&1 &
  local maker=$!
  TEST_TIMEOUT=${TEST_TIMEOUT:-200} timeout "${CHECK_TIMEOUT:-280}" bash "$self" check "$dir" || echo "$name: check: rc $?"
  wait "$maker" || echo "$name: making the models failed: $(tail -3 "$models_dir.log")"
  cat "$models_dir.log" >&2
  REPS=${TUNE_REPS:-2} TG=${TUNE_TG:-64} timeout "${TUNE_TIMEOUT:-150}" bash "$self" tune "$dir" || echo "$name: tune: rc $?"
  local best
  best=$(cat "$models_dir/best-tuning" 2>/dev/null || true)
  echo "$name: the table, the profile and bench --ops with VKLLM_MATVEC=\"$best\""
  export VKLLM_MATVEC=$best
  timeout "${RUN_TIMEOUT:-150}" bash "$self" run "$dir" || echo "$name: run: rc $?"
  timeout "${PARALLEL_TIMEOUT:-90}" bash "$self" parallel "$dir" || echo "$name: parallel: rc $?"
  echo "$name: speculative decoding, vkllm alone (scripts/bench-spec.sh, docs/speculative.md)"
  VKLLM_BIN="$vkllm" ANCHOR=0 timeout "${SPEC_TIMEOUT:-60}" bash "$(dirname "$self")/bench-spec.sh" "$models_dir/${models%% *}.gguf" ||
    echo "$name: spec: rc $?"
  local last=${models##* }
  local big="$models_dir/$last.gguf"
  echo "$name: $last, decode over 4,096 cached tokens"
  timeout 60 "$vkllm" bench -m "$big" -p 0 -n 32 -r 1 --ctx-fill 0,4096 -c 4200 --profile 2>&1 || echo "$name: ctx-fill: rc $?"
  echo "$name: bench --ops"
  timeout 60 "$vkllm" bench --ops --ops-size "$ops_size" --no-matmul 2>&1 || echo "$name: ops: rc $?"
}

# The server's decode step (bench --parallel: one forward pass for N sequences) of the first and
# last models of MODELS, 1 and 4 sequences, under VKLLM_MATVEC with cols=4 (each piece of the
# weights read once for a workgroup's 4 columns) and cols=1 (a workgroup layer per column), taking
# turns: tok/s of all sequences together.
parallel() {
  setup_env
  local vkllm="$dir/bin/vkllm" m cols n out
  local base=${VKLLM_MATVEC:-} pick=${models%% *}
  [ "${models##* }" = "$pick" ] || pick="$pick ${models##* }"
  make_models
  for m in $pick; do
    for cols in 4 1; do
      for n in 1 4; do
        out=$(VKLLM_MATVEC="${base:+$base,}cols=$cols" timeout 40 "$vkllm" bench -m "$models_dir/$m.gguf" -p 0 -n 64 -r 1 \
          --parallel "$n" --json 2>/dev/null) || out='{}'
        printf '%s: parallel %s cols=%s sequences=%s: %.2f tok/s\n' "$name" "$m" "$cols" "$n" "$(json_num "$out" decode.tok_s)"
      done
    done
  done
}

# Decode tok/s of `vkllm` ($1) on a model ($2), under a time limit; 0 when it fails.
decode_tok_s() {
  local out
  out=$(timeout 120 "$1" bench -m "$2" -p 0 -n "${TG:-128}" -r "${REPS:-3}" --json 2>/dev/null) || { echo 0; return; }
  json_num "$out" decode.tok_s 2>/dev/null | sed 's/^nan$/0/' || echo 0
}

# This build against the packed base build (bin/vkllm.base): decode (tg TG, REPS repetitions) of each
# model, the two taking turns; decode over a 4,096-token cache on the last model (unless DEPTH=0);
# then each one's `bench --ops` (unless OPS=0).
ab() {
  setup_env
  local vkllm="$dir/bin/vkllm" base="$dir/bin/vkllm.base" m
  [ -x "$base" ] || { echo "$name: no base build packed (BASE_VKLLM=... $0 pack)" >&2; exit 1; }
  make_models
  printf '| %-12s | %12s | %12s | %6s |\n' model "base tg/s" "this tg/s" "x"
  printf '|--------------|-------------:|-------------:|-------:|\n'
  for m in $models; do
    local file="$models_dir/$m.gguf" a b
    a=$(decode_tok_s "$base" "$file")
    b=$(decode_tok_s "$vkllm" "$file")
    awk -v n="$m" -v a="$a" -v b="$b" 'BEGIN { printf "| %-12s | %12.2f | %12.2f | %6s |\n", n, a, b, (a > 0 ? sprintf("%.2fx", b / a) : "-") }'
  done
  if [ "${DEPTH:-1}" = 1 ]; then
    local big="$models_dir/${models##* }.gguf" which
    for which in base this; do
      echo "$name: $which, ${models##* } decode over 4,096 cached tokens"
      timeout 120 "$([ $which = base ] && echo "$base" || echo "$vkllm")" bench -m "$big" -p 0 -n 32 -r 1 --ctx-fill 0,4096 -c 4200 --profile 2>&1 ||
        echo "$name: ctx-fill: rc $?"
    done
  fi
  [ "${OPS:-1}" = 1 ] || return 0
  echo "$name: base, bench --ops"
  timeout 120 "$base" bench --ops --ops-size "$ops_size" 2>&1 || echo "$name: ops: rc $?"
  echo "$name: this build, bench --ops"
  timeout 120 "$vkllm" bench --ops --ops-size "$ops_size" 2>&1 || echo "$name: ops: rc $?"
}

# matvec.comp's GPU tunings (VKLLM_MATVEC, core/kernels/ops.h's MatvecTuning) against each other:
# decode tok/s of each model of MODELS under each of TUNINGS, taking turns, one row per tuning with
# its geometric mean over the first row (by default: the default shape, then with 8-bit x, then
# shapes near it with 8-bit x). The best row's tuning is written to $models_dir/best-tuning.
tunings=${TUNINGS:-"q8x=0 q8x=1 wg=128,in_flight=4,rps=1,split=2,q8x=1 wg=256,in_flight=2,rps=2,split=4,q8x=1 wg=128,in_flight=1,rps=2,split=4,q8x=1 wg=64,in_flight=4,rps=1,split=1,q8x=1"}
tune() {
  setup_env
  local vkllm="$dir/bin/vkllm" m t
  make_models
  printf '| %-36s |' tuning
  for m in $models; do printf ' %10s |' "$m"; done
  printf ' %6s |\n' "x"
  local first=() best="" best_x=0
  for t in $tunings; do
    local row=() i=0 x=1
    for m in $models; do
      row+=("$(VKLLM_MATVEC=$t decode_tok_s "$vkllm" "$models_dir/$m.gguf")")
    done
    ((${#first[@]})) || first=("${row[@]}")
    x=$(awk -v a="${first[*]}" -v b="${row[*]}" 'BEGIN { n = split(a, p, " "); split(b, q, " "); s = 0; k = 0
      for (i = 1; i <= n; ++i) if (p[i] > 0 && q[i] > 0) { s += log(q[i] / p[i]); ++k }
      printf "%.3f", k ? exp(s / k) : 0 }')
    printf '| %-36s |' "$t"
    for i in "${row[@]}"; do printf ' %10.2f |' "$i"; done
    printf ' %5sx |\n' "$x"
    if awk -v a="$x" -v b="$best_x" 'BEGIN { exit !(a > b) }'; then best=$t; best_x=$x; fi
  done
  echo "$best" >"$models_dir/best-tuning"
  echo "$name: best tuning $best (${best_x}x the first)"
}

case "$mode" in
  pack) pack ;;
  check) check ;;
  all) all ;;
  run) run ;;
  ab) ab ;;
  tune) tune ;;
  parallel) parallel ;;
  models) setup_env; make_models ;;
  *) echo "usage: $0 pack|check|run|all|ab|tune|parallel|models [DIR]   (see the top of this file)" >&2; exit 2 ;;
esac
