#!/usr/bin/env bash
# test_cli.sh - the gdn command's argument handling: bad numbers, unknown options and commands and
# impossible shapes exit with status 2 and a message naming the option; a small bench runs; without
# a usable GPU the command says why it runs on the CPU.
#   bash tests/test_cli.sh build/tools/gdn
set -uo pipefail
gdn=$1
failures=0

# expect <exit status> <regex the output must match> <args...>
expect() {
    local want_rc=$1 want_msg=$2
    shift 2
    local out rc
    out=$("$gdn" "$@" 2>&1)
    rc=$?
    if [ "$rc" != "$want_rc" ] || ! grep -qE -- "$want_msg" <<<"$out"; then
        echo "FAIL gdn $*: exit $rc (want $want_rc), output:"
        sed 's/^/    /' <<<"$out"
        echo "    (want a line matching: $want_msg)"
        failures=$((failures + 1))
    else
        echo "ok   gdn $* -> $rc: $(grep -E -m1 -- "$want_msg" <<<"$out")"
    fi
}

small=(--batch 1 --tokens 8 --heads 1 --value-heads 2 --key-dim 64 --value-dim 64 --reps 1 --device cpu)

expect 2 "usage: gdn" # no command
expect 2 "unknown command 'frobnicate'" frobnicate
expect 0 "--value-heads" help
expect 0 "libgdn [0-9]+\.[0-9]+\.[0-9]+" --version

for bad in abc 1e3 10x -4 +4 0x10 "" " 8" 1.5; do
    bad_re=$(sed 's/[][\.*^$+?(){}|]/\\&/g' <<<"$bad")
    expect 2 "--tokens needs a whole number .*got '$bad_re'" bench --tokens "$bad"
done
expect 2 "--heads = 99999999999999999999 is too large" bench --heads 99999999999999999999
expect 2 "--batch = 2147483648 is too large" bench --batch 2147483648
expect 2 "--key-dim = 0 is too small" bench --key-dim 0
expect 2 "--reps needs a whole number" bench --reps 3x
expect 2 "--tokens needs a value" bench --tokens
expect 2 "unknown option '--token'" bench --token 8
expect 2 "unexpected argument '4096'" bench 4096
expect 2 "--dtype must be one of f32, bf16, f16; got 'fp16'" bench --dtype fp16
expect 2 "--state-dtype must be one of f32, bf16; got 'f16'" bench --state-dtype f16
expect 2 "--state-layout must be one of kv, vk; got 'KV'" bench --state-layout KV
expect 2 "--device must be one of auto, cpu, cuda; got 'gpu'" bench --device gpu
expect 2 "--op must be one of both, chunk, recurrent; got 'all'" bench --op all
expect 2 "--value-heads 3 must be a multiple of --heads 2" bench --heads 2 --value-heads 3
# sizes whose byte counts overflow are refused before anything is allocated for them
expect 2 "the size of q overflows" bench "${small[@]}" --batch 2147483647 --tokens 2147483647 --heads 2147483647 \
    --value-heads 2147483647
# a shape the library refuses: its message, exit 1
expect 1 "head dims K = 320, V = 64: the CPU backend takes each in 1 .. 256" bench "${small[@]}" --key-dim 320
# small runs of both ops, every dtype and layout option
expect 0 "gdn_recurrent_fwd .*B=1 T=1 H=1 HV=2 K=64 V=64 bf16, VK f32 state" bench "${small[@]}"
expect 0 "gdn_chunk_fwd .*f16, KV bf16 state" bench "${small[@]}" --dtype f16 --state-layout kv --state-dtype bf16 --op chunk
expect 0 "gdn_recurrent_fwd .*T=3 .*f32, VK f32 state" bench "${small[@]}" --dtype f32 --op recurrent --decode-tokens 3

# without a usable GPU: --device cuda fails with the reason, auto says why it runs on the CPU
if "$gdn" bench "${small[@]}" --device cuda >/dev/null 2>&1; then
    echo "ok   gdn bench --device cuda ran on a GPU"
else
    expect 1 "--device cuda: (libgdn was built without the CUDA backend|the CUDA backend is built, but)" \
        bench "${small[@]}" --device cuda
    expect 0 "note: running on the CPU: (libgdn was built without|the CUDA backend is built, but)" \
        bench "${small[@]}" --device auto
fi

if [ "$failures" != 0 ]; then
    echo "$failures CLI check(s) failed"
    exit 1
fi
echo "all CLI checks passed"
