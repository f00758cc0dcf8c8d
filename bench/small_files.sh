#!/bin/bash
# Reading small files never read before through `locus mount` (the default, callbacks)
# at an emulated round-trip time: 50 files of a few bytes in one directory, listed
# first, then `cat` of all of them, then again. Prints the time per file.
#
#   cargo build --release -p locus-cli -p locus-bench --example delay_proxy
#   bench/small_files.sh [RTT_MS]        # 1 by default
set -euo pipefail
RTT=${1:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${LOCUS_BIN:-$HERE/../target/release/locus}
PROXY=$HERE/../target/release/examples/delay_proxy
W=$(mktemp -d /dev/shm/smallfiles.XXXX)
cleanup() {
    fusermount3 -u "$W/mnt" 2>/dev/null || true
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/root/d" "$W/mnt"
for i in $(seq 1 50); do echo "file $i" > "$W/root/d/f$i"; done
LOCUS_HOME=$W/home "$BIN" serve --listen 127.0.0.1:0 --root "$W/root" --state "$W/state" \
    --port-file "$W/port" --name '127.0.0.1:*' > "$W/serve.log" 2>&1 &
while [ ! -s "$W/port" ]; do sleep 0.1; done
PORT=$(head -1 "$W/port" | cut -d' ' -f1)
TOKEN=$(grep '^admin ' "$W/state/tokens" | cut -d' ' -f2)
"$PROXY" "127.0.0.1:$PORT" "$RTT" > "$W/proxy" 2>&1 &
while [ ! -s "$W/proxy" ]; do sleep 0.1; done
LOCUS_TOKEN=admin:$TOKEN LOCUS_HOME=$W/home "$BIN" mount "locus://$(head -1 "$W/proxy")/" "$W/mnt" > "$W/mount.log" 2>&1 &
while ! grep -qs " $W/mnt " /proc/mounts; do sleep 0.05; done
ls "$W/mnt/d" > /dev/null
for pass in "first read" "read again"; do
    S=$(date +%s%N)
    cat "$W"/mnt/d/f* > /dev/null
    E=$(date +%s%N)
    echo "$pass: $(( (E - S) / 50000 )) µs a file at $RTT ms"
done
