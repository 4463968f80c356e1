#!/usr/bin/env python3
"""kda_coop_sweep.py - KDA's cooperative grid (launch_coop with kda_prep units) against the share
of chunks whose records are written before it, at bench/fla_kda_prefill.py's shapes, libgdn
only. Needs a library built with -DGDN_CHUNK_DEV_KDA_PREFIX_ENV: the launcher then reads
GDN_DEV_KDA_PREFIX (percent of each sequence's chunks prepared before the grid; 100: every record
first, the two-pass order in one grid) at each call. Each setting's output and final state must
equal the rule's bitwise (the records are the same whatever runs them), then graph-replay times
(median of 20, fla_prefill.time_ms).

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=build-dev/kp/libgdn.so \
        python3 dev/prefill/kda_coop_sweep.py [SHAPE_SUBSTR] [PERCENT ...]
"""
import os
import sys

import torch

import libgdn
from fla_kda_prefill import make_inputs
from fla_prefill import time_ms

SHAPES = [("B1_T32768_H32_safe", 1, 32768, 32), ("B1_T32768_H16_safe", 1, 32768, 16),
          ("B2_T8192_H12_safe", 2, 8192, 12)]
args = sys.argv[1:]
want = args[0] if args and not args[0].isdigit() else ""
pcts = [a for a in args if a.isdigit()] or ["100", "70", "60", "55", "50", "45", "40", "30"]
print(f"{'shape':22s} {'prefix':>7s} {'graph ms':>9s} {'eager ms':>9s}  bitwise")
for name, B, T, H in SHAPES:
    if want not in name:
        continue
    inputs, kw, _ = make_inputs(B, T, H, "safe")
    os.environ.pop("GDN_DEV_KDA_PREFIX", None)
    o_ref, s_ref = libgdn.chunk_kda(*inputs, **kw)
    torch.cuda.synchronize()
    for pct in ["rule"] + pcts:
        if pct == "rule":
            os.environ.pop("GDN_DEV_KDA_PREFIX", None)
        else:
            os.environ["GDN_DEV_KDA_PREFIX"] = pct
        o, s = libgdn.chunk_kda(*inputs, **kw)
        torch.cuda.synchronize()
        same = torch.equal(o, o_ref) and torch.equal(s, s_ref)
        eager, graph = time_ms(lambda: libgdn.chunk_kda(*inputs, **kw))
        print(f"{name:22s} {pct:>7s} {graph if graph is not None else float('nan'):9.3f} {eager:9.3f}  {same}",
              flush=True)
    os.environ.pop("GDN_DEV_KDA_PREFIX", None)
