#!/bin/sh
# The Flux build switch (cmake/DyadFlux.cmake) and how make and CI use it:
#  * configured with DYAD_ENABLE_FLUX=OFF (or without flux-core), the Flux
#    parts are left out, ctest reports one skipped entry that says why, and
#    the line `make test` prints says the Flux tests were SKIPPED;
#  * configured with a flux-core prefix on PKG_CONFIG_PATH (the cached
#    0.73.0 one, as the Makefile passes it), the store is built, the installed
#    dyad-service and dyad carry the prefix's library directory in their
#    RPATH, and the line says the Flux tests run;
#  * the Makefile's configure step puts the prefix of
#    `scripts/build-flux-core.sh --print` on PKG_CONFIG_PATH, and .ci/run
#    builds that prefix before `make test`.
# Configures scratch trees only (nothing is built); removes them on exit.
#
# usage: check_build_switch.sh SOURCE_DIR
set -eu
SRC=$(cd "$1" && pwd)
WORK=$(mktemp -d /tmp/dyad-flux-switch.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM
fail() { echo "check_build_switch: $*" >&2; exit 1; }

# The line `make test` prints about the Flux tests, for build tree $1.
note() {
  line=$(cd "$SRC" && make -n test BUILD="$1" DEPS=true | grep 'DYAD_FLUX_BUILT' | head -1)
  [ -n "$line" ] || fail "make -n test shows no line about the Flux tests"
  sh -c "$line"
}

echo "== DYAD_ENABLE_FLUX=OFF"
cmake -S "$SRC" -B "$WORK/off" -DDYAD_ENABLE_FLUX=OFF -DDYAD_BUILD_BENCH=OFF >"$WORK/off.log" 2>&1 ||
  fail "configure failed: $(tail -5 "$WORK/off.log")"
grep -q '^DYAD_FLUX_BUILT:INTERNAL=OFF$' "$WORK/off/CMakeCache.txt" || fail "Flux parts built with the switch off"
(cd "$WORK/off" && ctest -N) | grep -q 'flux_tests_skipped' || fail "no flux_tests_skipped entry"
(cd "$WORK/off" && ctest -N) | grep -q 'kvs_flux_test' && fail "kvs_flux_test registered without Flux"
out=$(cd "$WORK/off" && ctest -R flux_tests_skipped -V 2>&1) || true
echo "$out" | grep -q 'Flux tests skipped: switched off (DYAD_ENABLE_FLUX=OFF)' ||
  fail "the skipped entry does not say why: $out"
echo "$out" | grep -q 'Skipped' || fail "flux_tests_skipped is not reported as skipped: $out"
said=$(note "$WORK/off")
echo "$said"
echo "$said" | grep -q 'Flux tests were SKIPPED: switched off' || fail "make test says: $said"

echo "== no flux-core where pkg-config looks (the switch left on)"
if ! env -u PKG_CONFIG_PATH pkg-config --exists flux-core 2>/dev/null; then
  env -u PKG_CONFIG_PATH cmake -S "$SRC" -B "$WORK/none" -DDYAD_BUILD_BENCH=OFF \
    >"$WORK/none.log" 2>&1 || fail "configure failed: $(tail -5 "$WORK/none.log")"
  grep -q '^DYAD_ENABLE_FLUX:BOOL=ON$' "$WORK/none/CMakeCache.txt" || fail "the switch is not on by default"
  grep -q '^DYAD_FLUX_BUILT:INTERNAL=OFF$' "$WORK/none/CMakeCache.txt" ||
    fail "Flux parts built without flux-core"
  said=$(note "$WORK/none")
  echo "$said"
  echo "$said" | grep -q 'Flux tests were SKIPPED: no flux-core' || fail "make test says: $said"
else
  echo "(a system flux-core is installed: not checked)"
fi

echo "== the Makefile and .ci/run"
(cd "$SRC" && make -n configure BUILD="$WORK/x") | grep -q 'build-flux-core.sh --print' ||
  fail "the Makefile's configure step does not ask build-flux-core.sh for its prefix"
(cd "$SRC" && make -n configure BUILD="$WORK/x") | grep -q 'PKG_CONFIG_PATH=' ||
  fail "the Makefile's configure step does not set PKG_CONFIG_PATH"
ci_build=$(grep -n 'build-flux-core.sh' "$SRC/.ci/run" | head -1 | cut -d: -f1)
ci_test=$(grep -n 'make test' "$SRC/.ci/run" | head -1 | cut -d: -f1)
[ -n "$ci_build" ] && [ -n "$ci_test" ] && [ "$ci_build" -lt "$ci_test" ] ||
  fail ".ci/run does not build flux-core before make test"

prefix=$("$SRC/scripts/build-flux-core.sh" --print 2>/dev/null) || {
  echo "no cached flux-core prefix: the enabled half is not checked"
  exit 0
}
echo "== with $prefix"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cmake -S "$SRC" -B "$WORK/on" -DDYAD_BUILD_BENCH=OFF \
  -DCMAKE_INSTALL_PREFIX="$WORK/prefix" >"$WORK/on.log" 2>&1 ||
  fail "configure failed: $(tail -5 "$WORK/on.log")"
grep -q '^DYAD_FLUX_BUILT:INTERNAL=ON$' "$WORK/on/CMakeCache.txt" || fail "Flux parts not built"
(cd "$WORK/on" && ctest -N) | grep -q 'KvsConformance.flux$' || fail "no KvsConformance.flux entry"
for prog in dyad-service dyad; do
  grep -A12 "bin/$prog\"" "$WORK/on/cmake_install.cmake" | grep -q "RPATH \".*$prefix/lib" ||
    fail "$prog is installed without $prefix/lib in its RPATH"
done
said=$(note "$WORK/on")
echo "$said"
echo "$said" | grep -q "Flux tests run inside flux start, with $prefix" || fail "make test says: $said"
echo "ok"
