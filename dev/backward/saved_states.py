"""saved_states.py - what saving the chunk states in the forward costs and what it saves in the
backward (gdn_chunk_fwd_args.saved_states, issue 17), at the benchmark shapes, one process.

    PYTHONPATH=python:bench:.peers/fla GDN_LIBRARY=build/libgdn.so python3 dev/backward/saved_states.py

Per shape (bf16, K = V = 128, L2 norm, g = logsigmoid(randn), no states), CUDA-event medians of 20
eager calls of the library's ops (libgdn._kernels, no autograd): the forward without and with
saved states, the backward recomputing the states and reading the saved ones; then the sums that
training pays (forward + backward) both ways.
"""
import torch
import torch.nn.functional as F

from libgdn import _kernels
from fla_prefill import time_ms

SHAPES = [("B2_T16384_H16_HV16", 2, 16384, 16, 16), ("B1_T32768_H16_HV32", 1, 32768, 16, 32),
          ("B1_T8192_H2_HV8", 1, 8192, 2, 8)]


def main():
    torch.manual_seed(0)
    rows = []
    for name, B, T, H, HV in SHAPES:
        q = torch.randn(B, T, H, 128, device="cuda").bfloat16()
        k = torch.randn(B, T, H, 128, device="cuda").bfloat16()
        v = torch.randn(B, T, HV, 128, device="cuda").bfloat16()
        g = F.logsigmoid(torch.randn(B, T, HV, device="cuda"))
        beta = torch.rand(B, T, HV, device="cuda").bfloat16()
        do = torch.randn_like(v)

        def fwd(save):
            return _kernels.chunk_fwd(q, k, v, g, None, None, None, beta, 0, 0.0, False, False, 0.0, True, None,
                                      False, None, False, torch.float32, save, "saved_states.py")

        saved = fwd(True)[2]

        def bwd(s):
            return _kernels.chunk_grads(q, k, v, g, None, None, None, beta, False, False, 0.0, True, None, False,
                                        None, do, None, "saved_states.py", s)

        a, b = bwd(None), bwd(saved)
        err = max((x.float() - y.float()).norm().item() / y.float().norm().item()
                  for x, y in zip(b, a) if x is not None)
        t = [time_ms(lambda: fwd(False), graph=False)[0], time_ms(lambda: fwd(True), graph=False)[0],
             time_ms(lambda: bwd(None), graph=False)[0], time_ms(lambda: bwd(saved), graph=False)[0]]
        rows.append((name, *t, t[0] + t[2], t[1] + t[3], err, saved.numel() / (B * T * HV)))
        del q, k, v, g, beta, do, saved, a, b
        torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name()}: ms, CUDA-event medians of 20 eager calls")
    print(f"{'shape':22s} {'fwd':>7s} {'fwd+save':>8s} {'bwd':>7s} {'bwd(sv)':>7s} {'f+b':>7s} {'f+b(sv)':>7s}"
          f" {'max rel diff':>12s} {'B/tok-head':>10s}")
    for r in rows:
        print(f"{r[0]:22s} {r[1]:7.3f} {r[2]:8.3f} {r[3]:7.3f} {r[4]:7.3f} {r[5]:7.3f} {r[6]:7.3f} {r[7]:12.2e}"
              f" {r[8]:10.0f}")


if __name__ == "__main__":
    main()
