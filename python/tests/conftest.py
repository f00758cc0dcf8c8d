"""A real `locus serve` for the tests, on a free port, exporting a fresh directory.

The binary is LOCUS_BIN (the Rust test that runs this suite sets it), else the release
build of this repository. Its admin credentials go to LOCUS_TOKEN, where the package
finds credentials as the `locus` command does.
"""

import os
import pathlib
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("locus")
    exe = os.environ.get("LOCUS_BIN", str(REPO / "target" / "release" / "locus"))
    root, state, port_file = work / "export", work / "state", work / "port"
    env = dict(os.environ, LOCUS_HOME=str(work / "home"), LOCUS_LOG="warn", RUST_BACKTRACE="0")
    proc = subprocess.Popen(
        [exe, "serve", "--listen", "127.0.0.1:0", "--root", str(root), "--state", str(state),
         "--port-file", str(port_file)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 20
    while not (port_file.exists() and port_file.read_text().strip()):
        assert proc.poll() is None, "locus serve exited at start"
        assert time.time() < deadline, "locus serve did not report its port"
        time.sleep(0.05)
    port = int(port_file.read_text().split()[0])
    token = next(l.split()[1] for l in (state / "tokens").read_text().splitlines() if l.startswith("admin "))
    os.environ["LOCUS_TOKEN"] = f"admin:{token}"
    yield {"url": f"locus://127.0.0.1:{port}/", "port": port, "root": root, "state": state, "exe": exe, "env": env}
    proc.terminate()
    proc.wait(timeout=10)
