/*
 * cuda_gate.cuh - the device gate and beta formulas (GDN_MATH.md "Gates") and their derivatives,
 * shared by the gating op (cuda_gating.cu), chunk_prep (sm90_chunk_prep.cuh), kda_prep, the
 * recurrent kernels and the backward (sm90_chunk_bwd.cuh), so that
 * every path rounds the same way: accurate expf / log1pf in this order, as the CPU reference
 * computes them in float64 (one exception: kda_prep's fast form, kda_gate_log2 in sm90_kda_prep.cuh).
 */
#ifndef GDN_CUDA_GATE_CUH
#define GDN_CUDA_GATE_CUH

/* softplus with vLLM's threshold: x itself once beta_sp x passes the threshold. */
__device__ __forceinline__ float gate_softplus(float x, float beta_sp, float threshold)
{
    const float bx = beta_sp * x;
    return bx > threshold ? x : log1pf(expf(bx)) / beta_sp;
}

/* Log decay g = -exp(A_log) softplus(a + dt_bias); dt_bias is 0 where the problem has none. */
__device__ __forceinline__ float gate_log_decay(float a, float dt_bias, float A_log, float beta_sp, float threshold)
{
    const float sp = gate_softplus(a + dt_bias, beta_sp, threshold);
    return -expf(A_log) * sp;
}

__device__ __forceinline__ float gate_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* d gate_softplus / dx: sigmoid(beta_sp x), 1 past the threshold (where softplus is x). The
 * backward's da is dg (-exp(A_log)) times this, at x = a + dt_bias. */
__device__ __forceinline__ float gate_softplus_slope(float x, float beta_sp, float threshold)
{
    const float bx = beta_sp * x;
    return bx > threshold ? 1.0f : gate_sigmoid(bx);
}

/* KDA log decay of one key channel from a + dt_bias: with a lower bound L < 0 (FLA's safe gate)
 * L sigmoid(exp(A_log) (a + dt_bias)), in (L, 0); without (L = 0) the GDN formula. GDN passes
 * L = 0. */
__device__ __forceinline__ float gate_log_decay_kda(float a, float dt_bias, float A_log, float lower_bound,
                                                    float beta_sp, float threshold)
{
    if (lower_bound < 0.0f)
        return lower_bound * gate_sigmoid(expf(A_log) * (a + dt_bias));
    return gate_log_decay(a, dt_bias, A_log, beta_sp, threshold);
}

/* Write strength from its logit: sigmoid, doubled where negative eigenvalues are allowed. */
__device__ __forceinline__ float gate_beta(float logit, int allow_neg_eigval)
{
    float b = gate_sigmoid(logit);
    if (allow_neg_eigval)
        b *= 2.0f;
    return b;
}

/* d gate_beta / d logit. */
__device__ __forceinline__ float gate_beta_grad(float logit, int allow_neg_eigval)
{
    const float s = gate_sigmoid(logit);
    return (allow_neg_eigval ? 2.0f : 1.0f) * s * (1.0f - s);
}

#endif /* GDN_CUDA_GATE_CUH */
