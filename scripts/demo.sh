#!/usr/bin/env bash
# The main job: set up and build, find a model, describe it (stderr) and generate text (stdout).
# Model lookup: $VKLLM_MODEL, models/default.gguf, ../shared/models/stories260K.gguf, else
# download stories260K.gguf from the ggml-org/tiny-llamas repository on Hugging Face.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2

model=${VKLLM_MODEL:-}
[ -n "$model" ] || { [ -f models/default.gguf ] && model=models/default.gguf; } || true
[ -n "$model" ] || { [ -f ../shared/models/stories260K.gguf ] && model=../shared/models/stories260K.gguf; } || true
if [ -z "$model" ]; then
  model=models/stories260K.gguf
  if [ ! -f "$model" ]; then
    echo "demo: downloading stories260K.gguf into models/" >&2
    curl -fL --progress-bar -o "$model.part" \
      https://huggingface.co/ggml-org/tiny-llamas/resolve/main/stories260K.gguf
    mv "$model.part" "$model"
  fi
fi

echo "demo: model $model" >&2
./build/vkllm info -m "$model" >&2
echo >&2
./build/vkllm run -m "$model" -n 128 -p "${VKLLM_PROMPT:-Once upon a time}"
echo
