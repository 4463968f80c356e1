#!/usr/bin/env bash
# check-pdl.sh - one device call: the prefill kernels launched with programmatic dependent launch
# (main + dev/prefill/chunk-pdl.patch, applied to a copy in /tmp) against the same code built with
# -DGDN_CHUNK_DEV_NO_PDL (plain launches, as main launches today). Builds both with CMake Release, runs test_cuda_chunk and compute-sanitizer memcheck on the PDL build,
# bench_prefill of both, and FLA (bench/fla_prefill.py, no accuracy: PDL changes no arithmetic)
# beside the PDL build, with FLA's autotune warm-up during the builds. Table last.
#   run(command="bash dev/prefill/check-pdl.sh 2>&1 | tail -n 40",
#       carry=[".peers/fla", "build-prefill/dev/triton_autotune.tgz"], kind="nvidia-h100-x1", timeout_s=300)
set -u -o pipefail
cd "$(dirname "$0")/../.."
R=$PWD
OUT=${OUT:-/tmp/pdl_check}
mkdir -p "$OUT"
t0=$(date +%s)
log() { echo "$* t=$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"

FLA_OK=0
if [ -z "${NO_FLA:-}" ] && [ -d .peers/fla ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.peers/fla:$R/python TRITON_CACHE_DIR=/tmp/triton_cache
    mkdir -p $TRITON_CACHE_DIR
    [ -f build-prefill/dev/triton_autotune.tgz ] && tar xzf build-prefill/dev/triton_autotune.tgz -C $TRITON_CACHE_DIR
    for w in B1_T8192_H2_HV8 B1_T32768_H16_HV32 B2_T16384_H16_HV16; do
        timeout 150 python3 bench/fla_prefill.py --warm $w >>"$OUT/fla_warm.log" 2>&1 &
    done
    FLA_OK=1
fi

S=/tmp/pdl_src
rm -rf $S && mkdir -p $S && cp -r CMakeLists.txt include src tests tools bench $S/
(cd $S && patch -p1 -s <"$R/dev/prefill/chunk-pdl.patch") || { log "patch does not apply"; exit 1; }

build() { # build DIR CUDA_FLAGS TARGETS...
    local d=$1 f=$2
    shift 2
    cmake -S $S -B $d -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$f" >"$d.log" 2>&1 &&
        cmake --build $d -j6 --target "$@" >>"$d.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$S/include $S/bench/bench_prefill.cu $d/libgdn_static.a -lpthread -o $d/bench_prefill >>"$d.log" 2>&1
}
build /tmp/pdl "" gdn gdn_static test_cuda_chunk & p1=$!
build /tmp/nopdl "-DGDN_CHUNK_DEV_NO_PDL" gdn_static & p2=$!
wait $p1; r1=$?
wait $p2; r2=$?
log "build pdl rc=$r1 nopdl rc=$r2"
[ $r1 = 0 ] || { tail -n 20 /tmp/pdl.log; exit 1; }

/tmp/pdl/tests/test_cuda_chunk >"$OUT/test.log" 2>&1
log "test_cuda_chunk (pdl) rc=$? $(tail -n 1 "$OUT/test.log")"
compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/pdl/tests/test_cuda_chunk cp_small graph_capture varlen \
    >"$OUT/memcheck.log" 2>&1
log "memcheck (cp_small graph_capture varlen) rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
for v in pdl nopdl; do
    [ -x /tmp/$v/bench_prefill ] && /tmp/$v/bench_prefill "$OUT/b_$v.txt" >"$OUT/bench_$v.log" 2>&1
done
log "bench done"
if [ $FLA_OK = 1 ]; then
    wait
    log "fla warm-up: $(grep -c warmed "$OUT/fla_warm.log") of 3"
    GDN_LIBRARY=/tmp/pdl/libgdn.so timeout $(( 280 - $(date +%s) + t0 )) python3 bench/fla_prefill.py --skip-accuracy \
        --ours "$OUT/b_pdl.txt" --out "$OUT/fla_table.txt" >"$OUT/fla.log" 2>&1
    log "fla rc=$?"
fi
echo "== bench_prefill graph ms (eager ms): pdl = main, nopdl = plain launches"
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
a, b = rd("pdl"), rd("nopdl")
print(f"{'shape':26} {'nopdl':>18} {'pdl':>18} {'pdl/nopdl':>9}")
for k in a:
    if k in b:
        print(f"{k:26} {b[k][0]:8.4f} ({b[k][1]:7.4f}) {a[k][0]:8.4f} ({a[k][1]:7.4f}) {a[k][0] / b[k][0]:9.3f}")
PY
[ -f "$OUT/fla_table.txt" ] && tail -n 9 "$OUT/fla_table.txt"
exit 0
