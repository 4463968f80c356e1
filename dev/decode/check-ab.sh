#!/usr/bin/env bash
# check-ab.sh - one device call: this tree against a base snapshot (BASE, default .stage/base, made
# with  git archive REV include src tests bench | tar -x -C .stage/base  plus this tree's
# scripts/device_decode.sh in .stage/base/scripts). Builds both as scripts/device_decode.sh does;
# runs this tree's tests, memcheck and (RACE=1) racecheck; times bench_decode of both at T = TS,
# B = BS (env) and prints the two tables side by side (cold us, this / base), then EXTRA args'
# bench output of this tree (e.g. EXTRA="--tiles --T 4 --B 64").
#   run(command="bash dev/decode/check-ab.sh", carry=[".stage/base"], kind="nvidia-h100-x1")
set -u -o pipefail
cd "$(dirname "$0")/../.."
HERE=$PWD
OUT=${OUT:-/tmp/ab-out}
BASE=${BASE:-$HERE/.stage/base}
TS=${TS:-1,4,8}
BS=${BS:-1,8,64,128,256}
mkdir -p "$OUT"
(cd "$BASE" && OUT=/tmp/ab-base DECODE_SKIP_TESTS=1 DECODE_NO_BENCH=1 BUILD=/tmp/ab-base-build bash scripts/device_decode.sh > /tmp/ab-base.log 2>&1) &
OUT=$OUT/decode DECODE_NO_BENCH=1 BUILD=build-decode-dev bash scripts/device_decode.sh > "$OUT/build.log" 2>&1
wait
grep -E "spill|passed|ERROR SUMMARY|rc=|FAIL" "$OUT/build.log" | head -12
tail -2 /tmp/ab-base.log
if [ "${RACE:-0}" = 1 ]; then
    timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 build-decode-dev/test_cuda_recurrent pool_decode \
        single_token_paths multi_token_paths > "$OUT/racecheck.log" 2>&1
    echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log")"
fi
build-decode-dev/bench_decode --T "$TS" --B "$BS" > "$OUT/bench_new.log" 2>&1
/tmp/ab-base-build/bench_decode --T "$TS" --B "$BS" > "$OUT/bench_base.log" 2>&1
build-decode-dev/bench_decode --T "$TS" --B "$BS" > "$OUT/bench_new2.log" 2>&1
grep -E "^copy" "$OUT/bench_new.log" "$OUT/bench_base.log"
python3 - "$OUT/bench_new.log" "$OUT/bench_base.log" "$OUT/bench_new2.log" <<'PY'
import sys
def table(path):
    t = {}
    for line in open(path):
        f = line.split()
        if len(f) == 7 and f[0] in ("f32", "bf16"):
            t[(f[0], int(f[1]), int(f[2]))] = (float(f[3]), float(f[4]), f[6])
    return t
new, base, new2 = (table(p) for p in sys.argv[1:4])
print("state  T    B | new hot/cold   %copy | new2 cold | base hot/cold  %copy | base/new cold")
for k in sorted(new, key=lambda k: (k[0] != "f32", k[1], k[2])):
    n, b, n2 = new[k], base.get(k), new2.get(k)
    if b:
        print("%-5s %2d %4d | %7.2f/%7.2f %6s | %8.2f | %7.2f/%7.2f %6s | %.3f" % (k + n[:2] + (n[2], n2[1] if n2 else 0) + b[:2] + (b[2], b[1] / n[1])))
PY
if [ -n "${EXTRA:-}" ]; then
    build-decode-dev/bench_decode $EXTRA > "$OUT/bench_extra.log" 2>&1
    grep -vE "^(f32|bf16) |^check|^device|^$|^state" "$OUT/bench_extra.log"
fi
