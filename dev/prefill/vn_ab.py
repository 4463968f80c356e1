"""A/B for Vn's beta diagonal in f32: per library (TAG), GDN and KDA prefill graph-replay times at
issue 16 / 18 shapes, and errors against float64 (GDN: fla_prefill's accuracy cases and a varlen
case ending in 1-token chunks; KDA: fla_kda_prefill's cases, seeds 0-2, beside FLA's). One process
per build: GDN_LIBRARY and PYTHONPATH pick it. Prints 'TAG kind name value' lines.

    PYTHONPATH=.peers/fla:python:bench:dev/prefill python3 dev/prefill/vn_ab.py TAG time|acc
(bench/results/kda-prefill-vs-fla-h200.txt, part 4: two builds, interleaved, two rounds each)"""
import sys
import torch
import libgdn
import fla_prefill as gp
import fla_kda_prefill as kp
from fla_prefill import time_ms, rel

tag, what = sys.argv[1], sys.argv[2]
D = 128
if what == "time":
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(200):
        x @ x
    torch.cuda.synchronize()
    for name, B, T, H, HV, nseq, fixed in gp.SHAPES[:5]:
        (q, k, v, g, beta), kw, _, _ = gp.shape_inputs(B, T, H, HV, nseq, fixed)
        e, gr = time_ms(lambda: libgdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw))
        print(f"{tag} t_gdn {name} {gr:.4f}", flush=True)
    for name, B, T, H, nseq, gate in kp.SHAPES:
        args, kw, _ = kp.shape_inputs(B, T, H, nseq, gate)
        e, gr = time_ms(lambda: libgdn.chunk_kda(*args, **kw))
        print(f"{tag} t_kda {name} {gr:.4f}", flush=True)
else:
    for T, H, HV, lens in ((8192, 2, 8, None), (16384, 1, 4, None), (0, 2, 8, [700, 1, 64, 2000, 129])):
        cu = cu_cpu = None
        if lens:
            cu_cpu = torch.tensor([0] + lens).cumsum(0)
            T = int(cu_cpu[-1])
            cu = cu_cpu.cuda()
        for seed in range(2):
            q, k, v, g, beta = gp.make_inputs(1, T, H, HV, seed=T + seed)
            if cu is None:
                ref_o, ref_S = gp.reference_f64(q, k, v, g, beta, D ** -0.5)
            else:
                ref_o = torch.empty(1, T, HV, D, dtype=torch.float64, device="cuda")
                ref_S = []
                for n in range(len(lens)):
                    a, b = int(cu_cpu[n]), int(cu_cpu[n + 1])
                    o1, s1 = gp.reference_f64(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], D ** -0.5)
                    ref_o[:, a:b] = o1
                    ref_S.append(s1.reshape(HV, D, D))
                ref_S = torch.stack(ref_S)
            oo, os_ = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
            nm = f"T{T}_H{H}_HV{HV}{'_varlen' if lens else ''}_s{seed}"
            print(f"{tag} e_gdn {nm} o {rel(oo, ref_o):.4e} S {rel(os_.reshape(ref_S.shape), ref_S):.4e}", flush=True)
    print(kp.accuracy(3).replace("\n", f"\n{tag} kda_acc "), flush=True)
