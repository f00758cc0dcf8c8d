"""A real `locus serve --s3-port` for the S3 client tests, exporting a fresh directory.

The binary is LOCUS_BIN (the Rust test that runs this suite sets it). Subjects: `admin`
(everything) and `alice`, who may read and write the bucket `shared` and nothing else;
each gets its S3 keys from `locus token SUBJECT --s3`, as a user would.
"""

import os
import pathlib
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[4]


def keys(exe, state, subject):
    out = subprocess.run([exe, "token", subject, "--s3", "--state", str(state)], check=True,
                         capture_output=True, text=True).stdout
    pairs = dict(line.split("=", 1) for line in out.split())
    return pairs["AWS_ACCESS_KEY_ID"], pairs["AWS_SECRET_ACCESS_KEY"]


def start(work, flags=()):
    """A `locus serve --s3-port 0 FLAGS` exporting WORK/export; returns (facts, process)."""
    exe = os.environ.get("LOCUS_BIN", str(REPO / "target" / "release" / "locus"))
    root, state, port_file = work / "export", work / "state", work / "ports"
    (root / "shared").mkdir(parents=True)
    (root / "private").mkdir()
    (root / "shared" / "hello.txt").write_text("hello from the export\n")
    state.mkdir()
    # An active-file handler: `wc@ARGS` runs wc over the asked directory's files.
    (state / "handlers.conf").write_text("wc command /usr/bin/wc\n")
    admin = keys(exe, state, "admin")
    alice = keys(exe, state, "alice")
    env = dict(os.environ, LOCUS_HOME=str(work / "home"), LOCUS_LOG="warn", RUST_BACKTRACE="1")
    log = open(work / "serve.log", "w")
    proc = subprocess.Popen(
        [exe, "serve", "--listen", "127.0.0.1:0", "--root", str(root), "--state", str(state),
         "--port-file", str(port_file), "--s3-port", "0", *flags],
        env=env, stdout=log, stderr=log,
    )
    deadline = time.time() + 20
    while "s3 " not in (port_file.read_text() if port_file.exists() else ""):
        assert proc.poll() is None, "locus serve exited at start: " + (work / "serve.log").read_text()
        assert time.time() < deadline, "locus serve did not report its S3 port"
        time.sleep(0.05)
    ports = dict(line.split() if " " in line else ("native", line) for line in port_file.read_text().splitlines())
    scheme = "locus+tls" if "--tls" in flags else "locus"
    native = f"{scheme}://127.0.0.1:{ports['native']}"
    token = next(l.split()[1] for l in (state / "tokens").read_text().splitlines() if l.startswith("admin "))
    # alice: read, write, list and delete in `shared` only (set over plain TCP; a TLS
    # server's tests need no alice).
    if "--tls" not in flags:
        subprocess.run([exe, "acl", "set", f"{native}/shared", "alice", "rwld"], check=True,
                       env=dict(env, LOCUS_TOKEN=f"admin:{token}"))
    web = "https" if "--tls" in flags else "http"
    facts = {
        "endpoint": f"{web}://127.0.0.1:{ports['s3']}", "port": int(ports["s3"]),
        "root": root, "state": state, "exe": exe, "env": env, "native": native,
        "admin": admin, "alice": alice, "admin_token": f"admin:{token}", "work": work,
    }
    return facts, proc


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    facts, proc = start(tmp_path_factory.mktemp("locus-s3"))
    yield facts
    proc.terminate()
    proc.wait(timeout=10)


def client(server, who="admin", **kw):
    import boto3
    from botocore.config import Config

    key, secret = server[who]
    return boto3.client(
        "s3", endpoint_url=server["endpoint"], aws_access_key_id=key, aws_secret_access_key=secret,
        region_name="us-east-1", config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **kw),
    )


@pytest.fixture
def s3(server):
    return client(server)


@pytest.fixture
def bucket(s3, request):
    name = "b-" + request.node.name.lower().replace("_", "-")[:40]
    s3.create_bucket(Bucket=name)
    return name
