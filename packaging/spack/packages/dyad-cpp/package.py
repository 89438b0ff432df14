# Spack recipe of DYAD in C++ (packaging/spack/README.md). Named dyad-cpp,
# not dyad: Spack's builtin `dyad` is upstream's Flux-based DYAD, which
# installs libraries and headers of the same names.

from spack.package import *


class DyadCpp(CMakePackage):
    """DYAD in C++: moves files between the nodes of an HPC job as a side
    effect of ordinary file I/O, through one dyad-service daemon per node
    (no Flux needed). Source-compatible with upstream DYAD's C API, C++
    streams, LD_PRELOAD wrapper and pydyad."""

    # No homepage or public release yet: build a checkout with `spack develop`
    # (README.md). The version is the CMake project version.
    version("0.2.0")

    license("MIT")

    variant("ucx", default=True, description="UCX transport (DTL mode UCX)")
    variant("ofi", default=True, description="libfabric transport (DTL modes OFI, MARGO)")
    variant("redis", default=True, description="Redis metadata store (redis://, Cluster, Sentinel)")
    variant("munge", default=True, description="MUNGE authentication between services")
    variant("python", default=True, description="pydyad, the Python bindings")
    variant("flux", default=False,
            description="Flux integration: the dyad.so module, the flux:// store, "
            "consumers on brokers without the module")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.20:", type="build")
    depends_on("pkgconfig", type="build")
    depends_on("cli11", type="build")
    depends_on("nlohmann-json", type="build")
    depends_on("asio@1.22:", type="build")
    depends_on("openssl")

    depends_on("ucx", when="+ucx")
    depends_on("libfabric", when="+ofi")
    depends_on("hiredis", when="+redis")
    depends_on("munge", when="+munge")
    extends("python", when="+python")
    depends_on("python@3.8:", when="+python", type=("build", "run"))
    depends_on("py-pybind11", when="+python", type="build")
    depends_on("flux-core", when="+flux")
    depends_on("googletest", type="test")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("DYAD_ENABLE_UCX", "ucx"),
            self.define_from_variant("DYAD_ENABLE_OFI", "ofi"),
            self.define_from_variant("DYAD_ENABLE_REDIS", "redis"),
            self.define_from_variant("DYAD_ENABLE_MUNGE", "munge"),
            self.define_from_variant("DYAD_ENABLE_PYTHON", "python"),
            self.define_from_variant("DYAD_ENABLE_FLUX", "flux"),
            self.define("DYAD_BUILD_TESTS", self.run_tests),
            self.define("DYAD_BUILD_BENCH", False),
            # Spack has its own compiler cache setting (config:ccache).
            self.define("DYAD_USE_CCACHE", False),
        ]
        if spec.satisfies("+python"):
            python = spec["python"]
            args.append(self.define("PYDYAD_PYTHON", python.command.path))
            # pydyad goes where Spack's python looks for extensions.
            args.append(self.define("PYDYAD_SITE_DIR", python.package.platlib))
        return args
