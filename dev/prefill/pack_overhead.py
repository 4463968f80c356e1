"""pack_overhead.py - what the CUDA chunk op's strided-input packing costs: chunk_gated_delta_rule
with contiguous q, k, v against the same call with transformers' Qwen3-Next layout (v a channel
slice of a transposed [B, C, T] convolution output, unit stride on the tokens), and with q, k, v
all in that layout. Checks that the outputs agree bitwise, then times each under CUDA graph replay;
FLA's chunk_gated_delta_rule on the transformers layout beside it when FLA imports.

    PYTHONPATH=.peers/fla:python GDN_LIBRARY=build/libgdn.so python3 dev/prefill/pack_overhead.py
"""
import torch

import libgdn

try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
except ImportError:
    fla_chunk = None


def timed(fn, reps=20):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def main():
    torch.manual_seed(0)
    dev = "cuda"
    print(f"{torch.cuda.get_device_name(0)}; ms, median of 20 graph replays")
    print(f"{'shape':20s} {'contiguous':>10s} {'v transposed':>16s} {'qkv transposed':>16s} {'FLA v transposed':>16s}")
    for B, T, H, HV in ((1, 32768, 16, 32), (2, 16384, 16, 16), (1, 8192, 2, 8)):
        K = V = 128
        C = 2 * H * K + HV * V
        # transformers: conv output [B, C, T] -> transpose(1, 2) -> split channels -> reshape heads
        mixed = torch.randn(B, C, T, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        qs, ks, vs = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
        qs, ks, vs = qs.reshape(B, T, H, K), ks.reshape(B, T, H, K), vs.reshape(B, T, HV, V)
        qc, kc, vc = qs.contiguous(), ks.contiguous(), vs.contiguous()
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device=dev)) * 0.1
        beta = torch.rand(B, T, HV, device=dev, dtype=torch.bfloat16)
        h0 = torch.randn(B, HV, K, V, device=dev) * 0.1

        def run(q, k, v):
            return libgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)

        o0, s0 = run(qc, kc, vc)
        o1, s1 = run(qc, kc, vs)
        o2, s2 = run(qs, ks, vs)
        assert torch.equal(o0, o1) and torch.equal(s0, s1), "v transposed: results differ"
        assert torch.equal(o0, o2) and torch.equal(s0, s2), "qkv transposed: results differ"
        t0 = timed(lambda: run(qc, kc, vc))
        t1 = timed(lambda: run(qc, kc, vs))
        t2 = timed(lambda: run(qs, ks, vs))
        fla = "-"
        if fla_chunk is not None:
            tf = timed(lambda: fla_chunk(qc, kc, vs, g, beta, initial_state=h0, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True))
            fla = f"{tf:.3f} (ours {tf / t1:.2f}x)"
        print(f"{B}x{T} H{H}/HV{HV:<6d} {t0:10.3f} {t1:8.3f} ({t1 / t0:.2f}x) {t2:8.3f} ({t2 / t0:.2f}x) {fla:>16s}")


if __name__ == "__main__":
    main()
