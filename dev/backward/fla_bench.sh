#!/bin/bash
# fla_bench.sh - bench/fla_backward.py in one device call, with FLA's Triton autotune results kept
# between calls: most of a first call's time (about 460 s for --only B) goes to FLA's autotuning.
# Restores them from build-dev/triton_bwd_autotune.tgz when carried; saves them to
# $OUT/triton_bwd_autotune.tgz (copy that into build-dev/ for the next call). The table goes to
# $OUT/backward_table.txt.
#
#   run(command="GDN_COMMIT=<rev> bash dev/backward/fla_bench.sh --only B", carry=["build-dev", ".peers/fla"])
set -u
OUT=${OUT:-/tmp/fla_bench}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=/tmp/triton_cache PYTHONUNBUFFERED=1
mkdir -p $TRITON_CACHE_DIR
[ -f build-dev/triton_bwd_autotune.tgz ] && tar xzf build-dev/triton_bwd_autotune.tgz -C $TRITON_CACHE_DIR
t0=$(date +%s)
PYTHONPATH=$PWD/.peers/fla:$PWD/python GDN_LIBRARY=${GDN_LIBRARY:-build-dev/libgdn.so} \
    python3 bench/fla_backward.py --out "$OUT/backward_table.txt" "$@"
echo "fla_backward.py: rc=$? in $(( $(date +%s) - t0 )) s"
(cd $TRITON_CACHE_DIR && find . -name '*.autotune.json' | tar czf "$OUT/triton_bwd_autotune.tgz" -T -)
