#!/usr/bin/env bash
# check-prep-gva.sh - one device call for chunk_prep's head groups (dev/prefill/chunk-prep-gva.patch,
# branch helper-gva): one CTA per (chunk, group of value heads of a key head). Applies the patch to
# a copy of main in /tmp and builds with CMake (Release), side by side:
#   main   the repository root's tree (if it already holds the patch: that tree with it reversed)
#   var    main + the patch (head groups chosen by the wave rule: G = 2 at H16/HV32, 4 at
#          B1_T65536_H2_HV8, none at B1_T8192_H2_HV8 or at the tests' sizes)
#   h4     var with -DGDN_CHUNK_DEV_PREP_HEADS=4: the largest group that divides G, at every size,
#          so that the tests take the grouped path (G = 2, 3, 4, 9 in test_cuda_chunk)
# then: test_cuda_chunk (all cases) on var and h4; prep_gva_digest (fixed inputs, digests of o and
# the final state) on main, var and h4, which must all agree bit for bit; compute-sanitizer
# memcheck on var and h4 and racecheck on h4 (basic, gva, cp_small, varlen); bench_prefill of main,
# var (all shapes) and h4 (the H2_HV8 shapes); FLA beside var (bench/fla_prefill.py with accuracy;
# FLA's autotune key sets warm up in parallel with the builds). Logs in $OUT/logs.tgz; table last.
#
#   run(command="bash dev/prefill/check-prep-gva.sh 2>&1 | tail -n 60",
#       carry=[".peers/fla", "build-prefill/dev/triton_autotune.tgz"],
#       kind="nvidia-h100-x1", timeout_s=600)
#
# DRY=1 stops after the builds (for checking the script on a machine without a GPU); NO_FLA=1
# skips FLA (~300 s instead of ~550: timeout_s=360). BUDGET: seconds for the whole script.
set -u -o pipefail
W=$(cd "$(dirname "$0")/../.." && pwd)    # the tree holding this script (a worktree or main)
if [ "$(basename "$(dirname "$W")")" = .wt ]; then R=$(cd "$W/../.." && pwd); else R=$W; fi
PATCH=$W/dev/prefill/chunk-prep-gva.patch
OUT=${OUT:-/tmp/prefill_prep_gva}
BUDGET=${BUDGET:-585}
mkdir -p "$OUT"
LOGS=/tmp/prefill_prep_gva_logs
rm -rf $LOGS && mkdir -p $LOGS
trap 'tar czf "$OUT/logs.tgz" -C $LOGS . 2>/dev/null' EXIT
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "$* t=$(el)" | tee -a "$OUT/summary.txt"; }
ARCH="-gencode=arch=compute_90a,code=sm_90a"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}

{ date -u; (cd "$W" && git log -1 --format='script tree %h %s' 2>/dev/null); (cd "$R" && git log -1 --format='main %h %s' 2>/dev/null);
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null; } | tee "$OUT/summary.txt"

FLA_OK=0
if [ -z "${DRY:-}" ] && [ -z "${NO_FLA:-}" ] && [ -d "$R/.peers/fla" ]; then
    export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.peers/fla:$R/python TRITON_CACHE_DIR=/tmp/triton_cache
    mkdir -p $TRITON_CACHE_DIR
    [ -f "$R/build-prefill/dev/triton_autotune.tgz" ] && tar xzf "$R/build-prefill/dev/triton_autotune.tgz" -C $TRITON_CACHE_DIR
    warm_pids=()
    for w in B1_T32768_H16_HV32 B2_T16384_H16_HV16 B1_T8192_H2_HV8; do
        timeout 200 python3 "$R/bench/fla_prefill.py" --warm $w >>"$LOGS/fla_warm.log" 2>&1 &
        warm_pids+=($!)
    done
    FLA_OK=1
fi

# Sources: main, and main + the patch (or, when main holds the patch already, the reverse).
S=/tmp/gva_src
rm -rf $S && mkdir -p $S/main
cp -r "$R"/CMakeLists.txt "$R"/include "$R"/src "$R"/tests "$R"/tools "$R"/bench $S/main/
cp -r $S/main $S/var
if (cd $S/var && patch -p1 -s -f --dry-run <"$PATCH" >/dev/null 2>&1); then
    (cd $S/var && patch -p1 -s -f <"$PATCH")
    log "patch applied to main"
elif (cd $S/main && patch -p1 -s -f -R --dry-run <"$PATCH" >/dev/null 2>&1); then
    (cd $S/main && patch -p1 -s -f -R <"$PATCH")
    log "main already holds the patch: baseline = main with it reversed"
else
    log "patch neither applies nor reverses on main"
    exit 1
fi

flags() { [ "$1" = h4 ] && echo "-DGDN_CHUNK_DEV_PREP_HEADS=4"; }
build() {
    local s=$S/$1 d=/tmp/gva_$1 tg="gdn_static gdn_test_util"
    [ "$1" = h4 ] && s=$S/var
    [ "$1" != main ] && tg="$tg test_cuda_chunk"
    [ "$1" = var ] && tg="$tg gdn"
    rm -rf $d
    cmake -S $s -B $d -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON -DCMAKE_CUDA_FLAGS="$(flags "$1")" \
        >"$LOGS/build_$1.log" 2>&1 &&
        cmake --build $d -j${JOBS:-5} --target $tg >>"$LOGS/build_$1.log" 2>&1 &&
        nvcc -O3 -std=c++17 $ARCH -I$s/include $s/bench/bench_prefill.cu $d/libgdn_static.a -lpthread \
            -o $d/bench_prefill >>"$LOGS/build_$1.log" 2>&1 &&
        gcc -std=c11 -O2 -Wall -Wextra -I$s/include -I$s/tests -I$CUDA_HOME/include "$W/dev/prefill/prep_gva_digest.c" \
            $d/tests/libgdn_test_util.a $d/libgdn_static.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread \
            -o $d/prep_gva_digest >>"$LOGS/build_$1.log" 2>&1
}
for v in main var h4; do build $v & eval "pid_$v=$!"; done
for v in main var h4; do eval "wait \$pid_$v"; eval "rc_$v=$?"; eval "log \"build $v rc=\$rc_$v\""; done
[ $rc_var = 0 ] && [ $rc_h4 = 0 ] || { tail -n 30 "$LOGS/build_var.log" "$LOGS/build_h4.log"; exit 1; }
[ -n "${DRY:-}" ] && { log "DRY: stopping after the builds"; exit 0; }

for v in var h4; do
    timeout 120 /tmp/gva_$v/tests/test_cuda_chunk >"$LOGS/test_$v.log" 2>&1
    log "test_cuda_chunk $v rc=$? $(tail -n 1 "$LOGS/test_$v.log")"
    grep -E "FAIL|rel " "$LOGS/test_$v.log" | grep -v "^PASS" | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
done

for v in main var h4; do
    [ -x /tmp/gva_$v/prep_gva_digest ] && timeout 90 /tmp/gva_$v/prep_gva_digest >"$LOGS/digest_$v.txt" 2>&1
done
for v in var h4; do
    if cmp -s "$LOGS/digest_main.txt" "$LOGS/digest_$v.txt" && [ -s "$LOGS/digest_main.txt" ]; then
        log "digest $v = main: bitwise identical ($(wc -l <"$LOGS/digest_main.txt") cases)"
    else
        log "digest $v DIFFERS from main:"
        diff "$LOGS/digest_main.txt" "$LOGS/digest_$v.txt" | tee -a "$OUT/summary.txt"
    fi
done

for v in var h4; do
    timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gva_$v/tests/test_cuda_chunk basic gva cp_small varlen \
        >"$LOGS/memcheck_$v.log" 2>&1
    log "memcheck $v (basic, gva, cp_small, varlen) rc=$? $(grep 'ERROR SUMMARY' "$LOGS/memcheck_$v.log" | tail -n 1)"
done
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/gva_h4/tests/test_cuda_chunk basic gva cp_small varlen \
    >"$LOGS/racecheck_h4.log" 2>&1
log "racecheck h4 (basic, gva, cp_small, varlen) rc=$? $(grep 'RACECHECK SUMMARY' "$LOGS/racecheck_h4.log" | tail -n 1)"

if [ $FLA_OK = 1 ]; then
    for p in "${warm_pids[@]}"; do wait $p; done
    log "fla warm-up done: $(grep -c warmed "$LOGS/fla_warm.log") of 3"
fi

bench() { # variant, shape substring
    local b=/tmp/gva_$1/bench_prefill
    [ -x $b ] || return 0
    timeout 60 $b "$LOGS/b_$1.txt" ${2:-} >>"$LOGS/bench.log" 2>&1 || log "bench $1 failed"
}
bench main
bench var
bench h4 H2_HV8
log "bench done"

if [ $FLA_OK = 1 ] && [ -f "$LOGS/b_var.txt" ]; then
    left=$(( BUDGET - 15 - $(el) ))
    if [ $left -gt 40 ]; then
        GDN_LIBRARY=/tmp/gva_var/libgdn.so timeout $left python3 "$R/bench/fla_prefill.py" --ours "$LOGS/b_var.txt" \
            --out "$OUT/fla_table.txt" >"$LOGS/fla.log" 2>&1
        log "fla rc=$? (limit $left s)"
    else
        log "fla skipped: $left s left"
    fi
fi

echo "== bench_prefill graph_ms (eager_ms); var/main and h4/main on graph times" | tee -a "$OUT/summary.txt"
python3 - "$LOGS" <<'EOF' | tee -a "$OUT/summary.txt"
import sys, os
d = sys.argv[1]
names = ["main", "var", "h4"]
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
print(f"{'shape':26s}" + "".join(f"{n:>20s}" for n in names) + "  var/main   h4/main")
for s in rows:
    cells = "".join(f"{'%.4f (%.4f)' % data[(n, s)] if (n, s) in data else '-':>20s}" for n in names)
    rat = [data[(n, s)][0] / data[("main", s)][0] if (n, s) in data and ("main", s) in data else float("nan") for n in ("var", "h4")]
    print(f"{s:26s}{cells}  {rat[0]:8.3f}  {rat[1]:8.3f}")
EOF
[ -f "$OUT/fla_table.txt" ] && tee -a "$OUT/summary.txt" <"$OUT/fla_table.txt"
exit 0
