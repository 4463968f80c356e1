#!/usr/bin/env bash
# device_decode.sh - the decode harness, in one call on the device machine (an H100):
#   1. builds for sm_90a: the library's C sources, the decode/gating CUDA files, a stub for the
#      chunk op (so that a half-written prefill kernel cannot break this build), the CUDA test
#      and the benchmark;
#   2. runs tests/test_cuda_recurrent (the option matrix against the float64 recurrence, fresh
#      random inputs, poisoned outputs);
#   3. runs compute-sanitizer --tool memcheck on small cases (pools, bad device indices, gating,
#      extreme gates, the options sweep: both decode paths);
#   4. runs bench/bench_decode (libgdn, hot and cold, copy ceiling) and bench/fla_decode.py (FLA),
#      then prints the merged table and the targets last.
# Logs and the results file (decode-results.txt) go to $OUT.
#   device tool:  bash scripts/device_decode.sh            (carry .peers/fla for the FLA numbers)
#   options (env): DECODE_VARIANTS=1 also times tile variants; DECODE_SKIP_TESTS=1 benchmarks only;
#   DECODE_NO_BENCH=1 stops after the tests;
#   DECODE_COMMIT names the commit in the results (the device copy of the tree has no git).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/decode-out}
BUILD=${BUILD:-build-decode-dev}
mkdir -p "$OUT" "$BUILD"
export PYTHONPATH=.peers/fla${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
NVCC_FLAGS=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas=-warn-spills
            -DGDN_WITH_CUDA -DGDN_BUILDING_LIBRARY -Iinclude -Isrc)
CC_FLAGS=(-std=c11 -O2 -Wall -Wextra -DGDN_WITH_CUDA -DGDN_BUILDING_LIBRARY -Iinclude -Isrc -I"$CUDA_HOME/include")
LIBS=(-L"$CUDA_HOME/lib64" -lcudart_static -lpthread -ldl -lrt -lm)

step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step build
t0=$(date +%s)
cat > "$BUILD/chunk_stub.cu" <<'EOF'
#include "cuda/cuda_common.cuh"
extern "C" size_t gdn_cuda_chunk_fwd_workspace_size(const gdn_problem *p) { (void)p; return 0; }
extern "C" size_t gdn_cuda_chunk_fwd_workspace_min(const gdn_problem *p) { (void)p; return 0; }
extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p)
{
    (void)p;
    return gdn_set_error(GDN_ERR_NOT_IMPLEMENTED, "chunk_fwd: not built by device_decode.sh");
}
EOF
pids=()
nvcc "${NVCC_FLAGS[@]}" -Xptxas -v -c src/cuda/sm90_recurrent_fwd.cu -o "$BUILD/rec.o" > "$BUILD/rec.log" 2>&1 & pids+=($!)
nvcc "${NVCC_FLAGS[@]}" -c src/cuda/cuda_gating.cu -o "$BUILD/gating.o" > "$BUILD/gating.log" 2>&1 & pids+=($!)
nvcc "${NVCC_FLAGS[@]}" -c "$BUILD/chunk_stub.cu" -o "$BUILD/chunk_stub.o" > "$BUILD/stub.log" 2>&1 & pids+=($!)
nvcc "${NVCC_FLAGS[@]}" -c bench/bench_decode.cu -o "$BUILD/bench_decode.o" > "$BUILD/bench.log" 2>&1 & pids+=($!)
cobjs=()
for f in src/api.c src/cpu/*.c tests/test_util.c tests/test_cuda_recurrent.c; do
    o="$BUILD/$(echo "$f" | tr / _).o"
    cobjs+=("$o")
    gcc "${CC_FLAGS[@]}" -Itests -c "$f" -o "$o" > "$o.log" 2>&1 & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
cat "$BUILD"/*.log "$BUILD"/*.o.log 2>/dev/null | grep -E "error|warning" | head -30
if [ $fail -ne 0 ]; then echo "BUILD FAILED"; cat "$BUILD"/*.log | tail -40; exit 1; fi
grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" "$BUILD/rec.log" | sort | uniq -c | sort -rn | head -12
libobjs=("$BUILD/rec.o" "$BUILD/gating.o" "$BUILD/chunk_stub.o")
for o in "${cobjs[@]}"; do case "$o" in *tests_*) ;; *) libobjs+=("$o") ;; esac; done
g++ -o "$BUILD/test_cuda_recurrent" "$BUILD/tests_test_cuda_recurrent.c.o" "$BUILD/tests_test_util.c.o" "${libobjs[@]}" "${LIBS[@]}" || exit 1
g++ -o "$BUILD/bench_decode" "$BUILD/bench_decode.o" "${libobjs[@]}" "${LIBS[@]}" || exit 1
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

tests_rc=skipped
san_rc=skipped
if [ "${DECODE_SKIP_TESTS:-0}" != 1 ]; then
    step "tests (test_cuda_recurrent)"
    "$BUILD/test_cuda_recurrent" 2>&1 | tee "$OUT/tests.log" | grep -vE "^(PASS|ok) " | tail -40
    tests_rc=${PIPESTATUS[0]}
    tail -1 "$OUT/tests.log"

    step "compute-sanitizer memcheck (pools, bad device indices, gating, extreme gates, options)"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/test_cuda_recurrent" pool_decode bad_device gating extreme_gates options \
        > "$OUT/memcheck.log" 2>&1
    san_rc=$?
    grep -E "ERROR SUMMARY|passed|Invalid" "$OUT/memcheck.log" | head -10
fi

if [ "${DECODE_NO_BENCH:-0}" = 1 ]; then
    echo "tests rc=$tests_rc memcheck rc=$san_rc"
    exit 0
fi

step "bench (libgdn)"
variants=()
[ "${DECODE_VARIANTS:-0}" = 1 ] && variants=(--variants)
"$BUILD/bench_decode" --tsv "$OUT/decode_ours.tsv" "${variants[@]}" 2>&1 | tee "$OUT/bench_ours.log"
bench_rc=${PIPESTATUS[0]}

step "bench (FLA) and merged table"
{
    echo "# libgdn decode benchmark (bench/bench_decode.cu + bench/fla_decode.py via scripts/device_decode.sh)"
    echo "# device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# commit: ${DECODE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "# command: bash scripts/device_decode.sh (DECODE_VARIANTS=${DECODE_VARIANTS:-0})"
    echo "# tests: rc=$tests_rc ($(tail -1 "$OUT/tests.log" 2>/dev/null)); memcheck: rc=$san_rc ($(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log" 2>/dev/null))"
    echo "# shape: H=16 HV=32 K=V=128, bf16 q/k/v, q/k l2 norm and gating in-kernel, VK state pool updated in place"
    grep -E "^copy ceiling|^check" "$OUT/bench_ours.log"
    python3 bench/fla_decode.py --ours "$OUT/decode_ours.tsv" --tsv "$OUT/decode_fla.tsv" 2> "$OUT/fla.err" | grep -v "^fla f32"
    grep -A14 "^variants" "$OUT/bench_ours.log"
} > "$OUT/decode-results.txt"
tail -n 80 "$OUT/fla.err"
cat "$OUT/decode-results.txt"
echo "tests rc=$tests_rc memcheck rc=$san_rc bench rc=$bench_rc"
