"""libgdn's C entry points as torch custom ops: libgdn::chunk_fwd (gdn_chunk_fwd, with
libgdn::chunk_bwd, gdn_chunk_bwd, registered as its derivative), libgdn::recurrent_fwd and
libgdn::recurrent_fwd_inplace (gdn_recurrent_fwd, the latter writing the states or the state pool
it is given) and libgdn::gating (gdn_gating), each with a fake implementation giving its outputs'
shapes and dtypes, so that torch.compile traces them without
graph breaks (torch >= 2.4; on older torch they are the plain functions, see _custom_ops.py).

The ops take resolved arguments (gate tensors, flags, scale as numbers, state dtypes) and run on
real tensors only: they fill the C structs, allocate outputs and workspace with torch, validate
host-resident index tensors of CUDA calls on the host (_index_args) and call the library on
torch's current stream. ops.py maps FLA's and vLLM's signatures onto them.
"""

import ctypes
from typing import Optional, Tuple

import torch

from . import _capi as C
from ._custom_ops import call, custom_op

Tensor = torch.Tensor


def _empty(shape, dtype, device):
    """Every output and state buffer comes from here (tests swap in a poisoning allocator)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _state_shape(rows, HV, K, V, state_v_first):
    return (rows, HV, V, K) if state_v_first else (rows, HV, K, V)


def _num_seqs(q, cu_seqlens):
    return cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]


def _run(fn_name, size_fn, run_fn, args, device):
    """Query the workspace (the CPU backend takes its scratch from one too), allocate it with torch
    on `device`, run. `args` is the filled struct; the query validates it."""
    nbytes = ctypes.c_size_t(0)
    C.check(size_fn(ctypes.byref(args), ctypes.byref(nbytes)), fn_name)
    buf, args.workspace = C.workspace(nbytes.value, device)
    args.workspace_bytes = nbytes.value
    status = run_fn(ctypes.byref(args))
    del buf  # back to torch's allocator; on CUDA it stays reserved for this stream's queued work
    C.check(status, fn_name)


def _mark_host(s):
    """Describe every present tensor of an argument struct (nested ones too) as host-resident."""
    for name, ftype in s._fields_:
        if ftype is C.Tensor:
            t = getattr(s, name)
            if t.data:
                t.device, t.device_ordinal = C.GDN_DEVICE_CPU, 0
        elif isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
            _mark_host(getattr(s, name))


def _index_args(fn, size_fn, args, device, indices):
    """Put the index tensors `indices` ({struct field: int32 tensor or None}) into `args` for a
    call on `device`. The C library checks the values of index tensors that live on the host, but
    a CUDA call takes device tensors only: a CUDA call given host-resident indices has them
    validated by the library first, on the host (the same query on a copy of `args` with every
    descriptor marked host-resident: it reads no tensor data but the indices), and only then copied
    to the device. A call that mixes host and device indices brings the device ones to the host for
    that check (a synchronisation, in that case only); device-resident indices alone are never read
    on the host. Returns the tensors `args` now points to: keep them alive until the call returns."""
    present = {field: t for field, t in indices.items() if t is not None}
    if device.type == "cuda" and any(t.device.type == "cpu" for t in present.values()):
        host = {field: t if t.device.type == "cpu" else t.cpu() for field, t in present.items()}
        shadow = type(args).from_buffer_copy(args)
        _mark_host(shadow)
        for field, t in host.items():
            setattr(shadow, field, C.describe(t, field))
        C.check(size_fn(ctypes.byref(shadow), ctypes.byref(ctypes.c_size_t(0))), fn)
    kept = []
    for field, t in present.items():
        if t.device != device:
            t = t.to(device)
        setattr(args, field, C.describe(t, field))
        kept.append(t)
    return kept


def _as_int32(t):
    """int32 as the C API takes it: FLA and vLLM pass int64. Host tensors are cast (and made
    contiguous) on the host, device tensors on the device, without a host read."""
    if t is None:
        return None
    t = t if t.dtype == torch.int32 else t.to(torch.int32)
    return t.contiguous() if t.device.type == "cpu" else t


def _fill_gate(gate, kind, g, a, A_log, dt_bias, beta, lower_bound, softplus_beta, softplus_threshold,
               beta_from_logits, allow_neg_eigval):
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


def _fwd_args(cls, q, k, v, g, a, A_log, dt_bias, beta, gate_kind, lower_bound, softplus_beta, softplus_threshold,
              beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, state_v_first):
    """A ChunkFwdArgs or RecurrentFwdArgs with the inputs and options both take filled in; the
    caller sets cu_seqlens, the states, o and the stream."""
    args = cls()
    args.q, args.k, args.v = C.describe(q, "q"), C.describe(k, "k"), C.describe(v, "v")
    _fill_gate(args.gate, gate_kind, g, a, A_log, dt_bias, beta, lower_bound, softplus_beta, softplus_threshold,
               beta_from_logits, allow_neg_eigval)
    args.scale = float(scale)
    args.use_qk_l2norm = int(bool(use_qk_l2norm))
    args.state_layout = C.GDN_STATE_VK if state_v_first else C.GDN_STATE_KV
    return args


def _no_states(t):
    """The placeholder a custom op returns for a state output that was not asked for."""
    return torch.empty(0, dtype=torch.float32, device=t.device)


def saved_states_bytes(q, v, cu_seqlens, gate_kind):
    """gdn_chunk_saved_states_size without a call (the fake implementations need it): per 64-token
    chunk slot (sm90_chunk_common.cuh's map) and value head the state entering it (K V 16-bit
    values), then from a 256-byte boundary the backward's record of each (19200 bytes: T, Pm and
    per-token factors), where the CUDA backward reads them; else 0. The op checks it against the
    query."""
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if q.device.type != "cuda" or gate_kind != C.GDN_GATE_GDN or q.dtype not in (torch.bfloat16, torch.float16) \
            or K not in (64, 128) or V not in (64, 128):
        return 0
    # varlen: floor(T / 64) + N + 1 slots, N + 1 being cu_seqlens' length
    slots = T // 64 + cu_seqlens.shape[0] if cu_seqlens is not None else B * ((T + 63) // 64)
    tiles = HV * slots * K * V * 2
    return (tiles + 255) // 256 * 256 + HV * slots * 19200


def _chunk_fwd_fake(x):
    q, v = x["q"], x["v"]
    o = v.new_empty(v.shape)
    saved = q.new_empty((saved_states_bytes(q, v, x["cu_seqlens"], x["gate_kind"]) if x["save_states"] else 0,),
                        dtype=torch.uint8)
    if not x["output_final_state"]:
        return o, _no_states(q), saved
    shape = _state_shape(_num_seqs(q, x["cu_seqlens"]), v.shape[2], q.shape[3], v.shape[3], x["state_v_first"])
    return o, q.new_empty(shape, dtype=x["final_state_dtype"]), saved


def _chunk_fwd_setup_context(ctx, inputs, output):
    (q, k, v, g, a, A_log, dt_bias, beta, gate_kind, _, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm,
     cu_seqlens, state_v_first, initial_state, output_final_state, _, _, caller) = inputs
    ctx.save_for_backward(q, k, v, g, a, A_log, dt_bias, beta, initial_state, cu_seqlens, output[2])
    # Unused outputs' gradients stay None: materialized, the saved states' would be a zero fill of
    # their whole buffer every backward (chunk_grads takes None for do and dht).
    ctx.set_materialize_grads(False)
    ctx.opts = (gate_kind, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, state_v_first, output_final_state,
                caller)


def _chunk_fwd_backward(ctx, do, dht, _saved=None):
    """libgdn::chunk_fwd's derivative (torch >= 2.4): gdn_chunk_bwd, None for the non-tensor inputs."""
    gate_kind, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, state_v_first, final, caller = ctx.opts
    if gate_kind != C.GDN_GATE_GDN:
        raise C.GDNUnsupportedError(f"{caller}: the backward takes GDN gates only (KDA: not yet)",
                                    C.GDN_ERR_UNSUPPORTED)
    q, k, v, g, a, A_log, dt_bias, beta, h0, cu, saved = ctx.saved_tensors
    dq, dk, dv, dg, da, dA_log, ddt_bias, dbeta, dh0 = chunk_grads(
        q, k, v, g, a, A_log, dt_bias, beta, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, cu,
        state_v_first, h0, do, dht if final else None, caller, saved)
    return (dq, dk, dv, dg, da, dA_log, ddt_bias, dbeta, None, None, None, None, None, None, None, None, dh0, None,
            None, None, None)


@custom_op("libgdn::chunk_fwd", mutates_args=(), fake=_chunk_fwd_fake,
           autograd=(_chunk_fwd_setup_context, _chunk_fwd_backward))
def chunk_fwd(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], a: Optional[Tensor], A_log: Optional[Tensor],
              dt_bias: Optional[Tensor], beta: Tensor, gate_kind: int, lower_bound: float, beta_from_logits: bool,
              allow_neg_eigval: bool, scale: float, use_qk_l2norm: bool, cu_seqlens: Optional[Tensor],
              state_v_first: bool, initial_state: Optional[Tensor], output_final_state: bool,
              final_state_dtype: torch.dtype, save_states: bool, caller: str) -> Tuple[Tensor, Tensor, Tensor]:
    """gdn_chunk_fwd: (o, final state or an empty tensor without output_final_state, the states
    saved for the backward: uint8, empty where save_states is false or the backend saves none).
    Messages start with `caller`, the public function called."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    cu = _as_int32(cu_seqlens)
    final = None
    if output_final_state:
        final = _empty(_state_shape(_num_seqs(q, cu), HV, K, V, state_v_first), final_state_dtype, dev)
    o = _empty(v.shape, v.dtype, dev)
    args = _fwd_args(C.ChunkFwdArgs, q, k, v, g, a, A_log, dt_bias, beta, gate_kind, lower_bound, 0.0, 0.0,
                     beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, state_v_first)
    args.initial_state = C.describe(initial_state, "initial_state")
    args.final_state = C.describe(final, "final_state")
    args.o = C.describe(o, "o")
    args.stream = C.stream_of(q)
    L = C.lib()
    kept = _index_args(caller, L.gdn_chunk_fwd_workspace_size, args, dev, {"cu_seqlens": cu})
    nsaved = saved_states_bytes(q, v, cu, gate_kind) if save_states else 0
    if save_states:
        nbytes = ctypes.c_size_t(0)
        C.check(L.gdn_chunk_saved_states_size(ctypes.byref(args), ctypes.byref(nbytes)), caller)
        if nbytes.value != nsaved:
            raise C.GDNError(f"{caller}: saved states: the library asks {nbytes.value} bytes, libgdn's Python "
                             f"side {nsaved} (saved_states_bytes is out of step with the library)")
    saved = _empty((nsaved,), torch.uint8, dev)
    if nsaved:
        args.saved_states, args.saved_states_bytes = saved.data_ptr(), nsaved
    _run(caller, L.gdn_chunk_fwd_workspace_size, L.gdn_chunk_fwd, args, dev)
    del kept
    return o, (final if final is not None else _no_states(q)), saved


@custom_op("libgdn::chunk_fwd_pool", mutates_args=("pool",), fake=lambda x: x["v"].new_empty(x["v"].shape))
def chunk_fwd_pool(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], a: Optional[Tensor], A_log: Optional[Tensor],
                   dt_bias: Optional[Tensor], beta: Tensor, gate_kind: int, lower_bound: float, beta_from_logits: bool,
                   allow_neg_eigval: bool, scale: float, use_qk_l2norm: bool, cu_seqlens: Optional[Tensor],
                   state_v_first: bool, pool: Tensor, state_indices: Tensor, has_initial_state: Optional[Tensor],
                   null_slot_zero: bool, checkpoint_interval: int, checkpoint_indices: Optional[Tensor],
                   caller: str) -> Tensor:
    """gdn_chunk_fwd on a state pool: each sequence starts from its slot (or from zeros where
    has_initial_state is false), its final state goes back to that slot, and with
    checkpoint_interval > 0 the state every that many tokens to its checkpoint_indices slots."""
    dev = q.device
    cu = _as_int32(cu_seqlens)
    o = _empty(v.shape, v.dtype, dev)
    args = _fwd_args(C.ChunkFwdArgs, q, k, v, g, a, A_log, dt_bias, beta, gate_kind, lower_bound, 0.0, 0.0,
                     beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, state_v_first)
    args.initial_state = C.describe(pool, "initial_state")
    args.null_slot_zero = int(bool(null_slot_zero))
    args.checkpoint_interval = int(checkpoint_interval)
    args.o = C.describe(o, "o")
    args.stream = C.stream_of(q)
    L = C.lib()
    kept = _index_args(caller, L.gdn_chunk_fwd_workspace_size, args, dev,
                       {"cu_seqlens": cu, "state_indices": _as_int32(state_indices),
                        "has_initial_state": _as_int32(has_initial_state),
                        "checkpoint_indices": _as_int32(checkpoint_indices)})
    _run(caller, L.gdn_chunk_fwd_workspace_size, L.gdn_chunk_fwd, args, dev)
    del kept
    return o


def _recurrent(q, k, v, g, a, A_log, dt_bias, beta, gate_kind, lower_bound, softplus_beta, softplus_threshold,
               beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, cu_seqlens, state_v_first, state,
               ssm_state_indices, num_accepted_tokens, null_slot_zero, inplace, states_out, states_dtype, caller):
    """gdn_recurrent_fwd. inplace: the pool `state` is written through ssm_state_indices, or
    (without indices) the final states overwrite `state`. states_out: 0 none, 1 the final states
    [N, ...], 2 the state after every token [B * T, ...]. Returns (o, those states or None)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    cu = _as_int32(cu_seqlens)
    pooled = ssm_state_indices is not None
    out_states = None
    if states_out == 1:
        out_states = _empty(_state_shape(_num_seqs(q, cu), HV, K, V, state_v_first), states_dtype, dev)
    elif states_out == 2:
        out_states = _empty(_state_shape(B * T, HV, K, V, state_v_first), states_dtype, dev)
    o = _empty(v.shape, v.dtype, dev)
    args = _fwd_args(C.RecurrentFwdArgs, q, k, v, g, a, A_log, dt_bias, beta, gate_kind, lower_bound, softplus_beta,
                     softplus_threshold, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, state_v_first)
    args.state = C.describe(state, "initial_state")
    args.inplace_state = int(bool(inplace and pooled))
    args.null_slot_zero = int(bool(null_slot_zero))
    final = state if inplace and not pooled else (out_states if states_out == 1 else None)
    args.final_state = C.describe(final, "final_state")
    args.step_states = C.describe(out_states if states_out == 2 else None, "step_states")
    args.o = C.describe(o, "o")
    args.stream = C.stream_of(q)
    L = C.lib()
    kept = _index_args(caller, L.gdn_recurrent_fwd_workspace_size, args, dev,
                       {"cu_seqlens": cu, "state_indices": _as_int32(ssm_state_indices),
                        "num_accepted_tokens": _as_int32(num_accepted_tokens)})
    _run(caller, L.gdn_recurrent_fwd_workspace_size, L.gdn_recurrent_fwd, args, dev)
    del kept
    return o, out_states


def _recurrent_fwd_fake(x):
    q, v = x["q"], x["v"]
    o = v.new_empty(v.shape)
    if x["states_out"] == 0:
        return o, _no_states(q)
    rows = _num_seqs(q, x["cu_seqlens"]) if x["states_out"] == 1 else q.shape[0] * q.shape[1]
    shape = _state_shape(rows, v.shape[2], q.shape[3], v.shape[3], x["state_v_first"])
    return o, q.new_empty(shape, dtype=x["states_dtype"])


@custom_op("libgdn::recurrent_fwd", mutates_args=(), fake=_recurrent_fwd_fake)
def recurrent_fwd(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], a: Optional[Tensor], A_log: Optional[Tensor],
                  dt_bias: Optional[Tensor], beta: Tensor, gate_kind: int, lower_bound: float, softplus_beta: float,
                  softplus_threshold: float, beta_from_logits: bool, allow_neg_eigval: bool, scale: float,
                  use_qk_l2norm: bool, cu_seqlens: Optional[Tensor], state_v_first: bool,
                  initial_state: Optional[Tensor], ssm_state_indices: Optional[Tensor],
                  num_accepted_tokens: Optional[Tensor], null_slot_zero: bool, states_out: int,
                  states_dtype: torch.dtype, caller: str) -> Tuple[Tensor, Tensor]:
    """gdn_recurrent_fwd reading its states: (o, the states states_out asks for, or an empty tensor)."""
    o, states = _recurrent(q, k, v, g, a, A_log, dt_bias, beta, gate_kind, lower_bound, softplus_beta,
                           softplus_threshold, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, cu_seqlens,
                           state_v_first, initial_state, ssm_state_indices, num_accepted_tokens, null_slot_zero,
                           False, states_out, states_dtype, caller)
    return o, (states if states is not None else _no_states(q))


@custom_op("libgdn::recurrent_fwd_inplace", mutates_args=("initial_state",),
           fake=lambda x: x["v"].new_empty(x["v"].shape))
def recurrent_fwd_inplace(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], a: Optional[Tensor],
                          A_log: Optional[Tensor], dt_bias: Optional[Tensor], beta: Tensor, gate_kind: int,
                          lower_bound: float, softplus_beta: float, softplus_threshold: float,
                          beta_from_logits: bool, allow_neg_eigval: bool, scale: float, use_qk_l2norm: bool,
                          cu_seqlens: Optional[Tensor], state_v_first: bool, initial_state: Tensor,
                          ssm_state_indices: Optional[Tensor], num_accepted_tokens: Optional[Tensor],
                          null_slot_zero: bool, caller: str) -> Tensor:
    """gdn_recurrent_fwd writing its states into initial_state (the pool, or the states in place)."""
    o, _ = _recurrent(q, k, v, g, a, A_log, dt_bias, beta, gate_kind, lower_bound, softplus_beta,
                      softplus_threshold, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, cu_seqlens,
                      state_v_first, initial_state, ssm_state_indices, num_accepted_tokens, null_slot_zero,
                      True, 0, torch.float32, caller)
    return o


def _chunk_bwd_fake(x):
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    g, a, dt_bias, h0 = x["g"], x["a"], x["dt_bias"], x["initial_state"]
    gate = g.new_empty(g.shape) if g is not None else a.new_empty(a.shape)
    A_log = x["A_log"]
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gate,
            A_log.new_empty(A_log.shape) if a is not None else _no_states(q),
            dt_bias.new_empty(dt_bias.shape) if dt_bias is not None else _no_states(q),
            beta.new_empty(beta.shape), h0.new_empty(h0.shape) if h0 is not None else _no_states(q))


@custom_op("libgdn::chunk_bwd", mutates_args=(), fake=_chunk_bwd_fake)
def chunk_bwd(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], a: Optional[Tensor], A_log: Optional[Tensor],
              dt_bias: Optional[Tensor], beta: Tensor, beta_from_logits: bool, allow_neg_eigval: bool, scale: float,
              use_qk_l2norm: bool, cu_seqlens: Optional[Tensor], state_v_first: bool,
              initial_state: Optional[Tensor], d_o: Tensor, dht: Optional[Tensor], saved_states: Optional[Tensor],
              caller: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """gdn_chunk_bwd (GDN gates): (dq, dk, dv, dg or da, dA_log, ddt_bias, dbeta, dh0), an empty
    tensor for each gradient whose input is absent. The workspace (needed on the CPU too) comes
    from torch."""
    dev = q.device
    cu = _as_int32(cu_seqlens)
    dq, dk, dv = _empty(q.shape, q.dtype, dev), _empty(k.shape, k.dtype, dev), _empty(v.shape, v.dtype, dev)
    dg = _empty(g.shape, g.dtype, dev) if g is not None else None
    da = _empty(a.shape, a.dtype, dev) if a is not None else None
    dA_log = _empty(A_log.shape, A_log.dtype, dev) if a is not None else None
    ddt_bias = _empty(dt_bias.shape, dt_bias.dtype, dev) if dt_bias is not None else None
    dbeta = _empty(beta.shape, beta.dtype, dev)
    dh0 = _empty(initial_state.shape, initial_state.dtype, dev) if initial_state is not None else None
    args = _fwd_args(C.ChunkBwdArgs, q, k, v, g, a, A_log, dt_bias, beta, C.GDN_GATE_GDN, 0.0, 0.0, 0.0,
                     beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm, state_v_first)
    args.initial_state = C.describe(initial_state, "initial_state")
    args.d_o = C.describe(d_o, "do")
    args.dht = C.describe(dht, "dht")
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv), ("dg", dg), ("da", da), ("dA_log", dA_log),
                    ("ddt_bias", ddt_bias), ("dbeta", dbeta), ("dh0", dh0)):
        setattr(args, name, C.describe(t, name))
    args.stream = C.stream_of(q)
    if saved_states is not None and saved_states.numel() > 0:
        args.saved_states, args.saved_states_bytes = saved_states.data_ptr(), saved_states.numel()
    L = C.lib()
    kept = _index_args(caller, L.gdn_chunk_bwd_workspace_size, args, dev, {"cu_seqlens": cu})
    nbytes = ctypes.c_size_t(0)
    C.check(L.gdn_chunk_bwd_workspace_size(ctypes.byref(args), ctypes.byref(nbytes)), caller)
    buf, args.workspace = C.workspace(nbytes.value, dev)
    args.workspace_bytes = nbytes.value
    status = L.gdn_chunk_bwd(ctypes.byref(args))
    del buf, kept
    C.check(status, caller)
    # A fresh empty tensor for each absent gradient: a custom op's outputs must not alias each other.
    return (dq, dk, dv, dg if dg is not None else da, dA_log if dA_log is not None else _no_states(q),
            ddt_bias if ddt_bias is not None else _no_states(q), dbeta,
            dh0 if dh0 is not None else _no_states(q))


def chunk_grads(q, k, v, g, a, A_log, dt_bias, beta, beta_from_logits, allow_neg_eigval, scale, use_qk_l2norm,
                cu_seqlens, state_v_first, initial_state, do, dht, caller, saved_states=None):
    """The gradients of the chunked forward's tensor inputs (q, k, v, g, a, A_log, dt_bias, beta,
    initial_state; None for the absent ones) from those of its outputs: do (None: zero) and dht
    (None: zero; converted to the initial state's dtype, which the C API shares between them)."""
    if do is None:
        do = torch.zeros_like(v)
    elif do.dtype != v.dtype:
        do = do.to(v.dtype)
    if dht is not None and initial_state is not None and dht.dtype != initial_state.dtype:
        dht = dht.to(initial_state.dtype)
    dq, dk, dv, dgate, dA_log, ddt_bias, dbeta, dh0 = call(
        chunk_bwd, q, k, v, g, a, A_log, dt_bias, beta, bool(beta_from_logits), bool(allow_neg_eigval), float(scale),
        bool(use_qk_l2norm), cu_seqlens, bool(state_v_first), initial_state, do, dht, saved_states, caller)
    return (dq, dk, dv, dgate if g is not None else None, dgate if a is not None else None,
            dA_log if a is not None else None, ddt_bias if dt_bias is not None else None, dbeta,
            dh0 if initial_state is not None else None)


def _as_bth(t):
    """A [..., HV] tensor as a 3-D [B, T, HV] one for the C API: views where possible."""
    if t.dim() == 3:
        return t
    if t.dim() == 2:
        return t.unsqueeze(0)
    if t.dim() == 1:
        return t.view(1, 1, -1)
    return t.reshape(1, -1, t.shape[-1])


def _gating_fake(x):
    a3 = _as_bth(x["a"])
    g = a3.new_empty(a3.shape, dtype=torch.float32)
    if x["b"] is None:
        return g, _no_states(x["a"])
    b3 = _as_bth(x["b"])
    return g, b3.new_empty(b3.shape, dtype=x["beta_dtype"])


@custom_op("libgdn::gating", mutates_args=(), fake=_gating_fake)
def gating(a: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor], b: Optional[Tensor],
           beta_dtype: torch.dtype, softplus_beta: float, softplus_threshold: float,
           caller: str) -> Tuple[Tensor, Tensor]:
    """gdn_gating: (g [B, T, HV] float32, beta [B, T, HV] in beta_dtype, or an empty tensor without b)."""
    a3 = _as_bth(a)
    g = _empty(a3.shape, torch.float32, a.device)
    b3 = _as_bth(b) if b is not None else None
    beta = _empty(b3.shape, beta_dtype, b.device) if b is not None else None
    args = C.GatingArgs()
    args.kind = C.GDN_GATE_GDN
    args.a = C.describe(a3, "a")
    args.A_log = C.describe(A_log, "A_log")
    args.dt_bias = C.describe(dt_bias, "dt_bias")
    args.softplus_beta = float(softplus_beta)
    args.softplus_threshold = float(softplus_threshold)
    args.g_out = C.describe(g, "g_out")
    args.b = C.describe(b3, "b")
    args.beta_out = C.describe(beta, "beta_out")
    args.stream = C.stream_of(a)
    C.check(C.lib().gdn_gating(ctypes.byref(args)), caller)
    return g, (beta if beta is not None else _no_states(a))
