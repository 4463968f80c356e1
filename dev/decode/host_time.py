"""host_time.py - an eager decode step's host time (Python + launch) against its device time, for
libgdn's and FLA's fused_recurrent_gated_delta_rule called as transformers' Qwen3-Next calls it
(q, k, v, g, beta of one token; f32 initial_state from the cache; output_final_state=True; q/k
l2 norm in-kernel), and for fused_recurrent_kda called as FLA's KDA layer calls it.

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=build/libgdn.so python3 dev/decode/host_time.py [B ...]

Per batch size B (default 1 8 64), H=16, HV=32, K=V=128:
  host us    perf_counter per call over 200 calls without a sync (the rate the host queues work)
  event us   CUDA-event median of 20 single calls (the host gap between calls included)
Then cProfile's top entries and torch's profiler (CPU side) for libgdn's call at the last B.
"""
import cProfile
import pstats
import sys

import torch

import libgdn
from fla_prefill import host_us
from layout_time import H, HV, K, call  # inputs as transformers passes them (KV state)

BS = [int(x) for x in sys.argv[1:]] or [1, 8, 64]


def gdn_call(f, B):
    return call(f, B, False, False)


def kda_call(f, B):
    return call(f, B, True, False)


def event_us(fn, n=20):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return sorted(ts)[n // 2]


peers = [("libgdn", libgdn.fused_recurrent_gated_delta_rule, libgdn.fused_recurrent_kda)]
try:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_gdn
    from fla.ops.kda import fused_recurrent_kda as fla_kda
    peers.append(("FLA", fla_gdn, fla_kda))
except ImportError as e:
    print("FLA not importable:", e)
print(f"H{H} HV{HV} K=V={K}, T=1, {torch.cuda.get_device_name()}, torch {torch.__version__}")
for B in BS:
    for name, fg, fk in peers:
        for op, fn in (("gdn", gdn_call(fg, B)), ("kda", kda_call(fk, B))):
            print(f"B{B:<4d} {name:7s} {op}  host {host_us(fn, 200, 10):7.1f} us   event {event_us(fn):7.1f} us", flush=True)

fn = gdn_call(libgdn.fused_recurrent_gated_delta_rule, BS[-1])
for _ in range(10):
    fn()
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(200):
    fn()
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(14)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=48))
