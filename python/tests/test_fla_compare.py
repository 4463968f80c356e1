"""Side by side with FLA itself (when importable, on CUDA): same inputs through FLA and libgdn,
each one's relative RMS error against the float64 reference (computed on the GPU in float64), and
the median time of each. libgdn must be no less accurate than FLA (within 2x, or under the
absolute bound). The table is printed and, with GDN_REPORT_DIR set, written to fla_compare.txt.
GDN_FLA_FIRST_CONFIG=1 limits FLA's autotuners to their first config (FLA's times are then not its best)."""

import os

import pytest
import torch
import torch.nn.functional as F

import libgdn
from conftest import DEVICES, import_fla_gdn
from libgdn import _capi
from reference import gdn_gate, kv, recurrence, rel_err, to_layout

if "cuda" not in DEVICES:
    pytest.skip("needs a GPU and the CUDA backend", allow_module_level=True)
fla_gdn = import_fla_gdn()
if fla_gdn is None:
    pytest.skip("FLA (fla.ops.gated_delta_rule) does not import", allow_module_level=True)

ROWS = []
ABS_TOL = 6e-3  # bf16 inputs and outputs (FLA's own tests accept 5e-3)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    lines = [f"{'case':42s} {'ours o':>9s} {'FLA o':>9s} {'ours ht':>9s} {'FLA ht':>9s} {'ours ms':>8s} {'FLA ms':>8s}"]
    for r in ROWS:
        lines.append(f"{r[0]:42s} {r[1]:9.2e} {r[2]:9.2e} {r[3]:9.2e} {r[4]:9.2e} {r[5]:8.3f} {r[6]:8.3f}")
    text = "\n".join(lines)
    print("\nlibgdn vs FLA (relative RMS error against float64; median time)\n" + text)
    if os.environ.get("GDN_REPORT_DIR"):
        with open(os.path.join(os.environ["GDN_REPORT_DIR"], "fla_compare.txt"), "w") as f:
            f.write(text + "\n")


def median_ms(fn, reps=10):
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def compare(name, ours, fla, ref_o, ref_h, v_first):
    try:
        o, h = ours()
    except libgdn.GDNUnsupportedError as e:
        if e.status == _capi.GDN_ERR_NOT_IMPLEMENTED:
            pytest.skip(f"not implemented on CUDA yet: {e}")
        raise
    fo, fh = fla()
    row = (name, rel_err(o, ref_o), rel_err(fo, ref_o), rel_err(kv(h, v_first), ref_h),
           rel_err(kv(fh, v_first), ref_h), median_ms(ours), median_ms(fla))
    ROWS.append(row)
    print(f"\n{row[0]}: ours o {row[1]:.2e} FLA o {row[2]:.2e} ours ht {row[3]:.2e} FLA ht {row[4]:.2e} "
          f"ours {row[5]:.3f} ms FLA {row[6]:.3f} ms", flush=True)
    assert row[1] <= max(2 * row[2], ABS_TOL), f"{name}: o error {row[1]:.2e} vs FLA {row[2]:.2e}"
    assert row[3] <= max(2 * row[4], ABS_TOL), f"{name}: state error {row[3]:.2e} vs FLA {row[4]:.2e}"


@pytest.mark.parametrize("v_first", [False, True])
def test_recurrent_decode_vs_fla(v_first):
    N, H, HV, K, V = 64, 4, 8, 128, 128
    dev = "cuda"
    q = torch.randn(N, 1, H, K, device=dev).bfloat16()
    k = torch.randn(N, 1, H, K, device=dev).bfloat16()
    v = torch.randn(N, 1, HV, V, device=dev).bfloat16()
    g = F.logsigmoid(torch.randn(N, 1, HV, device=dev))
    beta = torch.rand(N, 1, HV, device=dev)
    h0 = torch.randn(N, HV, K, V, device=dev) * 0.3
    kw = dict(initial_state=to_layout(h0, v_first), output_final_state=True, use_qk_l2norm_in_kernel=True,
              state_v_first=v_first)
    ref_o, ref_h, _ = recurrence(q, k, v, g, beta, h0=h0, use_qk_l2norm=True, keep_steps=False)
    compare(f"recurrent decode N{N} bf16 {'VK' if v_first else 'KV'}",
            lambda: libgdn.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw),
            lambda: fla_gdn.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw), ref_o, ref_h, v_first)


CHUNK_CASES = [
    # name, B, T, H, HV, K, V, cu_seqlens, options
    # One head-dim pair, since each new shape costs FLA a round of Triton compiles on the device.
    ("chunk bf16 B2 T1024 H4 K128 h0", 2, 1024, 4, 4, 128, 128, None, dict(h0=True)),
    ("chunk bf16 GVA varlen gate-in-kernel vfirst", 1, 1500, 2, 8, 128, 128, [0, 300, 301, 1024, 1500],
     dict(gate_in_kernel=True, v_first=True)),
]


@pytest.mark.parametrize("case", CHUNK_CASES, ids=[c[0] for c in CHUNK_CASES])
def test_chunk_vs_fla(case):
    name, B, T, H, HV, K, V, cu, opt = case
    dev = "cuda"
    q = torch.randn(B, T, H, K, device=dev).bfloat16()
    k = torch.randn(B, T, H, K, device=dev).bfloat16()
    v = torch.randn(B, T, HV, V, device=dev).bfloat16()
    beta_logits = torch.randn(B, T, HV, device=dev)
    N = len(cu) - 1 if cu else B
    v_first = opt.get("v_first", False)
    h0 = torch.randn(N, HV, K, V, device=dev) * 0.3 if opt.get("h0") else None
    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, output_final_state=True,
              state_v_first=v_first)
    if cu:
        kw["cu_seqlens"] = torch.tensor(cu, device=dev, dtype=torch.long)
    if h0 is not None:
        kw["initial_state"] = to_layout(h0, v_first)
    if opt.get("gate_in_kernel"):
        a = torch.randn(B, T, HV, device=dev)
        A_log, dt_bias = torch.rand(HV, device=dev) * 2 - 1, torch.randn(HV, device=dev)
        gate, ref_g = a, gdn_gate(a, A_log, dt_bias)
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    else:
        gate = F.logsigmoid(torch.randn(B, T, HV, device=dev))
        ref_g = gate
    ref_o, ref_h, _ = recurrence(q, k, v, ref_g, torch.sigmoid(beta_logits.double()), h0=h0, cu_seqlens=cu,
                                 use_qk_l2norm=True, keep_steps=False)
    compare(name, lambda: libgdn.chunk_gated_delta_rule(q, k, v, gate, beta_logits, **kw),
            lambda: fla_gdn.chunk_gated_delta_rule(q, k, v, gate, beta_logits, **kw), ref_o, ref_h, v_first)
