/*
 * sm90_recurrent_util.cuh - parameter struct and device helpers of the recurrent forward kernel
 * (sm90_recurrent_fwd.cu): typed loads and stores of state rows and token inputs, slot checks.
 */
#ifndef GDN_SM90_RECURRENT_UTIL_CUH
#define GDN_SM90_RECURRENT_UTIL_CUH

#include "cuda_common.cuh"
#include "cuda_gate.cuh"
#include "sm90_primitives.cuh"

/* Internal linkage: the library and the benchmark each compile their own copy. */
namespace {

using gdn_sm90::bulk_load;
using gdn_sm90::fence_proxy_async;
using gdn_sm90::grid_dependency_sync;
using gdn_sm90::mbar_expect_tx;
using gdn_sm90::mbar_fence_init;
using gdn_sm90::mbar_init;
using gdn_sm90::mbar_wait;
using gdn_sm90::mma_tf32;
using gdn_sm90::smem_u32;
using gdn_sm90::tf32_split;
using gdn_sm90::Tf32Pair;

/* Strides (elements) of one state tensor, whatever its layout. */
struct StateStrides {
    int64_t s0; /* slot or sequence (or packed token, for step_states) */
    int64_t s1; /* value head */
    int64_t sk; /* key index: 1 for VK contiguous */
    int64_t sv; /* value index: the row */
};

/* One launch's arguments. Pointers are device pointers; all strides in elements. */
struct RecurrentParams {
    int64_t T, HV, G, V, N;
    const int32_t *cu_seqlens;          /* [N + 1] or NULL */

    const void *q, *k;                  /* [B, T, H, K], s = {b, t, h, d} */
    const void *v;                      /* [B, T, HV, V], s = {b, t, hv, d} */
    void *o;                            /* [B, T, HV, V] */
    int64_t q_s[4], k_s[4], v_s[4], o_s[4];

    const float *g;                     /* [B, T, HV] (KDA: [B, T, HV, K]) or NULL (then a is present) */
    int64_t g_s[3];
    const void *a;                      /* raw gate, shaped as g */
    gdn_dtype a_dtype;
    int64_t a_s[3];
    const float *A_log;                 /* [HV] */
    const float *dt_bias;               /* [HV] (KDA: [HV, K]) or NULL */
    int64_t dt_s;
    float softplus_beta, softplus_threshold;
    const void *beta;                   /* [B, T, HV]: beta, or logits b */
    gdn_dtype beta_dtype;
    int64_t beta_s[3];
    int beta_from_logits, allow_neg_eigval;

    float scale;
    int use_qk_l2norm;

    void *state_in;                     /* pool [P, HV, ..] or [N, HV, ..]; may be NULL */
    StateStrides st_in;
    int64_t num_slots;
    void *final_state;                  /* [N, HV, ..] or NULL */
    StateStrides st_fin;
    void *step_states;                  /* [B * T, HV, ..] or NULL */
    StateStrides st_step;

    const int32_t *state_indices;       /* [N] or [N, idx_cols], or NULL */
    int64_t idx_s_n, idx_s_t, idx_cols;
    int idx_2d;                         /* per-step slots (2-D indices) */
    const int32_t *num_accepted_tokens; /* [N] or NULL */
    int inplace_state;
    int null_slot_zero;

    /* KDA gates (the kernels' KDA instances read these; appended so that the GDN instances'
     * parameter offsets stay as they are) */
    int64_t g_sr, a_sr, dt_sr;          /* key-channel strides of g, a and dt_bias */
    float lower_bound;                  /* < 0: FLA's safe gate; 0: off */
};

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* The output row of token t of batch row b, value head hv (element d at d * p.o_s[3]). */
template <typename InT> __device__ __forceinline__ InT *token_o(const RecurrentParams &p, int64_t b, int64_t t, int hv)
{
    return (InT *)p.o + b * p.o_s[0] + t * p.o_s[1] + hv * p.o_s[2];
}

/* The state of row i (sequence, pool slot or step) and value head hv in a state view with strides st. */
template <typename StateT>
__device__ __forceinline__ StateT *state_at(const void *base, const StateStrides &st, int64_t i, int64_t hv)
{
    return (StateT *)base + i * st.s0 + hv * st.s1;
}

/* A slot may be read or written: in the pool, not padding, not the null block. */
__device__ __forceinline__ bool slot_valid(const RecurrentParams &p, int64_t slot)
{
    return slot >= (p.null_slot_zero ? 1 : 0) && slot < p.num_slots;
}

template <typename T, int N> struct alignas(sizeof(T) * N) Pack {
    T x[N];
};

/* N consecutive elements as one vector (VEC), or N elements `stride` apart, as f32. */
template <typename T, int N, bool VEC>
__device__ __forceinline__ void load_f32(const T *ptr, int64_t stride, float *out)
{
    if constexpr (VEC) {
        const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N> *>(ptr);
#pragma unroll
        for (int e = 0; e < N; e++)
            out[e] = gdn_to_f32<T>(pk.x[e]);
    } else {
#pragma unroll
        for (int e = 0; e < N; e++)
            out[e] = gdn_to_f32<T>(ptr[e * stride]);
    }
}

/* N f32 values times `scale`, rounded to T, as the 16 bytes of one state piece (N = 16 / sizeof(T)). */
template <typename T, int N> __device__ __forceinline__ uint4 pack16(const float *in, float scale)
{
    static_assert(N * sizeof(T) == 16, "a state piece is 16 bytes");
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (sizeof(T) == 4) {
            w[i] = __float_as_uint(in[i] * scale);
        } else {
            const T lo = gdn_from_f32<T>(in[2 * i] * scale), hi = gdn_from_f32<T>(in[2 * i + 1] * scale);
            uint16_t l, h;
            memcpy(&l, &lo, 2);
            memcpy(&h, &hi, 2);
            w[i] = (uint32_t)l | (uint32_t)h << 16;
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* One 16-byte store to global memory (st_global_16) or shared memory (st_shared_16), spelled in
 * PTX: from a plain 16-byte struct assignment NVVM emitted four 4-byte (bf16: eight 2-byte)
 * stores for most state pieces. */
__device__ __forceinline__ void st_global_16(void *ptr, uint4 v)
{
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ void st_shared_16(uint32_t addr, uint4 v)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

/* in[e] * scale for N elements of global memory: one 16-byte store (VEC), or N elements
 * `stride` apart. */
template <typename T, int N, bool VEC>
__device__ __forceinline__ void store_f32(T *ptr, int64_t stride, const float *in, float scale)
{
    if constexpr (VEC) {
        st_global_16(ptr, pack16<T, N>(in, scale));
    } else {
#pragma unroll
        for (int e = 0; e < N; e++)
            ptr[e * stride] = gdn_from_f32<T>(in[e] * scale);
    }
}

/* Writes this lane's part of RPL state rows, times `scale` (the kernels keep S / scale in
 * registers). base points at (slot, value head). */
template <typename StateT, int RPL, int EPL, int VE, int NV, bool VEC>
__device__ __forceinline__ void store_rows(StateT *base, const StateStrides &st, const int *rows,
                                           const bool *row_ok, int gl, const float (*s)[EPL], float scale)
{
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        if (!row_ok[r])
            continue;
#pragma unroll
        for (int c = 0; c < NV; c++) {
            const int key = (c * 8 + gl) * VE;
            store_f32<StateT, VE, VEC>(base + (int64_t)rows[r] * st.sv + key * st.sk, st.sk, &s[r][c * VE], scale);
        }
    }
}

/* The bits of element off of base (dtype dt), to be converted by bits_to_f32 after every load of
 * a token is in flight: a conversion right after its load would wait for it, and the loads that
 * follow it in program order would start one memory round trip later. */
__device__ __forceinline__ uint32_t load_bits(const void *base, gdn_dtype dt, int64_t off)
{
    switch (dt) {
    case GDN_DTYPE_BF16:
    case GDN_DTYPE_F16: return ((const uint16_t *)base)[off];
    default: return ((const uint32_t *)base)[off];
    }
}

__device__ __forceinline__ float bits_to_f32(uint32_t x, gdn_dtype dt)
{
    switch (dt) {
    case GDN_DTYPE_BF16: return __uint_as_float(x << 16);
    case GDN_DTYPE_F16: return __half2float(__ushort_as_half((unsigned short)x));
    default: return __uint_as_float(x);
    }
}

/* The gate inputs of token t of value head hv, loaded (gate_inputs) apart from their use
 * (gate_values). KDA: x is unused (the per-key decays are loaded by the stage, KeyGates). */
struct GateInputs {
    uint32_t x;   /* g (f32 bits), or a (a_dtype bits) */
    float dt;     /* dt_bias (0 without) */
    float alog;   /* A_log (unused with g) */
    uint32_t b;   /* beta, or its logit (beta_dtype bits) */
};

template <bool KDA = false>
__device__ __forceinline__ GateInputs gate_inputs(const RecurrentParams &p, int64_t b, int64_t t, int hv)
{
    GateInputs gi;
    gi.dt = 0.0f, gi.alog = 0.0f;
    if constexpr (KDA) {
        gi.x = 0u;
        if (!p.g)
            gi.alog = p.A_log[hv];
    } else if (p.g) {
        gi.x = __float_as_uint(p.g[b * p.g_s[0] + t * p.g_s[1] + hv * p.g_s[2]]);
    } else {
        gi.x = load_bits(p.a, p.a_dtype, b * p.a_s[0] + t * p.a_s[1] + hv * p.a_s[2]);
        if (p.dt_bias)
            gi.dt = p.dt_bias[hv * p.dt_s];
        gi.alog = p.A_log[hv];
    }
    gi.b = load_bits(p.beta, p.beta_dtype, b * p.beta_s[0] + t * p.beta_s[1] + hv * p.beta_s[2]);
    return gi;
}

/* Write strength beta from the gate inputs. */
__device__ __forceinline__ float gate_beta_value(const RecurrentParams &p, const GateInputs &gi)
{
    const float bt = bits_to_f32(gi.b, p.beta_dtype);
    return p.beta_from_logits ? gate_beta(bt, p.allow_neg_eigval) : bt;
}

/* Decay exp(g) (GDN) and write strength beta from the gate inputs. */
__device__ __forceinline__ void gate_values(const RecurrentParams &p, const GateInputs &gi, float *e, float *beta)
{
    const float g = p.g ? __uint_as_float(gi.x)
                        : gate_log_decay(bits_to_f32(gi.x, p.a_dtype), gi.dt, gi.alog, p.softplus_beta,
                                         p.softplus_threshold);
    *e = expf(g);
    *beta = gate_beta_value(p, gi);
}

/* A skipped sequence: zero its outputs (o, final_state, step_states), touch nothing else. */
template <typename StateT, typename InT, int RPL, int EPL, int VE, int NV, bool VEC>
__device__ __forceinline__ void zero_outputs(const RecurrentParams &p, const int *rows, const bool *row_ok, int gl,
                                             int64_t b, int64_t bos, int64_t eos, int64_t packed0, int64_t n, int hv)
{
    float z[RPL][EPL];
#pragma unroll
    for (int r = 0; r < RPL; r++)
#pragma unroll
        for (int i = 0; i < EPL; i++)
            z[r][i] = 0.0f;
    for (int64_t t = bos; t < eos; t++) {
        InT *o = token_o<InT>(p, b, t, hv);
#pragma unroll
        for (int r = 0; r < RPL; r++)
            if (gl == r && row_ok[r])
                o[(int64_t)rows[r] * p.o_s[3]] = gdn_from_f32<InT>(0.0f);
        if (p.step_states)
            store_rows<StateT, RPL, EPL, VE, NV, VEC>(state_at<StateT>(p.step_states, p.st_step, packed0 + t - bos, hv),
                                                 p.st_step, rows, row_ok, gl, z, 1.0f);
    }
    if (p.final_state)
        store_rows<StateT, RPL, EPL, VE, NV, VEC>(state_at<StateT>(p.final_state, p.st_fin, n, hv),
                                                  p.st_fin, rows, row_ok, gl, z, 1.0f);
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_UTIL_CUH */
