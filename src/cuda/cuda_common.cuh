/*
 * cuda_common.cuh - shared helpers for the CUDA backend: runtime-error checks, the device guard of
 * the backend entries, dtype loads and stores.
 */
#ifndef GDN_CUDA_COMMON_CUH
#define GDN_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "problem.h"

/* Report a failed launch or runtime call as GDN_ERR_CUDA with the runtime's message. */
static inline gdn_status gdn_cuda_check(cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return GDN_OK;
    return gdn_set_error(GDN_ERR_CUDA, "%s: %s", what, cudaGetErrorString(err));
}

/* Makes the problem's device current for one backend entry and restores the caller's on leaving:
 * kernel launches, attributes and occupancy queries act on the current device. */
class DeviceGuard {
  public:
    gdn_status enter(int ordinal)
    {
        int current = 0;
        cudaError_t err = cudaGetDevice(&current);
        if (err != cudaSuccess)
            return gdn_set_error(GDN_ERR_CUDA, "cudaGetDevice: %s", cudaGetErrorString(err));
        if (current != ordinal) {
            err = cudaSetDevice(ordinal);
            if (err != cudaSuccess)
                return gdn_set_error(GDN_ERR_CUDA, "cudaSetDevice(%d): %s", ordinal, cudaGetErrorString(err));
            previous_ = current;
        }
        return GDN_OK;
    }
    ~DeviceGuard()
    {
        if (previous_ >= 0)
            cudaSetDevice(previous_);
    }

  private:
    int previous_ = -1;
};

template <typename T> __device__ __forceinline__ float gdn_to_f32(T x);
template <> __device__ __forceinline__ float gdn_to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float gdn_to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float gdn_to_f32<__half>(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T gdn_from_f32(float x);
template <> __device__ __forceinline__ float gdn_from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 gdn_from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half gdn_from_f32<__half>(float x) { return __float2half_rn(x); }

/* Two adjacent elements as one store (float2, __nv_bfloat162), from two f32 values. */
template <typename T> struct GdnPair;
template <> struct GdnPair<float> {
    using type = float2;
    static __device__ __forceinline__ float2 make(float a, float b) { return make_float2(a, b); }
};
template <> struct GdnPair<__nv_bfloat16> {
    using type = __nv_bfloat162;
    static __device__ __forceinline__ __nv_bfloat162 make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

/* Element off of base (dtype dt) as f32; the dtype is known only at run time. */
__device__ __forceinline__ float load_elem(const void *base, gdn_dtype dt, int64_t off)
{
    switch (dt) {
    case GDN_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)base)[off]);
    case GDN_DTYPE_F16: return __half2float(((const __half *)base)[off]);
    default: return ((const float *)base)[off];
    }
}

__device__ __forceinline__ void store_elem(void *base, gdn_dtype dt, int64_t off, float x)
{
    switch (dt) {
    case GDN_DTYPE_BF16: ((__nv_bfloat16 *)base)[off] = __float2bfloat16_rn(x); break;
    case GDN_DTYPE_F16: ((__half *)base)[off] = __float2half_rn(x); break;
    default: ((float *)base)[off] = x; break;
    }
}

#endif /* GDN_CUDA_COMMON_CUH */
