#!/usr/bin/env bash
# check-coop.sh - one device call for dev/prefill/chunk-coop.patch (chunk_prep and the main pass in
# one cooperative grid when the main pass needs at most half the SMs; dev/prefill/README.md). Copies
# the tree to /tmp/coop_tree, applies the patch there, puts the unpatched sources beside it as
# .stage/base and runs that copy's check-wg-gva.sh with BASE=.stage/base: builds (patched: main,
# nogroup, h4; unpatched: base), test_cuda_chunk on main and h4 (the patch adds a graph-capture
# case of the cooperative path), digests of all four (the patch changes no arithmetic: base must
# equal main bit for bit), memcheck and racecheck, bench_prefill with main/base, and with FLA=1
# FLA beside main.
#   run(command="FLA=1 bash dev/prefill/check-coop.sh 2>&1 | tail -n 45",
#       carry=[".peers/fla", "build-prefill/dev/triton_autotune.tgz"], kind="nvidia-h100-x1", timeout_s=600)
# Without FLA about 150 s; with it about 300 s.
set -u -o pipefail
R=$(cd "$(dirname "$0")/../.." && pwd)
T=/tmp/coop_tree
rm -rf $T && mkdir -p $T/.stage/base
cp -r "$R"/CMakeLists.txt "$R"/include "$R"/src "$R"/tests "$R"/tools "$R"/bench "$R"/dev "$T"/
cp -r "$R"/CMakeLists.txt "$R"/include "$R"/src "$R"/tests "$R"/tools "$R"/bench "$T"/.stage/base/
(cd $T && patch -p1 -s <"$R/dev/prefill/chunk-coop.patch") || { echo "patch does not apply"; exit 1; }
[ -d "$R/.peers" ] && ln -s "$R/.peers" $T/.peers
[ -d "$R/build-prefill" ] && ln -s "$R/build-prefill" $T/build-prefill
[ -d "$R/python" ] && ln -s "$R/python" $T/python
BASE=.stage/base bash $T/dev/prefill/check-wg-gva.sh
