#!/bin/sh
# scripts/install-deps.sh and the Makefile's use of it (issue 26, item 3),
# with stand-ins for dpkg-query, id, sudo and apt-get on PATH, so nothing is
# installed and any user can be played:
#  * the build set holds the compiler, the libraries and ccache, and none of
#    the test or benchmark toolchain (clang-16, python3-torch, gtest, ...);
#  * nothing missing: exit 0 and silence, as root or not;
#  * not root, no sudo, an optional package missing: the list, the apt-get
#    line, a one-line note of what is left out, exit 0, nothing installed;
#  * not root, a required package missing: the same list, exit 1;
#  * root (or a sudo without password): apt-get installs exactly what the
#    requested sets miss;
#  * `make -n`: install asks for the build set only and configures a tree
#    without tests or benchmarks; demo builds only its programs; test asks
#    for build + test;
#  * `make uninstall` removes the files of a manifest and DYAD's own
#    directories left empty, keeps everything else, and without a manifest
#    says so and fails.
#
# usage: check_install_deps.sh SOURCE_DIR
set -eu
SRC_DIR=$(cd "$1" && pwd)
WORK=$(mktemp -d /tmp/dyad-deps-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
trap 'exit 1' INT TERM
fail() { echo "check_install_deps: $*" >&2; exit 1; }

mkdir "$WORK/bin"
# dpkg-query -W -f=... PKG: installed unless PKG is in $FAKE_MISSING.
cat >"$WORK/bin/dpkg-query" <<'EOF'
#!/bin/sh
for a; do pkg=$a; done
case " $FAKE_MISSING " in
  *" $pkg "*) exit 1 ;;
esac
printf 'install ok installed'
EOF
cat >"$WORK/bin/id" <<'EOF'
#!/bin/sh
echo "$FAKE_UID"
EOF
# sudo: refuses (a password would be needed) unless FAKE_SUDO=yes.
cat >"$WORK/bin/sudo" <<'EOF'
#!/bin/sh
[ "${FAKE_SUDO:-no}" = yes ] || exit 1
[ "$1" = -n ] && shift
"$@"
EOF
cat >"$WORK/bin/apt-get" <<'EOF'
#!/bin/sh
echo "$*" >>"$FAKE_APT_LOG"
EOF
chmod +x "$WORK/bin/"*
export FAKE_APT_LOG="$WORK/apt.log"
DEPS="$SRC_DIR/scripts/install-deps.sh"

# run UID MISSING SETS...: exit status in $rc, stdout+stderr in $WORK/out
run() {
  uid=$1 missing=$2
  shift 2
  rm -f "$FAKE_APT_LOG"
  rc=0
  env PATH="$WORK/bin:$PATH" FAKE_UID="$uid" FAKE_MISSING="$missing" sh "$DEPS" "$@" \
    >"$WORK/out" 2>&1 || rc=$?
}
apt_called() { [ -f "$FAKE_APT_LOG" ]; }

echo "== the build set: compiler, libraries, ccache; no test or benchmark toolchain"
build=" $(sh "$DEPS" --list build | tr '\n' ' ') "
for p in cmake g++ pkg-config libssl-dev libcli11-dev ccache libucx-dev libhiredis-dev; do
  case "$build" in *" $p "*) ;; *) fail "build set lacks $p:$build" ;; esac
done
for p in clang-16 libfuzzer-16-dev python3-torch python3-h5py python3-matplotlib libgtest-dev \
         redis-server nftables strace; do
  case "$build" in *" $p "*) fail "build set holds $p (a test/bench package):$build" ;; esac
done
all=" $(sh "$DEPS" --list all | tr '\n' ' ') "
for p in clang-16 python3-torch libgtest-dev python3-matplotlib lua5.1 ccache; do
  case "$all" in *" $p "*) ;; *) fail "set all lacks $p" ;; esac
done

echo "== nothing missing: exit 0, silent, for root and others"
for uid in 0 1000; do
  run "$uid" "" build test bench
  [ "$rc" -eq 0 ] || fail "uid $uid, nothing missing: exit $rc: $(cat "$WORK/out")"
  [ ! -s "$WORK/out" ] || fail "uid $uid, nothing missing: said $(cat "$WORK/out")"
  apt_called && fail "uid $uid, nothing missing: apt-get ran"
done

echo "== not root, no sudo, optional packages missing: listed, apt-get line, exit 0"
run 1000 "libucx-dev libhiredis-dev clang-16" build
[ "$rc" -eq 0 ] || fail "optional missing: exit $rc: $(cat "$WORK/out")"
apt_called && fail "not root: apt-get ran"
grep -q "optional: libucx-dev libhiredis-dev" "$WORK/out" || fail "no list: $(cat "$WORK/out")"
grep -q "apt-get install -y --no-install-recommends libucx-dev libhiredis-dev$" "$WORK/out" ||
  fail "no apt-get line: $(cat "$WORK/out")"
grep -q "going on without: UCX transport, Redis metadata store$" "$WORK/out" ||
  fail "no note of what is left out: $(cat "$WORK/out")"
grep -q clang-16 "$WORK/out" && fail "clang-16 is not in the build set: $(cat "$WORK/out")"

echo "== not root, no sudo, a required package missing: listed, exit 1"
run 1000 "libcli11-dev libucx-dev" build
[ "$rc" -eq 1 ] || fail "required missing: exit $rc (want 1): $(cat "$WORK/out")"
apt_called && fail "not root: apt-get ran"
grep -q "required: libcli11-dev" "$WORK/out" || fail "required not listed: $(cat "$WORK/out")"
grep -q "no-install-recommends libcli11-dev libucx-dev$" "$WORK/out" ||
  fail "no apt-get line: $(cat "$WORK/out")"

echo "== --check as root: reports, installs nothing"
run 0 "libucx-dev" --check build
[ "$rc" -eq 0 ] && ! apt_called && grep -q "optional: libucx-dev" "$WORK/out" ||
  fail "--check: exit $rc, $(cat "$WORK/out")"

echo "== root: apt-get installs exactly what the requested sets miss"
run 0 "libucx-dev clang-16 python3-torch libgtest-dev" build
[ "$rc" -eq 0 ] || fail "root install: exit $rc: $(cat "$WORK/out")"
[ "$(cat "$FAKE_APT_LOG")" = "install -y --no-install-recommends libucx-dev" ] ||
  fail "build set as root ran: apt-get $(cat "$FAKE_APT_LOG")"
run 0 "libucx-dev clang-16 python3-torch libgtest-dev" build test
[ "$(cat "$FAKE_APT_LOG")" = \
  "install -y --no-install-recommends libgtest-dev libucx-dev clang-16 python3-torch" ] ||
  fail "build+test as root ran: apt-get $(cat "$FAKE_APT_LOG")"
FAKE_SUDO=yes run 1000 "libmunge-dev" build
[ "$rc" -eq 0 ] && [ "$(cat "$FAKE_APT_LOG")" = "install -y --no-install-recommends libmunge-dev" ] ||
  fail "sudo without password: exit $rc, apt-get $(cat "$FAKE_APT_LOG" 2>/dev/null)"

echo "== bad usage: exit 2"
run 1000 "" buld
[ "$rc" -eq 2 ] || fail "unknown set: exit $rc"

echo "== make -n: what install, demo and test ask for"
cd "$SRC_DIR"
make -n install PREFIX="$WORK/p" BUILD="$WORK/b" >"$WORK/install.n" 2>&1 ||
  fail "make -n install: $(cat "$WORK/install.n")"
grep -q "install-deps.sh build$" "$WORK/install.n" || fail "install: not the build set"
grep -q "install-deps.sh.*test" "$WORK/install.n" && fail "install asks for the test set"
grep -q -- "-B $WORK/b-install .*-DDYAD_BUILD_TESTS=OFF -DDYAD_BUILD_BENCH=OFF" "$WORK/install.n" ||
  grep -A1 -- "-B $WORK/b-install" "$WORK/install.n" | grep -q -- "-DDYAD_BUILD_TESTS=OFF -DDYAD_BUILD_BENCH=OFF" ||
  fail "install: not configured without tests and benchmarks: $(cat "$WORK/install.n")"
grep -q "ctest" "$WORK/install.n" && fail "install runs ctest"
make -n demo BUILD="$WORK/b" >"$WORK/demo.n" 2>&1 || fail "make -n demo: $(cat "$WORK/demo.n")"
grep -q "install-deps.sh demo$" "$WORK/demo.n" || fail "demo: not the demo set"
grep -q -- "--target dyad dyad-service dyad-demo" "$WORK/demo.n" ||
  fail "demo: does not build only its programs: $(cat "$WORK/demo.n")"
make -n test BUILD="$WORK/b" >"$WORK/test.n" 2>&1 || fail "make -n test"
grep -q "install-deps.sh build test$" "$WORK/test.n" || fail "test: not build + test"
echo "== make uninstall: the manifest's files, DYAD's own empty directories, nothing else"
U="$WORK/usr/local"
mkdir -p "$U/bin" "$U/share/doc/dyad/man" "$U/lib/python3/dist-packages/pydyad/__pycache__" \
         "$WORK/bi"
for f in bin/dyad share/doc/dyad/README.md share/doc/dyad/man/x.md \
         lib/python3/dist-packages/pydyad/__init__.py; do
  echo x >"$U/$f"
  echo "$U/$f" >>"$WORK/bi/install_manifest.txt"
done
echo x >"$U/lib/python3/dist-packages/pydyad/__pycache__/__init__.cpython-311.pyc"
echo "$U/bin/gone-already" >>"$WORK/bi/install_manifest.txt"
echo keep >"$U/bin/other"
make uninstall INSTALL_BUILD="$WORK/bi" >"$WORK/uninstall.out" 2>&1 ||
  fail "make uninstall: $(cat "$WORK/uninstall.out")"
[ -f "$U/bin/other" ] || fail "make uninstall removed a file not in the manifest"
[ -d "$U/share/doc" ] && [ -d "$U/lib/python3/dist-packages" ] ||
  fail "make uninstall removed a shared directory"
for gone in bin/dyad share/doc/dyad lib/python3/dist-packages/pydyad; do
  [ ! -e "$U/$gone" ] || fail "make uninstall left $gone"
done
rm -f "$WORK/bi/install_manifest.txt"
if make uninstall INSTALL_BUILD="$WORK/bi" PREFIX="$WORK/nothing" >"$WORK/uninstall.out" 2>&1; then
  fail "make uninstall without a manifest succeeded"
fi
grep -q "no install manifest" "$WORK/uninstall.out" || fail "no clear error: $(cat "$WORK/uninstall.out")"
echo "install-deps OK"
