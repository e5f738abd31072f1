#!/usr/bin/env node
// Regenerates tests/data/grammar/*.json: the tokens upstream llama.cpp (../shared/anchor's
// node-llama-cpp, CPU backend) chooses greedily under a GBNF grammar, for test_cli's
// Grammar.GreedyTokensMatchLlamaCpp. Each case: a model of ../shared/models, a prompt, a grammar
// file of tests/data/grammar and a token budget; generation stops at the budget or at an
// end-of-generation token (which llama.cpp's grammar allows once the grammar is complete).
//
// usage: node scripts/make-grammar-refs.mjs      (needs the anchor: bash ../shared/anchor/setup.sh)
import {execFileSync} from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const shared = path.resolve(root, "../shared");
const dataDir = path.join(root, "tests/data/grammar");
const anchor = execFileSync("bash", [path.join(shared, "anchor/setup.sh")], {encoding: "utf8"}).trim().split("\n").pop();
const {getLlama, LlamaLogLevel, LlamaGrammarEvaluationState} = await import(pathToFileURL(path.join(anchor, "node_modules/node-llama-cpp/dist/index.js")).href);

// name | model | prompt | grammar | tokens
const cases = [
    ["stories-words", "stories260K.gguf", "Once upon a time", "words.gbnf", 40],
    ["stories-list", "stories260K.gguf", "Lily had a list:", "list.gbnf", 64],
    ["stories-accents", "stories260K.gguf", "The cat said", "accents.gbnf", 40],
    ["stories-json", "stories260K.gguf", "Once upon a time", "json-object.gbnf", 48],
    ["qwen2-json", "synth-qwen2-f32.gguf", "Once upon a time", "json-object.gbnf", 24],
    ["qwen2-words", "synth-qwen2-f32.gguf", "The", "words.gbnf", 24],
];

const llama = await getLlama({gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
    progressLogs: false, maxThreads: 1, logLevel: LlamaLogLevel.error});
for (const [name, modelFile, prompt, grammarFile, n] of cases) {
    const model = await llama.loadModel({modelPath: path.join(shared, "models", modelFile), gpuLayers: 0});
    const tokens = model.tokenize(prompt, false);
    if (model.tokens.shouldPrependBosToken) tokens.unshift(model.tokens.bos);
    const context = await model.createContext({contextSize: 256, batchSize: 256, sequences: 1, threads: {ideal: 1, min: 1}});
    const grammarText = fs.readFileSync(path.join(dataDir, grammarFile), "utf8");
    const grammar = await llama.createGrammar({grammar: grammarText});
    const state = new LlamaGrammarEvaluationState({model, grammar});
    const seq = context.getSequence();
    const greedy = [];
    let stop = "length";
    for await (const out of seq.evaluateWithMetadata(tokens, {}, {temperature: 0, grammarEvaluationState: state, yieldEogToken: true})) {
        if (model.isEogToken(out.token)) { stop = "eos"; break; }
        greedy.push(out.token);
        if (greedy.length >= n) break;
    }
    const result = {model: modelFile, prompt, grammar: grammarFile, n_predict: n, prompt_tokens: tokens, tokens: greedy,
        text: model.detokenize(greedy, false, tokens), stop_reason: stop,
        llama_cpp_release: `${llama.llamaCppRelease.repo}@${llama.llamaCppRelease.release}`};
    fs.writeFileSync(path.join(dataDir, `${name}.json`), JSON.stringify(result, null, 1) + "\n");
    process.stderr.write(`${name}: ${greedy.length} tokens (${stop}): ${JSON.stringify(result.text)}\n`);
    await context.dispose();
    await model.dispose();
}
