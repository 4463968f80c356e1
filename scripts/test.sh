#!/usr/bin/env bash
# test.sh - build libgdn (Release, warnings as errors) into build/ and run every test: the C suite
# through ctest, then the Python tests when python/tests exists. Works on a fresh Debian machine:
# missing build tools (cmake, gcc, make, pkg-config; for the Python tests python3-torch /
# python3-pytest) are installed with apt-get when running as root. No GPU needed: without one
# ctest reports the CUDA tests as skipped. The build is the one scripts/demo.sh makes
# (scripts/common.sh), so either after the other rebuilds nothing.
#   bash scripts/test.sh            (GDN_BUILD_DIR overrides build/, GDN_JOBS the build parallelism)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

. scripts/common.sh
# pkg-config: the install test builds a consumer with it (tests/test_install.sh)
gdn_ensure_tools cmake cmake gcc gcc make make pkg-config pkg-config

build=$(gdn_build_dir)
echo "== configure + build ($build, Release, -DGDN_WERROR=ON)"
gdn_build "$build" "${GDN_JOBS:-$(nproc)}"

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
