"""Training transformers' Qwen3-Next (and Qwen3.5, where the installed transformers has it) on libgdn,
on the CPU in float32: a small random model whose linear-attention kernels are bound to libgdn's
functions through the modeling module's globals, trained for a few Adam steps on a language-modelling
loss, against the same model (same weights, same data) on transformers' own torch kernels
(torch_chunk_gated_delta_rule, whose backward is autograd's). The losses must agree step by step, the
model must train, and every linear-attention layer's backward must run in libgdn (gdn_chunk_bwd).
Needs transformers (the GPU machine has it; CI does not, where test_backward.py's training loop
against the float64 reference core runs instead)."""

import inspect

import pytest
import torch

import libgdn
from transformers_models import MODELS, bind_kernels, load_model

pytest.importorskip("transformers")

# Sequences of 100 tokens: a full chunk of 64 and a partial one; GVA (4 value heads over 2 key heads).
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
              num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
              max_position_embeddings=256, initializer_range=0.05,
              layer_types=["linear_attention", "linear_attention", "full_attention"])
BATCH, T, STEPS = 2, 100, 8
LINEAR_LAYERS = CONFIG["layer_types"].count("linear_attention")
# transformers versions that import FLA's gated RMS norm when FLA is importable build it on CUDA; set
# to None, both models use transformers' torch norm. (Other fast paths are functions that keep a torch
# fallback, or are None already, where the layer falls back to torch itself.)
FAST_PATH_GLOBALS = ("FusedRMSNormGated",)


def train(modeling, lm_cls, config, state, tokens, monkeypatch, chunk, recurrent):
    """The losses of STEPS Adam steps from `state` on `tokens` with the kernel globals (chunk, recurrent)."""
    bind_kernels(monkeypatch, modeling, chunk, recurrent)
    model = lm_cls(config).float()
    model.load_state_dict(state)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", list(MODELS))
def test_training_matches_transformers(name, monkeypatch, c_calls):
    modeling, lm_cls, config = load_model(name, **CONFIG)
    for glob in FAST_PATH_GLOBALS:
        if hasattr(modeling, glob):
            monkeypatch.setattr(modeling, glob, None)

    torch.manual_seed(0)
    state = {k: v.clone() for k, v in lm_cls(config).float().state_dict().items()}
    tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(1))

    # transformers versions that route the torch kernels to FLA's when FLA is importable wrap them;
    # unwrapped, they are the torch reference.
    ref = train(modeling, lm_cls, config, state, tokens, monkeypatch,
                inspect.unwrap(modeling.torch_chunk_gated_delta_rule),
                inspect.unwrap(modeling.torch_recurrent_gated_delta_rule))
    assert not c_calls, f"the torch run called libgdn: {dict(c_calls)}"
    ours = train(modeling, lm_cls, config, state, tokens, monkeypatch,
                 libgdn.chunk_gated_delta_rule, libgdn.fused_recurrent_gated_delta_rule)
    assert c_calls["gdn_chunk_fwd"] == STEPS * LINEAR_LAYERS and c_calls["gdn_chunk_bwd"] == STEPS * LINEAR_LAYERS, \
        f"every linear-attention layer's forward and backward run in libgdn: {dict(c_calls)}"
    print(f"\n{name}: losses libgdn {['%.6f' % x for x in ours]}\n{' ' * len(name)}  torch  {['%.6f' % x for x in ref]}")
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert abs(a - b) <= 1e-4 * abs(b), f"{name} step {i}: loss {a:.8f} on libgdn vs {b:.8f} on transformers' torch"
    assert ours[-1] < ours[0], f"{name}: the model does not train ({ours[0]:.4f} -> {ours[-1]:.4f})"
