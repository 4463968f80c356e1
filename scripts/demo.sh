#!/usr/bin/env bash
# demo.sh - build libgdn (Release) into build/ and run `gdn demo`: one Qwen3-Next GDN layer, a
# chunked prefill of 4096 tokens and 8 in-place decode steps, checked against float64. Uses the
# GPU when the CUDA backend is built and a GPU is present, else the CPU (and says why). On a fresh
# Debian machine missing build tools are installed with apt-get when running as root. The build
# is the one scripts/test.sh makes (scripts/common.sh), so either after the other rebuilds nothing.
#   bash scripts/demo.sh            (GDN_BUILD_DIR overrides build/, GDN_JOBS the build parallelism)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
gdn_ensure_tools cmake cmake gcc gcc make make

build=$(gdn_build_dir)
mkdir -p "$build"
echo "demo.sh: building into $build/ (log: $build/build.log)"
gdn_build "$build" "${GDN_JOBS:-$(nproc)}" >"$build/build.log" 2>&1 || { tail -n 40 "$build/build.log"; exit 1; }
grep -E "^-- libgdn" "$build/build.log" || true
"$build/tools/gdn" demo
