"""fla_prefill.py - libgdn's CUDA chunk forward beside FLA's chunk_gated_delta_rule, same inputs,
same process, same timing (CUDA events, median of 20 after warm-up; eagerly and under CUDA graph
replay), at the six prefill shapes of issue 4, three more of issue 18 and a small mixed varlen batch;
then accuracy of both against a float64 recurrence at T >= 8192.

    PYTHONPATH=.peers/fla:python GDN_LIBRARY=build/libgdn.so python3 bench/fla_prefill.py \
        [--ours bench_prefill.txt] [--out table.txt] [--skip-accuracy] [--only SHAPE_SUBSTR]

--ours reads bench/bench_prefill.cu's output (the C timings of gdn_chunk_fwd) to print beside.
bf16, K = V = 128, L2 norm in-kernel, g = logsigmoid(randn), beta = sigmoid(randn), no initial
state, final state f32. TFLOP/s are counted as 4 * T * HV * d^2.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import libgdn
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent

D = 128
SHAPES = [
    # name, B, T, H, HV, nseq, fixed_len (0: random 1..4096); FLA's cheapest-to-compile first
    ("B1_T8192_H2_HV8", 1, 8192, 2, 8, 0, 0),
    ("B1_T65536_H2_HV8", 1, 65536, 2, 8, 0, 0),
    ("B1_T32768_H16_HV32", 1, 32768, 16, 32, 0, 0),
    ("B2_T16384_H16_HV16", 2, 16384, 16, 16, 0, 0),
    ("varlen64rand_H16_HV32", 1, 0, 16, 32, 64, 0),
    ("varlen16x16384_H16_HV16", 1, 0, 16, 16, 16, 16384),
    # issue 18's shapes with FlashInfer figures: Qwen3.5-397B at TP1, and a TP8 shard
    ("B2_T4096_H16_HV64", 2, 4096, 16, 64, 0, 0),
    ("B8_T8192_H16_HV64", 8, 8192, 16, 64, 0, 0),
    ("B1_T32768_H2_HV8", 1, 32768, 2, 8, 0, 0),
    # a small mixed batch: a few waves of main-pass CTAs whose chains differ up to 64-fold
    ("varlen16rand_H16_HV32", 1, 0, 16, 32, 16, 0),
]


def random_lengths(n):
    """Same 31-bit LCG as bench_prefill.cu."""
    x, out = 12345, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(1 + x % 4096)
    return out


def varlen_cu(nseq, fixed=0):
    """cu_seqlens on the host (int64) of nseq sequences of length fixed (0: random_lengths), and T."""
    lens = [fixed] * nseq if fixed else random_lengths(nseq)
    cu_cpu = torch.tensor([0] + lens).cumsum(0)
    return cu_cpu, int(cu_cpu[-1])


def make_inputs(B, T, H, HV, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
    k = torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
    v = torch.randn(B, T, HV, D, device="cuda", generator=gen).bfloat16()
    g = F.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=gen))
    beta = torch.randn(B, T, HV, device="cuda", generator=gen).sigmoid()
    return q, k, v, g, beta


def shape_inputs(B, T, H, HV, nseq, fixed):
    """The inputs of one SHAPES row: ((q, k, v, g, beta), the call's keywords with cu_seqlens,
    host cu_seqlens or None, T); varlen rows (nseq > 0) take varlen_cu's lengths."""
    cu = cu_cpu = None
    if nseq:
        cu_cpu, T = varlen_cu(nseq, fixed)
        cu = cu_cpu.cuda()
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    return make_inputs(B, T, H, HV), kw, cu_cpu, T


def host_us(fn, n, warm):
    """Host microseconds per call over n calls queued without a sync (the rate the host issues
    work), after warm calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def time_ms(fn, iters=20, warm=3, graph=True):
    """Median of per-call event timings, eagerly; and under graph replay (None if capture fails or
    graph is False)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    eager = sorted(a.elapsed_time(b) for a, b in ev)[iters // 2]
    graph_ms = None
    if not graph:
        return eager, graph_ms
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            fn()
        for _ in range(warm):
            gr.replay()
        torch.cuda.synchronize()
        for a, b in ev:
            a.record()
            gr.replay()
            b.record()
        torch.cuda.synchronize()
        graph_ms = sorted(a.elapsed_time(b) for a, b in ev)[iters // 2]
    except Exception as e:  # FLA's varlen path reads cu_seqlens on the host
        print(f"  graph capture failed: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
        torch.cuda.synchronize()
    return eager, graph_ms


def bench(ours_c, out, only=None):
    rows = []
    for name, B, T, H, HV, nseq, fixed in SHAPES:
        if only and only not in name:
            continue
        (q, k, v, g, beta), kw, cu_cpu, T = shape_inputs(B, T, H, HV, nseq, fixed)
        fla_e, fla_g = time_ms(lambda: fla_chunk(q, k, v, g, beta, cu_seqlens_cpu=cu_cpu, **kw))
        our_e, our_g = time_ms(lambda: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw))
        tok = B * T
        flop = 4.0 * tok * HV * D * D
        c = ours_c.get(name)
        rows.append((name, tok, flop, our_g, our_e, fla_g, fla_e, c))
        line = fmt_table(rows[-1:]).splitlines()[1]
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
        del q, k, v, g, beta
        torch.cuda.empty_cache()
    return rows


def warm(name):
    """FLA autotunes per (H, HV, K, V) on first use, minutes of compiling: the device script runs
    one of these per key set in parallel (Triton caches the results on disk) before timing."""
    for nm, B, T, H, HV, nseq, fixed in SHAPES:
        if nm == name:
            q, k, v, g, beta = make_inputs(B, T, H, HV)
            fla_chunk(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
            torch.cuda.synchronize()
            print(f"warmed FLA at {name}", flush=True)


def fmt_table(rows):
    lines = []
    hdr = (f"{'shape':26s} {'tokens':>7s} | {'ours_g':>8s} {'ours_e':>8s} {'TFLOP/s':>7s} {'Mtok/s':>7s} | "
           f"{'fla_g':>8s} {'fla_e':>8s} | {'x_graph':>7s} {'x_eager':>7s} | {'C_g':>8s} {'C_e':>8s}")
    lines.append(hdr)
    for name, tok, flop, og, oe, fg, fe, c in rows:
        best = og if og is not None else oe
        tf = flop / best * 1e-9
        xg = f"{fg / og:7.2f}" if (fg is not None and og is not None) else "    n/a"
        xe = f"{fe / oe:7.2f}"
        cg, ce = (f"{c[0]:8.4f}", f"{c[1]:8.4f}") if c else ("     n/a", "     n/a")
        f = lambda x: f"{x:8.4f}" if x is not None else "     n/a"
        lines.append(f"{name:26s} {tok:7d} | {f(og)} {f(oe)} {tf:7.1f} {tok / best * 1e-3:7.1f} | "
                     f"{f(fg)} {f(fe)} | {xg} {xe} | {cg} {ce}")
    lines.append("times in ms (median of 20); x_* = FLA time / ours; C_* = bench_prefill.cu's graph / eager times")
    return "\n".join(lines)


def reference_f64(q, k, v, g, beta, scale):
    """The recurrence of GDN_MATH.md in float64, all heads at once (B = 1, no initial state)."""
    _, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    qd = q[0].double().repeat_interleave(G, dim=1)
    kd = k[0].double().repeat_interleave(G, dim=1)
    qd = qd / torch.sqrt((qd * qd).sum(-1, keepdim=True) + 1e-6) * scale
    kd = kd / torch.sqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
    vd, gd, bd = v[0].double(), g[0].double().exp(), beta[0].double()
    S = torch.zeros(HV, K, V, dtype=torch.float64, device=q.device)
    o = torch.empty(T, HV, V, dtype=torch.float64, device=q.device)
    for t in range(T):
        S *= gd[t][:, None, None]
        kt = kd[t]
        u = bd[t][:, None] * (vd[t] - torch.einsum("hk,hkv->hv", kt, S))
        S += kt[:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", qd[t], S)
    return o[None], S[None]


def rel(x, ref):
    x = x.double()
    return ((x - ref).norm() / ref.norm()).item()


def accuracy():
    lines = [f"{'case':24s} {'ours_o':>9s} {'fla_o':>9s} {'o ratio':>7s} | {'ours_S':>9s} {'fla_S':>9s} {'S ratio':>7s} | "
             f"{'fla_rec_o':>9s}"]
    for T, H, HV in ((8192, 2, 8), (16384, 1, 4)):
        q, k, v, g, beta = make_inputs(1, T, H, HV, seed=T)
        scale = D ** -0.5
        ref_o, ref_S = reference_f64(q, k, v, g, beta, scale)
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
        oo, os_ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
        fo, fs = fla_chunk(q, k, v, g, beta, **kw)
        ro, _ = fla_recurrent(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        a, b = rel(oo, ref_o), rel(fo, ref_o)
        c_, d = rel(os_, ref_S), rel(fs, ref_S)
        lines.append(f"T={T} H={H} HV={HV}".ljust(24) + f" {a:9.3e} {b:9.3e} {a / b:7.3f} | {c_:9.3e} {d:9.3e} "
                     f"{c_ / d:7.3f} | {rel(ro, ref_o):9.3e}")
    lines.append("relative RMS error vs float64 recurrence; ratio = ours / FLA chunk (bar: <= 1.1, and < 5e-3)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="bench_prefill.cu output file")
    ap.add_argument("--out", help="write the tables here too")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--only", metavar="SUBSTR", help="time only the shapes whose name contains this")
    ap.add_argument("--warm", metavar="SHAPE", help="run FLA once at this shape (fills the autotune cache), nothing else")
    args = ap.parse_args()
    if args.warm:
        warm(args.warm)
        return
    ours_c = {}
    if args.ours:
        for line in open(args.ours):
            p = line.split()
            if len(p) == 4:
                ours_c[p[0]] = (float(p[2]), float(p[3]))
    torch.backends.cuda.matmul.allow_tf32 = False
    out = open(args.out, "w") if args.out else None
    head = f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}"
    print(head, flush=True)
    if out:
        out.write(head + "\n\n")
    if not args.skip_accuracy:
        acc = accuracy()
        print(acc, flush=True)
        if out:
            out.write(acc + "\n\n")
            out.flush()
    if out:
        out.write("rows as measured (full table below when every shape finished):\n")
    table = fmt_table(bench(ours_c, out, args.only))
    print(table, flush=True)
    if out:
        out.write("\n" + table + "\n")
        out.close()


if __name__ == "__main__":
    main()
