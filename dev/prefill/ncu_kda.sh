#!/bin/bash
# ncu_kda.sh - ncu (--set full, source counters) of kda_prep and chunk_wg<KDA> in one chunk_kda
# call at one of bench/fla_kda_prefill.py's shapes, with a library built with -lineinfo: details
# and the SASS page as CSV under $OUT, the top stall lines (ncu_stalls.py) and the instruction mix
# (dev/backward/sass_mix.py).
#
#   LIB=build-dev/li/libgdn.so OUT=/tmp/ncu bash dev/prefill/ncu_kda.sh [SHAPE_SUBSTR]
set -u
LIB=${LIB:-build-dev/li/libgdn.so}
OUT=${OUT:-/tmp/ncu}
SHAPE=${1:-B1_T32768_H32_safe}
mkdir -p $OUT
for kern in kda_prep chunk_wg; do
    GDN_LIBRARY=$LIB PYTHONPATH=$PWD/python:$PWD/bench:$PWD/.peers/fla timeout 240 ncu --clock-control none \
        --set full --import-source yes -k regex:$kern --launch-count 1 -f -o $OUT/rep_$kern \
        python3 dev/prefill/profile_kda.py $SHAPE once > $OUT/ncu_$kern.log 2>&1
    echo "ncu $kern rc=$?"
    ncu -i $OUT/rep_$kern.ncu-rep --page details --csv > $OUT/details_$kern.csv 2>/dev/null
    ncu -i $OUT/rep_$kern.ncu-rep --page source --csv --print-source sass > $OUT/sass_$kern.csv 2>/dev/null
    rm -f $OUT/rep_$kern.ncu-rep
    python3 dev/prefill/ncu_stalls.py $OUT/sass_$kern.csv 14 2>&1 | head -34
    python3 dev/backward/sass_mix.py $OUT/sass_$kern.csv 12
done
