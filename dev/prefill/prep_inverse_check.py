"""prep_inverse_check.py - offline check of chunk_prep's triangular inverse T = (I + A)^-1
(src/cuda/sm90_chunk_fwd.cu), no GPU needed: the kernel's block schedule replayed in numpy.

  1. schedule: the same steps in float64 (diagonal 16 x 16 blocks by forward substitution, then
     inverse_blocks for (1,0) (2,1) (3,2), then (2,0) with (3,0), and (3,1)) must reproduce
     numpy's inverse to rounding: a wrong block index or a missing dependency shows as O(1) error;
  2. accuracy: the kernel's arithmetic (f32 substitution; 3xTF32 products: each operand split into
     tf32 hi + lo, lo*hi + hi*lo + hi*hi with f32 sums) against main's (f32 blocked forward
     substitution), both against float64, on chunks drawn like bench_prefill's inputs (L2-normed
     keys, beta = sigmoid(randn), g = logsigmoid(randn); and slow gates, g = logsigmoid(6 + randn)).

    /usr/bin/python3 dev/prefill/prep_inverse_check.py        (Debian python3-numpy)
"""

import numpy as np

C, K = 64, 128


def tf32(x):
    """cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def mma3(x, y):
    """3xTF32 product of f32 blocks (the tensor core's products of tf32 values are exact)."""
    xh, yh = tf32(x), tf32(y)
    xl, yl = tf32(x - xh), tf32(y - yh)
    p = lambda a, b: (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    return (p(xl, yh) + p(xh, yl)) + p(xh, yh)


def kernel_inverse(A, dt, mm):
    A = A.astype(dt)
    T = np.zeros((C, C), dt)
    for w in range(4):  # diagonal blocks: warp w, lane cc solves column cc
        r0 = 16 * w
        for cc in range(16):
            x = [dt(0)] * 16
            for i2 in range(16):
                s = dt(1 if i2 == cc else 0)
                for ii in range(i2):
                    s = dt(s - A[r0 + i2, r0 + ii] * x[ii])
                x[i2] = s
            T[r0:r0 + 16, r0 + cc] = x
    blk = lambda i, j: (slice(16 * i, 16 * i + 16), slice(16 * j, 16 * j + 16))

    def inverse_blocks(i0, j, ni):
        z = np.zeros((16, 16), dt)
        s = [sum((mm(A[blk(i0 + ii, kb)], T[blk(kb, j)]) for kb in range(j, i0)), z) for ii in range(ni)]
        for ii in range(ni):
            T[blk(i0 + ii, j)] = s[ii]
        r = [sum((mm(T[blk(i0 + ii, i0 + m)], T[blk(i0 + m, j)]) for m in range(ii + 1)), z) for ii in range(ni)]
        for ii in range(ni):
            T[blk(i0 + ii, j)] = -r[ii]

    for j in range(3):
        inverse_blocks(j + 1, j, 1)
    inverse_blocks(2, 0, 2)
    inverse_blocks(3, 1, 1)
    return T


def main_inverse(A):
    """main's chunk_prep: 16-row blocks, dot products with the finished rows, then substitution."""
    A = A.astype(np.float32)
    T = np.zeros((C, C), np.float32)
    for r0 in range(0, C, 16):
        if r0:
            T[r0:r0 + 16, :r0] = -(A[r0:r0 + 16, :r0] @ T[:r0, :r0])
        for c in range(r0 + 16):
            x = [T[r0 + ii, c] if c < r0 else np.float32(r0 + ii == c) for ii in range(16)]
            for ii in range(16):
                for i2 in range(ii + 1, 16):
                    x[i2] = np.float32(x[i2] - A[r0 + i2, r0 + ii] * x[ii])
            T[r0:r0 + 16, c] = x
    return T


def chunk_A(rng, gate_shift):
    k = rng.standard_normal((C, K))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    gam = np.cumsum(-np.log1p(np.exp(-(gate_shift + rng.standard_normal(C)))))
    beta = 1 / (1 + np.exp(-rng.standard_normal(C)))
    return np.tril(beta[:, None] * (k @ k.T) * np.exp(gam[:, None] - gam[None, :]), -1)


def main():
    rng = np.random.default_rng(0)
    off = np.tril(np.ones((C, C)), -16)  # the blocks below the diagonal: where the schemes differ
    rel = lambda T, ref: np.sqrt((((T - ref) * off) ** 2).sum() / ((ref * off) ** 2).sum())
    ok = True
    for shift, name in ((0.0, "g = logsigmoid(randn)"), (6.0, "g = logsigmoid(6 + randn)")):
        sched, new, old = [], [], []
        for _ in range(4):
            A = chunk_A(rng, shift)
            ref = np.linalg.inv(np.eye(C) + A)
            sched.append(np.abs(kernel_inverse(A, np.float64, lambda x, y: x @ y) - ref).max())
            new.append(rel(kernel_inverse(A, np.float32, mma3), ref))
            old.append(rel(main_inverse(A), ref))
        ok &= max(sched) < 1e-12 and max(new) < 2 * max(old) + 1e-7
        print(f"{name:28s} schedule max err {max(sched):.1e} | off-diagonal rel RMS: "
              f"kernel (3xTF32) {np.mean(new):.2e}, main (f32) {np.mean(old):.2e}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
