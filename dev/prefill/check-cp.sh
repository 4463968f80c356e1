#!/usr/bin/env bash
# check-cp.sh - one device call for the prefill helper's branch (context parallelism for few
# (sequence, head) pairs, tile choice at ~32 pairs). Builds with CMake (Release) in /tmp, side by
# side:
#   main   the tree at the repository root (the lead's main)
#   var    this worktree
#   nocp   this worktree with -DGDN_CHUNK_DEV_NO_CP (the plain path: accuracy and time baseline)
#   t22    this worktree with the tile forced to <NW=2, KS=2>   (32-pair shapes only: main's tile there)
#   s16    this worktree with 16 CP segments where CP is taken (-DGDN_CHUNK_DEV_SEGS=16)
#   p5     this worktree with chunk_prep fitted to 5 CTAs per SM (96 registers) instead of 4
# then runs test_cuda_chunk (var; cp / cp_long of nocp for the error baseline), compute-sanitizer
# memcheck and racecheck, bench_prefill, and with FLA=1 bench/fla_prefill.py beside var. Logs go
# to $OUT/logs.tgz (few files come back from the device), the table to $OUT/summary.txt.
#
#   run(command="cd .wt/prefill && bash dev/prefill/check-cp.sh 2>&1 | tail -n 60",
#       carry=[".wt/prefill"], timeout_s=300)
set -u -o pipefail
W=$(cd "$(dirname "$0")/../.." && pwd)   # this worktree
R=$(cd "$W/../.." && pwd)                 # the repository root holding .wt/<name>
OUT=${OUT:-/tmp/prefill_cp}
mkdir -p "$OUT"
LOGS=/tmp/prefill_cp_logs
rm -rf $LOGS && mkdir -p $LOGS
trap 'tar czf "$OUT/logs.tgz" -C $LOGS . 2>/dev/null' EXIT
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
    t22) echo "-DGDN_CHUNK_DEV_NW=2 -DGDN_CHUNK_DEV_KS=2" ;;
    s16) echo "-DGDN_CHUNK_DEV_SEGS=16" ;;
    p5) echo "-DGDN_CHUNK_DEV_PREP_CTAS=5" ;;
    esac
}
build() {
    local s d=/tmp/gdn_$1 tg="gdn_static"
    s=$(src "$1")
    rm -rf $d && mkdir -p $d
    cp -r "$s"/CMakeLists.txt "$s"/include "$s"/src "$s"/tests "$s"/tools "$s"/bench $d/ 2>/dev/null
    case $1 in var) tg="gdn gdn_static test_cuda_chunk" ;; nocp | p5) tg="gdn_static test_cuda_chunk" ;; esac
    cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$(flags "$1")" \
        >"$LOGS/build_$1.log" 2>&1 &&
        cmake --build $d/build -j4 --target $tg >>"$LOGS/build_$1.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$d/include $d/bench/bench_prefill.cu $d/build/libgdn_static.a -lpthread \
            -o $d/build/bench_prefill >>"$LOGS/build_$1.log" 2>&1
}
VARIANTS=${VARIANTS:-main var nocp t22 s16}
for v in $VARIANTS; do build $v & eval "pid_$v=$!"; done
rc_nocp=1
for v in $VARIANTS; do eval "wait \$pid_$v"; eval "rc_$v=$?"; eval "log \"build $v rc=\$rc_$v\""; done
[ $rc_var = 0 ] || { tail -n 30 "$LOGS/build_var.log"; exit 1; }
V=/tmp/gdn_var/build

timeout 120 $V/tests/test_cuda_chunk >"$LOGS/test_var.log" 2>&1
log "test var rc=$? $(tail -n 1 "$LOGS/test_var.log")"
grep -E "FAIL|rel " "$LOGS/test_var.log" | grep -v "^PASS" | sed 's/^/var /' | tee -a "$OUT/summary.txt"
if [ $rc_nocp = 0 ]; then
    timeout 60 /tmp/gdn_nocp/build/tests/test_cuda_chunk cp_cases cp_small cp_long >"$LOGS/test_nocp.log" 2>&1
    log "test nocp (the cp cases on the plain path) rc=$? $(tail -n 1 "$LOGS/test_nocp.log")"
    grep -E "rel " "$LOGS/test_nocp.log" | grep -v "^PASS" | sed 's/^/nocp/' | tee -a "$OUT/summary.txt"
fi

if [ "${rc_p5:-1}" = 0 ]; then
    timeout 60 /tmp/gdn_p5/build/tests/test_cuda_chunk >"$LOGS/test_p5.log" 2>&1
    log "test p5 rc=$? $(tail -n 1 "$LOGS/test_p5.log")"
fi

timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $V/tests/test_cuda_chunk basic cp_cases mid_heads \
    >"$LOGS/memcheck.log" 2>&1
log "memcheck rc=$? $(grep 'ERROR SUMMARY' "$LOGS/memcheck.log" | tail -n 1)"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $V/tests/test_cuda_chunk cp_small \
    >"$LOGS/racecheck.log" 2>&1
log "racecheck (cp_small) rc=$? $(grep 'RACECHECK SUMMARY' "$LOGS/racecheck.log" | tail -n 1)"

bench() { # variant, out name, shape substring
    local b=/tmp/gdn_$1/build/bench_prefill
    [ -x $b ] || return 0
    timeout 60 $b "$LOGS/b_$2.txt" ${3:-} >>"$LOGS/bench.log" 2>&1 || log "bench $2 failed"
}
bench main main
bench var var
bench nocp nocp B1_T
bench s16 s16 H2_HV8
bench p5 p5
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
    # Per-kernel durations of one call (the first: prep, PRE, scan, main) at the two few-head shapes.
    for s in T8192_H2 T65536_H2; do
        timeout 60 ncu --metrics gpu__time_duration.sum -k regex:"chunk_|cp_scan" --launch-count 4 \
            $V/bench_prefill - $s >$LOGS/ncu_$s.log 2>&1
        echo "ncu $s (us): $(grep -E 'chunk_|cp_scan|gpu__time_duration' $LOGS/ncu_$s.log |
            sed -E 's/.*(chunk_prep|chunk_main_kernel<[^>]*>|cp_scan_kernel<[^>]*>).*/\1/; s/ *gpu__time_duration.sum *//' |
            paste -sd' ')" | tee -a "$OUT/summary.txt"
    done
fi
for s in B1_T32768 B2_T16384; do bench t22 "t22_$s" $s; done
cat $LOGS/b_t22_*.txt >$LOGS/b_t22.txt 2>/dev/null
log "bench done"

if [ "${FLA:-0}" = 1 ] && [ -d "$R/.peers/fla" ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.peers/fla:$W/python GDN_LIBRARY=$V/libgdn.so
    export TRITON_CACHE_DIR=/tmp/triton_cache
    left=$(( 280 - $(el) ))
    [ $left -gt 40 ] && timeout $left python3 $W/bench/fla_prefill.py --skip-accuracy --only ${FLA_ONLY:-H2_HV8} \
        --ours "$LOGS/b_var.txt" --out "$OUT/fla_table.txt" >"$LOGS/fla.log" 2>&1
    log "fla rc=$?"
fi

echo "== bench_prefill graph_ms (eager_ms): variant columns" | tee -a "$OUT/summary.txt"
python3 - "$LOGS" <<'EOF' | tee -a "$OUT/summary.txt"
import sys, os
out = sys.argv[1]
names = ["main", "var", "nocp", "t22", "s16", "p5"]
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
print("columns: graph replay ms (eager ms), median of 20; var/main on graph times")
EOF
[ -f "$OUT/fla_table.txt" ] && tail -n 8 "$OUT/fla_table.txt" | tee -a "$OUT/summary.txt"
exit 0
