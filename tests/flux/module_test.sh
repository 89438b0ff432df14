#!/bin/bash
# module_test.sh BUILD_DIR: the Flux module dyad.so (issue 27), inside a
# two-broker instance on this host. ctest runs it as
#   flux start --test-size=2 tests/flux/module_test.sh BUILD_DIR
# (the instance ends with this script). Each case prints "ok - NAME" or
# "not ok - NAME: why"; the exit status is the number of failed cases.
# Every wait is bounded (timeout), and the modules, processes and
# directories the script made are removed on any exit.
set -u
B=${1:?usage: module_test.sh BUILD_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
MOD=$B/lib/dyad.so
FETCH="flux python $HERE/module_fetch.py"
if [ -z "${FLUX_URI:-}" ]; then
  echo "module_test.sh must run inside flux start --test-size=2" >&2
  exit 2
fi
T=$(mktemp -d /tmp/dyad-fluxmod.XXXXXX)
RUNDIR=$(flux getattr rundir)
failed=0
cleanup() {
  timeout 30 flux exec -r all flux module remove -f dyad >/dev/null 2>&1 ||
    timeout 30 flux exec -r all sh -c 'flux module remove dyad 2>/dev/null; true'
  rm -rf "$T"
}
trap cleanup EXIT
ok() { echo "ok - $1"; }
notok() {
  echo "not ok - $1: $2"
  failed=$((failed + 1))
}
ms() { date +%s%3N; }
stat_of() { # RANK KEY/KEY...: one value of flux module stats dyad, as text
  timeout 10 flux exec -r "$1" flux module stats dyad 2>/dev/null |
    python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("/"):
    v = v.get(k, "") if isinstance(v, dict) else ""
print(v)' "$2" 2>/dev/null
}

mkdir -p "$T/p0" "$T/p1" "$T/c0"

# --- LoadReturnsWhenReady: the service answers the moment load returns.
t0=$(ms)
if timeout 90 flux exec -r 0 flux module load "$MOD" "$T/p0" &&
  timeout 90 flux exec -r 1 flux module load "$MOD" --fetch-chunk 4194304 "$T/p1"; then
  t1=$(ms)
  if DYAD_SERVICE_SOCKET=$RUNDIR/dyad-local-1.sock timeout 10 "$B/dyad" status >"$T/status1" 2>&1 &&
    grep -q "rank" "$T/status1"; then
    ok "FluxModule.LoadReturnsWhenReady (both loads: $((t1 - t0)) ms)"
  else
    notok FluxModule.LoadReturnsWhenReady "status right after load failed: $(head -3 "$T/status1")"
  fi
else
  notok FluxModule.LoadReturnsWhenReady "flux module load failed"
  timeout 10 flux dmesg | grep dyad | tail -20
  exit 1
fi

# --- TwoBrokersGetDifferentSocketsAndPorts
l0=$(grep '^listen=' "$RUNDIR/dyad-local-0.ready" 2>/dev/null)
l1=$(grep '^listen=' "$RUNDIR/dyad-local-1.ready" 2>/dev/null)
if [ -S "$RUNDIR/dyad-local-0.sock" ] && [ -S "$RUNDIR/dyad-local-1.sock" ] &&
  [ -n "$l0" ] && [ -n "$l1" ] && [ "$l0" != "$l1" ]; then
  ok "FluxModule.TwoBrokersGetDifferentSocketsAndPorts ($l0 / $l1)"
else
  notok FluxModule.TwoBrokersGetDifferentSocketsAndPorts "sockets or ports: '$l0' '$l1'"
fi

# --- PublishThroughTheSocket: produce on rank 1 through its module's
# service, consume on rank 0 (FLUX_URI gives the client rank 0's socket):
# the two services authenticate each other with the agreed secret.
head -c 3000000 /dev/urandom >"$T/p1/data.bin"
if DYAD_SERVICE_SOCKET=$RUNDIR/dyad-local-1.sock DYAD_PATH_PRODUCER=$T/p1 \
  timeout 20 "$B/dyad" produce "$T/p1/data.bin" >"$T/produce.out" 2>&1 &&
  DYAD_PATH_CONSUMER=$T/c0 timeout 30 "$B/dyad" consume -t 20 "$T/c0/data.bin" \
    >"$T/consume.out" 2>&1 && cmp -s "$T/c0/data.bin" "$T/p1/data.bin"; then
  ok FluxModule.PublishThroughTheSocket
else
  notok FluxModule.PublishThroughTheSocket "$(cat "$T/produce.out" "$T/consume.out" | head -5)"
fi

# --- SecretIsAgreedAndPrivate: one secret for both brokers, 0600 files,
# the KVS key readable by the owner and refused to a guest.
s0=$(cat "$RUNDIR/dyad-local-0.secret" 2>/dev/null)
s1=$(cat "$RUNDIR/dyad-local-1.secret" 2>/dev/null)
mode=$(stat -c %a "$RUNDIR/dyad-local-1.secret" 2>/dev/null)
if [ -n "$s0" ] && [ "$s0" = "$s1" ] && [ ${#s0} -ge 32 ] && [ "$mode" = 600 ] &&
  timeout 10 flux kvs get dyadmod.secret >/dev/null 2>&1 &&
  ! FLUX_HANDLE_USERID=4242 FLUX_HANDLE_ROLEMASK=0x2 timeout 10 flux kvs get dyadmod.secret \
    >/dev/null 2>&1; then
  ok FluxModule.SecretIsAgreedAndPrivate
else
  notok FluxModule.SecretIsAgreedAndPrivate "secrets '${#s0}'/'${#s1}' chars, mode $mode"
fi

# --- StatsShowCounters: flux module stats dyad has the child and the
# service's counters.
state=$(stat_of 1 service/state)
pubs=$(stat_of 1 counters/requests.publish)
if [ "$state" = running ] && [ "${pubs:-0}" -ge 1 ] && [ "$(stat_of 1 rank)" = 1 ]; then
  ok FluxModule.StatsShowCounters
else
  notok FluxModule.StatsShowCounters "state '$state', requests.publish '$pubs'"
fi

# --- DmesgShowsServiceLines: the module's and the service's lines.
if timeout 10 flux exec -r 1 flux dmesg >"$T/dmesg1" 2>&1 &&
  grep -q 'dyad.*dyad-service (pid [0-9]*) is ready' "$T/dmesg1" &&
  grep -q 'dyad.*dyad-service: .*serving: rank 1' "$T/dmesg1"; then
  ok FluxModule.DmesgShowsServiceLines
else
  notok FluxModule.DmesgShowsServiceLines "$(grep dyad "$T/dmesg1" | tail -3)"
fi

# --- FetchFromOtherRank: upstream's FLUX_RPC consume loop gets the bytes,
# a chunk per response (9 MB in 4 MiB responses: three).
head -c 9000000 /dev/urandom >"$T/p1/big.bin"
if timeout 60 $FETCH 1 big.bin >"$T/big.got" 2>"$T/fetch.err" && cmp -s "$T/big.got" "$T/p1/big.bin" &&
  grep -q 'responses: 3' "$T/fetch.err"; then
  ok FluxModule.FetchFromOtherRank
else
  notok FluxModule.FetchFromOtherRank "$(cat "$T/fetch.err")"
fi
# Upstream's consumers take one data response: by default (16 MiB chunks)
# a 9 MB file is one response.
cp "$T/p1/big.bin" "$T/p0/big.bin"
if timeout 60 $FETCH 0 big.bin >"$T/big0.got" 2>"$T/fetch.err" &&
  cmp -s "$T/big0.got" "$T/p0/big.bin" && grep -q 'responses: 1' "$T/fetch.err"; then
  ok FluxModule.FetchFitsUpstreamsOneResponseByDefault
else
  notok FluxModule.FetchFitsUpstreamsOneResponseByDefault "$(cat "$T/fetch.err")"
fi
: >"$T/p1/empty"
if timeout 30 $FETCH 1 empty >"$T/empty.got" 2>"$T/fetch.err" && [ ! -s "$T/empty.got" ]; then
  ok FluxModule.FetchOfAnEmptyFile
else
  notok FluxModule.FetchOfAnEmptyFile "$(cat "$T/fetch.err")"
fi

# --- StatsDoNotStallTheModule: a service that does not answer (stopped)
# costs each stats request its 2 s bound on a thread of its own: three at
# once end together (on the module's reactor they would take 6 s in a row),
# each saying why.
spid=$(stat_of 1 service/pid)
if [ -n "$spid" ] && kill -STOP "$spid"; then
  t0=$(ms)
  for i in 1 2 3; do
    FLUX_URI=local://$RUNDIR/local-1 timeout 20 flux module stats dyad >"$T/stats.$i" 2>&1 &
  done
  wait
  t1=$(ms)
  kill -CONT "$spid"
  if [ $((t1 - t0)) -lt 5000 ] && grep -q status_error "$T/stats.1" &&
    grep -q status_error "$T/stats.3" && grep -q '"state": "running"' "$T/stats.2"; then
    ok "FluxModule.StatsDoNotStallTheModule (3 at once: $((t1 - t0)) ms)"
  else
    notok FluxModule.StatsDoNotStallTheModule "$((t1 - t0)) ms: $(head -c 300 "$T/stats.1")"
  fi
else
  notok FluxModule.StatsDoNotStallTheModule "no service pid"
fi

# --- FetchRefusesSymlinkEscape and FetchRefusesPathOutside.
ln -s /etc/hostname "$T/p1/escape"
timeout 30 $FETCH 1 escape >"$T/esc.got" 2>"$T/fetch.err"
rc=$?
if [ $rc = 11 ] && [ ! -s "$T/esc.got" ] && grep -q escapes "$T/fetch.err"; then
  ok FluxModule.FetchRefusesSymlinkEscape
else
  notok FluxModule.FetchRefusesSymlinkEscape "rc $rc: $(cat "$T/fetch.err")"
fi
bad=0
for p in ../p0/data.bin /etc/hostname ../../etc/hostname; do
  timeout 30 $FETCH 1 "$p" >"$T/out.got" 2>"$T/fetch.err"
  rc=$?
  if [ $rc != 11 ] || [ -s "$T/out.got" ]; then
    bad=1
    notok FluxModule.FetchRefusesPathOutside "'$p': rc $rc $(cat "$T/fetch.err")"
  fi
done
[ $bad = 0 ] && ok FluxModule.FetchRefusesPathOutside
timeout 30 $FETCH 1 missing.bin >/dev/null 2>"$T/fetch.err"
rc=$?
if [ $rc = 12 ]; then ok FluxModule.FetchOfMissingFileIsENOENT; else
  notok FluxModule.FetchOfMissingFileIsENOENT "rc $rc: $(cat "$T/fetch.err")"
fi

# --- FetchRefusesNonOwner: the broker stamps a guest's role.
FLUX_HANDLE_USERID=4242 FLUX_HANDLE_ROLEMASK=0x2 timeout 30 $FETCH 1 data.bin \
  >"$T/guest.got" 2>"$T/fetch.err"
rc=$?
if [ $rc != 0 ] && [ ! -s "$T/guest.got" ]; then ok "FluxModule.FetchRefusesNonOwner (rc $rc)"; else
  notok FluxModule.FetchRefusesNonOwner "rc $rc: $(cat "$T/fetch.err")"
fi

# --- FetchWaitsForProducerLock: a producer holding its exclusive lock
# makes the fetch wait (on a timer: the module stays responsive meanwhile).
echo locked-content >"$T/p1/locked.txt"
tl=$(ms)
flock -x "$T/p1/locked.txt" sleep 3 &
lockpid=$!
sleep 0.2
timeout 30 $FETCH 1 locked.txt >"$T/locked.got" 2>"$T/fetch.err" &
fetchpid=$!
# Meanwhile the module answers other requests (stats) and shows the fetch.
responsive=0
while [ $(($(ms) - tl)) -lt 2700 ]; do
  [ "$(stat_of 1 fetch/in_progress)" = 1 ] && responsive=1 && break
  sleep 0.1
done
wait $fetchpid
rc=$?
t1=$(ms)
wait $lockpid
if [ $rc = 0 ] && cmp -s "$T/locked.got" "$T/p1/locked.txt" && [ $((t1 - tl)) -ge 2900 ] &&
  [ $responsive = 1 ] && [ "$(stat_of 1 fetch/lock_waits)" -ge 1 ]; then
  ok "FluxModule.FetchWaitsForProducerLock (done $((t1 - tl)) ms after the 3 s lock began)"
else
  notok FluxModule.FetchWaitsForProducerLock "rc $rc after $((t1 - tl)) ms, seen in progress: $responsive"
fi

# --- NoModuleGivesENOSYS: a broker without the module answers ENOSYS.
timeout 30 flux exec -r 0 flux module remove dyad
timeout 30 $FETCH 0 anything >/dev/null 2>"$T/fetch.err"
rc=$?
if [ $rc = $((10 + 38)) ]; then ok FluxModule.NoModuleGivesENOSYS; else
  notok FluxModule.NoModuleGivesENOSYS "rc $rc: $(cat "$T/fetch.err")"
fi

# --- KilledChildIsRestarted: the broker survives, the module restarts the
# service (logged), stats count it.
pid=$(stat_of 1 service/pid)
if [ -n "$pid" ] && [ "$pid" -gt 0 ] && kill -9 "$pid"; then
  deadline=$(($(ms) + 20000))
  while [ "$(ms)" -lt $deadline ]; do
    [ "$(stat_of 1 service/restarts)" = 1 ] && [ "$(stat_of 1 service/state)" = running ] && break
    sleep 0.2
  done
  newpid=$(stat_of 1 service/pid)
  timeout 10 flux exec -r 1 flux dmesg >"$T/dmesg1" 2>&1
  if [ "$(stat_of 1 service/state)" = running ] && [ "$newpid" != "$pid" ] &&
    [ "$(stat_of 1 service/last_exit)" = "killed by signal 9 (Killed)" ] &&
    grep -q 'restarting it in' "$T/dmesg1" &&
    DYAD_SERVICE_SOCKET=$RUNDIR/dyad-local-1.sock timeout 10 "$B/dyad" status >/dev/null 2>&1 &&
    [ "$(grep '^listen=' "$RUNDIR/dyad-local-1.ready")" = "$l1" ]; then
    ok "FluxModule.KilledChildIsRestarted (pid $pid -> $newpid, same port)"
  else
    notok FluxModule.KilledChildIsRestarted "state $(stat_of 1 service/state), pid $newpid"
  fi
else
  notok FluxModule.KilledChildIsRestarted "no service pid in stats"
fi

# --- RemoveIsPrompt: bounded, and the service and its socket are gone.
pid=$(stat_of 1 service/pid)
t0=$(ms)
timeout 30 flux exec -r 1 flux module remove dyad
rc=$?
t1=$(ms)
if [ $rc = 0 ] && [ $((t1 - t0)) -lt 10000 ] && ! kill -0 "$pid" 2>/dev/null &&
  [ ! -e "$RUNDIR/dyad-local-1.sock" ] && [ ! -e "$RUNDIR/dyad-local-1.secret" ]; then
  ok "FluxModule.RemoveIsPrompt ($((t1 - t0)) ms)"
else
  notok FluxModule.RemoveIsPrompt "rc $rc after $((t1 - t0)) ms, pid $pid alive: $(kill -0 "$pid" 2>&1 && echo yes)"
fi

# --- BadOptionFailsLoad and ServiceFailingBeforeReadyFailsLoad: clear
# errors, nothing left loaded.
if ! timeout 30 flux module load "$MOD" --bogus "$T/p0" 2>"$T/load.err" &&
  timeout 10 flux dmesg | grep -q "unknown option '--bogus'" &&
  ! flux module list | grep -q '^dyad '; then
  ok FluxModule.BadOptionFailsLoad
else
  notok FluxModule.BadOptionFailsLoad "$(cat "$T/load.err")"
fi
t0=$(ms)
if ! timeout 60 flux module load "$MOD" --service /bin/false "$T/p0" 2>"$T/load.err" &&
  timeout 10 flux dmesg | grep -q 'dyad-service exited with status 1 before it was ready' &&
  [ $(($(ms) - t0)) -lt 20000 ] && ! flux module list | grep -q '^dyad '; then
  ok FluxModule.ServiceFailingBeforeReadyFailsLoad
else
  notok FluxModule.ServiceFailingBeforeReadyFailsLoad "$(cat "$T/load.err")"
fi

# --- ReadyTimeoutFailsLoad: a service that never gets ready fails the load
# after --ready-timeout, is stopped, and nothing stays loaded.
printf '#!/bin/sh\necho $$ >%s\nexec sleep 60\n' "$T/never-ready.pid" >"$T/never-ready"
chmod +x "$T/never-ready"
t0=$(ms)
if ! timeout 60 flux module load "$MOD" --service "$T/never-ready" --ready-timeout 1 "$T/p0" \
  2>"$T/load.err" && [ $(($(ms) - t0)) -lt 15000 ] &&
  timeout 10 flux dmesg | grep -q 'dyad-service was not ready within 1 s' &&
  ! flux module list | grep -q '^dyad ' && [ -s "$T/never-ready.pid" ] &&
  ! kill -0 "$(cat "$T/never-ready.pid")" 2>/dev/null; then
  ok "FluxModule.ReadyTimeoutFailsLoad ($(($(ms) - t0)) ms)"
else
  notok FluxModule.ReadyTimeoutFailsLoad "$(cat "$T/load.err")"
fi

# --- InfoAndErrorLogsPerRank: upstream's -i/-e, one file per rank.
if timeout 90 flux exec -r 1 flux module load "$MOD" -i "$T/info" -e "$T/err" "$T/p1" &&
  grep -q 'serving: rank 1' "$T/info.1" 2>/dev/null &&
  timeout 30 flux exec -r 1 flux module remove dyad; then
  ok FluxModule.InfoAndErrorLogsPerRank
else
  notok FluxModule.InfoAndErrorLogsPerRank "$(ls "$T"; head -3 "$T/info.1" 2>&1)"
  timeout 30 flux exec -r 1 flux module remove dyad 2>/dev/null
fi

# --- DyadStartAndStop: upstream's `dyad start -p PATH -m MODE` and `dyad stop`.
loaded_on() { timeout 10 flux exec -r "$1" flux module list 2>/dev/null | grep -c '^dyad '; }
if timeout 90 "$B/dyad" start -p "$T/p0" -m FLUX_RPC >"$T/start.out" 2>&1 &&
  [ "$(loaded_on 0)" = 1 ] && [ "$(loaded_on 1)" = 1 ] &&
  [ "$(stat_of 1 info/transport)" = tcp ] &&
  timeout 60 "$B/dyad" stop >"$T/stop.out" 2>&1 &&
  [ "$(loaded_on 0)" = 0 ] && [ "$(loaded_on 1)" = 0 ]; then
  ok FluxModule.DyadStartAndStop
else
  notok FluxModule.DyadStartAndStop "$(cat "$T/start.out" "$T/stop.out" | head -5)"
fi
if ! env -u FLUX_URI "$B/dyad" start -p "$T/p0" >/dev/null 2>"$T/start.err" &&
  grep -q 'no Flux instance' "$T/start.err" &&
  ! "$B/dyad" start -p relative/dir >/dev/null 2>"$T/start.err" &&
  grep -q 'absolute' "$T/start.err"; then
  ok FluxModule.DyadStartRefusesWithoutFluxOrWithARelativePath
else
  notok FluxModule.DyadStartRefusesWithoutFluxOrWithARelativePath "$(cat "$T/start.err")"
fi

echo "$failed failed"
exit $failed
