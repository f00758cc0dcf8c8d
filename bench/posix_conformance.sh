#!/bin/bash
# The POSIX conformance checks of bench/posix_conformance.py, side by side: a local
# directory, `locus mount` in each consistency mode, `locus run` (FUSE and trace
# interposition) and sshfs against a loopback sshd, all served from tmpfs. Prints one row
# per check and one column per target; a cell is PASS or the failure.
#
#   apt-get install -y sshfs openssh-server fuse3
#   cargo build --release -p locus-cli
#   bench/posix_conformance.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${LOCUS_BIN:-$HERE/../target/release/locus}
CHECK="$HERE/posix_conformance.py"
W=$(mktemp -d /dev/shm/conformance.XXXX)
cleanup() {
    for m in "$W"/mnt-*; do fusermount3 -u "$m" 2>/dev/null || true; done
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/root" "$W/local" "$W/sshroot" "$W/results"

LOCUS_HOME=$W/home "$BIN" serve --listen 127.0.0.1:0 --root "$W/root" --state "$W/state" \
    --port-file "$W/port" > "$W/serve.log" 2>&1 &
while [ ! -s "$W/port" ]; do sleep 0.1; done
PORT=$(head -1 "$W/port" | cut -d' ' -f1)
URL=locus://127.0.0.1:$PORT

run_local() { python3 "$CHECK" "$W/local" --json > "$W/results/local"; }

run_mount() {
    local mode=$1 mnt=$W/mnt-$1
    mkdir -p "$mnt"
    LOCUS_HOME=$W/home "$BIN" mount "$URL/" "$mnt" --consistency "$mode" --cache-dir "$W/cache-$mode" \
        > "$W/mount-$mode.log" 2>&1 &
    for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
    python3 "$CHECK" "$mnt" --json > "$W/results/mount-$mode"
    fusermount3 -u "$mnt"
}

run_agent() {
    local how=$1
    LOCUS_HOME=$W/home "$BIN" run --interpose "$how" --mount "/conf=$URL/" -- \
        python3 "$CHECK" /conf --json > "$W/results/run-$how" 2> "$W/run-$how.log" || true
}

run_sshfs() {
    command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ] || { echo '{}' > "$W/results/sshfs"; return; }
    mkdir -p "$W/sshd" /run/sshd
    ssh-keygen -q -t ed25519 -N '' -f "$W/sshd/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$W/sshd/user_key"
    cp "$W/sshd/user_key.pub" "$W/sshd/authorized_keys"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    printf 'Port %s\nListenAddress 127.0.0.1\nHostKey %s/host_key\nAuthorizedKeysFile %s/authorized_keys\nPermitRootLogin yes\nPasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile %s/sshd.pid\nSubsystem sftp internal-sftp\n' \
        "$port" "$W/sshd" "$W/sshd" "$W/sshd" > "$W/sshd/config"
    /usr/sbin/sshd -D -f "$W/sshd/config" &
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
    mkdir -p "$W/mnt-sshfs"
    sshfs "$(id -un)@127.0.0.1:$W/sshroot" "$W/mnt-sshfs" -p "$port" \
        -o "IdentityFile=$W/sshd/user_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR"
    python3 "$CHECK" "$W/mnt-sshfs" --json > "$W/results/sshfs"
    fusermount3 -u "$W/mnt-sshfs"
}

run_local
for mode in nfs afs sprite; do run_mount "$mode"; done
run_agent fuse
run_agent trace
run_sshfs

python3 - "$W/results" <<'EOF'
import json, os, sys
d = sys.argv[1]
cols = ["local", "mount-nfs", "mount-afs", "mount-sprite", "run-fuse", "run-trace", "sshfs"]
res = {}
for c in cols:
    try:
        res[c] = json.load(open(os.path.join(d, c)))
    except Exception:
        res[c] = {}
names = list(res["local"])
print("| check | " + " | ".join(cols) + " |")
print("|---|" + "---|" * len(cols))
for n in names:
    cells = []
    for c in cols:
        r = res[c].get(n, "not run")
        cells.append("pass" if r == "PASS" else r.replace("FAIL ", "FAIL: ").replace("|", "/"))
    print(f"| {n} | " + " | ".join(cells) + " |")
worse = [(n, c) for n in names for c in cols[1:6]
         if res["sshfs"].get(n) == "PASS" and res[c].get(n, "PASS") != "PASS"]
print()
print("Locus fails where sshfs passes:", ", ".join(f"{n} ({c})" for n, c in worse) or "nowhere")
EOF
