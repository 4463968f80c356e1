#!/usr/bin/env bash
# carry_ab.sh - one device call's A/B of builds carried by dev/carry_build.sh (build-dev/carry/NAME.tar.xz):
# whether each build gives the first one's bits, the prefill kernels' times in interleaved rounds, then the
# chunk tests and the sanitizers on the builds that carry test_cuda_chunk. Run on the device from the
# repository root, with build-dev and .peers/fla carried.
#
#   bash dev/carry_ab.sh [-g] [-r ROUNDS] [-s "SHAPES"] [-t "TESTS"] BASE NAME...
#     -g        GDN: kda_bits.py --gdn and profile_kda.py --gdn (default: KDA)
#     -r        interleaved timing rounds (default 2)
#     -s        shape names for profile_kda.py (default: KDA 2x16384 H64, varlen 64 and 1x32768 H32)
#     -t        test_cuda_chunk cases, matched as substrings of the test names (default: the KDA cases; with -g
#               GDN cases, whose names also select some KDA cases)
#
# Output: "bits NAME: k of n cases bitwise equal", then per round and build the kernel lines of
# profile_kda.py (torch profiler, mean of 5 calls), then the tests' summary and the sanitizers' last lines.
# Budget: ~20 s a build for the bits, ~15 s a build and round for three KDA shapes, ~20 s a build for the
# KDA tests, ~40 s for the sanitizers.
set -u
cd "$(dirname "$0")/.." || exit 1
GDN="" ROUNDS=2 SHAPES="" TESTS=""
while getopts "gr:s:t:" o; do
    case $o in
    g) GDN=--gdn ;;
    r) ROUNDS=$OPTARG ;;
    s) SHAPES=$OPTARG ;;
    t) TESTS=$OPTARG ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 2; }
if [ -z "$SHAPES" ]; then
    [ -n "$GDN" ] && SHAPES="B2_T16384_H16_HV16 varlen64rand_H16_HV32 B1_T32768_H16_HV32" || SHAPES="B2_T16384_H64_safe varlen64rand_H32_safe B1_T32768_H32_safe"
fi
if [ -z "$TESTS" ]; then
    [ -n "$GDN" ] && TESTS="basic gva raw_gates varlen cp_cases extreme_gates dual pool" ||
        TESTS="kda_basic kda_heads kda_raw_gates kda_extreme kda_states kda_varlen kda_cp kda_coop kda_pool"
fi
U=/tmp/carry_ab
mkdir -p $U
for n in "$@"; do xz -dc "build-dev/carry/$n.tar.xz" | tar -C $U -xf - || exit 1; done
export PYTHONPATH=$PWD/python:$PWD/bench:$PWD/.peers/fla:$PWD/dev/prefill
lib() { echo "$U/$1/libgdn.so"; }

echo "== bits (against $1)"
BITS=$(mktemp -u /tmp/carry_ab_bits.XXXX.pt)
GDN_LIBRARY=$(lib "$1") timeout 90 python3 dev/prefill/kda_bits.py $GDN "$BITS" 2>&1 | tail -1
for n in "${@:2}"; do
    echo -n "bits $n: "
    GDN_LIBRARY=$(lib "$n") timeout 90 python3 dev/prefill/kda_bits.py $GDN "$BITS" 2>&1 | tail -1
done

echo "== timing"
for r in $(seq "$ROUNDS"); do
    for n in "$@"; do
        echo "-- round $r $n"
        # shellcheck disable=SC2086
        GDN_LIBRARY=$(lib "$n") timeout 90 python3 dev/prefill/profile_kda.py $GDN $SHAPES 2>&1 |
            grep -E "^[A-Za-z0-9_]+:|_kernel" | grep -v "Memset\|cuda[A-Z]" | sed 's/: per-kernel CUDA time, mean of 5 calls//'
    done
done

last=""
for n in "$@"; do
    [ -x "$U/$n/test_cuda_chunk" ] || continue
    echo "== tests $n"
    # shellcheck disable=SC2086
    timeout 240 "$U/$n/test_cuda_chunk" $TESTS 2>&1 | grep -E "^FAIL|^SKIP all|passed"
    last=$n
done
if [ -n "$last" ] && command -v compute-sanitizer >/dev/null; then
    first=${TESTS%% *}
    echo "== sanitizers $last ($first)"
    timeout 120 compute-sanitizer --tool memcheck "$U/$last/test_cuda_chunk" "$first" 2>&1 | tail -1
    timeout 120 compute-sanitizer --tool racecheck "$U/$last/test_cuda_chunk" "$first" 2>&1 | tail -1
fi
