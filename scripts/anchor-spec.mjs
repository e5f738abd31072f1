#!/usr/bin/env node
// Upstream llama.cpp (../shared/anchor's node-llama-cpp) generating greedily from a prompt, plain
// and with node-llama-cpp's lookup drafts (InputLookupTokenPredictor over llama.cpp's batched
// verify), for scripts/bench-spec.sh. The predictor looks up the longest match of the context's
// end in its "input", which is given the whole context before the newest token at every token
// (the prompt and what was generated, as vkllm's ngram-simple searches), not only the prompt. Prints one JSON line per mode:
//   {"mode": "plain"|"lookup", "tokens": [...], "tg_tok_s": N, "validated": N, "refuted": N}
// tg_tok_s: tokens after the first per second, from the first token to the last (the steps that
// run generated tokens, as vkllm's decode_tok_s counts them).
//
// usage: node scripts/anchor-spec.mjs ANCHOR_DIR MODEL.gguf PROMPT_FILE N [--gpu vulkan|cpu] [--draft-max 16]
import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import {pathToFileURL} from "node:url";

const [anchor, modelPath, promptFile, nText, ...rest] = process.argv.slice(2);
if (!anchor || !modelPath || !promptFile || !nText) {
    console.error("usage: node scripts/anchor-spec.mjs ANCHOR_DIR MODEL.gguf PROMPT_FILE N [--gpu vulkan|cpu] [--draft-max 16]");
    process.exit(2);
}
let gpu = "vulkan", draftMax = 16;
for (let i = 0; i < rest.length; i++) {
    if (rest[i] === "--gpu") gpu = rest[++i];
    else if (rest[i] === "--draft-max") draftMax = parseInt(rest[++i], 10);
    else throw new Error(`unknown option ${rest[i]}`);
}
const n = parseInt(nText, 10);
// lavapipe is a CPU-type Vulkan device, which ggml-vulkan skips unless it is selected explicitly.
if (gpu === "vulkan" && process.env.GGML_VK_VISIBLE_DEVICES == null) process.env.GGML_VK_VISIBLE_DEVICES = "0";
const {getLlama, LlamaLogLevel, InputLookupTokenPredictor} =
    await import(pathToFileURL(path.join(anchor, "node_modules/node-llama-cpp/dist/index.js")).href);

const llama = await getLlama({gpu: gpu === "vulkan" ? "vulkan" : false, build: "never", skipDownload: true,
    usePrebuiltBinaries: true, progressLogs: false, maxThreads: 2, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: gpu === "vulkan" ? "max" : 0});
const prompt = model.tokenize(fs.readFileSync(promptFile, "utf8"), false);
if (model.tokens.shouldPrependBosToken) prompt.unshift(model.tokens.bos);
const now = () => Number(process.hrtime.bigint()) / 1e6;  // ms

// The predictor's "input" kept as the whole context before its newest token.
class ContextLookup extends InputLookupTokenPredictor {
    reset({stateTokens}) {
        super.reset({stateTokens});
        this.context = stateTokens.slice();
        this.updateInputTokens(this.context.slice(0, -1));
    }
    pushTokens(tokens) {
        super.pushTokens(tokens);
        this.context.push(...tokens);
        this.updateInputTokens(this.context.slice(0, -1));
    }
}

for (const mode of ["plain", "lookup"]) {
    const context = await model.createContext({contextSize: prompt.length + n + 64, batchSize: 512, sequences: 1,
        threads: {ideal: 2, min: 1}});
    const tokenPredictor = mode === "lookup"
        ? new ContextLookup({predictionLength: {min: 1, max: draftMax}}) : undefined;
    const seq = context.getSequence({tokenPredictor});
    const tokens = [];
    let tFirst = 0, tLast = 0;
    for await (const t of seq.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
        tLast = now();
        if (tokens.length === 0) tFirst = tLast;
        tokens.push(t);
        if (tokens.length >= n) break;
    }
    const stats = seq.tokenPredictions;
    console.log(JSON.stringify({mode, tokens, tg_tok_s: (tokens.length - 1) * 1000 / Math.max(tLast - tFirst, 1e-3),
        validated: stats.validated, refuted: stats.refuted}));
    await context.dispose();
}
