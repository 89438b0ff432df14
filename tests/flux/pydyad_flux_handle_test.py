"""pydyad's Dyad.init(flux_handle=...) with a real handle (issue 27): inside
`flux start --test-size=2`, rank 1 runs dyad.so and produces a file; this
process, on rank 0 (no module) and with FLUX_URI removed from its
environment, consumes it through the flux.Flux handle it passes to
Dyad.init. Usage (tests/flux/CMakeLists.txt):

    flux start --test-size=2 flux python pydyad_flux_handle_test.py BUILD_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    build = sys.argv[1]
    sys.path.insert(0, os.path.join(build, "python"))
    import flux
    from pydyad import Dyad, dyad_open

    work = tempfile.mkdtemp(prefix="dyad-pyflux.")
    prod, cons = os.path.join(work, "prod"), os.path.join(work, "cons")
    ns = f"pyflux{os.getpid()}"
    loaded = False
    try:
        os.makedirs(prod)
        subprocess.run(["flux", "exec", "-r", "1", "flux", "module", "load",
                        os.path.join(build, "lib", "dyad.so"), "--mode=FLUX_RPC", prod],
                       check=True, timeout=120)
        loaded = True
        env = dict(os.environ, DYAD_PATH_PRODUCER=prod, DYAD_KVS_NAMESPACE=ns,
                   LD_PRELOAD=os.path.join(build, "libdyad_wrapper.so"))
        subprocess.run(["flux", "exec", "-r", "1",
                        os.path.join(build, "tests", "flux", "upstream_ci", "c_prod"), "2", prod],
                       env=env, check=True, timeout=60)

        h = flux.Flux()
        uri = os.environ.pop("FLUX_URI")
        os.environ["DYAD_SERVICE_SOCKET"] = os.path.join(work, "no-module.sock")
        os.environ["DYAD_CONSUME_TIMEOUT"] = "30"
        d = Dyad()
        # Refused before C sees it: not a handle.
        for bogus in (object(), 1):
            try:
                d.init(cons_managed_path=cons, flux_handle=bogus)
            except TypeError:
                pass
            else:
                raise AssertionError(f"flux_handle={bogus!r} was accepted")
        d.init(reinit=True, cons_managed_path=cons, kvs_namespace=ns, flux_handle=h)
        os.environ["FLUX_URI"] = uri
        path = os.path.join(cons, "data1.txt")
        with dyad_open(path, "rb", dyad_ctx=d) as f:
            data = f.read()
        want = bytes((ord("a") + (1 * 7 + k) % 26) for k in range(200 + 37)) + b"\n"
        assert data == want, f"{len(data)} bytes, expected {len(want)}"
        d.finalize()
        print("OK: consumed through the caller's flux.Flux handle")
        return 0
    finally:
        if loaded:
            subprocess.run(["flux", "exec", "-r", "1", "flux", "module", "remove", "dyad"],
                           timeout=60)
        subprocess.run(["flux", "kvs", "namespace", "remove", ns], timeout=30,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
