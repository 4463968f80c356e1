"""What the transformers tests share: the models (Qwen3-Next, Qwen3.5), the module globals that
transformers binds its linear-attention kernels to, and binding libgdn's (or any) functions there."""

import importlib

import pytest

# The module globals transformers binds its kernels to (the FLA names, then the torch fallbacks);
# whichever the installed version has are set, before the model is built (its layers read them in
# __init__).
CHUNK_NAMES = ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule")
RECURRENT_NAMES = ("fused_recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule")

MODELS = {
    "qwen3_next": ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM",
                   # Every expert routed to (weights still from the router): no top-k choice that
                   # rounding could flip, which would swamp the kernels' share of the error.
                   dict(num_experts=4, num_experts_per_tok=4, moe_intermediate_size=128,
                        shared_expert_intermediate_size=128, decoder_sparse_step=1, norm_topk_prob=True)),
    "qwen3_5": ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {}),
}


def make_config(cls, **kw):
    """The config with the keys this transformers version knows (its configs are strict)."""
    defaults = cls()
    return cls(**{key: value for key, value in kw.items() if hasattr(defaults, key)})


def load_model(name, **config):
    """(modeling module, causal-LM class, its config from `config` and the model's own keys) of MODELS[name];
    skips the test where the installed transformers lacks the model."""
    path, config_name, lm_name, extra = MODELS[name]
    try:
        modeling = importlib.import_module(path)
    except ImportError as e:
        pytest.skip(f"this transformers has no {path}: {e}")
    if not hasattr(modeling, lm_name) or not hasattr(modeling, config_name):
        pytest.skip(f"{path} has no {lm_name} / {config_name}")
    return modeling, getattr(modeling, lm_name), make_config(getattr(modeling, config_name), **config, **extra)


def bind_kernels(monkeypatch, modeling, chunk, recurrent):
    """Sets the modeling module's kernel globals to (chunk, recurrent); fails if it has none of them."""
    bound = []
    for names, fn in ((CHUNK_NAMES, chunk), (RECURRENT_NAMES, recurrent)):
        for name in names:
            if hasattr(modeling, name):
                monkeypatch.setattr(modeling, name, fn)
                bound.append(name)
    assert any(n in bound for n in CHUNK_NAMES) and any(n in bound for n in RECURRENT_NAMES), \
        f"{modeling.__name__} has none of the kernel globals {CHUNK_NAMES + RECURRENT_NAMES}"
