#!/usr/bin/env bash
# test.sh - build libgdn (Release, warnings as errors) into build/ and run every test: the C suite
# through ctest, then the Python tests when python/tests exists. Works on a fresh Debian machine:
# missing build tools (and, for the Python tests, python3-torch / python3-pytest) are installed
# with apt-get when running as root. No GPU needed: CUDA tests skip without one.
#   bash scripts/test.sh            (GDN_BUILD_DIR overrides build/, GDN_JOBS the build parallelism)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

# Install the Debian packages named for the commands that are missing (root only).
ensure_tools() {
    local missing=() pkgs=() cmd pkg
    while [ $# -gt 0 ]; do
        cmd=$1 pkg=$2
        shift 2
        command -v "$cmd" >/dev/null 2>&1 || { missing+=("$cmd"); pkgs+=("$pkg"); }
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "test.sh: missing ${missing[*]}; install ${pkgs[*]} (or run as root on Debian)" >&2
        exit 1
    fi
    echo "test.sh: installing ${pkgs[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}
ensure_tools cmake cmake gcc gcc make make

build=${GDN_BUILD_DIR:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac # absolute or relative to the repository root
jobs=${GDN_JOBS:-$(nproc)}
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
    export PATH="/usr/local/cuda/bin:$PATH" # so CMake finds the CUDA compiler
fi

echo "== configure + build ($build, Release, -DGDN_WERROR=ON)"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGDN_WERROR=ON >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
grep -E "libgdn:|CUDA compiler identification" "$build/configure.log" || true
cmake --build "$build" -j"$jobs"

echo "== C tests (ctest)"
ctest --test-dir "$build" --output-on-failure

if [ -d python/tests ]; then
    echo "== Python tests"
    if ! /usr/bin/python3 -c "import torch, pytest" >/dev/null 2>&1; then
        if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
            echo "test.sh: /usr/bin/python3 lacks torch or pytest; install python3-torch python3-pytest" >&2
            exit 1
        fi
        echo "test.sh: installing python3-torch python3-pytest"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch python3-pytest >/dev/null
    fi
    GDN_LIBRARY="$build/libgdn.so" PYTHONPATH="$PWD/python" /usr/bin/python3 -m pytest -q python/tests
fi

echo "== all tests passed in $(($(date +%s) - start)) s"
