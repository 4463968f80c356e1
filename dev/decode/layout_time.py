"""layout_time.py - one-token decode in both state layouts, libgdn beside FLA, CUDA graph replay:
KV ([N, HV, K, V], FLA's and transformers' default) against VK ([N, HV, V, K], vLLM's), f32 state,
H=16, HV=32, K=V=128, q/k l2 norm in-kernel, initial state in, final state out (not in place), as
transformers' Qwen3-Next decodes. "copy" is a device copy of the state bytes (read + write once),
the floor of a one-token step.

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=build/libgdn.so \
        python3 dev/decode/layout_time.py [B ...] [KV|VK] [libgdn] [T=n] [bf16]

KV or VK: that layout only; libgdn: no FLA (an A/B of builds, one process each); T=n: n tokens a
sequence (a verify step; 1 by default); bf16: bf16 states (initial and final; the copy too), where a
peer that refuses them shows nan (FLA returns an f32 final state there).
"""
import sys

import torch
import torch.nn.functional as F

import libgdn
from fla_prefill import time_ms

H, HV, K, V = 16, 32, 128, 128

def call(f, B, kda, v_first, T, sdt):
    dev = "cuda"
    q = torch.randn(B, T, H, K, device=dev).bfloat16()
    k = torch.randn(B, T, H, K, device=dev).bfloat16()
    v = torch.randn(B, T, HV, V, device=dev).bfloat16()
    g = F.logsigmoid(torch.randn(B, T, HV, K, device=dev) if kda else torch.randn(B, T, HV, device=dev))
    beta = torch.rand(B, T, HV, device=dev).bfloat16()
    h0 = (torch.randn(B, HV, K, V, device=dev) * 0.1).to(sdt)
    if v_first:
        h0 = h0.transpose(-1, -2).contiguous()
    # libgdn returns its final state in final_state_dtype (f32 by default, as FLA): bf16 asks for bf16, else the
    # call would time a conversion of the initial state and the f32 kernel
    kw = {"final_state_dtype": sdt} if f.__module__.startswith("libgdn") else {}
    return lambda: f(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                     use_qk_l2norm_in_kernel=True, state_v_first=v_first, **kw)


def timed(fn):
    """us under graph replay; nan where the library refuses the call"""
    try:
        return time_ms(fn)[1] * 1e3
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        print("  refused:", str(e).splitlines()[0][:120])
        return float("nan")


def main():
    BS = [int(x) for x in sys.argv[1:] if x.isdigit()] or [1, 8, 64, 128, 256]
    T = int(next((a[2:] for a in sys.argv[1:] if a.startswith("T=")), 1))
    sdt = torch.bfloat16 if "bf16" in sys.argv[1:] else torch.float32
    LAYOUTS = [lay == "VK" for lay in ("KV", "VK") if lay in sys.argv[1:]] or [False, True]
    peers = [("libgdn", libgdn.fused_recurrent_gated_delta_rule, libgdn.fused_recurrent_kda)]
    try:
        if "libgdn" in sys.argv[1:]:
            raise ImportError("libgdn only (asked)")
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_gdn
        from fla.ops.kda import fused_recurrent_kda as fla_kda
        peers.append(("FLA", fla_gdn, fla_kda))
    except ImportError as e:
        print("FLA not importable:", e)

    print(f"H{H} HV{HV} K=V={K}, T={T}, {str(sdt)[6:]} state, graph replay, us; {torch.cuda.get_device_name()}")
    print(f"{'B':>4s} {'op':4s} {'layout':6s} " + " ".join(f"{n:>8s}" for n, _, _ in peers) +
          "     copy  FLA/ours  copy/ours")
    for B in BS:
        src = torch.randn(B, HV, K, V, device="cuda").to(sdt)
        dst = torch.empty_like(src)
        copy = time_ms(lambda: dst.copy_(src))[1] * 1e3
        for op in ("gdn", "kda"):
            for v_first in LAYOUTS:
                ts = [timed(call(fg if op == "gdn" else fk, B, op == "kda", v_first, T, sdt)) for _, fg, fk in peers]
                ratio = f"{ts[1] / ts[0]:8.2f}" if len(ts) > 1 else "       -"
                print(f"{B:4d} {op:4s} {'VK' if v_first else 'KV':6s} " + " ".join(f"{t:8.1f}" for t in ts) +
                      f" {copy:8.1f}  {ratio}  {copy / ts[0]:9.2f}", flush=True)


if __name__ == "__main__":
    main()
