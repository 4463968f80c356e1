#!/usr/bin/env bash
# ncu-tile-src.sh - ncu (--set full) of a decode kernel (KERNEL, a regex; default the CUDA-core
# fast path recurrent_fwd_tma, or recurrent_fwd_mma for the tensor-core path) at T = $T (default
# 8), B = 256, f32 state: its headline metrics and the SASS lines where its warps stall most
# (dev/prefill/ncu_stalls.py).
set -u
BUILD=build-decode-dev
T=${T:-8}
KERNEL=${KERNEL:-recurrent_fwd_tma}
OUT=${OUT:-/tmp/ncuout}; mkdir -p $OUT
OUT=$OUT/d DECODE_NO_BENCH=1 DECODE_SKIP_TESTS=1 BUILD=$BUILD bash scripts/device_decode.sh > /tmp/build.log 2>&1 || { tail /tmp/build.log; exit 1; }
timeout 150 ncu --set full --import-source no -k regex:$KERNEL --launch-skip 12 --launch-count 1 -o /tmp/rep $BUILD/bench_decode --T $T --B 256 > /tmp/ncu.log 2>&1
echo "ncu rc=$?"
ncu -i /tmp/rep.ncu-rep --page details 2>/dev/null | grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Dynamic Shared|L1/TEX Hit|Mem Busy|Executed Ipc A" | head -24
ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null
gzip -c /tmp/src.csv > $OUT/src.csv.gz
python3 dev/prefill/ncu_stalls.py /tmp/src.csv 45 | tee $OUT/stalls.txt | cut -c1-230
