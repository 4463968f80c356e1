/*
 * sm90_chunk_bwd.cuh - the kernels of the chunked backward (GDN gates), on wgmma with f32
 * accumulators. Notation and equations: dev/backward/README.md, section 1. Per chunk and value
 * head, with Gam the chunk-local cumsum of the (floored) log decays, gam = exp(Gam),
 * gu = exp(Gam_C - Gam), rk / rq the norm factors and T = (I + A)^-1:
 *
 *   forward:   X = V - diag(ck) K S     Vn = T diag(beta) X     S' = gC S + K^T diag(cu) Vn
 *   reverse:   dVn = Pm^T dO + diag(cu) K dS'     dU = T^T dVn     dX = diag(beta) dU (= dv)
 *              dS = gC dS' + Q^T diag(cq) dO - K^T diag(ck) dX
 *
 * (ck = rk gam, cq = scale rq gam, cu = rk gu). The state S entering every chunk and the chunk's
 * record (T, Pm, per-token factors: gdn_chunk::gdn_rec) are the forward's: chunk_wg and chunk_prep
 * save them (gdn_chunk_fwd_args.saved_states), and where the caller did not, gdn_cuda_chunk_bwd
 * runs that forward itself into its workspace first. Then (one stream; no atomics, fixed orders):
 *   bwd_rev    per (sequence, value head, 64 value rows), on wgmma: the reverse chain stores dS'
 *              leaving every chunk, writes dv and dh0. It needs the records only, not S. With
 *              few (sequence, value head) pairs of fixed length (gdn_chunk::plan_cp) it runs per
 *              segment of each sequence too, after bwd_rev<PRE> (each segment's affine map) and
 *              bwd_scan (the gradient entering each segment from the end): sm90_chunk_bwd_rev.cuh.
 *   bwd_grad   per (chunk slot, key head), over the group's value heads in turn, on wgmma: everything
 *              else of the chunk from S, dS' and the record: dg or da, dbeta, the gate-parameter
 *              partials per value head; dq and dk summed over the group in registers, then
 *              through the L2-norm backward to the outputs.
 *   bwd_gate   per value head: dA_log and ddt_bias from the partials, in slot order.
 */
#ifndef GDN_SM90_CHUNK_BWD_CUH
#define GDN_SM90_CHUNK_BWD_CUH

#include "sm90_chunk_bwd_rev.cuh"
#include "sm90_chunk_bwd_grad.cuh"

#endif /* GDN_SM90_CHUNK_BWD_CUH */
