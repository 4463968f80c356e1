"""pf_ab.py - libgdn's chunked prefill alone (CUDA graph replay, median of 40) at bench/fla_prefill.py's
shapes, inputs and timer, one line per library build, for an A/B of builds in one device call (FLA
is imported by fla_prefill but never run):

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=<build>/libgdn.so python3 -P dev/prefill/pf_ab.py TAG

Run it once per build, interleaving builds and rounds; the line is TAG then the ms of each shape in
fla_prefill.SHAPES' order.
"""
import sys

import libgdn
from fla_prefill import SHAPES, shape_inputs, time_ms

tag = sys.argv[1] if len(sys.argv) > 1 else "libgdn"
out = []
for name, B, T, H, HV, nseq, fixed in SHAPES:
    (q, k, v, g, beta), kw, _, _ = shape_inputs(B, T, H, HV, nseq, fixed)
    _, graph_ms = time_ms(lambda: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw), iters=40)
    out.append(f"{graph_ms:.4f}")
print(f"{tag:6s} " + " ".join(out))
