#!/bin/bash
# l2_ahead.sh - bwd_grad with and without its L2 prefetch of the inputs of the CTA one wave ahead
# (GRAD_L2_AHEAD, sm90_chunk_bwd_common.cuh; a dev switch, off in the shipping build): the
# variant's CUDA tests and memcheck, then per-kernel times of both libraries at three shapes.
#
#   here:   the default build as for device_check.sh into build-dev/, and the variant:
#             cmake -S . -B /tmp/build-ahead -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
#                 -DGDN_WERROR=ON -DCMAKE_CUDA_FLAGS=-DGDN_BWD_DEV_L2_AHEAD
#             cmake --build /tmp/build-ahead -j3 --target gdn test_backward
#             mkdir -p build-dev/ahead; cp -L /tmp/build-ahead/libgdn.so build-dev/ahead/
#             cp /tmp/build-ahead/tests/test_backward build-dev/ahead/
#   device: run(command="bash dev/backward/l2_ahead.sh", carry=["build-dev"])
# The prefetch cannot change a result (a hint to L2), so the variant's tests pass or fail with the
# default's; what it may change is bwd_grad's time.
set -u
D=$PWD/build-dev
export PYTHONPATH=$PWD/python
echo "== test_backward cuda (ahead)"
$D/ahead/test_backward cuda_grads cuda_deterministic cuda_strided cuda_limits 2>&1 | grep -v "^    cuda" | tail -6
echo "== memcheck (ahead)"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $D/ahead/test_backward cuda_grads cuda_limits 2>&1 | tail -2
for shape in "2 16384 16 16" "1 32768 16 32" "1 8192 2 8"; do
    for lib in $D/libgdn.so $D/ahead/libgdn.so; do
        echo "== $shape $lib"
        GDN_LIBRARY=$lib python3 dev/backward/profile_bwd.py $shape 2>&1 | grep "bwd_grad\|bwd_chain"
    done
done
