/*
 * sm90_chunk_tuning.cuh - the tuning constants of the chunked forward in one place. A shipping
 * build defines no GDN_CHUNK_DEV_* macro and gets the defaults below; the dev scripts
 * (dev/prefill/prof-coop.sh, check-wg-gva.sh) build with -DGDN_CHUNK_DEV_<NAME>=... to time or
 * test the alternatives. No switch adds a field to a launch struct. Why each default is what it
 * is: the comment at its use, and dev/prefill/README.md for the measurements.
 */
#ifndef GDN_SM90_CHUNK_TUNING_CUH
#define GDN_SM90_CHUNK_TUNING_CUH

namespace gdn_chunk {

/* CTAs per SM that chunk_prep's registers are fitted to (__launch_bounds__): 5 gives 96 registers
 * without spills where prep is a large share of the time; 6 would spill. */
#ifdef GDN_CHUNK_DEV_PREP_CTAS
constexpr int PREP_CTAS = GDN_CHUNK_DEV_PREP_CTAS;
#else
constexpr int PREP_CTAS = 5;
#endif

/* Chunk slots per launch_coop counter: the main pass polls once per block of them. */
#ifdef GDN_CHUNK_DEV_FLAG_BLOCK
constexpr int FLAG_BLOCK = GDN_CHUNK_DEV_FLAG_BLOCK;
#else
constexpr int FLAG_BLOCK = 4;
#endif

/* Value rows of S^T per cp_scan CTA. */
#ifdef GDN_CHUNK_DEV_SCAN_ROWS
constexpr int SCAN_ROWS = GDN_CHUNK_DEV_SCAN_ROWS;
#else
constexpr int SCAN_ROWS = 8;
#endif

/* Launcher rules switched off or forced, for comparisons: no context parallelism, no cooperative
 * grid, a fixed CP segment count (0: the rule), a cap on chunk_prep's head groups without the wave
 * rule (0: the rule; tests use it so that every G takes the grouped path). */
#ifdef GDN_CHUNK_DEV_NO_CP
constexpr bool TUNE_NO_CP = true;
#else
constexpr bool TUNE_NO_CP = false;
#endif
#ifdef GDN_CHUNK_DEV_NO_COOP
constexpr bool TUNE_NO_COOP = true;
#else
constexpr bool TUNE_NO_COOP = false;
#endif
#ifdef GDN_CHUNK_DEV_SEGS
constexpr int TUNE_SEGS = GDN_CHUNK_DEV_SEGS;
#else
constexpr int TUNE_SEGS = 0;
#endif
#ifdef GDN_CHUNK_DEV_PREP_HEADS
constexpr int TUNE_PREP_HEADS = GDN_CHUNK_DEV_PREP_HEADS;
#else
constexpr int TUNE_PREP_HEADS = 0;
#endif

/* A timing probe of kda_prep at more CTAs an SM: Gam laid this many bytes over the end of K, which
 * shrinks the CTA's shared memory but wrecks the results (and sends every diagonal block to the
 * tensor cores); for dev/prefill/kda_occupancy_probe.sh only. 0: Gam after K. */
#ifdef GDN_CHUNK_DEV_KDA_PREP_OVERLAP
constexpr int TUNE_KDA_PREP_OVERLAP = GDN_CHUNK_DEV_KDA_PREP_OVERLAP;
#else
constexpr int TUNE_KDA_PREP_OVERLAP = 0;
#endif

/* Most sequences whose main-pass order chunk_prep sets (order_sequence): each of the first N prep
 * CTAs reads all N lengths, a barrier per 128, so the ranking's cost grows as N^2; with more
 * sequences than this, chains are short and the order's gain small. */
constexpr int64_t ORDER_MAX_SEQS = 512;

/* chunk_wg's DUAL CTA (two chains) takes this percentage of a one-chain CTA's time for the same
 * chunks (the launcher's wave rule, dual_fits). */
#ifdef GDN_CHUNK_DEV_DUAL_COST
constexpr int TUNE_DUAL_COST = GDN_CHUNK_DEV_DUAL_COST;
#else
constexpr int TUNE_DUAL_COST = 160;
#endif

/* launch_coop probes, from the second call on (the first call's records and output stay in
 * place): 1 the prep units alone, 2 the main pass alone (every flag set before the launch), 3 as 2
 * without the flag polls. The launcher sets coop_probe before each cooperative launch. */
#ifdef GDN_CHUNK_DEV_COOP_PROBE
constexpr int TUNE_COOP_PROBE = GDN_CHUNK_DEV_COOP_PROBE;
__device__ int coop_probe;
__device__ __forceinline__ int coop_probe_now() { return coop_probe; }
#else
constexpr int TUNE_COOP_PROBE = 0;
__device__ __forceinline__ int coop_probe_now() { return 0; }
#endif

} /* namespace gdn_chunk */

#endif /* GDN_SM90_CHUNK_TUNING_CUH */
