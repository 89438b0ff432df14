"""Builds pydyad for pip: ``pip install --no-build-isolation ./python``.

The pure-Python package is python/pydyad. The extension (pydyad._pydyad) is
built by the project's own CMake, for the interpreter running pip, with only
the targets it needs (the client libraries and the extension; no tests, no
benchmarks). libdyad_client and libdyad_ctx are copied beside the extension,
which finds them through a RUNPATH of $ORIGIN, so the installed package
needs no DYAD install prefix and no LD_LIBRARY_PATH. The version is the
CMake project version.

Environment: DYAD_CMAKE_ARGS adds CMake arguments (e.g.
"-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"); PYDYAD_CMAKE_BUILD_DIR keeps CMake's
build tree in that directory (default: under setuptools' build directory),
so a rebuild is incremental; PYDYAD_BUILD_BASE moves setuptools' own build
and metadata directories out of python/ (default python/build and
python/pydyad.egg-info); CMAKE_BUILD_PARALLEL_LEVEL sets the build's
parallelism (default: the number of CPUs).
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*dyad\s+VERSION\s+([0-9.]+)", text)
    if not match:
        sys.exit(f"setup.py: no project version in {ROOT / 'CMakeLists.txt'}")
    return match.group(1)


class CMakeBuild(build_ext):
    """build_ext that runs CMake instead of compiling sources itself."""

    def build_extension(self, ext):
        if shutil.which("cmake") is None:
            sys.exit("setup.py: cmake not found (apt-get install cmake; see scripts/install-deps.sh)")
        build_dir = pathlib.Path(os.environ.get("PYDYAD_CMAKE_BUILD_DIR")
                                 or pathlib.Path(self.build_temp) / "cmake").resolve()
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DDYAD_BUILD_TESTS=OFF", "-DDYAD_BUILD_BENCH=OFF",
            f"-DPYDYAD_PYTHON={sys.executable}",
            "-DPYDYAD_BUNDLED_LIBS=ON",
            # The libraries are copied out of the build tree as they are.
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        ] + shlex.split(os.environ.get("DYAD_CMAKE_ARGS", ""))
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
        major = project_version().split(".")[0]
        for lib in ("libdyad_client", "libdyad_ctx"):
            name = f"{lib}.so.{major}"  # the SONAME the extension asks for
            shutil.copyfile(build_dir / name, target.parent / name)


def build_options():
    base = os.environ.get("PYDYAD_BUILD_BASE")
    if not base:
        return {}
    os.makedirs(base, exist_ok=True)
    return {"build": {"build_base": base}, "egg_info": {"egg_base": base}}


setup(
    version=project_version(),
    options=build_options(),
    ext_modules=[Extension("pydyad._pydyad", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
