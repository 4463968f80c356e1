"""fla_kda_prefill.py - libgdn's CUDA chunked KDA forward (`libgdn.chunk_kda`) beside FLA's
`fla.ops.kda.chunk_kda`: same inputs, same process, same timing as fla_prefill.py (CUDA events,
median of 20 after warm-up, eagerly and under CUDA graph replay), at issue 16's prefill shapes;
then both against a float64 recurrence.

    PYTHONPATH=.peers/fla:python GDN_LIBRARY=build/libgdn.so python3 bench/fla_kda_prefill.py \
        [--out table.txt] [--skip-accuracy] [--only SHAPE_SUBSTR]

bf16 q, k, v, K = V = 128, L2 norm in-kernel, beta = sigmoid(randn), no initial state, final
state f32. "safe" shapes compute the gate in-kernel as FLA benchmarks chunk_kda: raw bf16 g with
A_log and dt_bias, safe_gate=True, lower_bound=-5; "g" shapes take precomputed per-key log decays
logsigmoid(randn) (f32). TFLOP/s are counted as 4 * T * HV * d^2, as for GDN.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import libgdn
from fla.ops.kda import chunk_kda as fla_kda
from fla_prefill import rel, time_ms, varlen_cu

D = 128
SHAPES = [
    # name, B, T, H (= HV), nseq (varlen: random lengths 1..4096), gate
    ("B2_T16384_H64_safe", 2, 16384, 64, 0, "safe"),
    ("B2_T16384_H64_g", 2, 16384, 64, 0, "g"),
    ("B1_T32768_H32_safe", 1, 32768, 32, 0, "safe"),
    ("B1_T65536_H4_safe", 1, 65536, 4, 0, "safe"),
    ("varlen64rand_H32_safe", 1, 0, 32, 64, "safe"),
]


def make_inputs(B, T, H, gate, seed=0, extreme=False):
    """(q, k, v, g, beta), the keywords of a chunk_kda call, and the float64 log decays."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
    k = torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
    v = torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
    beta = torch.randn(B, T, H, device="cuda", generator=gen).sigmoid()
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    if gate == "safe":
        g = torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
        A_log = torch.rand(H, device="cuda", generator=gen)
        dt_bias = torch.randn(H * D, device="cuda", generator=gen)
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, safe_gate=True, lower_bound=-5.0)
        x = g.double() + dt_bias.double().view(H, D)
        g64 = -5.0 * torch.sigmoid(A_log.double().exp()[:, None] * x)
    else:
        # "long": long memory (g ~ -0.0025, the context-parallel tests' regime); "zero": no decay
        # at all over the middle three quarters of the sequence
        shift = 6.0 if gate == "long" else 0.0
        g = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen) + shift)
        if gate == "zero":
            g[:, T // 8:T - T // 8] = 0.0
        if extreme:
            # Every 7th (token, key) pair of a cycle of extreme log decays, the rest logsigmoid.
            cyc = torch.tensor([-1e4, -60.0, -15.0, -3.0, -0.5, -1e-4, 0.0], device="cuda")
            idx = torch.arange(g.numel(), device="cuda").view(g.shape)
            g = torch.where(idx % 7 == 0, cyc[(idx // 7) % 7], g)
        g64 = g.double()
    return (q, k, v, g, beta), kw, g64


def shape_inputs(B, T, H, nseq, gate):
    """The inputs of one SHAPES row: (args, keywords with cu_seqlens, host cu_seqlens or None);
    varlen rows (nseq > 0) take fla_prefill's random lengths."""
    cu = cu_cpu = None
    if nseq:
        cu_cpu, T = varlen_cu(nseq)
        cu = cu_cpu.to(device="cuda", dtype=torch.int32)
    args, kw, _ = make_inputs(B, T, H, gate)
    kw["cu_seqlens"] = cu
    return args, kw, cu_cpu


def reference_f64(q, k, v, g64, beta, scale, cu=None):
    """The KDA recurrence in float64 (per-key decays), all heads at once, B = 1."""
    _, T, H, K = q.shape
    qd = q[0].double()
    kd = k[0].double()
    qd = qd / torch.sqrt((qd * qd).sum(-1, keepdim=True) + 1e-6) * scale
    kd = kd / torch.sqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
    vd, ed, bd = v[0].double(), g64[0].exp(), beta[0].double()
    bounds = cu.tolist() if cu is not None else [0, T]
    o = torch.empty(T, H, v.shape[3], dtype=torch.float64, device=q.device)
    finals = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        S = torch.zeros(H, K, v.shape[3], dtype=torch.float64, device=q.device)
        for t in range(a, b):
            S *= ed[t][:, :, None]
            u = bd[t][:, None] * (vd[t] - torch.einsum("hk,hkv->hv", kd[t], S))
            S += kd[t][:, :, None] * u[:, None, :]
            o[t] = torch.einsum("hk,hkv->hv", qd[t], S)
        finals.append(S)
    return o[None], torch.stack(finals)


def fmt_row(name, tok, H, og, oe, fg, fe):
    flop = 4.0 * tok * H * D * D
    best = og if og is not None else oe
    f = lambda x: f"{x:8.3f}" if x is not None else "     n/a"
    xg = f"{fg / og:7.2f}" if (fg is not None and og is not None) else "    n/a"
    return (f"{name:24s} {tok:7d} | {f(og)} {f(oe)} {flop / best * 1e-9:7.1f} | {f(fg)} {f(fe)} | {xg} "
            f"{fe / oe:7.2f}")


HEADER = (f"{'shape':24s} {'tokens':>7s} | {'ours_g':>8s} {'ours_e':>8s} {'TFLOP/s':>7s} | {'fla_g':>8s} "
          f"{'fla_e':>8s} | {'x_graph':>7s} {'x_eager':>7s}")


def bench(out, only=None):
    print(HEADER, flush=True)
    if out:
        out.write(HEADER + "\n")
    for name, B, T, H, nseq, gate in SHAPES:
        if only and only not in name:
            continue
        args, kw, cu_cpu = shape_inputs(B, T, H, nseq, gate)
        if nseq:
            T = int(cu_cpu[-1])
        o1, h1 = libgdn.chunk_kda(*args, **kw)
        o2, h2 = fla_kda(*args, cu_seqlens_cpu=cu_cpu, **kw)
        torch.cuda.synchronize()
        assert torch.isfinite(o1).all() and torch.isfinite(h1).all(), f"{name}: libgdn output not finite"
        fla_e, fla_g = time_ms(lambda: fla_kda(*args, cu_seqlens_cpu=cu_cpu, **kw))
        our_e, our_g = time_ms(lambda: libgdn.chunk_kda(*args, **kw))
        line = fmt_row(name, B * T, H, our_g, our_e, fla_g, fla_e) + f"   (o: ours vs FLA {rel(o1, o2.double()):.1e})"
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
        del args, o1, o2, h1, h2
        torch.cuda.empty_cache()
    tail = "times in ms (median of 20); x_* = FLA time / ours"
    print(tail)
    if out:
        out.write(tail + "\n")


def accuracy(seeds=3):
    """Both libraries against the float64 recurrence on the same inputs, per case and seed (fresh
    inputs per seed), then the mean over the seeds."""
    head = f"{'case':34s} {'ours_o':>9s} {'fla_o':>9s} | {'ours_S':>9s} {'fla_S':>9s}"
    lines, means = [head], [head.replace("case", "mean over seeds", 1)]
    cases = [("T=4096 H=4 safe gate", 4096, 4, "safe", False, None),
             ("T=4096 H=4 precomputed g", 4096, 4, "g", False, None),
             ("T=4096 H=4 extreme g", 4096, 4, "g", True, None),
             ("T=8192 H=4 long memory g", 8192, 4, "long", False, None),
             ("T=4096 H=4 g = 0 on 3072 tokens", 4096, 4, "zero", False, None),
             ("varlen 5 seqs H=4 safe gate", 0, 4, "safe", False, [700, 1, 64, 2000, 129])]
    for name, T, H, gate, extreme, lens in cases:
        cu = cu_cpu = None
        if lens:
            cu_cpu = torch.tensor([0] + lens).cumsum(0)
            T = int(cu_cpu[-1])
            cu = cu_cpu.to(device="cuda", dtype=torch.int32)
        errs = []
        for seed in range(seeds):
            (q, k, v, g, beta), kw, g64 = make_inputs(1, T, H, gate, seed=T + H + 1000 * seed, extreme=extreme)
            kw["cu_seqlens"] = cu
            ref_o, ref_S = reference_f64(q, k, v, g64, beta, D ** -0.5, cu_cpu)
            oo, os_ = libgdn.chunk_kda(q, k, v, g, beta, **kw)
            fo, fs = fla_kda(q, k, v, g, beta, cu_seqlens_cpu=cu_cpu, **kw)
            errs.append((rel(oo, ref_o), rel(fo, ref_o), rel(os_, ref_S), rel(fs, ref_S)))
            lines.append(f"{name + f' seed {seed}':34s} {errs[-1][0]:9.3e} {errs[-1][1]:9.3e} | {errs[-1][2]:9.3e} "
                         f"{errs[-1][3]:9.3e}")
        m = [sum(e[i] for e in errs) / len(errs) for i in range(4)]
        means.append(f"{name:34s} {m[0]:9.3e} {m[1]:9.3e} | {m[2]:9.3e} {m[3]:9.3e}")
    lines.append("")
    lines += means
    lines.append("relative error (norm of the difference / norm of the reference) vs the float64 recurrence "
                 "(issue 16's bar: at most FLA's and under 5e-3)")
    return "\n".join(lines)


def warm(name):
    """FLA autotunes per key set (head count, gate form) on first use, minutes of compiling:
    scripts/device_kda_prefill.sh runs one of these per key set before timing."""
    for nm, B, T, H, nseq, gate in SHAPES:
        if nm == name:
            args, kw, _ = make_inputs(B, T if T else 4096, H, gate)
            fla_kda(*args, **kw)
            torch.cuda.synchronize()
            print(f"warmed FLA at {name}", flush=True)
            return 0
    print(f"unknown shape {name}", file=sys.stderr)
    return 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write the tables here too")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--accuracy-only", action="store_true", help="no timings")
    ap.add_argument("--only", metavar="SUBSTR", help="time only the shapes whose name contains this")
    ap.add_argument("--warm", metavar="SHAPE", help="only run FLA once at this shape (fills Triton's autotune cache)")
    args = ap.parse_args()
    if args.warm:
        return warm(args.warm)
    out = open(args.out, "w") if args.out else None
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    # Clock warm-up: two seconds of GEMMs before the first timing.
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < 2.0:
        x @ x
    torch.cuda.synchronize()
    del x
    if not args.accuracy_only:
        bench(out, args.only)
    if not args.skip_accuracy:
        acc = accuracy()
        print(acc)
        if out:
            out.write("\n" + acc + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
