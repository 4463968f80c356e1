"""The GatedDeltaNet layer: prefill then token-by-token decode equals one prefill of the whole
sequence, and the layer with libgdn's core equals the layer with the float64 reference core."""

import pytest
import torch

import libgdn
from reference import gdn_gate, kv, recurrence, rel_err, to_layout


def make_layer(device, dtype, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(hidden_size=256, expand_v=1, head_dim=64, num_heads=2, num_v_heads=4)
    cfg.update(kw)
    return libgdn.GatedDeltaNet(**cfg).to(device=device, dtype=dtype).eval()


def reference_core(layer):
    """The layer's core computed by tests/reference.py in float64 (same arguments as _core)."""
    def core(q, k, v, a, b, state, output_final_state):
        g = gdn_gate(a.float().cpu(), layer.A_log.cpu(), layer.dt_bias.cpu())
        beta = torch.sigmoid(b.double().cpu()) * (2 if layer.allow_neg_eigval else 1)
        h0 = kv(state.cpu(), True) if state is not None else None
        o, final, _ = recurrence(q.cpu(), k.cpu(), v.cpu(), g, beta, h0=h0, use_qk_l2norm=True)
        return o.to(device=q.device, dtype=q.dtype), to_layout(final, True).float().to(q.device)
    return core


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_then_decode(device, dtype):
    layer = make_layer(device, dtype)
    B, T0, steps = 2, 40, 5
    x = torch.randn(B, T0 + steps, layer.hidden_size, device=device, dtype=dtype)
    with torch.no_grad():
        full, _ = layer(x)
        y0, cache = layer(x[:, :T0], use_cache=True)
        assert cache["recurrent_state"].shape == (B, layer.num_v_heads, layer.head_v_dim, layer.head_k_dim)
        ys = [y0]
        for t in range(T0, T0 + steps):
            y, cache = layer(x[:, t:t + 1], cache=cache, use_cache=True)
            ys.append(y)
    err = rel_err(torch.cat(ys, dim=1), full)
    assert err < (2e-5 if dtype == torch.float32 else 2e-2), f"prefill+decode vs prefill: {err:.3e}"


def test_layer_core_matches_reference(device):
    layer = make_layer(device, torch.float32, allow_neg_eigval=True)
    x = torch.randn(2, 30, layer.hidden_size, device=device)
    with torch.no_grad():
        y, cache = layer(x, use_cache=True)
        y1, cache1 = layer(x[:, :1], cache=cache, use_cache=True)
        layer._core = reference_core(layer)
        y_ref, cache_ref = layer(x, use_cache=True)
        y1_ref, cache1_ref = layer(x[:, :1], cache=cache_ref, use_cache=True)
    assert rel_err(y, y_ref) < 2e-5
    assert rel_err(cache["recurrent_state"], cache_ref["recurrent_state"]) < 2e-5
    assert rel_err(y1, y1_ref) < 2e-5
    assert rel_err(cache1["recurrent_state"], cache1_ref["recurrent_state"]) < 2e-5
