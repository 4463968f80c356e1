"""Build step of the libgdn Python package (pyproject.toml holds the metadata): puts libgdn.so into
libgdn/_lib/ of the built package, taken from $GDN_LIBRARY, else from the checkout's
build/libgdn.so, else from a CMake build of the checkout made here ($GDN_CMAKE_ARGS: extra
options). The wheel is marked platform-specific since it carries a shared library."""

import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def find_or_build_library(build_temp):
    if os.environ.get("GDN_LIBRARY"):
        path = os.environ["GDN_LIBRARY"]
        if not os.path.isfile(path):
            raise RuntimeError(f"GDN_LIBRARY={path} is not a file")
        return path
    built = os.path.join(REPO, "build", "libgdn.so")
    if os.path.isfile(built):
        return built
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        raise RuntimeError("libgdn.so not found: set GDN_LIBRARY, or build from a libgdn checkout")
    out = os.path.join(build_temp, "cmake")
    extra = shlex.split(os.environ.get("GDN_CMAKE_ARGS", ""))
    subprocess.run(["cmake", "-S", REPO, "-B", out, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_TESTING=OFF"] + extra,
                   check=True)
    subprocess.run(["cmake", "--build", out, "--target", "gdn", "-j", str(os.cpu_count() or 2)], check=True)
    return os.path.join(out, "libgdn.so")


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        build_temp = self.get_finalized_command("build").build_temp
        lib = find_or_build_library(build_temp)
        dst = os.path.join(self.build_lib, "libgdn", "_lib")
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(lib, os.path.join(dst, "libgdn.so"))
        self.announce(f"libgdn: packaged {lib}", level=2)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
