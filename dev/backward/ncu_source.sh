#!/bin/bash
# ncu_source.sh - ncu (--set full, source counters) of bwd_chain and bwd_grad in one small
# backward call (the instruction mix per chunk step does not depend on the shape), with a library
# built with -lineinfo: details and the SASS page as CSV under $OUT, and the
# top stall lines (dev/prefill/ncu_stalls.py); sass_mix.py gives the instruction mix of a CSV.
#
#   LIB=build-dev/li/libgdn.so OUT=/tmp/ncu bash dev/backward/ncu_source.sh [B T H HV]
set -u
LIB=${LIB:-build-dev/li/libgdn.so}
OUT=${OUT:-/tmp/ncu}
mkdir -p $OUT
for kern in bwd_chain bwd_grad; do
    GDN_LIBRARY=$LIB PYTHONPATH=$PWD/python timeout 240 ncu --clock-control none --set full --import-source yes \
        -k regex:$kern --launch-count 1 -f -o $OUT/rep_$kern python3 dev/backward/profile_bwd.py ${@:-1 4096 4 4} once > $OUT/ncu_$kern.log 2>&1
    echo "ncu $kern rc=$?"
    ncu -i $OUT/rep_$kern.ncu-rep --page details --csv > $OUT/details_$kern.csv 2>/dev/null
    ncu -i $OUT/rep_$kern.ncu-rep --page source --csv --print-source sass > $OUT/sass_$kern.csv 2>/dev/null
    rm -f $OUT/rep_$kern.ncu-rep
    python3 dev/prefill/ncu_stalls.py $OUT/sass_$kern.csv 12 2>&1 | head -16
    python3 dev/backward/sass_mix.py $OUT/sass_$kern.csv 12
done
ls -la $OUT
