"""Bad inputs raise Python exceptions that carry the library's message (naming the argument), and
nothing is written on an error."""

import ctypes
import os
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

import libgdn
import libgdn.vllm as vllm_ops
from libgdn import _capi

B, T, H, HV, K, V = 2, 8, 2, 4, 64, 64


def inputs(device, dtype=torch.float32):
    q = torch.randn(B, T, H, K, device=device, dtype=dtype)
    k = torch.randn(B, T, H, K, device=device, dtype=dtype)
    v = torch.randn(B, T, HV, V, device=device, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, HV, device=device))
    beta = torch.rand(B, T, HV, device=device)
    return q, k, v, g, beta


def test_shape_mismatch_names_the_argument(device):
    q, k, v, g, beta = inputs(device)
    with pytest.raises(libgdn.GDNInvalidArgumentError, match=r"chunk_gated_delta_rule: k: shape\[2\]"):
        libgdn.chunk_gated_delta_rule(q, k[:, :, :1], v, g, beta)
    with pytest.raises(ValueError, match=r"gate.beta: shape"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta[:, :, :2])


def test_gva_ratio(device):
    q, k, v, g, beta = inputs(device)
    with pytest.raises(ValueError, match="not a multiple"):
        libgdn.chunk_gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])


def test_unsupported_head_dim(device):
    """Head dims past the backend's own limit (CPU: 1 .. 256; CUDA: 64, 128, 256) raise, naming K."""
    q = torch.randn(1, 4, 1, 320, device=device)
    v = torch.randn(1, 4, 1, 64, device=device)
    g = torch.zeros(1, 4, 1, device=device)
    with pytest.raises(libgdn.GDNUnsupportedError, match="head dims? K = 320"):
        libgdn.chunk_gated_delta_rule(q, q, v, g, g)
    with pytest.raises(NotImplementedError):
        libgdn.chunk_gated_delta_rule(q, q, v, g, g)


def test_dtypes(device):
    q, k, v, g, beta = inputs(device)
    with pytest.raises(ValueError, match="chunk_gated_delta_rule: k is f16 but q is f32"):
        libgdn.chunk_gated_delta_rule(q, k.half(), v, g, beta)
    with pytest.raises(ValueError, match="fused_recurrent_gated_delta_rule: v is bf16 but q is f32"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v.bfloat16(), g, beta=beta)
    with pytest.raises(ValueError, match="dtype torch.int8 is not supported"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta.to(torch.int8))
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        libgdn.chunk_gated_delta_rule(q.tolist(), k, v, g, beta)
    with pytest.raises(ValueError, match="final_state_dtype"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, final_state_dtype=torch.float16)


def test_cu_seqlens_checked_on_cpu():
    q, k, v, g, beta = (x[:1] for x in inputs("cpu"))
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\] = 3 < cu_seqlens\[1\] = 5"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 5, 3, 8]))
    with pytest.raises(ValueError, match="must equal T"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 5, 7]))
    q2, k2, v2, g2, beta2 = inputs("cpu")
    with pytest.raises(ValueError, match="batch size B = 2, must be 1"):
        libgdn.chunk_gated_delta_rule(q2, k2, v2, g2, beta2, cu_seqlens=torch.tensor([0, 5, 8]))


def test_initial_state_rows(device):
    q, k, v, g, beta = inputs(device)
    h0 = torch.zeros(3, HV, K, V, device=device)
    with pytest.raises(ValueError, match=r"initial_state: shape\[0\] = 3, expected 2"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0)


def test_fla_option_checks(device):
    q, k, v, g, beta = inputs(device)
    with pytest.raises(ValueError, match="allow_neg_eigval=True requires use_beta_sigmoid_in_kernel"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="A_log must be provided"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="chunk_size"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=128)
    with pytest.raises(NotImplementedError, match="gv"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, gv=v, beta=beta)
    with pytest.raises(ValueError, match="pass beta by keyword"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta)


def test_pool_errors_write_nothing():
    q, k, v, g, beta = inputs("cpu")
    pool = torch.randn(4, HV, K, V)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"state_indices\[1\]\[0\] = 4 is out of range for a pool of 4 slots"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=pool,
                                                ssm_state_indices=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="num_accepted_tokens needs"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=pool,
                                                ssm_state_indices=torch.tensor([0, 1]),
                                                num_accepted_tokens=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="output_final_state does not apply"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=pool,
                                                ssm_state_indices=torch.tensor([0, 1]), output_final_state=True)
    with pytest.raises(ValueError, match="initial_state"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, ssm_state_indices=torch.tensor([0, 1]))
    assert torch.equal(pool, before)


def test_serving_errors(device):
    q, k, v, _, _ = inputs(device)
    a = torch.randn(B * T, HV, device=device)
    A_log = torch.zeros(HV, device=device)
    with pytest.raises(ValueError, match="a has shape"):
        libgdn.fused_sigmoid_gating_delta_rule_update(A_log, a[:5], A_log, 1.0, 20.0, q, k, v, a, None, None)
    with pytest.raises(NotImplementedError, match="target verify"):
        libgdn.fused_sigmoid_gating_delta_rule_update(A_log, a, A_log, 1.0, 20.0, q, k, v, a, None, None,
                                                      intermediate_states_buffer=a)
    with pytest.raises(ValueError, match="scale must be positive"):
        vllm_ops.fused_recurrent_gated_delta_rule(q, k, v, a.view(B, T, HV), scale=-1.0,
                                                  initial_state=torch.zeros(B, HV, K, V, device=device))
    with pytest.raises(ValueError, match="softplus_beta"):
        libgdn.fused_gdn_gating(A_log, a, a, A_log, beta=-1.0)


def test_library_not_found(monkeypatch):
    monkeypatch.setattr(_capi, "_lib", None)
    monkeypatch.setattr(_capi, "library_candidates", lambda: ["/nonexistent/libgdn.so"])
    with pytest.raises(libgdn.GDNLibraryNotFoundError, match="GDN_LIBRARY"):
        libgdn.version()


def test_struct_layout_matches_header():
    """The ctypes structs match include/gdn.h field for field (sizes and offsets from a C compiler)."""
    header = os.path.join(os.path.dirname(__file__), "..", "..", "include", "gdn.h")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not os.path.exists(header) or cc is None:
        pytest.skip("needs the checkout's include/gdn.h and a C compiler")
    structs = {"gdn_tensor": _capi.Tensor, "gdn_gate_params": _capi.GateParams, "gdn_gating_args": _capi.GatingArgs,
               "gdn_chunk_fwd_args": _capi.ChunkFwdArgs, "gdn_recurrent_fwd_args": _capi.RecurrentFwdArgs,
               "gdn_chunk_bwd_args": _capi.ChunkBwdArgs}
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "gdn.h"', "int main(void) {"]
    expected = []
    for cname, cls in structs.items():
        lines.append(f'printf("%zu\\n", sizeof({cname}));')
        expected.append(ctypes.sizeof(cls))
        for field, _ in cls._fields_:
            lines.append(f'printf("%zu\\n", offsetof({cname}, {field}));')
            expected.append(getattr(cls, field).offset)
    lines.append("return 0; }")
    tmp = os.environ.get("TMPDIR", "/tmp")
    src, exe = os.path.join(tmp, f"gdn_abi_{os.getpid()}.c"), os.path.join(tmp, f"gdn_abi_{os.getpid()}")
    with open(src, "w") as f:
        f.write("\n".join(lines))
    subprocess.run([cc, "-I", os.path.dirname(header), src, "-o", exe], check=True)
    got = [int(x) for x in subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()]
    os.remove(src)
    os.remove(exe)
    assert got == expected


def test_forward_only_warning():
    """The recurrent function and the gating helpers have no backward: they warn when autograd would
    expect one (the chunked function differentiates, test_backward.py)."""
    q, k, v, g, beta = inputs("cpu")
    q.requires_grad_(True)
    with pytest.warns(UserWarning, match="forward-only"):
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta)
    with torch.no_grad():
        libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta)
    a, A_log = torch.randn(2, 4, requires_grad=True), torch.randn(4)
    with pytest.warns(UserWarning, match="forward-only"):
        libgdn.fused_gdn_gating(A_log, a, torch.randn(2, 4), torch.randn(4))


def test_chunk_unsupported_is_not_rerun(monkeypatch, c_calls):
    """A chunk call the library declines raises GDNUnsupportedError; the package never reruns it on
    the recurrent kernel (which inputs go to the recurrent kernel is decided before any call)."""
    monkeypatch.setattr(_capi.lib(), "gdn_chunk_fwd", lambda args: _capi.GDN_ERR_UNSUPPORTED)
    q, k, v, g, beta = inputs("cpu", torch.bfloat16)
    with pytest.raises(libgdn.GDNUnsupportedError, match="chunk_gated_delta_rule"):
        libgdn.chunk_gated_delta_rule(q, k, v, g, beta)
    assert c_calls["gdn_recurrent_fwd"] == 0
