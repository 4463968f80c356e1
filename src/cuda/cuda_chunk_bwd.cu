/*
 * cuda_chunk_bwd.cu - the CUDA backend's entry for the chunked backward (gdn_chunk_bwd). No kernel
 * exists yet: its check reports GDN_ERR_UNSUPPORTED (to the workspace query and the call alike) so
 * that the API is complete and honest, and the
 * CPU backend (src/cpu/cpu_chunk_bwd.c) is the reference a kernel will be checked against.
 */
#include "problem.h"

gdn_status gdn_cuda_chunk_bwd_check(const gdn_bwd_problem *p)
{
    (void)p;
    return gdn_set_error(GDN_ERR_UNSUPPORTED, "backward: no CUDA kernel yet (gdn_chunk_bwd runs on CPU tensors)");
}

size_t gdn_cuda_chunk_bwd_workspace_size(const gdn_bwd_problem *p)
{
    (void)p;
    return 0;
}

gdn_status gdn_cuda_chunk_bwd(const gdn_bwd_problem *p)
{
    (void)p;
    return gdn_set_error(GDN_ERR_UNSUPPORTED, "backward: no CUDA kernel yet (gdn_chunk_bwd runs on CPU tensors)");
}
