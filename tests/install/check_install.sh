#!/bin/sh
# Installs the build into a temporary prefix and builds small programs
# against it, one with pkg-config and one with find_package(dyad), the way
# users of upstream DYAD link it, and one C++11 program on the public C++
# client. Fails if a header, library, program or package file is missing
# from the install.
set -eu
BUILD_DIR="$1"
SRC_DIR="$2"
WORK=$(mktemp -d /tmp/dyad-install-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM

cmake --install "$BUILD_DIR" --prefix "$WORK/prefix" >/dev/null
P="$WORK/prefix"
for f in include/dyad/client/dyad_client.h include/dyad/client/dyad_client.hpp \
         include/dyad/core/dyad_ctx.h libexec/dyad/dyad-demo \
         include/dyad/common/dyad_rc.h include/dyad/common/dyad_dtl.h include/dyad/dyad_config.hpp \
         bin/dyad bin/dyad-service lib/libdyad_client.so lib/libdyad_ctx.so \
         lib/pkgconfig/dyad.pc lib/cmake/dyad/dyadConfig.cmake; do
  [ -e "$P/$f" ] || { echo "missing from install: $f" >&2; exit 1; }
done

cat > "$WORK/app.c" <<'C'
#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <stdio.h>
int main(void) {
  dyad_rc_t rc = dyad_init(false, false, false, false, false, false, 3, 1024, 1, NULL,
                           "/tmp", NULL, false, "FLUX_RPC", DYAD_COMM_RECV, NULL);
  if (DYAD_IS_ERROR(rc)) { printf("init failed: %s\n", dyad_rc_name(rc)); return 1; }
  rc = dyad_consume(dyad_ctx_get(), NULL);
  printf("%s\n", dyad_rc_name(rc));
  dyad_finalize();
  return rc == DYAD_RC_BADBUF ? 0 : 1;
}
C
PKG_CONFIG_PATH="$P/lib/pkgconfig" cc -std=c11 -o "$WORK/app" "$WORK/app.c" \
  $(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs dyad)
LD_LIBRARY_PATH="$P/lib" "$WORK/app"

mkdir -p "$WORK/cm"
cp "$WORK/app.c" "$WORK/cm/app.c"
cat > "$WORK/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(app C)
find_package(dyad REQUIRED)
add_executable(app app.c)
target_link_libraries(app PRIVATE dyad::dyad_client)
CM
cmake -S "$WORK/cm" -B "$WORK/cm/build" -DCMAKE_PREFIX_PATH="$P" >/dev/null
cmake --build "$WORK/cm/build" >/dev/null
LD_LIBRARY_PATH="$P/lib" "$WORK/cm/build/app"

# The public C++ client needs nothing newer than C++11 (upstream programs
# are built with -std=c++11), and its symbols come from libdyad_ctx.
cat > "$WORK/client.cc" <<'CXX'
#include <dyad/client/dyad_client.hpp>
#include <cstdio>
int main() {
  dyad::client::Options o;
  o.consumer_path = "/tmp/dyad-install-test-cons";
  o.service_socket = "/nonexistent/dyad.sock";
  o.rpc_timeout_ms = 2000;
  dyad::client::Client c;
  dyad::client::Status st = dyad::client::Client::Create(o, &c);
  if (!st.ok()) { std::printf("create: %s\n", st.ToString().c_str()); return 1; }
  std::string rel;
  st = c.Resolve("/tmp/dyad-install-test-cons/a/b", dyad::client::Side::kConsumer, &rel);
  if (!st.ok() || rel != "a/b") return 1;
  st = c.Ping();
  std::printf("%s\n", st.ToString().c_str());
  return st.code() == DYAD_RC_NOSERVICE ? 0 : 1;
}
CXX
c++ -std=c++11 -Wall -Werror -o "$WORK/client" "$WORK/client.cc" \
  $(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs dyad)
LD_LIBRARY_PATH="$P/lib" "$WORK/client" >/dev/null
"$P/bin/dyad" --help >/dev/null
"$P/bin/dyad" demo --help >/dev/null  # runs <libexecdir>/dyad/dyad-demo
"$P/bin/dyad-service" --help >/dev/null
echo "install OK"
