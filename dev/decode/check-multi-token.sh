#!/usr/bin/env bash
# check-multi-token.sh - one device call that validates dev/decode/multi-token-running-scale.patch
# against main: copies main and main + the patch to /tmp, builds both for sm_90a (the library's C
# sources, the decode and gating CUDA files, a stub for the chunk op, as scripts/device_decode.sh
# does), runs tests/test_cuda_recurrent and compute-sanitizer memcheck on the patched build, times
# bench_decode of both (the patched bench source, which takes --T / --B, compiled against each
# tree) at T in {1, 2, 4, 8}, B in {64, 256}, f32 and bf16 state, and FLA (bench/fla_decode.py)
# on the same shapes, then prints a short table last. Logs and summary.txt go to $OUT.
#
#   run(command="bash dev/decode/check-multi-token.sh 2>&1 | tail -n 60", carry=[".peers/fla"], timeout_s=600)
#
# Without .peers/fla, or with NO_FLA=1, the FLA columns are empty.
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode_check}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "$* t=$(el)" | tee -a "$OUT/summary.txt"; }
PATCH=$PWD/dev/decode/multi-token-running-scale.patch
TS=1,2,4,8
BS=64,256
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
NVCC_FLAGS=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas=-warn-spills
            -DGDN_WITH_CUDA -DGDN_BUILDING_LIBRARY)
CC_FLAGS=(-std=c11 -O2 -Wall -Wextra -DGDN_WITH_CUDA -DGDN_BUILDING_LIBRARY -I"$CUDA_HOME/include")
LIBS=(-L"$CUDA_HOME/lib64" -lcudart_static -lpthread -ldl -lrt -lm)

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null;
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } | tee "$OUT/summary.txt"

# Two copies of the tree: main as it is, and main + the patch.
for v in main fix; do
    rm -rf /tmp/gdn_$v && mkdir -p /tmp/gdn_$v
    cp -r include src tests bench /tmp/gdn_$v/
done
(cd /tmp/gdn_fix && { patch -p1 -s <"$PATCH" || git apply "$PATCH"; }) || { log "patch does not apply"; exit 1; }

# build DIR: the library objects, test_cuda_recurrent and bench_decode (from the patched bench
# source) under DIR/b; -Xptxas -v of the decode file in DIR/b/rec.log.
build() {
    local d=/tmp/gdn_$1 b=/tmp/gdn_$1/b pids=() fail=0
    mkdir -p $b
    cat >$b/chunk_stub.cu <<'EOF'
#include "cuda/cuda_common.cuh"
extern "C" size_t gdn_cuda_chunk_fwd_workspace_size(const gdn_problem *p) { (void)p; return 0; }
extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p)
{
    (void)p;
    return gdn_set_error(GDN_ERR_NOT_IMPLEMENTED, "chunk_fwd: not built by check-multi-token.sh");
}
EOF
    local inc=(-I$d/include -I$d/src)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -Xptxas -v -c $d/src/cuda/sm90_recurrent_fwd.cu -o $b/rec.o >$b/rec.log 2>&1 & pids+=($!)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -c $d/src/cuda/cuda_gating.cu -o $b/gating.o >$b/gating.log 2>&1 & pids+=($!)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -c $b/chunk_stub.cu -o $b/chunk_stub.o >$b/stub.log 2>&1 & pids+=($!)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -c /tmp/gdn_fix/bench/bench_decode.cu -o $b/bench_decode.o >$b/bench.log 2>&1 &
    pids+=($!)
    local libobjs=($b/rec.o $b/gating.o $b/chunk_stub.o)
    for f in $d/src/api.c $d/src/cpu/*.c; do
        gcc "${CC_FLAGS[@]}" "${inc[@]}" -c $f -o $b/$(basename $f).o >$b/$(basename $f).log 2>&1 & pids+=($!)
        libobjs+=($b/$(basename $f).o)
    done
    for f in test_util test_cuda_recurrent; do
        gcc "${CC_FLAGS[@]}" "${inc[@]}" -I$d/tests -c $d/tests/$f.c -o $b/$f.o >$b/$f.log 2>&1 & pids+=($!)
    done
    for p in "${pids[@]}"; do wait $p || fail=1; done
    [ $fail = 0 ] || { cat $b/*.log | grep -E "error" | head -20; return 1; }
    g++ -o $b/test_cuda_recurrent $b/test_cuda_recurrent.o $b/test_util.o "${libobjs[@]}" "${LIBS[@]}" &&
        g++ -o $b/bench_decode $b/bench_decode.o "${libobjs[@]}" "${LIBS[@]}"
}
build main >"$OUT/build_main.log" 2>&1 & pm=$!
build fix >"$OUT/build_fix.log" 2>&1 & pf=$!
wait $pm; rm_=$?
wait $pf; rf=$?
log "build main rc=$rm_ fix rc=$rf"
for v in main fix; do
    cp /tmp/gdn_$v/b/rec.log "$OUT/ptxas_$v.log" 2>/dev/null
    for st in "f32 f13__nv_bfloat16" "bf16 13__nv_bfloat16S1_"; do
        echo "$v fast path K=128 ${st%% *} state, bf16 inputs: $(grep -A2 "recurrent_fwd_tma_kernelILi128E${st#* }Li2E" \
            "$OUT/ptxas_$v.log" | grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
    done | tee -a "$OUT/summary.txt"
done
[ $rf = 0 ] || { cat "$OUT/build_fix.log" | tail -n 30; exit 1; }
F=/tmp/gdn_fix/b
M=/tmp/gdn_main/b

timeout 120 $F/test_cuda_recurrent >"$OUT/test_fix.log" 2>&1
log "test fix rc=$? $(tail -n 1 "$OUT/test_fix.log")"
grep -E "FAIL" "$OUT/test_fix.log" | head -20
grep -E "extreme_gates" "$OUT/test_fix.log" | head -3

timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $F/test_cuda_recurrent pool_decode pool_spec_verify \
    extreme_gates bad_device gating >"$OUT/memcheck_fix.log" 2>&1
log "memcheck fix rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck_fix.log" | tail -n 1)"

for v in main fix; do
    d=/tmp/gdn_$v/b
    [ -x $d/bench_decode ] || continue
    timeout 150 $d/bench_decode --T $TS --B $BS --tsv "$OUT/bench_$v.tsv" >"$OUT/bench_$v.log" 2>&1
    log "bench $v rc=$? $(grep -c '^check.* ok$' "$OUT/bench_$v.log") of 4 checks vs CPU ok"
    grep -E "^check" "$OUT/bench_$v.log"
done

if [ -z "${NO_FLA:-}" ] && [ -d .peers/fla ]; then
    left=$(( 580 - $(el) ))
    if [ $left -gt 30 ]; then
        PYTHONUNBUFFERED=1 PYTHONPATH=.peers/fla timeout $left python3 /tmp/gdn_fix/bench/fla_decode.py --T $TS --B $BS \
            --tsv "$OUT/fla.tsv" >"$OUT/fla.log" 2>&1
        log "fla rc=$?"
    fi
fi

# The table: cold us per call (rotating buffers, CUDA graph replay), patch / main, and each
# column's cost relative to its own T = 1 at the same B (the targets: T=4 <= 1.15x, T=8 <= 1.3x).
python3 - "$OUT" >"$OUT/table.txt" <<'EOF'
import os, sys
out = sys.argv[1]

def read(path, ours):
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        f = line.split("\t")
        if line.startswith("#") or not f[0] or f[0] in ("state", "T"):
            continue
        if ours:
            rows[(f[0], int(f[1]), int(f[2]))] = float(f[4])
        else:
            rows[("f32", int(f[0]), int(f[1]))] = float(f[3])
    return rows

m, x, fla = read(f"{out}/bench_main.tsv", 1), read(f"{out}/bench_fix.tsv", 1), read(f"{out}/fla.tsv", 0)
print("cold us per call; xT1 = time / the same column's T=1 time at the same B; FLA: f32 state only")
print(f"{'state':5} {'B':>4} {'T':>2} {'main':>9} {'patch':>9} {'patch/main':>10} {'FLA':>9} | "
      f"{'main xT1':>8} {'patch xT1':>9} {'FLA xT1':>8}")
for st in ("f32", "bf16"):
    for B in sorted({k[2] for k in m} | {k[2] for k in x}):
        for T in sorted({k[1] for k in m} | {k[1] for k in x}):
            k, k1 = (st, T, B), (st, 1, B)
            def f(d, key):
                return f"{d[key]:9.2f}" if key in d else f"{'-':>9}"
            def r(d):
                return f"{d[k] / d[k1]:8.2f}x" if k in d and k1 in d else f"{'-':>9}"
            ratio = f"{x[k] / m[k]:10.3f}" if k in x and k in m else f"{'-':>10}"
            print(f"{st:5} {B:>4} {T:>2} {f(m, k)} {f(x, k)} {ratio} {f(fla, k)} | {r(m)} {r(x)} {r(fla)}")
EOF
cat "$OUT/table.txt" | tee -a "$OUT/summary.txt"
exit 0
