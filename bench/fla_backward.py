"""fla_backward.py - libgdn's chunked backward (gdn_chunk_bwd on CUDA) beside FLA's
chunk_gated_delta_rule backward, same inputs, same process, same timing, at the shapes of issue 17.

    GDN_COMMIT=$(git rev-parse --short HEAD) PYTHONPATH=.peers/fla:python GDN_LIBRARY=build/libgdn.so \
        python3 bench/fla_backward.py [--out table.txt] [--only SHAPE_SUBSTR]

bf16, K = V = 128, L2 norm in-kernel, g = logsigmoid(randn) (f32), beta = sigmoid(randn) (bf16),
no initial state, no final state. Per shape, eager CUDA-event medians of 20 calls after warm-up:
  fwd      the forward alone (no autograd graph)
  bwd      autograd backward alone: torch.autograd.grad(o, inputs, do, retain_graph=True) on one
           forward's graph (grad returns the gradients; nothing accumulates into .grad)
  fwd+bwd  a forward with autograd and its backward (torch.autograd.grad)
FLA's gated backward refuses Hopper with triton < 3.7.1 (its issue #640, results said to be wrong);
for timing only this script sets fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True. FLA's gradients
are never used as a reference: the tests check libgdn's against float64.
"""

import argparse
import datetime
import os
import sys

import torch

import libgdn
import fla.ops.common.chunk_o as fla_chunk_o
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fla_prefill import make_inputs, time_ms, varlen_cu  # noqa: E402

fla_chunk_o.TRITON_ABOVE_3_7_1 = True

SHAPES = [
    # name, B, T, H, HV, nseq (0: fixed length; else random lengths 1..4096)
    ("B1_T8192_H2_HV8", 1, 8192, 2, 8, 0),
    ("B2_T16384_H16_HV16", 2, 16384, 16, 16, 0),
    ("B1_T32768_H16_HV32", 1, 32768, 16, 32, 0),
    ("varlen64rand_H16_HV32", 1, 0, 16, 32, 64),
]


def median_ms(fn):
    return time_ms(fn, graph=False)[0]  # autograd calls: eager only


def timings(f, q, k, v, g, beta, do, **extra):
    kw = dict(use_qk_l2norm_in_kernel=True, **extra)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]

    def fwd():
        with torch.no_grad():
            f(q, k, v, g, beta, **kw)

    def fwd_bwd():
        o, _ = f(*leaves, **kw)
        torch.autograd.grad(o, leaves, do)

    o, _ = f(*leaves, **kw)

    def bwd():
        torch.autograd.grad(o, leaves, do, retain_graph=True)

    return median_ms(fwd), median_ms(bwd), median_ms(fwd_bwd)


def bench(out, only=None):
    rows = []
    for name, B, T, H, HV, nseq in SHAPES:
        if only and only not in name:
            continue
        cu = cu_cpu = None
        if nseq:
            cu_cpu, T = varlen_cu(nseq)
            cu = cu_cpu.cuda()
        q, k, v, g, beta = make_inputs(B, T, H, HV)
        beta = beta.bfloat16()
        do = torch.randn_like(v)
        ours = timings(libgdn.chunk_gated_delta_rule, q, k, v, g, beta, do, cu_seqlens=cu)
        theirs = timings(fla_chunk, q, k, v, g, beta, do, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
        rows.append((name, ours, theirs))
        line = (f"{name:24s} ours fwd {ours[0]:7.3f} bwd {ours[1]:7.3f} fwd+bwd {ours[2]:7.3f} | "
                f"FLA fwd {theirs[0]:7.3f} bwd {theirs[1]:7.3f} fwd+bwd {theirs[2]:7.3f} | "
                f"bwd {theirs[1] / ours[1]:5.2f}x fwd+bwd {theirs[2] / ours[2]:5.2f}x")
        print(line, flush=True)
        out.append(line)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--only")
    args = ap.parse_args()
    head = [f"# device {torch.cuda.get_device_name()}, {datetime.date.today()}, torch {torch.__version__}",
            "# times in ms (eager, CUDA-event median of 20); ratio = FLA / libgdn"]
    if os.environ.get("GDN_COMMIT"):  # the caller's commit (a device copy of the tree may lack .git)
        head.append("# commit " + os.environ["GDN_COMMIT"])
    for h in head:
        print(h)
    out = list(head)
    bench(out, args.only)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
