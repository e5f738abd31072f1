#!/usr/bin/env node
// Regenerates tests/data/samplers/*.json: the tokens upstream llama.cpp (../shared/anchor's
// node-llama-cpp, CPU backend) chooses greedily under its DRY and XTC samplers, for test_cli's
// Cli.SamplersMatchLlamaCpp. Greedy decoding makes them deterministic: DRY edits the logits before
// the argmax, and XTC at probability 1 cuts the top choices on every step. node-llama-cpp's greedy
// chain is bias, penalties, DRY, XTC and the argmax (no top-k, top-p or min-p: the XTC case's
// flags turn vkllm's off), and a DRY window it is not given is -1, which this llama.cpp reads as
// off: every DRY case names its window.
//
// node-llama-cpp feeds DRY the generated tokens only, where llama-cli and llama-server (and vkllm)
// feed it the prompt too; the prompts here are a lone newline after BOS, which no repeat can reach
// back across (it is a sequence breaker), so both histories give the same penalties.
//
// usage: node scripts/make-sampler-refs.mjs      (needs the anchor: bash ../shared/anchor/setup.sh)
import {execFileSync} from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const shared = path.resolve(root, "../shared");
const dataDir = path.join(root, "tests/data/samplers");
const anchor = execFileSync("bash", [path.join(shared, "anchor/setup.sh")], {encoding: "utf8"}).trim().split("\n").pop();
const {getLlama, LlamaLogLevel} = await import(pathToFileURL(path.join(anchor, "node_modules/node-llama-cpp/dist/index.js")).href);

// name | model | prompt | tokens | sampling options (node-llama-cpp's) | vkllm's flags for the same
const cases = [
    ["stories-dry", "stories260K.gguf", "\n", 300, {dryRepeatPenalty: {strength: 0.8, base: 1.75, allowedLength: 2, lastTokens: 64}},
        ["--dry-multiplier", "0.8"]],
    ["stories-dry-strong", "stories260K.gguf", "\n", 300,
        {dryRepeatPenalty: {strength: 2, base: 2, allowedLength: 1, lastTokens: 200, sequenceBreakers: [".", "\n"]}},
        ["--dry-multiplier", "2", "--dry-base", "2", "--dry-allowed-length", "1", "--dry-penalty-last-n", "200",
         "--dry-sequence-breaker", ".", "--dry-sequence-breaker", "\\n"]],
    ["stories-xtc", "stories260K.gguf", "\n", 120, {xtc: {probability: 1, threshold: 0.1}},
        ["--xtc-probability", "1", "--xtc-threshold", "0.1", "--top-k", "0", "--top-p", "1", "--min-p", "0"]],
    ["qwen2-dry", "synth-qwen2-f32.gguf", "\n", 120, {dryRepeatPenalty: {strength: 0.8, base: 1.75, allowedLength: 2, lastTokens: 64}},
        ["--dry-multiplier", "0.8"]],
];

const llama = await getLlama({gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
    progressLogs: false, maxThreads: 1, logLevel: LlamaLogLevel.error});
for (const [name, modelFile, prompt, n, options, flags] of cases) {
    const model = await llama.loadModel({modelPath: path.join(shared, "models", modelFile), gpuLayers: 0});
    const tokens = model.tokenize(prompt, false);
    if (model.tokens.shouldPrependBosToken) tokens.unshift(model.tokens.bos);
    const context = await model.createContext({contextSize: 512, batchSize: 512, sequences: 1, threads: {ideal: 1, min: 1}});
    const seq = context.getSequence();
    const greedy = [];
    // The steps compared: up to the first whose two best tokens (after DRY) are within 0.005 in
    // log-probability, where a last-bit difference of the logits may choose either.
    let compare = n;
    for await (const out of seq.evaluateWithMetadata(tokens, {probabilities: true}, {temperature: 0, yieldEogToken: true, ...options})) {
        const p = [...out.probabilities.values()].sort((a, b) => b - a);
        if (compare === n && p.length > 1 && Math.log(p[0]) - Math.log(p[1]) < 0.005) compare = greedy.length;
        greedy.push(out.token);
        if (greedy.length >= n) break;
    }
    const result = {model: modelFile, prompt, n_predict: n, compare, flags, prompt_tokens: tokens, tokens: greedy,
        text: model.detokenize(greedy, false, tokens), llama_cpp_release: `${llama.llamaCppRelease.repo}@${llama.llamaCppRelease.release}`};
    fs.writeFileSync(path.join(dataDir, `${name}.json`), JSON.stringify(result, null, 1) + "\n");
    process.stderr.write(`${name}: ${greedy.length} tokens, ${compare} compared: ${JSON.stringify(result.text.slice(0, 80))}\n`);
    await context.dispose();
    await model.dispose();
}
