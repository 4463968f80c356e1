#!/bin/bash
# ncu_source.sh - ncu (--set full, source counters) of bwd_chain and bwd_grad in one small
# backward call (the instruction mix per chunk step does not depend on the shape), with a library
# built with -lineinfo: details, the SASS page and the CUDA-source page as CSV under $OUT, and the
# top stall lines (dev/prefill/ncu_stalls.py). ncu_summary.py reads the CSVs after.
#
#   LIB=build-dev/li/libgdn.so OUT=/tmp/ncu bash dev/backward/ncu_source.sh [B T H HV]
set -u
LIB=${LIB:-build-dev/li/libgdn.so}
OUT=${OUT:-/tmp/ncu}
mkdir -p $OUT
cat > /tmp/one_bwd.py <<'PY'
import sys
import torch
import torch.nn.functional as F
import libgdn
B, T, H, HV = (int(x) for x in sys.argv[1:5])
D = 128
q = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
k = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
v = torch.randn(B, T, HV, D, device="cuda").bfloat16().requires_grad_()
g = F.logsigmoid(torch.randn(B, T, HV, device="cuda")).requires_grad_()
beta = torch.rand(B, T, HV, device="cuda").bfloat16().requires_grad_()
o, _ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
o.backward(torch.randn_like(v))
torch.cuda.synchronize()
PY
for kern in bwd_chain bwd_grad; do
    GDN_LIBRARY=$LIB PYTHONPATH=$PWD/python timeout 240 ncu --clock-control none --set full --import-source yes \
        -k regex:$kern --launch-count 1 -f -o $OUT/rep_$kern python3 /tmp/one_bwd.py ${@:-1 4096 4 4} > $OUT/ncu_$kern.log 2>&1
    echo "ncu $kern rc=$?"
    ncu -i $OUT/rep_$kern.ncu-rep --page details --csv > $OUT/details_$kern.csv 2>/dev/null
    ncu -i $OUT/rep_$kern.ncu-rep --page source --csv --print-source sass > $OUT/sass_$kern.csv 2>/dev/null
    ncu -i $OUT/rep_$kern.ncu-rep --page source --csv --print-source cuda > $OUT/cuda_$kern.csv 2>/dev/null
    rm -f $OUT/rep_$kern.ncu-rep
    python3 dev/prefill/ncu_stalls.py $OUT/sass_$kern.csv 12 2>&1 | head -16
done
ls -la $OUT
