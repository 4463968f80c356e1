/*
 * cuda_gating.cu - the gating op on CUDA: raw a, b -> g, beta.
 */
#include "cuda_common.cuh"

extern "C" gdn_status gdn_cuda_gating(const gdn_gating_problem *p)
{
    (void)p;
    return gdn_set_error(GDN_ERR_NOT_IMPLEMENTED, "gdn_gating: the CUDA backend does not implement it yet");
}
