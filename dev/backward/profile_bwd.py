"""profile_bwd.py - per-kernel CUDA times of libgdn's chunked backward (torch profiler), one shape.

    PYTHONPATH=python GDN_LIBRARY=build/libgdn.so python3 dev/backward/profile_bwd.py [B T H HV [once]]

With `once`: one backward call and no profiler (for ncu, dev/backward/ncu_source.sh).
"""
import sys

import torch
import torch.nn.functional as F

import libgdn

B, T, H, HV = (int(x) for x in sys.argv[1:5]) if len(sys.argv) > 4 else (2, 16384, 16, 16)
once = len(sys.argv) > 5 and sys.argv[5] == "once"
D = 128
q = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
k = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
v = torch.randn(B, T, HV, D, device="cuda").bfloat16().requires_grad_()
g = F.logsigmoid(torch.randn(B, T, HV, device="cuda")).requires_grad_()
beta = torch.rand(B, T, HV, device="cuda").bfloat16().requires_grad_()
do = torch.randn_like(v)
o, _ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
if once:
    o.backward(do)
    torch.cuda.synchronize()
    sys.exit(0)
for _ in range(3):
    o.backward(do, retain_graph=True)
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        o.backward(do, retain_graph=True)
    torch.cuda.synchronize()
print(f"B{B} T{T} H{H} HV{HV}: per-kernel CUDA time over 5 backward calls")
for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
    print(f"{e.key[:60]:60s} {e.device_time_total / e.count / 1000:8.3f} ms x {e.count}")
