#!/usr/bin/env bash
# carry_build.sh - spend the device's minutes on measuring, not compiling: build the variants here
# (nvcc 13.0, sm_90a) and carry the binaries to the device xz-compressed (a 15 MB libgdn.so or static
# test binary packs to ~2.6 MB; a call's carry holds 64 MiB).
#
#   bash dev/carry_build.sh variant WORKTREE BUILD [MAIN_BUILD]
#       BUILD := a copy of MAIN_BUILD (default /tmp/build-cuda: main's configured tree, built at main's
#       HEAD: the objects of unchanged files are taken as they are) with its
#       paths pointed at WORKTREE and every file older than the objects except those the worktree
#       changes against main, then `cmake --build`: only the changed translation units recompile
#       (a prep or recurrent change: ~1.5-2.5 min on 2 cores instead of ~5 for the whole library).
#   bash dev/carry_build.sh pack NAME BUILD [BINARY ...]
#       build-dev/carry/NAME.tar.xz with NAME/libgdn.so and the named binaries (paths relative to BUILD,
#       e.g. tests/test_cuda_chunk bench_decode).
#   on the device: mkdir -p /tmp/u && xz -dc build-dev/carry/NAME.tar.xz | tar -C /tmp/u -xf -
#       then GDN_LIBRARY=/tmp/u/NAME/libgdn.so, /tmp/u/NAME/test_cuda_chunk, ... (carry build-dev/carry)
set -eu
R=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in
variant)
    WT=$(cd "$2" && pwd) B=$3 M=${4:-/tmp/build-cuda}
    rm -rf "$B" && cp -a "$M" "$B"
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$M/CMakeCache.txt")
    grep -rlI --null "$src" "$B" | xargs -0 sed -i "s#$src#$WT#g"
    grep -rlI --null "$M" "$B" | xargs -0 sed -i "s#$M#$B#g"
    old="$(date -d '-1 day' '+%Y-%m-%d %H:%M')"
    find "$B" -type f ! -name '*.o' ! -name '*.a' ! -name '*.so*' ! -perm -u+x -print0 | xargs -0 touch -h -d "$old"
    (cd "$WT" && git ls-files -z | xargs -0 touch -h -d "$old" && git diff --name-only main -- | xargs -r touch -c)
    cmake --build "$B" -j2 >"$B.log" 2>&1 || { tail -20 "$B.log"; exit 1; }
    grep -E "Building" "$B.log" || true
    ;;
pack)
    N=$2 B=$3
    shift 3
    S=$(mktemp -d)
    mkdir "$S/$N" && cp -L "$B/libgdn.so" "$S/$N/"
    for f in "$@"; do cp "$B/$f" "$S/$N/"; done
    mkdir -p "$R/build-dev/carry"
    tar -C "$S" -cf - "$N" | xz -6 -T2 >"$R/build-dev/carry/$N.tar.xz"
    rm -rf "$S"
    ls -la "$R/build-dev/carry/$N.tar.xz"
    ;;
*)
    sed -n '2,19p' "$0"
    exit 2
    ;;
esac
