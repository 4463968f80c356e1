#!/usr/bin/env python3
"""profile_kda.py - per-kernel CUDA times of libgdn.chunk_kda (torch profiler) at one of
bench/fla_kda_prefill.py's shapes, with the same inputs.

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=build/libgdn.so \
        python3 dev/prefill/profile_kda.py [SHAPE_SUBSTR ... [once]]

With `once`: one call of the first matching shape and no profiler (for ncu).
"""
import sys

import torch

import libgdn
from fla_kda_prefill import SHAPES, shape_inputs

args = sys.argv[1:]
once = bool(args) and args[-1] == "once"
wanted = [a for a in args if a != "once"] or [s[0] for s in SHAPES]
for name, B, T, H, nseq, gate in SHAPES:
    if not any(w in name for w in wanted):
        continue
    inputs, kw, _ = shape_inputs(B, T, H, nseq, gate)
    if once:
        libgdn.chunk_kda(*inputs, **kw)
        torch.cuda.synchronize()
        sys.exit(0)
    for _ in range(3):
        libgdn.chunk_kda(*inputs, **kw)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            libgdn.chunk_kda(*inputs, **kw)
        torch.cuda.synchronize()
    print(f"{name}: per-kernel CUDA time, mean of 5 calls")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
        print(f"  {e.key[:64]:64s} {e.device_time_total / 5 / 1000:8.3f} ms ({e.count // 5} a call)")
    del inputs
    torch.cuda.empty_cache()
