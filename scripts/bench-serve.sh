#!/usr/bin/env bash
# The server under load (docs/server.md), in one run of `vkllm serve --parallel 4`:
#   1. decode throughput: one stream alone, then STREAMS streams at once (each TOKENS tokens after
#      a short prompt), ROUNDS times in turns; aggregate completion tokens per second of each, the
#      ratio per round and its median, and the host's CPU steal during each (on a shared host a
#      CPU driver's tok/s moves with it, so a round where the two differ much says little); and
#      the steady rate, STREAMS tokens per median step (the median time between a stream's
#      tokens), which a few slow seconds of a shared host within a run do not move;
#   2. prefix reuse: a request with a PREFIX-token prompt, then one sharing that prefix with
#      another question; cached tokens and time to first token of each (max_tokens 1);
#   3. a long prompt during a stream: while one stream generates, a LONG-token prompt arrives
#      (max_tokens 1); the stream's tokens while it is prefilled and the longest wait between them.
#
# usage: scripts/bench-serve.sh [MODEL]      (default: the 1b q4_0 benchmark model, made if missing)
#        STREAMS=4 TOKENS=32 ROUNDS=9 PREFIX=2000 LONG=300 CTX=2560 scripts/bench-serve.sh MODEL
#        PARTS=throughput scripts/bench-serve.sh     (part 1 only)
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
model=${1:-$(bench_1b_model q4_0)}
streams=${STREAMS:-4}
tokens=${TOKENS:-32}
rounds=${ROUNDS:-9}
prefix=${PREFIX:-2000}
ctx=${CTX:-2560}
bench_require "$model"
bench_workdir

"$vkllm" serve -m "$model" --port 0 --parallel "$streams" --ctx "$ctx" --temp 0 2>"$work/serve.err" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1200); do
  port=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\)/v1.*|\1|p' "$work/serve.err")
  [ -n "$port" ] && break
  kill -0 $server 2>/dev/null || { cat "$work/serve.err" >&2; exit 1; }
  sleep 0.5
done
url="http://127.0.0.1:$port/v1"
now() { date +%s.%N; }
calc() { awk "BEGIN { print $* }"; }
# complete BODY OUT: POSTs a text completion, the response to OUT.
complete() { curl -sf "$url/completions" -H 'Content-Type: application/json' -d "$1" -o "$2"; }
field() { node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); console.log(process.argv[2].split(".").reduce((o,k)=>o[k], j))' "$1" "$2"; }

# Warm-up (pipelines compiled, first-use costs paid) with every stream at once.
for i in $(seq "$streams"); do complete "{\"prompt\":\"Warm up $i\",\"max_tokens\":4}" "$work/w$i.json" & done
wait_all() { for p in "$@"; do wait "$p"; done; }
wait_all $(jobs -p | grep -v "^$server$")

# N streams at once, streamed: end to end, all completion tokens over the wall time (prompts
# included); decode, the tokens that arrive while every stream is generating (after the last
# stream's first token, up to the first stream's last) over that window, as llama-batched-bench's
# S_TG counts the decode phase alone; steady, n tokens per median gap between a stream's tokens
# in that window. Prints "tokens seconds e2e_tok_s decode_tok_s steady_tok_s".
run_streams() {
  # node's http module, not fetch: on these two cores the client competes with the server it
  # measures, and fetch's web streams took ≈ 5.5× the CPU per token event (docs/server.md).
  node - "$url" "$1" "$tokens" <<'JS'
const http = require("http");
const [url, n, tokens] = process.argv.slice(2).map((v, i) => (i ? Number(v) : v));
const target = new URL(url + "/completions");
const stream = (i) => new Promise((resolve, reject) => {
  const body = JSON.stringify({prompt: `Story number ${i}: once upon a time`, max_tokens: tokens, stream: true});
  const req = http.request({host: target.hostname, port: target.port, path: target.pathname, method: "POST",
    headers: {"Content-Type": "application/json", "Content-Length": Buffer.byteLength(body)}}, (res) => {
    const stamps = [];
    let buf = "";
    res.setEncoding("utf8");
    res.on("data", (chunk) => {
      buf += chunk;
      for (let at; (at = buf.indexOf("\n\n")) >= 0; buf = buf.slice(at + 2)) {
        const ev = buf.slice(0, at);
        if (ev.startsWith("data: {") && JSON.parse(ev.slice(6)).choices[0].finish_reason === null) stamps.push(performance.now());
      }
    });
    res.on("end", () => resolve(stamps));
    res.on("error", reject);
  });
  req.on("error", reject);
  req.end(body);
});
(async () => {
  const t0 = performance.now();
  const all = await Promise.all(Array.from({length: n}, (_, i) => stream(i + 1)));
  const t1 = performance.now(), total = all.reduce((s, a) => s + a.length, 0);
  const w0 = Math.max(...all.map((a) => a[0])), w1 = Math.min(...all.map((a) => a[a.length - 1]));
  const inside = all.reduce((s, a) => s + a.filter((t) => t > w0 && t <= w1).length, 0);
  const gaps = [];
  for (const a of all) {
    const w = a.filter((t) => t >= w0 && t <= w1);
    for (let i = 1; i < w.length; i++) gaps.push(w[i] - w[i - 1]);
  }
  gaps.sort((x, y) => x - y);
  const steady = gaps.length ? n / (gaps[Math.floor(gaps.length / 2)] / 1000) : 0;
  console.log(total, ((t1 - t0) / 1000).toFixed(3), (total / ((t1 - t0) / 1000)).toFixed(3), (inside / ((w1 - w0) / 1000)).toFixed(3),
              steady.toFixed(3));
})();
JS
}
# The host's CPU steal ticks and all ticks so far (/proc/stat's "cpu" line), and the stolen share
# between two such readings as a percentage ("-" where there is no /proc/stat).
cpu_ticks() { awk '/^cpu /{t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t; exit}' /proc/stat 2>/dev/null || true; }
steal_pct() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ");
  print (y[2] > x[2] ? sprintf("%.0f%%", 100 * (y[1] - x[1]) / (y[2] - x[2])) : "-") }' || echo -; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END { print v[int((NR + 1) / 2)] }'; }
printf 'model %s, --parallel %d, %d tokens per stream, greedy, %d rounds in turns\n' "$(basename "$model")" "$streams" "$tokens" "$rounds"
printf '| round | streams | tokens | seconds | tok/s end to end | decode tok/s | decode ratio | steady tok/s | steady ratio | host CPU steal |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
e2e_ratios="" dec_ratios="" steady_ratios=""
for r in $(seq "$rounds"); do
  c0=$(cpu_ticks); read -r tok1 s1 e2e1 dec1 st1 < <(run_streams 1); c1=$(cpu_ticks)
  read -r tokn sn e2en decn stn < <(run_streams "$streams"); c2=$(cpu_ticks)
  printf '| %d | 1 | %d | %.2f | %.2f | %.2f | 1.00× | %.2f | 1.00× | %s |\n' "$r" "$tok1" "$s1" "$e2e1" "$dec1" "$st1" "$(steal_pct "$c0" "$c1")"
  printf '| %d | %d | %d | %.2f | %.2f | %.2f | %.2f× | %.2f | %.2f× | %s |\n' "$r" "$streams" "$tokn" "$sn" "$e2en" "$decn" \
    "$(calc "$decn / $dec1")" "$stn" "$(calc "$stn / $st1")" "$(steal_pct "$c1" "$c2")"
  e2e_ratios+=" $(calc "$e2en / $e2e1")" dec_ratios+=" $(calc "$decn / $dec1")" steady_ratios+=" $(calc "$stn / $st1")"
done
printf 'median over the rounds: decode %.2f×, steady %.2f×, end to end %.2f× (%d streams against 1)\n' \
  "$(echo "$dec_ratios" | median)" "$(echo "$steady_ratios" | median)" "$(echo "$e2e_ratios" | median)" "$streams"
[ "${PARTS:-all}" = throughput ] && exit 0

# Prefix reuse: PREFIX tokens of a manual (repeated sentences), then two questions.
sentence="The pump must be primed before the first start, and the valve must be closed while the tank fills. "
manual=""
for _ in $(seq 50); do manual+="$sentence"; done
per50=$(printf '%s' "$manual" >"$work/m.txt"; count_tokens "$model" "$work/m.txt")
manual=""
for _ in $(seq $(( prefix * 50 / per50 + 2 ))); do manual+="$sentence"; done
ask() {  # QUESTION OUT: one token after the manual and the question; prints seconds
  local t0 t1
  t0=$(now)
  node -e 'process.stdout.write(JSON.stringify({prompt: process.argv[1] + process.argv[2], max_tokens: 1}))' "$manual" "$1" >"$work/q.json"
  curl -sf "$url/completions" -H 'Content-Type: application/json' --data-binary @"$work/q.json" -o "$2"
  t1=$(now)
  calc "$t1 - $t0"
}
ta=$(ask "Question: what comes first?" "$work/a.json")
tb=$(ask "Question: when is the valve closed?" "$work/b.json")
printf '\n| request | prompt tokens | cached | time to first token s |\n|---|---:|---:|---:|\n'
printf '| first | %s | %s | %.2f |\n' "$(field "$work/a.json" usage.prompt_tokens)" "$(field "$work/a.json" usage.prompt_tokens_details.cached_tokens)" "$ta"
printf '| same prefix | %s | %s | %.2f |\n' "$(field "$work/b.json" usage.prompt_tokens)" "$(field "$work/b.json" usage.prompt_tokens_details.cached_tokens)" "$tb"
printf 'TTFT ratio: %.1f×\n' "$(calc "$ta / $tb")"

# A long prompt while a stream generates: the stream goes on between the prompt's prefill chunks.
long=${LONG:-300}
node - "$url" "$(( long * 50 / per50 + 1 ))" "$sentence" <<'JS'
const [url, n, sentence] = process.argv.slice(2);
const post = (body) => fetch(url + "/completions", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
(async () => {
  const stamps = [];
  let long, settled = false;
  const res = await post({prompt: "Story: once upon a time", max_tokens: 400, stream: true});
  const reader = res.body.getReader();
  for (let buf = ""; ;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += new TextDecoder().decode(value);
    for (let at; (at = buf.indexOf("\n\n")) >= 0; buf = buf.slice(at + 2))
      if (buf.startsWith("data: {")) stamps.push(performance.now());
    if (stamps.length >= 3 && !long) {
      const t0 = performance.now();
      long = post({prompt: sentence.repeat(Number(n)), max_tokens: 1}).then(async (r) => {
        const t1 = performance.now(), j = await r.json();
        settled = true;
        return {t0, t1, j};
      });
    }
    if (settled) break;
  }
  reader.cancel().catch(() => {});
  const {t0, t1, j} = await long;
  const during = stamps.filter((t) => t >= t0 && t <= t1), pts = [t0, ...during, t1];
  const gap = Math.max(...pts.slice(1).map((t, i) => t - pts[i]));
  console.log(`\n| long prompt tokens | its time to first token s | stream tokens meanwhile | longest wait between them s |\n|---:|---:|---:|---:|`);
  console.log(`| ${j.usage.prompt_tokens} | ${((t1 - t0) / 1000).toFixed(2)} | ${during.length} | ${(gap / 1000).toFixed(2)} |`);
})();
JS
