"""Kimi Delta Attention (per-key-channel decays) with FLA's signatures: chunk_kda and
fused_recurrent_kda (`fla.ops.kda`), forward only, over the same libgdn ops as the GDN functions.
The CPU backend runs both. On CUDA chunk_kda runs on the tensor-core chunk kernel (bf16 / f16
inputs, K = 64 / 128; float32 inputs or K = 256 go to the recurrent kernel with one warning per
process, as chunk_gated_delta_rule's do), fused_recurrent_kda on the recurrent kernel (decode and
speculative verify, every serving argument)."""

import torch

from . import _capi as C
from .ops import (_check_beta, _check_qkv, _chunk_call, _f32, _forward_only, _log_decay, _options, _recurrent_call,
                  _state_v_first)


def _kda_gate(fn, g, v, A_log, dt_bias, use_gate_in_kernel, lower_bound, safe_gate):
    """(gate tensors, lower bound) for the C API: precomputed g, or raw g with A_log / dt_bias
    ([HV * K] or [HV, K]) and the optional lower bound L (gate L * sigmoid(exp(A_log) * x))."""
    if g is None or g.dim() != 4:
        raise ValueError(f"{fn}: g must be [B, T, HV, K], got {None if g is None else tuple(g.shape)}")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(f"{fn}: lower_bound must be specified when safe_gate=True and use_gate_in_kernel=True")
        if not -5 <= lower_bound < 0:
            raise ValueError(f"{fn}: lower_bound must be in the safe range [-5, 0), got {lower_bound}")
    if not use_gate_in_kernel:
        return (_log_decay(g), None, None, None), 0.0
    HV, K = v.shape[2], g.shape[3]
    if A_log is None:
        if lower_bound is None:
            raise ValueError(f"{fn}: A_log must be provided when use_gate_in_kernel=True and lower_bound is not set")
        A_log = torch.zeros(HV, dtype=torch.float32, device=g.device)  # exp(0) = 1: L * sigmoid(g + dt_bias)
    if dt_bias is not None:
        dt_bias = _f32(dt_bias).reshape(HV, K)
    return (None, g, _f32(A_log).contiguous(), dt_bias), float(lower_bound or 0.0)


def chunk_kda(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    safe_gate=False,
    lower_bound=None,
    disable_recompute=False,
    return_intermediate_states=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    cp_context=None,
    *,
    A_log=None,
    dt_bias=None,
    final_state_dtype=torch.float32,
    **kwargs,
):
    r"""
    Kimi Delta Attention, chunked form (prefill), as FLA's `fla.ops.kda.chunk_kda` (forward only).

    Args:
        q (torch.Tensor): queries `[B, T, H, K]`.
        k (torch.Tensor): keys `[B, T, H, K]`.
        v (torch.Tensor): values `[B, T, HV, V]` (GVA when `HV > H`).
        g (torch.Tensor): per-channel log decays `[B, T, HV, K]`, or with `use_gate_in_kernel=True`
            the raw input of `-exp(A_log) * softplus(g + dt_bias)` (or, with `lower_bound`,
            `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`).
        beta (torch.Tensor): `[B, T, HV]` (logits with `use_beta_sigmoid_in_kernel=True`).
        scale (Optional[float]): Default `1 / sqrt(K)`.
        initial_state (Optional[torch.Tensor]): `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`).
        output_final_state (bool): return the final state (float32 unless `final_state_dtype`).
        use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
        cu_seqlens: as in `chunk_gated_delta_rule`.
        use_gate_in_kernel (bool): `g` is raw; needs `A_log` `[HV]` (or `lower_bound`), optional
            `dt_bias` `[HV * K]`.
        safe_gate (bool): requires `lower_bound` in `[-5, 0)` (libgdn accepts no other bound).
        lower_bound (Optional[float]): see `g`.
        disable_recompute, cu_seqlens_cpu, chunk_size: accepted and ignored (forward only).
        return_intermediate_states (bool), cp_context: not supported (raise unless `False` / `None`).
        **kwargs: other keywords are ignored, with one warning per name per process.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]`.
        final_state (torch.Tensor): `[N, HV, K, V]` if `output_final_state=True`, else `None`.
    """
    fn = "chunk_kda"
    state_v_first = _state_v_first(fn, state_v_first, kwargs)
    kwargs.pop("chunk_size", None)
    _options(fn, kwargs, cp_context=cp_context, return_intermediate_states=return_intermediate_states)
    _check_qkv(fn, q, k, v)
    _check_beta(fn, beta)
    _forward_only(fn, q, k, v, g, beta, initial_state, A_log, dt_bias)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{fn}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    gate, lb = _kda_gate(fn, g, v, A_log, dt_bias, use_gate_in_kernel, lower_bound, safe_gate)
    return _chunk_call(fn, q, k, v, C.GDN_GATE_KDA, gate, lb, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                       scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                       cu_seqlens, final_state_dtype)


def fused_recurrent_kda(
    q,
    k,
    v,
    g,
    beta,
    A_log=None,
    dt_bias=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    lower_bound=None,
    state_v_first=False,
    cu_seqlens=None,
    *,
    inplace_final_state=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    null_slot_zero=False,
    final_state_dtype=torch.float32,
    **kwargs,
):
    r"""
    Kimi Delta Attention token by token (decode), as FLA's `fla.ops.kda.fused_recurrent_kda`, with
    the serving arguments of `fused_recurrent_gated_delta_rule` (`inplace_final_state`,
    `ssm_state_indices`, `num_accepted_tokens`, `null_slot_zero`).

    Args:
        q, k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`.
        g (torch.Tensor): `[B, T, HV, K]` log decays (raw with `use_gate_in_kernel=True`).
        beta (torch.Tensor): `[B, T, HV]`.
        A_log, dt_bias, lower_bound, use_gate_in_kernel: as in `chunk_kda`.
        Everything else: as in `fused_recurrent_gated_delta_rule` (`out=` other than `None` raises;
        other unknown keywords are ignored with one warning per name per process).

    Returns:
        o (torch.Tensor): `[B, T, HV, V]`.
        final_state (torch.Tensor): as in `fused_recurrent_gated_delta_rule`.
    """
    fn = "fused_recurrent_kda"
    state_v_first = _state_v_first(fn, state_v_first, kwargs)
    _options(fn, kwargs)
    _check_qkv(fn, q, k, v)
    _check_beta(fn, beta)
    _forward_only(fn, q, k, v, g, beta, initial_state, A_log, dt_bias)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{fn}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    gate, lb = _kda_gate(fn, g, v, A_log, dt_bias, use_gate_in_kernel, lower_bound, False)
    return _recurrent_call(fn, q, k, v, C.GDN_GATE_KDA, gate, lb, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                           scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                           cu_seqlens, inplace_final_state, ssm_state_indices, num_accepted_tokens, null_slot_zero,
                           final_state_dtype)
