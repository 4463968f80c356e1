"""bwd_digest.py - one digest per shape of libgdn's chunked CUDA backward: is a change bitwise neutral?

    PYTHONPATH=python GDN_LIBRARY=build/libgdn.so python3 dev/backward/bwd_digest.py > a.txt
    PYTHONPATH=python GDN_LIBRARY=build-new/libgdn.so python3 dev/backward/bwd_digest.py > b.txt
    diff a.txt b.txt

For each shape (fixed seeds, inputs drawn on the host, so the same on every device and library):
the forward with the in-kernel L2 norm, an initial state and the final state, then one backward
(torch autograd) from fixed random cotangents of o and the final state. Prints the shape's name,
the sha256 of the concatenated raw bytes of o, the final state and every gradient (dq, dk, dv,
dg, dbeta, dh0; with the in-kernel gate da, dA_log, ddt_bias in place of dg), and each tensor's
norm. Two libraries whose backward (and forward) are bitwise equal print identical lines.
"""
import hashlib
import sys

import torch
import torch.nn.functional as F

import libgdn

# name, B, T, H, HV, K, V, cu_seqlens (None: B sequences of T tokens), in-kernel gate, dtype.
# Lengths that are not multiples of 64 give partial chunks (the cp.async and global-store paths);
# HV / H > 1 walks several value heads a CTA.
SHAPES = [
    ("b2_t1024_h4_hv4_k128_v128", 2, 1024, 4, 4, 128, 128, None, False, torch.bfloat16),
    ("b1_t2048_h2_hv8_k128_v128", 1, 2048, 2, 8, 128, 128, None, False, torch.bfloat16),
    ("varlen_empty_h2_hv4_k128_v128", 1, None, 2, 4, 128, 128, [0, 300, 300, 1000, 1064, 1500], False, torch.bfloat16),
    ("b1_t1000_h2_hv4_k128_v64", 1, 1000, 2, 4, 128, 64, None, False, torch.bfloat16),
    ("b1_t1000_h2_hv4_k64_v128", 1, 1000, 2, 4, 64, 128, None, False, torch.bfloat16),
    ("b1_t777_h2_hv4_k64_v64", 1, 777, 2, 4, 64, 64, None, False, torch.bfloat16),
    ("b2_t600_h2_hv4_k128_v128_f16", 2, 600, 2, 4, 128, 128, None, False, torch.float16),
    ("varlen_empty_gate_h2_hv4_k128_v128", 1, None, 2, 4, 128, 128, [0, 0, 257, 1024, 1300], True, torch.bfloat16),
]


def run(name, B, T, H, HV, K, V, cu_list, gate, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * scale

    cu = None
    if cu_list is not None:
        cu = torch.tensor(cu_list, dtype=torch.int64)
        B, T, N = 1, cu_list[-1], len(cu_list) - 1
    else:
        N = B
    leaves = {
        "q": draw(B, T, H, K).to(dtype),
        "k": draw(B, T, H, K).to(dtype),
        "v": draw(B, T, HV, V).to(dtype),
        "beta": torch.rand(B, T, HV, generator=gen).to(dtype),
        "h0": draw(N, HV, K, V, scale=0.5),
    }
    if gate:
        leaves["a"] = draw(B, T, HV).to(dtype)
        leaves["A_log"] = (torch.rand(HV, generator=gen) + 0.5).log()
        leaves["dt_bias"] = draw(HV)
    else:
        leaves["g"] = F.logsigmoid(draw(B, T, HV))
    do = draw(B, T, HV, V).to(dtype)
    dht = draw(N, HV, K, V)
    leaves = {n: x.cuda().requires_grad_(True) for n, x in leaves.items()}
    do, dht = do.cuda(), dht.cuda()
    kw = dict(initial_state=leaves["h0"], output_final_state=True, use_qk_l2norm_in_kernel=True,
              cu_seqlens=cu.cuda() if cu is not None else None)
    if gate:
        kw.update(use_gate_in_kernel=True, A_log=leaves["A_log"], dt_bias=leaves["dt_bias"])
    o, ht = libgdn.chunk_gated_delta_rule(leaves["q"], leaves["k"], leaves["v"], leaves["a" if gate else "g"],
                                          leaves["beta"], **kw)
    torch.autograd.backward([o, ht], [do, dht])
    torch.cuda.synchronize()
    named = [("o", o), ("ht", ht)] + [("d" + n, x.grad) for n, x in leaves.items()]
    sha = hashlib.sha256()
    norms = []
    for n, x in named:
        if x is None:
            sys.exit(f"{name}: no gradient for {n}")
        x = x.detach().contiguous().cpu()
        sha.update(x.view(torch.uint8).numpy().tobytes())
        norms.append(f"{n}={x.double().norm().item():.9e}")
    print(f"{name} {sha.hexdigest()} {' '.join(norms)}", flush=True)


def main():
    if not torch.cuda.is_available():
        sys.exit("bwd_digest.py: needs a CUDA device")
    for seed, shape in enumerate(SHAPES):
        run(*shape, seed=1000 + seed)


if __name__ == "__main__":
    main()
