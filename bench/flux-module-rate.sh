#!/bin/bash
# flux-module-rate.sh BUILD_DIR KVS N: inside `flux start --test-size=2`, loads
# dyad.so with -k KVS on both brokers, publishes N files of 4 KiB on rank 1
# (one `dyad produce`) and consumes them on rank 0 (one `dyad consume`), and
# prints both rates (docs/flux.md, "Rates").
B=$1; K=$2; N=$3
T=$(mktemp -d /tmp/dyad-rate.XXXXXX); mkdir -p $T/p0 $T/p1 $T/c0
R=$(flux getattr rundir)
flux exec -r 0 flux module load $B/lib/dyad.so -k $K $T/p0 && flux exec -r 1 flux module load $B/lib/dyad.so -k $K $T/p1 || exit 1
for i in $(seq 1 $N); do head -c 4096 /dev/urandom > $T/p1/f$i; done
files=$(for i in $(seq 1 $N); do echo $T/p1/f$i; done)
cfiles=$(for i in $(seq 1 $N); do echo $T/c0/f$i; done)
t0=$(date +%s%N)
DYAD_SERVICE_SOCKET=$R/dyad-local-1.sock DYAD_PATH_PRODUCER=$T/p1 $B/dyad produce $files || echo produce failed
t1=$(date +%s%N)
DYAD_PATH_CONSUMER=$T/c0 $B/dyad consume -t 30 $cfiles || echo consume failed
t2=$(date +%s%N)
echo "$K: publish $N files: $(( N * 1000000000 / (t1 - t0) )) files/s; consume (fetch from the other broker): $(( N * 1000000000 / (t2 - t1) )) files/s"
flux exec -r all flux module remove dyad
rm -rf $T
