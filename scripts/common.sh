# common.sh - sourced by test.sh and demo.sh: installs missing Debian tools, and configures and
# builds libgdn with the one set of options both scripts use (Release, warnings as errors, the CUDA
# backend when nvcc is found) into the one build directory (GDN_BUILD_DIR, default build/), so
# that either script run after the other rebuilds nothing that did not change.

# gdn_ensure_tools <command> <Debian package> ...: installs the packages of the missing commands
# with apt-get (root only), else exits naming them.
gdn_ensure_tools() {
    local missing=() pkgs=() cmd pkg
    while [ $# -gt 0 ]; do
        cmd=$1 pkg=$2
        shift 2
        command -v "$cmd" >/dev/null 2>&1 || { missing+=("$cmd"); pkgs+=("$pkg"); }
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "${0##*/}: missing ${missing[*]}; install ${pkgs[*]} (or run as root on Debian)" >&2
        exit 1
    fi
    echo "${0##*/}: installing ${pkgs[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

# The build directory, absolute (GDN_BUILD_DIR is absolute or relative to the repository root).
gdn_build_dir() {
    local build=${GDN_BUILD_DIR:-build}
    case $build in /*) ;; *) build=$PWD/$build ;; esac
    echo "$build"
}

# gdn_build <build dir> <jobs>: configure (log in <build dir>/configure.log), print the line that
# says whether the CUDA backend is built, build.
gdn_build() {
    local build=$1 jobs=$2
    if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
        export PATH="/usr/local/cuda/bin:$PATH" # so CMake finds the CUDA compiler
    fi
    mkdir -p "$build"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGDN_WERROR=ON >"$build/configure.log" 2>&1 ||
        { cat "$build/configure.log"; exit 1; }
    grep -E "^-- libgdn" "$build/configure.log" || true
    cmake --build "$build" -j"$jobs"
}
