"""libgdn's torch custom ops (torch >= 2.4): torch.library.opcheck on each op (schema and declared
mutations, fake implementations against real outputs, AOT dispatch with dynamic shapes), on every
device, and the public functions under torch.compile(fullgraph=True): no graph break, results equal
to eager. Those skip on older torch, where the package calls the same bodies without custom ops;
the fake implementations are checked against real outputs on every torch."""

import pytest
import torch
import torch.nn.functional as F

import libgdn
from libgdn import _custom_ops, _kernels
from reference import rel_err

needs_custom_ops = pytest.mark.skipif(not _custom_ops.AVAILABLE, reason=f"torch.library.custom_op needs "
                                                                        f"torch >= 2.4 (torch {torch.__version__})")

B, T, H, HV, K, V = 2, 40, 2, 4, 64, 64


def inputs(device, T=T, B=B, dtype=torch.bfloat16):
    """16-bit q, k, v (the CUDA chunk kernel's inputs), float32 gates."""
    q = torch.randn(B, T, H, K, device=device, dtype=dtype)
    k = F.normalize(torch.randn(B, T, H, K, device=device), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, V, device=device, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, HV, device=device))
    beta = torch.rand(B, T, HV, device=device)
    return q, k, v, g, beta


def op_cases(device):
    """(name, op, args) for every op and its kinds of call: the argument lists the public
    functions pass."""
    q, k, v, g, beta = inputs(device)
    q1, k1, v1, g1, beta1 = (t[:1] for t in (q, k, v, g, beta))
    h0 = torch.randn(B, HV, K, V, device=device)
    cu_dev = torch.tensor([0, 7, 7, T], dtype=torch.int32, device=device)
    cu_host = torch.tensor([0, 7, 7, T])
    P = 5
    pool = torch.randn(P, HV, V, K, device=device)
    slots = torch.tensor([3, 0], dtype=torch.int32, device=device)
    qd, kd, vd, gd, betad = inputs(device, T=1)
    a = torch.randn(B, 1, HV, device=device)
    A_log, dt_bias = torch.randn(HV, device=device), torch.randn(HV, device=device)
    gate = (g, None, None, None, beta, 0, 0.0)  # g, a, A_log, dt_bias, beta, gate kind, lower bound
    raw = (None, a, A_log, dt_bias, a.sigmoid(), 0, 0.0)
    a1 = torch.randn(1, T, HV, device=device, dtype=torch.bfloat16)
    name = "chunk_gated_delta_rule"
    return [
        ("chunk", _kernels.chunk_fwd, (q, k, v, *gate, False, False, 0.0, True, None, False, h0, True, torch.float32,
                                  True, name)),
        ("chunk-varlen-host-cu", _kernels.chunk_fwd, (q1, k1, v1, g1, None, None, None, beta1, 0, 0.0, False, False, 0.3, False,
                                                 cu_host, True, None, False, torch.bfloat16, True, name)),
        ("chunk-varlen-no-state", _kernels.chunk_fwd, (q1, k1, v1, g1, None, None, None, beta1, 0, 0.0, False, False,
                                                  0.0, True, cu_dev, False, None, False, torch.float32, False, name)),
        ("recurrent-final", _kernels.recurrent_fwd, (q, k, v, *gate[:5], 0, 0.0, 0.0, 0.0, False, False, 0.0, True, None,
                                                False, h0, None, None, False, 1, torch.float32, name)),
        ("recurrent-steps", _kernels.recurrent_fwd, (qd, kd, vd, *raw, 1.0, 20.0, True, False, 0.0, True, None, True,
                                                pool, slots, None, False, 2, torch.float32, name)),
        ("recurrent-none", _kernels.recurrent_fwd, (q, k, v, *gate, 0.0, 0.0, False, False, 0.0, False, None, False,
                                               None, None, None, False, 0, torch.float32, name)),
        ("recurrent-pool-inplace", _kernels.recurrent_fwd_inplace, (qd, kd, vd, *raw, 1.0, 20.0, True, False, 0.0, True,
                                                               None, True, pool, slots, None, False, name)),
        ("recurrent-states-inplace", _kernels.recurrent_fwd_inplace, (q, k, v, *gate, 0.0, 0.0, False, False, 0.0, False,
                                                                 None, False, h0.clone(), None, None, False, name)),
        ("chunk-bwd", _kernels.chunk_bwd, (q, k, v, g, None, None, None, beta, False, False, 0.0, True, None, False,
                                           h0, torch.randn_like(v), torch.randn_like(h0), None, name)),
        ("chunk-bwd-raw-varlen", _kernels.chunk_bwd, (q1, k1, v1, None, a1, A_log, dt_bias, beta1, True, True, 0.3,
                                                      False, cu_host, True, None, torch.randn_like(v1), None, None, name)),
        ("gating", _kernels.gating, (a, A_log, dt_bias, a.bfloat16(), torch.bfloat16, 1.0, 20.0, "fused_gdn_gating")),
        ("gating-no-b", _kernels.gating, (a.view(B, HV), A_log, None, None, torch.float32, 0.0, 0.0, "fused_gdn_gate")),
    ]


CASE_NAMES = [c[0] for c in op_cases("cpu")]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_fake_matches_real(device, case):
    """What torch.compile is told of the outputs (shape, strides, dtype, device) is what the op returns."""
    _, op, args = next(c for c in op_cases(device) if c[0] == case)
    real, fake = op(*args), _custom_ops.fake_of(op)(*args)
    real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
    assert len(real) == len(fake)
    for r, f in zip(real, fake):
        assert (f.shape, f.stride(), f.dtype, f.device) == (r.shape, r.stride(), r.dtype, r.device)


@needs_custom_ops
@pytest.mark.parametrize("case", CASE_NAMES)
def test_opcheck(device, case):
    _, op, args = next(c for c in op_cases(device) if c[0] == case)
    torch.library.opcheck(op, args)


@needs_custom_ops
def test_ops_registered():
    for name in ("chunk_fwd", "chunk_bwd", "recurrent_fwd", "recurrent_fwd_inplace", "gating"):
        assert hasattr(torch.ops.libgdn, name)


def model_step(q, k, v, g, beta, a, b, A_log, dt_bias, pool, slots):
    """A prefill and a pooled decode step through the public functions, as model code calls them."""
    o, h = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                         use_cache=True)
    gd, betad = libgdn.fused_gdn_gating(A_log, a, b, dt_bias)
    od, _ = libgdn.fused_recurrent_gated_delta_rule(q[:, -1:], k[:, -1:], v[:, -1:], g=gd.view(B, 1, HV),
                                                    beta=betad.view(B, 1, HV), initial_state=pool,
                                                    ssm_state_indices=slots, use_qk_l2norm_in_kernel=True,
                                                    state_v_first=True)
    return o, h, od


@needs_custom_ops
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(device, backend):
    if backend == "inductor" and device != "cuda":
        pytest.skip("inductor is exercised on CUDA only (its CPU path compiles C++, slowly)")
    torch._dynamo.reset()
    q, k, v, g, beta = inputs(device)
    a, b = torch.randn(B, HV, device=device), torch.randn(B, HV, device=device)
    A_log, dt_bias = torch.randn(HV, device=device), torch.randn(HV, device=device)
    pool = torch.randn(5, HV, V, K, device=device)
    slots = torch.tensor([4, 1], device=device)
    start = pool.clone()
    # Warm the keyword warning up outside the graph (warnings.warn is not traced).
    model_step(q, k, v, g, beta, a, b, A_log, dt_bias, pool, slots)
    pool.copy_(start)
    want = model_step(q, k, v, g, beta, a, b, A_log, dt_bias, pool, slots)
    want_pool = pool.clone()
    pool.copy_(start)
    compiled = torch.compile(model_step, fullgraph=True, backend=backend)
    with torch.no_grad():
        got = compiled(q, k, v, g, beta, a, b, A_log, dt_bias, pool, slots)
    for x, y in zip(got, want):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert rel_err(x, y) < 1e-6
    assert rel_err(pool, want_pool) < 1e-6


@needs_custom_ops
def test_compile_backward(device):
    """Training under torch.compile: libgdn::chunk_fwd's registered derivative is traced into the
    backward graph, and its gradients equal those of the eager path (which skips the dispatcher and
    differentiates through ops._ChunkFunction)."""
    torch._dynamo.reset()
    q, k, v, g, beta = inputs(device, dtype=torch.float32 if device == "cpu" else torch.bfloat16)

    def loss(q, k, v, g, beta):
        o, h = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
        return (o * o).sum() + h.sum()

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, g, beta)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for want, got in zip(*grads):
        assert rel_err(got, want) < 1e-6


def test_eager_dispatch():
    """Eager calls on plain tensors run the ops' bodies directly; calls with a tracer's tensor (meta
    here) or torch.func's in any argument, and calls under torch.jit.trace, go through the ops."""
    q = inputs("cpu")[0]
    assert _custom_ops.eager(q, None, q, 1.0)
    assert not _custom_ops.eager(q.to("meta"))
    assert not _custom_ops.eager(q, None, q.to("meta"))
    func = getattr(torch, "func", None) or pytest.importorskip("functorch")
    seen = []
    func.grad(lambda x: (seen.append(_custom_ops.eager(q, x)), x.sum())[1])(q.float())
    torch.jit.trace(lambda x: (seen.append(_custom_ops.eager(x)), x * 2)[1], (q.float(),), check_trace=False)
    assert seen == [False, False]


def test_eager_call_runs_the_body(monkeypatch):
    """_custom_ops.call runs the body itself on plain tensors (on every torch), and an eager
    training call differentiates through ops._ChunkFunction."""
    _, op, args = next(c for c in op_cases("cpu") if c[0] == "gating")
    body, ran = _custom_ops._bodies[id(op)], []
    monkeypatch.setitem(_custom_ops._bodies, id(op), lambda *a: (ran.append(1), body(*a))[1])
    _custom_ops.call(op, *args)
    assert ran == [1]
    q, k, v, g, beta = (t.float().requires_grad_(True) for t in inputs("cpu"))
    o, _ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta)
    assert type(o.grad_fn).__name__ == "_ChunkFunctionBackward"


@needs_custom_ops
def test_eager_body_equals_op(device):
    """The body run directly gives the op's outputs bitwise, and a meta call of a public function
    is answered by the op's fake implementation."""
    for case in ("chunk", "chunk-bwd", "recurrent-final", "gating"):
        _, op, args = next(c for c in op_cases(device) if c[0] == case)
        torch.manual_seed(0)
        via_op = op(*args)
        got = _custom_ops.call(op, *args)
        for x, y in zip(got, via_op):
            if x.dtype == torch.uint8:  # the saved states' buffer: its padding is not written
                continue
            assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y), case
    a, A_log = torch.randn(B, HV, device="meta"), torch.randn(HV, device="meta")
    g, beta = libgdn.fused_gdn_gating(A_log, a, torch.randn(B, HV, device="meta"), torch.randn(HV, device="meta"))
    assert g.is_meta and beta.is_meta and g.shape[-1] == HV
