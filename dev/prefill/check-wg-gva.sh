#!/usr/bin/env bash
# check-wg-gva.sh - one device call for the prefill path as it is (chunk_prep with head groups for
# GVA, chunk_wg), against the same tree built two other ways (CMake Release each):
#   main     as it is
#   nogroup  -DGDN_CHUNK_DEV_PREP_HEADS=1: chunk_prep one head per CTA everywhere
#   h4       -DGDN_CHUNK_DEV_PREP_HEADS=4: the largest group dividing G at every size, so that the
#            tests take the grouped path (G = 2, 3, 4, 9 in test_cuda_chunk)
# Runs test_cuda_chunk (all) on main and h4; prep_gva_digest (fixed inputs, digests of o and the
# final state) on main, nogroup and h4, which must agree bit for bit; memcheck on main and h4,
# racecheck on main and h4; bench_prefill of main and nogroup; with FLA=1, FLA beside main.
# BASE=DIR (a copy of another revision's tree, e.g. `git archive REV | tar x -C .stage/base`, carried)
# adds a build "base" of that tree to the benchmark table, for an A/B in the same run
# (bench/fla_prefill.py with accuracy; carry .peers/fla and build-prefill/dev/triton_autotune.tgz).
# Logs in $OUT; table last.
#   run(command="FLA=1 bash dev/prefill/check-wg-gva.sh 2>&1 | tail -n 60",
#       carry=[".peers/fla", "build-prefill/dev/triton_autotune.tgz"], kind="nvidia-h100-x1", timeout_s=600)
set -u -o pipefail
cd "$(dirname "$0")/../.."
R=$PWD
OUT=${OUT:-/tmp/wg_gva_check}
BUDGET=${BUDGET:-570}
mkdir -p "$OUT"
LOGS=/tmp/wg_gva_logs # everything but the summary, the tables and the timings goes to $OUT/logs.tgz
rm -rf $LOGS && mkdir -p $LOGS
trap 'tar czf "$OUT/logs.tgz" -C $LOGS . 2>/dev/null' EXIT
t0=$(date +%s)
log() { echo "$* t=$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/summary.txt"

if [ -n "${FLA:-}" ] && [ -d .peers/fla ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.peers/fla:$R/python TRITON_CACHE_DIR=/tmp/triton_cache
    mkdir -p $TRITON_CACHE_DIR
    [ -f build-prefill/dev/triton_autotune.tgz ] && tar xzf build-prefill/dev/triton_autotune.tgz -C $TRITON_CACHE_DIR
    for w in B1_T8192_H2_HV8 B1_T32768_H16_HV32 B2_T16384_H16_HV16; do
        timeout 240 python3 bench/fla_prefill.py --warm $w >>"$LOGS/fla_warm.log" 2>&1 &
    done
fi

flags() {
    case $1 in
    nogroup) echo "-DGDN_CHUNK_DEV_PREP_HEADS=1" ;;
    h4) echo "-DGDN_CHUNK_DEV_PREP_HEADS=4" ;;
    esac
}
build() {
    local d=/tmp/v_$1 tg="gdn_static gdn_test_util" src=$R
    [ "$1" = base ] && src=$R/$BASE
    case $1 in main) tg="$tg gdn test_cuda_chunk" ;; h4) tg="$tg test_cuda_chunk" ;; esac
    cmake -S $src -B $d -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$(flags "$1")" >"$d.log" 2>&1 &&
        cmake --build $d -j5 --target $tg >>"$d.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$src/include $src/bench/bench_prefill.cu $(ls $d/libgdn.a $d/libgdn_static.a 2>/dev/null | head -1) -lpthread -o $d/bench_prefill >>"$d.log" 2>&1 &&
        gcc -std=c11 -O2 -I$R/include -I$R/tests -I$CUDA_HOME/include $R/dev/prefill/prep_gva_digest.c \
            $d/tests/libgdn_test_util.a $(ls $d/libgdn.a $d/libgdn_static.a 2>/dev/null | head -1) -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread \
            -o $d/prep_gva_digest >>"$d.log" 2>&1
}
VARIANTS="main nogroup h4${BASE:+ base}"
for v in $VARIANTS; do build $v & eval "pid_$v=$!"; done
for v in $VARIANTS; do eval "wait \$pid_$v"; eval "log \"build $v rc=\$?\""; done
[ -x /tmp/v_main/tests/test_cuda_chunk ] || { tail -n 30 /tmp/v_main.log; exit 1; }

for v in main h4; do
    timeout 150 /tmp/v_$v/tests/test_cuda_chunk >"$LOGS/test_$v.log" 2>&1
    log "test_cuda_chunk $v rc=$? $(tail -n 1 "$LOGS/test_$v.log")"
    grep "^FAIL" "$LOGS/test_$v.log"
done
for v in $VARIANTS; do
    [ -x /tmp/v_$v/prep_gva_digest ] && timeout 60 /tmp/v_$v/prep_gva_digest >"$LOGS/digest_$v.txt" 2>&1
done
for v in nogroup h4 ${BASE:+base}; do
    if [ -s "$LOGS/digest_main.txt" ] && cmp -s "$LOGS/digest_main.txt" "$LOGS/digest_$v.txt"; then
        log "digest $v = main: bitwise identical ($(wc -l <"$LOGS/digest_main.txt") cases)"
    else
        log "digest $v DIFFERS from main"
        diff "$LOGS/digest_main.txt" "$LOGS/digest_$v.txt" | head -n 10
    fi
done
for v in main h4; do
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/v_$v/tests/test_cuda_chunk basic gva varlen \
        odd_lengths cp_small graph_capture >"$LOGS/memcheck_$v.log" 2>&1
    log "memcheck $v rc=$? $(grep 'ERROR SUMMARY' "$LOGS/memcheck_$v.log" | tail -n 1)"
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/v_$v/tests/test_cuda_chunk basic gva cp_small \
        >"$LOGS/racecheck_$v.log" 2>&1
    log "racecheck $v rc=$? $(grep 'RACECHECK SUMMARY' "$LOGS/racecheck_$v.log" | tail -n 1)"
done
for v in main nogroup base; do
    [ -x /tmp/v_$v/bench_prefill ] && timeout 90 /tmp/v_$v/bench_prefill "$OUT/b_$v.txt" >"$LOGS/bench_$v.log" 2>&1
done
log "bench done"
if [ -n "${FLA:-}" ] && [ -d .peers/fla ]; then
    wait
    left=$(( BUDGET - $(date +%s) + t0 ))
    GDN_LIBRARY=/tmp/v_main/libgdn.so timeout $left python3 bench/fla_prefill.py --ours "$OUT/b_main.txt" \
        --out "$OUT/fla_table.txt" >"$LOGS/fla.log" 2>&1
    log "fla rc=$? (limit $left s)"
fi
echo "== bench_prefill graph ms (eager ms)"
python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import sys
out = sys.argv[1]
def rd(v):
    d = {}
    try:
        for l in open(f"{out}/b_{v}.txt"):
            f = l.split()
            if len(f) >= 4 and f[0][0] in "Bv":
                d[f[0]] = (float(f[2]), float(f[3]))
    except OSError:
        pass
    return d
m, g, b = rd("main"), rd("nogroup"), rd("base")
print(f"{'shape':26} {'base':>8} {'nogroup':>8} {'main':>18} {'main/nogroup':>12} {'main/base':>9}")
for k in m:
    f = lambda d: f"{d[k][0]:8.4f}" if k in d else "       -"
    r = lambda d: f"{m[k][0] / d[k][0]:.3f}" if k in d else "-"
    print(f"{k:26} {f(b)} {f(g)} {m[k][0]:8.4f} ({m[k][1]:7.4f}) {r(g):>12} {r(b):>9}")
PY
[ -f "$OUT/fla_table.txt" ] && sed -n '/^case/,$p' "$OUT/fla_table.txt"
exit 0
