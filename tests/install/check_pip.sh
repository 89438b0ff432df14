#!/bin/sh
# `pip install ./python` as docs/python.md tells a user to run it: Debian's
# interpreter, a virtual environment that sees the system packages, no
# network, no build isolation. Then: `pip show pydyad` knows it, the package
# imports from the venv (not from the build tree) with its own copy of the
# client libraries, moves a file between two real services, and
# `pip uninstall` removes it.
#
# usage: check_pip.sh BUILD_DIR SOURCE_DIR PYTHON
# PYDYAD_CMAKE_BUILD_DIR (set by the test registration) keeps setup.py's CMake
# tree between runs, so only the first run compiles.
set -eu
BUILD_DIR=$(cd "$1" && pwd)
SRC_DIR=$(cd "$2" && pwd)
PYTHON=$3
WORK=$(mktemp -d /tmp/dyad-pip-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM
unset PYTHONPATH LD_LIBRARY_PATH

fail() { echo "check_pip: $*" >&2; exit 1; }

"$PYTHON" -m venv --system-site-packages "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install --no-build-isolation --no-index --disable-pip-version-check -q \
  "$SRC_DIR/python" >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log" >&2; fail "pip install failed"; }

want=$(sed -n 's/^project(dyad VERSION \([0-9.]*\).*/\1/p' "$SRC_DIR/CMakeLists.txt")
"$VPY" -m pip show pydyad >"$WORK/show" || fail "pip show pydyad failed"
grep -qx "Version: $want" "$WORK/show" || { cat "$WORK/show" >&2; fail "pip show: not version $want"; }
grep -qx "Location: $WORK/venv/lib/python3[.0-9]*/site-packages" "$WORK/show" ||
  { cat "$WORK/show" >&2; fail "pip show: not installed in the venv"; }

# From another directory, so nothing of the source tree is importable.
cd "$WORK"
"$VPY" - "$BUILD_DIR" "$WORK/venv" <<'PY'
import os, subprocess, sys, textwrap
build_dir, venv = sys.argv[1], sys.argv[2]
import pydyad, pydyad._pydyad
assert pydyad.__file__.startswith(venv), pydyad.__file__
maps = open("/proc/self/maps").read()
libs = {l.split()[-1] for l in maps.splitlines() if "libdyad_c" in l}
assert libs and all(p.startswith(venv) for p in libs), libs
from pydyad.cluster import LocalCluster
with LocalCluster(nodes=2, build_dir=build_dir, namespace="pip-test") as cl:
    def node(rank, code):
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=cl.node_env(rank),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        return r.stdout
    node(0, """
        import os, pydyad
        with pydyad.dyad_open(os.path.join(os.environ["DYAD_PATH_PRODUCER"], "f.txt"), "w") as f:
            f.write("from the wheel")
    """)
    out = node(1, """
        import os, pydyad
        with pydyad.dyad_open(os.path.join(os.environ["DYAD_PATH_CONSUMER"], "f.txt")) as f:
            print(f.read())
    """)
    assert out.strip() == "from the wheel", out
print("pip-installed pydyad moved a file")
PY

"$VPY" -m pip uninstall -y -q pydyad
if "$VPY" -c 'import pydyad' 2>/dev/null; then fail "pydyad still importable after uninstall"; fi
echo "pip install OK"
