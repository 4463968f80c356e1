"""vLLM's GDN entry points with vLLM's current signatures (vllm/model_executor/layers/fla/ops),
over libgdn: a drop-in for `from vllm.model_executor.layers.fla.ops import ...`.

    from libgdn.vllm import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
"""

import torch

from .ops import _options, chunk_gated_delta_rule as _chunk, fused_gdn_gating, \
    fused_recurrent_gated_delta_rule as _fused_recurrent
from .serving import _decode_update

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "fused_sigmoid_gating_delta_rule_update",
           "fused_gdn_gating"]


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    head_first=False,
    use_qk_l2norm_in_kernel=False,
    *,
    state_v_first=False,
    ssm_state_indices=None,
    has_initial_state=None,
    null_slot_zero=False,
    checkpoint_interval=0,
    checkpoint_indices=None,
    **kwargs,
):
    r"""
    vLLM's `chunk_gated_delta_rule` (positional order and defaults as vLLM's), the prefill of
    `GatedDeltaNetAttention`. With `ssm_state_indices` (keyword) the call reads and writes vLLM's
    state pool itself instead of the gather before and the scatter after it: `initial_state` is the
    pool `[P, HV, K, V]` (`[P, HV, V, K]` with `state_v_first=True`), sequence `n` starts from slot
    `ssm_state_indices[n]` (from zeros where `has_initial_state[n]` is False) and its final state
    goes back to that slot; `output_final_state` must then be False. `checkpoint_interval` /
    `checkpoint_indices` write the state every M tokens into pool slots (prefix caching). Other
    arguments as `libgdn.chunk_gated_delta_rule`; `head_first=True` raises.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]`.
        final_state (Optional[torch.Tensor]): `[N, HV, K, V]` with `output_final_state`, else None.
    """
    return _chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_v_first=state_v_first,
                  ssm_state_indices=ssm_state_indices, has_initial_state=has_initial_state,
                  null_slot_zero=null_slot_zero, checkpoint_interval=checkpoint_interval,
                  checkpoint_indices=checkpoint_indices, head_first=head_first, **kwargs)


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta=None,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    retrieve_parent_token=None,
    use_qk_l2norm_in_kernel=False,
    *,
    state_v_first=False,
    null_slot_zero=False,
    **kwargs,
):
    r"""
    vLLM's `fused_recurrent_gated_delta_rule` (positional order and defaults as vLLM's).

    Args:
        q, k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`.
        g (torch.Tensor): log decays `[B, T, HV]`.
        beta (Optional[torch.Tensor]): `[B, T, HV]`. Default: ones.
        scale (Optional[float]): Default `1 / sqrt(K)`.
        initial_state (torch.Tensor): the state pool `[P, HV, K, V]` (with `ssm_state_indices`)
            or the states `[N, HV, K, V]`; `[.., V, K]` with `state_v_first=True`.
        inplace_final_state (bool): `True`: states written into `initial_state` (1-D indices: the
            final state to the start slot; 2-D `[N, T_max]`: the state after token `t` to slot
            `ssm_state_indices[n, t]`). `False`: the state after every token is returned,
            `[B * T, HV, K, V]`.
        cu_seqlens (Optional[torch.Tensor]): `[N + 1]`.
        ssm_state_indices (Optional[torch.Tensor]): `[N]` or `[N, T_max]` slots; negative slots
            (PAD_SLOT_ID) skip the sequence (outputs zero) or, per step, that write.
        num_accepted_tokens (Optional[torch.Tensor]): `[N]`; the start slot is
            `ssm_state_indices[n, num_accepted_tokens[n] - 1]`.
        retrieve_parent_token: EAGLE tree verification: not supported (must be None).
        use_qk_l2norm_in_kernel (bool).
        state_v_first (bool, keyword): pool layout `[.., V, K]`. Default `False` (vLLM's kernel).
        null_slot_zero (bool, keyword): slot 0 is a null block too.
        **kwargs: other keywords are ignored, with one warning per name per process.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]`.
        final_state (torch.Tensor): `initial_state` (updated in place) or the per-token states.
    """
    _options("fused_recurrent_gated_delta_rule", kwargs, retrieve_parent_token=retrieve_parent_token)
    if scale is not None and not scale > 0:
        raise ValueError(f"fused_recurrent_gated_delta_rule: scale must be positive, got {scale}")
    return _fused_recurrent(
        q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
        inplace_final_state=bool(inplace_final_state), ssm_state_indices=ssm_state_indices,
        num_accepted_tokens=num_accepted_tokens, null_slot_zero=null_slot_zero)


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    b,
    dt_bias,
    q,
    k,
    v,
    beta=1.0,
    threshold=20.0,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_kda=False,
    **kwargs,
):
    r"""
    vLLM's `fused_sigmoid_gating_delta_rule_update` (current signature): gating, `sigmoid(b)` and
    the delta-rule update in one call, states in a `[P, HV, V, K]` pool (K contiguous).

    Args:
        A_log (torch.Tensor): `[HV]`.
        a, b (torch.Tensor): raw gates and beta logits, `[B * T, HV]` or `[B, T, HV]`
            (KDA `a`: `[B * T, HV * K]`).
        dt_bias (torch.Tensor): `[HV]` (KDA `[HV * K]`).
        q, k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`.
        beta, threshold (float): softplus parameters. Default 1, 20.
        scale (Optional[float]): Default `1 / sqrt(K)`.
        initial_state (torch.Tensor): the pool `[P, HV, V, K]`, float32 or bfloat16. Without
            `ssm_state_indices`, sequence `n` uses `initial_state[n]`.
        inplace_final_state (bool): write states into the pool (see
            `fused_recurrent_gated_delta_rule`); `False` returns per-token states `[B * T, HV, V, K]`.
        cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, is_kda: as vLLM.
        **kwargs: other keywords are ignored, with one warning per name per process.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]`.
        final_state (torch.Tensor): `initial_state` (updated) or the per-token states.
    """
    fn = "fused_sigmoid_gating_delta_rule_update"
    _options(fn, kwargs)
    if initial_state is None:
        raise ValueError(f"{fn}: initial_state (the state pool) is required")
    if scale is not None and not scale > 0:
        raise ValueError(f"{fn}: scale must be positive, got {scale}")
    indices = ssm_state_indices
    if indices is None:
        n = (cu_seqlens.shape[0] - 1) if cu_seqlens is not None else q.shape[0]
        indices = torch.arange(n, dtype=torch.int32, device=q.device)
    o, steps = _decode_update(
        fn, A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=beta, softplus_threshold=threshold, q=q, k=k, v=v,
        b=b, pool=initial_state, indices=indices, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens, is_kda=is_kda, state_v_first=True, inplace=bool(inplace_final_state),
        num_accepted_tokens=num_accepted_tokens,
        step_states_dtype=None if inplace_final_state else initial_state.dtype)
    return o, (initial_state if inplace_final_state else steps)
