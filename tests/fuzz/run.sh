#!/bin/sh
# tests/fuzz/run.sh: builds and runs DYAD's libFuzzer targets.
#
#   run.sh build          configure build-fuzz/ with clang-16 and build the targets
#   run.sh smoke [SECS]   replay the committed corpus and fuzz each target SECS
#                         seconds (default 3); what `make test` runs (ctest, label fuzz)
#   run.sh fuzz [SECS]    fuzz each target SECS seconds (default $FUZZ_SECONDS, else 60);
#                         what `make fuzz` runs
#   run.sh merge          minimize what fuzzing found into the committed corpus
#   run.sh seeds          write the hand-made seed inputs into the committed corpus
#
# Environment: FUZZ_BUILD (build directory, default <repo>/build-fuzz),
# FUZZ_JOBS (parallel compile jobs, default 2), FUZZ_TARGETS (space-separated
# subset of targets). Exit status: 0 when every target ran without a
# finding, 1 on a finding (crash, sanitizer report, timeout or leak; the
# input is kept under $FUZZ_BUILD/artifacts), 77 when clang-16 or libFuzzer
# is missing (ctest counts that as skipped; scripts/install-deps.sh
# installs them).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FUZZ_BUILD:-$root/build-fuzz}
jobs=${FUZZ_JOBS:-2}
corpus=$here/corpus
cmd=${1:-smoke}
# Symbolized stack traces in sanitizer reports.
if [ -x /usr/lib/llvm-16/bin/llvm-symbolizer ]; then
    PATH=/usr/lib/llvm-16/bin:$PATH
    export PATH
fi

need_toolchain() {
    if ! command -v clang-16 >/dev/null 2>&1 || ! command -v clang++-16 >/dev/null 2>&1; then
        echo "fuzz: clang-16 is not installed (scripts/install-deps.sh installs it)" >&2
        exit 77
    fi
    rt=$(clang-16 -print-resource-dir)/lib/linux
    if [ ! -f "$rt/libclang_rt.fuzzer-x86_64.a" ] && [ ! -f /usr/lib/llvm-16/lib/libFuzzer.a ]; then
        echo "fuzz: libFuzzer runtime missing (install libfuzzer-16-dev libclang-rt-16-dev)" >&2
        exit 77
    fi
}

do_build() {
    need_toolchain
    mkdir -p "$build"
    if [ ! -f "$build/CMakeCache.txt" ]; then
        launcher=""
        if command -v ccache >/dev/null 2>&1; then
            launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
        fi
        # shellcheck disable=SC2086
        CC=clang-16 CXX=clang++-16 cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            $launcher >"$build/configure.log" 2>&1 || {
            cat "$build/configure.log" >&2
            exit 1
        }
    fi
    cmake --build "$build" -j"$jobs" >"$build/build.log" 2>&1 || {
        tail -n 40 "$build/build.log" >&2
        exit 1
    }
}

targets() {
    if [ -n "${FUZZ_TARGETS:-}" ]; then
        echo "$FUZZ_TARGETS" | tr ' ' '\n'
    else
        grep -v '^$' "$build/targets.txt"
    fi
}

# run_target NAME SECONDS: fuzzes NAME from its committed corpus, keeping new
# inputs in $build/corpus-work/NAME; prints one summary line.
run_target() {
    name=$1
    secs=$2
    mkdir -p "$build/corpus-work/$name" "$build/artifacts" "$build/logs" "$corpus/$name"
    log=$build/logs/$name.log
    status=0
    ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        "$build/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/$name-" \
        "$build/corpus-work/$name" "$corpus/$name" >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | sed 's/cov: //')
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | sed 's/ft: //')
    seeds=$(find "$corpus/$name" -type f | wc -l)
    if [ "$status" -ne 0 ]; then
        printf '%-28s FINDING (exit %s); see %s\n' "$name" "$status" "$log"
        grep -m 5 -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" || true
        return 1
    fi
    printf '%-28s %9s runs  cov %5s  ft %6s  corpus %4s  (%ss)\n' "$name" "${runs:-?}" \
        "${cov:-?}" "${ft:-?}" "$seeds" "$secs"
}

run_all() {
    secs=$1
    failed=0
    for t in $(targets); do
        run_target "$t" "$secs" || failed=1
    done
    return $failed
}

case $cmd in
    build) do_build ;;
    smoke)
        do_build
        run_all "${2:-3}"
        ;;
    fuzz)
        do_build
        run_all "${2:-${FUZZ_SECONDS:-60}}"
        ;;
    merge)
        do_build
        for t in $(targets); do
            mkdir -p "$build/corpus-work/$t" "$corpus/$t"
            "$build/$t" -merge=1 -max_len=16384 "$corpus/$t" "$build/corpus-work/$t" \
                >"$build/logs/$t.merge.log" 2>&1
            echo "$t: $(find "$corpus/$t" -type f | wc -l) inputs"
        done
        ;;
    seeds)
        do_build
        "$build/fuzz_make_seeds" "$corpus"
        ;;
    *)
        sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
