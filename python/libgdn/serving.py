"""Serving-engine decode entry points over libgdn.

fused_sigmoid_gating_delta_rule_update here has SGLang's signature (also vLLM's before its 2025
rewrite): raw gates a, b in, the state pool updated in place, o out. libgdn.vllm holds vLLM's
current signatures.
"""

import torch

from . import _capi as C
from . import ops as _ops
from .ops import _f32


def _tokens_view(t, B, T, tail, name, fn):
    """a / b given per packed token [B * T, ...] or per batch row [B, T, ...], as [B, T, *tail]."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor")
    want = (B, T) + tuple(tail)
    if t.numel() != B * T * int(torch.Size(tail).numel()):
        raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)}, expected {B * T} tokens x {tuple(tail)}")
    return t.reshape(want) if tuple(t.shape) != want else t


def _decode_update(fn, *, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, pool, indices,
                   scale, use_qk_l2norm_in_kernel, cu_seqlens, is_kda, state_v_first, inplace,
                   num_accepted_tokens=None, step_states_dtype=None):
    """Shared body of the fused sigmoid-gating decode calls: the pool (or None: zero states) is
    read through `indices`, written back in place if `inplace`, and with step_states_dtype the
    state after every token is returned. Returns (o, step states or None)."""
    _ops._check_qkv(fn, q, k, v)
    _ops._forward_only(fn, q, k, v, a, b, A_log, dt_bias)
    B, T = q.shape[0], q.shape[1]
    HV, K = v.shape[2], q.shape[3]
    kind = C.GDN_GATE_KDA if is_kda else C.GDN_GATE_GDN
    a4 = _tokens_view(a, B, T, (HV, K) if is_kda else (HV,), "a", fn)
    b3 = _tokens_view(b, B, T, (HV,), "b", fn)
    if is_kda and dt_bias is not None:
        dt_bias = dt_bias.view(HV, K)
    idx = _ops._index_tensor(indices) if pool is not None else None
    acc = _ops._index_tensor(num_accepted_tokens)
    if acc is not None and idx is None:
        raise ValueError(f"{fn}: num_accepted_tokens needs the state pool and its indices")
    if pool is not None and idx is None:
        raise ValueError(f"{fn}: the state pool is given without its slot indices")
    gate = (None, a4, _f32(A_log).contiguous(), _f32(dt_bias))
    return _ops._recurrent_dispatch(
        fn, q, k, v, kind, gate, 0.0, softplus_beta, softplus_threshold, b3, True, False, scale,
        use_qk_l2norm_in_kernel, _ops._index_tensor(cu_seqlens), state_v_first, pool, idx, acc, False,
        bool(inplace and pool is not None), 2 if step_states_dtype is not None else 0,
        step_states_dtype if step_states_dtype is not None else torch.float32)


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    dt_bias,
    softplus_beta,
    softplus_threshold,
    q,
    k,
    v,
    b,
    initial_state_source,
    initial_state_indices,
    scale=None,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    is_kda=False,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    cache_steps=None,
    retrieve_parent_token=None,
    **kwargs,
):
    r"""
    Gating, beta and the delta-rule update fused in one decode call (SGLang's signature):
    per token `g = -exp(A_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`, then the recurrence.
    Sequence `n` starts from pool slot `initial_state_indices[n]` and its final state is written
    back there, in place.

    Args:
        A_log (torch.Tensor): `[HV]`.
        a (torch.Tensor): raw gates `[B * T, HV]` or `[B, T, HV]` (KDA: `[B * T, HV * K]`).
        dt_bias (torch.Tensor): `[HV]` (KDA: `[HV * K]` or `[HV, K]`).
        softplus_beta (float), softplus_threshold (float): softplus parameters (vLLM: 1, 20).
        q (torch.Tensor): `[B, T, H, K]` (varlen: `B = 1` with `cu_seqlens`).
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`.
        b (torch.Tensor): beta logits `[B * T, HV]` or `[B, T, HV]`.
        initial_state_source (torch.Tensor): the state pool `[P, HV, V, K]` (K contiguous, as
            SGLang and vLLM keep it), float32 or bfloat16; updated in place. `None`: zero states,
            nothing written.
        initial_state_indices (torch.Tensor): `[N]` slots (any integer dtype). A negative slot
            (PAD_SLOT_ID) skips the sequence: nothing is read or written, its outputs are zero
            (SGLang computes them from a zero state instead; they are padding either way).
        scale (Optional[float]): Default `1 / sqrt(K)`.
        use_qk_l2norm_in_kernel (bool): L2-normalise q and k in-kernel.
        cu_seqlens (Optional[torch.Tensor]): `[N + 1]` for packed sequences.
        is_kda (bool): per-key-channel gates (Kimi Delta Attention).
        disable_state_update (bool): read the pool but write nothing back.
        intermediate_states_buffer, intermediate_state_indices, cache_steps, retrieve_parent_token:
            SGLang's target-verify extras: not supported (must be None); use
            `fused_recurrent_gated_delta_rule` with 2-D `ssm_state_indices` for per-step states.
        **kwargs: other keywords are ignored, with one warning per name per process.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]`, dtype of `v`.
    """
    fn = "fused_sigmoid_gating_delta_rule_update"
    _ops._options(fn, kwargs)
    if intermediate_states_buffer is not None or retrieve_parent_token is not None:
        raise NotImplementedError(f"{fn}: intermediate_states_buffer / retrieve_parent_token (target verify) are "
                                  f"not supported; use fused_recurrent_gated_delta_rule with 2-D ssm_state_indices")
    o, _ = _decode_update(
        fn, A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
        q=q, k=k, v=v, b=b, pool=initial_state_source, indices=initial_state_indices, scale=scale,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, is_kda=is_kda,
        state_v_first=True, inplace=not disable_state_update)
    return o
