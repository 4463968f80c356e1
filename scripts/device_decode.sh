#!/usr/bin/env bash
# device_decode.sh - the decode harness, in one call on the device machine (an H100):
#   1. builds with CMake (CUDA backend, sm_90a, -DGDN_BENCH=ON): the library, the CUDA test and
#      bench/bench_decode; with DECODE_VARIANTS=1 also dev/decode/decode_sweeps.cu against it;
#   2. runs tests/test_cuda_recurrent (the option matrix against the float64 recurrence, fresh
#      random inputs, poisoned outputs);
#   3. runs compute-sanitizer --tool memcheck on small cases (pools, bad device indices, gating,
#      extreme gates, the options sweep: both decode paths);
#   4. runs bench/bench_decode (libgdn, hot and cold, copy ceiling) and bench/fla_decode.py (FLA),
#      then prints the merged table and the targets last.
# Logs and the results file (decode-results.txt, or decode-kda-results.txt) go to $OUT.
#   device tool:  bash scripts/device_decode.sh            (carry .peers/fla for the FLA numbers)
#   options (env): DECODE_VARIANTS=1 also runs the tile sweeps (decode_sweeps --variants);
#   DECODE_SKIP_TESTS=1 benchmarks only; DECODE_NO_BENCH=1 stops after the tests;
#   DECODE_KDA=1 benchmarks KDA gates (bench_decode --kda against FLA's fused_recurrent_kda,
#   results in decode-kda-results.txt with issue 16's targets); DECODE_KV=1 keeps the pool in the KV
#   layout on both sides (bench_decode --kv, fla_decode.py --kv; results decode[-kda]-kv-results.txt);
#   DECODE_COMMIT names the commit in the results (the device copy of the tree has no git);
#   DECODE_PREBUILT=1 skips the build and runs $BUILD/tests/test_cuda_recurrent and
#   $BUILD/bench_decode as carried (built here: the device's own build costs device time).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/decode-out}
BUILD=${BUILD:-build-decode-dev}
mkdir -p "$OUT" "$BUILD"
BENCH_ARGS=()
RESULTS=decode-results.txt
if [ "${DECODE_KDA:-0}" = 1 ]; then
    BENCH_ARGS=(--kda)
    RESULTS=decode-kda-results.txt
fi
if [ "${DECODE_KV:-0}" = 1 ]; then
    BENCH_ARGS+=(--kv)
    RESULTS=${RESULTS%-results.txt}-kv-results.txt
fi
export PYTHONPATH=.peers/fla${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step build
t0=$(date +%s)
if [ "${DECODE_PREBUILT:-0}" = 1 ]; then
    echo "prebuilt binaries in $BUILD"
elif ! { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DGDN_BENCH=ON &&
       cmake --build "$BUILD" -j"$(nproc)" --target gdn_static test_cuda_recurrent bench_decode; } > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "BUILD FAILED"
    exit 1
fi
TEST=$BUILD/tests/test_cuda_recurrent
BENCH=$BUILD/bench_decode
if [ "${DECODE_VARIANTS:-0}" = 1 ]; then
    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DGDN_WITH_CUDA \
        -Iinclude -Isrc -Ibench dev/decode/decode_sweeps.cu "$BUILD/libgdn.a" -lpthread \
        -o "$BUILD/decode_sweeps" >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
fi
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

tests_rc=skipped
san_rc=skipped
if [ "${DECODE_SKIP_TESTS:-0}" != 1 ]; then
    step "tests (test_cuda_recurrent)"
    "$TEST" 2>&1 | tee "$OUT/tests.log" | grep -vE "^(PASS|ok) " | tail -40
    tests_rc=${PIPESTATUS[0]}
    tail -1 "$OUT/tests.log"

    step "compute-sanitizer memcheck (pools, bad device indices, gating, extreme gates, options; GDN and KDA)"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$TEST" pool_decode bad_device gating extreme_gates options \
        kda_pools kda_options > "$OUT/memcheck.log" 2>&1
    san_rc=$?
    grep -E "ERROR SUMMARY|passed|Invalid" "$OUT/memcheck.log" | head -10
fi

if [ "${DECODE_NO_BENCH:-0}" = 1 ]; then
    echo "tests rc=$tests_rc memcheck rc=$san_rc"
    exit 0
fi

step "bench (libgdn)"
"$BENCH" "${BENCH_ARGS[@]}" --tsv "$OUT/decode_ours.tsv" 2>&1 | tee "$OUT/bench_ours.log"
bench_rc=${PIPESTATUS[0]}
if [ "${DECODE_VARIANTS:-0}" = 1 ]; then
    step "tile sweeps (dev/decode/decode_sweeps --variants)"
    "$BUILD/decode_sweeps" --variants 2>&1 | tee -a "$OUT/bench_ours.log"
fi

step "bench (FLA) and merged table"
{
    echo "# libgdn decode benchmark (bench/bench_decode.cu + bench/fla_decode.py via scripts/device_decode.sh)"
    echo "# device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# commit: ${DECODE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "# command: bash scripts/device_decode.sh (DECODE_VARIANTS=${DECODE_VARIANTS:-0} DECODE_KDA=${DECODE_KDA:-0} DECODE_KV=${DECODE_KV:-0})"
    echo "# tests: rc=$tests_rc ($(tail -1 "$OUT/tests.log" 2>/dev/null)); memcheck: rc=$san_rc ($(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log" 2>/dev/null))"
    echo "# shape: H=16 HV=32 K=V=128, bf16 q/k/v, q/k l2 norm and gating in-kernel, VK state pool updated in place"
    echo "# gates: $([ "${DECODE_KDA:-0}" = 1 ] && echo "KDA (a [B, T, HV, K], dt_bias [HV, K]; FLA: fused_recurrent_kda)" || echo GDN)"
    grep -E "^copy ceiling|^check" "$OUT/bench_ours.log"
    python3 bench/fla_decode.py "${BENCH_ARGS[@]}" --ours "$OUT/decode_ours.tsv" --tsv "$OUT/decode_fla.tsv" 2> "$OUT/fla.err" | grep -v "^fla f32"
    grep -A14 "^variants" "$OUT/bench_ours.log"
} > "$OUT/$RESULTS"
tail -n 80 "$OUT/fla.err"
cat "$OUT/$RESULTS"
echo "tests rc=$tests_rc memcheck rc=$san_rc bench rc=$bench_rc"
