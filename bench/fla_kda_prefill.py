"""fla_kda_prefill.py - libgdn's chunked KDA prefill (libgdn.chunk_kda) beside FLA's
fla.ops.kda.chunk_kda, same inputs, same process, same timing as fla_prefill.py (CUDA events, median
of --iters after warm-up; eagerly and under CUDA graph replay), at issue 16's prefill shapes; then
the accuracy of both against a float64 recurrence (after the timings; --skip-accuracy skips it).

    PYTHONPATH=.peers/fla:python GDN_LIBRARY=build/libgdn.so python3 bench/fla_kda_prefill.py \
        [--out table.txt] [--skip-accuracy] [--only SHAPE_SUBSTR] [--iters 20] [--warm SHAPE]

bf16 q, k, v, K = V = 128, L2 norm in-kernel, beta = sigmoid(randn) f32 precomputed (as FLA's
benchmarks pass it), no initial state, final state f32. Gates, the same tensors and keywords on both
sides:
  safe    raw g = randn [B, T, HV, K] bf16, A_log = randn [HV], dt_bias = randn [HV * K] (f32),
          use_gate_in_kernel=True, safe_gate=True, lower_bound=-5: the gate
          g = -5 * sigmoid(exp(A_log) * (g + dt_bias)) in-kernel, as FLA's
          benchmarks/cp/benchmark_kda_cp8_vs_cp2tp.py and its KimiDeltaAttention layer call it
  logsig  precomputed g = logsigmoid(randn) [B, T, HV, K] f32, no lower bound
          (use_gate_in_kernel=False, safe_gate=False: FLA's general intra-chunk path; its
          benchmarks/ops/registry.py times this g with safe_gate=True, lower_bound=-5 instead)
The accuracy section adds "extreme": logsig draws with -1e4, -60, -15, -3, -0.5 and 0 mixed in.
Each shape runs both libraries once before timing (a library that raises or returns NaN / Inf is
not timed) and prints how far apart their outputs are. TFLOP/s are counted as 4 * T * HV * d^2.
Where libgdn's CUDA chunk kernel does not take the call, chunk_kda runs on the recurrent kernel
with a warning; the tables say which path ran.
"""

import argparse
import math
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import libgdn
from fla.ops.kda import chunk_kda as fla_chunk
from fla_prefill import random_lengths, rel, time_ms

D = 128
LOWER_BOUND = -5.0
SHAPES = [
    # name, B, T, H, HV, nseq (0: fixed length; else that many random lengths 1..4096), gate
    ("B2_T16384_H64_HV64_safe", 2, 16384, 64, 64, 0, "safe"),
    ("B1_T32768_H32_HV32_safe", 1, 32768, 32, 32, 0, "safe"),
    ("B1_T65536_H4_HV4_safe", 1, 65536, 4, 4, 0, "safe"),
    ("varlen64rand_H32_HV32_safe", 1, 0, 32, 32, 64, "safe"),
    ("B2_T16384_H64_HV64_logsig", 2, 16384, 64, 64, 0, "logsig"),
]
# Accuracy: name, B, T, H, HV, sequence lengths (None: B fixed-length rows of T), gate.
VARLEN_ACC = random_lengths(6) + [1, 63, 64, 65]  # "varlen": the LCG's lengths and some around a 64-token chunk
ACC_CASES = [
    ("T4096_H4_safe", 1, 4096, 4, 4, None, "safe"),
    ("varlen10_H4_safe", 1, 0, 4, 4, "varlen", "safe"),
    ("T4096_H4_logsig", 1, 4096, 4, 4, None, "logsig"),
    ("varlen10_H4_logsig", 1, 0, 4, 4, "varlen", "logsig"),
    ("T4096_H4_extreme", 1, 4096, 4, 4, None, "extreme"),
    ("varlen10_H4_extreme", 1, 0, 4, 4, "varlen", "extreme"),
]
ERR_BAR = 5e-3

# Warnings libgdn gave (the recurrent fallback warns once per process): printed with the tables.
LIBGDN_WARNINGS = []


def extreme_gates(g, gen):
    """Gates FLA's safe gate excludes, mixed into logsigmoid draws: each of -1e4, -60, -15, -3, -0.5
    and 0 on 1 % of the elements; key channel 0 never decays (0), channel 1 always -60; every 509th
    token forgets everything (-1e4)."""
    vals = torch.tensor([-1e4, -60.0, -15.0, -3.0, -0.5, 0.0], device=g.device)
    pick = (torch.rand(g.shape, device=g.device, generator=gen) * 100).long()
    g = torch.where(pick < len(vals), vals[pick.clamp(max=len(vals) - 1)], g)
    g[..., 0] = 0.0
    g[..., 1] = -60.0
    g[:, ::509] = -1e4
    return g.contiguous()


def make_inputs(B, T, H, HV, gate, seed=0, device="cuda"):
    """q, k, v, g, beta and the gate keywords, the same for both libraries."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    q = rn(B, T, H, D).bfloat16()
    k = rn(B, T, H, D).bfloat16()
    v = rn(B, T, HV, D).bfloat16()
    beta = rn(B, T, HV).sigmoid()
    if gate == "safe":
        g = rn(B, T, HV, D).bfloat16()
        kw = dict(use_gate_in_kernel=True, A_log=rn(HV), dt_bias=rn(HV * D), safe_gate=True, lower_bound=LOWER_BOUND)
    else:
        g = F.logsigmoid(rn(B, T, HV, D))
        if gate == "extreme":
            g = extreme_gates(g, gen)
        kw = {}
    return q, k, v, g, beta, kw


def log_decays(g, kw):
    """The per-channel log decays in float64: g itself, or the safe gate evaluated from raw g."""
    if not kw.get("use_gate_in_kernel"):
        return g.double()
    HV = kw["A_log"].shape[0]
    x = g.double() + kw["dt_bias"].double().view(HV, -1)
    return kw["lower_bound"] * torch.sigmoid(kw["A_log"].double().exp()[:, None] * x)


def call_ours(q, k, v, g, beta, kw):
    """libgdn.chunk_kda, keeping any warning it gives (the recurrent fallback) for the tables."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = libgdn.chunk_kda(q, k, v, g, beta, **kw)
    for w in caught:
        msg = str(w.message)
        if msg not in LIBGDN_WARNINGS:
            LIBGDN_WARNINGS.append(msg)
            print(f"  libgdn warning: {msg}", file=sys.stderr, flush=True)
    return out


def path_note():
    if any("recurrent" in w for w in LIBGDN_WARNINGS):
        return "libgdn chunk_kda ran on the RECURRENT kernel (fallback warning: " + LIBGDN_WARNINGS[0] + ")"
    return "libgdn chunk_kda: no fallback warning (chunk kernel)"


def checked_call(who, name, fn):
    """One call before timing: (o, final state), or None (reported) if it raises or gives NaN / Inf."""
    try:
        o, ht = fn()
        torch.cuda.synchronize()
    except Exception as e:  # one library failing leaves the other's timings
        print(f"  {name}: {who} raised {type(e).__name__}: {str(e)[:200]}: not timed", file=sys.stderr, flush=True)
        return None
    if not (bool(torch.isfinite(o).all()) and bool(torch.isfinite(ht).all())):
        print(f"  {name}: {who} output or final state has NaN / Inf: not timed", file=sys.stderr, flush=True)
        return None
    return o, ht


def shape_inputs(B, T, H, HV, nseq, gate):
    """Inputs of a timing shape; varlen packs nseq random lengths (cu_seqlens int32 on the device)."""
    cu = cu_cpu = None
    if nseq:
        cu_cpu = torch.tensor([0] + random_lengths(nseq), dtype=torch.int32).cumsum(0, dtype=torch.int32)
        T = int(cu_cpu[-1])
        cu = cu_cpu.cuda()
    q, k, v, g, beta, kw = make_inputs(B, T, H, HV, gate)
    kw.update(output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    return q, k, v, g, beta, kw, cu_cpu


def bench(out, only=None, iters=20):
    rows = []
    for name, B, T, H, HV, nseq, gate in SHAPES:
        if only and only not in name:
            continue
        q, k, v, g, beta, kw, cu_cpu = shape_inputs(B, T, H, HV, nseq, gate)
        tok = q.shape[0] * q.shape[1]
        # Check both before timing: finite outputs, and how far apart the two libraries are.
        ours = checked_call("libgdn", name, lambda: call_ours(q, k, v, g, beta, kw))
        fla = checked_call("FLA", name, lambda: fla_chunk(q, k, v, g, beta, cu_seqlens_cpu=cu_cpu, **kw))
        diff = None
        if ours and fla:
            diff = ((ours[0].float() - fla[0].float()).norm() / fla[0].float().norm()).item()
        fla_e = fla_g = our_e = our_g = None
        if fla:
            del fla
            fla_e, fla_g = time_ms(lambda: fla_chunk(q, k, v, g, beta, cu_seqlens_cpu=cu_cpu, **kw), iters)
        if ours:
            del ours
            our_e, our_g = time_ms(lambda: libgdn.chunk_kda(q, k, v, g, beta, **kw), iters)
        flop = 4.0 * tok * HV * D * D
        rows.append((name, tok, flop, our_g, our_e, fla_g, fla_e, diff))
        line = fmt_table(rows[-1:], iters).splitlines()[1]
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
        del q, k, v, g, beta, kw
        torch.cuda.empty_cache()
    return rows


def warm(name):
    """FLA autotunes its kernels on first use, minutes of compiling: the device script runs one of
    these per key set in parallel (Triton caches the results on disk) before timing."""
    for nm, B, T, H, HV, nseq, gate in SHAPES:
        if nm == name:
            q, k, v, g, beta, kw, cu_cpu = shape_inputs(B, T, H, HV, nseq, gate)
            fla_chunk(q, k, v, g, beta, cu_seqlens_cpu=cu_cpu, **kw)
            torch.cuda.synchronize()
            print(f"warmed FLA at {name}", flush=True)


def fmt_table(rows, iters=20):
    f = lambda x: f"{x:8.4f}" if x is not None else "     n/a"
    lines = []
    hdr = (f"{'shape':28s} {'tokens':>7s} | {'ours_g':>8s} {'ours_e':>8s} {'TFLOP/s':>7s} {'Mtok/s':>7s} | "
           f"{'fla_g':>8s} {'fla_e':>8s} {'TFLOP/s':>7s} | {'x_graph':>7s} {'x_eager':>7s} | {'o_diff':>8s}")
    lines.append(hdr)
    for name, tok, flop, og, oe, fg, fe, diff in rows:
        ob = og if og is not None else oe
        fb = fg if fg is not None else fe
        otf = f"{flop / ob * 1e-9:7.1f}" if ob is not None else "    n/a"
        omt = f"{tok / ob * 1e-3:7.1f}" if ob is not None else "    n/a"
        ftf = f"{flop / fb * 1e-9:7.1f}" if fb is not None else "    n/a"
        xg = f"{fg / og:7.2f}" if (fg is not None and og is not None) else "    n/a"
        xe = f"{fe / oe:7.2f}" if (fe is not None and oe is not None) else "    n/a"
        d = f"{diff:8.2e}" if diff is not None else "     n/a"
        lines.append(f"{name:28s} {tok:7d} | {f(og)} {f(oe)} {otf} {omt} | {f(fg)} {f(fe)} {ftf} | {xg} {xe} | {d}")
    lines.append(f"times in ms (median of {iters}), _g under CUDA graph replay, _e eager; TFLOP/s = 4*T*HV*d^2 / the "
                 f"graph time (eager without one); x_* = FLA time / ours; o_diff = ||o_ours - o_fla|| / ||o_fla||")
    return "\n".join(lines)


def reference_f64(q, k, v, g, beta, scale, cu=None):
    """The KDA recurrence of GDN_MATH.md in float64 with per-key-channel decays, all sequences and
    heads at once on q's device: per token S = diag(exp(g_t)) S; u = v_t - S^T k_t;
    S += beta_t k_t u^T; o_t = scale * S^T q_t, q and k L2-normalised. Sequences are padded to the
    longest with g = 0, beta = 0, k = 0 there, so the padding leaves S unchanged.
    q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] log decays; beta [B, T, HV]; cu: a list of
    cumulative lengths (then B = 1) or None. Returns o [B, T, HV, V], final states [N, HV, K, V]."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    bounds = [(b * T, (b + 1) * T) for b in range(B)] if cu is None else list(zip(cu[:-1], cu[1:]))
    N, L = len(bounds), max(e - s for s, e in bounds)
    idx = torch.zeros(N, L, dtype=torch.long)
    valid = torch.zeros(N, L, dtype=torch.bool)
    for n, (s, e) in enumerate(bounds):
        idx[n, :e - s] = torch.arange(s, e)
        valid[n, :e - s] = True
    idx, valid = idx.to(q.device), valid.to(q.device)

    def pad(x):  # [B, T, ...] -> [N, L, ...] float64, zeros where no token
        x = x.reshape(B * T, *x.shape[2:]).double()[idx]
        x[~valid] = 0
        return x

    def l2norm(x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    qd = l2norm(pad(q)).repeat_interleave(G, dim=2) * scale
    kd = l2norm(pad(k)).repeat_interleave(G, dim=2)
    vd, gd, bd = pad(v), pad(g).exp(), pad(beta)
    S = torch.zeros(N, HV, K, V, dtype=torch.float64, device=q.device)
    o = torch.empty(N, L, HV, V, dtype=torch.float64, device=q.device)
    for t in range(L):
        S *= gd[:, t, :, :, None]
        kt = kd[:, t]
        u = bd[:, t, :, None] * (vd[:, t] - torch.einsum("nhk,nhkv->nhv", kt, S))
        S += kt[:, :, :, None] * u[:, :, None, :]
        o[:, t] = torch.einsum("nhk,nhkv->nhv", qd[:, t], S)
    out = torch.zeros(B * T, HV, V, dtype=torch.float64, device=q.device)
    out[idx[valid]] = o[valid]
    return out.view(B, T, HV, V), S


def errors(who, name, fn, ref_o, ref_S):
    """Relative RMS errors of o and the final state against the float64 run (NaN if the call raises)."""
    try:
        o, ht = fn()
    except Exception as e:
        print(f"  {name}: {who} raised {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
        return math.nan, math.nan
    return rel(o, ref_o), rel(ht, ref_S)


def ratio(a, b):
    return a / b if b else math.nan


def verdict(ours, fla):
    """The issue's bar: ours at most FLA's error (a non-finite FLA error counts as above) and < 5e-3."""
    if not ours < ERR_BAR:
        return False
    return not fla == fla or fla == float("inf") or ours <= fla


def accuracy(cases=None, device="cuda"):
    e = lambda x: f"{x:9.3e}"
    lines = [f"{'case':22s} {'tokens':>6s} | {'ours_o':>9s} {'fla_o':>9s} {'o ratio':>7s} | "
             f"{'ours_S':>9s} {'fla_S':>9s} {'S ratio':>7s} | bar"]
    all_ok = True
    for name, B, T, H, HV, lens, gate in cases or ACC_CASES:
        cu = cu_dev = cu_cpu = None
        if lens:
            lens = VARLEN_ACC if lens == "varlen" else lens
            cu = [0]
            for n in lens:
                cu.append(cu[-1] + n)
            T = cu[-1]
            cu_cpu = torch.tensor(cu, dtype=torch.int32)
            cu_dev = cu_cpu.to(device)
        q, k, v, g, beta, kw = make_inputs(B, T, H, HV, gate, seed=1000 + T, device=device)
        ref_o, ref_S = reference_f64(q, k, v, log_decays(g, kw), beta, D ** -0.5, cu)
        kw.update(output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_dev)
        a, c = errors("libgdn", name, lambda: call_ours(q, k, v, g, beta, kw), ref_o, ref_S)
        b, d = errors("FLA", name, lambda: fla_chunk(q, k, v, g, beta, cu_seqlens_cpu=cu_cpu, **kw), ref_o, ref_S)
        ok_o, ok_s = verdict(a, b), verdict(c, d)
        all_ok = all_ok and ok_o and ok_s
        bar = "ok" if ok_o and ok_s else "FAIL (" + " ".join(w for w, ok in (("o", ok_o), ("S", ok_s)) if not ok) + ")"
        lines.append(f"{name:22s} {B * T:6d} | {e(a)} {e(b)} {ratio(a, b):7.3f} | {e(c)} {e(d)} {ratio(c, d):7.3f} | "
                     f"{bar}")
        del q, k, v, g, beta, kw, ref_o, ref_S
    lines.append(f"relative RMS error vs a float64 recurrence; ratio = ours / FLA chunk_kda; bar (issue 16): "
                 f"ours <= FLA and < {ERR_BAR:g} on o and the final state S (FLA NaN / Inf counts as above ours): "
                 f"{'all ok' if all_ok else 'NOT MET'}")
    lines.append("gates: safe = in-kernel lower_bound -5 gate; logsig = precomputed logsigmoid(randn), no lower "
                 "bound; extreme = logsig with -1e4, -60, -15, -3, -0.5, 0 mixed in; varlen10 lengths "
                 + ",".join(map(str, VARLEN_ACC)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the tables here too")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--only", metavar="SUBSTR", help="time only the shapes whose name contains this")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per measurement (median)")
    ap.add_argument("--warm", metavar="SHAPE", help="run FLA once at this shape (fills the autotune cache), nothing else")
    args = ap.parse_args()
    if args.warm:
        warm(args.warm)
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    out = open(args.out, "w") if args.out else None
    # Clock warm-up: two seconds of GEMMs before the first timing.
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < 2.0:
        x @ x
    torch.cuda.synchronize()
    del x
    head = f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  libgdn {libgdn.version()}"
    print(head, flush=True)
    if out:
        out.write(head + "\n\nrows as measured (full table below when every shape finished):\n")
    table = fmt_table(bench(out, args.only, args.iters), args.iters) + "\n" + path_note()
    print(table, flush=True)
    if out:
        out.write("\n" + table + "\n\n")
        out.flush()
    if not args.skip_accuracy:
        acc = accuracy() + "\n" + path_note()
        print(acc, flush=True)
        if out:
            out.write(acc + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    main()
