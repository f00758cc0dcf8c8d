"""locus.Client: file operations, errors as OSError subclasses, scripts, storelets."""

import os
import subprocess

import pytest

import locus


def test_files_round_trip(server):
    c = locus.Client(server["url"])
    assert c.whoami() == "admin"
    c.mkdir("/py")
    data = bytes(range(256)) * 40000  # 10 MB: several pipelined reads
    c.write("/py/data.bin", data)
    assert (server["root"] / "py" / "data.bin").read_bytes() == data
    assert c.read("/py/data.bin") == data
    assert c.read("/py/data.bin", 5_000_000, 5_000_001) == data[5_000_000:10_000_001]
    assert c.read("/py/data.bin", len(data) - 3, 100) == data[-3:]
    # read_buffer lends the received bytes without a copy: the same bytes, read-only.
    buf = c.read_buffer("/py/data.bin")
    view = memoryview(buf)
    assert len(buf) == len(data) and view.readonly and view == data
    with pytest.raises(TypeError):
        view[0:1] = b"x"
    assert bytes(c.read_buffer("/py/data.bin", 4_194_300, 4_194_310)) == data[4_194_300:8_388_610]
    assert bytes(c.read_buffer("/py/data.bin", len(data) - 3, 100)) == data[-3:]
    assert len(c.read_buffer("/py/data.bin", len(data) + 5)) == 0
    del view
    st = c.stat("/py/data.bin")
    assert st["type"] == "file" and st["size"] == len(data)
    assert [e["name"] for e in c.listdir("/py")] == ["data.bin"]
    c.rename("/py/data.bin", "/py/moved.bin")
    c.unlink("/py/moved.bin")
    c.rmdir("/py")
    assert not (server["root"] / "py").exists()


def test_errors_carry_errno(server):
    c = locus.Client(server["url"])
    with pytest.raises(FileNotFoundError):
        c.stat("/no/such/file")
    c.mkdir("/exists")
    with pytest.raises(FileExistsError):
        c.mkdir("/exists")
    # A subject without rights is refused with EACCES.
    out = subprocess.run([server["exe"], "token", "nobody", "--state", str(server["state"])],
                         capture_output=True, text=True, env=server["env"], check=True)
    token = out.stdout.strip().split()[-1]
    admin = os.environ["LOCUS_TOKEN"]
    os.environ["LOCUS_TOKEN"] = f"nobody:{token}"
    try:
        with pytest.raises(PermissionError):
            locus.Client(server["url"]).write("/exists/x", b"no")
    finally:
        os.environ["LOCUS_TOKEN"] = admin
    with pytest.raises(ValueError):
        locus.Client("http://not-locus/")


def test_script_call(server):
    c = locus.Client(server["url"])
    c.write("/s.txt", b"12345")
    source = "local path, extra = ...\nlocal st = fs.stat(path)\nreturn st.size + extra, path, {1, 2}"
    assert c.script_call(source, ["/s.txt", 10]) == [15, "/s.txt", [1, 2]]


HELLO = b"""(module
    (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
    (memory (export "memory") 1)
    (data (i32.const 100) "hello\\n")
    (func (export "_start")
      (i32.store (i32.const 0) (i32.const 100)) (i32.store (i32.const 4) (i32.const 6))
      (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"""


def test_storelet_output_streams(server):
    run = locus.Client(server["url"]).storelet_run(HELLO)
    assert run.exit_code is None
    chunks = list(run)
    assert b"".join(chunks) == b"hello\nhello\n"
    assert run.exit_code == 0 and run.account["fuel"] > 0
