#!/bin/bash
# What a second `find` can cost on any FUSE file system of this machine, beside what it
# costs on `locus mount --consistency afs`.
#
# Reading a directory through FUSE marks its access time stale in the kernel
# (`fuse_invalidate_atime`), so the next `find` asks the file system once per directory
# for its attributes, however long it may cache them. The least that pass can cost is the
# local `find` plus one bare FUSE round trip per directory. This script measures that
# round trip on `bench/fuse_passthrough_ceiling.c` (an `fstat` loop on a file whose
# attributes are never cached: one GETATTR each, answered by a C `fstat`), the local
# `find` over Go's sources, and three `find` passes over the same tree on an afs mount
# of a local server at 0 ms, in interleaved rounds; it prints the medians.
#
#   apt-get install -y libfuse3-dev golang-go   # or any Go; its GOROOT/src is the tree
#   cargo build --release -p locus-cli
#   bench/warm_find_ceiling.sh [ROUNDS]          # 3 rounds by default
set -euo pipefail
ROUNDS=${1:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${LOCUS_BIN:-$HERE/../target/release/locus}
CEILING=$(mktemp -d /dev/shm/ceiling.XXXX)
cc -O2 -o "$CEILING/fuse_ceiling" "$HERE/fuse_passthrough_ceiling.c" $(pkg-config fuse3 --cflags --libs)
W=$(mktemp -d /dev/shm/warmfind.XXXX)
cleanup() {
    fusermount3 -u "$W/mnt" 2>/dev/null || true
    fusermount3 -u "$CEILING/mnt" 2>/dev/null || true
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$W" "$CEILING"
}
trap cleanup EXIT
mkdir -p "$W/root" "$W/mnt" "$CEILING/data" "$CEILING/mnt"
cp -r "$(go env GOROOT)/src" "$W/root/src"
echo x > "$CEILING/data/f"
DIRS=$(find "$W/root/src" -type d | wc -l)

LOCUS_HOME=$W/home "$BIN" serve --listen 127.0.0.1:0 --root "$W/root" --state "$W/state" \
    --port-file "$W/port" > "$W/serve.log" 2>&1 &
while [ ! -s "$W/port" ]; do sleep 0.1; done
PORT=$(head -1 "$W/port" | cut -d' ' -f1)
TOKEN=$(grep '^admin ' "$W/state/tokens" | cut -d' ' -f2)
CEILING_TTL=0 "$CEILING/fuse_ceiling" -s -f -o noatime "$CEILING/data" "$CEILING/mnt" > /dev/null 2>&1 &

python3 - "$ROUNDS" "$DIRS" "$W" "$CEILING" "$BIN" "$PORT" "$TOKEN" <<'EOF'
import os, statistics, subprocess, sys, time
rounds, dirs, w, ceiling, binary, port, token = sys.argv[1:]
rounds, dirs = int(rounds), int(dirs)
env = dict(os.environ, LOCUS_TOKEN=f"admin:{token}", LOCUS_HOME=f"{w}/home")

def find(path):
    t = time.perf_counter()
    subprocess.run(["find", path], stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t) * 1000

def getattr_round_trip():
    fd = os.open(f"{ceiling}/mnt/f", os.O_RDONLY)
    t = time.perf_counter()
    for _ in range(5000):
        os.fstat(fd)
    os.close(fd)
    return (time.perf_counter() - t) / 5000 * 1e6

def mounted(path):
    return any(line.split()[1] == path for line in open("/proc/mounts"))

rows = {k: [] for k in ["rt", "local", "cold", "second", "third"]}
for r in range(rounds):
    rows["rt"].append(getattr_round_trip())
    rows["local"].append(statistics.median(find(f"{w}/root/src") for _ in range(3)))
    mount = subprocess.Popen([binary, "mount", "--consistency", "afs", f"locus://127.0.0.1:{port}/", f"{w}/mnt"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not mounted(f"{w}/mnt"):
        time.sleep(0.05)
    for k in ["cold", "second", "third"]:
        rows[k].append(find(f"{w}/mnt/src"))
    subprocess.run(["fusermount3", "-u", f"{w}/mnt"], check=True)
    mount.wait()
    print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()), file=sys.stderr)

m = {k: statistics.median(v) for k, v in rows.items()}
floor = m["local"] + dirs * m["rt"] / 1000
print(f"directories: {dirs}; bare FUSE GETATTR round trip: {m['rt']:.1f} µs (median of {rounds})")
print("| find over Go's src, ms (median) | local | ceiling: local + one round trip per directory | locus mount afs |")
print("|---|---|---|---|")
print(f"| second pass | {m['local']:.1f} | {floor:.1f} ({floor / m['local']:.1f}x local) | {m['second']:.1f} ({m['second'] / m['local']:.1f}x local, {m['second'] / floor:.2f}x the ceiling) |")
print(f"| third pass | {m['local']:.1f} | {m['local']:.1f} | {m['third']:.1f} ({m['third'] / m['local']:.1f}x local) |")
print(f"| cold (first) pass | {m['local']:.1f} | | {m['cold']:.1f} |")
EOF
