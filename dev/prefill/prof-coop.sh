#!/usr/bin/env bash
# prof-coop.sh - where the cooperative prefill path (launch_coop) spends its time, at the two shapes
# that take it. Builds (CMake Release, library + bench_prefill only):
#   main    as it is
#   nocoop  -DGDN_CHUNK_DEV_NO_COOP: chunk_prep, then the main pass (two kernels)
#   prep    -DGDN_CHUNK_DEV_COOP_PROBE=1: from the second call on, the prep units alone (main CTAs exit)
#   mainonly -DGDN_CHUNK_DEV_COOP_PROBE=2: from the second call on, the main pass alone (flags preset)
#   noflag  =3: as mainonly, without the flag polls
#   blk1, blk8  -DGDN_CHUNK_DEV_FLAG_BLOCK=1 / 8: the main pass polls per chunk / per 8 chunks
#   h2, h4  -DGDN_CHUNK_DEV_PREP_HEADS=2 / 4: chunk_prep head groups of at most 2 / 4, no wave rule
#   scan4, scan8  -DGDN_CHUNK_DEV_SCAN_ROWS=4 / 8: cp_scan value rows per CTA (at most 8: the partial sums fill M^T's place)
# SHAPES="..." picks the shapes of the per-variant table
# VARIANTS="..." picks (default: main nocoop prep mainonly); NO_NCU=1 skips ncu
#   base    with BASE=DIR (another revision's tree, carried): that tree as it is
# test_cuda_chunk on main; bench_prefill per shape and variant (one shape per process: the probes
# count calls), main and base at every shape; then ncu (--set full) of chunk_prep and of the main
# pass in the nocoop build at B1_T32768_H16_HV32, with ncu_stalls.py's top lines for chunk_prep.
# Logs tarred into $OUT/logs.tgz; table last.
#   run(command="bash dev/prefill/prof-coop.sh 2>&1 | tail -n 60", kind="nvidia-h100-x1", timeout_s=600)
set -u -o pipefail
cd "$(dirname "$0")/../.."
R=$PWD
OUT=${OUT:-/tmp/prof_coop}
mkdir -p "$OUT"
LOGS=/tmp/prof_coop_logs
rm -rf $LOGS && mkdir -p $LOGS
trap 'tar czf "$OUT/logs.tgz" -C $LOGS . 2>/dev/null' EXIT
t0=$(date +%s)
log() { echo "$* t=$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; } | tee "$OUT/summary.txt"
flags() {
    case $1 in
    nocoop) echo "-DGDN_CHUNK_DEV_NO_COOP" ;;
    prep) echo "-DGDN_CHUNK_DEV_COOP_PROBE=1" ;;
    mainonly) echo "-DGDN_CHUNK_DEV_COOP_PROBE=2" ;;
    noflag) echo "-DGDN_CHUNK_DEV_COOP_PROBE=3" ;;
    blk1) echo "-DGDN_CHUNK_DEV_FLAG_BLOCK=1" ;;
    blk8) echo "-DGDN_CHUNK_DEV_FLAG_BLOCK=8" ;;
    h2) echo "-DGDN_CHUNK_DEV_PREP_HEADS=2" ;;
    h4) echo "-DGDN_CHUNK_DEV_PREP_HEADS=4" ;;
    scan4) echo "-DGDN_CHUNK_DEV_SCAN_ROWS=4" ;;
    scan8) echo "-DGDN_CHUNK_DEV_SCAN_ROWS=8" ;;
    esac
}
build() {
    local d=/tmp/p_$1 src=$R tg=gdn_static
    [ "$1" = base ] && src=$R/$BASE
    [ "$1" = main ] && tg="gdn_static test_cuda_chunk"
    cmake -S $src -B $d -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$(flags "$1")" >"$LOGS/build_$1.log" 2>&1 &&
        cmake --build $d -j4 --target $tg >>"$LOGS/build_$1.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$src/include $src/bench/bench_prefill.cu $(ls $d/libgdn.a $d/libgdn_static.a 2>/dev/null | head -1) -lpthread -o $d/bench_prefill >>"$LOGS/build_$1.log" 2>&1
}
VARIANTS=${VARIANTS:-main nocoop prep mainonly}
ALL="$VARIANTS${BASE:+ base}"
for v in $ALL; do build $v & eval "pid_$v=$!"; done
for v in $ALL; do eval "wait \$pid_$v"; eval "log \"build $v rc=\$?\""; done
if [ -x /tmp/p_main/tests/test_cuda_chunk ]; then
    timeout 150 /tmp/p_main/tests/test_cuda_chunk >"$LOGS/test_main.log" 2>&1
    log "test_cuda_chunk main rc=$? $(tail -n 1 "$LOGS/test_main.log")"
    grep "^FAIL" "$LOGS/test_main.log"
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/p_main/tests/test_cuda_chunk basic gva varlen \
        odd_lengths cp_small graph_capture >"$LOGS/memcheck.log" 2>&1
    log "memcheck main rc=$? $(grep 'ERROR SUMMARY' "$LOGS/memcheck.log" | tail -n 1)"
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/p_main/tests/test_cuda_chunk basic gva cp_small \
        >"$LOGS/racecheck.log" 2>&1
    log "racecheck main rc=$? $(grep 'RACECHECK SUMMARY' "$LOGS/racecheck.log" | tail -n 1)"
fi
for v in main ${BASE:+base}; do
    [ -x /tmp/p_$v/bench_prefill ] && timeout 90 /tmp/p_$v/bench_prefill "$OUT/b_$v.txt" >"$LOGS/bench_$v.log" 2>&1
done
SHAPES=${SHAPES:-B1_T32768_H16_HV32 B2_T16384_H16_HV16}
for s in $SHAPES; do
    for v in $VARIANTS; do
        [ -x /tmp/p_$v/bench_prefill ] && timeout 60 /tmp/p_$v/bench_prefill "$LOGS/b_${v}_$s.txt" $s >"$LOGS/bench_${v}_$s.log" 2>&1
    done
done
log "bench done"
N=/tmp/p_nocoop/bench_prefill
if [ -z "${NO_NCU:-}" ] && [ -x $N ] && command -v ncu >/dev/null; then
    for k in chunk_prep chunk_wg; do
        timeout 150 ncu --set full -k regex:$k --launch-count 1 -o $LOGS/rep_$k $N - B1_T32768_H16_HV32 >"$LOGS/ncu_$k.log" 2>&1
        log "ncu $k rc=$?"
        ncu -i $LOGS/rep_$k.ncu-rep --page details --csv >"$LOGS/details_$k.csv" 2>/dev/null
        ncu -i $LOGS/rep_$k.ncu-rep --page source --csv --print-source sass >"$LOGS/src_$k.csv" 2>/dev/null
    done
    python3 - "$LOGS" <<'PY' | tee -a "$OUT/summary.txt"
import csv, sys
d = sys.argv[1]
want = ["Duration", "SM Frequency", "Elapsed Cycles", "Executed Instructions", "Issue Slots Busy", "Issued Warp Per Scheduler",
        "Achieved Occupancy", "Theoretical Occupancy", "Registers Per Thread", "Compute (SM) Throughput", "Memory Throughput",
        "L1/TEX Hit Rate", "L2 Hit Rate", "Warp Cycles Per Issued Instruction", "Block Limit Registers", "Block Limit Shared Mem",
        "Grid Size", "Dynamic Shared Memory Per Block"]
for k in ["chunk_prep", "chunk_wg"]:
    try:
        rows = list(csv.reader(open(f"{d}/details_{k}.csv")))
    except OSError:
        continue
    h = rows[0]
    mi, ui, vi = h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
    seen = {}
    for r in rows[1:]:
        if len(r) > vi and r[mi] in want and r[mi] not in seen:
            seen[r[mi]] = f"{r[vi]} {r[ui]}".strip()
    print(f"== ncu {k} (nocoop build, B1_T32768_H16_HV32): " + "; ".join(f"{m} {seen[m]}" for m in want if m in seen))
PY
    python3 dev/prefill/ncu_stalls.py $LOGS/src_chunk_prep.csv 30 2>&1 | tee $LOGS/stalls_prep.txt | head -n 34
fi
echo "== bench_prefill graph ms (eager ms), one shape per process"
for s in $SHAPES; do
    line="$s"
    for v in $VARIANTS; do
        x=$(awk -v s=$s '$1==s {printf "%.4f (%.4f)", $3, $4}' "$LOGS/b_${v}_$s.txt" 2>/dev/null)
        line="$line | $v ${x:--}"
    done
    echo "$line" | tee -a "$OUT/summary.txt"
done
if [ -n "${BASE:-}" ]; then
    echo "== all shapes, graph ms (eager ms): base, main, main/base"
    join <(sort "$OUT/b_base.txt") <(sort "$OUT/b_main.txt") 2>/dev/null |
        awk '$3 > 0 {printf "%-26s %8.4f (%7.4f) %8.4f (%7.4f) %6.3f\n", $1, $3, $4, $6, $7, $6 / $3}' | tee -a "$OUT/summary.txt"
fi
exit 0
