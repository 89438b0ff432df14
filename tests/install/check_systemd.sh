#!/bin/sh
# The installed systemd template unit (share/dyad/systemd/dyad@.service):
#  1. `systemd-analyze verify` accepts an instance of it with nothing to say,
#     with no MANPATH, although the prefix is not where man looks (its
#     Documentation= names the installed pages by path; they exist), and
#     rejects a unit with a mistake (so the check itself works here);
#  2. a root and a worker started the way the unit starts them (ExecStart
#     with the environment of /etc/dyad/%i.env files written like
#     dyad.env.example says) form a cluster: a file produced on the root's
#     node is consumed on the worker's.
#
# usage: check_systemd.sh BUILD_DIR
set -eu
BUILD_DIR=$(cd "$1" && pwd)
WORK=$(mktemp -d /tmp/dyad-systemd-test.XXXXXX)
P="$WORK/prefix"
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
fail() {
  echo "check_systemd: $*" >&2
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done
  exit 1
}
for v in $(env | sed -n 's/^\(DYAD_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

cmake --install "$BUILD_DIR" --prefix "$P" >"$WORK/install.log" 2>&1 || fail "install failed"
UNIT="$P/share/dyad/systemd/dyad@.service"
[ -f "$UNIT" ] && [ -f "$P/share/dyad/systemd/dyad.env.example" ] || fail "unit or example missing"
grep -qx "ExecStart=$P/bin/dyad-service \$DYAD_SERVICE_OPTIONS" "$UNIT" ||
  fail "ExecStart does not name the installed dyad-service: $(grep ExecStart "$UNIT")"

# 1. systemd-analyze verify, on an instance named after this user.
user=$(id -un)
mkdir "$WORK/units"
cp "$UNIT" "$WORK/units/dyad@.service"
ln -s "dyad@.service" "$WORK/units/dyad@$user.service"
if command -v systemd-analyze >/dev/null 2>&1; then
  doc=$(sed -n 's/^Documentation=//p' "$UNIT")
  for d in $doc; do
    case "$d" in
      file://*) [ -f "${d#file://}" ] || fail "Documentation= names a missing file: $d" ;;
      *) fail "Documentation= $d: a prefix outside man's search path needs file:// URLs" ;;
    esac
  done
  if ! env -u MANPATH systemd-analyze verify "$WORK/units/dyad@$user.service" \
       >"$WORK/verify.out" 2>&1 || [ -s "$WORK/verify.out" ]; then
    cat "$WORK/verify.out" >&2
    fail "systemd-analyze verify complains about dyad@.service"
  fi
  sed 's/^Restart=/Restrat=/' "$UNIT" >"$WORK/units/broken@.service"
  ln -s "broken@.service" "$WORK/units/broken@$user.service"
  env -u MANPATH systemd-analyze verify "$WORK/units/broken@$user.service" \
    >"$WORK/broken.out" 2>&1 || true
  grep -q "Restrat" "$WORK/broken.out" || fail "systemd-analyze verify missed a misspelt key"
  echo "systemd-analyze verify: clean"
else
  echo "systemd-analyze not installed (apt-get install systemd): verify skipped"
fi

# 2. A root and a worker, each from ExecStart plus its environment file.
secret="$WORK/secret"
(umask 077; head -c 32 /dev/urandom | base64 >"$secret")
write_env() {  # name rank kvs
  mkdir -p -m 700 "$WORK/$1"  # it holds the socket: 0700, as the service requires
  cat >"$WORK/$1.env" <<EOF
# as /etc/dyad/$user.env on the $1's node
DYAD_SERVICE_RANK=$2
DYAD_KVS=$3
DYAD_PATH_PRODUCER=$WORK/$1/dyad
DYAD_PATH_CONSUMER=$WORK/$1/dyad
DYAD_SECRET_FILE=$secret
DYAD_SERVICE_LISTEN=127.0.0.1:0
DYAD_SERVICE_SOCKET=$WORK/$1/service.sock
DYAD_SERVICE_OPTIONS=--ready-file $WORK/$1/ready
EOF
}
start_from_unit() {  # name: ExecStart of the unit, environment from name.env
  exec_line=$(sed -n 's/^ExecStart=//p' "$UNIT")
  (
    # EnvironmentFile=: KEY=VALUE lines, the value taken as it is.
    while IFS= read -r line; do
      case "$line" in '#'* | '') continue ;; esac
      export "${line%%=*}=${line#*=}"
    done <"$WORK/$1.env"
    # systemd splits an unquoted $VAR of ExecStart into words, as the shell
    # does here.
    eval "exec $exec_line" >"$WORK/$1.log" 2>&1
  ) &
  PIDS="$PIDS $!"
  i=0
  until grep -q '^listen=' "$WORK/$1/ready" 2>/dev/null; do
    kill -0 "$!" 2>/dev/null || fail "$1 exited"
    [ $i -lt 200 ] || fail "$1 not ready within 20 s"
    sleep 0.1
    i=$((i + 1))
  done
}
write_env root 0 embedded
start_from_unit root
write_env worker 1 "embedded://$(sed -n 's/^advertise=//p' "$WORK/root/ready")"
start_from_unit worker

echo "from the root's node" >"$WORK/root/dyad/hello.txt"
DYAD_SERVICE_SOCKET="$WORK/root/service.sock" DYAD_PATH_PRODUCER="$WORK/root/dyad" \
  timeout 30 "$P/bin/dyad" produce "$WORK/root/dyad/hello.txt" || fail "produce on the root"
DYAD_SERVICE_SOCKET="$WORK/worker/service.sock" DYAD_PATH_CONSUMER="$WORK/worker/dyad" \
  timeout 30 "$P/bin/dyad" consume -t 20 "$WORK/worker/dyad/hello.txt" || fail "consume on the worker"
cmp "$WORK/root/dyad/hello.txt" "$WORK/worker/dyad/hello.txt" || fail "worker's copy differs"
echo "systemd unit OK"
