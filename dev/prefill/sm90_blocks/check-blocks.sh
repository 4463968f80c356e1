#!/usr/bin/env bash
# check-blocks.sh - one device call: build test_blocks.cu with -Xptxas -v (spills, "wgmma
# serialized" C75xx warnings), count HGMMA in the SASS, run the test, then compute-sanitizer
# memcheck and racecheck on it. Summary last. Logs under $OUT (or /tmp/sm90_blocks).
#   run(command="bash dev/prefill/sm90_blocks/check-blocks.sh 2>&1 | tail -n 40",
#       kind="nvidia-h100-x1", timeout_s=300)
set -u -o pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/sm90_blocks}
mkdir -p "$OUT"
B=/tmp/sm90_blocks_build
mkdir -p $B
S=()
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1

nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo \
    test_blocks.cu -o $B/test_blocks >"$OUT/build.log" 2>&1
rc=$?
warn=$(grep -ciE "warning|C75[0-9][0-9]" "$OUT/build.log")
spill=$(grep -E "spill (stores|loads)" "$OUT/build.log" | grep -vc " 0 bytes spill stores, 0 bytes spill loads")
regs=$(grep -oE "Used [0-9]+ registers" "$OUT/build.log" | awk '{print $2}' | sort -n | uniq | tr '\n' ' ')
S+=("build rc=$rc warnings=$warn kernels_with_spills=$spill registers: $regs")
[ $rc = 0 ] || { tail -n 30 "$OUT/build.log"; printf '%s\n' "${S[@]}"; exit 1; }
grep -iE "warning|C75" "$OUT/build.log" | head -n 5
if command -v cuobjdump >/dev/null; then
    cuobjdump -sass $B/test_blocks >"$OUT/sass.txt" 2>&1
    S+=("sass: HGMMA=$(grep -c HGMMA "$OUT/sass.txt") UTMALDG=$(grep -c UTMALDG "$OUT/sass.txt") LDL/STL=$(grep -cE '\b(LDL|STL)\b' "$OUT/sass.txt")")
fi

timeout 120 $B/test_blocks | tee "$OUT/test.log"
S+=("test rc=$? $(tail -n 1 "$OUT/test.log")")
for tool in memcheck racecheck; do
    timeout 180 compute-sanitizer --tool $tool --error-exitcode 9 $B/test_blocks >"$OUT/$tool.log" 2>&1
    r=$?
    S+=("$tool rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -n 1) fails=$(grep -c '^FAIL' "$OUT/$tool.log")")
    [ $r = 0 ] || grep -m 8 -E "^=+ +(Invalid|Error|Race|Warning)|^FAIL" "$OUT/$tool.log"
done
echo "---- summary"
printf '%s\n' "${S[@]}"
