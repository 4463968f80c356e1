"""chunk_gated_delta_rule, fused_recurrent_gated_delta_rule and the gating helpers against the
float64 reference (tests/reference.py) on fresh random inputs, poisoned outputs, on every device."""

import pytest
import torch
import torch.nn.functional as F

import libgdn
from reference import gdn_gate, kv, make_inputs, recurrence, rel_err, softplus, to_layout

# Relative RMS error bounds: float32 runs far under 1e-5 (GDN_MATH.md); 16-bit inputs are compared
# with the reference on the same rounded inputs, so only output rounding and f32 arithmetic remain.
TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.bfloat16: 6e-3, torch.float16: 2e-3}
STATE_TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.bfloat16: 6e-3, torch.float16: 2e-3}

CASES = [
    # name, B, T, H, HV, K, V, dtype, options
    ("f32", 2, 100, 2, 2, 64, 64, torch.float32, dict(h0=True, final=True)),
    ("bf16-gva-varlen-vfirst-l2", 1, 130, 2, 4, 64, 64, torch.bfloat16,
     dict(cu=[0, 0, 37, 37, 130], h0=True, final=True, v_first=True, l2norm=True)),
    ("f16-gate-in-kernel-neg", 1, 65, 1, 2, 128, 64, torch.float16,
     dict(gate_in_kernel=True, beta_logits=True, neg=True, final=True, h0=True)),
    ("f32-kv-mixed-scale", 2, 33, 1, 1, 64, 128, torch.float32, dict(scale=0.3)),
    ("bf16-bf16-state", 2, 70, 2, 2, 64, 64, torch.bfloat16, dict(h0=True, final=True, state_dtype=torch.bfloat16)),
    ("f32-strided-qkv", 2, 50, 2, 2, 64, 64, torch.float32, dict(strided=True, final=True, l2norm=True)),
    ("f64-oracle", 1, 40, 1, 1, 64, 64, torch.float64, dict(h0=True, final=True, cpu_only=True)),
    # K = 128: the default scale K^-0.5 is not an f32 value; the oracle takes it in double
    ("f64-oracle-k128", 1, 40, 1, 2, 128, 32, torch.float64, dict(h0=True, final=True, cpu_only=True, l2norm=True)),
    # head dims no SIMD width divides: the CPU backend's own limit is 1 .. 256
    ("f32-head-dims-48-24", 1, 70, 1, 2, 48, 24, torch.float32, dict(h0=True, final=True, cpu_only=True)),
]


def build(case, device, gen):
    name, B, T, H, HV, K, V, dtype, opt = case
    if opt.get("cpu_only") and device != "cpu":
        pytest.skip("float64 runs on the CPU backend only")
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, torch.float32, "cpu", gen=gen)
    if opt.get("strided"):
        # q, k, v as views of one fused projection, as model code slices them (strides passed through).
        qkv = torch.randn(B, T, 2 * H * K + HV * V, generator=gen)
        q = qkv[..., :H * K].view(B, T, H, K)
        k = qkv[..., H * K:2 * H * K].view(B, T, H, K)
        k.copy_(F.normalize(k, dim=-1))
        v = qkv[..., 2 * H * K:].view(B, T, HV, V)
        assert not q.is_contiguous()
    q, k, v = (x.to(dtype) for x in (q, k, v))
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta)
    ref_g, ref_beta = g, beta
    kw = {}
    if opt.get("gate_in_kernel"):
        a = torch.randn(B, T, HV, generator=gen)
        A_log = torch.rand(HV, generator=gen) * 2 - 1
        dt_bias = torch.randn(HV, generator=gen)
        inputs["g"] = a
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
        ref_g = gdn_gate(a, A_log, dt_bias)
    if opt.get("beta_logits"):
        b = torch.randn(B, T, HV, generator=gen) * 2
        inputs["beta"] = b
        kw.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=opt.get("neg", False))
        ref_beta = torch.sigmoid(b.double()) * (2 if opt.get("neg") else 1)
    cu = opt.get("cu")
    N = len(cu) - 1 if cu else B
    h0 = None
    state_dtype = opt.get("state_dtype", torch.float64 if dtype == torch.float64 else torch.float32)
    if opt.get("h0"):
        h0 = (torch.randn(N, HV, K, V, generator=gen) * 0.5).to(state_dtype)
        kw["initial_state"] = to_layout(h0, opt.get("v_first", False)).to(device)
    if cu:
        kw["cu_seqlens"] = torch.tensor(cu, dtype=torch.long, device=device)
    if opt.get("final"):
        kw["output_final_state"] = True
    if opt.get("v_first"):
        kw["state_v_first"] = True
    if opt.get("l2norm"):
        kw["use_qk_l2norm_in_kernel"] = True
    if "scale" in opt:
        kw["scale"] = opt["scale"]
    if "state_dtype" in opt:
        kw["final_state_dtype"] = opt["state_dtype"]
    if dtype == torch.float64:
        inputs["g"] = inputs["g"].double()
        inputs["beta"] = inputs["beta"].double()
    for key in ("A_log", "dt_bias"):
        if key in kw:
            kw[key] = kw[key].to(device)
    dev_inputs = {key: x.to(device) for key, x in inputs.items()}
    if opt.get("strided"):
        # .to(device) would compact the views; slice the moved projection instead.
        qkv = qkv.to(device)
        dev_inputs["q"] = qkv[..., :H * K].view(B, T, H, K)
        dev_inputs["k"] = qkv[..., H * K:2 * H * K].view(B, T, H, K)
        dev_inputs["v"] = qkv[..., 2 * H * K:].view(B, T, HV, V)
    ref = recurrence(q, k, v, ref_g, ref_beta, scale=opt.get("scale"), h0=h0, cu_seqlens=cu,
                     use_qk_l2norm=opt.get("l2norm", False))
    return dev_inputs, kw, ref, dtype, state_dtype


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_forward_matches_float64(fn, case, device, gen):
    inputs, kw, (ref_o, ref_final, _), dtype, state_dtype = build(case, device, gen)
    op = libgdn.chunk_gated_delta_rule if fn == "chunk" else libgdn.fused_recurrent_gated_delta_rule
    if fn == "recurrent":
        inputs = dict(inputs)
        q, k, v = inputs.pop("q"), inputs.pop("k"), inputs.pop("v")
        o, final = op(q, k, v, **inputs, **kw)
    else:
        o, final = op(**inputs, **kw)
    assert o.shape == ref_o.shape
    assert o.dtype == dtype and o.device.type == device
    err = rel_err(o, ref_o)
    assert err < TOL[dtype], f"o: rel err {err:.3e}"
    if kw.get("output_final_state"):
        assert final.dtype == state_dtype
        err = rel_err(kv(final, kw.get("state_v_first", False)), ref_final)
        tol = max(STATE_TOL[dtype], STATE_TOL[state_dtype])
        assert err < tol, f"final state: rel err {err:.3e}"
    else:
        assert final is None


@pytest.mark.parametrize("with_g", [False, True])
def test_recurrent_kda_gk(device, gen, with_g):
    B, T, H, HV, K, V = 2, 30, 1, 2, 64, 64
    q, k, v, gk, beta = make_inputs(B, T, H, HV, K, V, torch.float32, "cpu", kda=True, gen=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen)) if with_g else None
    h0 = torch.randn(B, HV, K, V, generator=gen) * 0.5
    ref_g = gk + g[..., None] if with_g else gk
    ref_o, ref_final, _ = recurrence(q, k, v, ref_g, beta, h0=h0)
    d = lambda x: None if x is None else x.to(device)
    o, final = libgdn.fused_recurrent_gated_delta_rule(d(q), d(k), d(v), g=d(g), gk=d(gk), beta=d(beta),
                                                       initial_state=d(h0), output_final_state=True)
    assert rel_err(o, ref_o) < 2e-5
    assert rel_err(final, ref_final) < 2e-5


def test_recurrent_default_beta_is_one(device, gen):
    B, T, H, HV, K, V = 1, 9, 1, 2, 64, 64
    q, k, v, g, _ = make_inputs(B, T, H, HV, K, V, torch.float32, "cpu", gen=gen)
    ref_o, _, _ = recurrence(q, k, v, g, torch.ones(B, T, HV))
    o, _ = libgdn.fused_recurrent_gated_delta_rule(q.to(device), k.to(device), v.to(device), g=g.to(device))
    assert rel_err(o, ref_o) < 2e-5


@pytest.mark.parametrize("v_first", [False, True])
def test_recurrent_inplace_without_indices(device, gen, v_first):
    B, T, H, HV, K, V = 2, 5, 2, 2, 64, 64
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, torch.float32, device, gen=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen)
    ref_o, ref_final, _ = recurrence(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), h0=h0)
    state = to_layout(h0, v_first).to(device)
    o, ret = libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=state,
                                                     state_v_first=v_first, inplace_final_state=True)
    assert ret is state
    assert rel_err(o, ref_o) < 2e-5
    assert rel_err(kv(state, v_first), ref_final) < 2e-5


@pytest.mark.parametrize("shape", ["2d", "3d", "4d"])
def test_fused_gdn_gate(device, gen, shape):
    HV = 6
    dims = {"2d": (17, HV), "3d": (2, 9, HV), "4d": (2, 3, 4, HV)}[shape]
    a = torch.randn(*dims, generator=gen) * 4
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(HV, generator=gen)
    g = libgdn.fused_gdn_gate(a.to(device).bfloat16(), A_log.to(device), dt_bias.to(device))
    ref = gdn_gate(a.bfloat16(), A_log, dt_bias)
    assert g.shape == a.shape and g.dtype == torch.float32
    assert rel_err(g, ref) < 1e-6
    g16 = libgdn.fused_gdn_gate(a.to(device), A_log.to(device), output_dtype=torch.bfloat16)
    assert g16.dtype == torch.bfloat16
    assert rel_err(g16, gdn_gate(a, A_log)) < 6e-3


@pytest.mark.parametrize("sp", [(1.0, 20.0), (2.0, 5.0)])
@pytest.mark.parametrize("rank", [2, 3])
def test_fused_gdn_gating(device, gen, sp, rank):
    HV = 8
    dims = (13, HV) if rank == 2 else (2, 5, HV)
    a = torch.randn(*dims, generator=gen) * 8  # reaches past the softplus threshold
    b = torch.randn(*dims, generator=gen).to(torch.bfloat16)
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(HV, generator=gen)
    d = lambda x: x.to(device)
    g, beta = libgdn.fused_gdn_gating(d(A_log), d(a), d(b), d(dt_bias), beta=sp[0], threshold=sp[1])
    want_shape = (1,) + dims if rank == 2 else dims
    assert g.shape == want_shape and beta.shape == want_shape
    assert g.dtype == torch.float32 and beta.dtype == torch.bfloat16
    ref_g = -A_log.double().exp() * softplus(a.double() + dt_bias.double(), sp[0], sp[1])
    assert rel_err(g.view(dims), ref_g) < 1e-6
    assert rel_err(beta.view(dims), torch.sigmoid(b.double())) < 6e-3


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
@pytest.mark.parametrize("n, heads, d", [(2, 1, 64), (16, 16, 128)])
def test_no_tokens(device, fn, n, heads, d):
    """T = 0 with empty sequences: nothing to compute, final states equal the initial ones. 16
    sequences of 16 heads give the CUDA chunk path more main-pass CTAs than SMs, where varlen batches
    with tokens have chunk_prep order the sequences (none runs here)."""
    q = torch.randn(1, 0, heads, d, device=device, dtype=torch.bfloat16)
    v = torch.randn(1, 0, heads, d, device=device, dtype=torch.bfloat16)
    g = torch.zeros(1, 0, heads, device=device)
    h0 = torch.randn(n, heads, d, d, device=device)
    op = libgdn.chunk_gated_delta_rule if fn == "chunk" else libgdn.fused_recurrent_gated_delta_rule
    o, h = op(q, q, v, g=g, beta=g, initial_state=h0, output_final_state=True,
              cu_seqlens=torch.zeros(n + 1, dtype=torch.int64, device=device))
    assert o.shape == v.shape
    assert torch.equal(h, h0)
