#!/usr/bin/env bash
# cpu_vs_ggml.sh - libgdn's CPU backend against ggml's GATED_DELTA_NET op, same shapes, one run.
#
# Builds ggml's test-backend-ops (CPU only, -O3 -march=native) from a ggml checkout given by path
# and libgdn plus bench/cpu_bench.c, both into build-cpu-bench/ (ignored); fetches nothing. Then,
# five times, interleaved so that both see the same machine: ggml's perf mode on its
# GATED_DELTA_NET cases (decode T = 1 at H = 32 / K = V = 128, H = 16 / 64 and KDA; prefill
# T = 64 and 1024, T = 1024 with 4 heads, KDA T = 64), then libgdn at the same shapes
# (bench/cpu_bench.c: decode in KV and VK layout through an in-place one-slot pool, prefill with
# gdn_chunk_fwd). Prints the median of the five per case and the ratio ggml time / libgdn time
# (> 1: libgdn faster), with the machine, date, commit and command at the top.
#
#   bash bench/cpu_vs_ggml.sh [ggml-checkout]     (default $GGML_DIR, else .peers/ggml)
#   GDN_BENCH_SAMPLES=5 GDN_BENCH_THREADS=2 GDN_JOBS=2 (build parallelism) GGML_BUILD=<existing build>
#   GGML_REV=<commit> names the ggml revision when the checkout has no .git
#
# Threads: libgdn runs GDN_BENCH_THREADS threads; ggml's test-backend-ops always uses
# std::thread::hardware_concurrency() threads, so on a machine with more cores than that the
# script pins both to the first GDN_BENCH_THREADS cores and says that ggml may run more threads.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ggml=${1:-${GGML_DIR:-.peers/ggml}}
samples=${GDN_BENCH_SAMPLES:-5}
threads=${GDN_BENCH_THREADS:-2}
jobs=${GDN_JOBS:-2}
out=$root/build-cpu-bench
[ -f "$ggml/tests/test-backend-ops.cpp" ] || { echo "cpu_vs_ggml.sh: no ggml checkout at $ggml" >&2; exit 1; }
grep -q "test_gated_delta_net" "$ggml/tests/test-backend-ops.cpp" ||
    { echo "cpu_vs_ggml.sh: $ggml has no GATED_DELTA_NET tests" >&2; exit 1; }
mkdir -p "$out"

echo "== building ggml test-backend-ops (CPU, -O3 -march=native) and libgdn" >&2
gbuild=${GGML_BUILD:-$out/ggml} # GGML_BUILD: an existing CPU build of test-backend-ops to reuse
if [ ! -x "$gbuild/bin/test-backend-ops" ]; then
    cmake -S "$ggml" -B "$gbuild" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BUILD_TESTS=ON \
        -DGGML_BUILD_EXAMPLES=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
        -DCMAKE_C_FLAGS="-O3 -march=native" -DCMAKE_CXX_FLAGS="-O3 -march=native" >"$out/ggml-configure.log" 2>&1
    nice cmake --build "$gbuild" --target test-backend-ops -j"$jobs" >"$out/ggml-build.log" 2>&1
fi
cmake -S . -B "$out/gdn" -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=OFF >"$out/gdn-configure.log" 2>&1
nice cmake --build "$out/gdn" --target gdn_static -j"$jobs" >"$out/gdn-build.log" 2>&1
cc -std=c11 -O2 -Iinclude bench/cpu_bench.c "$out/gdn/libgdn.a" -lpthread -lm -o "$out/cpu_bench"

pin=()
if [ "$(nproc)" -gt "$threads" ]; then
    pin=(taskset -c "0-$((threads - 1))")
    echo "note: $(nproc) cores; both pinned to $threads cores, ggml still starts hardware_concurrency() threads" >&2
fi
filter='head_count=32,head_size=128,n_seq_tokens=(1|64|1024),|head_count=16,head_size=64,n_seq_tokens=1,|head_count=4,head_size=128,n_seq_tokens=1024,'

raw=$out/raw.txt
: >"$raw"
for s in $(seq 1 "$samples"); do
    echo "== sample $s / $samples" >&2
    "${pin[@]}" "$gbuild/bin/test-backend-ops" perf -o GATED_DELTA_NET -b CPU -p "$filter" 2>&1 |
        sed -n 's/.*GATED_DELTA_NET(type=f32,head_count=\([0-9]*\),head_size=\([0-9]*\),n_seq_tokens=\([0-9]*\),n_seqs=1,v_repeat=1,permuted=0,kda=0,K=1).* \([0-9.]*\) us\/run.*/ggml h\1_d\2_t\3_gdn \4/p; s/.*GATED_DELTA_NET(type=f32,head_count=\([0-9]*\),head_size=\([0-9]*\),n_seq_tokens=\([0-9]*\),n_seqs=1,v_repeat=1,permuted=0,kda=1,K=1).* \([0-9.]*\) us\/run.*/ggml h\1_d\2_t\3_kda \4/p' >>"$raw"
    "${pin[@]}" "$out/cpu_bench" --threads "$threads" --samples 1 --min-time 0.5 _t1_ _t64_ _t1024_ |
        sed -n 's/^case=\(.*\)_\(KV\|VK\) us=\([0-9.]*\)$/libgdn \1 \2 \3/p' >>"$raw"
done

commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include bench || echo "+local changes")
echo "# libgdn CPU backend vs ggml GATED_DELTA_NET (test-backend-ops perf), f32, median of $samples"
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $threads threads"
# The ggml revision: its own git repository's HEAD, or $GGML_REV for a checkout without .git.
ggml_rev=${GGML_REV:-}
if [ -z "$ggml_rev" ] && [ "$(git -C "$ggml" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$ggml" && pwd -P)" ]; then
    ggml_rev=$(git -C "$ggml" rev-parse --short HEAD)
fi
echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'); libgdn commit $commit; ggml ${ggml_rev:-unknown (no .git; set GGML_REV)}"
echo "# command: bash bench/cpu_vs_ggml.sh $ggml (GDN_BENCH_SAMPLES=$samples GDN_BENCH_THREADS=$threads${GGML_BUILD:+ GGML_BUILD=$GGML_BUILD}${GGML_REV:+ GGML_REV=$GGML_REV})"
echo "# ratio = ggml us / libgdn us (> 1: libgdn faster); tok/s = T / libgdn time (prefill)"
awk '
function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
$1 == "ggml" { g[$2] = g[$2] " " $3; next }
$1 == "libgdn" { k = $2 " " $3; l[k] = l[k] " " $4; if (!(k in seen)) { seen[k] = 1; order[n++] = k } }
END {
    printf "%-22s %-6s %12s %12s %8s %14s\n", "case", "layout", "ggml us", "libgdn us", "ratio", "libgdn tok/s"
    for (i = 0; i < n; i++) {
        split(order[i], kk, " ")
        gm = (kk[1] in g) ? median(g[kk[1]]) : 0
        lm = median(l[order[i]])
        t = kk[1]; sub(/^h[0-9]+_d[0-9]+_t/, "", t); sub(/_.*/, "", t)
        r = "-"
        if (gm > 0) r = sprintf("%.2f", gm / lm)
        tps = t > 1 ? sprintf("%.0f", 1e6 * t / lm) : "-"
        printf "%-22s %-6s %12.1f %12.1f %8s %14s\n", kk[1], kk[2], gm, lm, r, tps
    }
}' "$raw"
