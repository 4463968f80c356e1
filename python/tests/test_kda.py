"""chunk_kda and fused_recurrent_kda (per-key-channel decays) against the float64 reference."""

import pytest
import torch

import libgdn
from reference import gdn_gate, kv, make_inputs, recurrence, rel_err, to_layout

TOL = {torch.float32: 2e-5, torch.bfloat16: 6e-3}


@pytest.mark.parametrize("gate", ["precomputed", "softplus", "lower_bound", "lower_bound_no_A"])
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_kda_matches_float64(device, gen, fn, gate):
    B, T, H, HV, K, V = 1, 90, 1, 2, 64, 64
    dtype = torch.bfloat16 if gate == "softplus" else torch.float32
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, dtype, "cpu", kda=True, gen=gen)
    cu = [0, 20, 20, 90]
    h0 = torch.randn(3, HV, K, V, generator=gen) * 0.5
    kw = dict(initial_state=to_layout(h0, True).to(device), output_final_state=True, state_v_first=True,
              use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(cu, device=device))
    ref_g = g
    if gate != "precomputed":
        a = torch.randn(B, T, HV, K, generator=gen) * 2
        A_log = torch.rand(HV, generator=gen) - 0.5
        dt_bias = torch.randn(HV * K, generator=gen)
        g = a
        kw.update(use_gate_in_kernel=True, A_log=A_log.to(device), dt_bias=dt_bias.to(device))
        x = a.double() + dt_bias.double().view(HV, K)
        if gate == "softplus":
            ref_g = gdn_gate(a, A_log, dt_bias.view(HV, K))
        else:
            kw["lower_bound"] = -3.0
            if gate == "lower_bound_no_A":
                kw["A_log"] = None
                A_log = torch.zeros(HV)
            ref_g = -3.0 * torch.sigmoid(A_log.double().exp()[:, None] * x)
        if fn == "chunk" and gate != "softplus":
            kw["safe_gate"] = True
    ref_o, ref_h, _ = recurrence(q, k, v, ref_g, beta, h0=h0, cu_seqlens=cu, use_qk_l2norm=True)
    op = libgdn.chunk_kda if fn == "chunk" else libgdn.fused_recurrent_kda
    o, h = op(q.to(device), k.to(device), v.to(device), g.to(device), beta.to(device), **kw)
    assert rel_err(o, ref_o) < TOL[dtype]
    assert rel_err(kv(h, True), ref_h) < TOL[dtype]


def test_kda_pool_decode(device, gen):
    N, P, H, HV, K, V = 4, 6, 2, 2, 64, 64
    q, k, v, g, beta = make_inputs(N, 1, H, HV, K, V, torch.float32, "cpu", kda=True, gen=gen)
    pool = torch.randn(P, HV, K, V, generator=gen)
    idx = [5, -1, 0, 2]
    pool_dev = pool.clone().to(device)
    o, ret = libgdn.fused_recurrent_kda(q.to(device), k.to(device), v.to(device), g.to(device), beta.to(device),
                                        initial_state=pool_dev,
                                        ssm_state_indices=torch.tensor(idx, device=device))
    assert ret is pool_dev
    for n, slot in enumerate(idx):
        if slot < 0:
            assert (o[n] == 0).all()
            continue
        ref_o, ref_h, _ = recurrence(q[n:n + 1], k[n:n + 1], v[n:n + 1], g[n:n + 1], beta[n:n + 1],
                                     h0=pool[slot:slot + 1])
        assert rel_err(o[n:n + 1], ref_o) < 2e-5
        assert rel_err(ret[slot:slot + 1], ref_h) < 2e-5


def test_kda_errors(device):
    q = torch.randn(1, 4, 1, 64, device=device)
    v = torch.randn(1, 4, 1, 64, device=device)
    beta = torch.rand(1, 4, 1, device=device)
    with pytest.raises(ValueError, match=r"g must be \[B, T, HV, K\]"):
        libgdn.chunk_kda(q, q, v, beta, beta)
    with pytest.raises(ValueError, match="lower_bound must be specified"):
        libgdn.chunk_kda(q, q, v, q, beta, use_gate_in_kernel=True, safe_gate=True, A_log=beta[0, 0])
    with pytest.raises(ValueError, match="A_log must be provided"):
        libgdn.fused_recurrent_kda(q, q, v, q, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"lower_bound = -7 must be in \[-5, 0\)"):
        libgdn.fused_recurrent_kda(q, q, v, q, beta, use_gate_in_kernel=True, A_log=beta[0, 0], lower_bound=-7.0)


@pytest.mark.parametrize("HV,H,K,T", [(32, 16, 128, 1), (96, 32, 128, 4), (12, 4, 64, 8), (4, 1, 64, 19)])
def test_kda_spec_verify(device, gen, HV, H, K, T):
    """Speculative verify with KDA gates: 2-D slots, num_accepted_tokens picking the start slot
    (one sequence skipped by 0 accepted), per-token states written to the pool in place; raw gates
    with lower_bound and beta from logits on half the shapes."""
    N, V, P = 3, K, 4 * T + 2
    q, k, v, g, beta = make_inputs(N, T, H, HV, K, V, torch.bfloat16, "cpu", kda=True, gen=gen)
    pool = torch.randn(P, HV, V, K, generator=gen) * 0.5
    idx = torch.arange(1, N * T + 1, dtype=torch.int32).view(N, T)
    nat = torch.tensor([T, 0, 1], dtype=torch.int32)
    raw = T % 2 == 0
    kw = {}
    ref_g, ref_beta, g_in, beta_in = g, beta, g, beta
    if raw:
        a = torch.randn(N, T, HV, K, generator=gen) * 2
        A_log = torch.rand(HV, generator=gen) - 0.5
        dt_bias = torch.randn(HV, K, generator=gen)
        blog = torch.randn(N, T, HV, generator=gen)
        ref_g = -1.0 * torch.sigmoid(A_log.double().exp()[:, None] * (a.double() + dt_bias.double()))
        ref_beta, g_in, beta_in = torch.sigmoid(blog.double()), a, blog
        kw = dict(use_gate_in_kernel=True, A_log=A_log.to(device), dt_bias=dt_bias.to(device), lower_bound=-1.0,
                  use_beta_sigmoid_in_kernel=True)
    pool_dev = pool.clone().to(device)
    o, ret = libgdn.fused_recurrent_kda(q.to(device), k.to(device), v.to(device), g_in.to(device),
                                        beta_in.to(device), initial_state=pool_dev, state_v_first=True,
                                        ssm_state_indices=idx.to(device), num_accepted_tokens=nat.to(device),
                                        use_qk_l2norm_in_kernel=True, **kw)
    assert ret is pool_dev
    assert (o[1] == 0).all()
    for n in (0, 2):
        h0 = pool[int(idx[n, nat[n] - 1])].transpose(-1, -2)[None]
        ref_o, _, steps = recurrence(q[n:n + 1], k[n:n + 1], v[n:n + 1], ref_g[n:n + 1], ref_beta[n:n + 1], h0=h0,
                                     use_qk_l2norm=True)
        assert rel_err(o[n:n + 1], ref_o) < 6e-3
        for t in range(T):
            assert rel_err(ret[int(idx[n, t])].transpose(-1, -2), steps[t]) < 2e-5
    untouched = [s for s in range(P) if s == 0 or s > N * T or T + 1 <= s <= 2 * T]  # seq 1 is skipped
    for s in untouched:
        assert torch.equal(ret[s].cpu(), pool[s])


def test_chunk_kda_on_the_recurrent_kernel(gen, monkeypatch):
    """chunk_kda sent to the recurrent op, as it is on CUDA for float32 inputs or K = 256: routed
    here on the CPU, it matches the chunk op's results and keeps its arguments
    (varlen, initial state in the V-first layout, in-kernel safe gate, final state)."""
    from libgdn import ops
    B, T, H, HV, K, V = 1, 90, 1, 2, 64, 64
    q, k, v, _, beta = make_inputs(B, T, H, HV, K, V, torch.float32, "cpu", kda=True, gen=gen)
    a = torch.randn(B, T, HV, K, generator=gen)
    h0 = torch.randn(3, HV, V, K, generator=gen) * 0.5
    kw = dict(initial_state=h0, output_final_state=True, state_v_first=True, use_qk_l2norm_in_kernel=True,
              cu_seqlens=torch.tensor([0, 20, 20, 90]), use_gate_in_kernel=True, A_log=torch.rand(HV, generator=gen),
              dt_bias=torch.randn(HV * K, generator=gen), safe_gate=True, lower_bound=-4.0)
    o_chunk, h_chunk = libgdn.chunk_kda(q, k, v, a, beta, **kw)
    calls = []
    monkeypatch.setattr(ops, "_recurrent_instead", lambda fn, q_, kind: calls.append(kind) or True)
    o_rec, h_rec = libgdn.chunk_kda(q, k, v, a, beta, **kw)
    assert calls, "the routing was not consulted"
    assert not torch.equal(o_rec, o_chunk), "the recurrent kernel (a different summation order) did not run"
    assert h_rec.shape == h_chunk.shape and h_rec.dtype == h_chunk.dtype
    assert rel_err(o_rec, o_chunk) < 2e-5
    assert rel_err(h_rec, h_chunk) < 2e-5



@pytest.mark.parametrize("K,HV,H,opt", [(64, 4, 2, "beta_logits"), (128, 4, 2, "neg_eigval"), (64, 3, 1, "plain"),
                                        (128, 12, 4, "beta_logits")])
def test_chunk_kda_chunk_kernel_options(device, gen, monkeypatch, K, HV, H, opt):
    """chunk_kda with 16-bit inputs, which the CUDA chunk kernel takes (not the recurrent one):
    K = 64 and 128, GVA, several chunks per sequence and an empty one, the in-kernel safe gate, beta
    from logits in-kernel (with allow_neg_eigval, beta = 2 sigmoid), a K-first initial state."""
    from libgdn import ops
    routed = []
    real = ops._recurrent_instead
    monkeypatch.setattr(ops, "_recurrent_instead", lambda fn, q_, kind: routed.append(real(fn, q_, kind)) or routed[-1])
    V, cu = K, [0, 150, 150, 300]
    q, k, v, _, beta = make_inputs(1, 300, H, HV, K, V, torch.bfloat16, "cpu", kda=True, gen=gen)
    a = torch.randn(1, 300, HV, K, generator=gen).bfloat16()
    A_log = torch.rand(HV, generator=gen)
    dt_bias = torch.randn(HV * K, generator=gen)
    h0 = torch.randn(3, HV, K, V, generator=gen) * 0.5
    ref_beta = beta
    kw = dict(initial_state=h0.to(device), output_final_state=True, use_qk_l2norm_in_kernel=True,
              cu_seqlens=torch.tensor(cu, device=device), use_gate_in_kernel=True, A_log=A_log.to(device),
              dt_bias=dt_bias.to(device), safe_gate=True, lower_bound=-5.0)
    if opt != "plain":
        beta = torch.randn(1, 300, HV, generator=gen).bfloat16()
        ref_beta = torch.sigmoid(beta.double()) * (2.0 if opt == "neg_eigval" else 1.0)
        kw.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=opt == "neg_eigval")
    ref_g = -5.0 * torch.sigmoid(A_log.double().exp()[:, None] * (a.double() + dt_bias.double().view(HV, K)))
    ref_o, ref_h, _ = recurrence(q, k, v, ref_g, ref_beta, h0=h0, cu_seqlens=cu, use_qk_l2norm=True,
                                 keep_steps=False)
    o, h = libgdn.chunk_kda(q.to(device), k.to(device), v.to(device), a.to(device), beta.to(device), **kw)
    assert routed and not any(routed), "the chunk kernel did not take the call"
    assert rel_err(o, ref_o) < 5e-3
    assert rel_err(h, ref_h) < 5e-3
