"""dual_ab.py - chunk_wg's DUAL instance (two math warpgroups a CTA, each the chain and the outputs of
64 value rows) against the one-chain instance, in one process, on a dev build of the library
(-DGDN_CHUNK_DEV_DUAL_ENV, which reads GDN_DEV_DUAL at each call: 0 never DUAL, 1 wherever allowed,
also in place of the cooperative grid).

For each shape of bench/fla_prefill.SHAPES (bf16, K = V = 128, L2 norm, f32 final state): o and the
final state of both instances compared bit for bit (they round the same values in the same order),
then graph-replay ms (median of 40), the instances interleaved for `rounds` rounds. One line a shape.

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=<dev build>/libgdn.so python3 -P dev/prefill/dual_ab.py [rounds [B,T,H,HV ... | kda]]

Shapes given as B,T,H,HV (fixed length) replace fla_prefill's: the launcher rule's boundary; `kda`
takes chunk_kda at bench/fla_kda_prefill.SHAPES instead.
"""
import os
import sys

import torch

import libgdn
from fla_prefill import SHAPES, shape_inputs, time_ms

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
kda = sys.argv[2:] == ["kda"]
if kda:
    import fla_kda_prefill

    cases = []
    for name, B, T, H, nseq, gate in fla_kda_prefill.SHAPES:
        args, kw, _ = fla_kda_prefill.shape_inputs(B, T, H, nseq, gate)
        cases.append((name, args, kw))
else:
    if len(sys.argv) > 2:
        SHAPES = []
        for arg in sys.argv[2:]:
            B, T, H, HV = (int(x) for x in arg.split(","))
            SHAPES.append((f"B{B}_T{T}_H{H}_HV{HV}", B, T, H, HV, 0, 0))
    cases = []
    for name, B, T, H, HV, nseq, fixed in SHAPES:
        (q, k, v, g, beta), kw, _, _ = shape_inputs(B, T, H, HV, nseq, fixed)
        cases.append((name, (q, k, v, g, beta), kw))
fn = libgdn.chunk_kda if kda else libgdn.chunk_gated_delta_rule
print(f"{'shape':26s} bitwise  " + "  ".join(f"one{r} dual{r}" for r in range(rounds)) + "  dual/one")
for name, args, kw in cases:
    outs = {}
    for mode in ("0", "1"):
        os.environ["GDN_DEV_DUAL"] = mode
        o, ht = fn(*args, **kw)
        torch.cuda.synchronize()
        outs[mode] = (o.clone(), ht.clone())
    same = all(torch.equal(a, b) for a, b in zip(outs["0"], outs["1"]))
    finite = all(torch.isfinite(x).all().item() for x in outs["1"])
    times = {"0": [], "1": []}
    for _ in range(rounds):
        for mode in ("0", "1"):
            os.environ["GDN_DEV_DUAL"] = mode
            _, ms = time_ms(lambda: fn(*args, **kw), iters=40)
            times[mode].append(ms)
    cols = "  ".join(f"{a:.4f} {b:.4f}" for a, b in zip(times["0"], times["1"]))
    ratio = min(times["1"]) / min(times["0"])
    print(f"{name:26s} {'yes' if same else ('NO' if finite else 'NaN')}      {cols}  {ratio:.3f}", flush=True)
