#!/usr/bin/env bash
# check-small-b.sh - one device call that checks branch helper-decode against main: builds main (a
# snapshot of main's include/src/tests/bench in $BASE, default .base/ of this worktree, made here
# with   git archive <main commit> include src tests bench | tar -x -C .base)
# and this tree side by side in /tmp (the library's C sources, the decode and gating CUDA files, a
# stub for the chunk op, as scripts/device_decode.sh does), runs tests/test_cuda_recurrent and
# compute-sanitizer memcheck on this tree, times bench_decode of both at T in {1, 4, 8}, B in
# {1, 8, 32, 64, 256} (hot and cold, f32 and bf16 state), the fast path with and without
# programmatic dependent launch (--pdl), and FLA on the same shapes when .peers/fla is carried,
# then prints a short table last. At most 8 files come back from the device: $OUT holds the
# summary, the table, the test, sanitizer and benchmark logs; the rest stays in /tmp.
#
#   run(command="cd .wt/decode && bash dev/decode/check-small-b.sh",
#       carry=[".wt/decode", ".peers/fla"], kind="nvidia-h100-x1", timeout_s=300)
set -u -o pipefail
cd "$(dirname "$0")/../.."
HERE=$PWD
OUT=${OUT:-/tmp/decode_check}
BASE=${BASE:-$HERE/.base}
FLA=${FLA:-$HERE/../../.peers/fla}
W=/tmp/decode_work   # what need not come back (at most 8 files do): build logs, tsv files
mkdir -p "$OUT" $W
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "$* t=$(el)" | tee -a "$OUT/summary.txt"; }
TS=1,4,8
BS=1,8,32,64,256
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
NVCC_FLAGS=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas=-warn-spills
            -DGDN_WITH_CUDA -DGDN_BUILDING_LIBRARY)
CC_FLAGS=(-std=c11 -O2 -Wall -Wextra -DGDN_WITH_CUDA -DGDN_BUILDING_LIBRARY -I"$CUDA_HOME/include")
LIBS=(-L"$CUDA_HOME/lib64" -lcudart_static -lpthread -ldl -lrt -lm)

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } |
    tee "$OUT/summary.txt"

rm -rf /tmp/gdn_main /tmp/gdn_var && mkdir -p /tmp/gdn_main /tmp/gdn_var
cp -r "$BASE"/include "$BASE"/src "$BASE"/tests "$BASE"/bench /tmp/gdn_main/ || { log "no main snapshot in $BASE"; exit 1; }
cp -r include src tests bench /tmp/gdn_var/

# build NAME: the library objects, test_cuda_recurrent and bench_decode of /tmp/gdn_NAME under
# /tmp/gdn_NAME/b; -Xptxas -v of the decode file in b/rec.log.
build() {
    local d=/tmp/gdn_$1 b=/tmp/gdn_$1/b pids=() fail=0
    mkdir -p $b
    cat >$b/chunk_stub.cu <<'EOF'
#include "cuda/cuda_common.cuh"
extern "C" size_t gdn_cuda_chunk_fwd_workspace_size(const gdn_problem *p) { (void)p; return 0; }
extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p)
{
    (void)p;
    return gdn_set_error(GDN_ERR_NOT_IMPLEMENTED, "chunk_fwd: not built by check-small-b.sh");
}
EOF
    local inc=(-I$d/include -I$d/src)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -Xptxas -v -c $d/src/cuda/sm90_recurrent_fwd.cu -o $b/rec.o >$b/rec.log 2>&1 & pids+=($!)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -c $d/src/cuda/cuda_gating.cu -o $b/gating.o >$b/gating.log 2>&1 & pids+=($!)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -c $b/chunk_stub.cu -o $b/chunk_stub.o >$b/stub.log 2>&1 & pids+=($!)
    nvcc "${NVCC_FLAGS[@]}" "${inc[@]}" -c $d/bench/bench_decode.cu -o $b/bench_decode.o >$b/bench.log 2>&1 & pids+=($!)
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
build main >$W/build_main.log 2>&1 & pm=$!
build var >$W/build_var.log 2>&1 & pv=$!
wait $pm; rm_=$?
wait $pv; rv=$?
log "build main rc=$rm_ var rc=$rv"
cp /tmp/gdn_var/b/rec.log /tmp/ptxas_var.log 2>/dev/null
echo "var registers (fast path, K=128, bf16 inputs, f32 / bf16 state): $(grep -A2 -E \
    "tma_kernelILi128E(f13__nv_bfloat16|13__nv_bfloat16S1_)Li2E" /tmp/ptxas_var.log |
    grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
[ $rv = 0 ] || { tail -n 30 $W/build_var.log; exit 1; }
V=/tmp/gdn_var/b
M=/tmp/gdn_main/b

timeout 100 $V/test_cuda_recurrent >"$OUT/test_var.log" 2>&1
log "test var rc=$? $(tail -n 1 "$OUT/test_var.log")"
grep -E "FAIL|call failed|_paths|many_heads" "$OUT/test_var.log" | head -12

timeout 90 $V/bench_decode --T $TS --B $BS --tsv $W/bench_var.tsv --pdl >"$OUT/bench_var.log" 2>&1
log "bench var rc=$? $(grep -c '^check.* ok$' "$OUT/bench_var.log") of 4 checks vs CPU ok"
grep -E "^pdl " "$OUT/bench_var.log"
if [ $rm_ = 0 ]; then
    timeout 40 $M/bench_decode --T $TS --B $BS --tsv $W/bench_main.tsv >"$OUT/bench_main.log" 2>&1
    log "bench main rc=$?"
fi

timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $V/test_cuda_recurrent pool_decode pool_spec_verify \
    strided_inputs bad_device multi_token_paths graph_capture >"$OUT/memcheck_var.log" 2>&1
log "memcheck var rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck_var.log" | tail -n 1) $(tail -n 1 "$OUT/memcheck_var.log")"

if [ -z "${NO_FLA:-}" ] && [ -d "$FLA" ]; then
    left=$(( 285 - $(el) ))
    if [ $left -gt 30 ]; then
        PYTHONUNBUFFERED=1 PYTHONPATH=$FLA timeout $left python3 bench/fla_decode.py --T $TS --B $BS \
            --tsv $W/fla.tsv >"$OUT/fla.log" 2>&1
        log "fla rc=$?"
    fi
fi

# The table: us per call (CUDA graph replay), hot and cold, var / main and FLA / var.
python3 - $W >"$OUT/table.txt" <<'EOF'
import os, sys
out = sys.argv[1]

def read(path, ours):
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if line.startswith("#") or not f[0] or f[0] in ("state", "T"):
            continue
        if ours:
            rows[(f[0], int(f[1]), int(f[2]))] = (float(f[3]), float(f[4]))
        else:
            rows[("f32", int(f[0]), int(f[1]))] = (float(f[2]), float(f[3]))
    return rows

m, x, fla = read(f"{out}/bench_main.tsv", 1), read(f"{out}/bench_var.tsv", 1), read(f"{out}/fla.tsv", 0)
print("us per call hot / cold; var/main < 1: variant faster; FLA/var > 1: variant faster (FLA: f32 state only)")
print(f"{'state':5} {'T':>2} {'B':>4} {'main hot':>9} {'cold':>8} {'var hot':>8} {'cold':>8} {'FLA hot':>8} {'cold':>8}"
      f" | {'v/m hot':>7} {'cold':>6} {'F/v hot':>7} {'cold':>6}")
keys = sorted(set(m) | set(x), key=lambda k: (k[0] != "f32", k[1], k[2]))
for k in keys:
    def f(d):
        return f"{d[k][0]:9.2f} {d[k][1]:8.2f}" if k in d else f"{'-':>9} {'-':>8}"
    def r(a, b):
        return f"{a[k][0] / b[k][0]:7.3f} {a[k][1] / b[k][1]:6.3f}" if k in a and k in b else f"{'-':>7} {'-':>6}"
    print(f"{k[0]:5} {k[1]:>2} {k[2]:>4} {f(m)} {f(x)[1:]} {f(fla)[1:]} | {r(x, m)} {r(fla, x)}")
EOF
cat "$OUT/table.txt" | tee -a "$OUT/summary.txt"
exit 0
