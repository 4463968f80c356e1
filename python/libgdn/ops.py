"""FLA-compatible Gated DeltaNet functions over libgdn: chunk_gated_delta_rule (prefill),
fused_recurrent_gated_delta_rule (decode, with vLLM's state-pool arguments) and the gating helpers.

Every function takes torch tensors on the CPU (CPU backend) or on a CUDA device (CUDA backend, run on
torch's current stream), passes strides through, allocates outputs and workspace with torch (so it
works under CUDA graph capture and the caching allocator), never synchronises, and never reads
device data on the host (see _kernels._index_args for host-resident index tensors).
chunk_gated_delta_rule is differentiable (gdn_chunk_bwd, CPU and CUDA); the other functions are
forward only.
Argument errors raise GDNInvalidArgumentError (a ValueError) with the library's message; valid
calls that this build cannot run raise GDNUnsupportedError (a NotImplementedError).

Keyword arguments: as FLA, unknown ones are accepted and ignored (one warning per function and name
per process); options that would change the result and that libgdn does not implement raise.

The functions resolve their arguments here (plain torch, traceable) and call the custom ops of
_kernels.py (libgdn::chunk_fwd, chunk_fwd_pool, chunk_bwd, recurrent_fwd, recurrent_fwd_inplace, gating),
which torch.compile traces without graph breaks where torch >= 2.4 provides torch.library.custom_op.
Eager calls of the ops that mutate nothing run their bodies directly (_custom_ops.call), without the
dispatcher's host time; there _ChunkFunction differentiates the chunked forward.
"""

import collections
import warnings

import torch
from torch.autograd.function import once_differentiable

from . import _capi as C
from . import _custom_ops
from ._kernels import chunk_fwd, chunk_fwd_pool, chunk_grads, gating, recurrent_fwd, recurrent_fwd_inplace

# ------------------------------------------------------------------------------------------------
# Keyword arguments

# Options of FLA, vLLM or transformers that change the result and that libgdn does not implement:
# name -> (the value that is a no-op, why it raises otherwise).
_RESULT_CHANGING = {
    "head_first": (False, "head_first=True ([B, H, T, ...] inputs) is not supported (FLA removed it); "
                          "pass [B, T, H, ...] tensors"),
    "cp_context": (None, "context parallelism (cp_context) is not supported by libgdn"),
    "gv": (None, "per-value-channel decays (gv) are not supported by libgdn"),
    "gk": (None, "per-key-channel decays (gk) are not taken here; use chunk_kda / fused_recurrent_kda"),
    "return_intermediate_states": (False, "return_intermediate_states is not supported by libgdn"),
    "out": (None, "a caller-provided output buffer (out) is not supported by libgdn"),
    "retrieve_parent_token": (None, "EAGLE tree verification (retrieve_parent_token) is not supported by libgdn"),
}

_warned = set()  # (function, key) pairs already warned about in this process


def _warn_once(fn, key, message, stacklevel=4):
    if (fn, key) in _warned:
        return
    _warned.add((fn, key))
    warnings.warn(message, stacklevel=stacklevel)


def _is_noop(value, noop):
    if noop is None:
        return value is None
    return not isinstance(value, torch.Tensor) and value == noop


def _options(fn, kwargs, **named):
    """FLA's keyword policy. `named` are result-changing options that are parameters of `fn`;
    `kwargs` the rest of the call's keywords (after fn took those it implements). A result-changing
    option other than its no-op value raises NotImplementedError; any other keyword is ignored,
    with one warning per (function, name) per process."""
    for name, value in list(named.items()) + sorted(kwargs.items()):
        rule = _RESULT_CHANGING.get(name)
        if rule is not None:
            if not _is_noop(value, rule[0]):
                raise NotImplementedError(f"{fn}: {rule[1]}")
        elif name in kwargs:
            _warn_once(fn, name, f"{fn}: ignoring the keyword argument {name!r}: libgdn does not use it "
                                 f"(FLA ignores unknown keywords too)")


def _state_v_first(fn, state_v_first, kwargs):
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError(f"{fn}: pass either state_v_first or the deprecated transpose_state_layout")
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    return state_v_first


# ------------------------------------------------------------------------------------------------
# Argument checks and conversions (plain torch, traceable)

_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}


def _dtype_name(dtype):
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _check_qkv(fn, q, k, v):
    """q, k, v are 4-D tensors of one dtype; a mismatch names both dtypes."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{fn}: {name} must be 4-D [B, T, heads, dim], got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{fn}: {name} is {_dtype_name(t.dtype)} but q is {_dtype_name(q.dtype)}; "
                             f"q, k and v must have one dtype")


def _check_beta(fn, beta):
    if isinstance(beta, torch.Tensor) and beta.dim() == 4:
        raise NotImplementedError(f"{fn}: per-value-channel beta [B, T, HV, V] is not supported by libgdn; "
                                  f"beta must be [B, T, HV]")


def _forward_only(fn, *tensors):
    """Warn when autograd would expect gradients from a function without a backward (all but
    chunk_gated_delta_rule)."""
    if _grad_needed(*tensors):
        warnings.warn(f"{fn} is forward-only in libgdn; no gradients flow through its outputs "
                      f"(run under torch.no_grad() / torch.inference_mode() to silence this)", stacklevel=3)


def _f32(t):
    """Gate parameters (A_log, dt_bias): the C API takes float32."""
    if t is None:
        return None
    return t if t.dtype == torch.float32 else t.float()


def _log_decay(g):
    """Precomputed log decays: float32 (float64 too on the CPU's float64 path), upcast from 16-bit
    as FLA does inside its kernels."""
    return g if g.dtype in (torch.float32, torch.float64) else g.float()


def _state_dtype(q, requested):
    # The float64 oracle path keeps states in float64 too.
    if q.dtype == torch.float64 and q.device.type == "cpu":
        return torch.float64
    return requested


def _index_tensor(t):
    """An index argument (cu_seqlens, slots, counts) as a tensor; lists become host tensors."""
    if t is None or isinstance(t, torch.Tensor):
        return t
    return torch.as_tensor(t)


def _gate_tensors(fn, g, A_log, dt_bias, use_gate_in_kernel):
    """(g, a, A_log, dt_bias) for the gate struct: precomputed g (upcast to float32, as FLA does
    inside its kernels) or raw a with A_log / dt_bias."""
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError(f"{fn}: A_log must be provided when use_gate_in_kernel=True")
        if g is None:
            raise ValueError(f"{fn}: g (the raw gate input) must be provided when use_gate_in_kernel=True")
        return None, g, _f32(A_log).contiguous(), _f32(dt_bias)
    if g is None:
        raise ValueError(f"{fn}: g (log decays) is required")
    return _log_decay(g), None, None, None


# ------------------------------------------------------------------------------------------------
# Chunked forward


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    chunk_indices=None,
    cp_context=None,
    *,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    final_state_dtype=torch.float32,
    ssm_state_indices=None,
    has_initial_state=None,
    null_slot_zero=False,
    checkpoint_interval=0,
    checkpoint_indices=None,
    **kwargs,
):
    r"""
    Gated delta rule, chunked form (prefill). Same signature and results as FLA's
    `fla.ops.gated_delta_rule.chunk_gated_delta_rule`, differentiable (gradients to q, k, v, g, beta,
    initial_state, and A_log / dt_bias with use_gate_in_kernel; on CUDA the backward takes bf16 /
    f16 inputs with head dims 64 or 128 and raises GDNUnsupportedError otherwise). Any strides. On CUDA,
    float32 inputs and head dim K = 256, which the chunk kernel does not take, run on the recurrent
    kernel (same results; one warning per process).

    Args:
        q (torch.Tensor):
            queries of shape `[B, T, H, K]`; float32, bfloat16 or float16 (float64 on the CPU).
        k (torch.Tensor):
            keys of shape `[B, T, H, K]`, same dtype as `q`.
        v (torch.Tensor):
            values of shape `[B, T, HV, V]`, same dtype as `q`.
            GVA (grouped value attention) is applied if `HV > H`; `HV` must be divisible by `H`.
        g (torch.Tensor):
            gates of shape `[B, T, HV]`. With `use_gate_in_kernel=False` (default) the log decays
            (upcast to float32 if given in another dtype). With `use_gate_in_kernel=True` the raw
            input `a`, from which the kernel computes `g = -exp(A_log) * softplus(a + dt_bias)`.
        beta (torch.Tensor):
            betas of shape `[B, T, HV]` (float32, bfloat16 or float16); raw logits with
            `use_beta_sigmoid_in_kernel=True`.
        scale (Optional[float]):
            Scale of the queries. Default: `1 / sqrt(K)`.
        initial_state (Optional[torch.Tensor]):
            Initial state of shape `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first=True`)
            for `N` input sequences. Converted to `final_state_dtype` when a final state is
            returned, else read as is if float32 / bfloat16. Default: `None` (zeros).
        output_final_state (Optional[bool]):
            Whether to return the final state, shape as `initial_state`. Default: `False`.
        use_qk_l2norm_in_kernel (bool):
            L2-normalise q and k per token and head inside the kernel. Default: `False`.
        use_beta_sigmoid_in_kernel (bool):
            `beta` holds logits; the kernel uses `sigmoid(beta)`. Default: `False`.
        allow_neg_eigval (bool):
            With `use_beta_sigmoid_in_kernel=True`, use `2 * sigmoid(beta)`. Default: `False`.
        state_v_first (bool):
            States in the V-first `[V, K]` layout (K contiguous). Default: `False`.
        cu_seqlens (torch.LongTensor):
            Cumulative sequence lengths `[N + 1]` of `N` sequences packed in a batch of 1
            (FlashAttention convention). Any integer dtype, on the op's device or on the host (a
            host tensor of a CUDA call is validated on the host, then copied to the device).
        use_gate_in_kernel (bool, keyword):
            `g` is the raw gate input; requires `A_log`. Default: `False`.
        A_log (Optional[torch.Tensor], keyword):
            `[HV]`, required with `use_gate_in_kernel=True` (used as float32).
        dt_bias (Optional[torch.Tensor], keyword):
            `[HV]`, bias added before the softplus; optional (used as float32).
        final_state_dtype (torch.dtype, keyword):
            dtype of the returned final state: `torch.float32` (FLA's choice, default) or
            `torch.bfloat16`. States are float64 on the CPU's float64 path.
        ssm_state_indices (Optional[torch.Tensor], keyword):
            `[N]` slots of a state pool (vLLM's): `initial_state` is then the pool `[P, HV, K, V]`
            (`[P, HV, V, K]` with `state_v_first=True`, float32 or bfloat16), sequence `n` starts
            from slot `ssm_state_indices[n]` and its final state is written back to that slot in
            place (so `output_final_state` must be False and the returned state is `None`). A
            negative slot (or 0 with `null_slot_zero=True`) skips the sequence: zero outputs, the
            pool untouched. Forward only.
        has_initial_state (Optional[torch.Tensor], keyword):
            `[N]` bool or int: False starts that sequence from zeros (a new request) instead of
            reading its slot. Needs `ssm_state_indices`.
        checkpoint_interval, checkpoint_indices (keyword):
            Prefix-cache checkpoints: with `checkpoint_interval=M` (a multiple of 64) the state
            after every `M` tokens of sequence `n` is also written to pool slot
            `checkpoint_indices[n, j]` (`[N, J]`, negative: skip). Needs `ssm_state_indices`.
        cu_seqlens_cpu, chunk_indices, chunk_size:
            Accepted for FLA compatibility and ignored (nothing is precomputed here).
        cp_context:
            Context parallelism: not supported (raises unless `None`).
        **kwargs:
            Other keywords are ignored, as FLA does, with one warning per name per process;
            `head_first=True` raises.

    Returns:
        o (torch.Tensor):
            Outputs of shape `[B, T, HV, V]`, dtype of `v`.
        final_state (torch.Tensor):
            Final state `[N, HV, K, V]` (or `[N, HV, V, K]`) in `final_state_dtype` if
            `output_final_state=True`, else `None`.

    Examples::
        >>> import torch, torch.nn.functional as F
        >>> from libgdn import chunk_gated_delta_rule
        >>> B, T, H, HV, K, V = 2, 1024, 4, 8, 128, 128
        >>> q = torch.randn(B, T, H, K, dtype=torch.bfloat16, device='cuda')
        >>> k = F.normalize(torch.randn(B, T, H, K, device='cuda'), p=2, dim=-1).bfloat16()
        >>> v = torch.randn(B, T, HV, V, dtype=torch.bfloat16, device='cuda')
        >>> beta = torch.rand(B, T, HV, device='cuda').sigmoid()
        >>> g = F.logsigmoid(torch.randn(B, T, HV, device='cuda'))
        >>> o, ht = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    """
    fn = "chunk_gated_delta_rule"
    state_v_first = _state_v_first(fn, state_v_first, kwargs)
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"{fn}: chunk_size must be 16, 32 or 64, got {chunk_size}")
    _options(fn, kwargs, cp_context=cp_context)
    _check_qkv(fn, q, k, v)
    _check_beta(fn, beta)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{fn}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")

    gate = _gate_tensors(fn, g, A_log, dt_bias, use_gate_in_kernel)
    if ssm_state_indices is not None:
        return _chunk_pool_call(fn, q, k, v, gate, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval, scale,
                                initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first, cu_seqlens,
                                ssm_state_indices, has_initial_state, null_slot_zero, checkpoint_interval,
                                checkpoint_indices)
    if has_initial_state is not None or null_slot_zero or checkpoint_interval or checkpoint_indices is not None:
        raise ValueError(f"{fn}: has_initial_state, null_slot_zero and checkpoints need ssm_state_indices "
                         f"(a state pool)")
    return _chunk_call(fn, q, k, v, C.GDN_GATE_GDN, gate, 0.0, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                       scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                       cu_seqlens, final_state_dtype)


def _chunk_pool_call(fn, q, k, v, gate, beta, beta_from_logits, allow_neg_eigval, scale, pool, output_final_state,
                     use_qk_l2norm, state_v_first, cu_seqlens, indices, has_initial_state, null_slot_zero,
                     checkpoint_interval, checkpoint_indices):
    """The chunked forward on a state pool (libgdn::chunk_fwd_pool): returns (o, None)."""
    if pool is None:
        raise ValueError(f"{fn}: ssm_state_indices needs initial_state, the state pool")
    if output_final_state:
        raise ValueError(f"{fn}: with ssm_state_indices the final states are written into the pool "
                         f"(initial_state) in place; pass output_final_state=False")
    g, a, A_log, dt_bias = gate
    _forward_only(fn, q, k, v, g, a, A_log, dt_bias, beta, pool)
    o = chunk_fwd_pool(q, k, v, g, a, A_log, dt_bias, beta, C.GDN_GATE_GDN, 0.0, bool(beta_from_logits),
                       bool(allow_neg_eigval), 0.0 if scale is None else float(scale), bool(use_qk_l2norm),
                       _index_tensor(cu_seqlens), bool(state_v_first), pool, _index_tensor(indices),
                       _index_tensor(has_initial_state), bool(null_slot_zero), int(checkpoint_interval),
                       _index_tensor(checkpoint_indices), fn)
    return o, None


chunk_gdn = chunk_gated_delta_rule


def _recurrent_instead(fn, q, kind):
    """Whether a chunked forward runs on the recurrent kernel, decided from dtype and shape before
    any call: the CUDA chunk kernel takes 16-bit inputs with K = 64 or 128 (GDN and KDA gates), so
    on CUDA float32 inputs and K = 256 go to the recurrent kernel (the same recurrence token by
    token: same results, slower on long prompts), with one warning per process."""
    if q.device.type != "cuda":
        return False
    if q.dtype == torch.float32:
        why = "float32 inputs"
    elif q.shape[3] == 256:
        why = "head dim K = 256"
    else:
        return False
    _warn_once(fn, "recurrent for " + why, f"{fn}: the CUDA chunk kernel takes bf16 / f16 inputs with K = 64 or "
                                          f"128; {why} run on the recurrent kernel (same results, slower for long "
                                          f"prompts)", stacklevel=5)
    return True


def _chunk_call(fn, q, k, v, kind, gate, lower_bound, beta, beta_from_logits, allow_neg_eigval, scale,
                initial_state, output_final_state, use_qk_l2norm, state_v_first, cu_seqlens, final_state_dtype):
    """The chunked forward once the gate is resolved: gate = (g, a, A_log, dt_bias)."""
    if final_state_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"{fn}: final_state_dtype must be torch.float32 or torch.bfloat16, got {final_state_dtype}")
    if not isinstance(beta, torch.Tensor):
        raise TypeError(f"{fn}: beta must be a torch.Tensor, got {type(beta).__name__}")
    state_dtype = _state_dtype(q, final_state_dtype)
    h0 = initial_state
    if output_final_state:
        if h0 is not None and h0.dtype != state_dtype:
            h0 = h0.to(state_dtype)
    elif h0 is not None and h0.dtype not in (torch.float32, torch.bfloat16, state_dtype):
        h0 = h0.to(state_dtype)
    cu = _index_tensor(cu_seqlens)
    g, a, A_log, dt_bias = gate
    opts = _chunk_options(fn, kind, lower_bound, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, cu,
                         state_v_first, output_final_state, state_dtype)
    train = kind == C.GDN_GATE_GDN and _grad_needed(q, k, v, g, a, A_log, dt_bias, beta, h0)
    if train and not _op_differentiates(opts, q, k, v, g, a, A_log, dt_bias, beta, h0):
        o, final = _ChunkFunction.apply(q, k, v, g, a, A_log, dt_bias, beta, h0, opts)
    else:
        # Where the op differentiates, its forward saves the states its backward reads.
        o, final, _ = _chunk_forward(opts, q, k, v, g, a, A_log, dt_bias, beta, h0, train)
    return o, (final if output_final_state else None)


def _op_differentiates(opts, q, *tensors):
    """Whether the call runs on libgdn::chunk_fwd as a torch custom op (torch >= 2.4, under
    torch.compile or another tracer), which has gdn_chunk_bwd registered as its derivative (traced
    like the forward). Elsewhere (eager calls, which skip the dispatcher: _custom_ops.call; older
    torch; a CUDA call sent to the recurrent kernel) _ChunkFunction differentiates."""
    return (_custom_ops.AVAILABLE and not _custom_ops.eager(q, *tensors)
            and not _recurrent_instead(opts.fn, q, opts.kind))


# The non-tensor arguments of one chunked call (and cu_seqlens, never differentiated); a named
# tuple, which torch.compile traces.
_ChunkOpts = collections.namedtuple("_ChunkOpts", "fn kind lower_bound beta_from_logits allow_neg_eigval scale "
                                                  "use_qk_l2norm cu state_v_first output_final_state state_dtype")


def _chunk_options(fn, kind, lower_bound, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, cu, state_v_first,
                  output_final_state, state_dtype):
    return _ChunkOpts(fn, int(kind), float(lower_bound), bool(beta_from_logits), bool(allow_neg_eigval),
                      0.0 if scale is None else float(scale), bool(use_qk_l2norm), cu, bool(state_v_first),
                      bool(output_final_state), state_dtype)


def _grad_needed(*tensors):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _chunk_forward(o, q, k, v, g, a, A_log, dt_bias, beta, h0, save_states=False):
    """libgdn::chunk_fwd, or the recurrent op where the chunk kernel does not take the call
    (_recurrent_instead): (o, the final state or an empty tensor without one, the states saved for
    the backward with save_states, or None / an empty tensor)."""
    if _recurrent_instead(o.fn, q, o.kind):
        # The recurrent op calls its state argument `state`; name the chunk function's argument.
        rows = o.cu.shape[0] - 1 if o.cu is not None else q.shape[0]
        if h0 is not None and h0.dim() >= 1 and h0.shape[0] != rows:
            raise C.GDNInvalidArgumentError(f"{o.fn}: initial_state: shape[0] = {h0.shape[0]}, expected {rows}",
                                            C.GDN_ERR_INVALID_ARGUMENT)
        out, final = _recurrent_dispatch(o.fn, q, k, v, o.kind, (g, a, A_log, dt_bias), o.lower_bound, 0.0, 0.0,
                                         beta, o.beta_from_logits, o.allow_neg_eigval, o.scale, o.use_qk_l2norm, o.cu,
                                         o.state_v_first, h0, None, None, False, False,
                                         1 if o.output_final_state else 0, o.state_dtype)
        return out, (final if final is not None else torch.empty(0, dtype=torch.float32, device=q.device)), None
    return _custom_ops.call(chunk_fwd, q, k, v, g, a, A_log, dt_bias, beta, o.kind, o.lower_bound,
                            o.beta_from_logits, o.allow_neg_eigval, o.scale, o.use_qk_l2norm, o.cu, o.state_v_first,
                            h0, o.output_final_state, o.state_dtype, bool(save_states), o.fn)


class _ChunkFunction(torch.autograd.Function):
    """The chunked forward with its backward (gdn_chunk_bwd) where the op does not carry it
    (_op_differentiates): the forward saves its inputs and, where the backend keeps them, the
    states entering its chunks; the backward recomputes the rest."""

    @staticmethod
    def forward(ctx, q, k, v, g, a, A_log, dt_bias, beta, h0, opts):
        ctx.opts = opts
        # Unused outputs' gradients stay None (no zero fill of the final state's size), as in the op's
        # registered derivative.
        ctx.set_materialize_grads(False)
        o, final, saved = _chunk_forward(opts, q, k, v, g, a, A_log, dt_bias, beta, h0, True)
        ctx.save_for_backward(q, k, v, g, a, A_log, dt_bias, beta, h0, saved)
        if not opts.output_final_state:
            ctx.mark_non_differentiable(final)
        return o, final

    @staticmethod
    @once_differentiable  # gdn_chunk_bwd has no derivative: a second order says so when it reaches it
    def backward(ctx, do, dht):
        o = ctx.opts
        q, k, v, g, a, A_log, dt_bias, beta, h0, saved = ctx.saved_tensors
        grads = chunk_grads(q, k, v, g, a, A_log, dt_bias, beta, o.beta_from_logits, o.allow_neg_eigval, o.scale,
                            o.use_qk_l2norm, o.cu, o.state_v_first, h0, do, dht if o.output_final_state else None,
                            o.fn, saved)
        return grads + (None,)


# ------------------------------------------------------------------------------------------------
# Recurrent forward


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g=None,
    gk=None,
    gv=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
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
    Gated delta rule, token by token (decode, multi-token verify). FLA's
    `fused_recurrent_gated_delta_rule` signature, plus the serving arguments of vLLM's fork
    (`inplace_final_state`, `ssm_state_indices`, `num_accepted_tokens`) with vLLM's semantics.

    Args:
        q (torch.Tensor):
            queries of shape `[B, T, H, K]`.
        k (torch.Tensor):
            keys of shape `[B, T, H, K]`.
        v (torch.Tensor):
            values of shape `[B, T, HV, V]`; `HV` divisible by `H` (GVA).
        g (torch.Tensor):
            log decays `[B, T, HV]` (the raw input with `use_gate_in_kernel=True`). Default: `None`.
        gk (torch.Tensor):
            per-key-channel log decays `[B, T, HV, K]` (KDA). Added to `g` when both are given.
        gv (torch.Tensor):
            per-value-channel decays: not supported (raises unless `None`).
        beta (torch.Tensor):
            betas `[B, T, HV]`. Default: ones. (FLA's per-channel `[B, T, HV, V]` raises.)
        scale (Optional[float]):
            Default: `1 / sqrt(K)`.
        initial_state (Optional[torch.Tensor]):
            Without `ssm_state_indices`: `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`).
            With `ssm_state_indices`: the state pool `[P, HV, K, V]` / `[P, HV, V, K]` (slot
            strides may be padded), float32 or bfloat16.
        output_final_state (bool):
            Return the final state `[N, ...]` (FLA semantics, without `ssm_state_indices`).
        use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, state_v_first, cu_seqlens:
            As in `chunk_gated_delta_rule`.
        inplace_final_state (Optional[bool], keyword):
            vLLM's switch. `None` (default): `True` when `ssm_state_indices` is given, else FLA
            semantics. `True`: write the states into `initial_state` in place and return it:
            with 1-D indices the final state goes to the start slot; with 2-D indices `[N, T_max]`
            the state after token `t` goes to slot `ssm_state_indices[n, t]` (negative slots
            skip that write). Without indices, the final state overwrites `initial_state[n]`.
            `False` (vLLM): return the state after every token, `[B * T, HV, ...]` (row = packed
            token index), in the dtype of `initial_state`.
        ssm_state_indices (Optional[torch.Tensor], keyword):
            `[N]` or `[N, T_max]` slots of `initial_state` (any integer dtype). Sequence `n` starts
            from slot `ssm_state_indices[n, num_accepted_tokens[n] - 1]` (else `[n, 0]`). A negative
            start slot (vLLM's PAD_SLOT_ID) skips the sequence: nothing is read or written and its
            outputs are zero. On the device, or on the host (validated there by the library, then
            copied: a bad slot raises instead of being skipped).
        num_accepted_tokens (Optional[torch.Tensor], keyword):
            `[N]` accepted draft tokens (speculative decoding); needs 2-D indices. Device or host,
            as `ssm_state_indices`.
        null_slot_zero (bool, keyword):
            Treat slot 0 as a null block too, as vLLM pads batches with block 0: sequences whose
            start slot is <= 0 are skipped, and per-step writes to slot 0 are dropped.
        final_state_dtype (torch.dtype, keyword):
            dtype of the returned final state with `output_final_state=True`: float32 (FLA's
            choice, default) or bfloat16.
        **kwargs:
            Other keywords are ignored, as FLA does, with one warning per name per process.

    Returns:
        o (torch.Tensor):
            Outputs of shape `[B, T, HV, V]`.
        final_state (torch.Tensor):
            FLA semantics: the final state `[N, ...]` if `output_final_state=True`, else `None`.
            In place: `initial_state` itself (updated). `inplace_final_state=False`: the
            per-token states `[B * T, ...]`.

    Examples::
        >>> # vLLM decode: one token per sequence, states in a pool, updated in place
        >>> o, _ = fused_recurrent_gated_delta_rule(
        ...     q, k, v, g=g, beta=beta, initial_state=ssm_state, inplace_final_state=True,
        ...     cu_seqlens=query_start_loc, ssm_state_indices=state_indices,
        ...     use_qk_l2norm_in_kernel=True)
    """
    fn = "fused_recurrent_gated_delta_rule"
    state_v_first = _state_v_first(fn, state_v_first, kwargs)
    _options(fn, kwargs, gv=gv)
    _check_qkv(fn, q, k, v)
    _check_beta(fn, beta)
    _forward_only(fn, q, k, v, g, gk, beta, initial_state, A_log, dt_bias)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{fn}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")

    # Gates: GDN scalar g, KDA per-channel gk, or both (exp(g) * exp(gk) = exp(g + gk)).
    kind = C.GDN_GATE_GDN
    if gk is not None:
        if use_gate_in_kernel:
            raise NotImplementedError(f"{fn}: use_gate_in_kernel with gk (KDA gating) is not supported here")
        if gk.dim() != 4:
            raise ValueError(f"{fn}: gk must be [B, T, HV, K], got shape {tuple(gk.shape)} (FLA's positional "
                             f"order is q, k, v, g, gk, gv, beta: pass beta by keyword)")
        kind = C.GDN_GATE_KDA
        gk = _log_decay(gk)
        gate = (gk if g is None else gk + _log_decay(g).unsqueeze(-1)), None, None, None
    else:
        gate = _gate_tensors(fn, g, A_log, dt_bias, use_gate_in_kernel)
    return _recurrent_call(fn, q, k, v, kind, gate, 0.0, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval, scale,
                           initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first, cu_seqlens,
                           inplace_final_state, ssm_state_indices, num_accepted_tokens, null_slot_zero,
                           final_state_dtype)


fused_recurrent_gdn = fused_recurrent_gated_delta_rule


def _recurrent_call(fn, q, k, v, kind, gate, lower_bound, beta, beta_from_logits, allow_neg_eigval, scale,
                    initial_state, output_final_state, use_qk_l2norm, state_v_first, cu_seqlens,
                    inplace_final_state, ssm_state_indices, num_accepted_tokens, null_slot_zero, final_state_dtype):
    """The recurrent forward once the gate is resolved (gate = (g, a, A_log, dt_bias)), with FLA's
    and vLLM's state semantics."""
    if final_state_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"{fn}: final_state_dtype must be torch.float32 or torch.bfloat16, got {final_state_dtype}")
    B, T = q.shape[0], q.shape[1]
    if beta is None:
        beta = torch.ones(B, T, v.shape[2], dtype=torch.float32, device=q.device)

    idx = _index_tensor(ssm_state_indices)
    acc = _index_tensor(num_accepted_tokens)
    pooled = idx is not None
    if acc is not None and not pooled:
        raise ValueError(f"{fn}: num_accepted_tokens needs ssm_state_indices")
    if null_slot_zero and not pooled:
        raise ValueError(f"{fn}: null_slot_zero needs ssm_state_indices")
    if pooled and initial_state is None:
        raise ValueError(f"{fn}: ssm_state_indices given but initial_state (the state pool) is None")
    if pooled and output_final_state:
        raise ValueError(f"{fn}: with ssm_state_indices the states go to the pool (inplace_final_state=True) "
                         f"or are returned per token (inplace_final_state=False); output_final_state does not apply")
    if inplace_final_state is None:
        inplace_final_state = True if pooled else None
    if inplace_final_state is not None and initial_state is None:
        raise ValueError(f"{fn}: inplace_final_state={inplace_final_state} needs initial_state")

    state = initial_state
    states_out, states_dtype = 0, torch.float32
    if inplace_final_state is False:
        states_out, states_dtype = 2, initial_state.dtype
    elif inplace_final_state is None and output_final_state:
        states_out, states_dtype = 1, _state_dtype(q, final_state_dtype)
        if state is not None and state.dtype != states_dtype:
            state = state.to(states_dtype)
    elif inplace_final_state is None and state is not None and \
            state.dtype not in (torch.float32, torch.bfloat16, _state_dtype(q, torch.float32)):
        state = state.to(torch.float32)
    o, states = _recurrent_dispatch(fn, q, k, v, kind, gate, lower_bound, 0.0, 0.0, beta, beta_from_logits,
                                    allow_neg_eigval, scale, use_qk_l2norm, _index_tensor(cu_seqlens), state_v_first,
                                    state, idx, acc, null_slot_zero, inplace_final_state is True, states_out,
                                    states_dtype)
    return o, (initial_state if inplace_final_state is True else states)


def _recurrent_dispatch(fn, q, k, v, kind, gate, lower_bound, softplus_beta, softplus_threshold, beta,
                        beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, cu_seqlens, state_v_first, state,
                        ssm_state_indices, num_accepted_tokens, null_slot_zero, inplace, states_out, states_dtype):
    """The recurrent custom op for the request: in place (the pool through its indices, or the
    states overwritten) or not, with states_out (0 none, 1 final [N], 2 per token [B * T]) in
    states_dtype. Returns (o, those states or None)."""
    g, a, A_log, dt_bias = gate
    common = (q, k, v, g, a, A_log, dt_bias, beta, int(kind), float(lower_bound), float(softplus_beta),
              float(softplus_threshold), bool(beta_from_logits), bool(allow_neg_eigval),
              0.0 if scale is None else float(scale), bool(use_qk_l2norm), cu_seqlens, bool(state_v_first), state,
              ssm_state_indices, num_accepted_tokens, bool(null_slot_zero))
    if inplace:
        return recurrent_fwd_inplace(*common, fn), None
    o, states = _custom_ops.call(recurrent_fwd, *common, int(states_out), states_dtype, fn)
    return o, (states if states_out else None)


# ------------------------------------------------------------------------------------------------
# Gating


def _gating_call(fn, a, A_log, dt_bias, b, beta_dtype, softplus_beta, softplus_threshold):
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"{fn}: a must be a torch.Tensor")
    _forward_only(fn, a, A_log, dt_bias, b)
    g, beta = _custom_ops.call(gating, a, _f32(A_log).contiguous() if A_log is not None else None, _f32(dt_bias), b,
                               beta_dtype if beta_dtype is not None else torch.float32, float(softplus_beta),
                               float(softplus_threshold), fn)
    return g, (beta if b is not None else None)


def fused_gdn_gate(g, A_log, dt_bias=None, output_dtype=torch.float32, **kwargs):
    r"""
    GDN gate, as FLA's `fla.ops.gated_delta_rule.gate.fused_gdn_gate` (forward only):
    `g = -exp(A_log) * softplus(g + dt_bias)`.

    Args:
        g (torch.Tensor):
            raw gate input of shape `[..., HV]` (float32, bfloat16 or float16).
        A_log (torch.Tensor):
            `[HV]` decay parameters.
        dt_bias (Optional[torch.Tensor]):
            `[HV]` bias added before the softplus.
        output_dtype (torch.dtype):
            dtype of the result. Default: `torch.float32` (computed in float32 in every case).
        **kwargs:
            Ignored, with one warning per name per process.

    Returns:
        Log decays of the shape of `g`.
    """
    _options("fused_gdn_gate", kwargs)
    out, _ = _gating_call("fused_gdn_gate", g, A_log, dt_bias, None, None, 0.0, 0.0)
    out = out.view(g.shape)
    return out if output_dtype == torch.float32 else out.to(output_dtype)


def fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0, **kwargs):
    r"""
    Gate and write strength in one pass, as vLLM's / SGLang's `fused_gdn_gating`:
    `g = -exp(A_log) * softplus(a + dt_bias)` with softplus `log(1 + exp(beta * x)) / beta`
    (`x` where `beta * x > threshold`), and `beta_output = sigmoid(b)`.

    Args:
        A_log (torch.Tensor): `[HV]`.
        a (torch.Tensor): `[num_tokens, HV]` (or `[B, T, HV]`).
        b (torch.Tensor): same shape as `a`.
        dt_bias (torch.Tensor): `[HV]`.
        beta (float): softplus beta. Default: 1.
        threshold (float): softplus threshold. Default: 20.
        **kwargs: ignored, with one warning per name per process.

    Returns:
        g (torch.Tensor): `[1, num_tokens, HV]` (or `[B, T, HV]`) float32.
        beta_output (torch.Tensor): same shape, dtype of `b`.
    """
    fn = "fused_gdn_gating"
    _options(fn, kwargs)
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"{fn}: b must be a torch.Tensor")
    return _gating_call(fn, a, A_log, dt_bias, b, b.dtype, beta, threshold)
