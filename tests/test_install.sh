#!/usr/bin/env bash
# test_install.sh - installs a built libgdn into a temporary prefix and builds tests/install/consumer.c
# against it one way, then runs it (ctest runs the three ways as test_install_{cmake,pkgconfig,static}):
#   cmake      find_package(gdn): gdn::gdn (shared, found through the build's rpath) and gdn::gdn_static
#   pkgconfig  pkg-config libgdn, run with LD_LIBRARY_PATH; then pkg-config --static with libgdn.a
#   static     the README's static link line: libgdn.a plus the libraries it lists
# Exits 77 (skipped) when the way's tool is missing (pkg-config; scripts/test.sh installs it).
#   bash tests/test_install.sh <way> <build dir> <version> <C compiler> <cuda: ON|OFF> [<CUDA lib dir>]
set -euo pipefail
way=$1 build=$2 version=$3 cc=$4 cuda=$5 cuda_libdir=${6:-}
src=$(cd "$(dirname "$0")/install" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gdn_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

fail() { echo "test_install ($way): $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install failed"; }
archive=$(find "$prefix" -name libgdn.a | head -n 1)
[ -n "$archive" ] || fail "cmake --install put no libgdn.a under the prefix"
libdir=$(dirname "$archive")
for f in "$prefix/include/gdn.h" "$libdir/libgdn.a" "$libdir/libgdn.so" "$libdir/libgdn.so.${version%%.*}" \
         "$libdir/libgdn.so.$version" "$libdir/cmake/gdn/gdnConfig.cmake" "$libdir/cmake/gdn/gdnConfigVersion.cmake" \
         "$libdir/pkgconfig/libgdn.pc" "$prefix/bin/gdn"; do
    [ -e "$f" ] || fail "cmake --install did not install ${f#"$prefix"/}"
done

# What a static link of libgdn.a needs besides it (README "Link against").
static_libs=(-lpthread -lm)
if [ "$cuda" = ON ]; then
    static_libs=(-L"$cuda_libdir" -lcudart_static -lpthread -ldl -lrt -lm -lstdc++)
fi

# The program must not load libgdn.so (static) or must (shared); then it must run and pass.
check() { # <binary> <static|shared>
    local needed
    needed=$(readelf -d "$1" | grep -c 'NEEDED.*libgdn\.so' || true)
    if [ "$2" = static ] && [ "$needed" != 0 ]; then fail "$1 needs libgdn.so but should be static"; fi
    if [ "$2" = shared ] && [ "$needed" = 0 ]; then fail "$1 does not load libgdn.so"; fi
    "$1" || fail "$1 failed"
}

case $way in
cmake)
    cmake -S "$src" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
        -DGDN_EXPECTED_VERSION="$version" -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" 2>&1 ||
        { cat "$tmp/configure.log"; fail "configuring the find_package(gdn) consumer failed"; }
    cmake --build "$tmp/consumer" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "building the consumer failed"; }
    check "$tmp/consumer/consumer_shared" shared
    check "$tmp/consumer/consumer_static" static
    ;;
pkgconfig)
    command -v pkg-config >/dev/null 2>&1 || { echo "test_install: pkg-config not installed: skipped"; exit 77; }
    export PKG_CONFIG_PATH=$libdir/pkgconfig
    got=$(pkg-config --modversion libgdn)
    [ "$got" = "$version" ] || fail "pkg-config --modversion libgdn = $got, want $version"
    read -ra flags <<<"$(pkg-config --cflags --libs libgdn)"
    "$cc" -o "$tmp/consumer_pc" "$src/consumer.c" "${flags[@]}" -lm
    LD_LIBRARY_PATH=$libdir check "$tmp/consumer_pc" shared
    # pkg-config --static lists what libgdn.a needs; -l:libgdn.a picks the archive over the .so
    read -ra flags <<<"$(pkg-config --static --cflags --libs libgdn)"
    flags=("${flags[@]/#-lgdn/-l:libgdn.a}")
    "$cc" -o "$tmp/consumer_pc_static" "$src/consumer.c" "${flags[@]}"
    check "$tmp/consumer_pc_static" static
    ;;
static)
    "$cc" -o "$tmp/consumer_static" "$src/consumer.c" -I"$prefix/include" "$libdir/libgdn.a" "${static_libs[@]}"
    check "$tmp/consumer_static" static
    # the shared library with an rpath, as the README shows
    "$cc" -o "$tmp/consumer_rpath" "$src/consumer.c" -I"$prefix/include" -L"$libdir" -lgdn -Wl,-rpath,"$libdir" -lm
    check "$tmp/consumer_rpath" shared
    ;;
*) fail "unknown way '$way' (cmake, pkgconfig, static)" ;;
esac
echo "test_install ($way): ok"
