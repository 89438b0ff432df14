#!/bin/sh
# Installs the Debian packages DYAD needs to build, test and run its demo.
# Idempotent: packages already installed are skipped, and apt is only invoked
# when something is missing. Run as root (or with sudo available).
set -eu

# build and core tests (clang-format: the source-format test; prometheus:
# promtool, which checks `dyad status --prometheus` in the operations tests)
PACKAGES="
cmake
make
g++
binutils
pkg-config
libssl-dev
libcli11-dev
nlohmann-json3-dev
libgtest-dev
libgmock-dev
iproute2
nftables
procps
coreutils
tar
strace
clang-format
ccache
prometheus
"
# optional backends (each is compiled in when found): UCX, libfabric, Redis
# (libfabric-bin: fi_info, which the OFI tests use to tell a provider that
# is missing here from one that failed)
PACKAGES="$PACKAGES
libucx-dev
libfabric-dev
libfabric-bin
libhiredis-dev
redis-server
redis-tools
redis-sentinel
"
# MUNGE authentication between services (libmunge; munged for tests and sites)
PACKAGES="$PACKAGES
munge
libmunge-dev
"
# fuzzing (tests/fuzz, `make fuzz`): clang with libFuzzer and the sanitizer runtimes
PACKAGES="$PACKAGES
clang-16
libfuzzer-16-dev
libclang-rt-16-dev
"
# pydyad and its data-loader integration (Debian's /usr/bin/python3), plots
PACKAGES="$PACKAGES
python3
python3-dev
pybind11-dev
python3-pytest
python3-numpy
python3-h5py
python3-torch
python3-matplotlib
python3-pip
python3-setuptools
python3-wheel
python3-venv
"
# packaging checks: man pages (groff), the systemd unit (systemd-analyze)
PACKAGES="$PACKAGES
groff-base
systemd
"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

echo "install-deps: installing:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-deps: missing packages:$missing; run as root or install them" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# A stale package index makes installs fail with 404s; refresh once, then retry.
if ! $SUDO apt-get install -y --no-install-recommends $missing; then
    $SUDO apt-get update
    $SUDO apt-get install -y --no-install-recommends $missing
fi
