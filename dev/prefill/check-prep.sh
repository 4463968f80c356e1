#!/usr/bin/env bash
# check-prep.sh - one device call for the chunk_prep rework (issue 4; branch helper-prep). Builds
# with CMake (Release) in /tmp, side by side:
#   main   the tree at the repository root (the lead's main)
#   var    this worktree
#   p4     this worktree with chunk_prep fitted to 4 CTAs per SM (128 registers) instead of 5
# then runs test_cuda_chunk (var), compute-sanitizer memcheck (basic, varlen, odd_lengths,
# cp_small) and racecheck (basic, cp_small) on var, bench_prefill of main, var (all shapes) and p4
# (the H = 2 shapes, where prep is the largest share), and bench/fla_prefill.py (accuracy against
# float64 and timing, FLA beside var). FLA's three autotune key sets warm up in parallel with the
# builds and tests (compiling only, from the restored autotune cache) and must finish before any
# timing starts. Logs go to $OUT/logs.tgz, the table to $OUT/summary.txt.
#
#   run(command="cd .wt/prep && bash dev/prefill/check-prep.sh 2>&1 | tail -n 70",
#       carry=[".wt/prep", ".peers/fla", "build-prefill/dev/triton_autotune.tgz"],
#       kind="nvidia-h100-x1", timeout_s=420)
#
# DRY=1 stops after the builds (for checking the script on a machine without a GPU). NO_FLA=1
# skips FLA (then the call needs ~150 s instead of ~400: timeout_s=240 is enough).
set -u -o pipefail
W=$(cd "$(dirname "$0")/../.." && pwd)   # this worktree
R=$(cd "$W/../.." && pwd)                 # the repository root holding .wt/<name>
OUT=${OUT:-/tmp/prefill_prep}
BUDGET=${BUDGET:-405}                     # seconds for the whole script (the call's limit: 420)
mkdir -p "$OUT"
LOGS=/tmp/prefill_prep_logs
rm -rf $LOGS && mkdir -p $LOGS
trap 'tar czf "$OUT/logs.tgz" -C $LOGS . 2>/dev/null' EXIT
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "$* t=$(el)" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"

{ date -u; (cd "$W" && git log -1 --format='var commit %h %s' 2>/dev/null); (cd "$R" && git log -1 --format='main commit %h %s' 2>/dev/null);
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null; } | tee "$OUT/summary.txt"

# FLA warm-up first: Triton compiles for a minute per key set, on the CPU, while we build.
FLA_OK=0
if [ -z "${DRY:-}" ] && [ -z "${NO_FLA:-}" ] && [ -d "$R/.peers/fla" ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.peers/fla:$W/python TRITON_CACHE_DIR=/tmp/triton_cache
    mkdir -p $TRITON_CACHE_DIR
    [ -f "$R/build-prefill/dev/triton_autotune.tgz" ] && tar xzf "$R/build-prefill/dev/triton_autotune.tgz" -C $TRITON_CACHE_DIR
    warm_pids=()
    for w in B1_T32768_H16_HV32 B2_T16384_H16_HV16 B1_T8192_H2_HV8; do
        timeout 200 python3 $W/bench/fla_prefill.py --warm $w >>"$LOGS/fla_warm.log" 2>&1 &
        warm_pids+=($!)
    done
    FLA_OK=1
fi

src() { [ "$1" = main ] && echo "$R" || echo "$W"; }
flags() { [ "$1" = p4 ] && echo "-DGDN_CHUNK_DEV_PREP_CTAS=4"; }
build() {
    local s d=/tmp/gdn_$1 tg="gdn_static"
    s=$(src "$1")
    rm -rf $d && mkdir -p $d
    cp -r "$s"/CMakeLists.txt "$s"/include "$s"/src "$s"/tests "$s"/tools "$s"/bench $d/ 2>/dev/null
    [ "$1" = var ] && tg="gdn gdn_static test_cuda_chunk"
    cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$(flags "$1")" \
        >"$LOGS/build_$1.log" 2>&1 &&
        cmake --build $d/build -j${JOBS:-5} --target $tg >>"$LOGS/build_$1.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$d/include $d/bench/bench_prefill.cu $d/build/libgdn_static.a -lpthread \
            -o $d/build/bench_prefill >>"$LOGS/build_$1.log" 2>&1
}
for v in main var p4; do build $v & eval "pid_$v=$!"; done
for v in main var p4; do eval "wait \$pid_$v"; eval "rc_$v=$?"; eval "log \"build $v rc=\$rc_$v\""; done
[ $rc_var = 0 ] || { tail -n 30 "$LOGS/build_var.log"; exit 1; }
V=/tmp/gdn_var/build
[ -n "${DRY:-}" ] && { log "DRY: stopping after the builds"; exit 0; }

timeout 120 $V/tests/test_cuda_chunk >"$LOGS/test_var.log" 2>&1
log "test var rc=$? $(tail -n 1 "$LOGS/test_var.log")"
grep -E "FAIL|rel " "$LOGS/test_var.log" | grep -v "^PASS" | sed 's/^/var /' | tee -a "$OUT/summary.txt"

timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $V/tests/test_cuda_chunk basic varlen odd_lengths cp_small \
    >"$LOGS/memcheck.log" 2>&1
log "memcheck (basic, varlen, odd_lengths, cp_small) rc=$? $(grep 'ERROR SUMMARY' "$LOGS/memcheck.log" | tail -n 1)"
timeout 80 compute-sanitizer --tool racecheck --error-exitcode 9 $V/tests/test_cuda_chunk basic cp_small \
    >"$LOGS/racecheck.log" 2>&1
log "racecheck (basic, cp_small) rc=$? $(grep 'RACECHECK SUMMARY' "$LOGS/racecheck.log" | tail -n 1)"

if [ $FLA_OK = 1 ]; then
    for p in "${warm_pids[@]}"; do wait $p; done
    log "fla warm-up done: $(grep -c warmed "$LOGS/fla_warm.log") of 3"
fi

bench() { # variant, shape substring
    local b=/tmp/gdn_$1/build/bench_prefill
    [ -x $b ] || return 0
    timeout 60 $b "$LOGS/b_$1.txt" ${2:-} >>"$LOGS/bench.log" 2>&1 || log "bench $1 failed"
}
bench main
bench var
bench p4 H2_HV8
log "bench done"

if [ $FLA_OK = 1 ] && [ -f "$LOGS/b_var.txt" ]; then
    left=$(( BUDGET - 25 - $(el) ))
    if [ $left -gt 40 ]; then
        GDN_LIBRARY=$V/libgdn.so timeout $left python3 $W/bench/fla_prefill.py --ours "$LOGS/b_var.txt" \
            --out "$OUT/fla_table.txt" >"$LOGS/fla.log" 2>&1
        log "fla rc=$? (limit $left s)"
    else
        log "fla skipped: $left s left"
    fi
fi

echo "== bench_prefill graph_ms (eager_ms), H100; var/main and p4/main on graph times" | tee -a "$OUT/summary.txt"
python3 - "$LOGS" <<'EOF' | tee -a "$OUT/summary.txt"
import sys, os
d = sys.argv[1]
names = ["main", "var", "p4"]
rows, data = [], {}
for n in names:
    f = os.path.join(d, f"b_{n}.txt")
    if not os.path.exists(f):
        continue
    for line in open(f):
        p = line.split()
        if len(p) != 4:
            continue
        if p[0] not in rows:
            rows.append(p[0])
        data[(n, p[0])] = (float(p[2]), float(p[3]))
print(f"{'shape':26s}" + "".join(f"{n:>20s}" for n in names) + "  var/main   p4/main")
for s in rows:
    cells = "".join(f"{'%.4f (%.4f)' % data[(n, s)] if (n, s) in data else '-':>20s}" for n in names)
    rat = [data[(n, s)][0] / data[("main", s)][0] if (n, s) in data and ("main", s) in data else float("nan") for n in ("var", "p4")]
    print(f"{s:26s}{cells}  {rat[0]:8.3f}  {rat[1]:8.3f}")
EOF
[ -f "$OUT/fla_table.txt" ] && tee -a "$OUT/summary.txt" <"$OUT/fla_table.txt"
exit 0
