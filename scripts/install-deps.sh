#!/bin/sh
# Checks, and installs when it can, the Debian packages DYAD needs.
#
# usage: install-deps.sh [--check | --list] [SET...]
#   SET   build (default)  compile and install DYAD (`make install`)
#         demo             what `make demo` needs: the build's compiler and
#                          libraries, iproute2 (network namespaces)
#         test             the test suite (`make test` asks for build + test)
#         bench            the benchmarks (`make bench` asks for build + test + bench)
#         flux             building flux-core from source (scripts/build-flux-core.sh),
#                          for the Flux module and its tests
#         all              build + test + bench
#   --check  only report what is missing, never install
#   --list   print the packages of the sets, one per line, and exit
#
# Idempotent: packages already installed are skipped and apt-get runs only
# when something is missing. As root (or with a sudo that needs no
# password) the missing packages are installed. Otherwise the missing
# packages are listed with the apt-get line that installs them; the exit
# status is 1 only when a *required* package is missing, so a build goes on
# without the optional parts (a backend whose library is missing is left out
# of the build, with a one-line note here and in CMake's output).
#
# Exit status: 0 nothing required is missing (after installing, if it
# could), 1 a required package is missing or apt-get failed, 2 bad usage.
set -eu

# One line per package: SET KIND PACKAGE WHAT. KIND is req (the set cannot
# do without it) or opt (something is left out or skipped without it).
TABLE='
build req cmake             -
build req make              -
build req g++               -
build req pkg-config        -
build req libssl-dev        -
build req libcli11-dev      -
build req nlohmann-json3-dev -
build req libasio-dev       -
build opt ccache            compiler_cache_(rebuilds_from_scratch)
build opt libucx-dev        UCX_transport
build opt libfabric-dev     OFI_(libfabric)_transport
build opt libhiredis-dev    Redis_metadata_store
build opt libmunge-dev      MUNGE_authentication
build opt python3-dev       pydyad_(Python_bindings)
build opt pybind11-dev      pydyad_(Python_bindings)
demo  req cmake             -
demo  req make              -
demo  req g++               -
demo  req pkg-config        -
demo  req libssl-dev        -
demo  req libcli11-dev      -
demo  req nlohmann-json3-dev -
demo  req libasio-dev       -
demo  opt ccache            compiler_cache_(rebuilds_from_scratch)
demo  opt iproute2          network_namespaces_(the_demo_uses_loopback_instead)
test  req libgtest-dev      -
test  req libgmock-dev      -
test  opt binutils          exported-symbol_and_RUNPATH_checks
test  opt iproute2          network_namespaces_(tests_use_loopback_instead)
test  opt nftables          packet-loss_fault_tests
test  opt procps            -
test  opt coreutils         -
test  opt tar               preload_tests_with_tar
test  opt strace            syscall-count_tests
test  opt valgrind          store-lifetime_check_under_valgrind
test  opt clang-format      source-format_test
test  req prometheus        -
test  opt libfabric-bin     OFI_provider_checks_(fi_info)
test  opt redis-server      Redis_store_tests
test  opt redis-tools       Redis_Cluster_tests
test  opt redis-sentinel    Redis_Sentinel_tests
test  opt munge             MUNGE_tests_(munged)
test  opt clang-16          fuzz_targets_and_thread-safety_analysis
test  opt libfuzzer-16-dev  fuzz_targets
test  opt libclang-rt-16-dev fuzz_targets
test  opt python3-pytest    pydyad_tests
test  opt python3-numpy     pydyad_data-loader_tests
test  opt python3-h5py      pydyad_HDF5_tests
test  opt python3-torch     pydyad_PyTorch_tests
test  opt python3-pip       pip_install_test
test  opt python3-setuptools pip_install_test
test  opt python3-wheel     pip_install_test
test  opt python3-venv      pip_install_test
test  opt groff-base        man-page_check
test  opt systemd           systemd_unit_check_(systemd-analyze)
test  opt lua5.1            environment-module_check_(luac)
flux  req autoconf          -
flux  req automake          -
flux  req libtool           -
flux  req make              -
flux  req pkg-config        -
flux  req g++               -
flux  req libzmq3-dev       -
flux  req uuid-dev          -
flux  req libjansson-dev    -
flux  req liblz4-dev        -
flux  req libarchive-dev    -
flux  req libhwloc-dev      -
flux  req libsqlite3-dev    -
flux  req lua5.1            -
flux  req liblua5.1-0-dev   -
flux  req lua-posix         -
flux  req python3-dev       -
flux  req python3-cffi      -
flux  req python3-ply       -
flux  req python3-setuptools -
flux  req python3-yaml      -
flux  req libsystemd-dev    -
flux  req libmunge-dev      -
flux  req jq                -
flux  req xz-utils          -
bench opt python3-matplotlib benchmark_plots
bench opt redis-server      Redis_metadata_benchmarks
bench opt redis-tools       Redis_metadata_benchmarks
'

usage() {
    echo "usage: install-deps.sh [--check | --list] [build|demo|test|bench|flux|all]..." >&2
    exit 2
}

mode=install
sets=""
for arg in "$@"; do
    case $arg in
        --check) mode=check ;;
        --list) mode=list ;;
        -h | --help) sed -n '2,/^set -eu/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        build | demo | test | bench | flux) sets="$sets $arg" ;;
        all) sets="$sets build test bench" ;;
        *) echo "install-deps: unknown set or option '$arg'" >&2; usage ;;
    esac
done
[ -n "$sets" ] || sets=build

# The rows of the requested sets, one package once (a package required by
# any requested set counts as required).
rows=$(echo "$TABLE" | awk -v sets="$sets" '
    BEGIN { n = split(sets, s, " "); for (i = 1; i <= n; i++) want[s[i]] = 1 }
    NF == 4 && ($1 in want) {
        if (!($3 in kind)) { order[++count] = $3; what[$3] = $4; kind[$3] = $2 }
        else if ($2 == "req") kind[$3] = "req"
    }
    END { for (i = 1; i <= count; i++) print order[i], kind[order[i]], what[order[i]] }')

if [ "$mode" = list ]; then
    echo "$rows" | awk '{ print $1 }'
    exit 0
fi

sets_text=$(echo $sets)
if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "install-deps: not a Debian system (no dpkg-query): cannot check packages." >&2
    echo "install-deps: the build needs CMake >= 3.20, a C++17 compiler, pkg-config, OpenSSL," \
         "CLI11 and nlohmann-json; UCX, libfabric, hiredis, libmunge and pybind11 are optional" \
         "(see docs/deployment.md)" >&2
    exit 0
fi

missing_req=""
missing_opt=""
notes=""
installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
# (a here-document, not a pipe, so the loop's variables survive it)
while read -r pkg kind what; do
    [ -n "$pkg" ] || continue
    installed "$pkg" && continue
    if [ "$kind" = req ]; then
        missing_req="$missing_req $pkg"
    else
        missing_opt="$missing_opt $pkg"
        if [ "$what" != - ]; then
            what=$(echo "$what" | tr _ ' ')
            case "$notes" in *"$what"*) ;; *) notes="${notes:+$notes, }$what" ;; esac
        fi
    fi
done <<EOF
$rows
EOF

missing="$missing_req$missing_opt"
if [ -z "$missing" ]; then
    exit 0
fi

SUDO=""
can_install=no
if [ "$mode" = install ]; then
    if [ "$(id -u)" -eq 0 ]; then
        can_install=yes
    elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        SUDO="sudo"
        can_install=yes
    fi
fi

if [ "$can_install" = yes ]; then
    echo "install-deps: installing ($sets_text):$missing"
    export DEBIAN_FRONTEND=noninteractive
    # A stale package index makes installs fail with 404s; refresh once, then retry.
    # shellcheck disable=SC2086
    if ! $SUDO apt-get install -y --no-install-recommends $missing; then
        $SUDO apt-get update
        if ! $SUDO apt-get install -y --no-install-recommends $missing; then
            echo "install-deps: apt-get could not install:$missing" >&2
            exit 1
        fi
    fi
    exit 0
fi

if [ "$mode" = check ]; then
    why="(--check: nothing installed)"
else
    why="(not root, and no sudo without a password: nothing installed)"
fi
echo "install-deps: missing Debian packages for '$sets_text' $why:" >&2
[ -z "$missing_req" ] || echo "  required:$missing_req" >&2
[ -z "$missing_opt" ] || echo "  optional:$missing_opt" >&2
echo "install-deps: to install them, as root: apt-get install -y --no-install-recommends$missing" >&2
if [ -n "$missing_req" ]; then
    echo "install-deps: cannot go on without the required packages" >&2
    exit 1
fi
[ -z "$notes" ] || echo "install-deps: going on without: $notes" >&2
exit 0
