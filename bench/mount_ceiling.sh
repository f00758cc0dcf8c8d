#!/bin/bash
# `locus mount --consistency afs` (a local server, 0 ms) beside the bare FUSE file systems
# of `bench/`, which answer from a local directory with system calls and nothing else,
# and beside the local directory, on the workloads of `locus bench mount`: `find` over
# Go's sources three times (on `fuse_lookup_ceiling.c`), PostMark with 2000 files and
# 20000 transactions, and the Andrew-like job over Lua's sources (both on
# `fuse_passthrough_ceiling.c`, one thread, kernel caching for a day). Fresh mounts for
# each workload, rounds interleaved, medians printed: what any FUSE client of a remote
# server could reach here at best, and Locus's ratio to it.
#
#   apt-get install -y libfuse3-dev postmark golang-go   # any Go: its GOROOT/src is the tree
#   cargo build --release -p locus-cli
#   bench/mount_ceiling.sh [ROUNDS] [WORKLOADS]           # 3 rounds; find,postmark,andrew
set -euo pipefail
ROUNDS=${1:-3}
WORKLOADS=${2:-find,postmark,andrew}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${LOCUS_BIN:-$HERE/../target/release/locus}
W=$(mktemp -d /dev/shm/mountceiling.XXXX)
cleanup() {
    for m in "$W"/mnt-*; do fusermount3 -u "$m" 2>/dev/null || true; done
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
for c in fuse_lookup_ceiling fuse_passthrough_ceiling; do
    cc -O2 -o "$W/$c" "$HERE/$c.c" $(pkg-config fuse3 --cflags --libs)
done
mkdir -p "$W/root" "$W/local" "$W/backing"
cp -r "$(go env GOROOT)/src" "$W/root/gosrc"
cp -r "$(go env GOROOT)/src" "$W/local/gosrc"
LUA=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/lua-src-*/lua-5.4* | head -1)
cp -r "$LUA" "$W/lua"
printf 'SRC := $(filter-out lua.c luac.c,$(wildcard *.c))\nliblua.a: $(SRC:.c=.o)\n\tar rcs $@ $^\n%%.o: %%.c\n\tcc -O0 -c -o $@ $<\n' > "$W/lua/Makefile"

LOCUS_HOME=$W/home "$BIN" serve --listen 127.0.0.1:0 --root "$W/root" --state "$W/state" \
    --port-file "$W/port" > "$W/serve.log" 2>&1 &
while [ ! -s "$W/port" ]; do sleep 0.1; done
PORT=$(head -1 "$W/port" | cut -d' ' -f1)
TOKEN=$(grep '^admin ' "$W/state/tokens" | cut -d' ' -f2)

PYTHONPATH="$HERE" python3 - "$ROUNDS" "$WORKLOADS" "$W" "$BIN" "$PORT" "$TOKEN" <<'EOF'
import os, re, shutil, statistics, subprocess, sys, time
rounds, workloads, w, binary, port, token = sys.argv[1:]
env = dict(os.environ, LOCUS_TOKEN=f"admin:{token}", LOCUS_HOME=f"{w}/home", CEILING_TTL="86400")

def mounted(path):
    return any(line.split()[1] == path for line in open("/proc/mounts"))

class Mount:
    """A fresh mount of `kind` for one workload; its directory is `at`."""
    def __init__(self, kind, workload):
        self.at = f"{w}/mnt-{kind}"
        os.makedirs(self.at, exist_ok=True)
        if kind == "locus":
            cmd = [binary, "mount", "--consistency", "afs", "--cache-dir", f"{w}/cache",
                   f"locus://127.0.0.1:{port}/", self.at]
        elif workload == "find":
            cmd = [f"{w}/fuse_lookup_ceiling", f"{w}/root", self.at]
        else:
            cmd = [f"{w}/fuse_passthrough_ceiling", "-s", "-f", "-o", "noatime", f"{w}/backing", self.at]
        self.child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not mounted(self.at):
            time.sleep(0.05)
    def end(self):
        subprocess.run(["fusermount3", "-u", self.at], check=True)
        self.child.wait()

from ceiling_workloads import timed, andrew, postmark as postmark_in  # bench/ceiling_workloads.py
def postmark(dir):
    return postmark_in(w, dir)
ANDREW = andrew(w)

results = {}  # (workload, row, target) -> [values]
def note(workload, row, target, value):
    results.setdefault((workload, row, target), []).append(value)

for r in range(int(rounds)):
    for workload in workloads.split(","):
        for target in ["local", "ceiling", "locus"]:
            m = None if target == "local" else Mount(target, workload)
            where = f"{w}/local" if m is None else m.at
            if workload == "find":
                for p in ["cold", "second", "third"]:
                    note("find", p, target, timed(f"find gosrc", where) * 1000)
            elif workload == "postmark":
                tps, wall = postmark(where)
                note("postmark", "tx/s", target, tps)
                note("postmark", "wall s", target, wall)
            else:
                note("andrew", "s", target, timed(ANDREW, where))
            if m:
                m.end()
    print(f"round {r} done", file=sys.stderr)

print(f"medians of {rounds} rounds; locus: `locus mount --consistency afs`, local server, 0 ms")
print("| workload | local | bare FUSE ceiling | locus | locus ÷ ceiling (time) | ceiling ÷ local (time) |")
print("|---|---|---|---|---|---|")
for (workload, row, target), v in results.items():
    if target != "local":
        continue
    local, ceiling, locus = (statistics.median(results[(workload, row, t)]) for t in ("local", "ceiling", "locus"))
    # Transactions per second are a rate: its ratios are inverted to read as times.
    time = (lambda a, b: b / a) if row == "tx/s" else (lambda a, b: a / b)
    label = {"find": f"find, {row} pass, ms", "postmark": f"PostMark, {row}", "andrew": "Andrew-like job, s"}[workload]
    n = lambda v: f"{v:.0f}" if v >= 100 else f"{v:.3g}"
    print(f"| {label} | {n(local)} | {n(ceiling)} | {n(locus)} | {time(locus, ceiling):.2f}x | {time(ceiling, local):.2f}x |")
EOF
