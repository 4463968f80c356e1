#!/usr/bin/env bash
# device_prefill.sh - one device call for the CUDA chunk forward (issue 4): build, correctness
# tests, compute-sanitizer, benchmarks. Writes logs and prefill_table.txt to $OUT.
#
#   scripts/device_prefill.sh [test] [sanitize] [bench] [fla]     (no argument: all four)
#
# test      tests/test_cuda_chunk (option matrix, odd lengths, varlen, determinism, poison)
# sanitize  compute-sanitizer memcheck and racecheck on small cases
# bench     bench/bench_prefill.cu: gdn_chunk_fwd at the six shapes, graph and eager
# ncu       Nsight Compute sections of the two kernels at B1_T8192 (after bench)
# fla       bench/fla_prefill.py: FLA beside libgdn, same inputs; accuracy vs float64
#           (needs .peers/fla carried: run(carry=[".peers/fla"]))
#
# Builds the library, the test and the benchmark with CMake (-DGDN_BENCH=ON).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/prefill_out}
mkdir -p "$OUT"
steps=${*:-test sanitize bench fla}
B=build-device
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; git status --short src tests bench scripts 2>/dev/null; \
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } | tee "$OUT/summary.txt"

t0=$(date +%s)
PRE=build-prefill/dev
if [ "${USE_PREBUILT:-0}" = 1 ] && [ -f $PRE/libgdn.so ] && [ -x $PRE/test_cuda_chunk ] && [ -x $PRE/bench_prefill ]; then
    # Artifacts built on the workstation (same nvcc 13.0, sm_90a) and carried: saves the build.
    SO=$PRE/libgdn.so
    TEST=$PRE/test_cuda_chunk
    BENCH=$PRE/bench_prefill
    log "prebuilt binaries from $PRE"
elif cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DGDN_BENCH=ON >"$OUT/build.log" 2>&1 &&
   cmake --build $B -j16 --target gdn gdn_static test_cuda_chunk bench_prefill >>"$OUT/build.log" 2>&1; then
    SO=$B/libgdn.so
    TEST=$B/tests/test_cuda_chunk
    BENCH=$B/bench_prefill
    log "cmake build ok ($(( $(date +%s) - t0 )) s)"
else
    tail -40 "$OUT/build.log"
    log "cmake build failed (see build.log)"
    exit 1
fi

for s in $steps; do
    case $s in
    test)
        t0=$(date +%s)
        $TEST 2>&1 | tee "$OUT/test.log" | tail -n 40
        log "test_cuda_chunk: $(tail -n 1 "$OUT/test.log") ($(( $(date +%s) - t0 )) s)"
        ;;
    sanitize)
        t0=$(date +%s)
        compute-sanitizer --tool memcheck --error-exitcode 9 $TEST varlen odd_lengths mid_heads cp_small >"$OUT/sanitize.log" 2>&1
        log "memcheck (varlen, odd_lengths, mid_heads, cp_small): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitize.log" | tail -n 1)"
        compute-sanitizer --tool racecheck --error-exitcode 9 $TEST basic mid_heads cp_small >>"$OUT/sanitize.log" 2>&1
        log "racecheck (basic, mid_heads, cp_small): rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/sanitize.log" | tail -n 1) ($(( $(date +%s) - t0 )) s)"
        ;;
    bench)
        $BENCH "$OUT/bench_prefill.txt" 2>&1 | tee "$OUT/bench.log"
        log "bench_prefill: rc=$?"
        ;;
    ncu)
        ncu --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy -k regex:chunk_ \
            --launch-count 4 $BENCH - T8192 >"$OUT/ncu.log" 2>&1
        log "ncu: rc=$?"
        grep -E "chunk_|Duration|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers|Compute \(SM\) Throughput|Memory Throughput" "$OUT/ncu.log" | head -60
        ;;
    fla)
        ours=()
        if [ -f "$OUT/bench_prefill.txt" ]; then
            ours=(--ours "$OUT/bench_prefill.txt")
        elif [ -f $PRE/bench_prefill.txt ]; then
            ours=(--ours $PRE/bench_prefill.txt) # an earlier run's C timings of the same binaries
        fi
        # FLA autotunes each kernel per (H, HV, K, V) on first use, which takes minutes; Triton
        # keeps the results in TRITON_CACHE_DIR, saved to $OUT and restored from $PRE when carried.
        export TRITON_CACHE_DIR=/tmp/triton_cache
        mkdir -p $TRITON_CACHE_DIR
        [ -f $PRE/triton_autotune.tgz ] && tar xzf $PRE/triton_autotune.tgz -C $TRITON_CACHE_DIR
        export PYTHONUNBUFFERED=1 PYTHONPATH=.peers/fla:python GDN_LIBRARY=$SO
        t0=$(date +%s)
        for w in B1_T32768_H16_HV32 B2_T16384_H16_HV16 B1_T8192_H2_HV8 B2_T4096_H16_HV64; do
            timeout ${FLA_WARM_TIMEOUT:-300} python3 bench/fla_prefill.py --warm $w >>"$OUT/fla.log" 2>&1 &
        done
        wait
        log "FLA autotune warm-up, four key sets in parallel: $(( $(date +%s) - t0 )) s"
        timeout ${FLA_TIMEOUT:-600} python3 bench/fla_prefill.py "${ours[@]}" ${FLA_ARGS:-} --out "$OUT/prefill_table.txt" 2>&1 |
            tee -a "$OUT/fla.log"
        log "fla_prefill: rc=$?"
        (cd $TRITON_CACHE_DIR && find . -name '*.autotune.json' | tar czf "$OUT/triton_autotune.tgz" -T -)
        ;;
    esac
done
cat "$OUT/summary.txt"
