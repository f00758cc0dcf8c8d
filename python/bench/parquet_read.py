"""Reads one Parquet file with pyarrow from a local path, through fsspec's local
filesystem (the ceiling of any fsspec filesystem), through fsspec on locus://,
through sshfs (a loopback sshd) and through fsspec's HTTP filesystem (a local static
server with Range support, Go's net/http), side by side; prints medians of repeated runs.

    python python/bench/parquet_read.py [--size-gb 1] [--repeat 5] [--work-dir /dev/shm]

Needs the `locus` package installed (pip install ./python), pandas-free pyarrow, numpy,
aiohttp (fsspec's HTTP filesystem), and for the sshfs row sshfs, sshd and ssh-keygen;
a row whose tool is missing is skipped with a note. LOCUS_BIN names the `locus` binary
(default: target/release/locus of this repository).
"""

import argparse
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = pathlib.Path(__file__).resolve().parents[2]

GO_SERVER = """package main

import ("net/http"; "os")

func main() { http.ListenAndServe("127.0.0.1:" + os.Args[2], http.FileServer(http.Dir(os.Args[1]))) }
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited at start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not start")


def make_parquet(path, size_gb):
    # Ten float64 columns of random values: about 80 bytes a row that do not compress.
    rows = int(size_gb * (1 << 30) / 80)
    rng = np.random.default_rng(7)
    writer = None
    step = 2_000_000
    for start in range(0, rows, step):
        n = min(step, rows - start)
        table = pa.table({f"c{i}": rng.random(n) for i in range(10)})
        writer = writer or pq.ParquetWriter(path, table.schema, compression="none")
        writer.write_table(table, row_group_size=1_000_000)
    writer.close()


def start_locus(work, root):
    exe = os.environ.get("LOCUS_BIN", str(REPO / "target" / "release" / "locus"))
    state, port_file = work / "state", work / "port"
    proc = subprocess.Popen(
        [exe, "serve", "--listen", "127.0.0.1:0", "--root", str(root), "--state", str(state),
         "--port-file", str(port_file)],
        env=dict(os.environ, LOCUS_LOG="warn", RUST_BACKTRACE="0", LOCUS_HOME=str(work / "home")),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None:
            sys.exit("locus serve exited at start")
        time.sleep(0.05)
    port = int(port_file.read_text().split()[0])
    token = next(l.split()[1] for l in (state / "tokens").read_text().splitlines() if l.startswith("admin "))
    os.environ["LOCUS_TOKEN"] = f"admin:{token}"
    return proc, port


def start_sshfs(work, root, mnt):
    if not (shutil.which("sshfs") and shutil.which("ssh-keygen") and os.path.exists("/usr/sbin/sshd")):
        return None, "sshfs, ssh-keygen or sshd missing"
    d = work / "sshd"
    d.mkdir()
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    os.makedirs("/run/sshd", exist_ok=True)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PermitRootLogin yes\nPasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile {d}/sshd.pid\n"
        "Subsystem sftp internal-sftp\n")
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, sshd, "sshd")
    mnt.mkdir()
    user = os.environ.get("USER", "root")
    subprocess.run(["sshfs", f"{user}@127.0.0.1:{root}", str(mnt), "-p", str(port), "-o",
                    f"IdentityFile={d}/user_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR"],
                   check=True)
    return sshd, None


def start_http(work, root):
    if not shutil.which("go"):
        return None, None, "go missing"
    src = work / "static.go"
    src.write_text(GO_SERVER)
    binary = work / "static"
    subprocess.run(["go", "build", "-o", str(binary), str(src)], check=True, cwd=work,
                   env=dict(os.environ, GO111MODULE="off"))
    port = free_port()
    proc = subprocess.Popen([str(binary), str(root), str(port)])
    wait_port(port, proc, "the static HTTP server")
    return proc, port, None


def timed(read):
    start = time.perf_counter()
    table = read()
    took = time.perf_counter() - start
    assert table.num_rows > 0
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--work-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="locus-parquet-", dir=args.work_dir))
    root = work / "export"
    root.mkdir()
    procs, mounted = [], None
    try:
        path = root / "data.parquet"
        make_parquet(path, args.size_gb)
        size = path.stat().st_size
        locus, port = start_locus(work, root)
        procs.append(locus)
        locus_fs, _ = fsspec.core.url_to_fs(f"locus://127.0.0.1:{port}/")
        local_fs = fsspec.filesystem("file")
        rows = {
            "local path": lambda: pq.read_table(str(path)),
            # The same file through fsspec's own local filesystem: pyarrow's interface to
            # Python filesystems with no network at all, the ceiling of any fsspec path.
            "fsspec file://": lambda: pq.read_table(str(path), filesystem=local_fs),
            "locus:// (fsspec)": lambda: pq.read_table("/data.parquet", filesystem=locus_fs),
        }
        sshd, why = start_sshfs(work, root, work / "sshfs")
        if sshd:
            procs.append(sshd)
            mounted = work / "sshfs"
            rows["sshfs"] = lambda: pq.read_table(str(mounted / "data.parquet"))
        else:
            print(f"skipping sshfs: {why}")
        http, http_port, why = start_http(work, root)
        if http:
            procs.append(http)
            http_fs = fsspec.filesystem("http")
            url = f"http://127.0.0.1:{http_port}/data.parquet"
            rows["http (fsspec)"] = lambda: pq.read_table(url, filesystem=http_fs)
        else:
            print(f"skipping http: {why}")
        times = {name: [] for name in rows}
        for _ in range(args.repeat):
            for name, read in rows.items():
                times[name].append(timed(read))
        local = statistics.median(times["local path"])
        print(f"pyarrow.parquet.read_table of {size / 1e9:.2f} GB, medians of {args.repeat} (interleaved)")
        print(f"{'source':<20} {'seconds':>8} {'GB/s':>7} {'÷ local':>8}")
        for name, ts in times.items():
            m = statistics.median(ts)
            print(f"{name:<20} {m:>8.3f} {size / m / 1e9:>7.2f} {m / local:>7.2f}x")
    finally:
        if mounted:
            subprocess.run(["fusermount3", "-u", str(mounted)], check=False)
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
