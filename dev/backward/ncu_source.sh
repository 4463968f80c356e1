#!/bin/bash
# ncu_source.sh - ncu of bwd_rev and bwd_grad in one small backward call (the instruction mix per
# chunk step does not depend on the shape), through dev/ncu_kernels.sh (its outputs); sass_mix.py
# gives the instruction mix of a CSV.
#
#   LIB=build-dev/li/libgdn.so OUT=/tmp/ncu bash dev/backward/ncu_source.sh [B T H HV]
PYTHONPATH=$PWD/python exec bash dev/ncu_kernels.sh "bwd_rev bwd_grad" python3 dev/backward/profile_bwd.py \
    ${@:-1 4096 4 4} once
