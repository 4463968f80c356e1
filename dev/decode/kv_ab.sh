#!/usr/bin/env bash
# kv_ab.sh - one device call's A/B of builds carried by dev/carry_build.sh (build-dev/carry/NAME.tar.xz, each
# with libgdn.so and test_cuda_recurrent) on one-token decode: layout_time.py's libgdn rows in interleaved
# rounds, then the recurrent tests, memcheck and racecheck on the fastest build of the last round (by the sum of its
# times). Run on the device from the repository root, with build-dev and .peers/fla carried.
#
#   bash dev/decode/kv_ab.sh [-r ROUNDS] [-l KV|VK] [-b "B ..."] [-x "ARGS"] [-t "NAME ..."] [-n] NAME...
#     -x  more layout_time.py arguments (T=4, bf16)
#     -n  no checks of the fastest (timing only: ~100 s less)
#     -t  builds to test and memcheck first, whatever their speed (a new kernel); the fastest is checked last
#         and its name left in /tmp/kv_ab/best
#
# Every line goes out as it is produced (no pipe through tail): a call that reaches its time limit still
# reports what it measured. Budget (estimates): ~15 s a build and round (torch import, two batch sizes, GDN and
# KDA), ~60 s the tests, ~60 s each sanitizer; keep the call's timeout above the sum.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROUNDS=2 LAYOUT=KV BS="128 256" TEST="" XARGS="" CHECK_BEST=1
while getopts "r:l:b:t:x:n" o; do
    case $o in
    r) ROUNDS=$OPTARG ;;
    l) LAYOUT=$OPTARG ;;
    b) BS=$OPTARG ;;
    t) TEST=$OPTARG ;;
    x) XARGS=$OPTARG ;;
    n) CHECK_BEST=0 ;;
    *) sed -n "2,15p" "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n "2,15p" "$0"; exit 2; }
U=/tmp/kv_ab
mkdir -p $U
for n in "$@"; do xz -dc "build-dev/carry/$n.tar.xz" | tar -C $U -xf - || exit 1; done
export PYTHONPATH=$PWD/python:$PWD/bench:$PWD/dev/decode:$PWD/.peers/fla
check() {
    echo "tests $1: $(timeout 150 $U/$1/test_cuda_recurrent 2>&1 | grep -E '^FAIL|passed|^SKIP' | tr '\n' ' ')"
    echo "memcheck $1: $(timeout 120 compute-sanitizer --tool memcheck $U/$1/test_cuda_recurrent pool_decode \
        kda_pools options 2>&1 | tail -1) ($SECONDS s)"
    echo "racecheck $1: $(timeout 120 compute-sanitizer --tool racecheck $U/$1/test_cuda_recurrent pool_decode \
        kda_options 2>&1 | tail -1) ($SECONDS s)"
}
for n in $TEST; do check "$n"; done
declare -A total
for r in $(seq "$ROUNDS"); do
    for n in "$@"; do
        echo "-- round $r $n ($SECONDS s)"
        # shellcheck disable=SC2086
        out=$(GDN_LIBRARY=$U/$n/libgdn.so timeout 90 python3 dev/decode/layout_time.py $BS $LAYOUT $XARGS libgdn 2>&1 |
              grep -E "^ +[0-9]+ |Error")
        echo "$out"
        total[$n]=$(echo "$out" | awk '$1 ~ /^[0-9]+$/ {s += $4} END {printf "%.1f", s}')
    done
done
best=$1
for n in "$@"; do
    awk -v a="${total[$n]}" -v b="${total[$best]}" 'BEGIN {exit !(a < b)}' && best=$n
done
echo "== fastest in the last round: $best (${total[$best]} us summed) ($SECONDS s)"
echo "$best" > $U/best
[ "$CHECK_BEST" = 1 ] || exit 0
case " $TEST " in *" $best "*) ;; *) check "$best" ;; esac
