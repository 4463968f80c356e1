#!/usr/bin/env python3
"""kda_bits.py - whether two builds of the library give chunk_kda (or, with --gdn,
chunk_gated_delta_rule) the same bits: run once per library with the same file; the first run
saves its outputs, the second compares with them. For kernel changes meant to keep every rounding
(a reordered loop, shared subexpressions).

    GDN_LIBRARY=base/libgdn.so python3 dev/prefill/kda_bits.py [--gdn] /tmp/kda_bits.pt
    GDN_LIBRARY=new/libgdn.so  python3 dev/prefill/kda_bits.py [--gdn] /tmp/kda_bits.pt

Cases: K = V = 128 and 64; safe gate from raw bf16 and f32 inputs, the softplus gate, precomputed
g with extreme values; fixed length (with an initial state) and varlen; H = 4 (context
parallelism at T = 8192) and 32.
--gdn cases: K = V = 128 and 64; value heads per key head 1, 3 and 4 (chunk_prep's grouped
instance), precomputed g (with extreme values) and the in-kernel gate; fixed length and varlen;
context parallelism (1 x 8192, H = 2, HV = 8) and a saturated grid (2 x 4096, H = 16, HV = 64).
"""
import os
import sys

import torch
import torch.nn.functional as F

import libgdn


def with_extreme(g):
    """g with every 7th log decay replaced, in turn, by -1e4, -60, -15, -3, -0.5, -1e-4 and 0."""
    cyc = torch.tensor([-1e4, -60.0, -15.0, -3.0, -0.5, -1e-4, 0.0], device="cuda")
    idx = torch.arange(g.numel(), device="cuda").view(g.shape)
    return torch.where(idx % 7 == 0, cyc[(idx // 7) % 7], g)


def drawer(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rn(*s, dt=torch.bfloat16):
        return torch.randn(*s, device="cuda", generator=gen).to(dt)

    return gen, rn


def cases():
    gen, rn = drawer(7)
    for D, T, H, gate, varlen in [(128, 1000, 32, "safe16", False), (128, 8192, 4, "safe16", False),
                                  (128, 777, 8, "safe32", True), (64, 900, 12, "softplus", False),
                                  (128, 600, 4, "g_extreme", True), (64, 513, 4, "g", True)]:
        q, k, v = rn(1, T, H, D), rn(1, T, H, D), rn(1, T, H, D)
        beta = rn(1, T, H, dt=torch.float32).sigmoid()
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
        if varlen:
            cu = torch.tensor([0, T // 5, T // 5, T // 2 + 3, T], device="cuda", dtype=torch.int32)
            kw["cu_seqlens"] = cu
            kw["initial_state"] = rn(4, H, D, D, dt=torch.float32)
        else:
            kw["initial_state"] = rn(1, H, D, D, dt=torch.float32)
        if gate.startswith("safe") or gate == "softplus":
            g = rn(1, T, H, D, dt=torch.bfloat16 if gate == "safe16" else torch.float32)
            kw.update(use_gate_in_kernel=True, A_log=torch.rand(H, device="cuda", generator=gen),
                      dt_bias=rn(H * D, dt=torch.float32))
            if gate.startswith("safe"):
                kw.update(safe_gate=True, lower_bound=-5.0)
        else:
            g = F.logsigmoid(rn(1, T, H, D, dt=torch.float32))
            if gate == "g_extreme":
                g = with_extreme(g)
        name = f"D{D}_T{T}_H{H}_{gate}{'_varlen' if varlen else ''}"
        o, s = libgdn.chunk_kda(q, k, v, g, beta, **kw)
        yield name, o, s


def gdn_cases():
    gen, rn = drawer(11)

    for D, B, T, H, HV, gate, varlen in [(128, 2, 1000, 4, 16, "g", False), (128, 1, 8192, 2, 8, "g", False),
                                         (128, 1, 777, 8, 16, "raw", True), (64, 1, 900, 4, 12, "g", False),
                                         (128, 1, 600, 4, 4, "g_extreme", True), (64, 1, 513, 2, 4, "raw", True),
                                         (128, 2, 4096, 16, 64, "g", False)]:
        q, k, v = rn(B, T, H, D), rn(B, T, H, D), rn(B, T, HV, D)
        beta = rn(B, T, HV, dt=torch.float32).sigmoid()
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
        if varlen:
            kw["cu_seqlens"] = torch.tensor([0, T // 5, T // 5, T // 2 + 3, T], device="cuda", dtype=torch.int32)
            kw["initial_state"] = rn(4, HV, D, D, dt=torch.float32)
        else:
            kw["initial_state"] = rn(B, HV, D, D, dt=torch.float32)
        if gate == "raw":
            g = rn(B, T, HV)
            kw.update(use_gate_in_kernel=True, A_log=torch.rand(HV, device="cuda", generator=gen),
                      dt_bias=rn(HV, dt=torch.float32))
        else:
            g = F.logsigmoid(rn(B, T, HV, dt=torch.float32))
            if gate == "g_extreme":
                g = with_extreme(g)
        name = f"gdn_D{D}_B{B}_T{T}_H{H}_HV{HV}_{gate}{'_varlen' if varlen else ''}"
        o, s = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
        yield name, o, s


def main():
    gdn = "--gdn" in sys.argv
    path = [a for a in sys.argv[1:] if a != "--gdn"][0]
    got = {name: (o.cpu(), s.cpu()) for name, o, s in (gdn_cases() if gdn else cases())}
    if not os.path.exists(path):
        torch.save(got, path)
        print(f"saved {len(got)} cases to {path}")
        return
    ref = torch.load(path)
    bad = 0
    for name, (o, s) in got.items():
        ro, rs = ref[name]
        same = torch.equal(o.view(torch.int16), ro.view(torch.int16)) and torch.equal(s.view(torch.int32), rs.view(torch.int32))
        bad += not same
        print(f"{name:32s} {'same bits' if same else 'DIFFERENT'}"
              + ("" if same else f" (o max diff {(o.float() - ro.float()).abs().max():.3e})"))
    print(f"{len(got) - bad} of {len(got)} cases bitwise equal")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
