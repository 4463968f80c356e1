"""FLA-compatible Gated DeltaNet functions over libgdn: chunk_gated_delta_rule (prefill),
fused_recurrent_gated_delta_rule (decode, with vLLM's state-pool arguments) and the gating helpers.

Every function takes torch tensors on the CPU (CPU backend) or on a CUDA device (CUDA backend, run on
torch's current stream), passes strides through, allocates outputs and workspace with torch (so it
works under CUDA graph capture and the caching allocator), never synchronises, and never reads
device data on the host. Forward only: outputs carry no autograd history.
Argument errors raise GDNInvalidArgumentError (a ValueError) with the library's message; valid
calls that this build cannot run raise GDNUnsupportedError (a NotImplementedError).
"""

import warnings

import torch

from . import _capi as C

# ------------------------------------------------------------------------------------------------
# Shared plumbing


def _run(fn_name, size_fn, run_fn, args, device, on_unsupported=None):
    """Query the workspace (CUDA; the CPU backend takes none), allocate it with torch on `device`,
    run. `args` is the filled struct. The query validates the arguments, so a GDN_ERR_UNSUPPORTED
    from the run itself means the CUDA backend declined valid arguments: then on_unsupported(error)
    runs instead, if given."""
    buf = None
    if device.type == "cuda":
        nbytes = C.ctypes.c_size_t(0)
        C.check(size_fn(C.ctypes.byref(args), C.ctypes.byref(nbytes)), fn_name)
        buf, args.workspace = C.workspace(nbytes.value, device)
        args.workspace_bytes = nbytes.value
    status = run_fn(C.ctypes.byref(args))
    del buf  # back to torch's allocator; on CUDA it stays reserved for this stream's queued work
    if status == C.GDN_ERR_UNSUPPORTED and on_unsupported is not None and device.type == "cuda":
        try:
            C.check(status, fn_name)
        except C.GDNUnsupportedError as e:
            on_unsupported(e)
        return
    C.check(status, fn_name)


def _forward_only(fn, *tensors):
    """Warn when autograd would expect gradients: libgdn computes the forward pass only."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        warnings.warn(f"{fn}: libgdn is forward-only; no gradients flow through its outputs "
                      f"(run under torch.no_grad() / torch.inference_mode() to silence this)", stacklevel=3)


def _empty(shape, dtype, device):
    """Every output and state buffer comes from here (tests swap in a poisoning allocator)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _i32(t, device):
    """Index tensors (cu_seqlens, slots, counts) as int32 on the op's device: FLA and vLLM pass
    int64; the C API takes int32. A device-side cast, never a host read."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    return t.to(device=device, dtype=torch.int32)


def _f32(t):
    """Gate parameters (A_log, dt_bias): the C API takes float32."""
    if t is None:
        return None
    return t if t.dtype == torch.float32 else t.float()


def _log_decay(g):
    """Precomputed log decays: float32 (float64 too on the CPU's float64 path), upcast from 16-bit
    as FLA does inside its kernels."""
    return g if g.dtype in (torch.float32, torch.float64) else g.float()


def _check_kwargs(fn_name, kwargs, ignored=()):
    for key in ignored:
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"{fn_name}: unexpected keyword arguments {sorted(kwargs)}")


def _state_v_first(fn_name, state_v_first, kwargs):
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError(f"{fn_name}: pass either state_v_first or the deprecated transpose_state_layout")
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    return state_v_first


def _layout(state_v_first):
    return C.GDN_STATE_VK if state_v_first else C.GDN_STATE_KV


def _state_shape(rows, HV, K, V, state_v_first):
    return (rows, HV, V, K) if state_v_first else (rows, HV, K, V)


def _need_4d(fn_name, **tensors):
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn_name}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{fn_name}: {name} must be 4-D [B, T, heads, dim], got shape {tuple(t.shape)}")


def _state_dtype(q, requested):
    # The float64 oracle path keeps states in float64 too.
    if q.dtype == torch.float64 and q.device.type == "cpu":
        return torch.float64
    return requested


def _fill_gate(gate, *, kind, g=None, a=None, A_log=None, dt_bias=None, beta=None,
               beta_from_logits=False, allow_neg_eigval=False, softplus_beta=0.0,
               softplus_threshold=0.0, lower_bound=0.0):
    gate.kind = kind
    gate.g = C.describe(g, "g")
    gate.a = C.describe(a, "a")
    gate.A_log = C.describe(A_log, "A_log")
    gate.dt_bias = C.describe(dt_bias, "dt_bias")
    gate.beta = C.describe(beta, "beta")
    gate.beta_from_logits = int(bool(beta_from_logits))
    gate.allow_neg_eigval = int(bool(allow_neg_eigval))
    gate.softplus_beta = float(softplus_beta)
    gate.softplus_threshold = float(softplus_threshold)
    gate.lower_bound = float(lower_bound)


def _fwd_args(cls, q, k, v, kind, gate, lower_bound, beta, beta_from_logits, allow_neg_eigval, scale,
              use_qk_l2norm, cu, state_v_first):
    """A ChunkFwdArgs or RecurrentFwdArgs with the inputs and options both take filled in (q, k, v,
    the gate from gate = (g, a, A_log, dt_bias), scale, l2norm, cu_seqlens, layout); the caller
    sets the states, o and the stream."""
    args = cls()
    args.q, args.k, args.v = C.describe(q, "q"), C.describe(k, "k"), C.describe(v, "v")
    g, a, A_log, dt_bias = gate
    _fill_gate(args.gate, kind=kind, g=g, a=a, A_log=A_log, dt_bias=dt_bias, beta=beta,
               beta_from_logits=beta_from_logits, allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound)
    args.scale = 0.0 if scale is None else float(scale)
    args.use_qk_l2norm = int(bool(use_qk_l2norm))
    args.cu_seqlens = C.describe(cu, "cu_seqlens")
    args.state_layout = _layout(state_v_first)
    return args


def _gate_tensors(fn_name, g, A_log, dt_bias, use_gate_in_kernel):
    """(g, a, A_log, dt_bias) for the gate struct: precomputed g (upcast to float32, as FLA does
    inside its kernels) or raw a with A_log / dt_bias."""
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError(f"{fn_name}: A_log must be provided when use_gate_in_kernel=True")
        if g is None:
            raise ValueError(f"{fn_name}: g (the raw gate input) must be provided when use_gate_in_kernel=True")
        return None, g, _f32(A_log).contiguous(), _f32(dt_bias)
    if g is None:
        raise ValueError(f"{fn_name}: g (log decays) is required")
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
    **kwargs,
):
    r"""
    Gated delta rule, chunked form (prefill). Same signature and results as FLA's
    `fla.ops.gated_delta_rule.chunk_gated_delta_rule` (forward only). Inputs the CUDA chunk kernel
    does not take (float32, per-channel gates, unaligned strides) run through the recurrent kernel,
    with a warning.

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
            (FlashAttention convention). Any integer dtype; cast to int32 on the op's device.
        use_gate_in_kernel (bool, keyword):
            `g` is the raw gate input; requires `A_log`. Default: `False`.
        A_log (Optional[torch.Tensor], keyword):
            `[HV]`, required with `use_gate_in_kernel=True` (used as float32).
        dt_bias (Optional[torch.Tensor], keyword):
            `[HV]`, bias added before the softplus; optional (used as float32).
        final_state_dtype (torch.dtype, keyword):
            dtype of the returned final state: `torch.float32` (FLA's choice, default) or
            `torch.bfloat16`. States are float64 on the CPU's float64 path.
        cu_seqlens_cpu, chunk_indices:
            Accepted for FLA compatibility and ignored (nothing is precomputed here).

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
    if kwargs.pop("head_first", False):
        raise ValueError(f"{fn}: head_first was removed in FLA; pass [B, T, H, ...] tensors")
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"{fn}: chunk_size must be 16, 32 or 64, got {chunk_size}")
    _check_kwargs(fn, kwargs)
    if cp_context is not None:
        raise NotImplementedError(f"{fn}: context parallelism (cp_context) is not supported by libgdn")
    _need_4d(fn, q=q, k=k, v=v)
    _forward_only(fn, q, k, v, g, beta, initial_state, A_log, dt_bias)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{fn}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")

    gate = _gate_tensors(fn, g, A_log, dt_bias, use_gate_in_kernel)
    return _chunk_call(fn, q, k, v, C.GDN_GATE_GDN, gate, 0.0, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                       scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                       cu_seqlens, final_state_dtype)


chunk_gdn = chunk_gated_delta_rule


def _chunk_call(fn, q, k, v, kind, gate, lower_bound, beta, beta_from_logits, allow_neg_eigval, scale,
                initial_state, output_final_state, use_qk_l2norm, state_v_first, cu_seqlens, final_state_dtype):
    """The chunked forward once the gate is resolved: gate = (g, a, A_log, dt_bias)."""
    if final_state_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"{fn}: final_state_dtype must be torch.float32 or torch.bfloat16, got {final_state_dtype}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    cu = _i32(cu_seqlens, dev)
    N = cu.shape[0] - 1 if cu is not None else B

    state_dtype = _state_dtype(q, final_state_dtype)
    h0 = initial_state
    final = None
    if output_final_state:
        final = _empty(_state_shape(N, HV, K, V, state_v_first), state_dtype, dev)
        if h0 is not None and h0.dtype != state_dtype:
            h0 = h0.to(state_dtype)
    elif h0 is not None and h0.dtype not in (torch.float32, torch.bfloat16, state_dtype):
        h0 = h0.to(state_dtype)
    o = _empty(v.shape, v.dtype, v.device)

    args = _fwd_args(C.ChunkFwdArgs, q, k, v, kind, gate, lower_bound, beta, beta_from_logits, allow_neg_eigval,
                     scale, use_qk_l2norm, cu, state_v_first)
    args.initial_state = C.describe(h0, "initial_state")
    args.final_state = C.describe(final, "final_state")
    args.o = C.describe(o, "o")
    args.stream = C.stream_of(q)
    L = C.lib()

    def recurrent_instead(e):
        # The CUDA chunk kernel declined these inputs (f32, KDA, odd strides): the recurrent
        # kernel computes the same recurrence, token by token.
        warnings.warn(f"{e}; running the recurrent kernel instead", stacklevel=5)
        _run(fn, L.gdn_recurrent_fwd_workspace_size, L.gdn_recurrent_fwd, _as_recurrent(args), dev)

    _run(fn, L.gdn_chunk_fwd_workspace_size, L.gdn_chunk_fwd, args, dev, on_unsupported=recurrent_instead)
    return o, final


def _as_recurrent(c):
    """Recurrent-forward arguments computing what chunk-forward arguments c describe."""
    r = C.RecurrentFwdArgs()
    for name, _ in C.FWD_INPUT_FIELDS:
        setattr(r, name, getattr(c, name))
    r.state, r.final_state = c.initial_state, c.final_state
    r.o, r.stream = c.o, c.stream
    return r


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
            per-value-channel decays: not supported (raises).
        beta (torch.Tensor):
            betas `[B, T, HV]`. Default: ones.
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
            outputs are zero.
        num_accepted_tokens (Optional[torch.Tensor], keyword):
            `[N]` accepted draft tokens (speculative decoding); needs 2-D indices.
        null_slot_zero (bool, keyword):
            Treat slot 0 as a null block too, as vLLM pads batches with block 0: sequences whose
            start slot is <= 0 are skipped, and per-step writes to slot 0 are dropped.
        final_state_dtype (torch.dtype, keyword):
            dtype of the returned final state with `output_final_state=True`: float32 (FLA's
            choice, default) or bfloat16.

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
    _check_kwargs(fn, kwargs)
    _need_4d(fn, q=q, k=k, v=v)
    _forward_only(fn, q, k, v, g, gk, beta, initial_state, A_log, dt_bias)
    if gv is not None:
        raise NotImplementedError(f"{fn}: per-value-channel decays (gv) are not supported by libgdn")
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
    """The recurrent forward once the gate is resolved: gate = (g, a, A_log, dt_bias)."""
    if final_state_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"{fn}: final_state_dtype must be torch.float32 or torch.bfloat16, got {final_state_dtype}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    cu = _i32(cu_seqlens, dev)
    N = cu.shape[0] - 1 if cu is not None else B
    if beta is None:
        beta = torch.ones(B, T, HV, dtype=torch.float32, device=dev)
    elif beta.dim() == 4:
        raise NotImplementedError(f"{fn}: per-value-channel beta [B, T, HV, V] is not supported by libgdn")

    pooled = ssm_state_indices is not None
    idx = _i32(ssm_state_indices, dev)
    acc = _i32(num_accepted_tokens, dev)
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
    final = None
    step_states = None
    inplace = 0
    ret_state = None
    if inplace_final_state is True:
        ret_state = initial_state
        if pooled:
            inplace = 1
        else:
            final = initial_state  # exact alias: the final state overwrites the initial one
    elif inplace_final_state is False:
        step_states = _empty(_state_shape(B * T, HV, K, V, state_v_first), initial_state.dtype, dev)
        ret_state = step_states
    elif output_final_state:
        state_dtype = _state_dtype(q, final_state_dtype)
        final = _empty(_state_shape(N, HV, K, V, state_v_first), state_dtype, dev)
        if state is not None and state.dtype != state_dtype:
            state = state.to(state_dtype)
        ret_state = final
    elif state is not None and state.dtype not in (torch.float32, torch.bfloat16, _state_dtype(q, torch.float32)):
        state = state.to(torch.float32)
    o = _empty(v.shape, v.dtype, v.device)

    args = _fwd_args(C.RecurrentFwdArgs, q, k, v, kind, gate, lower_bound, beta, beta_from_logits, allow_neg_eigval,
                     scale, use_qk_l2norm, cu, state_v_first)
    args.state = C.describe(state, "initial_state")
    args.state_indices = C.describe(idx, "ssm_state_indices")
    args.num_accepted_tokens = C.describe(acc, "num_accepted_tokens")
    args.inplace_state = inplace
    args.null_slot_zero = int(bool(null_slot_zero))
    args.final_state = C.describe(final, "final_state")
    args.step_states = C.describe(step_states, "step_states")
    args.o = C.describe(o, "o")
    args.stream = C.stream_of(q)
    L = C.lib()
    _run(fn, L.gdn_recurrent_fwd_workspace_size, L.gdn_recurrent_fwd, args, dev)
    return o, ret_state


# ------------------------------------------------------------------------------------------------
# Gating


def _as_bth(t):
    """A [..., HV] tensor as a 3-D [B, T, HV] one for the C API: views where possible."""
    if t.dim() == 3:
        return t
    if t.dim() == 2:
        return t.unsqueeze(0)
    if t.dim() == 1:
        return t.view(1, 1, -1)
    return t.reshape(1, -1, t.shape[-1])


def _gating(fn, a, A_log, dt_bias, b, beta_dtype, softplus_beta, softplus_threshold):
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"{fn}: a must be a torch.Tensor")
    a3 = _as_bth(a)
    g = _empty(a3.shape, torch.float32, a.device)
    b3 = _as_bth(b) if b is not None else None
    beta = _empty(b3.shape, beta_dtype, b.device) if b is not None else None
    args = C.GatingArgs()
    args.kind = C.GDN_GATE_GDN
    args.a = C.describe(a3, "a")
    args.A_log = C.describe(_f32(A_log).contiguous() if A_log is not None else None, "A_log")
    args.dt_bias = C.describe(_f32(dt_bias), "dt_bias")
    args.softplus_beta = float(softplus_beta)
    args.softplus_threshold = float(softplus_threshold)
    args.g_out = C.describe(g, "g_out")
    args.b = C.describe(b3, "b")
    args.beta_out = C.describe(beta, "beta_out")
    args.stream = C.stream_of(a)
    C.check(C.lib().gdn_gating(C.ctypes.byref(args)), fn)
    return g, beta


def fused_gdn_gate(g, A_log, dt_bias=None, output_dtype=torch.float32):
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

    Returns:
        Log decays of the shape of `g`.
    """
    out, _ = _gating("fused_gdn_gate", g, A_log, dt_bias, None, None, 0.0, 0.0)
    out = out.view(g.shape)
    return out if output_dtype == torch.float32 else out.to(output_dtype)


def fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):
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

    Returns:
        g (torch.Tensor): `[1, num_tokens, HV]` (or `[B, T, HV]`) float32.
        beta_output (torch.Tensor): same shape, dtype of `b`.
    """
    if not isinstance(b, torch.Tensor):
        raise TypeError("fused_gdn_gating: b must be a torch.Tensor")
    return _gating("fused_gdn_gating", a, A_log, dt_bias, b, b.dtype, beta, threshold)
