#!/usr/bin/env bash
# device_ab.sh - timing A/B of two trees of libgdn on one GPU, for changes that must not cost
# time (issue 15's refactor): builds each tree's static library with CMake and the public
# benchmarks against it, then runs them interleaved (A B, then B A, ...): bench_prefill at its six
# prefill shapes and bench_decode's sweep (f32 / bf16 state, T = 1, 2, 4, 8, B = 1 .. 512). Prints
# one table of before / after / ratio (medians over the rounds; ratio = after / before, < 1 faster).
#   device tool: run(command="bash scripts/device_ab.sh .ab/base .", carry=[".ab/base"])
#   where .ab/base is `git archive <base commit> | tar -x -C .ab/base`.
# Env: ROUNDS (default 2: A B, then B A), AB_BUDGET_S (default 450: no round starts that would end
# past it, counted from the start, builds included), AB_DECODE_T / AB_DECODE_B (comma lists;
# default the whole sweep), OUT (logs and ab-table.txt; default ./out-ab), AB_BUILD (the two builds;
# default ./build-ab). Under 8 minutes on an H100 with 16 cores.
set -u -o pipefail
base=$(cd "${1:?base tree}" && pwd)
new=$(cd "${2:-.}" && pwd)
OUT=${OUT:-$PWD/out-ab}
ROUNDS=${ROUNDS:-2}
BUDGET=${AB_BUDGET_S:-450}
BUILD=$(mkdir -p "${AB_BUILD:-build-ab}" && cd "${AB_BUILD:-build-ab}" && pwd)
mkdir -p "$OUT"
ARCH=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr)
jobs=$(( $(nproc) / 2 ))

build() { # tree name: the tree's static library, then its benchmarks against it
    local t=$1 b=$BUILD/$2
    cmake -S "$t" -B "$b" -DCMAKE_BUILD_TYPE=Release -DGDN_CUDA=ON >"$OUT/build-$2.log" 2>&1 &&
        cmake --build "$b" -j"$jobs" --target gdn_static >>"$OUT/build-$2.log" 2>&1 || return 1
    local lib=$b/libgdn.a
    [ -f "$lib" ] || lib=$b/libgdn_static.a # trees from before the static library was named libgdn.a
    # bench_decode of trees before issue 15 includes private headers (-I src); the timed part is the
    # public API in both.
    nvcc "${ARCH[@]}" -I"$t/include" -I"$t/src" -DGDN_WITH_CUDA "$t/bench/bench_prefill.cu" "$lib" -lpthread -lm \
        -o "$b/bench_prefill" >>"$OUT/build-$2.log" 2>&1 &&
        nvcc "${ARCH[@]}" -I"$t/include" -I"$t/src" -DGDN_WITH_CUDA "$t/bench/bench_decode.cu" "$lib" -lpthread -lm \
            -o "$b/bench_decode" >>"$OUT/build-$2.log" 2>&1
}

t0=$(date +%s)
build "$base" base & pb=$!
build "$new" new & pn=$!
fail=0
wait $pb || { echo "base build failed:"; tail -30 "$OUT/build-base.log"; fail=1; }
wait $pn || { echo "new build failed:"; tail -30 "$OUT/build-new.log"; fail=1; }
[ $fail = 0 ] || exit 1
echo "builds: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/device.txt"

dargs=()
[ -n "${AB_DECODE_T:-}" ] && dargs+=(--T "$AB_DECODE_T")
[ -n "${AB_DECODE_B:-}" ] && dargs+=(--B "$AB_DECODE_B")
run() { # which round
    local w=$1 r=$2 b=$BUILD/$1
    "$b/bench_prefill" - >"$OUT/prefill-$w-$r.txt" 2>&1 || { echo "bench_prefill ($w) failed"; cat "$OUT/prefill-$w-$r.txt"; exit 1; }
    "$b/bench_decode" --tsv "$OUT/decode-$w-$r.tsv" "${dargs[@]}" >"$OUT/decode-$w-$r.log" 2>&1 ||
        { echo "bench_decode ($w) failed"; tail -20 "$OUT/decode-$w-$r.log"; exit 1; }
}
done_rounds=0
for r in $(seq 1 "$ROUNDS"); do
    t1=$(date +%s)
    if [ $r -gt 1 ] && [ $(( t1 - t0 + round_s )) -gt "$BUDGET" ]; then
        echo "round $r skipped: it would end past AB_BUDGET_S = $BUDGET s"
        break
    fi
    if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
    for w in $order; do
        run "$w" "$r"
    done
    round_s=$(( $(date +%s) - t1 ))
    done_rounds=$r
    echo "round $r ($order): $round_s s"
done

python3 - "$OUT" "$done_rounds" <<'PY' | tee "$OUT/ab-table.txt"
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def prefill(w):
    rows = {}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/prefill-{w}-{r}.txt"):
            f = line.split()
            if len(f) == 7 and f[1].isdigit():
                rows.setdefault(f[0], []).append((float(f[2]), float(f[3])))
    return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in rows.items()}
def decode(w):
    rows = {}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/decode-{w}-{r}.tsv"):
            f = line.split("\t")
            if line.startswith("#") or f[0] == "state":
                continue
            rows.setdefault(f"{f[0]} T={f[1]} B={f[2]}", []).append((float(f[3]), float(f[4])))
    return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in rows.items()}
worst = 0.0
def table(title, unit, a, b, cols):
    global worst
    print(f"\n{title} (median of {rounds} runs each, interleaved; ratio = after / before)")
    print(f"{'case':<28}" + "".join(f"{c + ' before':>14}{c + ' after':>13}{'ratio':>8}" for c in cols))
    for k in a:
        if k not in b:
            continue
        line = f"{k:<28}"
        for i in range(len(cols)):
            ratio = b[k][i] / a[k][i]
            worst = max(worst, abs(ratio - 1))
            line += f"{a[k][i]:>14.4f}{b[k][i]:>13.4f}{ratio:>8.3f}"
        print(line)
table("prefill, bench_prefill (ms)", "ms", prefill("base"), prefill("new"), ["graph", "eager"])
table("decode, bench_decode (us per call, graph replay)", "us", decode("base"), decode("new"), ["hot", "cold"])
print(f"\nlargest deviation: {100 * worst:.2f} %")
PY
echo "total: $(( $(date +%s) - t0 )) s; logs in $OUT"
