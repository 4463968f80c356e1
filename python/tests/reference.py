"""Float64 reference for the tests: the recurrence of docs/GDN_MATH.md written in plain torch,
token by token, independent of libgdn. Also the input builders and the error measure."""

import torch
import torch.nn.functional as F


def softplus(x, beta=1.0, threshold=20.0):
    bx = beta * x
    return torch.where(bx > threshold, x, torch.log1p(torch.exp(bx)) / beta)


def gdn_gate(a, A_log, dt_bias=None, beta=1.0, threshold=20.0):
    """g = -exp(A_log) * softplus(a + dt_bias), in float64; A_log / dt_bias broadcast over the
    trailing [HV] (GDN) or [HV, K] (KDA) dims."""
    x = a.double()
    if dt_bias is not None:
        x = x + dt_bias.double()
    A = A_log.double().exp()
    if x.dim() >= 1 and A.shape[0] != x.shape[-1]:  # KDA: A_log [HV] over [..., HV, K]
        A = A[:, None]
    return -A * softplus(x, beta, threshold)


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def sequences(B, T, cu_seqlens):
    """(batch row, start, end) per sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in cu_seqlens]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def recurrence(q, k, v, g, beta, scale=None, h0=None, cu_seqlens=None, use_qk_l2norm=False, keep_steps=True):
    """The gated delta rule in float64.

    q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV] (GDN) or [B, T, HV, K] (KDA) log decays;
    beta [B, T, HV]; h0 [N, HV, K, V] or None. Returns o [B, T, HV, V], the final states
    [N, HV, K, V] and the state after every token [B * T, HV, K, V] (row = packed token index;
    zeros for tokens of no sequence; None without keep_steps). Runs on q's device.
    """
    q, k, v, g, beta = (x.to(device=q.device, dtype=torch.float64) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    scale = K ** -0.5 if scale is None else scale
    kda = g.dim() == 4
    seqs = sequences(B, T, cu_seqlens)
    f64 = dict(dtype=torch.float64, device=q.device)
    o = torch.zeros(B, T, HV, V, **f64)
    final = torch.zeros(len(seqs), HV, K, V, **f64)
    steps = torch.zeros(B * T, HV, K, V, **f64) if keep_steps else None
    for n, (b, start, end) in enumerate(seqs):
        S = h0[n].to(**f64).clone() if h0 is not None else torch.zeros(HV, K, V, **f64)
        for t in range(start, end):
            qt = q[b, t].repeat_interleave(G, dim=0)
            kt = k[b, t].repeat_interleave(G, dim=0)
            if use_qk_l2norm:
                qt, kt = l2norm(qt), l2norm(kt)
            if kda:
                S = S * torch.exp(g[b, t])[:, :, None]
            else:
                S = S * torch.exp(g[b, t])[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hk,hkv->hv", kt, S))
            S = S + torch.einsum("hk,hv->hkv", kt, u)
            o[b, t] = torch.einsum("hk,hkv->hv", qt * scale, S)
            if keep_steps:
                steps[b * T + t] = S
        final[n] = S
    return o, final, steps


def rel_err(out, ref):
    """Relative RMS error ||out - ref|| / ||ref|| (inf on NaN / Inf where ref is finite)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out).all():
        return float("inf")
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def kv(state, state_v_first):
    """A state tensor [.., K, V] from the given layout."""
    return state.transpose(-1, -2) if state_v_first else state


def to_layout(state_kv, state_v_first):
    """A [.., K, V] state in the requested layout: a new contiguous tensor (never an alias)."""
    x = state_kv.transpose(-1, -2) if state_v_first else state_kv
    return x.clone(memory_format=torch.contiguous_format)


def make_inputs(B, T, H, HV, K, V, dtype, device, *, kda=False, gen=None):
    """Fresh random q, k, v, g (realistic log decays), beta on `device` in `dtype` (g, beta f32)."""
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)
    q = rnd(B, T, H, K)
    k = F.normalize(rnd(B, T, H, K), p=2, dim=-1)
    v = rnd(B, T, HV, V)
    g = F.logsigmoid(rnd(B, T, HV, K) if kda else rnd(B, T, HV))
    beta = torch.rand(B, T, HV, generator=gen).clamp_min(0.05)
    to = lambda x, dt: x.to(device=device, dtype=dt)
    return to(q, dtype), to(k, dtype), to(v, dtype), to(g, torch.float32), to(beta, torch.float32)
