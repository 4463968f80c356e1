#!/usr/bin/env bash
# check-wg.sh - one device call for chunk_wg (the main pass on wgmma, src/cuda/sm90_chunk_wg.cuh):
# builds the tree twice with CMake (Release): "wg" as it is, and "mma" with -DGDN_CHUNK_DEV_NO_WG
# (chunk_main's mma.sync tiles for the main pass, as before chunk_wg). Runs test_cuda_chunk (all
# cases) on wg, compute-sanitizer memcheck and racecheck on a few cases, bench_prefill of both,
# and with FLA=1 bench/fla_prefill.py beside wg (accuracy and times; carry .peers/fla and the
# autotune cache). Logs under $OUT; table last.
#   run(command="bash dev/prefill/check-wg.sh 2>&1 | tail -n 50", kind="nvidia-h100-x1", timeout_s=400)
set -u -o pipefail
cd "$(dirname "$0")/../.."
R=$PWD
OUT=${OUT:-/tmp/wg_check}
mkdir -p "$OUT"
t0=$(date +%s)
log() { echo "$* t=$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/summary.txt"

if [ -n "${FLA:-}" ] && [ -d .peers/fla ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.peers/fla:$R/python TRITON_CACHE_DIR=/tmp/triton_cache
    mkdir -p $TRITON_CACHE_DIR
    [ -f build-prefill/dev/triton_autotune.tgz ] && tar xzf build-prefill/dev/triton_autotune.tgz -C $TRITON_CACHE_DIR
    for w in B1_T8192_H2_HV8 B1_T32768_H16_HV32 B2_T16384_H16_HV16; do
        timeout 200 python3 bench/fla_prefill.py --warm $w >>"$OUT/fla_warm.log" 2>&1 &
    done
fi

build() { # build DIR CUDA_FLAGS TARGETS...
    local d=$1 f=$2
    shift 2
    cmake -S $R -B $d -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$f" >"$d.log" 2>&1 &&
        cmake --build $d -j8 --target "$@" >>"$d.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$R/include $R/bench/bench_prefill.cu $d/libgdn_static.a -lpthread -o $d/bench_prefill >>"$d.log" 2>&1
}
build /tmp/wg "" gdn gdn_static test_cuda_chunk & p1=$!
build /tmp/mma "-DGDN_CHUNK_DEV_NO_WG" gdn_static & p2=$!
wait $p1; r1=$?
wait $p2; r2=$?
log "build wg rc=$r1 mma rc=$r2"
[ $r1 = 0 ] || { tail -n 30 /tmp/wg.log; exit 1; }

timeout 200 /tmp/wg/tests/test_cuda_chunk >"$OUT/test.log" 2>&1
log "test_cuda_chunk (wg) rc=$? $(tail -n 1 "$OUT/test.log")"
grep -E "^FAIL|worst" "$OUT/test.log" | head -n 20
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/wg/tests/test_cuda_chunk basic varlen odd_lengths \
    cp_small narrow_values graph_capture >"$OUT/memcheck.log" 2>&1
log "memcheck rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
grep -m 6 -E "^=+ +(Invalid|Error)|^FAIL" "$OUT/memcheck.log"
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/wg/tests/test_cuda_chunk basic cp_small \
    >"$OUT/racecheck.log" 2>&1
log "racecheck rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -n 1)"
grep -m 6 -E "^=+ +(Error|Race|Warning)" "$OUT/racecheck.log"
for v in wg mma; do
    [ -x /tmp/$v/bench_prefill ] && timeout 90 /tmp/$v/bench_prefill "$OUT/b_$v.txt" >"$OUT/bench_$v.log" 2>&1
done
log "bench done"
if [ -n "${FLA:-}" ] && [ -d .peers/fla ]; then
    wait
    GDN_LIBRARY=/tmp/wg/libgdn.so timeout $(( ${BUDGET:-560} - $(date +%s) + t0 )) python3 bench/fla_prefill.py \
        --ours "$OUT/b_wg.txt" --out "$OUT/fla_table.txt" >"$OUT/fla.log" 2>&1
    log "fla rc=$?"
fi
echo "== bench_prefill graph ms (eager ms): wg = chunk_wg main pass, mma = chunk_main (mma.sync)"
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
a, b = rd("wg"), rd("mma")
print(f"{'shape':26} {'mma':>18} {'wg':>18} {'wg/mma':>7}")
for k in a:
    if k in b:
        print(f"{k:26} {b[k][0]:8.4f} ({b[k][1]:7.4f}) {a[k][0]:8.4f} ({a[k][1]:7.4f}) {a[k][0] / b[k][0]:7.3f}")
PY
[ -f "$OUT/fla_table.txt" ] && tail -n 12 "$OUT/fla_table.txt"
exit 0
