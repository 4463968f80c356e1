#!/usr/bin/env bash
# device_python.sh - the Python package's device suite: builds libgdn (CMake, CUDA backend) unless
# $GDN_LIBRARY names a prebuilt one, then runs python/tests on CPU and CUDA (custom ops' opcheck and
# torch.compile included), transformers' Qwen3-Next / Qwen3.5 on libgdn against their float32 torch
# oracle and FLA (test_transformers.py), and the side-by-side checks against FLA when .peers/fla is
# present (carried). Logs and tables go to $OUT (default ./out-python).
#   run on the device with carry [".peers/fla"]:  bash scripts/device_python.sh
# GDN_FLA_FIRST_CONFIG=1 (the default here) makes FLA's Triton autotuners try only their first
# config, to keep FLA's compile time inside a short lease; FLA's timings are then not its best.
# GDN_TIME_BUDGET (default 200 s) bounds the whole script: the FLA comparison gets what is left.
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out-python}
mkdir -p "$OUT"
log="$OUT/python-device.txt"
exec > >(tee "$log") 2>&1

echo "== libgdn python device suite, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo "${GDN_COMMIT:-unknown (no .git here; set GDN_COMMIT)}")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'

if [ -n "${GDN_LIBRARY:-}" ] && [ -f "$GDN_LIBRARY" ]; then
    echo "== prebuilt library: $GDN_LIBRARY"
else
    echo "== building libgdn (cmake, Release, CUDA sm_90a)"
    t0=$(date +%s)
    if cmake -S . -B build-device-python -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF > "$OUT/build.log" 2>&1 &&
       cmake --build build-device-python --target gdn -j "$(nproc)" >> "$OUT/build.log" 2>&1; then
        echo "built in $(( $(date +%s) - t0 )) s"
    else
        echo "BUILD FAILED; last lines of build.log:"; tail -30 "$OUT/build.log"; exit 1
    fi
    export GDN_LIBRARY=$PWD/build-device-python/libgdn.so
fi

export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
[ -d .peers/fla ] && export PYTHONPATH=$PWD/.peers/fla:$PYTHONPATH
export GDN_FLA_FIRST_CONFIG=${GDN_FLA_FIRST_CONFIG:-1}
export GDN_REPORT_DIR=$OUT
export PYTHONUNBUFFERED=1
python3 -c 'import libgdn; print("libgdn", libgdn.version(), "cuda backend", libgdn.has_cuda(), libgdn.library_path())'
python3 -c 'import fla; print("fla", getattr(fla, "__version__", "?"))' 2>/dev/null || echo "fla not importable: FLA checks skip"
python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>/dev/null ||
    echo "transformers not importable: the model test skips"

# The suite proper first; then transformers' models on libgdn (at most 300 s: FLA's kernels compile
# there on first use); then the FLA comparison, bounded by what is left of GDN_TIME_BUDGET seconds,
# verbose so a slow case shows by name.
echo "== pytest python/tests (devices: cpu, cuda), the transformers and FLA comparisons apart"
python3 -m pytest python/tests -q -rs --durations=8 -p no:cacheprovider --ignore=python/tests/test_fla_compare.py \
    --ignore=python/tests/test_transformers.py
status=$?
echo "== transformers' models on libgdn (test_transformers.py)"
timeout -s INT 300 python3 -m pytest python/tests/test_transformers.py -v -s -rs -p no:cacheprovider
tf_status=$?
left=$(( ${GDN_TIME_BUDGET:-200} - SECONDS ))
fla_status=0
if [ -d .peers/fla ] && [ "$left" -gt 15 ]; then
    echo "== FLA side by side (${left} s left)"
    timeout -s INT "$left" python3 -m pytest python/tests/test_fla_compare.py -v -s -rs -p no:cacheprovider
    fla_status=$?
    [ $fla_status -eq 124 ] && echo "FLA comparison stopped at the time budget"
fi
if [ -f "$OUT/fla_compare.txt" ]; then
    echo "== libgdn vs FLA (relative RMS error against float64; median ms$([ "$GDN_FLA_FIRST_CONFIG" = 1 ] && echo ', FLA with its first autotune config'))"
    cat "$OUT/fla_compare.txt"
fi
if [ -f "$OUT/transformers.txt" ]; then
    echo "== transformers on libgdn (logits' relative RMS error against the float32 torch oracle)"
    cat "$OUT/transformers.txt"
fi
echo "== pytest exit status: suite $status, transformers $tf_status, FLA comparison $fla_status; ${SECONDS} s"
[ $status -eq 0 ] && [ $tf_status -eq 0 ] && [ $fla_status -eq 0 ]
