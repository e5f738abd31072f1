#!/usr/bin/env bash
# Regenerates tests/data/arch/*.json: what upstream llama.cpp (../shared/anchor, CPU backend, one
# thread) computes on small synthetic models of the architectures vkllm added after the first
# round (qwen3, …). The tests rebuild each model with the same make_model arguments (make_model
# is deterministic) and compare vkllm's greedy tokens and top-1 log-probabilities with these.
#
# usage: scripts/make-arch-refs.sh [CASE…]   (default: every case below; needs a build and the anchor)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shared=$root/../shared
make_model=${VKLLM_MAKE_MODEL:-$root/build/tests/tools/make_model}
out_dir=$root/tests/data/arch
n_gen=32
[ -x "$make_model" ] || { echo "make-arch-refs: $make_model is missing: build first" >&2; exit 1; }
anchor=$(bash "$shared/anchor/setup.sh" 2>/dev/null | tail -1)
[ -f "$anchor/greedy.mjs" ] || { echo "make-arch-refs: the anchor did not install (../shared/anchor/setup.sh)" >&2; exit 1; }

# name | make_model arguments | prompt id (../shared/reference/prompts) | decided threshold
# Random weights give logits with small top-1/top-2 margins, after which a correct implementation
# may legitimately pick another token; --logit-scale widens the logits and the seeds are the
# first of 1–6 (1–4 for the IQ4 types) whose greedy run stays decided longest (a case decided for 0 steps tests nothing).
qwen3_shape="--arch qwen3 --layers 2 --embd 256 --ff 512 --heads 8 --kv-heads 2 --head-dim 64"
# "@shared" stands for ../shared (the tests substitute their own path).
phi3_shape="--arch phi3 --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --rot 48 --attn-factor 1.19 --vocab-from @shared/vocab/ggml-vocab-phi-3.gguf"
# gemma2: a 32-token window on layer 0 (prompts plus 32 generated tokens pass it), attention
# soft-capped at 10 and the logits at 30 (F32) or 120 (quantized: at 30 their margins fall under the
# threshold at every step); post-norms centred at 8 so the layers outweigh the √n_embd-scaled input
# embedding. gemma3: six layers (five window layers, then a global one with base 1e6 and linear
# scaling 8; the window layers keep base 10000). gemma3-q4_k uses seed 2: with seed 1 llama.cpp's
# CPU and Vulkan backends differ by 0.48 in step 17's log-probability (vkllm is 0.15 from Vulkan's).
gemma2_shape="--arch gemma2 --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --head-dim 64 --window 32 --post-norm 8 --attn-softcap 10"
gemma3_shape="--arch gemma3 --layers 6 --embd 256 --ff 512 --heads 4 --kv-heads 2 --head-dim 64 --window 32 --post-norm 8 --rope-base 1000000 --rope-scale 8"
cases=(
  "qwen3-f32--sy-1|$qwen3_shape --type f32 --logit-scale 12 --seed 2|sy-1|0.05"
  "qwen3-f32--sy-2|$qwen3_shape --type f32 --logit-scale 12 --seed 1|sy-2|0.05"
  "qwen3-q8_0--sy-2|$qwen3_shape --type q8_0 --logit-scale 40 --seed 3|sy-2|1.0"
  "qwen3-q4_k--sy-1|$qwen3_shape --type q4_k --logit-scale 40 --seed 3|sy-1|1.0"
  "qwen3-iq4_nl--sy-2|$qwen3_shape --type iq4_nl --logit-scale 40 --seed 4|sy-2|1.0"
  "qwen3-iq4_xs--sy-2|$qwen3_shape --type iq4_xs --logit-scale 40 --seed 1|sy-2|1.0"
  # qwen3 with YaRN (long-context Qwen files): factor 4 over an original context of 4,096, so the
  # ramp runs from pair 10 to 23 of 32 (the pairs below keep their angle, those above are
  # interpolated) and cos and sin take 1 + 0.1·ln 4.
  "qwen3-f32-yarn--sy-2|$qwen3_shape --rope-scale 4 --rope-scaling yarn --orig-ctx 4096 --type f32 --logit-scale 12 --seed 1|sy-2|0.05"
  "qwen3-q8_0-yarn--sy-1|$qwen3_shape --rope-scale 4 --rope-scaling yarn --orig-ctx 4096 --type q8_0 --logit-scale 40 --seed 5|sy-1|1.0"
  # A factor under 1 (llama.cpp's magnitude term is 1 there, not 1 + 0.1·ln 0.5), and yarn_* keys
  # that llama.cpp does not read for these architectures (so they must change nothing).
  "qwen3-f32-yarn-half--sy-1|$qwen3_shape --rope-scale 0.5 --rope-scaling yarn --orig-ctx 4096 --key-f32 rope.scaling.yarn_beta_fast=8 --key-f32 rope.scaling.yarn_attn_factor=2 --type f32 --logit-scale 12 --seed 1|sy-1|0.05"
  # phi3: fused QKV and gate|up, 48 of 64 dims rotated, attn_factor 1.19 (Phi-3-128k's); the long
  # RoPE factors when the context passes --orig-ctx 16, the short ones under 1,000,000. llama.cpp
  # needs phi3's <|end|> token, so the Phi-3 vocabulary. phi3-q4_k-short uses seed 6, not 1: with
  # seed 1 llama.cpp's CPU and Vulkan backends disagree at step 2 (the CPU backend's Q8_K
  # activations move a logit by > 2 at this logit scale; vkllm agrees with the Vulkan backend).
  "phi3-f32-long--sy-2|$phi3_shape --orig-ctx 16 --type f32 --logit-scale 12 --seed 1|sy-2|0.05"
  "phi3-f32-short--sy-2|$phi3_shape --orig-ctx 1000000 --type f32 --logit-scale 12 --seed 2|sy-2|0.05"
  "phi3-q8_0-long--sy-1|$phi3_shape --orig-ctx 16 --type q8_0 --logit-scale 40 --seed 4|sy-1|1.0"
  "phi3-q4_k-short--sy-2|$phi3_shape --orig-ctx 1000000 --type q4_k --logit-scale 40 --seed 6|sy-2|1.0"
  "gemma2-f32--sy-1|$gemma2_shape --final-softcap 30 --type f32 --logit-scale 12 --seed 4|sy-1|0.05"
  "gemma2-f32--sy-2|$gemma2_shape --final-softcap 30 --type f32 --logit-scale 12 --seed 2|sy-2|0.05"
  "gemma2-q8_0--sy-1|$gemma2_shape --final-softcap 120 --type q8_0 --logit-scale 40 --seed 4|sy-1|1.0"
  "gemma2-q4_k--sy-1|$gemma2_shape --final-softcap 120 --type q4_k --logit-scale 40 --seed 2|sy-1|1.0"
  "gemma3-f32--sy-1|$gemma3_shape --type f32 --logit-scale 12 --seed 3|sy-1|0.05"
  "gemma3-f32--sy-2|$gemma3_shape --type f32 --logit-scale 12 --seed 1|sy-2|0.05"
  "gemma3-q8_0--sy-2|$gemma3_shape --type q8_0 --logit-scale 40 --seed 1|sy-2|1.0"
  "gemma3-q4_k--sy-1|$gemma3_shape --type q4_k --logit-scale 40 --seed 2|sy-1|1.0"
  # gemma3 with YaRN on its global layers: the window layers keep scale 1 but take llama.cpp's one
  # attention factor (1 / (1 + 0.1·ln 4) of the global layers' magnitude), and their own base from
  # rope.freq_base_swa, which newer converters write.
  "gemma3-f32-yarn--sy-2|${gemma3_shape/--rope-scale 8/--rope-scale 4 --rope-scaling yarn --orig-ctx 64 --key-f32 rope.freq_base_swa=1000} --type f32 --logit-scale 12 --seed 1|sy-2|0.05"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out_dir"
for c in "${cases[@]}"; do
  IFS='|' read -r name args prompt threshold <<<"$c"
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  model=$tmp/$name.gguf
  # shellcheck disable=SC2086  # the arguments are words
  "$make_model" ${args//@shared/$shared} -o "$model" >&2
  node "$anchor/greedy.mjs" "$model" --prompt-file "$shared/reference/prompts/$prompt.txt" -n "$n_gen" \
    --gpu cpu --threads 1 --top 5 >"$tmp/out.json"
  NAME=$name ARGS=$args PROMPT=$prompt THRESHOLD=$threshold node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const threshold = Number(process.env.THRESHOLD);
    const margins = r.top.map(t => t[0][1] - t[1][1]);
    let decided = margins.findIndex(m => m < threshold);
    if (decided < 0) decided = margins.length;
    const j = {
      case: process.env.NAME,
      source: "llama.cpp v0.4.0 (5b4ebc5) via ../shared/anchor greedy.mjs --gpu cpu --threads 1",
      make_model: process.env.ARGS,
      prompt_id: process.env.PROMPT,
      prompt_tokens: r.prompt_tokens,
      greedy: r.greedy,
      top1_logprob: r.top.map(t => t[0][1]),
      margins,
      decided_threshold: threshold,
      decided_prefix: decided,
    };
    process.stdout.write(JSON.stringify(j, null, 1) + "\n");
  ' "$tmp/out.json" >"$out_dir/$name.json"
  echo "make-arch-refs: $name: $(node -e 'const j=require(process.argv[1]); console.log(j.prompt_tokens.length + " prompt tokens, decided " + j.decided_prefix + "/" + j.greedy.length)' "$out_dir/$name.json")" >&2
done
