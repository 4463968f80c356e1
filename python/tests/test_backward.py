"""The backward of chunk_gated_delta_rule (gdn_chunk_bwd, CPU and CUDA): torch.autograd.gradcheck in float64
for each option group, float32 gradients against autograd through the float64 reference of
reference.py with FLA-style keywords, a short training loop of a GatedDeltaNet model against the
same model on the reference, and the CUDA backward against the float64 reference."""

import pytest
import torch
import torch.nn.functional as F

import libgdn
from libgdn import _capi, _custom_ops, _kernels
from reference import gdn_gate, kv, recurrence, rel_err, to_layout

K = V = 64  # the head dims the library takes (64, 128, 256)


def rnd(gen, *shape, dtype=torch.float64, scale=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def leaf(x):
    return x.detach().clone().requires_grad_(True)


def gradcheck(fn, inputs, gen):
    """gradcheck of fn's outputs each reduced over its last dim by fixed random weights (exact torch
    ops), so that the Jacobian has T * HV rows instead of T * HV * V and the check stays cheap at
    K = V = 64; every input element is still perturbed."""
    inputs = tuple(inputs)
    weights = {}

    def projected(*args):
        outs = fn(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for i, o in enumerate(outs):
            if i not in weights:
                weights[i] = torch.randn(o.shape[-1], generator=gen, dtype=torch.float64)
        return tuple(o @ weights[i] for i, o in enumerate(outs))
    assert torch.autograd.gradcheck(projected, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_gradcheck_plain(gen):
    B, T, H, HV = 2, 4, 1, 1
    q, k, v = rnd(gen, B, T, H, K), F.normalize(rnd(gen, B, T, H, K), dim=-1), rnd(gen, B, T, HV, V)
    g = F.logsigmoid(rnd(gen, B, T, HV))
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)

    def fn(q, k, v, g, beta):
        return libgdn.chunk_gated_delta_rule(q, k, v, g, beta)[0]
    gradcheck(fn, map(leaf, (q, k, v, g, beta)), gen)


def test_gradcheck_chunk_boundary(gen):
    """70 tokens: a full chunk of 64 and a partial one, so the state carried from one chunk into the
    next is in every gradient; l2 norm and an initial state (q stays a constant, checked above)."""
    B, T, H, HV = 1, 70, 1, 1
    q, k, v = rnd(gen, B, T, H, K), rnd(gen, B, T, H, K), rnd(gen, B, T, HV, V)
    g = F.logsigmoid(rnd(gen, B, T, HV) + 2.0)
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    h0 = rnd(gen, B, HV, K, V, scale=0.5)

    def fn(k, v, g, beta):
        return libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
    gradcheck(fn, map(leaf, (k, v, g, beta)), gen)


def test_second_order_raises(gen):
    """The backward has no derivative: a gradient of a gradient is an error, not a silent zero."""
    B, T, H, HV = 1, 5, 1, 1
    q, k, v = (leaf(rnd(gen, B, T, H, K)) for _ in range(3))
    g = leaf(F.logsigmoid(rnd(gen, B, T, HV)))
    beta = leaf(torch.rand(B, T, HV, generator=gen, dtype=torch.float64))
    o, _ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta)
    dq, = torch.autograd.grad((o * o).sum(), q, create_graph=True)  # do = 2 o carries a graph
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()


def test_gradcheck_l2norm_states(gen):
    """The V-first state layout, both states in the loss; q, k, v stay constants here (checked in the
    other groups) so that the 4096 elements of the state keep the check cheap."""
    B, T, H, HV = 1, 5, 1, 1
    q, k, v = rnd(gen, B, T, H, K), rnd(gen, B, T, H, K), rnd(gen, B, T, HV, V)
    g = F.logsigmoid(rnd(gen, B, T, HV))
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    h0 = rnd(gen, B, HV, V, K, scale=0.5)

    def fn(g, beta, h0):
        return libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True, state_v_first=True)
    gradcheck(fn, map(leaf, (g, beta, h0)), gen)


def test_gradcheck_in_kernel_gate(gen):
    """Raw a and beta logits (allow_neg_eigval); A_log / dt_bias are float32 in the C API, so their
    gradients are checked against the reference in test_gate_parameter_grads instead."""
    B, T, H, HV = 1, 5, 1, 1
    q, k, v = rnd(gen, B, T, H, K), rnd(gen, B, T, H, K), rnd(gen, B, T, HV, V)
    a, b = rnd(gen, B, T, HV), rnd(gen, B, T, HV, scale=2.0)
    A_log = torch.rand(HV, generator=gen).add(0.5).log()
    dt_bias = torch.randn(HV, generator=gen)

    def fn(q, k, v, a, b):
        return libgdn.chunk_gated_delta_rule(q, k, v, a, b, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                             use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                             use_qk_l2norm_in_kernel=True)[0]
    gradcheck(fn, map(leaf, (q, k, v, a, b)), gen)


def test_gradcheck_varlen_gva(gen):
    """Packed sequences with an empty one, GVA (dq, dk summed over the value heads), the final state
    in the loss (initial states given; dv and dh0 are checked in the other groups, which keeps this
    one cheap)."""
    cu = torch.tensor([0, 2, 2, 5])
    T, H, HV = 5, 1, 2
    q, k, v = rnd(gen, 1, T, H, K), rnd(gen, 1, T, H, K), rnd(gen, 1, T, HV, V)
    g = F.logsigmoid(rnd(gen, 1, T, HV))
    beta = torch.rand(1, T, HV, generator=gen, dtype=torch.float64)
    h0 = rnd(gen, 3, HV, K, V, scale=0.5)

    def fn(q, k, g, beta):
        return libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    gradcheck(fn, map(leaf, (q, k, g, beta)), gen)


def reference_fla(q, k, v, a, b, A_log, dt_bias, h0, cu_seqlens, state_v_first):
    """chunk_gated_delta_rule's in-kernel gate, beta logits and l2 norm on the float64 reference."""
    g = gdn_gate(a, A_log, dt_bias)
    beta = torch.sigmoid(b.double())
    o, final, _ = recurrence(q, k, v, g, beta, h0=kv(h0, state_v_first), cu_seqlens=cu_seqlens, use_qk_l2norm=True,
                             keep_steps=False)
    return o, kv(final, state_v_first)


@pytest.mark.parametrize("state_v_first", [False, True])
def test_grads_match_reference_f32(gen, state_v_first):
    """float32 inputs, FLA-style keywords (in-kernel gate, beta logits, l2 norm, varlen, states):
    every gradient against autograd through the float64 reference on the same values."""
    cu = torch.tensor([0, 30, 30, 97])
    T, H, HV = 97, 2, 4
    q, k, v = rnd(gen, 1, T, H, K, dtype=torch.float32), rnd(gen, 1, T, H, K, dtype=torch.float32), \
        rnd(gen, 1, T, HV, V, dtype=torch.float32)
    a, b = rnd(gen, 1, T, HV, dtype=torch.float32), rnd(gen, 1, T, HV, dtype=torch.float32)
    A_log = torch.rand(HV, generator=gen).add(0.5).log()
    dt_bias = torch.randn(HV, generator=gen)
    h0 = to_layout(rnd(gen, 3, HV, K, V, dtype=torch.float32, scale=0.5), state_v_first)
    wo, wh = rnd(gen, 1, T, HV, V), rnd(gen, *h0.shape)
    ins = [leaf(x) for x in (q, k, v, a, b, A_log, dt_bias, h0)]
    o, ht = libgdn.chunk_gated_delta_rule(ins[0], ins[1], ins[2], g=ins[3], beta=ins[4], initial_state=ins[7],
                                          output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          use_gate_in_kernel=True, A_log=ins[5], dt_bias=ins[6],
                                          use_beta_sigmoid_in_kernel=True, state_v_first=state_v_first,
                                          cu_seqlens=cu)
    ((o.double() * wo).sum() + (ht.double() * wh).sum()).backward()
    refs = [leaf(x.double()) for x in (q, k, v, a, b, A_log, dt_bias, h0)]
    o_ref, ht_ref = reference_fla(*refs, cu, state_v_first)
    ((o_ref * wo).sum() + (ht_ref * wh).sum()).backward()
    assert rel_err(o, o_ref) < 1e-5
    for name, x, r in zip(("q", "k", "v", "a", "b", "A_log", "dt_bias", "h0"), ins, refs):
        assert x.grad is not None and x.grad.dtype == x.dtype, name
        err = rel_err(x.grad, r.grad)
        assert err < 1e-6, f"d{name}: rel err {err:.2e}"


def test_gate_parameter_grads(gen):
    """dA_log and ddt_bias in the float64 oracle mode against the reference's autograd."""
    T, H, HV = 50, 1, 2
    q, k, v = rnd(gen, 2, T, H, K), rnd(gen, 2, T, H, K), rnd(gen, 2, T, HV, V)
    a, b = rnd(gen, 2, T, HV), rnd(gen, 2, T, HV)
    A_log, dt_bias = leaf(torch.rand(HV, generator=gen).add(0.5).log()), leaf(torch.randn(HV, generator=gen))
    wo = rnd(gen, 2, T, HV, V)
    o, _ = libgdn.chunk_gated_delta_rule(q, k, v, a, b, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                         use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)
    (o * wo).sum().backward()
    A_ref, dt_ref = leaf(A_log.detach().double()), leaf(dt_bias.detach().double())
    g = gdn_gate(a, A_ref, dt_ref)
    o_ref, _, _ = recurrence(q, k, v, g, torch.sigmoid(b), use_qk_l2norm=True, keep_steps=False)
    (o_ref * wo).sum().backward()
    assert rel_err(A_log.grad, A_ref.grad) < 1e-6
    assert rel_err(dt_bias.grad, dt_ref.grad) < 1e-6


def test_custom_op_derivative(gen):
    """The derivative registered on libgdn::chunk_fwd (the path torch >= 2.4 takes) gives the
    gradients of the public function, checked on every torch by calling its two halves the way
    torch.library does: setup_context(ctx, inputs, output), then backward(ctx, *output grads)."""
    class Ctx:
        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

        def set_materialize_grads(self, value):
            self.materialize_grads = value

    cu = torch.tensor([0, 20, 20, 70], dtype=torch.int32)
    T, H, HV = 70, 1, 2
    q, k, v = rnd(gen, 1, T, H, K), rnd(gen, 1, T, H, K), rnd(gen, 1, T, HV, V)
    a, b = rnd(gen, 1, T, HV), rnd(gen, 1, T, HV)
    A_log, dt_bias = torch.rand(HV, generator=gen).add(0.5).log(), torch.randn(HV, generator=gen)
    h0 = rnd(gen, 3, HV, V, K)
    do, dht = rnd(gen, 1, T, HV, V), rnd(gen, 3, HV, V, K)
    args = (q, k, v, None, a, A_log, dt_bias, b, 0, 0.0, True, True, 0.5, True, cu, True, h0, True, torch.float64,
            True, "chunk_gated_delta_rule")
    ctx = Ctx()
    out = _kernels.chunk_fwd(*args)
    _kernels._chunk_fwd_setup_context(ctx, args, out)
    grads = _kernels._chunk_fwd_backward(ctx, do, dht)
    assert len(grads) == len(args)
    ins = [leaf(x) for x in (q, k, v, a, b, A_log, dt_bias, h0)]
    o, ht = libgdn.chunk_gated_delta_rule(ins[0], ins[1], ins[2], ins[3], ins[4], scale=0.5, initial_state=ins[7],
                                          output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          use_gate_in_kernel=True, A_log=ins[5], dt_bias=ins[6],
                                          use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                          state_v_first=True, cu_seqlens=cu)
    assert torch.equal(o, out[0]) and torch.equal(ht, out[1])
    torch.autograd.backward((o, ht), (do, dht))
    for i, x in zip((0, 1, 2, 4, 7, 5, 6, 16), ins):  # q, k, v, a, b (beta), A_log, dt_bias, h0
        assert torch.equal(grads[i], x.grad), f"input {i}"
    assert all(g is None for i, g in enumerate(grads) if i in (3, 8, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20))
    assert out[2].numel() == 0  # the CPU backend saves no states


def test_bf16_grads_dtypes(gen):
    """bf16 inputs get bf16 gradients (the gate's float32 and the state's dtype kept)."""
    B, T, H, HV = 1, 20, 1, 2
    q, k, v = (leaf(rnd(gen, B, T, H, K, dtype=torch.bfloat16)), leaf(rnd(gen, B, T, H, K, dtype=torch.bfloat16)),
               leaf(rnd(gen, B, T, HV, V, dtype=torch.bfloat16)))
    g = leaf(F.logsigmoid(rnd(gen, B, T, HV, dtype=torch.float32)))
    beta = leaf(torch.rand(B, T, HV, generator=gen).to(torch.bfloat16))
    h0 = leaf(rnd(gen, B, HV, K, V, dtype=torch.bfloat16))
    o, ht = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
    (o.float().sum() + ht.sum()).backward()
    for x in (q, k, v, g, beta, h0):
        assert x.grad.dtype == x.dtype and torch.isfinite(x.grad.float()).all()


def test_no_grad_calls_stay_forward_only(gen, c_calls):
    q, k, v = rnd(gen, 1, 8, 1, K), rnd(gen, 1, 8, 1, K), rnd(gen, 1, 8, 1, V)
    g, beta = F.logsigmoid(rnd(gen, 1, 8, 1)), torch.rand(1, 8, 1, dtype=torch.float64)
    o, _ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta)
    assert o.grad_fn is None and not o.requires_grad
    with torch.no_grad():
        o, _ = libgdn.chunk_gated_delta_rule(q, leaf(k), v, g, beta)
    assert o.grad_fn is None
    assert c_calls["gdn_chunk_fwd"] == 2


@pytest.mark.parametrize("dims", [(64, 64), (128, 128)])
def test_cuda_grads_match_float64(device, gen, dims):
    """The CUDA backward (bf16 inputs, FLA-style keywords: in-kernel gate, beta logits, l2 norm,
    varlen with an empty sequence, GVA, states in and out, V-first layout) against autograd through
    the float64 reference on the same values: the issue's bars, 5e-3 (1e-2 for the gate's)."""
    if device != "cuda":
        pytest.skip("CUDA only")
    Kd, Vd = dims
    cu = torch.tensor([0, 130, 130, 257], device="cuda")
    T, H, HV = 257, 2, 4

    def draw(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).cuda()
    q, k, v = draw(1, T, H, Kd).bfloat16(), draw(1, T, H, Kd).bfloat16(), draw(1, T, HV, Vd).bfloat16()
    a, b = draw(1, T, HV).bfloat16(), draw(1, T, HV).bfloat16()
    A_log = (torch.rand(HV, generator=gen) + 0.5).log().cuda()
    dt_bias = torch.randn(HV, generator=gen).cuda()
    h0 = draw(3, HV, Vd, Kd, scale=0.5).float()
    wo, wh = draw(1, T, HV, Vd), draw(3, HV, Vd, Kd)
    ins = [leaf(x) for x in (q, k, v, a, b, A_log, dt_bias, h0)]
    o, ht = libgdn.chunk_gated_delta_rule(ins[0], ins[1], ins[2], g=ins[3], beta=ins[4], initial_state=ins[7],
                                          output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          use_gate_in_kernel=True, A_log=ins[5], dt_bias=ins[6],
                                          use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=cu,
                                          head_first=False)
    ((o.double() * wo).sum() + (ht.double() * wh).sum()).backward()
    refs = [leaf(x.double().cpu()) for x in (q, k, v, a, b, A_log, dt_bias, h0)]
    g_ref = gdn_gate(refs[3], refs[5], refs[6])
    g_ref.retain_grad()
    o_ref, final, _ = recurrence(refs[0], refs[1], refs[2], g_ref, torch.sigmoid(refs[4]), h0=kv(refs[7], True),
                                 cu_seqlens=cu.cpu(), use_qk_l2norm=True, keep_steps=False)
    ((o_ref * wo.cpu()).sum() + (kv(final, True) * wh.cpu()).sum()).backward()
    # dA_log and ddt_bias sum a term per token (dg g and da) whose signs differ, so their relative
    # error grows with the cancellation; it is measured against the sum of the terms' magnitudes.
    magnitude = {"A_log": (g_ref.grad * g_ref.detach()).abs().sum(dim=(0, 1)),
                 "dt_bias": refs[3].grad.abs().sum(dim=(0, 1))}
    for name, x, r in zip(("q", "k", "v", "a", "b", "A_log", "dt_bias", "h0"), ins, refs):
        assert x.grad is not None and x.grad.dtype == x.dtype and x.grad.device.type == "cuda", name
        if name in magnitude:
            err = ((x.grad.cpu().double() - r.grad).norm() / magnitude[name].norm()).item()
        else:
            err = rel_err(x.grad.cpu(), r.grad)
        bar = 1e-2 if name in ("a", "A_log", "dt_bias") else 5e-3
        assert err < bar, f"d{name}: rel err {err:.2e} (bar {bar:.0e})"


@pytest.mark.parametrize("varlen", [False, True])
def test_cuda_saved_states(device, gen, varlen):
    """The CUDA forward saves the states and chunk records its backward reads (the path training
    takes): the buffer has the size the fake implementation gives torch.compile; the gradients from
    it match the recomputing backward's within the bars; and the backward does read it (a zeroed
    buffer changes dq)."""
    if device != "cuda":
        pytest.skip("CUDA only")
    B, T, H, HV, Kd = (1, 300, 1, 2, 64) if varlen else (2, 200, 1, 2, 128)
    cu = torch.tensor([0, 100, 100, 300], dtype=torch.int32, device="cuda") if varlen else None
    q, k = rnd(gen, B, T, H, Kd).cuda().bfloat16(), rnd(gen, B, T, H, Kd).cuda().bfloat16()
    v = rnd(gen, B, T, HV, Kd).cuda().bfloat16()
    g = F.logsigmoid(rnd(gen, B, T, HV)).float().cuda()
    beta = torch.rand(B, T, HV, generator=gen).cuda().bfloat16()
    args = (q, k, v, g, None, None, None, beta, 0, 0.0, False, False, 0.0, True, cu, False, None, False,
            torch.float32, True, "chunk_gated_delta_rule")
    o, _, saved = _kernels.chunk_fwd(*args)
    slots = T // 64 + 4 if varlen else B * ((T + 63) // 64)
    # the states entering the chunk slots (16-bit), then from a 256-byte boundary a 19200-byte
    # backward record per slot and value head
    tiles = HV * slots * Kd * Kd * 2
    assert saved.dtype == torch.uint8 and saved.numel() == (tiles + 255) // 256 * 256 + HV * slots * 19200
    assert _custom_ops.fake_of(_kernels.chunk_fwd)(*args)[2].shape == saved.shape
    o2, _, none = _kernels.chunk_fwd(*args[:-2], False, args[-1])
    assert none.numel() == 0 and torch.equal(o, o2)
    do = rnd(gen, B, T, HV, Kd).cuda().bfloat16()
    common = (q, k, v, g, None, None, None, beta, False, False, 0.0, True, cu, False, None, do, None,
              "chunk_gated_delta_rule")
    from_saved, recomputed = _kernels.chunk_grads(*common, saved), _kernels.chunk_grads(*common)
    for name, x, y in zip(("dq", "dk", "dv", "dg", "da", "dA_log", "ddt_bias", "dbeta"), from_saved, recomputed):
        if y is not None:
            assert rel_err(x.float(), y.float()) < 5e-3, name
    zeroed = _kernels.chunk_grads(*common, torch.zeros_like(saved))
    assert rel_err(zeroed[0].float(), recomputed[0].float()) > 1e-2


def test_cuda_backward_refuses_f32(device):
    """float32 CUDA inputs run the forward on the recurrent kernel; the backward takes 16-bit inputs
    only and says so."""
    if device != "cuda":
        pytest.skip("CUDA only")
    q = torch.randn(1, 64, 1, K, device="cuda", requires_grad=True)
    k = F.normalize(torch.randn(1, 64, 1, K, device="cuda"), dim=-1)
    v = torch.randn(1, 64, 1, V, device="cuda")
    g = F.logsigmoid(torch.randn(1, 64, 1, device="cuda"))
    beta = torch.rand(1, 64, 1, device="cuda")
    o, _ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta)
    with pytest.raises(libgdn.GDNUnsupportedError, match="bf16 or f16") as e:
        o.sum().backward()
    assert e.value.status == _capi.GDN_ERR_UNSUPPORTED


# ------------------------------------------------------------------------------------------------
# Training


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = libgdn.GatedDeltaNet(hidden_size=128, expand_v=1, head_dim=64, num_heads=1, num_v_heads=2)
        self.head = torch.nn.Linear(128, 8)

    def forward(self, x):
        return self.head(self.layer(x)[0])


def reference_core(layer):
    """The layer's delta-rule core on the float64 reference, differentiable by autograd."""
    def core(q, k, v, a, b, state, output_final_state):
        g = gdn_gate(a, layer.A_log, layer.dt_bias)
        beta = torch.sigmoid(b.double()) * (2 if layer.allow_neg_eigval else 1)
        o, final, _ = recurrence(q, k, v, g, beta, use_qk_l2norm=True, keep_steps=False)
        return o.to(q.dtype), to_layout(final, True).float()
    return core


def test_training_matches_reference():
    """20 Adam steps of a GatedDeltaNet model with libgdn's core and with the reference core (same
    initialisation, same data): the losses agree step by step."""
    torch.manual_seed(1234)
    model = Model()
    ref = Model()
    ref.load_state_dict(model.state_dict())
    ref.layer._core = reference_core(ref.layer)
    x = torch.randn(2, 48, 128)
    y = torch.randn(2, 48, 8)
    opts = [torch.optim.Adam(m.parameters(), lr=3e-3) for m in (model, ref)]
    losses = []
    for _ in range(20):
        step = []
        for m, opt in zip((model, ref), opts):
            opt.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            step.append(loss.item())
        losses.append(step)
    for i, (a, b) in enumerate(losses):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {i}: loss {a:.8f} vs reference {b:.8f}"
    assert losses[-1][0] < 0.9 * losses[0][0], "the model does not train"
    assert model.layer.A_log.grad is not None and model.layer.dt_bias.grad is not None
