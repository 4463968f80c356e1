#!/bin/bash
# device_check.sh - one device call for a backward change: the CUDA tests of test_backward, the
# sanitizers on them, the Python backward tests (and optionally the full suite), then per-kernel
# times of each library given, at three shapes; then the forward's cost of saving the states and
# the backward's gain from them (saved_states.py).
#
#   build-dev/{libgdn.so,test_backward} and, for an A/B, build-dev/base/libgdn.so
#   bash dev/backward/device_check.sh [full]
set -u
D=$PWD/build-dev
export PYTHONPATH=$PWD/python:$PWD/.peers/fla
echo "== test_backward cuda"
$D/test_backward cuda_grads cuda_deterministic cuda_strided cuda_limits 2>&1 | tail -25
echo "== memcheck"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $D/test_backward cuda_grads cuda_strided cuda_limits 2>&1 | tail -4
echo "== racecheck"
timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 $D/test_backward cuda_grads 2>&1 | tail -4
echo "== python backward tests"
GDN_LIBRARY=$D/libgdn.so python3 -m pytest -q -x python/tests/test_backward.py 2>&1 | tail -3
if [ "${1:-}" = full ]; then
    echo "== python suite"
    GDN_LIBRARY=$D/libgdn.so python3 -m pytest -q python/tests 2>&1 | tail -3
fi
for lib in $D/base/libgdn.so $D/libgdn.so; do
    [ -f $lib ] || continue
    for shape in "2 16384 16 16" "1 8192 2 8" "1 32768 16 32"; do
        echo "== profile $lib $shape"
        GDN_LIBRARY=$lib python3 dev/backward/profile_bwd.py $shape 2>&1 | tail -6
    done
done
echo "== saved states"
PYTHONPATH=$PWD/python:$PWD/bench:$PWD/.peers/fla GDN_LIBRARY=$D/libgdn.so python3 dev/backward/saved_states.py 2>&1 | tail -5
