#!/usr/bin/env bash
# vkllm on a lent GPU machine that has no packages and no network (the device machine of
# docs/performance.md, "On a GPU"). Everything it needs travels in one folder made here:
#
#   scripts/bench-gpu.sh pack [DIR]   here, after a build: DIR (default .gpu, git-ignored) gets
#                                     vkllm, make_model, the shared libraries they load beyond
#                                     glibc (the Vulkan loader among them; libstdc++ as a fallback)
#                                     and the vocabulary the models are made with (about 17 MiB).
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
# TG (128) set the test sizes, REPS (1) the repetitions.
set -euo pipefail
mode=${1:-}
dir=${2:-.gpu}
here="$(cd "$(dirname "$0")/.." && pwd)"
name=bench-gpu

pack() {
  local vkllm="$here/build/vkllm" make_model="$here/build/tests/tools/make_model"
  local vocab="${VKLLM_SHARED_DIR:-$here/../shared}/vocab/ggml-vocab-llama-spm.gguf"
  for f in "$vkllm" "$make_model" "$vocab"; do [ -f "$f" ] || { echo "$name: $f is missing (build first)" >&2; exit 1; }; done
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib" "$dir/lib-fallback"
  cp "$vkllm" "$make_model" "$dir/bin/"
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
  echo "$name: packed $(du -sh "$dir" | cut -f1) into $dir; on the GPU machine: bash $dir/bench-gpu.sh run $dir" >&2
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

run() {
  dir="$(cd "$dir" && pwd)"
  local vkllm="$dir/bin/vkllm" make_model="$dir/bin/make_model" vocab="$dir/ggml-vocab-llama-spm.gguf"
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! "$vkllm" --version >/dev/null 2>&1; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dir/lib-fallback"; fi
  # NVIDIA's driver files where the lent machines keep them, if the loader finds none by itself.
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES=$icd; fi
  "$vkllm" devices >&2 || { echo "$name: vkllm finds no Vulkan device" >&2; exit 1; }
  local device
  device=$("$vkllm" devices 2>/dev/null | sed -n 's/^device 0: //p' | head -1)
  local peak=${PEAK_GBS:-$(peak_gbs "$device")}
  local models_dir=${MODELS_DIR:-/tmp/vkllm-gpu-models} pp=${PP:-512} tg=${TG:-128} reps=${REPS:-1} layers=${LAYERS:-32}
  mkdir -p "$models_dir"
  local anchor_ok=0
  if [ -n "${ANCHOR:-}" ] && [ -f "${ANCHOR}/bench.mjs" ] && command -v node >/dev/null; then anchor_ok=1; fi
  echo "$(date -u +%Y-%m-%d) · ${device:-device 0} · pp$pp, tg$tg, median of $reps$( ((peak > 0)) && echo " · bandwidth $peak GB/s")"
  printf '| %-12s | %10s | %10s | %10s | %8s |%s\n' model "pp tok/s" "tg tok/s" "tg GB/s" "of peak" \
    "$( ((anchor_ok)) && printf ' %10s | %10s | %6s | %6s |' "llama pp" "llama tg" "pp ×" "tg ×")"
  printf '|--------------|-----------:|-----------:|-----------:|---------:|%s\n' "$( ((anchor_ok)) && echo '-----------:|-----------:|-------:|-------:|')"
  for m in ${MODELS:-1b-q4_0 1b-q4_k 1b-q8_0 1b-q6_k 8b-q4_0}; do
    local shape=${m%%-*} type=${m#*-} file="$models_dir/$m.gguf" args
    case "$shape" in
      1b) args=(--preset 1b) ;;
      8b) args=(--layers "$layers" --embd 4096 --ff 14336 --heads 32 --kv-heads 8) ;;
      tiny) args=(--layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2) ;;
      *) echo "$name: unknown model shape '$shape' in '$m' (1b, 8b, tiny)" >&2; exit 1 ;;
    esac
    if [ ! -f "$file" ]; then
      local t0=$SECONDS
      "$make_model" "${args[@]}" --type "$type" --vocab-from "$vocab" -o "$file.part" >&2
      mv "$file.part" "$file"
      echo "$name: made $m in $((SECONDS - t0)) s" >&2
    fi
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

case "$mode" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: $0 pack|run [DIR]   (see the top of this file)" >&2; exit 2 ;;
esac
