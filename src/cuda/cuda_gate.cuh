/*
 * cuda_gate.cuh - the device gate and beta formulas (GDN_MATH.md "Gates") and their derivatives,
 * shared by the gating op (cuda_gating.cu), chunk_prep (sm90_chunk_prep.cuh), kda_prep, the
 * recurrent kernels and the backward (sm90_chunk_bwd.cuh), so that
 * every path rounds the same way: accurate expf / log1pf in this order, as the CPU reference
 * computes them in float64. One exception: KDA's per-key gate in the chunked prefill (kda_prep) and
 * the recurrent kernels takes the fast form below (KdaGate).
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

constexpr float LOG2E = 1.4426950408889634f;

/* 2^x in one MUFU.EX2 (relative error ~2^-22, results below 2^-126 flushed to 0). The chunk
 * kernels keep x <= 0, or (kda_prep) x <= 96; the decode's KDA staging and the backward's decay
 * pass log decays of the caller's gates, <= 0 by the gate contract (GDN_MATH.md). */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* KDA's gate in its fast form: gate_log_decay_kda in log2 units (times LOG2E) with the hardware
 * approximations (ex2.approx.ftz, rcp.approx, lg2.approx: relative error about 2^-21, absolute
 * 2^-24 where softplus is tiny) and the per-head constants folded once. KDA evaluates the gate of
 * every key of every token: in kda_prep the accurate library calls cost as much as the rest of the
 * chunk preparation, and in the recurrent kernels they lengthen the token staging that every CTA
 * waits for (dev/decode/README.md, KDA). Prefill and decode thus share one formula; the GDN gate
 * (one value a token) and the gating op keep the accurate one. */
struct KdaGate {
    float c2;  /* -exp(A_log) LOG2E */
    float lb2; /* lower_bound LOG2E (safe gate) */
    float sp_beta, sp_threshold;
};

__device__ __forceinline__ KdaGate kda_gate_consts(float A_log, float lower_bound, float sp_beta, float sp_threshold)
{
    KdaGate k;
    k.c2 = -expf(A_log) * LOG2E;
    k.lb2 = lower_bound * LOG2E;
    k.sp_beta = sp_beta;
    k.sp_threshold = sp_threshold;
    return k;
}

/* Safe gate: lower_bound sigmoid(exp(A_log) (a + dt_bias)), cb = c2 dt_bias. */
__device__ __forceinline__ float kda_gate_safe_log2(float a, float cb, const KdaGate &k)
{
    return __fdividef(k.lb2, 1.0f + fast_exp2(fmaf(k.c2, a, cb)));
}

/* Softplus gate: -exp(A_log) softplus(a + dt_bias), vLLM's threshold. */
__device__ __forceinline__ float kda_gate_softplus_log2(float a, float dt_bias, const KdaGate &k)
{
    const float x = a + dt_bias, bx = k.sp_beta * x;
    return k.c2 * (bx > k.sp_threshold ? x : __fdividef(__logf(1.0f + __expf(bx)), k.sp_beta));
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
