"""The functions called as real clients call them: transformers' Qwen3-Next / Qwen3.5 linear-attention
layer (its keyword arguments, its strided v, its float32 state fed back for decode), and FLA's
keyword policy: unknown keywords ignored with one warning per (function, name), options that would
change the result raising. Compared with the float64 reference of reference.py."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import libgdn
import libgdn.vllm as vllm_ops
from libgdn import _kernels, ops
from reference import make_inputs, recurrence, rel_err

# Keywords transformers' model code passes beside the kernel's own (the decoder layer's **kwargs).
TRANSFORMERS_EXTRA = dict(use_cache=True, output_router_logits=False)
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test starts as a new process would: no keyword warned about yet."""
    monkeypatch.setattr(ops, "_warned", set())


def qwen3_next_qkv(x, H, HV, K, V):
    """q, k, v as Qwen3-Next's GatedDeltaNet makes them: the causal conv's output [B, C, T]
    transposed to [B, T, C] and split by channels (views: unit stride on the token dim, not on the
    head dim), q and k repeated to the value heads."""
    B, C, T = x.shape
    mixed = F.silu(x).transpose(1, 2)
    q, k, v = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
    q = q.reshape(B, T, H, K).repeat_interleave(HV // H, dim=2)
    k = k.reshape(B, T, H, K).repeat_interleave(HV // H, dim=2)
    v = v.reshape(B, T, HV, V)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformers_qwen3_next_call(device, gen, dtype):
    """Prefill with chunk_gated_delta_rule, then decode token by token with
    fused_recurrent_gated_delta_rule from the returned float32 state, keywords as transformers
    passes them; outputs against the float64 recurrence over the whole sequence."""
    B, T, steps, H, HV, K, V = 2, 37, 3, 2, 4, 64, 64
    C = 2 * H * K + HV * V
    x = torch.randn(B, C, T + steps, generator=gen)
    a = torch.randn(B, T + steps, HV, generator=gen)
    b = torch.randn(B, T + steps, HV, generator=gen)
    A_log = torch.log(torch.rand(HV, generator=gen) * 16)
    dt_bias = torch.ones(HV)
    g = -A_log.exp() * F.softplus(a + dt_bias)  # transformers computes these in float32
    beta = b.sigmoid()

    q, k, v = qwen3_next_qkv(x.to(dtype), H, HV, K, V)
    assert v.stride(-1) == T + steps and v.stride(1) == 1
    ref_o, ref_final, _ = recurrence(q, k, v, g, beta, use_qk_l2norm=True)

    dev = lambda t: t.to(device)
    xd = dev(x.to(dtype))
    qd, kd, vd = qwen3_next_qkv(xd[..., :T], H, HV, K, V)
    assert vd.stride(-1) != 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o, state = libgdn.chunk_gated_delta_rule(qd, kd, vd, g=dev(g[:, :T]), beta=dev(beta[:, :T]),
                                                 initial_state=None, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True, **TRANSFORMERS_EXTRA)
        outs = [o]
        for t in range(T, T + steps):
            qt, kt, vt = qwen3_next_qkv(xd[..., t:t + 1], H, HV, K, V)
            o, state = libgdn.fused_recurrent_gated_delta_rule(qt, kt, vt, g=dev(g[:, t:t + 1]),
                                                               beta=dev(beta[:, t:t + 1]), initial_state=state,
                                                               output_final_state=True,
                                                               use_qk_l2norm_in_kernel=True, **TRANSFORMERS_EXTRA)
            assert state.dtype == torch.float32 and state.shape == (B, HV, K, V)
            outs.append(o)
    o = torch.cat(outs, dim=1)
    assert o.dtype == dtype
    err = rel_err(o, ref_o)
    assert err < TOL[dtype], f"o: rel err {err:.3e}"
    err = rel_err(state, ref_final)
    assert err < TOL[dtype], f"final state: rel err {err:.3e}"
    ignored = sorted(str(w.message).split(": ")[0] + ":" + name for w in caught for name in TRANSFORMERS_EXTRA
                     if repr(name) in str(w.message))
    assert ignored == ["chunk_gated_delta_rule:output_router_logits", "chunk_gated_delta_rule:use_cache",
                       "fused_recurrent_gated_delta_rule:output_router_logits",
                       "fused_recurrent_gated_delta_rule:use_cache"], ignored


def small(device, gen, dtype=torch.float32):
    q, k, v, g, beta = make_inputs(1, 5, 1, 2, 64, 64, dtype, "cpu", gen=gen)
    return tuple(t.to(device) for t in (q, k, v, g, beta))


def keyword_warnings(call):
    """The keyword warnings `call` gives (the call must succeed)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if "ignoring the keyword argument" in str(w.message)]


def test_unknown_keywords_warn_once_per_function_and_name(device, gen):
    q, k, v, g, beta = small(device, gen)
    chunk = lambda **kw: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    first = keyword_warnings(lambda: chunk(use_cache=True, foo=1))
    assert len(first) == 2 and "'foo'" in first[0] and "'use_cache'" in first[1]
    assert first[0].startswith("chunk_gated_delta_rule: ")
    assert keyword_warnings(lambda: chunk(use_cache=False, foo=2)) == []
    assert len(keyword_warnings(lambda: chunk(bar=None))) == 1
    # The same name to another function warns once there too.
    rec = keyword_warnings(lambda: libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, foo=1))
    assert len(rec) == 1 and rec[0].startswith("fused_recurrent_gated_delta_rule: ")
    # Every public entry point takes and ignores unknown keywords.
    a = torch.randn(5, 2, device=device)
    A_log = torch.zeros(2, device=device)
    pool = torch.zeros(3, 2, 64, 64, device=device)
    slots = torch.tensor([1], device=device)
    calls = {
        "fused_gdn_gate": lambda: libgdn.fused_gdn_gate(a, A_log, foo=1),
        "fused_gdn_gating": lambda: libgdn.fused_gdn_gating(A_log, a, a, A_log, foo=1),
        "chunk_kda": lambda: libgdn.chunk_kda(q, k, v, g[..., None].expand(1, 5, 2, 64), beta, foo=1),
        "fused_recurrent_kda": lambda: libgdn.fused_recurrent_kda(q, k, v, g[..., None].expand(1, 5, 2, 64), beta,
                                                                  out=None, foo=1),
        "fused_sigmoid_gating_delta_rule_update": lambda: libgdn.fused_sigmoid_gating_delta_rule_update(
            A_log, a, A_log, 1.0, 20.0, q, k, v, a, pool, slots, foo=1),
        "vllm.fused_recurrent_gated_delta_rule": lambda: vllm_ops.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots, bar=1),
        "vllm.fused_sigmoid_gating_delta_rule_update": lambda: vllm_ops.fused_sigmoid_gating_delta_rule_update(
            A_log, a, a, A_log, q, k, v, initial_state=pool, ssm_state_indices=slots, baz=1),
    }
    for name, call in calls.items():
        got = keyword_warnings(call)
        assert len(got) == 1, (name, got)


def test_result_changing_options_raise(device, gen):
    q, k, v, g, beta = small(device, gen)
    gk = g[..., None].expand(1, 5, 2, 64).contiguous()
    # Their no-op values are accepted, silently.
    assert keyword_warnings(lambda: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, head_first=False,
                                                                  cp_context=None, chunk_size=32)) == []
    assert keyword_warnings(lambda: libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, gv=None, beta=beta)) == []
    assert keyword_warnings(lambda: libgdn.chunk_kda(q, k, v, gk, beta, return_intermediate_states=False,
                                                     disable_recompute=True)) == []
    raising = [
        ("head_first", lambda: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, head_first=True)),
        ("cp_context", lambda: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, cp_context=object())),
        ("cp_context", lambda: libgdn.chunk_kda(q, k, v, gk, beta, cp_context=object())),
        ("gk", lambda: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, gk=gk)),
        ("gv", lambda: libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, gv=v, beta=beta)),
        ("per-value-channel beta", lambda: libgdn.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta=beta[..., None].expand(1, 5, 2, 64))),
        ("per-value-channel beta", lambda: libgdn.chunk_gated_delta_rule(q, k, v, g,
                                                                         beta[..., None].expand(1, 5, 2, 64))),
        ("return_intermediate_states", lambda: libgdn.chunk_kda(q, k, v, gk, beta, return_intermediate_states=True)),
        ("out", lambda: libgdn.fused_recurrent_kda(q, k, v, gk, beta, out=torch.empty_like(v))),
        ("retrieve_parent_token", lambda: vllm_ops.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=torch.zeros(1, 2, 64, 64, device=device),
            retrieve_parent_token=torch.zeros(1, 5, dtype=torch.long, device=device))),
    ]
    for what, call in raising:
        with pytest.raises(NotImplementedError, match=what):
            call()


def test_host_indices_of_a_cuda_call_are_checked_on_the_host(gen):
    """A CUDA call's host-resident index tensors are validated by the library before they are
    copied to the device: the same query, every descriptor marked host-resident, with the library's
    own message. Run here on descriptors that claim CUDA (no GPU needed: the values are rejected
    before any copy); tests/test_cuda.py covers the real CUDA call."""
    q, k, v, g, beta = make_inputs(2, 3, 1, 2, 64, 64, torch.float32, "cpu", gen=gen)
    pool = torch.zeros(4, 2, 64, 64)
    L = libgdn._capi.lib()
    fn = "fused_recurrent_gated_delta_rule"

    def claimed_cuda_args():
        args = _kernels._fwd_args(libgdn._capi.RecurrentFwdArgs, q, k, v, g, None, None, None, beta, 0, 0.0, 0.0, 0.0,
                             False, False, 0.0, False, False)
        args.state = libgdn._capi.describe(pool, "initial_state")
        args.inplace_state = 1
        args.o = libgdn._capi.describe(torch.empty_like(v), "o")
        for t in (args.q, args.k, args.v, args.gate.g, args.gate.beta, args.state, args.o):
            t.device = libgdn._capi.GDN_DEVICE_CUDA
        return args

    cuda = torch.device("cuda")  # never touched: the bad values raise before any copy
    with pytest.raises(libgdn.GDNInvalidArgumentError,
                       match=r"^fused_recurrent_gated_delta_rule: state_indices\[1\]\[0\] = 4 is out of range for a "
                             r"pool of 4 slots \[GDN_ERR_INVALID_ARGUMENT\]$"):
        _kernels._index_args(fn, L.gdn_recurrent_fwd_workspace_size, claimed_cuda_args(), cuda,
                        {"cu_seqlens": None, "state_indices": torch.tensor([0, 4], dtype=torch.int32),
                         "num_accepted_tokens": None})
    with pytest.raises(libgdn.GDNInvalidArgumentError, match=r"cu_seqlens\[2\] = 2 < cu_seqlens\[1\] = 3"):
        args = _kernels._fwd_args(libgdn._capi.ChunkFwdArgs, q[:1], k[:1], v[:1], g[:1], None, None, None, beta[:1], 0,
                             0.0, 0.0, 0.0, False, False, 0.0, False, False)
        args.o = libgdn._capi.describe(torch.empty_like(v[:1]), "o")
        for t in (args.q, args.k, args.v, args.gate.g, args.gate.beta, args.o):
            t.device = libgdn._capi.GDN_DEVICE_CUDA
        _kernels._index_args("chunk_gated_delta_rule", L.gdn_chunk_fwd_workspace_size, args, cuda,
                        {"cu_seqlens": torch.tensor([0, 3, 2, 3], dtype=torch.int32)})
    # The struct passed in is left as described (only the shadow copy is marked host-resident).
    args = claimed_cuda_args()
    with pytest.raises(libgdn.GDNInvalidArgumentError):
        _kernels._index_args(fn, L.gdn_recurrent_fwd_workspace_size, args, cuda,
                        {"state_indices": torch.tensor([5, 0], dtype=torch.int32)})
    assert args.q.device == libgdn._capi.GDN_DEVICE_CUDA and args.state.device == libgdn._capi.GDN_DEVICE_CUDA


def test_host_indices_list_and_int64(device, gen):
    """Index arguments given as int64 tensors or lists on the host work on every device."""
    q, k, v, g, beta = make_inputs(1, 9, 1, 2, 64, 64, torch.float32, "cpu", gen=gen)
    ref_o, _, _ = recurrence(q, k, v, g, beta, cu_seqlens=[0, 4, 9])
    d = lambda t: t.to(device)
    for cu in ([0, 4, 9], torch.tensor([0, 4, 9]), torch.tensor([0, 4, 9], dtype=torch.int32)):
        o, _ = libgdn.chunk_gated_delta_rule(d(q), d(k), d(v), d(g), d(beta), cu_seqlens=cu)
        assert rel_err(o, ref_o) < 2e-5
