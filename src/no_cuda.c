/*
 * no_cuda.c - the CUDA backend's entry points in a build without it (GDN_CUDA=OFF or no nvcc), so
 * that the API layer dispatches the same way in every build. Unreachable through the API, which
 * refuses CUDA tensors first, in calls and workspace queries alike (GDN_ERR_NO_BACKEND, naming the
 * tensor).
 */
#include "problem.h"

static gdn_status no_backend(void)
{
    return gdn_set_error(GDN_ERR_NO_BACKEND, "libgdn was built without the CUDA backend");
}

gdn_status gdn_cuda_gating(const gdn_gating_problem *p)
{
    (void)p;
    return no_backend();
}

gdn_status gdn_cuda_chunk_fwd_check(const gdn_problem *p)
{
    (void)p;
    return no_backend();
}

gdn_status gdn_cuda_recurrent_fwd_check(const gdn_problem *p)
{
    (void)p;
    return no_backend();
}

size_t gdn_cuda_chunk_fwd_workspace_size(const gdn_problem *p)
{
    (void)p;
    return 0;
}

size_t gdn_cuda_chunk_fwd_workspace_min(const gdn_problem *p)
{
    (void)p;
    return 0;
}

gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p)
{
    (void)p;
    return no_backend();
}

size_t gdn_cuda_recurrent_fwd_workspace_size(const gdn_problem *p)
{
    (void)p;
    return 0;
}

gdn_status gdn_cuda_recurrent_fwd(const gdn_problem *p)
{
    (void)p;
    return no_backend();
}

gdn_status gdn_cuda_chunk_bwd_check(const gdn_bwd_problem *p)
{
    (void)p;
    return no_backend();
}

size_t gdn_cuda_chunk_bwd_workspace_size(const gdn_bwd_problem *p)
{
    (void)p;
    return 0;
}

size_t gdn_cuda_chunk_saved_states_size(const gdn_problem *p)
{
    (void)p;
    return 0;
}

gdn_status gdn_cuda_chunk_bwd(const gdn_bwd_problem *p)
{
    (void)p;
    return no_backend();
}
