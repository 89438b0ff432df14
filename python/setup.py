"""Builds pydyad for pip: ``pip install --no-build-isolation ./python``.

The pure-Python package is python/pydyad. The extension (pydyad._pydyad) is
built with CMake for the interpreter running pip, in one of two ways:

* against an installed DYAD, when DYAD_PREFIX names its prefix, or when this
  directory is not inside a DYAD source tree (an sdist of pydyad): CMake
  runs on this directory alone, finds the install with find_package(dyad),
  and the extension uses that install's libdyad_client/libdyad_ctx (a
  RUNPATH to its library directory). One copy of the client libraries per
  process, the install's.
* otherwise, from the DYAD source tree around this directory: the project's
  own CMake builds the client libraries and the extension (no tests, no
  benchmarks), and copies libdyad_client and libdyad_ctx beside the
  extension, found through a RUNPATH of $ORIGIN: the installed package needs
  no DYAD install and no LD_LIBRARY_PATH.

Either way the wheel is for this machine (tag linux_x86_64, not manylinux):
it is built to be installed here, not uploaded. Nothing is written into the
source tree: setuptools' build and egg-info directories go to a temporary
directory (or PYDYAD_BUILD_BASE).

The version is the CMake project version of the source tree, or, in an
sdist, the one recorded in its PKG-INFO.

Environment: DYAD_PREFIX (above); DYAD_CMAKE_ARGS adds CMake arguments (e.g.
"-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"); PYDYAD_CMAKE_BUILD_DIR keeps CMake's
build tree in that directory (default: under the build directory), so a
rebuild is incremental; PYDYAD_BUILD_BASE keeps setuptools' build and
metadata directories there; CMAKE_BUILD_PARALLEL_LEVEL sets the build's
parallelism (default: the number of CPUs).
"""

import atexit
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def source_tree():
    """The DYAD source tree this directory belongs to, or None (an sdist)."""
    top = ROOT / "CMakeLists.txt"
    if top.is_file() and re.search(r"project\(\s*dyad\s", top.read_text()):
        return ROOT
    return None


def project_version():
    tree = source_tree()
    if tree is not None:
        text = (tree / "CMakeLists.txt").read_text()
        match = re.search(r"project\(\s*dyad\s+VERSION\s+([0-9.]+)", text)
        if match:
            return match.group(1)
        sys.exit(f"setup.py: no project version in {tree / 'CMakeLists.txt'}")
    pkg_info = HERE / "PKG-INFO"
    if pkg_info.is_file():
        match = re.search(r"^Version:\s*(\S+)", pkg_info.read_text(), re.M)
        if match:
            return match.group(1)
    sys.exit(f"setup.py: {HERE} is neither in a DYAD source tree nor an sdist with PKG-INFO")


class CMakeBuild(build_ext):
    """build_ext that runs CMake instead of compiling sources itself."""

    def build_extension(self, ext):
        if shutil.which("cmake") is None:
            sys.exit("setup.py: cmake not found (apt-get install cmake; see scripts/install-deps.sh)")
        build_dir = pathlib.Path(os.environ.get("PYDYAD_CMAKE_BUILD_DIR")
                                 or pathlib.Path(self.build_temp) / "cmake").resolve()
        prefix = os.environ.get("DYAD_PREFIX", "")
        tree = source_tree()
        standalone = bool(prefix) or tree is None
        common = [
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPYDYAD_PYTHON={sys.executable}",
            # The libraries are used from the build tree as they are.
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        ]
        if standalone:
            configure = ["cmake", "-S", str(HERE), "-B", str(build_dir)] + common
            if prefix:
                configure.append(f"-DCMAKE_PREFIX_PATH={os.path.abspath(prefix)}")
        else:
            configure = ["cmake", "-S", str(tree), "-B", str(build_dir)] + common + [
                "-DDYAD_BUILD_TESTS=OFF", "-DDYAD_BUILD_BENCH=OFF",
                "-DPYDYAD_BUNDLED_LIBS=ON",
            ]
        configure += shlex.split(os.environ.get("DYAD_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_pydyad",
                               "--parallel", jobs])

        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        built = build_dir / "python" / "pydyad" / target.name
        if not built.exists():
            sys.exit(f"setup.py: CMake did not produce {built} (was pybind11-dev or "
                     f"the headers of {sys.executable} missing? see the CMake output)")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)
        if standalone:
            return
        major = project_version().split(".")[0]
        for lib in ("libdyad_client", "libdyad_ctx"):
            name = f"{lib}.so.{major}"  # the SONAME the extension asks for
            shutil.copyfile(build_dir / name, target.parent / name)


def build_options():
    """setuptools' build and egg-info directories, outside the source tree."""
    base = os.environ.get("PYDYAD_BUILD_BASE")
    if base:
        os.makedirs(base, exist_ok=True)
    else:
        base = tempfile.mkdtemp(prefix="pydyad-build-")
        atexit.register(shutil.rmtree, base, ignore_errors=True)
    return {"build": {"build_base": base}, "egg_info": {"egg_base": base}}


setup(
    version=project_version(),
    options=build_options(),
    ext_modules=[Extension("pydyad._pydyad", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
