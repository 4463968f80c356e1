"""Random small shapes on the CPU backend against tests/reference.py: the edges that hand-picked
cases miss (one sequence of one head, T = 1, chunk edges 63 / 64 / 65, varlen with empty
sequences, GVA 3x, head dims 16 .. 128) under 1, 2 and 8 library threads, through the public
functions as FLA's callers use them. Forward: GDN and KDA, chunked and recurrent, f32 / bf16 /
f64. Backward: GDN in f64 against autograd through the float64 recurrence, with the gate
precomputed or in-kernel. Each seed draws its cases from its own generator, so a failure names a
reproducible case."""

import random

import pytest
import torch

import libgdn
from libgdn import _capi
from reference import gdn_gate, l2norm, make_inputs, recurrence, rel_err

TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 1e-2}


def _lengths(rng):
    """(B, T, cu_seqlens or None): fixed length, or one row of 1-4 sequences, some empty."""
    if rng.random() < 0.3:
        lens = [rng.choice([0, 1, 5, 63, 64, 65, 70]) for _ in range(rng.randint(1, 4))]
        if sum(lens) == 0:
            lens[0] = 1
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        return 1, cu[-1], torch.tensor(cu, dtype=torch.int32)
    return rng.choice([1, 1, 2, 3]), rng.choice([1, 2, 63, 64, 65, 100]), None


def _threads(rng):
    _capi.lib().gdn_set_num_threads(rng.choice([1, 2, 8]))


@pytest.fixture(autouse=True)
def _restore_threads():
    before = _capi.lib().gdn_get_num_threads()
    yield
    _capi.lib().gdn_set_num_threads(before)


@pytest.mark.parametrize("seed", range(8))
def test_forward_random_shapes(seed):
    rng = random.Random(seed)
    bad = []
    for i in range(25):
        _threads(rng)
        kda = rng.random() < 0.3
        H, G = rng.choice([1, 1, 2]), rng.choice([1, 2, 3])
        K, V = rng.choice([16, 32, 64, 128]), rng.choice([16, 32, 64, 128])
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float64])
        B, T, cu = _lengths(rng)
        nseq = cu.shape[0] - 1 if cu is not None else B
        gen = torch.Generator().manual_seed(1000 * seed + i)
        q, k, v, g, beta = make_inputs(B, T, H, H * G, K, V, dtype, "cpu", kda=kda, gen=gen)
        h0 = 0.1 * torch.randn(nseq, H * G, K, V, generator=gen) if rng.random() < 0.5 else None
        l2 = rng.random() < 0.5
        chunked = rng.random() < 0.5
        if kda:
            fn = libgdn.chunk_kda if chunked else libgdn.fused_recurrent_kda
        else:
            fn = libgdn.chunk_gated_delta_rule if chunked else libgdn.fused_recurrent_gated_delta_rule
        # beta by keyword: FLA's fused_recurrent takes gk, gv before it
        o, ht = fn(q, k, v, g, beta=beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                   use_qk_l2norm_in_kernel=l2)
        qr, kr = (l2norm(q.double()), l2norm(k.double())) if l2 else (q, k)
        o_ref, ht_ref, _ = recurrence(qr, kr, v, g, beta, h0=h0, cu_seqlens=cu, keep_steps=False)
        errs = rel_err(o, o_ref), rel_err(ht, ht_ref)
        if max(errs) > TOL[dtype]:
            bad.append(f"case {i}: {fn.__name__} B{B} T{T} H{H} HV{H * G} K{K} V{V} {dtype} "
                       f"cu={None if cu is None else cu.tolist()} h0={h0 is not None} l2={l2}: o {errs[0]:.2e}, "
                       f"state {errs[1]:.2e}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("seed", range(4))
def test_backward_random_shapes(seed):
    rng = random.Random(100 + seed)
    bad = []
    for i in range(15):
        _threads(rng)
        H, G = rng.choice([1, 2]), rng.choice([1, 2, 3])
        HV, K, V = H * G, rng.choice([16, 32, 64]), rng.choice([16, 32, 64])
        B, T, cu = _lengths(rng)
        nseq = cu.shape[0] - 1 if cu is not None else B
        gen = torch.Generator().manual_seed(5000 + 1000 * seed + i)
        q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, torch.float64, "cpu", gen=gen)
        leaves = [q, k, v, beta.double()]
        h0 = rng.random() < 0.5
        if h0:
            leaves.append(0.1 * torch.randn(nseq, HV, K, V, generator=gen, dtype=torch.float64))
        gate_in = rng.random() < 0.3
        if gate_in:
            # A_log and dt_bias are f32 parameters in the C API: draw f32 values, so that only the
            # returned dA_log, ddt_bias (f32) carry a rounding
            leaves += [torch.randn(B, T, HV, generator=gen, dtype=torch.float64),
                       torch.rand(HV, generator=gen).double(), torch.randn(HV, generator=gen).double()]
        else:
            leaves.append(g.double())
        leaves = [x.clone().requires_grad_(True) for x in leaves]
        q, k, v, beta = leaves[:4]
        state = leaves[4] if h0 else None
        l2 = rng.random() < 0.5
        kw = dict(initial_state=state, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=l2)
        if gate_in:
            a, A_log, dt_bias = leaves[-3:]
            o, ht = libgdn.chunk_gated_delta_rule(q, k, v, a, beta, A_log=A_log, dt_bias=dt_bias,
                                                  use_gate_in_kernel=True, **kw)
            g_ref = gdn_gate(a, A_log, dt_bias)
        else:
            o, ht = libgdn.chunk_gated_delta_rule(q, k, v, leaves[-1], beta, **kw)
            g_ref = leaves[-1]
        wo = torch.randn(o.shape, generator=gen, dtype=torch.float64)
        wh = torch.randn(ht.shape, generator=gen, dtype=torch.float64)
        grads = torch.autograd.grad((o * wo).sum() + (ht * wh).sum(), leaves)
        qr, kr = (l2norm(q), l2norm(k)) if l2 else (q, k)
        o_ref, ht_ref, _ = recurrence(qr, kr, v, g_ref, beta, h0=state, cu_seqlens=cu, keep_steps=False)
        refs = torch.autograd.grad((o_ref * wo).sum() + (ht_ref * wh).sum(), leaves)
        tols = [1e-10] * len(leaves)
        if gate_in:
            tols[-2:] = [1e-6, 1e-6]
        errs = [rel_err(x, r) for x, r in zip(grads, refs)]
        if any(e > t for e, t in zip(errs, tols)):
            bad.append(f"case {i}: B{B} T{T} H{H} HV{HV} K{K} V{V} cu={None if cu is None else cu.tolist()} "
                       f"h0={h0} l2={l2} gate_in={gate_in}: " + ", ".join(f"{e:.1e}" for e in errs))
    assert not bad, "\n".join(bad)
