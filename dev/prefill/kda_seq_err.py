"""Per-sequence final-state error of libgdn.chunk_kda and FLA's chunk_kda against float64, for
fla_kda_prefill.py's varlen accuracy case (lengths 700, 1, 64, 2000, 129; safe gate), 6 seeds;
also the same sequences as separate calls (B = 1, no cu_seqlens) for libgdn.

    PYTHONPATH=.peers/fla:python:bench:dev/prefill GDN_LIBRARY=... python3 dev/prefill/kda_seq_err.py
(bench/results/kda-prefill-vs-fla-h200.txt, part 3)"""
import torch
import libgdn
from fla.ops.kda import chunk_kda as fla_kda
from fla_kda_prefill import make_inputs, reference_f64, D
from fla_prefill import rel

lens = [700, 1, 64, 2000, 129]
cu_cpu = torch.tensor([0] + lens).cumsum(0)
cu = cu_cpu.to(device="cuda", dtype=torch.int32)
T, H = int(cu_cpu[-1]), 4
acc = {"ours": [0.0] * 5, "fla": [0.0] * 5, "ours_sep": [0.0] * 5}
tot = {"ours": 0.0, "fla": 0.0}
seeds = 6
for seed in range(seeds):
    (q, k, v, g, beta), kw, g64 = make_inputs(1, T, H, "safe", seed=T + H + 1000 * seed)
    ref_o, ref_S = reference_f64(q, k, v, g64, beta, D ** -0.5, cu_cpu)
    oo, os_ = libgdn.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, **kw)
    fo, fs = fla_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, **kw)
    tot["ours"] += rel(os_, ref_S) / seeds
    tot["fla"] += rel(fs, ref_S) / seeds
    for n in range(5):
        a, b = int(cu_cpu[n]), int(cu_cpu[n + 1])
        acc["ours"][n] += rel(os_[n], ref_S[n]) / seeds
        acc["fla"][n] += rel(fs[n], ref_S[n]) / seeds
        args = [x[:, a:b].contiguous() for x in (q, k, v, g, beta)]
        _, s1 = libgdn.chunk_kda(*args, **kw)
        acc["ours_sep"][n] += rel(s1[0], ref_S[n]) / seeds
    print(f"seed {seed}: ours {rel(os_, ref_S):.3e} fla {rel(fs, ref_S):.3e}; norms "
          + " ".join(f"{ref_S[n].norm().item():.2f}" for n in range(5)), flush=True)
print(f"mean over {seeds} seeds: ours {tot['ours']:.3e} fla {tot['fla']:.3e}")
print("seq len  " + " ".join(f"{x:>10s}" for x in acc))
for n in range(5):
    print(f"{lens[n]:7d}  " + " ".join(f"{acc[x][n]:10.3e}" for x in acc))
