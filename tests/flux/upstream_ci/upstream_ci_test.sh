#!/bin/sh
# upstream_ci_test.sh MODE DTL: upstream DYAD's CI test as a test of ours
# (issue 27). MODE is c, cpp or python; DTL is UCX or FLUX_RPC.
#
# Inside `flux start --test-size=2` (two brokers on this host), as upstream's
# script does: `flux kvs namespace create test`; a consumer job submitted
# FIRST (`flux submit --nodes 1 --exclusive -t 10`) that opens 10 files in a
# loop and prints "OK" per verified file (c: plain open() under
# LD_PRELOAD=libdyad_wrapper.so; cpp: dyad::ifstream_dyad, without the preload
# library, as upstream's script runs it; python: pydyad's dyad_open), with NO
# module on its broker (its
# consumes go to the owner's module through Flux); then, on the other broker,
# `flux module load dyad.so --mode=$DTL $DYAD_PATH_PRODUCER` and a producer
# job writing the 10 files; `flux job attach` both; the namespace and the
# modules removed and both directories deleted. Unlike upstream's script
# (which exits 0 whatever happened) it fails unless the consumer printed 10
# "OK" lines and the consumer's broker never had the module.
#
# Environment: DYAD_CI_BUILD (the build directory), DYAD_CI_FLUX (the flux
# command), DYAD_CI_PROGRAMS (where c_cons & co. are), DYAD_CI_TIMEOUT
# (seconds for the whole instance, default 240), DYAD_CI_VERBOSE=1 prints
# the jobs' output. Exit 77 (skipped) without flux or without dyad.so.
set -u

if [ "${1:-}" = "--role" ]; then
  # Inside a job: $2 consumer|producer, $3 MODE.
  role=$2
  mode=$3
  prog=$DYAD_CI_PROGRAMS
  n=10
  case $role in
    consumer)
      mkdir -p "$DYAD_PATH_CONSUMER"
      echo "consumer on broker rank $(flux getattr rank); modules here: $(flux module list | awk '$1 == "dyad"' | wc -l)"
      case $mode in
        c) LD_PRELOAD=$DYAD_CI_BUILD/libdyad_wrapper.so "$prog/c_cons" $n "$DYAD_PATH_CONSUMER" ;;
        cpp) "$prog/cpp_cons" $n "$DYAD_PATH_CONSUMER" ;;
        python) python3 "$DYAD_CI_SOURCE/consumer.py" "$DYAD_PATH_CONSUMER" $n 50 ;;
      esac
      ;;
    producer)
      echo "producer on broker rank $(flux getattr rank)"
      flux module load "$DYAD_CI_BUILD/lib/dyad.so" --mode="$DYAD_DTL_MODE" "$DYAD_PATH_PRODUCER" ||
        exit 1
      mkdir -p "$DYAD_PATH_PRODUCER"
      case $mode in
        c) LD_PRELOAD=$DYAD_CI_BUILD/libdyad_wrapper.so "$prog/c_prod" $n "$DYAD_PATH_PRODUCER" ;;
        cpp) "$prog/cpp_prod" $n "$DYAD_PATH_PRODUCER" ;;
        python) python3 "$DYAD_CI_SOURCE/producer.py" "$DYAD_PATH_PRODUCER" $n 50 ;;
      esac
      ;;
  esac
  exit $?
fi

if [ "${1:-}" = "--inside" ]; then
  # Inside the instance (FLUX_URI = rank 0): $2 MODE, $3 DTL, $4 work dir.
  mode=$2
  work=$4
  export DYAD_KVS_NAMESPACE=test
  export DYAD_DTL_MODE=$3
  DYAD_PATH=$work/dyad
  export DYAD_PATH_CONSUMER=${DYAD_PATH}_consumer
  export DYAD_PATH_PRODUCER=${DYAD_PATH}_producer
  self=$DYAD_CI_SOURCE/upstream_ci_test.sh
  status=0
  flux kvs namespace create test || exit 1
  cons=$(flux submit --nodes 1 --exclusive -t 10 --env=DYAD_KVS_NAMESPACE --env=DYAD_DTL_MODE \
    --output="$work/consumer.out" --error="$work/consumer.err" \
    sh "$self" --role consumer "$mode") || status=1
  # The consumer runs (and blocks in its first open) before anything is
  # produced, as in upstream's CI.
  [ $status -eq 0 ] && flux job wait-event -t 60 "$cons" start >/dev/null || status=1
  cons_rank=$(flux jobs -no '{ranks}' "$cons" 2>/dev/null)
  prod=$(flux submit --nodes 1 --exclusive -t 10 --env=DYAD_KVS_NAMESPACE --env=DYAD_DTL_MODE \
    --output="$work/producer.out" --error="$work/producer.err" \
    sh "$self" --role producer "$mode") || status=1
  # Bounded: a job that hangs is cancelled (and the test fails).
  wait_s=${DYAD_CI_JOB_TIMEOUT:-120}
  timeout "$wait_s" flux job attach "$cons" >/dev/null 2>&1 || status=1
  timeout 30 flux job attach "$prod" >/dev/null 2>&1 || status=1
  if [ $status -ne 0 ]; then
    echo "a job failed or did not end within ${wait_s} s; cancelling"
    flux job cancel "$cons" "$prod" 2>/dev/null
  fi
  prod_rank=$(flux jobs -no '{ranks}' "$prod" 2>/dev/null)
  # The consumer's broker never loaded the module; the producer's did.
  cons_mods=$(flux exec -r "$cons_rank" flux module list 2>/dev/null | awk '$1 == "dyad"' | wc -l)
  ok=$(grep -c '^OK$' "$work/consumer.out" 2>/dev/null)
  echo "mode=$mode dtl=$DYAD_DTL_MODE consumer rank=$cons_rank (dyad modules: $cons_mods)" \
       "producer rank=$prod_rank: $ok of 10 OK"
  if [ "${DYAD_CI_VERBOSE:-0}" = 1 ] || [ "$ok" != 10 ]; then
    for f in producer.out producer.err consumer.out consumer.err; do
      echo "--- $f"
      cat "$work/$f" 2>/dev/null
    done
    echo "--- flux dmesg (dyad)"
    flux dmesg 2>/dev/null | grep -i dyad | tail -20
  fi
  [ "$ok" = 10 ] || status=1
  [ "$cons_mods" = 0 ] || { echo "the consumer's broker had the module"; status=1; }
  [ "$cons_rank" != "$prod_rank" ] || { echo "both jobs ran on rank $cons_rank"; status=1; }
  flux kvs namespace remove test
  flux exec -r all flux module remove dyad 2>/dev/null
  flux exec -r all rm -rf "$DYAD_PATH_CONSUMER" "$DYAD_PATH_PRODUCER"
  exit $status
fi

mode=${1:?usage: upstream_ci_test.sh c|cpp|python UCX|FLUX_RPC}
dtl=${2:?usage: upstream_ci_test.sh c|cpp|python UCX|FLUX_RPC}
: "${DYAD_CI_BUILD:?DYAD_CI_BUILD (the build directory) is required}"
flux=${DYAD_CI_FLUX:-flux}
if ! command -v "$flux" >/dev/null 2>&1; then
  echo "skipped: no flux-core ($flux not found)"
  exit 77
fi
if [ ! -f "$DYAD_CI_BUILD/lib/dyad.so" ]; then
  echo "skipped: $DYAD_CI_BUILD/lib/dyad.so (the Flux module) is not built"
  exit 77
fi
DYAD_CI_SOURCE=$(cd "$(dirname "$0")" && pwd)
export DYAD_CI_SOURCE DYAD_CI_BUILD
export DYAD_CI_PROGRAMS=${DYAD_CI_PROGRAMS:-$DYAD_CI_BUILD/tests/flux/upstream_ci}
export PYTHONPATH=$DYAD_CI_BUILD/python${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d /tmp/dyad-upstream-ci.XXXXXX) || exit 1
trap 'rm -rf "$work"' EXIT INT TERM
# The instance ends with its command; the timeout bounds a hung one.
timeout -k 10 "${DYAD_CI_TIMEOUT:-240}" "$flux" start --test-size=2 \
  sh "$DYAD_CI_SOURCE/upstream_ci_test.sh" --inside "$mode" "$dtl" "$work"
