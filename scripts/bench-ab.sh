#!/usr/bin/env bash
# Two vkllm builds on the same `vkllm bench` at the same time, each on a core of its own (one
# lavapipe thread, the process pinned with taskset), so that both see the machine's phase. On a
# CPU driver this kind of machine changes speed by 1.5× between minutes, and more for a
# memory-bound kernel than for a compute-bound one, so two builds run one after the other compare
# phases more than code (docs/performance.md, "How to measure"). Each round prints both builds'
# test lines and, when the arguments include --profile, their GPU ms per op side by side with the
# ratio (this build over BASE); an op that only BASE ran (a kernel renamed or replaced) follows,
# with "-" for this build.
#
# usage: BASE=/path/to/other/vkllm scripts/bench-ab.sh BENCH-ARGS...
#   BASE=/tmp/old/vkllm ROUNDS=3 scripts/bench-ab.sh -m models/bench-1b-q4_0.gguf -p 0 -n 32 -r 2 --profile
# For CPU drivers on hosts with at least two cores (LP_NUM_THREADS is lavapipe's); ROUNDS defaults
# to 2. The two sides still share the memory bus and caches: compare ops whose code differs against
# ops whose code does not (this/base of an unchanged op is the pair's own bias).
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
base=${BASE:?"BASE=<the other build's vkllm> scripts/bench-ab.sh BENCH-ARGS..."}
rounds=${ROUNDS:-2}
[ -x "$base" ] || { echo "$bench: BASE=$base is not an executable" >&2; exit 1; }
[ $# -gt 0 ] || { echo "usage: BASE=<vkllm> scripts/bench-ab.sh BENCH-ARGS..." >&2; exit 1; }
bench_require
bench_workdir

# The "GPU time per op" rows of a bench's stderr as "table<TAB>op<TAB>ms", the table named by its
# header's depth ("" for a run without --ctx-fill).
ops() {
  awk '/GPU time per op/ { t = $0; sub(/.*\(measured tests/, "", t); sub(/\).*/, "", t); next }
       NF == 4 && $4 ~ /%$/ && $2 ~ /^[0-9.]+$/ { printf "%s\t%s\t%s\n", t, $1, $2 }' "$1"
}

for r in $(seq "$rounds"); do
  # The builds swap cores every round, so that a core's own bias (about 20% on the machine that
  # wrote this) falls on each side in turn.
  cb=$(((r + 1) % 2)) ct=$((r % 2))
  LP_NUM_THREADS=1 taskset -c "$cb" "$base" bench "$@" >"$work/base.out" 2>"$work/base.err" &
  a=$!
  LP_NUM_THREADS=1 taskset -c "$ct" "$vkllm" bench "$@" >"$work/this.out" 2>"$work/this.err" &
  b=$!
  wait "$a" || { echo "$bench: BASE failed:" >&2; tail -3 "$work/base.err" >&2; exit 1; }
  wait "$b" || { echo "$bench: this build failed:" >&2; tail -3 "$work/this.err" >&2; exit 1; }
  echo "## round $r of $rounds (base on CPU $cb, this build on CPU $ct)"
  for w in base this; do
    echo "$w:"
    grep -E ' (pp|tg)[0-9]+|against' "$work/$w.out" | sed 's/^/  /'
  done
  ops "$work/base.err" >"$work/base.ops"
  ops "$work/this.err" >"$work/this.ops"
  if [ -s "$work/this.ops" ]; then
    printf '| %-14s | %-28s | %10s | %10s | %6s |\n' "at" "op" "base ms" "this ms" "this/base"
    printf '|%s|%s|%s|%s|%s|\n' "----------------" "------------------------------" "-----------:" "-----------:" "-------:"
    awk -F'\t' 'NR == FNR { ms[$1 FS $2] = $3; next }
                { b = ms[$1 FS $2]; r = (b > 0) ? sprintf("%.3f", $3 / b) : "-"
                  printf "| %-14s | %-28s | %10s | %10.1f | %6s |\n", $1, $2, (b == "") ? "-" : b, $3, r }' "$work/base.ops" "$work/this.ops"
    # Ops that only the base build ran (a kernel renamed or replaced).
    awk -F'\t' 'NR == FNR { seen[$1 FS $2] = 1; next }
                !(($1 FS $2) in seen) { printf "| %-14s | %-28s | %10s | %10s | %6s |\n", $1, $2, $3, "-", "-" }' "$work/this.ops" "$work/base.ops"
  fi
done
