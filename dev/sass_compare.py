#!/usr/bin/env python3
"""sass_compare.py - is a refactor of src/cuda code-neutral? Compiles every src/cuda/*.cu of two
source trees to sm_90a cubins with the library's nvcc flags and compares each kernel's machine code
(its .text section), shared-memory size and resource info (.nv.info: registers, barriers, stack),
kernel by kernel, whatever file each kernel now lives in. No cuobjdump needed.

    dev/sass_compare.py BASE_TREE NEW_TREE

BASE_TREE is e.g. `git archive 7a7bb8a | tar -x -C build-base`. Prints one line per kernel:
identical, changed (what differs), or only in one tree; exits 1 if any kernel differs. Names of
anonymous namespaces (which embed the source file's name) are normalized. Takes a few minutes a
tree on two cores (-j via GDN_JOBS, default 2). GDN_SASS_ONLY (a regex on file names) compares a
subset; GDN_SASS_BASE_CACHE keeps the base cubins; GDN_SASS_RENAME maps renamed types; GDN_SASS_SUB
rewrites mangled names (a template parameter added with a default)."""
import concurrent.futures, glob, os, re, struct, subprocess, sys, tempfile

NVCC = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
FLAGS = ["-O3", "-DNDEBUG", "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden",
         "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-std=c++17",
         "-DGDN_BUILDING_LIBRARY", "-DGDN_WITH_CUDA", "-cubin"]


def sections(path):
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx]
    def name(off):
        s = strtab[4] + off
        return data[s:data.index(b"\0", s)].decode()
    out = {}
    for h in hdrs:
        nm = name(h[0])
        body = data[h[4]:h[4] + h[5]] if h[1] != 8 else b"nobits:%d" % h[5]  # SHT_NOBITS: size only
        out[nm] = body
    return out


RENAMES = [pair.split("=") for pair in os.environ.get("GDN_SASS_RENAME", "").split(",") if "=" in pair]
# GDN_SASS_SUB=REGEX=>REPL;..: substitutions on mangled names, e.g. a template parameter added with
# its default value ('ELi8EEEv=>EEEv' maps recurrent_fwd_mma_kernel<.., 8> onto the old name).
SUBS = [pair.split("=>") for pair in os.environ.get("GDN_SASS_SUB", "").split(";") if "=>" in pair]


def anon(name):
    """The mangled name with each anonymous namespace (<len>_GLOBAL__N__<file hash>) as ANON, and
    each type renamed between the trees (GDN_SASS_RENAME=new=old,...: ChunkParams=params) spelled
    the old way."""
    for new, old in RENAMES:
        name = name.replace("%d%s" % (len(new), new), "%d%s" % (len(old), old))
    for pat, repl in SUBS:
        name = re.sub(pat, repl, name)
    out, i = "", 0
    for m in re.finditer(r"(\d+)(_GLOBAL__N__)", name):
        if m.start() < i:
            continue
        out += name[i:m.start()] + "4ANON"
        i = m.start(2) + int(m.group(1))
    return out + name[i:]


def kernels(tree, tmp, cache=None):
    srcs = sorted(glob.glob(os.path.join(tree, "src/cuda/*.cu")))
    only = os.environ.get("GDN_SASS_ONLY")  # a regex on file names, to compare a subset
    if only:
        srcs = [s for s in srcs if re.search(only, os.path.basename(s))]
    def build(src):
        cubin = os.path.join(cache or tmp, os.path.basename(src) + ".cubin")
        if cache and os.path.exists(cubin):
            return cubin
        subprocess.run([NVCC, *FLAGS, "-I", os.path.join(tree, "include"), "-I", os.path.join(tree, "src"),
                        src, "-o", cubin], check=True)
        return cubin
    with concurrent.futures.ThreadPoolExecutor(int(os.environ.get("GDN_JOBS", "2"))) as ex:
        cubins = list(ex.map(build, srcs))
    ks = {}
    for c in cubins:
        secs = sections(c)
        for nm, body in secs.items():
            if not nm.startswith(".text."):
                continue
            fn = nm[len(".text."):]
            key = anon(fn)
            info = secs.get(".nv.info." + fn, b"")
            shared = secs.get(".nv.shared." + fn, b"")
            ks[key] = (body, info, shared)
    return ks


def main():
    base, new = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tb, tempfile.TemporaryDirectory() as tn:
        # GDN_SASS_BASE_CACHE: a folder that keeps the base tree's cubins between runs (the base
        # tree must not change while it is used).
        cache = os.environ.get("GDN_SASS_BASE_CACHE")
        if cache:
            os.makedirs(cache, exist_ok=True)
        kb, kn = kernels(base, tb, cache), kernels(new, tn)
    bad = 0
    for k in sorted(set(kb) | set(kn)):
        if k not in kn:
            print("only-base", k); bad += 1
        elif k not in kb:
            print("only-new ", k); bad += 1
        elif kb[k] == kn[k]:
            print("identical", k)
        else:
            what = [n for n, a, b in zip(("code", "info", "shared"), kb[k], kn[k]) if a != b]
            print("changed  ", k, "(%s; code %d -> %d bytes)" % (", ".join(what), len(kb[k][0]), len(kn[k][0])))
            bad += 1
    print("%d kernels, %d differ" % (len(set(kb) | set(kn)), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
