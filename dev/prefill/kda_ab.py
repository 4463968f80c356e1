"""A/B of libgdn.chunk_kda builds at issue 16's prefill shapes (graph replay, median of 20):
one process per build and round (GDN_LIBRARY and PYTHONPATH pick the build); prints
"TAG shape graph_ms eager_ms norm(o)". Usage: PYTHONPATH=.peers/fla:python:bench:dev/prefill kda_ab.py TAG"""
import sys
import torch
import libgdn
from fla_kda_prefill import SHAPES, shape_inputs
from fla_prefill import time_ms

tag = sys.argv[1]
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(200):
    x @ x
torch.cuda.synchronize()
for name, B, T, H, nseq, gate in SHAPES:
    args, kw, _ = shape_inputs(B, T, H, nseq, gate)
    o, h = libgdn.chunk_kda(*args, **kw)
    assert torch.isfinite(o).all() and torch.isfinite(h).all()
    e, g = time_ms(lambda: libgdn.chunk_kda(*args, **kw))
    print(f"{tag} {name} {g:.4f} {e:.4f} {o.double().norm().item():.6e}", flush=True)
