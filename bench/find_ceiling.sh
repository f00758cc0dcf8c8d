#!/bin/bash
# `find` over Go's sources three times on `locus mount --consistency afs` (a local server,
# 0 ms) beside the same three passes on `bench/fuse_lookup_ceiling.c`, a FUSE file system
# that answers from a local directory with system calls and nothing else and lets the
# kernel keep everything, and beside the local `find`; fresh mounts each round, rounds
# interleaved, medians printed.
#
# Why the second pass is not the third on any FUSE file system: reading a directory
# through FUSE marks its access time stale in the kernel (`fuse_invalidate_atime`), so the
# next `find` asks the file system once per directory for its attributes, however long
# it may cache them; the pass after that asks nothing.
#
#   apt-get install -y libfuse3-dev golang-go   # or any Go; its GOROOT/src is the tree
#   cargo build --release -p locus-cli
#   bench/find_ceiling.sh [ROUNDS]               # 5 rounds by default
set -euo pipefail
ROUNDS=${1:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${LOCUS_BIN:-$HERE/../target/release/locus}
W=$(mktemp -d /dev/shm/findceiling.XXXX)
cleanup() {
    fusermount3 -u "$W/mnt" 2>/dev/null || true
    fusermount3 -u "$W/ceiling" 2>/dev/null || true
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
cc -O2 -o "$W/fuse_lookup_ceiling" "$HERE/fuse_lookup_ceiling.c" $(pkg-config fuse3 --cflags --libs)
mkdir -p "$W/root" "$W/mnt" "$W/ceiling"
cp -r "$(go env GOROOT)/src" "$W/root/src"

LOCUS_HOME=$W/home "$BIN" serve --listen 127.0.0.1:0 --root "$W/root" --state "$W/state" \
    --port-file "$W/port" > "$W/serve.log" 2>&1 &
while [ ! -s "$W/port" ]; do sleep 0.1; done
PORT=$(head -1 "$W/port" | cut -d' ' -f1)
TOKEN=$(grep '^admin ' "$W/state/tokens" | cut -d' ' -f2)

python3 - "$ROUNDS" "$W" "$BIN" "$PORT" "$TOKEN" <<'EOF'
import os, statistics, subprocess, sys, time
rounds, w, binary, port, token = sys.argv[1:]
env = dict(os.environ, LOCUS_TOKEN=f"admin:{token}", LOCUS_HOME=f"{w}/home")
mounts = {
    "locus": ([binary, "mount", "--consistency", "afs", f"locus://127.0.0.1:{port}/", f"{w}/mnt"], f"{w}/mnt"),
    "ceiling": ([f"{w}/fuse_lookup_ceiling", f"{w}/root", f"{w}/ceiling"], f"{w}/ceiling"),
}

def find(path):
    t = time.perf_counter()
    subprocess.run(["find", path], stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t) * 1000

def mounted(path):
    return any(line.split()[1] == path for line in open("/proc/mounts"))

times = {(m, p): [] for m in mounts for p in ("cold", "second", "third")}
local = []
for r in range(int(rounds)):
    local.append(statistics.median(find(f"{w}/root/src") for _ in range(3)))
    for name, (command, at) in mounts.items():
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not mounted(at):
            time.sleep(0.05)
        for p in ("cold", "second", "third"):
            times[(name, p)].append(find(f"{at}/src"))
        subprocess.run(["fusermount3", "-u", at], check=True)
        child.wait()
    print(f"round {r}: local {local[-1]:.1f} ms, " + ", ".join(f"{m} {p} {v[-1]:.1f}" for (m, p), v in times.items()),
          file=sys.stderr)

l = statistics.median(local)
med = {k: statistics.median(v) for k, v in times.items()}
print(f"find over Go's src, ms, median of {rounds} rounds; local {l:.1f}")
print("| pass | bare FUSE ceiling | locus mount afs, 0 ms | locus ÷ ceiling | ceiling ÷ local | locus ÷ local |")
print("|---|---|---|---|---|---|")
for p in ("cold", "second", "third"):
    c, m = med[("ceiling", p)], med[("locus", p)]
    print(f"| {p} | {c:.1f} | {m:.1f} | {m / c:.2f}x | {c / l:.1f}x | {m / l:.1f}x |")
EOF
