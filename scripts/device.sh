#!/usr/bin/env bash
# device.sh - the whole-library check on a GPU machine, in one device call: builds libgdn with
# CMake (CUDA backend, sm_90a), runs every test: the CPU suite through ctest and the CUDA tests,
# which compare against the float64 reference on fresh random inputs with poisoned outputs; runs
# `gdn demo` on the GPU, runs compute-sanitizer memcheck and racecheck on small CUDA cases, and
# prints a summary last. Logs go to $OUT (default ./out-device).
#   bash scripts/device.sh                 (device tool: run(command="bash scripts/device.sh"))
#   GDN_PREBUILT=DIR bash scripts/device.sh
#       uses the binaries that dev/carry_build.sh packs flat into DIR (libgdn.so, test_backward,
#       test_cuda_*, gdn) instead of building: the device's minutes go to the tests, and the CPU-only
#       ctest suite (run by CI) is left out; test_backward runs whole, for its CUDA cases.
# The per-op benchmarks against FLA have their own harnesses, each one device call:
#   scripts/device_decode.sh, scripts/device_prefill.sh, scripts/device_python.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out-device}
BUILD=${GDN_BUILD_DIR:-build-device}
mkdir -p "$OUT"
summary=()
note() { summary+=("$1"); echo "== $1"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
if [ -n "${GDN_PREBUILT:-}" ]; then
    TESTS=("$GDN_PREBUILT"/test_backward "$GDN_PREBUILT"/test_cuda_*)
    TDIR=$GDN_PREBUILT GDN_TOOL=$GDN_PREBUILT/gdn
    note "prebuilt: $GDN_PREBUILT"
else
    t0=$(date +%s)
    if ! { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGDN_WERROR=ON &&
           cmake --build "$BUILD" -j"$(nproc)"; } >"$OUT/build.log" 2>&1; then
        tail -40 "$OUT/build.log"
        echo "BUILD FAILED"
        exit 1
    fi
    grep -q "^-- libgdn .*: CUDA backend ON" "$OUT/build.log" || { echo "CUDA backend not built"; exit 1; }
    note "build: ok ($(( $(date +%s) - t0 )) s)"
    ctest --test-dir "$BUILD" --output-on-failure -E test_cuda >"$OUT/ctest.log" 2>&1
    note "ctest (CPU tests, demo): rc=$?, $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
    TESTS=("$BUILD"/tests/test_cuda_*)
    TDIR=$BUILD/tests GDN_TOOL=$BUILD/tools/gdn
fi
for t in "${TESTS[@]}"; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    "$t" >"$OUT/$n.log" 2>&1
    note "$n: rc=$?, $(tail -1 "$OUT/$n.log")"
done

"$GDN_TOOL" demo >"$OUT/demo.log" 2>&1
note "gdn demo: rc=$?"
cat "$OUT/demo.log"

compute-sanitizer --tool memcheck --error-exitcode 9 "$TDIR/test_cuda_recurrent" pool_decode bad_device gating \
    kda_pools kda_options >"$OUT/memcheck.log" 2>&1
note "memcheck recurrent: rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
compute-sanitizer --tool memcheck --error-exitcode 9 "$TDIR/test_cuda_chunk" varlen odd_lengths cp_small strided \
    pool kda_basic kda_varlen kda_cp kda_coop kda_pool >>"$OUT/memcheck.log" 2>&1
note "memcheck chunk: rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
compute-sanitizer --tool memcheck --error-exitcode 9 "$TDIR/test_cuda_primitives" >>"$OUT/memcheck.log" 2>&1
note "memcheck primitives: rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
compute-sanitizer --tool racecheck --error-exitcode 9 "$TDIR/test_cuda_chunk" basic mid_heads cp_small \
    pool kda_basic kda_varlen kda_coop >"$OUT/racecheck.log" 2>&1
note "racecheck chunk: rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
compute-sanitizer --tool racecheck --error-exitcode 9 "$TDIR/test_cuda_recurrent" pool_decode single_token_paths multi_token_paths \
    kda_tokens kda_extreme_gates >>"$OUT/racecheck.log" 2>&1
note "racecheck recurrent: rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
compute-sanitizer --tool memcheck --error-exitcode 9 "$TDIR/test_backward" cuda_grads cuda_strided cuda_limits \
    >>"$OUT/memcheck.log" 2>&1
note "memcheck backward: rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
compute-sanitizer --tool racecheck --error-exitcode 9 "$TDIR/test_backward" cuda_grads >>"$OUT/racecheck.log" 2>&1
note "racecheck backward: rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
compute-sanitizer --tool racecheck --error-exitcode 9 "$TDIR/test_cuda_primitives" >>"$OUT/racecheck.log" 2>&1
note "racecheck primitives: rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"

echo
echo "summary ($(cat "$OUT/device.txt"), $(date -u '+%Y-%m-%d %H:%M UTC'))"
printf '  %s\n' "${summary[@]}"
