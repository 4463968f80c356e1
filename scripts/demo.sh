#!/usr/bin/env bash
# demo.sh - build libgdn (Release) into build/ and run `gdn demo`: one Qwen3-Next GDN layer, a
# chunked prefill of 4096 tokens and 8 in-place decode steps, checked against float64. Uses the
# GPU when the CUDA backend is built and a GPU is present, else the CPU. On a fresh Debian machine
# missing build tools are installed with apt-get when running as root.
#   bash scripts/demo.sh            (GDN_BUILD_DIR overrides build/)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in cmake gcc make; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "demo.sh: missing ${missing[*]}; install them (or run as root on Debian)" >&2
        exit 1
    fi
    echo "demo.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
    export PATH="/usr/local/cuda/bin:$PATH" # so CMake finds the CUDA compiler
fi

build=${GDN_BUILD_DIR:-build}
mkdir -p "$build"
echo "demo.sh: building into $build/ (log: $build/build.log)"
{ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j"$(nproc)"; } >"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log"; exit 1; }
"$build/tools/gdn" demo
