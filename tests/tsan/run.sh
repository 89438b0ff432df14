#!/bin/sh
# tests/tsan/run.sh: the record layer (src/common/seal.cc) under
# ThreadSanitizer.
#
# Builds only what the record layer needs (seal.cc, log.cc, status.cc) and
# record_layer_tsan.cc with clang-16 -fsanitize=thread into
# $TSAN_BUILD (default <repo>/build-tsan), then runs it: sessions whose
# directions are sealed and opened on different threads, handed over from
# thread to thread, rekeyed on the way, and the cipher's check against two
# threads at once. ctest runs it (label tsan; well under a minute).
#
# Exit status: 0 clean, 1 on a failure or a ThreadSanitizer report, 77 when
# clang-16 (or its TSan runtime) is missing: ctest counts that as skipped.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${TSAN_BUILD:-$root/build-tsan}

if ! command -v clang++-16 >/dev/null 2>&1; then
    echo "tsan: clang++-16 is not installed (scripts/install-deps.sh installs it); skipped" >&2
    exit 77
fi
rt=$(clang-16 -print-resource-dir)/lib/linux
if ! ls "$rt"/libclang_rt.tsan*-x86_64.a >/dev/null 2>&1 &&
   ! ls "$rt"/libclang_rt.tsan-x86_64.a >/dev/null 2>&1; then
    echo "tsan: the ThreadSanitizer runtime of clang-16 is missing (libclang-rt-16-dev); skipped" >&2
    exit 77
fi
if [ -x /usr/lib/llvm-16/bin/llvm-symbolizer ]; then
    PATH=/usr/lib/llvm-16/bin:$PATH
    export PATH
fi

mkdir -p "$build/include/dyad"
# The generated configuration header (its version does not matter here).
sed -e 's/@PROJECT_VERSION@/0.0.0-tsan/' -e 's/@PROJECT_VERSION_[A-Z]*@/0/' \
    "$root/include/dyad/dyad_config.hpp.in" >"$build/include/dyad/dyad_config.hpp.new"
if ! cmp -s "$build/include/dyad/dyad_config.hpp.new" "$build/include/dyad/dyad_config.hpp"; then
    mv "$build/include/dyad/dyad_config.hpp.new" "$build/include/dyad/dyad_config.hpp"
else
    rm -f "$build/include/dyad/dyad_config.hpp.new"
fi
bin=$build/record_layer_tsan
srcs="$here/record_layer_tsan.cc $root/src/common/seal.cc $root/src/common/log.cc $root/src/common/status.cc"
# Rebuilt when any source or header of the record layer is newer.
stale=0
if [ ! -x "$bin" ]; then
    stale=1
else
    for f in $srcs "$root"/src/common/seal.h "$root"/src/common/log.h "$root"/src/common/status.h; do
        if [ "$f" -nt "$bin" ]; then stale=1; fi
    done
fi
if [ "$stale" = 1 ]; then
    launcher=""
    if command -v ccache >/dev/null 2>&1; then launcher=ccache; fi
    # shellcheck disable=SC2086
    $launcher clang++-16 -std=c++17 -O1 -g -fsanitize=thread -fno-omit-frame-pointer \
        -I"$root/src" -I"$root/include" -I"$build/include" $srcs -o "$bin.tmp" -lcrypto -pthread \
        >"$build/build.log" 2>&1 || {
        cat "$build/build.log" >&2
        exit 1
    }
    mv "$bin.tmp" "$bin"
fi
TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}" "$bin"
