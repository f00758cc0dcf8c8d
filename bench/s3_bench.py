#!/usr/bin/env python3
"""The S3 door against Locus's native protocol and another S3 server, side by side in
one run: boto3 and rclone PUT and GET of one large object and of many small ones.

    python3 -m venv /tmp/s3venv && /tmp/s3venv/bin/pip install boto3
    apt-get install rclone
    GOFLAGS=-mod=mod go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
    go build -o /tmp/s3_ceiling bench/s3_ceiling.go
    /tmp/s3venv/bin/python bench/s3_bench.py --locus target/release/locus \
        --versitygw ~/go/bin/versitygw --ceiling /tmp/s3_ceiling [--rounds 3 --big-mib 1024 --small 10000]

Each server exports a directory of its own on the same disk; every transfer runs
`--rounds` times, interleaved, and the medians are printed with their ratios. The
native figures are `locus put`/`locus get` (large) and `locus cp -r` (small); the ceiling
is a bare HTTP server that checks and stores nothing (boto3 against it).
"""

import argparse
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config


def wait_for(path, word, proc):
    deadline = time.time() + 30
    while True:
        text = path.read_text() if os.path.exists(path) else ""
        lines = dict(l.split() if " " in l else ("native", l) for l in text.splitlines())
        if word in lines:
            return int(lines[word])
        if proc.poll() is not None or time.time() > deadline:
            sys.exit(f"the server did not start ({word})")
        time.sleep(0.05)


def timed(fn):
    # Each transfer starts with no dirty pages of the one before left to write back.
    os.sync()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--locus", required=True)
    ap.add_argument("--versitygw", required=True)
    ap.add_argument("--ceiling", help="bench/s3_ceiling.go built: boto3's ceiling on this machine")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--small", type=int, default=10000)
    ap.add_argument("--small-kib", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    import pathlib
    work = pathlib.Path(tempfile.mkdtemp(prefix="s3bench-", dir="/var/tmp"))
    procs = []
    try:
        # Locus: its export and state; keys for admin.
        lroot, lstate = work / "locus-export", work / "locus-state"
        (lroot / "bench").mkdir(parents=True)
        lstate.mkdir()
        out = subprocess.run([a.locus, "token", "admin", "--s3", "--state", str(lstate)], capture_output=True,
                             text=True, check=True).stdout
        keys = dict(l.split("=", 1) for l in out.split())
        lkey, lsecret = keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"]
        env = dict(os.environ, LOCUS_HOME=str(work / "home"), LOCUS_LOG="warn")
        env.pop("AWS_CA_BUNDLE", None)
        p = subprocess.Popen([a.locus, "serve", "--listen", "127.0.0.1:0", "--root", str(lroot), "--state", str(lstate),
                              "--port-file", str(work / "ports"), "--s3-port", "0"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        native = wait_for(work / "ports", "native", p)
        ls3 = wait_for(work / "ports", "s3", p)
        token = next(l.split()[1] for l in (lstate / "tokens").read_text().splitlines() if l.startswith("admin "))
        env["LOCUS_TOKEN"] = f"admin:{token}"
        # versitygw over a plain directory, without metadata in xattrs on this disk's behalf.
        vroot = work / "vgw-export"
        (vroot / "bench").mkdir(parents=True)
        vport = 17070 + os.getpid() % 1000
        p = subprocess.Popen([a.versitygw, "--access", "vgwkey", "--secret", "vgwsecret1234", "--port",
                              f"127.0.0.1:{vport}", "posix", str(vroot)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        procs.append(p)
        time.sleep(1.5)
        servers = {
            "locus-s3": (f"http://127.0.0.1:{ls3}", lkey, lsecret),
            "versitygw": (f"http://127.0.0.1:{vport}", "vgwkey", "vgwsecret1234"),
        }
        pids = {"locus-s3": procs[0].pid, "versitygw": procs[1].pid}
        if a.ceiling:
            # A bare HTTP server that checks nothing and stores nothing (boto3 only).
            cport = vport + 1
            procs.append(subprocess.Popen([a.ceiling, f"127.0.0.1:{cport}", str(a.big_mib)]))
            servers["ceiling"] = (f"http://127.0.0.1:{cport}", "k", "s")
            # The same, with a PUT's SHA-256 (a signed payload) and its write to disk:
            # everything a PUT of the door cannot skip.
            cdir = work / "ceiling-disk"
            cdir.mkdir()
            procs.append(subprocess.Popen([a.ceiling, f"127.0.0.1:{cport + 1}", str(a.big_mib), str(cdir)]))
            servers["ceiling-disk"] = (f"http://127.0.0.1:{cport + 1}", "k", "s")
            time.sleep(0.5)
        # What is sent.
        big = work / "big.bin"
        with open(big, "wb") as f:
            for _ in range(a.big_mib):
                f.write(os.urandom(1 << 20))
        small = work / "small"
        small.mkdir()
        for i in range(a.small):
            (small / f"f{i:05d}").write_bytes(os.urandom(a.small_kib << 10))
        names = sorted(os.listdir(small))

        def client(name):
            ep, k, s = servers[name]
            return boto3.client("s3", endpoint_url=ep, aws_access_key_id=k, aws_secret_access_key=s,
                                region_name="us-east-1",
                                config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                              max_pool_connections=a.threads * 2))

        def rclone_env(name):
            ep, k, s = servers[name]
            # The bucket exists: rclone is told not to make it (versitygw answers a
            # CreateBucket of a directory made without its metadata with a 500, which
            # rclone retries for ever: the hang an earlier run met).
            e = dict(env, RCLONE_CONFIG_S_TYPE="s3", RCLONE_CONFIG_S_PROVIDER="Other", RCLONE_CONFIG_S_ENDPOINT=ep,
                     RCLONE_CONFIG_S_ACCESS_KEY_ID=k, RCLONE_CONFIG_S_SECRET_ACCESS_KEY=s,
                     RCLONE_CONFIG_S_NO_CHECK_BUCKET="true", RCLONE_CONFIG=str(work / "rclone.conf"))
            return e

        def run(cmd, e, timeout=600):
            subprocess.run(cmd, env=e, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout)

        results = {}

        def note(what, seconds):
            results.setdefault(what, []).append(seconds)

        cpu_used = {}

        def server_cpu(name):
            # The server's CPU seconds so far (user + system, from /proc).
            if name not in pids:
                return 0.0
            fields = open(f"/proc/{pids[name]}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        def measured(what, name, fn):
            # Wall time noted, and the server's CPU time for it beside.
            before = server_cpu(name)
            note(what, timed(fn))
            cpu_used.setdefault(what, []).append(server_cpu(name) - before)

        tc = TransferConfig(max_concurrency=a.threads)
        for r in range(a.rounds):
            for name in servers:
                c = client(name)
                key = "big.big" if name.startswith("ceiling") else "big.bin"
                measured(f"boto3 PUT big {name}", name, lambda: c.upload_file(str(big), "bench", key, Config=tc))
                dst = work / "big.down"
                measured(f"boto3 GET big {name}", name, lambda: c.download_file("bench", key, str(dst), Config=tc))
                dst.unlink()

                def put_small():
                    with concurrent.futures.ThreadPoolExecutor(a.threads) as ex:
                        list(ex.map(lambda n: c.put_object(Bucket="bench", Key=f"small/{n}",
                                                           Body=(small / n).read_bytes()), names))

                def get_small():
                    with concurrent.futures.ThreadPoolExecutor(a.threads) as ex:
                        list(ex.map(lambda n: c.get_object(Bucket="bench", Key=f"small/{n}")["Body"].read(), names))

                measured(f"boto3 PUT small {name}", name, put_small)
                measured(f"boto3 GET small {name}", name, get_small)
                if name.startswith("ceiling"):
                    continue
                e = rclone_env(name)

                def rclone(what, cmd):
                    # A run past 180 s is noted as hung, not timed.
                    try:
                        note(f"rclone {what} {name}", timed(lambda: run(cmd, e, timeout=180)))
                    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as err:
                        print(f"rclone {what} {name}: {type(err).__name__}", file=sys.stderr)

                rclone("PUT big", ["rclone", "copyto", "--ignore-times", str(big), "s:bench/rbig.bin",
                                   "--s3-upload-concurrency", str(a.threads)])
                rclone("GET big", ["rclone", "copyto", "--ignore-times", "s:bench/rbig.bin", str(work / "rbig.down"),
                                   "--multi-thread-streams", str(a.threads)])
                (work / "rbig.down").unlink(missing_ok=True)
                # The same without rclone's MD5 of what it received (its own CPU, not the server's).
                rclone("GET big unchecked", ["rclone", "copyto", "--ignore-times", "--ignore-checksum", "s:bench/rbig.bin",
                                             str(work / "rbig.down"), "--multi-thread-streams", str(a.threads)])
                (work / "rbig.down").unlink(missing_ok=True)
                rclone("PUT small", ["rclone", "copy", "--ignore-times", str(small), "s:bench/rsmall",
                                     "--transfers", str(a.threads)])
                down = work / "rsmall.down"
                rclone("GET small", ["rclone", "copy", "--ignore-times", "s:bench/rsmall", str(down),
                                     "--transfers", str(a.threads)])
                shutil.rmtree(down, ignore_errors=True)
            url = f"locus://127.0.0.1:{native}"
            note("native PUT big", timed(lambda: run([a.locus, "put", str(big), f"{url}/bench/nbig.bin"], env)))
            note("native GET big", timed(lambda: run([a.locus, "get", f"{url}/bench/nbig.bin", str(work / "n.down")],
                                                     env)))
            (work / "n.down").unlink()
            note("native PUT small", timed(lambda: run([a.locus, "cp", "-r", str(small), f"{url}/bench/nsmall{r}"], env)))
            down = work / "nsmall.down"
            note("native GET small", timed(lambda: run([a.locus, "cp", "-r", f"{url}/bench/nsmall{r}", str(down)], env)))
            shutil.rmtree(down)
            print(f"round {r + 1} done", file=sys.stderr)

        med = {k: statistics.median(v) for k, v in results.items()}
        mib = a.big_mib
        print(f"# {a.rounds} rounds, medians; big = {mib} MiB, small = {a.small} x {a.small_kib} KiB, "
              f"{a.threads} client threads")
        print("| transfer | seconds (median) | rate |")
        print("|---|---|---|")
        for k in sorted(med):
            rate = f"{mib / med[k]:.0f} MiB/s" if "big" in k else f"{a.small / med[k]:.0f} objects/s"
            print(f"| {k} | {med[k]:.2f} ({', '.join(f'{x:.2f}' for x in results[k])}) | {rate} |")
        print()
        print()
        print("| boto3 transfer | server CPU seconds (median) | per object or per GiB |")
        print("|---|---|---|")
        for k in sorted(cpu_used):
            if "ceiling" in k:
                continue
            c = statistics.median(cpu_used[k])
            per = f"{c / (mib / 1024):.2f} s/GiB" if "big" in k else f"{c / a.small * 1e6:.0f} us/object"
            print(f"| {k} | {c:.2f} | {per} |")
        print()

        def ratio(slow, fast):
            return f"{med[slow] / med[fast]:.2f}x" if slow in med and fast in med else "n/a"

        for tool in ("boto3", "rclone"):
            for d in ("PUT", "GET"):
                door = f"{tool} {d} big locus-s3"
                print(f"{tool} {d} big: S3 door / native throughput = {ratio(f'native {d} big', door)}, "
                      f"/ versitygw = {ratio(f'{tool} {d} big versitygw', door)}, "
                      f"/ ceiling = {ratio(f'{tool} {d} big ceiling', door)}, "
                      f"/ ceiling with SHA-256 and disk = {ratio(f'{tool} {d} big ceiling-disk', door)}")
                door = f"{tool} {d} small locus-s3"
                print(f"{tool} {d} small: S3 door / versitygw rate = {ratio(f'{tool} {d} small versitygw', door)}, "
                      f"/ native = {ratio(f'native {d} small', door)}, / ceiling = {ratio(f'{tool} {d} small ceiling', door)}")
        door = "rclone GET big unchecked locus-s3"
        print(f"rclone GET big, MD5 unchecked: S3 door / native throughput = {ratio('native GET big', door)}, "
              f"/ versitygw = {ratio('rclone GET big unchecked versitygw', door)}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
