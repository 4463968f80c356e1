#!/usr/bin/env bash
# check-stage.sh - one device call: builds as scripts/device_decode.sh does, runs its tests and
# memcheck (the launcher stages one token per CTA for single-token calls), then bench_decode
# --stage at T = 1 on B (env; one token staged against a chunk of 8, launcher tile and others).
#   run(command="bash dev/decode/check-stage.sh", kind="nvidia-h100-x1")
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stage-out}
BUILD=${BUILD:-build-decode-dev}
B=${B:-1,8,32,64,128,256,512}
mkdir -p "$OUT"
OUT=$OUT/decode DECODE_NO_BENCH=1 BUILD=$BUILD bash scripts/device_decode.sh > "$OUT/build.log" 2>&1
grep -E "spill|passed|ERROR SUMMARY|rc=|FAIL" "$OUT/build.log" | head -20
"$BUILD/bench_decode" --stage --T 1 --B "$B" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -E "^copy|^check|^(f32|bf16) |^stage" "$OUT/bench.log"
