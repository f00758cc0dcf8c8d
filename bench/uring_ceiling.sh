#!/bin/bash
# FUSE over io_uring beside classic FUSE (/dev/fuse read and write) on this machine, with
# bare file systems that answer from a local directory with system calls and nothing
# else, on the workloads of `mount_ceiling.sh`: `find` over Go's sources three times on a
# fresh mount, PostMark with 2000 files and 20000 transactions, and the Andrew-like job
# over Lua's sources; all on /dev/shm (tmpfs), a fresh mount per workload, rounds
# interleaved (the order of targets turning each round), medians printed. Targets:
#   local     the directory itself;
#   libfuse   the libfuse ceilings of `mount_ceiling.sh` (`fuse_lookup_ceiling` for find,
#             `fuse_passthrough_ceiling -s` for PostMark and Andrew);
#   classic   `fuse_uring_ceiling --transport classic`, one reader of /dev/fuse per CPU;
#   classic1  the same with one reader;
#   uring     `fuse_uring_ceiling --transport uring`, a ring queue per CPU.
# The last three are one program: only the transport differs. All keep what the kernel
# learns for a day (CEILING_TTL=86400), as `locus mount --consistency afs` does.
# Turns on /sys/module/fuse/parameters/enable_uring for the run (restored after).
#
#   apt-get install -y liburing-dev libfuse3-dev postmark golang-go   # as root
#   bench/uring_ceiling.sh [ROUNDS] [WORKLOADS]                       # 5 rounds; find,postmark,andrew
set -euo pipefail
ROUNDS=${1:-5}
WORKLOADS=${2:-find,postmark,andrew}
HERE=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" = 0 ] || { echo "uring_ceiling.sh: run as root (it mounts with mount(2))" >&2; exit 1; }
for need in cc pkg-config postmark go; do
    command -v $need > /dev/null || { echo "missing $need: apt-get install -y liburing-dev libfuse3-dev postmark golang-go" >&2; exit 1; }
done
[ -e /usr/include/liburing.h ] || { echo "missing liburing: apt-get install -y liburing-dev" >&2; exit 1; }

# FUSE over io_uring is off unless this module parameter is on (kernel 6.14 and later).
URING=/sys/module/fuse/parameters/enable_uring
if [ ! -e $URING ]; then
    echo "uring_ceiling.sh: $URING does not exist: this kernel ($(uname -r)) has no FUSE over io_uring" >&2
    exit 1
fi
URING_WAS=$(cat $URING)
if ! echo 1 > $URING 2> /dev/null || [ "$(cat $URING)" != Y ]; then
    echo "uring_ceiling.sh: cannot turn on $URING (it reads $(cat $URING)); FUSE over io_uring is unavailable" >&2
    exit 1
fi
echo "enable_uring: was $URING_WAS, now $(cat $URING) for this run" >&2

W=$(mktemp -d /dev/shm/uringceiling.XXXX)
cleanup() {
    for m in "$W"/mnt-*; do umount "$m" 2> /dev/null || umount -l "$m" 2> /dev/null || true; done
    kill $(jobs -p) 2> /dev/null || true
    wait 2> /dev/null || true
    rm -rf "$W"
    [ "$URING_WAS" = Y ] || echo 0 > $URING
}
trap cleanup EXIT
for c in fuse_lookup_ceiling fuse_passthrough_ceiling; do
    cc -O2 -o "$W/$c" "$HERE/$c.c" $(pkg-config fuse3 --cflags --libs)
done
cc -O2 -Wall -o "$W/fuse_uring_ceiling" "$HERE/fuse_uring_ceiling.c" -luring -lpthread
mkdir -p "$W/root" "$W/local" "$W/backing" "$W/logs"
cp -r "$(go env GOROOT)/src" "$W/root/gosrc"
cp -r "$(go env GOROOT)/src" "$W/local/gosrc"
LUA=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/lua-src-*/lua-5.4* 2> /dev/null | head -1)
[ -n "$LUA" ] || { echo "no Lua 5.4 sources under ~/.cargo/registry/src/*/lua-src-*/ (a cargo build of locus fetches them)" >&2; exit 1; }
cp -r "$LUA" "$W/lua"
printf 'SRC := $(filter-out lua.c luac.c,$(wildcard *.c))\nliblua.a: $(SRC:.c=.o)\n\tar rcs $@ $^\n%%.o: %%.c\n\tcc -O0 -c -o $@ $<\n' > "$W/lua/Makefile"

PYTHONPATH="$HERE" python3 - "$ROUNDS" "$WORKLOADS" "$W" <<'EOF'
import os, re, shutil, statistics, subprocess, sys, time
rounds, workloads, w = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
env = dict(os.environ, CEILING_TTL="86400")
TARGETS = ["local", "libfuse", "classic", "classic1", "uring"]
cpus = os.cpu_count()

def mounted(path):
    return any(line.split()[1] == path for line in open("/proc/mounts"))

class Mount:
    """A fresh mount of `target` for one workload; its directory is `at`."""
    def __init__(self, target, workload, r):
        self.at = f"{w}/mnt-{target}"
        os.makedirs(self.at, exist_ok=True)
        backing = f"{w}/root" if workload == "find" else f"{w}/backing"
        self.log = open(f"{w}/logs/{workload}-{target}-{r}.log", "w")
        if target == "libfuse":
            if workload == "find":
                cmd = [f"{w}/fuse_lookup_ceiling", backing, self.at]
            else:
                cmd = [f"{w}/fuse_passthrough_ceiling", "-s", "-f", "-o", "noatime", backing, self.at]
            self.child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
            while not mounted(self.at):
                time.sleep(0.05)
        else:
            transport = "uring" if target == "uring" else "classic"
            threads = "1" if target == "classic1" else str(cpus)
            cmd = [f"{w}/fuse_uring_ceiling", "--transport", transport, "--threads", threads, backing, self.at]
            self.child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
            ready = self.child.stdout.readline()  # after FUSE_INIT (and, for uring, a request over the ring)
            if not ready.startswith("ready"):
                self.child.wait()
                sys.exit(f"{target} did not start: {open(self.log.name).read()}")
    def end(self):
        subprocess.run(["umount", self.at], check=True)
        self.child.wait()
        self.log.close()

from ceiling_workloads import timed, andrew, postmark as postmark_in  # bench/ceiling_workloads.py
def postmark(dir):
    return postmark_in(w, dir)
ANDREW = andrew(w)

results = {}  # (workload, row) -> {target: [values by round]}
def note(workload, row, target, value):
    results.setdefault((workload, row), {t: [] for t in TARGETS})[target].append(value)

for r in range(rounds):
    order = TARGETS[r % len(TARGETS):] + TARGETS[:r % len(TARGETS)]  # noise drifts over all alike
    for workload in workloads:
        for target in order:
            m = None if target == "local" else Mount(target, workload, r)
            where = f"{w}/local" if m is None else m.at
            if workload == "find":
                for p in ["cold", "second", "third"]:
                    note("find", p, target, timed("find gosrc", where) * 1000)
            elif workload == "postmark":
                tps, wall = postmark(where)
                note("postmark", "tx/s", target, tps)
                note("postmark", "wall s", target, wall)
            else:
                note("andrew", "s", target, timed(ANDREW, where))
            if m:
                m.end()
    print(f"round {r + 1} of {rounds} done", file=sys.stderr)

def label(workload, row):
    return {"find": f"find, {row} pass, ms", "postmark": f"PostMark, {row}", "andrew": "Andrew-like job, s"}[workload]
n = lambda v: f"{v:.0f}" if v >= 100 else f"{v:.3g}"
def ratio(row, a, b):  # a ÷ b as times: rates (tx/s) inverted, so < 1 means a is faster
    return b / a if row == "tx/s" else a / b

print(f"\nmedians of {rounds} rounds, {cpus} CPUs; classic: {cpus} readers of /dev/fuse, classic1: one; "
      f"uring: {cpus} ring queues; uring ÷ classic as time (< 1: io_uring faster)\n")
print("| workload | local | libfuse | classic | classic1 | uring | uring ÷ classic | uring ÷ classic1 |")
print("|---|---|---|---|---|---|---|---|")
for (workload, row), v in results.items():
    med = {t: statistics.median(v[t]) for t in TARGETS}
    print(f"| {label(workload, row)} | " + " | ".join(n(med[t]) for t in TARGETS) +
          f" | {ratio(row, med['uring'], med['classic']):.2f}x | {ratio(row, med['uring'], med['classic1']):.2f}x |")

print("\nevery round (in the order run), and the spread (max - min) ÷ median\n")
print("| workload | target | rounds | spread |")
print("|---|---|---|---|")
for (workload, row), v in results.items():
    for t in TARGETS:
        med = statistics.median(v[t])
        spread = (max(v[t]) - min(v[t])) / med if med else 0
        print(f"| {label(workload, row)} | {t} | {' '.join(n(x) for x in v[t])} | {spread * 100:.0f}% |")

# What carried the requests in the last round of each workload (from the program's log).
print()
for workload in workloads:
    for t in ["classic", "classic1", "uring"]:
        lines = open(f"{w}/logs/{workload}-{t}-{rounds - 1}.log").read().strip().splitlines()
        print(f"{workload}, {t}: {lines[-1] if lines else '(no log)'}")
EOF
