#!/usr/bin/env bash
# check.sh - one device call that validates dev/prefill/chunk-copy-warp-keysplit.patch against
# main: builds main and main + patch with CMake (Release) in /tmp, runs tests/test_cuda_chunk,
# compute-sanitizer memcheck and racecheck, bench_prefill of both, and bench/fla_prefill.py with
# FLA beside the patched library. Logs and summary.txt go to $OUT.
#
#   run(command="bash dev/prefill/check.sh 2>&1 | tail -n 80", carry=[".peers/fla", ".stage"], timeout_s=600)
#
# .stage is optional: when it holds the unfixed variant D (.stage/D/test_cuda_chunk), racecheck
# runs on it too, as the control that still reports the hazards; its triton_autotune.tgz (or
# build-prefill/dev's) saves FLA's autotuning. Without .peers/fla the FLA step is skipped.
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/prefill_check}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "$* t=$(el)" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"
PATCH=$PWD/dev/prefill/chunk-copy-warp-keysplit.patch

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null;
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } | tee "$OUT/summary.txt"

# Two copies of the tree: main as it is, and main + the patch.
for v in main fix; do
    rm -rf /tmp/gdn_$v && mkdir -p /tmp/gdn_$v
    cp -r CMakeLists.txt include src tests tools bench /tmp/gdn_$v/
done
(cd /tmp/gdn_fix && { patch -p1 -s <"$PATCH" || git apply "$PATCH"; }) || { log "patch does not apply"; exit 1; }

build() {
    local d=/tmp/gdn_$1
    cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON >"$OUT/build_$1.log" 2>&1 &&
        cmake --build $d/build -j8 --target gdn gdn_static test_cuda_chunk >>"$OUT/build_$1.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$d/include $d/bench/bench_prefill.cu $d/build/libgdn_static.a -lpthread \
            -o $d/build/bench_prefill >>"$OUT/build_$1.log" 2>&1
}
build main & pm=$!
build fix & pf=$!
wait $pm; rm_=$?
wait $pf; rf=$?
log "build main rc=$rm_ fix rc=$rf"
[ $rf = 0 ] || { tail -n 30 "$OUT/build_fix.log"; exit 1; }
F=/tmp/gdn_fix/build
M=/tmp/gdn_main/build

$F/tests/test_cuda_chunk >"$OUT/test_fix.log" 2>&1
log "test fix rc=$? $(tail -n 1 "$OUT/test_fix.log")"

CASES="basic mid_heads varlen odd_lengths"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $F/tests/test_cuda_chunk $CASES >"$OUT/memcheck_fix.log" 2>&1
log "memcheck fix rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck_fix.log" | tail -n 1)"
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $F/tests/test_cuda_chunk $CASES >"$OUT/racecheck_fix.log" 2>&1
log "racecheck fix rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/racecheck_fix.log" | tail -n 1)"
if [ -x .stage/D/test_cuda_chunk ]; then
    timeout 30 compute-sanitizer --tool racecheck --error-exitcode 9 .stage/D/test_cuda_chunk basic \
        >"$OUT/racecheck_D.log" 2>&1
    log "racecheck D (control, unfixed) rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/racecheck_D.log" | tail -n 1)"
fi

for v in main fix; do
    d=/tmp/gdn_$v/build
    [ -x $d/bench_prefill ] || continue
    $d/bench_prefill "$OUT/bench_$v.txt" >"$OUT/bench_$v.log" 2>&1
    log "bench $v rc=$?"
done

if [ -z "${NO_FLA:-}" ] && [ -d .peers/fla ] && [ -f "$OUT/bench_fix.txt" ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=.peers/fla:python GDN_LIBRARY=$F/libgdn.so
    export TRITON_CACHE_DIR=/tmp/triton_cache
    mkdir -p $TRITON_CACHE_DIR
    for tgz in .stage/triton_autotune.tgz build-prefill/dev/triton_autotune.tgz; do
        [ -f $tgz ] && { tar xzf $tgz -C $TRITON_CACHE_DIR; break; }
    done
    for w in B1_T8192_H2_HV8 B1_T32768_H16_HV32 B2_T16384_H16_HV16; do
        timeout 150 python3 /tmp/gdn_fix/bench/fla_prefill.py --warm $w >>"$OUT/fla_warm.log" 2>&1 &
    done
    wait
    log "fla warm-up done: $(grep -c warmed "$OUT/fla_warm.log") of 3"
    left=$(( 570 - $(el) ))
    if [ $left -gt 60 ]; then
        timeout $left python3 /tmp/gdn_fix/bench/fla_prefill.py --skip-accuracy --ours "$OUT/bench_fix.txt" \
            --out "$OUT/fla_table.txt" >"$OUT/fla.log" 2>&1
        log "fla rc=$?"
    fi
fi

echo "== bench_prefill (variant shape tokens graph_ms eager_ms)" | tee -a "$OUT/summary.txt"
for v in main fix; do [ -f "$OUT/bench_$v.txt" ] && sed "s/^/$v /" "$OUT/bench_$v.txt"; done | tee -a "$OUT/summary.txt"
[ -f "$OUT/fla_table.txt" ] && tail -n 12 "$OUT/fla_table.txt" | tee -a "$OUT/summary.txt"
exit 0
