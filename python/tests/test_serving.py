"""State pools as serving engines use them: the chunked prefill on a pool (ssm_state_indices,
has_initial_state, checkpoints) against gather-call-scatter; decode: vLLM's
fused_recurrent_gated_delta_rule (plain and speculative decode), fused_gdn_gating, both fused_sigmoid_gating_delta_rule_update signatures
(SGLang's, vLLM's), padded and null slots, per-step state writes, against the float64 reference."""

import pytest
import torch
import torch.nn.functional as F

import libgdn
import libgdn.vllm as vllm_ops
from reference import gdn_gate, kv, l2norm, make_inputs, rel_err

H, HV, K, V = 2, 4, 64, 64


def ref_pool_decode(q, k, v, g, beta, pool_kv, idx, lengths, *, acc=None, inplace=True, null_zero=False,
                    use_qk_l2norm=True, scale=None):
    """Expected (o, pool after the call, per-token states) of a pooled decode, in float64.

    q, k [1, T, H, K] packed; v [1, T, HV, V]; g [1, T, HV] (or [1, T, HV, K]); beta [1, T, HV];
    pool_kv [P, HV, K, V]; idx a list of lists (2-D) or ints (1-D); lengths of the N sequences.
    """
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    pool = pool_kv.double().clone()
    source = pool.clone()
    T = q.shape[1]
    o = torch.zeros(1, T, HV, V, dtype=torch.float64)
    steps = torch.zeros(T, HV, K, V, dtype=torch.float64)
    scale = K ** -0.5 if scale is None else scale
    G = HV // H
    start = 0
    for n, length in enumerate(lengths):
        row = idx[n] if isinstance(idx[n], list) else [idx[n]]
        col = 0
        if acc is not None:
            col = acc[n] - 1
            if not 0 <= col < len(row):
                start += length
                continue
        slot = row[col]
        if slot < 0 or (null_zero and slot == 0):
            start += length
            continue
        S = source[slot].clone()
        for i in range(length):
            t = start + i
            qt, kt = q[0, t].repeat_interleave(G, 0), k[0, t].repeat_interleave(G, 0)
            if use_qk_l2norm:
                qt, kt = l2norm(qt), l2norm(kt)
            decay = torch.exp(g[0, t])
            S = S * (decay[:, :, None] if decay.dim() == 2 else decay[:, None, None])
            u = beta[0, t][:, None] * (v[0, t] - torch.einsum("hk,hkv->hv", kt, S))
            S = S + torch.einsum("hk,hv->hkv", kt, u)
            o[0, t] = torch.einsum("hk,hkv->hv", qt * scale, S)
            steps[t] = S
            if inplace and len(row) > 1 and row[i] >= (1 if null_zero else 0):
                pool[row[i]] = S
        if inplace and len(row) == 1:
            pool[slot] = S
        start += length
    return o, pool, steps


def padded_pool(P, v_first, dtype, device, gen):
    """A pool [P, HV, K, V] (or [P, HV, V, K]) whose slots are padded by 64 elements, as engines
    that share one buffer between layers lay it out; returns (pool, its storage, pool as KV)."""
    storage = torch.randn(P, HV * K * V + 64, generator=gen)
    shape = (P, HV, V, K) if v_first else (P, HV, K, V)
    storage = storage.to(dtype).to(device)
    pool = storage[:, :HV * K * V].view(*shape)
    return pool, storage, kv(pool, v_first).cpu().clone()


def tokens(T, gen, dtype, device):
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    return [x.to(dtype).to(device) for x in (q, k, v)]


@pytest.mark.parametrize("null_zero", [False, True])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_vllm_decode(device, gen, state_dtype, null_zero):
    """vLLM's Qwen3-Next decode: fused_gdn_gating, then fused_recurrent on the pool in place."""
    N, P = 6, 10
    idx = [3, 0, 7, -1, 1, 9]  # -1: PAD_SLOT_ID; 0: a real slot, or the null block with null_zero
    q, k, v = tokens(N, gen, torch.bfloat16, device)
    a = torch.randn(N, HV, generator=gen).to(torch.bfloat16).to(device)
    b = torch.randn(N, HV, generator=gen).to(torch.bfloat16).to(device)
    A_log = torch.randn(HV, generator=gen).to(device)
    dt_bias = torch.randn(HV, generator=gen).to(device)
    pool, storage, pool_kv = padded_pool(P, False, state_dtype, device, gen)
    storage_before = storage.clone()
    ids = torch.tensor(idx, dtype=torch.int32, device=device)
    cu = torch.arange(N + 1, dtype=torch.int32, device=device)

    g, beta = vllm_ops.fused_gdn_gating(A_log, a, b, dt_bias)
    o, ret = vllm_ops.fused_recurrent_gated_delta_rule(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, inplace_final_state=True, cu_seqlens=cu,
        ssm_state_indices=ids, use_qk_l2norm_in_kernel=True, null_slot_zero=null_zero)
    assert ret is pool

    ref_g = gdn_gate(a.cpu()[None], A_log.cpu(), dt_bias.cpu())
    # The reference takes beta as rounded to bf16 by fused_gdn_gating (checked on its own elsewhere).
    assert rel_err(beta, torch.sigmoid(b.cpu()[None].double())) < 6e-3
    ref_beta = beta.cpu()
    ref_o, ref_pool, _ = ref_pool_decode(q.cpu(), k.cpu(), v.cpu(), ref_g, ref_beta, pool_kv, idx, [1] * N,
                                         null_zero=null_zero)
    tol = 6e-3
    assert rel_err(o, ref_o) < tol
    skipped = [n for n, s in enumerate(idx) if s < 0 or (null_zero and s == 0)]
    for n in skipped:
        assert (o[0, n] == 0).all(), f"padded sequence {n}: outputs must be zero"
    assert rel_err(kv(pool, False).cpu(), ref_pool) < (6e-3 if state_dtype == torch.bfloat16 else 2e-5)
    untouched = [s for s in range(P) if s not in idx or s in [idx[n] for n in skipped]]
    for s in untouched:
        assert torch.equal(storage[s].cpu(), storage_before[s].cpu()), f"slot {s} must not be written"
    assert torch.equal(storage[:, HV * K * V:].cpu(), storage_before[:, HV * K * V:].cpu()), "slot padding written"


@pytest.mark.parametrize("null_zero", [False, True])
@pytest.mark.parametrize("v_first", [False, True])
def test_vllm_spec_decode(device, gen, v_first, null_zero):
    """Speculative verify: 2-D slots [N, T_max], num_accepted_tokens picks the start slot, the
    state after every token goes to its own slot; negative per-step slots skip that write."""
    T_max, P = 4, 24
    lengths = [4, 3, 4, 2]
    idx = [[0, 1, 2, 3], [4, 5, 6, -1], [8, 9, -1, 11], [12, 13, 14, 15]]
    acc = [2, 1, 4, 0]  # 0: outside [1, T_max], the sequence is skipped
    T = sum(lengths)
    q, k, v = tokens(T, gen, torch.float32, device)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen)).to(device)
    beta = torch.rand(1, T, HV, generator=gen).to(device)
    pool, storage, pool_kv = padded_pool(P, v_first, torch.float32, device, gen)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=device)
    o, _ = libgdn.fused_recurrent_gated_delta_rule(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, inplace_final_state=True, cu_seqlens=cu,
        ssm_state_indices=torch.tensor(idx, device=device), num_accepted_tokens=torch.tensor(acc, device=device),
        use_qk_l2norm_in_kernel=True, state_v_first=v_first, null_slot_zero=null_zero)
    ref_o, ref_pool, _ = ref_pool_decode(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), pool_kv, idx, lengths,
                                         acc=acc, null_zero=null_zero)
    assert rel_err(o, ref_o) < 2e-5
    assert (o[0, 11:] == 0).all(), "skipped sequence: outputs must be zero"
    assert rel_err(kv(pool, v_first).cpu(), ref_pool) < 2e-5


def test_step_states_not_inplace(device, gen):
    """inplace_final_state=False (vLLM): the per-token states come back, the pool is only read."""
    lengths = [3, 2]
    T, P = sum(lengths), 5
    q, k, v = tokens(T, gen, torch.float32, device)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen)).to(device)
    beta = torch.rand(1, T, HV, generator=gen).to(device)
    pool, storage, pool_kv = padded_pool(P, False, torch.float32, device, gen)
    before = storage.clone()
    idx = [[4, 2, 1], [0, 3, -1]]
    o, steps = vllm_ops.fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, inplace_final_state=False,
        cu_seqlens=torch.tensor([0, 3, 5], device=device), ssm_state_indices=torch.tensor(idx, device=device),
        use_qk_l2norm_in_kernel=True)
    ref_o, _, ref_steps = ref_pool_decode(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), pool_kv, idx, lengths,
                                          inplace=False)
    assert steps.shape == (T, HV, K, V)
    assert rel_err(o, ref_o) < 2e-5
    assert rel_err(steps, ref_steps) < 2e-5
    assert torch.equal(storage.cpu(), before.cpu()), "the pool must not be written"


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("is_kda", [False, True])
def test_sglang_fused_sigmoid_gating_update(device, gen, packed, is_kda):
    """SGLang's signature: pool [P, HV, V, K], slots [N], raw a and b, o returned, pool in place."""
    N, P = 5, 8
    idx = [6, -1, 2, 0, 5]
    q, k, v = tokens(N, gen, torch.bfloat16, device)
    a = torch.randn(N, HV * K if is_kda else HV, generator=gen).to(device)
    b = torch.randn(N, HV, generator=gen).to(device)
    A_log = torch.randn(HV, generator=gen).to(device)
    dt_bias = torch.randn(HV * K if is_kda else HV, generator=gen).to(device)
    pool, storage, pool_kv = padded_pool(P, True, torch.float32, device, gen)
    if packed:
        args = dict(q=q, k=k, v=v, cu_seqlens=torch.arange(N + 1, device=device))
    else:
        args = dict(q=q.view(N, 1, H, K), k=k.view(N, 1, H, K), v=v.view(N, 1, HV, V))
    o = libgdn.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0, b=b,
        initial_state_source=pool, initial_state_indices=torch.tensor(idx, device=device),
        use_qk_l2norm_in_kernel=True, is_kda=is_kda, **args)
    if is_kda:
        ref_g = gdn_gate(a.cpu().view(1, N, HV, K), A_log.cpu(), dt_bias.cpu().view(HV, K))
    else:
        ref_g = gdn_gate(a.cpu()[None], A_log.cpu(), dt_bias.cpu())
    ref_o, ref_pool, _ = ref_pool_decode(q.cpu(), k.cpu(), v.cpu(), ref_g, torch.sigmoid(b.cpu()[None].double()),
                                         pool_kv, idx, [1] * N)
    assert o.shape == args["v"].shape
    assert rel_err(o.reshape(1, N, HV, V), ref_o) < 6e-3
    assert rel_err(kv(pool, True).cpu(), ref_pool) < 2e-5


def test_sglang_disable_state_update(device, gen):
    N, P = 3, 4
    q, k, v = tokens(N, gen, torch.float32, device)
    a, b = (torch.randn(N, HV, generator=gen).to(device) for _ in range(2))
    A_log, dt_bias = (torch.randn(HV, generator=gen).to(device) for _ in range(2))
    pool, storage, pool_kv = padded_pool(P, True, torch.float32, device, gen)
    before = storage.clone()
    o = libgdn.fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, torch.tensor([3, 1, 2], device=device),
        cu_seqlens=torch.arange(N + 1, device=device), disable_state_update=True)
    ref_o, _, _ = ref_pool_decode(q.cpu(), k.cpu(), v.cpu(), gdn_gate(a.cpu()[None], A_log.cpu(), dt_bias.cpu()),
                                  torch.sigmoid(b.cpu()[None].double()), pool_kv, [3, 1, 2], [1] * N,
                                  use_qk_l2norm=False)
    assert rel_err(o, ref_o) < 2e-5
    assert torch.equal(storage.cpu(), before.cpu())


@pytest.mark.parametrize("mode", ["decode", "spec", "steps"])
def test_vllm_fused_sigmoid_gating_update(device, gen, mode):
    """vLLM's current signature: (A_log, a, b, dt_bias, q, k, v, beta, threshold, ...) -> (o, state)."""
    if mode == "decode":
        lengths, idx, acc = [1, 1, 1], [2, 0, -1], None
    else:
        lengths, idx, acc = [2, 3], [[0, 1, 2], [3, 4, 5]], [1, 3]
    N, T, P = len(lengths), sum(lengths), 7
    q, k, v = tokens(T, gen, torch.float32, device)
    a, b = (torch.randn(T, HV, generator=gen).to(device) for _ in range(2))
    A_log, dt_bias = (torch.randn(HV, generator=gen).to(device) for _ in range(2))
    pool, storage, pool_kv = padded_pool(P, True, torch.float32, device, gen)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=device)
    # Keywords exactly as vLLM's Qwen3-Next GDN layer passes them (decode and speculative verify).
    o, ret = vllm_ops.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, initial_state=pool,
        inplace_final_state=mode != "steps", cu_seqlens=cu,
        ssm_state_indices=torch.tensor(idx, dtype=torch.int32, device=device),
        num_accepted_tokens=None if acc is None else torch.tensor(acc, dtype=torch.int32, device=device),
        use_qk_l2norm_in_kernel=True)
    ref_o, ref_pool, ref_steps = ref_pool_decode(
        q.cpu(), k.cpu(), v.cpu(), gdn_gate(a.cpu()[None], A_log.cpu(), dt_bias.cpu()),
        torch.sigmoid(b.cpu()[None].double()), pool_kv, idx, lengths, acc=acc, inplace=mode != "steps")
    assert rel_err(o, ref_o) < 2e-5
    if mode == "steps":
        assert ret.shape == (T, HV, V, K)
        assert rel_err(kv(ret, True), ref_steps) < 2e-5
    else:
        assert ret is pool
        assert rel_err(kv(pool, True).cpu(), ref_pool) < 2e-5


def test_recurrent_chunk_prefill_then_pool_decode(device, gen):
    """Prefill with chunk_gated_delta_rule writes states that decode then continues from a pool
    in the serving layout, matching one long recurrence."""
    T0, N = 50, 2
    q, k, v = (x.to(device) for x in (torch.randn(N, T0 + 1, H, K, generator=gen),
                                      torch.randn(N, T0 + 1, H, K, generator=gen),
                                      torch.randn(N, T0 + 1, HV, V, generator=gen)))
    g = F.logsigmoid(torch.randn(N, T0 + 1, HV, generator=gen)).to(device)
    beta = torch.rand(N, T0 + 1, HV, generator=gen).to(device)
    _, ht = libgdn.chunk_gated_delta_rule(q[:, :T0], k[:, :T0], v[:, :T0], g[:, :T0], beta[:, :T0],
                                          output_final_state=True, state_v_first=True,
                                          use_qk_l2norm_in_kernel=True)
    pool = torch.zeros(4, HV, V, K, device=device)
    slots = torch.tensor([3, 1], device=device)
    pool[slots] = ht
    o1, _ = libgdn.fused_recurrent_gated_delta_rule(
        q[:, T0:], k[:, T0:], v[:, T0:], g[:, T0:], beta=beta[:, T0:], initial_state=pool, ssm_state_indices=slots,
        state_v_first=True, use_qk_l2norm_in_kernel=True)
    o_all, ht_all = libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, output_final_state=True,
                                                            state_v_first=True, use_qk_l2norm_in_kernel=True)
    assert rel_err(o1, o_all[:, T0:]) < 2e-5
    assert rel_err(pool[slots], ht_all) < 2e-5


@pytest.mark.parametrize("v_first", [True, False])
def test_chunk_prefill_on_pool_matches_gather_scatter(device, gen, v_first):
    """chunk_gated_delta_rule reading and writing a vLLM-style pool (ssm_state_indices,
    has_initial_state, a padding slot, checkpoints every 64 tokens) gives bitwise what engines get
    by gathering the states, calling it, and scattering the final states back; the checkpoints are
    the final states of calls on the prefixes."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lens = [70, 0, 150, 129, 64]
    N, T = len(lens), sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
    q, k, v, g, beta = (x.to(device) for x in make_inputs(1, T, H, HV, K, V, dtype, "cpu", gen=gen))
    P, M, J = 16, 64, 3
    shape = (P, HV, V, K) if v_first else (P, HV, K, V)
    pool = torch.randn(*shape, generator=gen).to(device)
    idx = torch.tensor([5, 2, -1, 9, 0], dtype=torch.int32, device=device)
    has = torch.tensor([True, True, True, False, True], device=device)
    ck = torch.tensor([[11, 12, 13], [14, -1, -1], [1, 3, 4], [6, -1, 7], [8, 10, 15]], dtype=torch.int32,
                      device=device)
    kw = dict(use_qk_l2norm_in_kernel=True, state_v_first=v_first, cu_seqlens=cu)
    before = pool.clone()
    # vLLM's positional order (scale, initial_state, output_final_state, cu_seqlens, head_first)
    o, none = vllm_ops.chunk_gated_delta_rule(q, k, v, g, beta, None, pool, False, cu, False, True,
                                              state_v_first=v_first, ssm_state_indices=idx, has_initial_state=has,
                                              checkpoint_interval=M, checkpoint_indices=ck)
    assert none is None

    # Gather, call, scatter (the skipped sequence starts from zeros there; its outputs are dropped).
    live = idx >= 0
    h0 = torch.zeros(N, *shape[1:], device=device)
    h0[live] = before[idx[live].long()]
    h0[~has] = 0
    o_ref, ht = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
    expect = before.clone()
    expect[idx[live].long()] = ht[live]
    starts = cu.tolist()
    for n in range(N):
        rows = slice(starts[n], starts[n + 1])
        if idx[n] < 0:
            assert torch.count_nonzero(o[:, rows]) == 0
            continue
        assert torch.equal(o[:, rows], o_ref[:, rows]), f"o of sequence {n}"
        for j in range(J):
            if (j + 1) * M > lens[n] or ck[n, j] < 0:
                continue
            a, b = starts[n], starts[n] + (j + 1) * M
            _, hp = libgdn.chunk_gated_delta_rule(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b],
                                                  initial_state=h0[n:n + 1], output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True, state_v_first=v_first)
            expect[ck[n, j].long()] = hp[0]
    written = expect.ne(before).flatten(1).any(1) | torch.zeros(P, dtype=torch.bool, device=device)
    assert torch.equal(pool[~written], before[~written]), "slots that nothing writes stay as they were"
    for s in torch.nonzero(written).flatten().tolist():
        assert rel_err(pool[s], expect[s]) < (2e-5 if device == "cuda" else 1e-6), f"pool slot {s}"
        if device == "cpu":
            assert torch.equal(pool[s], expect[s]), f"pool slot {s} (bitwise on the CPU)"


def test_chunk_pool_argument_errors(device, gen):
    q, k, v, g, beta = (x.to(device) for x in make_inputs(1, 64, H, HV, K, V, torch.float32, "cpu", gen=gen))
    pool = torch.zeros(3, HV, K, V, device=device)
    idx = torch.tensor([1], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="output_final_state=False"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx,
                                      output_final_state=True)
    with pytest.raises(ValueError, match="need ssm_state_indices"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, checkpoint_interval=64)
    with pytest.raises(libgdn.GDNError, match="multiple of 64"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx,
                                      checkpoint_interval=32, checkpoint_indices=idx.view(1, 1))
    with pytest.raises(libgdn.GDNError, match="out of range"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx.cpu() + 5)
