#!/usr/bin/env python3
"""profile_kda.py - per-kernel CUDA times of libgdn.chunk_kda (torch profiler) at one of
bench/fla_kda_prefill.py's shapes, with the same inputs; with --gdn, of
libgdn.chunk_gated_delta_rule at bench/fla_prefill.py's shapes.

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=build/libgdn.so \
        python3 dev/prefill/profile_kda.py [--gdn] [SHAPE_SUBSTR ... [once]]

With `once`: one call of the first matching shape and no profiler (for ncu).
"""
import sys

import torch

import libgdn
import fla_prefill
from fla_kda_prefill import SHAPES, shape_inputs


def kda_cases():
    for name, B, T, H, nseq, gate in SHAPES:
        yield name, lambda B=B, T=T, H=H, nseq=nseq, gate=gate: (libgdn.chunk_kda, shape_inputs(B, T, H, nseq, gate)[:2])


def gdn_cases():
    for name, B, T, H, HV, nseq, fixed in fla_prefill.SHAPES:
        yield name, lambda B=B, T=T, H=H, HV=HV, nseq=nseq, fixed=fixed: (
            libgdn.chunk_gated_delta_rule, fla_prefill.shape_inputs(B, T, H, HV, nseq, fixed)[:2])


args = sys.argv[1:]
gdn = "--gdn" in args
args = [a for a in args if a != "--gdn"]
once = bool(args) and args[-1] == "once"
cases = list(gdn_cases() if gdn else kda_cases())
wanted = [a for a in args if a != "once"] or [c[0] for c in cases]
for name, make in cases:
    if not any(w in name for w in wanted):
        continue
    fn, (inputs, kw) = make()
    if once:
        fn(*inputs, **kw)
        torch.cuda.synchronize()
        sys.exit(0)
    for _ in range(3):
        fn(*inputs, **kw)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn(*inputs, **kw)
        torch.cuda.synchronize()
    print(f"{name}: per-kernel CUDA time, mean of 5 calls")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
        print(f"  {e.key[:64]:64s} {e.device_time_total / 5 / 1000:8.3f} ms ({e.count // 5} a call)")
    del inputs
    torch.cuda.empty_cache()
