#!/bin/bash
# ncu_kda.sh - ncu of kda_prep and chunk_wg<KDA> in one chunk_kda call at one of
# bench/fla_kda_prefill.py's shapes, through dev/ncu_kernels.sh (its outputs).
#
#   LIB=build-dev/li/libgdn.so OUT=/tmp/ncu bash dev/prefill/ncu_kda.sh [SHAPE_SUBSTR]
PYTHONPATH=$PWD/python:$PWD/bench:$PWD/.peers/fla exec bash dev/ncu_kernels.sh "kda_prep chunk_wg" \
    python3 dev/prefill/profile_kda.py ${1:-B1_T32768_H32_safe} once
