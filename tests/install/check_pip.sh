#!/bin/sh
# `pip install ./python` as docs/python.md tells a user to run it: Debian's
# interpreter, a virtual environment that sees the system packages, no
# network, no build isolation. Then: `pip show pydyad` knows it, the package
# imports from the venv (not from the build tree) with its own copy of the
# client libraries, moves a file between two real services, and
# `pip uninstall` removes it; nothing was written into the source tree.
# Second, an sdist of pydyad, unpacked alone (no DYAD tree around it), built
# with DYAD_PREFIX against an installed DYAD: the extension uses the
# install's libraries (the wheel bundles none) and moves a file too.
#
# usage: check_pip.sh BUILD_DIR SOURCE_DIR PYTHON
# PYDYAD_CMAKE_BUILD_DIR (set by the test registration) keeps setup.py's CMake
# tree between runs, so only the first run compiles; the sdist's build keeps
# its tree (and the DYAD install it builds against) beside it.
set -eu
BUILD_DIR=$(cd "$1" && pwd)
SRC_DIR=$(cd "$2" && pwd)
PYTHON=$3
WORK=$(mktemp -d /tmp/dyad-pip-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM
unset PYTHONPATH LD_LIBRARY_PATH DYAD_PREFIX PYDYAD_BUILD_BASE

fail() { echo "check_pip: $*" >&2; exit 1; }

# The source tree's python/ before and after: pip must not write into it.
snapshot() { (cd "$SRC_DIR/python" && find . -name __pycache__ -prune -o -print | sort); }
snapshot >"$WORK/tree.before"

"$PYTHON" -m venv --system-site-packages "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install --no-build-isolation --no-index --disable-pip-version-check -q \
  "$SRC_DIR/python" >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log" >&2; fail "pip install failed"; }
snapshot >"$WORK/tree.after"
if ! cmp -s "$WORK/tree.before" "$WORK/tree.after"; then
  diff "$WORK/tree.before" "$WORK/tree.after" >&2 || true
  fail "pip install ./python wrote into the source tree"
fi

want=$(sed -n 's/^project(dyad VERSION \([0-9.]*\).*/\1/p' "$SRC_DIR/CMakeLists.txt")
"$VPY" -m pip show pydyad >"$WORK/show" || fail "pip show pydyad failed"
grep -qx "Version: $want" "$WORK/show" || { cat "$WORK/show" >&2; fail "pip show: not version $want"; }
grep -qx "Location: $WORK/venv/lib/python3[.0-9]*/site-packages" "$WORK/show" ||
  { cat "$WORK/show" >&2; fail "pip show: not installed in the venv"; }

# From another directory, so nothing of the source tree is importable.
# use_pydyad VENV_PYTHON LIBS_UNDER: imports pydyad from the venv, with the
# client libraries from LIBS_UNDER, and moves a file between two services.
cd "$WORK"
use_pydyad() {
"$1" - "$BUILD_DIR" "$(dirname "$(dirname "$1")")" "$2" <<'PY'
import os, subprocess, sys, textwrap
build_dir, venv, libs_under = sys.argv[1], sys.argv[2], sys.argv[3]
import pydyad, pydyad._pydyad
assert pydyad.__file__.startswith(venv), pydyad.__file__
maps = open("/proc/self/maps").read()
libs = {l.split()[-1] for l in maps.splitlines() if "libdyad_c" in l}
assert libs and all(p.startswith(libs_under) for p in libs), (libs, libs_under)
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
}
use_pydyad "$VPY" "$WORK/venv" || fail "the pip-installed pydyad (bundled libraries)"

"$VPY" -m pip uninstall -y -q pydyad
if "$VPY" -c 'import pydyad' 2>/dev/null; then fail "pydyad still importable after uninstall"; fi

# An sdist, unpacked where no DYAD source tree is around it, against an
# installed DYAD. Fixed places under the build tree, so the kept CMake tree
# stays valid between runs.
KEEP="$BUILD_DIR/pydyad-wheel"
mkdir -p "$KEEP"
(cd "$SRC_DIR/python" && "$PYTHON" setup.py -q sdist -d "$WORK/dist") >"$WORK/sdist.log" 2>&1 ||
  { cat "$WORK/sdist.log" >&2; fail "setup.py sdist failed"; }
snapshot >"$WORK/tree.after"
cmp -s "$WORK/tree.before" "$WORK/tree.after" || fail "setup.py sdist wrote into the source tree"
rm -rf "$KEEP/sdist" "$KEEP/prefix"
mkdir "$KEEP/sdist"
tar -xzf "$WORK/dist"/pydyad-*.tar.gz -C "$KEEP/sdist" || fail "cannot unpack the sdist"
SDIST=$(echo "$KEEP/sdist"/pydyad-*)
for f in setup.py pyproject.toml PKG-INFO CMakeLists.txt src/_pydyad.cc cmake/site_dir.py \
         pydyad/__init__.py; do
  [ -f "$SDIST/$f" ] || fail "the sdist lacks $f"
done
cmake --install "$BUILD_DIR" --prefix "$KEEP/prefix" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log" >&2; fail "cmake --install failed"; }
"$PYTHON" -m venv --system-site-packages "$WORK/venv2"
V2="$WORK/venv2/bin/python"
env DYAD_PREFIX="$KEEP/prefix" PYDYAD_CMAKE_BUILD_DIR="$KEEP/standalone" \
  "$V2" -m pip install --no-build-isolation --no-index --disable-pip-version-check -q "$SDIST" \
  >"$WORK/pip2.log" 2>&1 || { cat "$WORK/pip2.log" >&2; fail "pip install of the sdist failed"; }
"$V2" -m pip show pydyad | grep -qx "Version: $want" || fail "sdist: pip show: not version $want"
if find "$WORK/venv2" -name 'libdyad_*' | grep -q .; then
  fail "the sdist's wheel bundles client libraries: $(find "$WORK/venv2" -name 'libdyad_*')"
fi
use_pydyad "$V2" "$KEEP/prefix/lib/" || fail "the sdist-built pydyad (installed libraries)"
echo "pip install OK"
