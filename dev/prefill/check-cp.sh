#!/usr/bin/env bash
# check-cp.sh - one device call for the prefill helper's branch (context parallelism for few
# (sequence, head) pairs, tile choice at ~32 pairs). Builds with CMake (Release) in /tmp, side by
# side:
#   main   the tree at the repository root (the lead's main)
#   var    this worktree
#   nocp   this worktree with -DGDN_CHUNK_DEV_NO_CP (the plain path: accuracy and time baseline)
#   t21    this worktree with the tile forced to <NW=2, KS=1>   (32-pair shapes only)
#   t41    this worktree with the tile forced to <NW=4, KS=1>   (32-pair shapes only)
# then runs test_cuda_chunk (var; cp / cp_long of nocp for the error baseline), compute-sanitizer
# memcheck and racecheck, bench_prefill, and with FLA=1 bench/fla_prefill.py beside var.
#
#   run(command="cd .wt/prefill && bash dev/prefill/check-cp.sh 2>&1 | tail -n 60",
#       carry=[".wt/prefill"], timeout_s=300)
set -u -o pipefail
W=$(cd "$(dirname "$0")/../.." && pwd)   # this worktree
R=$(cd "$W/../.." && pwd)                 # the repository root holding .wt/<name>
OUT=${OUT:-/tmp/prefill_cp}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "$* t=$(el)" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"

{ date -u; (cd "$W" && git log -1 --format='var commit %h %s' 2>/dev/null); (cd "$R" && git log -1 --format='main commit %h %s' 2>/dev/null);
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } | tee "$OUT/summary.txt"

src() { [ "$1" = main ] && echo "$R" || echo "$W"; }
flags() {
    case $1 in
    nocp) echo "-DGDN_CHUNK_DEV_NO_CP" ;;
    t21) echo "-DGDN_CHUNK_DEV_NW=2 -DGDN_CHUNK_DEV_KS=1" ;;
    t41) echo "-DGDN_CHUNK_DEV_NW=4 -DGDN_CHUNK_DEV_KS=1" ;;
    esac
}
build() {
    local s d=/tmp/gdn_$1 tg="gdn_static"
    s=$(src "$1")
    rm -rf $d && mkdir -p $d
    cp -r "$s"/CMakeLists.txt "$s"/include "$s"/src "$s"/tests "$s"/tools "$s"/bench $d/ 2>/dev/null
    case $1 in var) tg="gdn gdn_static test_cuda_chunk" ;; nocp) tg="gdn_static test_cuda_chunk" ;; esac
    cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$(flags "$1")" \
        >"$OUT/build_$1.log" 2>&1 &&
        cmake --build $d/build -j4 --target $tg >>"$OUT/build_$1.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$d/include $d/bench/bench_prefill.cu $d/build/libgdn_static.a -lpthread \
            -o $d/build/bench_prefill >>"$OUT/build_$1.log" 2>&1
}
VARIANTS="main var nocp t21 t41"
for v in $VARIANTS; do build $v & eval "pid_$v=$!"; done
for v in $VARIANTS; do eval "wait \$pid_$v"; eval "rc_$v=$?"; done
log "build rc: main=$rc_main var=$rc_var nocp=$rc_nocp t21=$rc_t21 t41=$rc_t41"
[ $rc_var = 0 ] || { tail -n 30 "$OUT/build_var.log"; exit 1; }
V=/tmp/gdn_var/build

timeout 120 $V/tests/test_cuda_chunk >"$OUT/test_var.log" 2>&1
log "test var rc=$? $(tail -n 1 "$OUT/test_var.log")"
grep -E "FAIL|rel " "$OUT/test_var.log" | head -n 20 | tee -a "$OUT/summary.txt"
if [ $rc_nocp = 0 ]; then
    timeout 60 /tmp/gdn_nocp/build/tests/test_cuda_chunk cp >"$OUT/test_nocp.log" 2>&1
    log "test nocp (cp cases on the plain path) rc=$? $(tail -n 1 "$OUT/test_nocp.log")"
    grep -E "rel " "$OUT/test_nocp.log" | sed 's/^/nocp/' | tee -a "$OUT/summary.txt"
fi

timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $V/tests/test_cuda_chunk basic cp mid_heads \
    >"$OUT/memcheck.log" 2>&1
log "memcheck rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $V/tests/test_cuda_chunk basic "cp" \
    >"$OUT/racecheck.log" 2>&1
log "racecheck rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -n 1)"

bench() { # variant, out name, shape substring
    local b=/tmp/gdn_$1/build/bench_prefill
    [ -x $b ] || return 0
    timeout 60 $b "$OUT/b_$2.txt" ${3:-} >>"$OUT/bench.log" 2>&1 || log "bench $2 failed"
}
bench main main
bench var var
bench nocp nocp B1_T
for v in t21 t41; do
    for s in B1_T32768 B2_T16384; do bench $v "${v}_$s" $s; done
    cat "$OUT"/b_${v}_*.txt >"$OUT/b_$v.txt" 2>/dev/null
done
log "bench done"

if [ "${FLA:-0}" = 1 ] && [ -d "$R/.peers/fla" ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.peers/fla:$W/python GDN_LIBRARY=$V/libgdn.so
    export TRITON_CACHE_DIR=/tmp/triton_cache
    left=$(( 280 - $(el) ))
    [ $left -gt 40 ] && timeout $left python3 $W/bench/fla_prefill.py --skip-accuracy --only ${FLA_ONLY:-H2_HV8} \
        --ours "$OUT/b_var.txt" --out "$OUT/fla_table.txt" >"$OUT/fla.log" 2>&1
    log "fla rc=$?"
fi

echo "== bench_prefill graph_ms (eager_ms): variant columns" | tee -a "$OUT/summary.txt"
python3 - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import sys, os
out = sys.argv[1]
names = ["main", "var", "nocp", "t21", "t41"]
rows, data = [], {}
for n in names:
    f = os.path.join(out, f"b_{n}.txt")
    if not os.path.exists(f):
        continue
    for line in open(f):
        s, tok, g, e = line.split()
        if s not in rows:
            rows.append(s)
        data[(n, s)] = (float(g), float(e))
print(f"{'shape':26s}" + "".join(f"{n:>18s}" for n in names) + "   var/main")
for s in rows:
    cells = "".join(f"{'%.4f (%.4f)' % data[(n, s)] if (n, s) in data else '-':>18s}" for n in names)
    r = data[("var", s)][0] / data[("main", s)][0] if ("var", s) in data and ("main", s) in data else float("nan")
    print(f"{s:26s}{cells}   {r:.3f}")
EOF
[ -f "$OUT/fla_table.txt" ] && tail -n 8 "$OUT/fla_table.txt" | tee -a "$OUT/summary.txt"
exit 0
