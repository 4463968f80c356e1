#!/bin/bash
# ncu_kernels.sh - ncu (--set full, source counters) of the first launch of each named kernel (a
# regex each) in one command, with a library built with -lineinfo: details and the SASS page as CSV
# under $OUT (details_<kernel>.csv, sass_<kernel>.csv), the top stall lines
# (dev/prefill/ncu_stalls.py) and the instruction mix (dev/backward/sass_mix.py). The callers:
# dev/backward/ncu_source.sh, dev/prefill/ncu_kda.sh.
#
#   LIB=build-dev/li/libgdn.so OUT=/tmp/ncu bash dev/ncu_kernels.sh "KERNEL ..." COMMAND [ARGS ...]
set -u
LIB=${LIB:-build-dev/li/libgdn.so}
OUT=${OUT:-/tmp/ncu}
kernels=$1
shift
mkdir -p $OUT
for kern in $kernels; do
    GDN_LIBRARY=$LIB timeout 240 ncu --clock-control none --set full --import-source yes \
        -k regex:$kern --launch-count 1 -f -o $OUT/rep_$kern "$@" > $OUT/ncu_$kern.log 2>&1
    echo "ncu $kern rc=$?"
    ncu -i $OUT/rep_$kern.ncu-rep --page details --csv > $OUT/details_$kern.csv 2>/dev/null
    ncu -i $OUT/rep_$kern.ncu-rep --page source --csv --print-source sass > $OUT/sass_$kern.csv 2>/dev/null
    rm -f $OUT/rep_$kern.ncu-rep
    python3 dev/prefill/ncu_stalls.py $OUT/sass_$kern.csv 14 2>&1 | head -18
    python3 dev/backward/sass_mix.py $OUT/sass_$kern.csv 12
done
ls -la $OUT
