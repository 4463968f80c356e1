"""transformers' Qwen3-Next (and Qwen3.5, where the installed transformers has it) running unpatched
on libgdn: a small random model whose linear-attention kernels are bound to libgdn's functions
through the modeling module's globals and nothing else; a prefill of two prompts of several hundred
tokens, then greedy decode steps with the model's cache.

Logits are compared with the same weights in float32 on transformers' own torch kernels (the
oracle), as relative RMS error. The bar: libgdn's error (bf16 model) is at most FLA's (bf16, same
weights; within 5 %, since the two differ only by rounding inside the kernels and the rest of the
bf16 model dominates the error), or, where FLA does not run, at most 1.25x that of transformers'
torch kernels on the bf16 model. The calls into the C library are counted: the prefill runs
gdn_chunk_fwd once per linear-attention layer and never the recurrent kernel.
The numbers go to $GDN_REPORT_DIR/transformers.txt when set. Needs CUDA and transformers."""

import os
import time

import pytest
import torch

import libgdn
from conftest import DEVICES, import_fla_gdn
from transformers_models import MODELS, bind_kernels, load_model

if "cuda" not in DEVICES:
    pytest.skip("needs a GPU and the CUDA backend", allow_module_level=True)
pytest.importorskip("transformers")

CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=256, linear_num_key_heads=4, linear_num_value_heads=8,
              linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
              max_position_embeddings=1024, initializer_range=0.05,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
BATCH, PROMPT, STEPS = 2, 300, 4
LINEAR_LAYERS = CONFIG["layer_types"].count("linear_attention")
ROWS = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    head = (f"{'model':11s} {'kernels':22s} {'prefill err':>11s} {'decode err':>11s} {'all err':>9s} "
            f"{'chunk calls':>11s} {'rec. calls':>10s} {'s':>6s}")
    text = "\n".join([head] + ROWS)
    print(f"\ntransformers on libgdn: logits' relative RMS error against the float32 torch oracle "
          f"(batch {BATCH}, prompt {PROMPT}, {STEPS} decode steps)\n{text}")
    if os.environ.get("GDN_REPORT_DIR"):
        with open(os.path.join(os.environ["GDN_REPORT_DIR"], "transformers.txt"), "w") as f:
            f.write(text + "\n")


def build(monkeypatch, modeling, lm_cls, config, state, chunk, recurrent, dtype):
    """The model with its kernel globals set to (chunk, recurrent) and the given weights."""
    bind_kernels(monkeypatch, modeling, chunk, recurrent)
    with torch.device("cuda"):
        model = lm_cls(config)
    model.load_state_dict(state)
    return model.to(dtype).eval()


@torch.inference_mode()
def run(model, prompt, tokens):
    """Logits of the prefill [B, PROMPT, vocab] and of each decode step fed `tokens` [B, STEPS]
    (teacher forcing, so that every implementation decodes the same tokens), as float32."""
    out = model(input_ids=prompt, use_cache=True)
    logits = [out.logits.float()]
    cache = out.past_key_values
    for t in range(tokens.shape[1]):
        out = model(input_ids=tokens[:, t:t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits.append(out.logits.float())
    torch.cuda.synchronize()
    return logits


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def errors(logits, oracle):
    prefill = rel(logits[0], oracle[0])
    decode = rel(torch.cat(logits[1:], 1), torch.cat(oracle[1:], 1))
    every = rel(torch.cat([x.flatten() for x in logits]), torch.cat([x.flatten() for x in oracle]))
    return prefill, decode, every


@pytest.mark.parametrize("name", list(MODELS))
def test_model_on_libgdn(name, monkeypatch, c_calls):
    fla = import_fla_gdn()  # before transformers imports it, so that GDN_FLA_FIRST_CONFIG applies
    modeling, lm_cls, config = load_model(name, **CONFIG)
    torch_chunk = getattr(modeling, "torch_chunk_gated_delta_rule")
    torch_recurrent = getattr(modeling, "torch_recurrent_gated_delta_rule")

    torch.manual_seed(0)
    with torch.device("cuda"):
        state = {k: v.clone() for k, v in lm_cls(config).state_dict().items()}
    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, CONFIG["vocab_size"], (BATCH, PROMPT), device="cuda", generator=gen)

    t0 = time.time()
    oracle_model = build(monkeypatch, modeling, lm_cls, config, state, torch_chunk, torch_recurrent, torch.float32)
    with torch.inference_mode():  # the oracle's greedy tokens, fed to every implementation
        out = oracle_model(input_ids=prompt, use_cache=True)
        tokens, cache, nxt = [], out.past_key_values, out.logits[:, -1].argmax(-1)
        for _ in range(STEPS):
            tokens.append(nxt)
            out = oracle_model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
    tokens = torch.stack(tokens, 1)
    oracle = run(oracle_model, prompt, tokens)
    del oracle_model
    ROWS.append(f"{name:11s} {'torch f32 (oracle)':22s} {0:11.2e} {0:11.2e} {0:9.2e} {'-':>11s} {'-':>10s} "
                f"{time.time() - t0:6.1f}")

    results = {}
    runs = [("torch bf16", torch_chunk, torch_recurrent)]
    if fla is not None:
        runs.append(("FLA bf16", fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule))
    runs.append(("libgdn bf16", libgdn.chunk_gated_delta_rule, libgdn.fused_recurrent_gated_delta_rule))
    for label, chunk, recurrent in runs:
        t0 = time.time()
        model = build(monkeypatch, modeling, lm_cls, config, state, chunk, recurrent, torch.bfloat16)
        c_calls.clear()
        try:
            with torch.inference_mode():
                out = model(input_ids=prompt, use_cache=True)
            torch.cuda.synchronize()
            prefill_calls = dict(c_calls)
            logits = run(model, prompt, tokens)
        except Exception as e:  # noqa: BLE001 - FLA may fail to compile here; libgdn must not
            if label != "FLA bf16":
                raise
            ROWS.append(f"{name:11s} {label:22s} failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        total_calls = dict(c_calls)
        results[label] = errors(logits, oracle)
        ROWS.append(f"{name:11s} {label:22s} {results[label][0]:11.2e} {results[label][1]:11.2e} "
                    f"{results[label][2]:9.2e} {total_calls.get('gdn_chunk_fwd', 0):11d} "
                    f"{total_calls.get('gdn_recurrent_fwd', 0):10d} {time.time() - t0:6.1f}")
        if label == "libgdn bf16":
            # One prefill in `out` above, then run(): a prefill and STEPS decode steps.
            assert prefill_calls == {"gdn_chunk_fwd": LINEAR_LAYERS}, \
                f"the prefill must run libgdn's chunk kernel once per linear-attention layer: {prefill_calls}"
            assert total_calls.get("gdn_chunk_fwd", 0) + total_calls.get("gdn_recurrent_fwd", 0) == \
                LINEAR_LAYERS * (2 + STEPS), f"every linear-attention call runs on libgdn: {total_calls}"
        else:
            assert not c_calls, f"{label} called libgdn: {dict(c_calls)}"
        del model

    ours = results["libgdn bf16"][2]
    if "FLA bf16" in results:
        bar, against = 1.05 * results["FLA bf16"][2], "1.05x FLA's"
    else:
        bar, against = 1.25 * results["torch bf16"][2], "1.25x transformers' torch kernels in bf16"
    assert ours <= bar, f"{name}: libgdn's logits error {ours:.3e} exceeds {against} ({bar:.3e})"
