"""profile_bwd.py - per-kernel CUDA times of libgdn's chunked backward (torch profiler), one shape.

    PYTHONPATH=python GDN_LIBRARY=build/libgdn.so python3 dev/backward/profile_bwd.py [--d D] [B T H HV [once]]
    PYTHONPATH=python:bench GDN_LIBRARY=build/libgdn.so python3 dev/backward/profile_bwd.py [--d D] varlen N H HV [once]

With `once`: one backward call and no profiler (for ncu, dev/backward/ncu_source.sh). `varlen N`: B = 1
and bench/fla_prefill.varlen_cu(N)'s sequences (bench/fla_backward.py's varlen shape), as cu_seqlens.
`--d D`: head dims K = V = D (64 or 128; default 128).
"""
import sys

import torch
import torch.nn.functional as F

import libgdn

D = 128
if len(sys.argv) > 2 and sys.argv[1] == "--d":
    D = int(sys.argv[2])
    del sys.argv[1:3]
cu = None
if len(sys.argv) > 1 and sys.argv[1] == "varlen":
    from fla_prefill import varlen_cu

    cu_cpu, T = varlen_cu(int(sys.argv[2]))
    cu = cu_cpu.cuda()
    B, H, HV = 1, int(sys.argv[3]), int(sys.argv[4])
else:
    B, T, H, HV = (int(x) for x in sys.argv[1:5]) if len(sys.argv) > 4 else (2, 16384, 16, 16)
once = len(sys.argv) > 5 and sys.argv[5] == "once"
q = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
k = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
v = torch.randn(B, T, HV, D, device="cuda").bfloat16().requires_grad_()
g = F.logsigmoid(torch.randn(B, T, HV, device="cuda")).requires_grad_()
beta = torch.rand(B, T, HV, device="cuda").bfloat16().requires_grad_()
do = torch.randn_like(v)
o, _ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
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
print(f"B{B} T{T} H{H} HV{HV}{f' D{D}' if D != 128 else ''}{' varlen' if cu is not None else ''}: per-kernel CUDA time over 5 backward calls")
for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
    print(f"{e.key[:60]:60s} {e.device_time_total / e.count / 1000:8.3f} ms x {e.count}")
# The backward's kernels from the first start to the last end, per call (bwd_grad may run beside
# bwd_rev, so the per-kernel times above need not add up): a call's group ends with bwd_grad or
# bwd_gate.
kern = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "gdn_bwd::" in e.name),
              key=lambda e: e.time_range.start)
groups = []
for e in kern:
    if not groups or any("bwd_grad" in x.name for x in groups[-1]) and "bwd_gate" not in e.name:
        groups.append([])
    groups[-1].append(e)
spans = sorted(max(x.time_range.end for x in gr) - min(x.time_range.start for x in gr) for gr in groups)
if spans:
    print(f"{'device span of the backward kernels (median of %d)' % len(spans):60s} {spans[len(spans) // 2] / 1000:8.3f} ms")
# The whole backward call, first launch to last kernel's end (kernels may overlap, so the
# per-kernel times above need not add up to it): median of 21 eager calls.
times = []
for _ in range(21):
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    o.backward(do, retain_graph=True)
    t1.record()
    torch.cuda.synchronize()
    times.append(t0.elapsed_time(t1))
print(f"{'backward call (events, median of 21)':60s} {sorted(times)[10]:8.3f} ms")
