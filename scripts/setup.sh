#!/usr/bin/env bash
# Installs the Debian packages vkllm needs (only those missing), then configures and builds
# Release into build/. Idempotent; run as root (or with sudo available) on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  libvulkan-dev glslang-tools spirv-tools mesa-vulkan-drivers vulkan-tools vulkan-validationlayers
  libcli11-dev libgtest-dev googletest nlohmann-json3-dev libpcre2-dev libedit-dev libxxhash-dev libutf8proc-dev
  libcpp-httplib-dev clang tmux curl ca-certificates
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
