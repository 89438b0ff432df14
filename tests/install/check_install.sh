#!/bin/sh
# Programs written for upstream DYAD, built and run against an install in a
# fresh /opt-style prefix, with nothing from the build tree and no
# LD_LIBRARY_PATH:
#  * every installed header compiles as C11 (C headers) and C++11;
#  * every installed library has a RUNPATH of $ORIGIN;
#  * a C11 program on the C API, built with pkg-config (cc -std=c11 -Wall
#    -Werror);
#  * upstream's C++ stream example built with -std=c++11 and linked exactly
#    like upstream's tutorial Makefile (-Wl,-rpath=$PREFIX/lib -ldyad_fstream),
#    and with pkg-config dyad-fstream (c++ -std=c++11 -Wall -Werror);
#  * a CMake project using find_package(dyad CONFIG) (C11 and C++11
#    programs, -Wall -Werror);
#  * a C++11 program on the public C++ client (dyad/client/dyad_client.hpp),
#    with pkg-config and with find_package;
#  * every DYAD header those programs include comes from $PREFIX/include,
#    and ldd resolves every DYAD library they (and the preload library)
#    need from $PREFIX/lib;
#  * unmodified cp and cat under LD_PRELOAD=$PREFIX/lib/libdyad_wrapper.so;
#  * a Python script using upstream's pydyad API from the installed package;
# and they move files between two dyad-service processes of that prefix on
# loopback (node 0 produces, node 1 consumes): each program built here
# produces one file and consumes one. Then:
#  * the Lmod module file (share/lmod/dyad/<version>.lua) parses (luac) and
#    sets PATH, MANPATH, PKG_CONFIG_PATH, CMAKE_PREFIX_PATH (and PYTHONPATH
#    with pydyad) to directories of the prefix that hold what they should;
#  * `cmake -P <prefix>/share/dyad/uninstall.cmake` removes every installed
#    file and the prefix (a .../dyad directory) with them.
# Processes and files are removed even on failure; every wait is bounded.
#
# usage: check_install.sh BUILD_DIR SOURCE_DIR
set -eu
BUILD_DIR=$(cd "$1" && pwd)
SRC_DIR=$(cd "$2" && pwd)
HERE="$SRC_DIR/tests/install"
WORK=$(mktemp -d /tmp/dyad-install-test.XXXXXX)
P="$WORK/opt/dyad"
PIDS=""
cleanup() {
  for pid in $PIDS; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $PIDS; do
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
unset LD_LIBRARY_PATH LD_PRELOAD PYTHONPATH CPATH LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH
for v in $(env | sed -n 's/^\(DYAD_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

fail() {
  echo "check_install: $*" >&2
  for n in 0 1; do
    [ -f "$WORK/node$n/log" ] && { echo "--- service $n log:" >&2; tail -20 "$WORK/node$n/log" >&2; }
  done
  exit 1
}
step() { echo "== $*"; }

VERSION=$(sed -n 's/^project(dyad VERSION \([0-9.]*\).*/\1/p' "$SRC_DIR/CMakeLists.txt")
step "install into $P"
cmake --install "$BUILD_DIR" --prefix "$P" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log" >&2; fail "cmake --install failed"; }
for f in include/dyad/client/dyad_client.h include/dyad/client/dyad_client.hpp \
         include/dyad/core/dyad_ctx.h libexec/dyad/dyad-demo \
         include/dyad/common/dyad_rc.h include/dyad/common/dyad_dtl.h include/dyad/dyad_config.hpp \
         include/dyad/stream/dyad_stream_api.hpp bin/dyad bin/dyad-service \
         lib/libdyad_client.so lib/libdyad_ctx.so lib/libdyad_fstream.so lib/libdyad_wrapper.so \
         lib/pkgconfig/dyad.pc lib/pkgconfig/dyad-fstream.pc lib/cmake/dyad/dyadConfig.cmake \
         share/man/man1/dyad.1 share/man/man8/dyad-service.8 \
         share/bash-completion/completions/dyad share/bash-completion/completions/dyad-service \
         share/doc/dyad/LICENSE share/doc/dyad/README.md share/doc/dyad/deployment.md \
         share/dyad/systemd/dyad@.service share/dyad/systemd/dyad.env.example \
         "share/lmod/dyad/$VERSION.lua" share/dyad/uninstall.cmake \
         share/dyad/install_manifest.txt; do
  [ -e "$P/$f" ] || fail "missing from install: $f"
done
# The Flux module, where upstream's users load it ($PREFIX/lib/dyad.so),
# when the build has it (flux-core found).
if [ -e "$BUILD_DIR/lib/dyad.so" ]; then
  [ -e "$P/lib/dyad.so" ] || fail "missing from install: lib/dyad.so"
fi

step "RUNPATH of every installed library"
for lib in $(find "$P" -name '*.so*' -type f); do
  rp=$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  case "$rp" in
    '$ORIGIN' | '$ORIGIN/'*) ;;
    *) fail "$lib has RUNPATH '$rp', expected \$ORIGIN-relative" ;;
  esac
done

step "installed headers compile as C11 and C++11"
for h in $(cd "$P/include" && find . -name '*.h' -o -name '*.hpp' | sed 's|^\./||'); do
  printf '#include <%s>\nint main(void) { return 0; }\n' "$h" >"$WORK/hdr.c"
  case "$h" in
    *.h) gcc -std=c11 -Wall -Wextra -pedantic -Werror -fsyntax-only -I"$P/include" "$WORK/hdr.c" ||
           fail "$h does not compile as C11" ;;
  esac
  g++ -std=c++11 -Wall -Wextra -pedantic -Werror -fsyntax-only -x c++ -I"$P/include" "$WORK/hdr.c" ||
    fail "$h does not compile as C++11"
done

step "build: C11 with pkg-config, C++11 like upstream's tutorial, CMake find_package"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
libdir=$(pkg-config --variable=libdir dyad)
# (-MMD: the headers each program included, checked below)
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -MMD -MF "$WORK/c_app.d" -o "$WORK/c_app" "$HERE/upstream_c_app.c" \
  $(pkg-config --cflags --libs dyad) -Wl,-rpath="$libdir" || fail "C program (pkg-config dyad)"
g++ -std=c++11 -o "$WORK/stream_app" "$SRC_DIR/tests/stream_helpers/upstream_example.cc" \
  -I"$P/include" -L"$P/lib" -Wl,-rpath="$P/lib" -ldyad_fstream || fail "C++11 tutorial-style link"
# shellcheck disable=SC2046
c++ -std=c++11 -Wall -Werror -MMD -MF "$WORK/stream_app_pc.d" -o "$WORK/stream_app_pc" \
  "$SRC_DIR/tests/stream_helpers/upstream_example.cc" \
  $(pkg-config --cflags --libs dyad-fstream) -Wl,-rpath="$libdir" ||
  fail "C++11 program (pkg-config dyad-fstream)"
# shellcheck disable=SC2046
c++ -std=c++11 -Wall -Wextra -Werror -MMD -MF "$WORK/cpp_client_app.d" -o "$WORK/cpp_client_app" \
  "$HERE/cpp_client_app.cc" $(pkg-config --cflags --libs dyad) -Wl,-rpath="$libdir" ||
  fail "C++11 program on dyad_client.hpp"
unset PKG_CONFIG_PATH
cmake -S "$HERE/find_package_project" -B "$WORK/cm" -DCMAKE_PREFIX_PATH="$P" \
  -DDYAD_TEST_SOURCES="$HERE" >"$WORK/cm.log" 2>&1 && cmake --build "$WORK/cm" >>"$WORK/cm.log" 2>&1 ||
  { cat "$WORK/cm.log" >&2; fail "find_package(dyad) project"; }
# Only installed headers: every DYAD header a program included is under
# $P/include (none from the source or build tree, none from elsewhere).
# (dyad.pc is relocatable: its -I is ${pcfiledir}/../../include)
for dep in "$WORK/c_app.d" "$WORK/stream_app_pc.d" "$WORK/cpp_client_app.d"; do
  hdrs=$(tr ' \\' '\n\n' <"$dep" | grep '/dyad/.*\.h' | xargs -r readlink -f || true)
  [ -n "$hdrs" ] || fail "$dep names no DYAD header"
  outside=$(printf '%s\n' "$hdrs" | grep -v "^$(readlink -f "$P")/include/" || true)
  [ -z "$outside" ] || fail "$dep: headers not from $P/include: $outside"
done
for exe in "$WORK/c_app" "$WORK/stream_app" "$WORK/stream_app_pc" "$WORK/cm/c_app" \
           "$WORK/cm/stream_app" "$WORK/cm/cpp_client_app" "$WORK/cpp_client_app" \
           "$P/lib/libdyad_wrapper.so" "$P/bin/dyad" "$P/bin/dyad-service"; do
  if ldd "$exe" | grep -q "not found"; then ldd "$exe" >&2; fail "$exe: libraries not found"; fi
  # Every DYAD library, resolved from the prefix (and for the programs at
  # least one: they are linked with it; the preload library and the
  # service need none).
  dyad_libs=$(ldd "$exe" | grep 'libdyad' || true)
  case "$exe" in
    *.so | */dyad-service) ;;
    *) [ -n "$dyad_libs" ] || { ldd "$exe" >&2; fail "$exe: needs no DYAD library"; } ;;
  esac
  # (resolved paths normalised: bin/dyad finds them as bin/../lib)
  for lib in $(printf '%s\n' "$dyad_libs" | awk '{ print $3 }'); do
    case "$(readlink -f "$lib")" in
      "$(readlink -f "$P")/lib/"*) ;;
      *) ldd "$exe" >&2; fail "$exe: $lib resolved outside $P/lib" ;;
    esac
  done
done

step "two services from the prefix on loopback"
umask 077
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/secret"
start_node() {  # rank kvs
  d="$WORK/node$1"
  mkdir -p "$d/prod" "$d/cons"
  "$P/bin/dyad-service" -r "$1" -k "$2" -l 127.0.0.1:0 -s "$d/sock" --secret-file "$WORK/secret" \
    --ready-file "$d/ready" --cons-path "$d/cons" "$d/prod" >"$d/log" 2>&1 &
  PIDS="$PIDS $!"
  i=0
  until [ -S "$d/sock" ] && grep -q '^listen=' "$d/ready" 2>/dev/null; do
    kill -0 "$!" 2>/dev/null || fail "service $1 exited"
    [ $i -lt 200 ] || fail "service $1 not ready within 20 s"
    sleep 0.1
    i=$((i + 1))
  done
}
start_node 0 embedded
start_node 1 "embedded://$(sed -n 's/^advertise=//p' "$WORK/node0/ready")"
umask 022
node() {  # rank command...: run as a process of node `rank`, bounded
  n=$1
  shift
  env DYAD_SERVICE_SOCKET="$WORK/node$n/sock" DYAD_PATH_PRODUCER="$WORK/node$n/prod" \
      DYAD_PATH_CONSUMER="$WORK/node$n/cons" DYAD_CONSUME_TIMEOUT=20 timeout 60 "$@"
}
PROD="$WORK/node0/prod"
CONS="$WORK/node1/cons"
TEXT="hello dyad 42
"

step "C++11 (tutorial link) produces, C11 (pkg-config) consumes"
node 0 "$WORK/stream_app" produce "$PROD/a.txt" >/dev/null || fail "stream_app produce"
node 1 "$WORK/c_app" consume "$CONS/a.txt" "$TEXT" >/dev/null || fail "c_app consume a.txt"

step "C11 (find_package) produces, C++11 (find_package) consumes"
node 0 "$WORK/cm/c_app" produce "$PROD/b.txt" "$TEXT" >/dev/null || fail "cm/c_app produce"
node 1 "$WORK/cm/stream_app" consume "$CONS/b.txt" | grep -qx ok || fail "cm/stream_app consume b.txt"

step "C11 (pkg-config) produces, C++11 (pkg-config dyad-fstream) consumes"
node 0 "$WORK/c_app" produce "$PROD/c.txt" "$TEXT" >/dev/null || fail "c_app produce"
node 1 "$WORK/stream_app_pc" consume "$CONS/c.txt" | grep -qx ok || fail "stream_app_pc consume c.txt"

step "C++11 public client (pkg-config) produces and consumes"
node 0 "$WORK/cpp_client_app" produce "$PROD/f.txt" "$TEXT" || fail "cpp_client_app produce"
node 1 "$WORK/cpp_client_app" consume "$CONS/f.txt" "$TEXT" | grep -qx ok ||
  fail "cpp_client_app consume f.txt"

step "the other way round: each program consumes what another produced"
node 0 "$WORK/stream_app_pc" produce "$PROD/g.txt" >/dev/null || fail "stream_app_pc produce"
node 1 "$WORK/stream_app" consume "$CONS/g.txt" | grep -qx ok || fail "stream_app consume g.txt"
node 0 "$WORK/cm/stream_app" produce "$PROD/h.txt" >/dev/null || fail "cm/stream_app produce"
node 1 "$WORK/cm/c_app" consume "$CONS/h.txt" "$TEXT" >/dev/null || fail "cm/c_app consume h.txt"
node 0 "$WORK/cm/cpp_client_app" produce "$PROD/i.txt" "$TEXT" || fail "cm/cpp_client_app produce"
node 1 "$WORK/cm/cpp_client_app" consume "$CONS/i.txt" "$TEXT" | grep -qx ok ||
  fail "cm/cpp_client_app consume i.txt"

step "unmodified cp and cat under LD_PRELOAD"
head -c 1048577 /dev/urandom >"$WORK/payload"
node 0 env LD_PRELOAD="$P/lib/libdyad_wrapper.so" cp "$WORK/payload" "$PROD/d.bin" || fail "cp"
node 1 env LD_PRELOAD="$P/lib/libdyad_wrapper.so" cat "$CONS/d.bin" >"$WORK/d.out" || fail "cat"
cmp "$WORK/payload" "$WORK/d.out" || fail "cat read other bytes than cp wrote"

SITE=$(find "$P" -type d -name pydyad -path '*-packages/pydyad' | head -1)
if [ -n "$SITE" ] && [ -x /usr/bin/python3 ]; then
  step "Python (upstream pydyad API) from $(dirname "$SITE")"
  export PYTHONPATH="$(dirname "$SITE")"
  node 0 /usr/bin/python3 - "$P" <<'PY' || fail "python producer"
import os, sys
import pydyad
from pydyad import Dyad, dyad_open
from pydyad.bindings import DTLMode, DTLCommMode
assert pydyad.__file__.startswith(sys.argv[1]), pydyad.__file__
d = Dyad()
d.init(prod_managed_path=os.environ["DYAD_PATH_PRODUCER"],
       cons_managed_path=os.environ["DYAD_PATH_CONSUMER"],
       dtl_mode=DTLMode.DYAD_DTL_FLUX_RPC, dtl_comm_mode=DTLCommMode.DYAD_COMM_SEND)
assert str(d.prod_path) == os.environ["DYAD_PATH_PRODUCER"], d.prod_path
with dyad_open(os.path.join(str(d.prod_path), "e.txt"), "w", dyad_ctx=d) as f:
    f.write("from python")
d.finalize()
PY
  node 1 /usr/bin/python3 - <<'PY' || fail "python consumer"
import os
from pydyad import Dyad, dyad_open
d = Dyad()
d.init_env()
fname = os.path.join(str(d.cons_path), "e.txt")
mdata = d.get_metadata(fname, should_wait=True, raw=True)
assert mdata.contents.owner_rank == 0, mdata.contents.owner_rank
with dyad_open(fname, "r", dyad_ctx=d, metadata_wrapper=mdata) as f:
    assert f.read() == "from python"
d.free_metadata(mdata)
with dyad_open(os.path.join(str(d.cons_path), "a.txt"), "r", dyad_ctx=d) as f:
    assert f.read() == "hello dyad 42\n"
d.finalize()
PY
  unset PYTHONPATH
else
  echo "== (pydyad not installed: built without pybind11-dev / python3-dev)"
fi

"$P/bin/dyad" --version | grep -q "^dyad [0-9]" || fail "dyad --version"
"$P/bin/dyad-service" --version | grep -q "^dyad-service [0-9]" || fail "dyad-service --version"
"$P/bin/dyad" demo --help >/dev/null || fail "dyad demo --help (runs <libexecdir>/dyad/dyad-demo)"
step "Lmod module file share/lmod/dyad/$VERSION.lua"
LUA="$P/share/lmod/dyad/$VERSION.lua"
for luac in luac5.1 luac; do
  if command -v "$luac" >/dev/null 2>&1; then
    "$luac" -p "$LUA" || fail "$LUA does not parse ($luac)"
    echo "parses ($luac)"
    break
  fi
done
# What Lmod would set: the file run with stand-ins of Lmod's functions
# (lua5.1), else its prepend_path lines read as text.
if command -v lua5.1 >/dev/null 2>&1; then
  lua5.1 -e 'function help() end function whatis() end
    function pathJoin(...) return table.concat({...}, "/") end
    function prepend_path(k, v) print(k .. "=" .. v) end
    function append_path(k, v) print(k .. "=" .. v) end
    function setenv(k, v) print(k .. "=" .. v) end' "$LUA" >"$WORK/module.env" ||
    fail "$LUA fails under lua5.1"
else
  sed -n 's/^prepend_path("\([A-Z_]*\)", pathJoin(prefix, "\(.*\)"))$/\1=PREFIX\/\2/p
          s/^prepend_path("\([A-Z_]*\)", prefix)$/\1=PREFIX/p' "$LUA" |
    sed "s|PREFIX|$P|" >"$WORK/module.env"
fi
want_vars="PATH MANPATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH"
[ -z "$SITE" ] || want_vars="$want_vars PYTHONPATH"
for v in $want_vars; do
  d=$(sed -n "s/^$v=//p" "$WORK/module.env")
  [ -n "$d" ] || fail "the module file does not set $v: $(cat "$WORK/module.env")"
  case "$d" in "$P"/* | "$P") ;; *) fail "module file: $v=$d is not in $P" ;; esac
  case $v in
    PATH) f="$d/dyad-service" ;;
    MANPATH) f="$d/man8/dyad-service.8" ;;
    PKG_CONFIG_PATH) f="$d/dyad.pc" ;;
    CMAKE_PREFIX_PATH) f="$d/lib/cmake/dyad/dyadConfig.cmake" ;;
    PYTHONPATH) f="$d/pydyad/__init__.py" ;;
  esac
  [ -e "$f" ] || fail "module file: $v=$d, but $f does not exist"
done
echo "sets $want_vars to the prefix"

step "uninstall: cmake -P $P/share/dyad/uninstall.cmake"
for pid in $PIDS; do kill -TERM "$pid" 2>/dev/null || true; done
cmake -P "$P/share/dyad/uninstall.cmake" >"$WORK/uninstall.log" 2>&1 ||
  { cat "$WORK/uninstall.log" >&2; fail "uninstall failed"; }
if [ -e "$P" ]; then
  find "$P" | head -20 >&2
  fail "uninstall left $P behind"
fi
[ -d "$WORK/opt" ] || fail "uninstall removed $WORK/opt, which is not DYAD's"
echo "install OK"
