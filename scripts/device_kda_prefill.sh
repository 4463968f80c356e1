#!/usr/bin/env bash
# device_kda_prefill.sh - one device call for KDA's chunked prefill on CUDA (issue 16): build,
# correctness tests, compute-sanitizer, the benchmark against FLA. Writes logs and
# kda_prefill_table.txt to $OUT.
#
#   scripts/device_kda_prefill.sh [test] [pytest] [sanitize] [fla]     (no argument: all four)
#
# test      tests/test_cuda_chunk, every case (GDN's and the kda_* ones)
# pytest    python/tests/test_kda.py on the library just built (cpu and cuda)
# sanitize  compute-sanitizer memcheck and racecheck on every kda_* case of test_cuda_chunk
#           (SANITIZE_CASES overrides the list; names the binary does not know select nothing)
# fla       bench/fla_kda_prefill.py: FLA's chunk_kda beside libgdn's, same inputs, graph and eager;
#           accuracy of both vs float64 (needs .peers/fla carried: run(carry=[".peers/fla"]));
#           FLA_ARGS adds options (--only SUBSTR, --skip-accuracy)
#
# Builds the library and the test with CMake (-DGDN_CUDA=ON -DGDN_BENCH=ON) into build-device.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kda_prefill_out}
mkdir -p "$OUT"
steps=${*:-test pytest sanitize fla}
B=build-device
PRE=build-prefill/dev
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; git status --short src tests bench scripts python 2>/dev/null; \
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } | tee "$OUT/summary.txt"

if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
    export PATH="/usr/local/cuda/bin:$PATH" # so CMake finds the CUDA compiler
fi
t0=$(date +%s)
if cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DGDN_BENCH=ON >"$OUT/build.log" 2>&1 &&
   cmake --build $B -j"$(nproc)" --target gdn test_cuda_chunk >>"$OUT/build.log" 2>&1; then
    SO=$PWD/$B/libgdn.so
    TEST=$B/tests/test_cuda_chunk
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
        log "test_cuda_chunk: $(tail -n 1 "$OUT/test.log"); kda: $(grep -cE '^PASS +kda' "$OUT/test.log") passed," \
            "$(grep -cE '^FAIL +kda' "$OUT/test.log") failed ($(( $(date +%s) - t0 )) s)"
        ;;
    pytest)
        t0=$(date +%s)
        GDN_LIBRARY=$SO PYTHONPATH=python python3 -m pytest python/tests/test_kda.py -q -rs -p no:cacheprovider \
            >"$OUT/pytest_kda.log" 2>&1
        log "pytest test_kda.py: rc=$? $(tail -n 1 "$OUT/pytest_kda.log") ($(( $(date +%s) - t0 )) s)"
        ;;
    sanitize)
        # A sanitized run is 10-100x slower: each tool gets SANITIZE_TIMEOUT seconds (rc 124 past it).
        t0=$(date +%s)
        cases=${SANITIZE_CASES:-kda_basic kda_heads kda_raw_gates kda_extreme kda_states kda_varlen kda_cp kda_coop kda_many kda_pool}
        for tool in memcheck racecheck; do
            timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool $tool --error-exitcode 9 $TEST $cases \
                >"$OUT/$tool.log" 2>&1
            log "$tool ($cases): rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/$tool.log" | tail -n 1);" \
                "$(grep -E '^[0-9]+ passed' "$OUT/$tool.log" | tail -n 1) ($(( $(date +%s) - t0 )) s)"
        done
        ;;
    fla)
        # FLA autotunes each kernel on first use, which takes minutes; Triton keeps the results in
        # TRITON_CACHE_DIR, saved to $OUT and restored from $PRE when carried.
        export TRITON_CACHE_DIR=/tmp/triton_cache
        mkdir -p $TRITON_CACHE_DIR
        [ -f $PRE/triton_kda_autotune.tgz ] && tar xzf $PRE/triton_kda_autotune.tgz -C $TRITON_CACHE_DIR
        export PYTHONUNBUFFERED=1 PYTHONPATH=.peers/fla:python GDN_LIBRARY=$SO
        t0=$(date +%s)
        # One warm-up per FLA key set (head count, gate form), in parallel unless FLA_WARM_SERIAL=1:
        # autotuning beside other processes can pick a slower config than it would alone.
        for w in B2_T16384_H64_safe B1_T32768_H32_safe B1_T65536_H4_safe B2_T16384_H64_g; do
            if [ "${FLA_WARM_SERIAL:-0}" = 1 ]; then
                timeout "${FLA_WARM_TIMEOUT:-300}" python3 bench/fla_kda_prefill.py --warm $w >>"$OUT/fla.log" 2>&1
            else
                timeout "${FLA_WARM_TIMEOUT:-300}" python3 bench/fla_kda_prefill.py --warm $w >>"$OUT/fla.log" 2>&1 &
            fi
        done
        wait
        log "FLA autotune warm-up, four key sets$([ "${FLA_WARM_SERIAL:-0}" = 1 ] || echo ' in parallel'): $(( $(date +%s) - t0 )) s"
        timeout "${FLA_TIMEOUT:-600}" python3 bench/fla_kda_prefill.py ${FLA_ARGS:-} --out "$OUT/kda_prefill_table.txt" 2>&1 |
            tee -a "$OUT/fla.log"
        log "fla_kda_prefill: rc=$? $(grep -E '^relative RMS error' "$OUT/kda_prefill_table.txt" 2>/dev/null | sed 's/.*: //')"
        (cd $TRITON_CACHE_DIR && find . -name '*.autotune.json' | tar czf "$OUT/triton_kda_autotune.tgz" -T -)
        ;;
    esac
done
cat "$OUT/summary.txt"
