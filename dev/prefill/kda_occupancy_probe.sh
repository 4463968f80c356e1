#!/usr/bin/env bash
# kda_occupancy_probe.sh - what a fourth kda_prep CTA an SM would buy, before building one: kda_prep's
# time at 3 CTAs an SM (main) against a probe build at 4 (-DGDN_CHUNK_DEV_KDA_PREP_OVERLAP=11264: Gam
# laid 11 KB over the end of K, 57088 bytes a CTA instead of 68352; results wrong, every diagonal block on
# tensor cores, so the probe's time is a floor on the work, not a valid output). Main is also timed with
# the diagonal blocks as they fall; the shapes (safe gate, lower_bound -5) take tensor cores there anyway.
#
#   MAIN_LIB=<main>/libgdn.so PROBE_LIB=<probe>/libgdn.so bash dev/prefill/kda_occupancy_probe.sh
#   bash dev/prefill/kda_occupancy_probe.sh            (builds both under /tmp/kp_*; ~3-4 min on 16 cores)
#
# Prints, per build and round, kda_prep's mean time (profile_kda.py: torch profiler, 5 calls) at
# 2x16384 H64 safe and varlen 64 H32 safe; then ncu's launch statistics of the probe (CTAs an SM by
# shared memory must read 4) unless NO_NCU=1.
set -u
cd "$(dirname "$0")/../.."
R=$PWD
export PYTHONPATH=$R/python:$R/bench:$R/.peers/fla
build() { # build DIR FLAGS
    cmake -S $R -B $1 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="$2" >$1.log 2>&1 &&
        cmake --build $1 -j8 --target gdn >>$1.log 2>&1
}
if [ -z "${MAIN_LIB:-}" ] || [ -z "${PROBE_LIB:-}" ]; then
    build /tmp/kp_main "" & build /tmp/kp_probe "-DGDN_CHUNK_DEV_KDA_PREP_OVERLAP=11264" &
    wait
    MAIN_LIB=/tmp/kp_main/libgdn.so PROBE_LIB=/tmp/kp_probe/libgdn.so
fi
for r in 1 2; do
    for v in main probe; do
        lib=$MAIN_LIB; [ $v = probe ] && lib=$PROBE_LIB
        echo "-- round $r $v"
        GDN_LIBRARY=$lib timeout 60 python3 dev/prefill/profile_kda.py B2_T16384_H64_safe varlen64rand 2>&1 |
            grep -E "^[A-Za-z0-9_]+:|kda_prep"
    done
done
if [ -z "${NO_NCU:-}" ] && command -v ncu >/dev/null; then
    GDN_LIBRARY=$PROBE_LIB timeout 120 ncu --section LaunchStats --section Occupancy -k regex:kda_prep --launch-count 1 \
        python3 dev/prefill/profile_kda.py B2_T16384_H64_safe once 2>&1 | grep -E "Block Limit Shared|Dynamic Shared|Achieved Occ|Theoretical Occ"
fi
