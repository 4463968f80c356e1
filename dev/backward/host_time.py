"""host_time.py - where a small training step's time goes: host (Python + launch) against device,
for libgdn's chunk_gated_delta_rule forward + backward (and FLA's, when importable), one shape.

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=build/libgdn.so python3 dev/backward/host_time.py [B T H HV] [libgdn]

With `libgdn`: libgdn only (no FLA kernels to compile; for an A/B of two builds of the package).

Per step (fwd: forward without autograd; fwd_ag: forward recording the graph; bwd: backward of a
kept graph; step: fwd_ag then its backward):
  host us    perf_counter per call over 50 calls without a sync (the rate the host queues work)
  event us   CUDA-event median per call (eager), as bench/fla_backward.py times it
Then the top CPU entries of torch's profiler over 10 libgdn steps.
"""
import sys

import torch

import libgdn
from fla_prefill import host_us, make_inputs, time_ms

B, T, H, HV = (int(x) for x in sys.argv[1:5]) if len(sys.argv) > 4 else (1, 8192, 2, 8)
only_libgdn = sys.argv[-1] == "libgdn"
q, k, v, g, beta = make_inputs(B, T, H, HV)
beta = beta.bfloat16()
do = torch.randn_like(v)


def steps(f):
    kw = dict(use_qk_l2norm_in_kernel=True)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]
    kept = f(*leaves, **kw)[0]

    def fwd():
        with torch.no_grad():
            f(q, k, v, g, beta, **kw)

    def fwd_ag():
        f(*leaves, **kw)

    def bwd():
        torch.autograd.grad(kept, leaves, do, retain_graph=True)

    def step():
        o, _ = f(*leaves, **kw)
        torch.autograd.grad(o, leaves, do)

    return dict(fwd=fwd, fwd_ag=fwd_ag, bwd=bwd, step=step)


def event_us(fn):
    return time_ms(fn, graph=False)[0] * 1e3


peers = [("libgdn", libgdn.chunk_gated_delta_rule)]
try:
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # timing only
    if not only_libgdn:
        peers.append(("FLA", fla_chunk))
except ImportError:
    pass
print(f"B{B} T{T} H{H} HV{HV}, {torch.cuda.get_device_name()}")
for name, f in peers:
    for what, fn in steps(f).items():
        print(f"{name:7s} {what:7s} host {host_us(fn, 50, 5):8.1f} us   event {event_us(fn):8.1f} us")
fn = steps(libgdn.chunk_gated_delta_rule)["step"]
for _ in range(3):
    fn()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48))
