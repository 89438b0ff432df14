#!/bin/sh
# Builds flux-core from a source tarball into a prefix cached outside the
# checkout, keyed by the tarball's hash, so that a second run (another
# checkout, a clean CI clone) costs nothing.
#
# usage: build-flux-core.sh [--print | --sources] [TARBALL]
#   TARBALL  a flux-core-<version>.tar.xz export (default: the 0.73.0 one in
#            $DYAD_FLUX_SOURCES, ../shared/flux-core beside the checkout)
#   --print  print the prefix the tarball builds into and exit (0 when it is
#            built, 1 when not)
#   --sources  print the folder where the tarballs are looked for, and exit
#
# Without a tarball found, a 0.73.0 prefix already in the cache is used.
#
# Environment:
#   DYAD_FLUX_CACHE    where prefixes go (default /var/cache/dyad/flux when
#                      writable, else ${XDG_CACHE_HOME:-~/.cache}/dyad/flux)
#   DYAD_FLUX_SOURCES  the folder holding the tarballs (default: shared/flux-core
#                      beside the checkout or beside one of its parent folders)
#   DYAD_FLUX_JOBS     make -j (default: the number of CPUs)
#
# Prints the prefix on its last line of output. The build needs the Debian
# packages of `scripts/install-deps.sh flux` (installed here when missing and
# running as root). A failed build leaves no prefix behind (it is built in a
# temporary folder and moved into place only when installed).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
print_only=0
sources_only=0
if [ "${1:-}" = "--print" ]; then
  print_only=1
  shift
elif [ "${1:-}" = "--sources" ]; then
  sources_only=1
  shift
fi

if [ -n "${DYAD_FLUX_CACHE:-}" ]; then
  cache=$DYAD_FLUX_CACHE
elif mkdir -p /var/cache/dyad/flux 2>/dev/null && [ -w /var/cache/dyad/flux ]; then
  cache=/var/cache/dyad/flux
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/dyad/flux
fi

# The sources: $DYAD_FLUX_SOURCES, else shared/flux-core beside the
# checkout or beside one of its parent folders.
find_sources() {
  if [ -n "${DYAD_FLUX_SOURCES:-}" ]; then
    echo "$DYAD_FLUX_SOURCES"
    return
  fi
  d=$(dirname "$top")
  while :; do
    if [ -d "$d/shared/flux-core" ]; then
      echo "$d/shared/flux-core"
      return
    fi
    [ "$d" = / ] && break
    d=$(dirname "$d")
  done
  echo "$(dirname "$top")/shared/flux-core"
}
sources=$(find_sources)
if [ "$sources_only" = 1 ]; then
  echo "$sources"
  exit 0
fi
tarball=${1:-$sources/flux-core-0.73.0.tar.xz}
if [ ! -f "$tarball" ]; then
  # No sources here, but 0.73.0 built from them before (another checkout
  # of this machine): that prefix serves.
  if [ -z "${1:-}" ]; then
    for cached in "$cache"/flux-core-0.73.0-*; do
      if [ -x "$cached/bin/flux" ]; then
        [ "$print_only" = 1 ] || echo "flux-core 0.73.0 already built (no sources at $sources)"
        echo "$cached"
        exit 0
      fi
    done
  fi
  echo "build-flux-core.sh: no tarball $tarball (set DYAD_FLUX_SOURCES or name one)" >&2
  exit 2
fi

base=$(basename "$tarball" .tar.xz)            # flux-core-0.73.0
version=${base#flux-core-}                     # 0.73.0 or 4a5e79f
hash=$(sha256sum "$tarball" | cut -c1-16)
prefix=$cache/$base-$hash

if [ "$print_only" = 1 ]; then
  echo "$prefix"
  [ -x "$prefix/bin/flux" ] && exit 0 || exit 1
fi
if [ -x "$prefix/bin/flux" ]; then
  echo "flux-core $version already built"
  echo "$prefix"
  exit 0
fi

# The version autogen.sh stamps in (a source export has no git history).
case "$version" in
  4a5e79f) flux_version=0.88.0-59-g4a5e79f56 ;;
  *) flux_version=$version ;;
esac

"$here/install-deps.sh" flux >&2 || {
  echo "build-flux-core.sh: packages for flux-core are missing (scripts/install-deps.sh flux)" >&2
  exit 1
}

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build-$base.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
jobs=${DYAD_FLUX_JOBS:-$(nproc 2>/dev/null || echo 2)}
echo "building flux-core $version into $prefix (a few minutes; log: $work/build.log)" >&2
(
  cd "$work"
  tar -xJf "$tarball"
  cd "$base"
  export FLUX_VERSION="$flux_version"
  ./autogen.sh
  PYTHON=/usr/bin/python3 ./configure --prefix="$prefix" --disable-docs
  make -j"$jobs"
  make install DESTDIR="$work/dest"
) >"$work/build.log" 2>&1 || {
  echo "build-flux-core.sh: the build failed; its log ends with:" >&2
  tail -30 "$work/build.log" >&2
  exit 1
}
mkdir -p "$(dirname "$prefix")"
mv "$work/dest$prefix" "$prefix"
echo "$prefix"
