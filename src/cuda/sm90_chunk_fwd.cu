/*
 * sm90_chunk_fwd.cu - chunked forward (prefill) on Hopper.
 */
#include "cuda_common.cuh"

extern "C" size_t gdn_cuda_chunk_fwd_workspace_size(const gdn_problem *p)
{
    (void)p;
    return 0;
}

extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p)
{
    (void)p;
    return gdn_set_error(GDN_ERR_NOT_IMPLEMENTED, "gdn_chunk_fwd: the CUDA backend does not implement it yet");
}
