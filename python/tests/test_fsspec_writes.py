"""Writing through fsspec's locus:// filesystem: copies made at the server, parents made
for new files, exclusive creation, writes streamed to the server as they are made (a
2 GiB file in little memory), appends that do not read the file, transactions, and dask
writing and reading Parquet."""

import os
import subprocess
import sys
import time

import fsspec
import pandas as pd
import pytest


def fs_of(server):
    return fsspec.filesystem("locus", host="127.0.0.1", port=server["port"])


def uploads_in(directory):
    """Hidden files of uploads in progress in a directory of the export."""
    return [p for p in directory.iterdir() if p.name.startswith(".__locus_put")]


def test_cp_file_copies_at_the_server_and_makes_the_parents(server):
    fs = fs_of(server)
    data = os.urandom(3 << 20)
    fs.pipe_file("/cp/src.bin", data)
    fs.cp_file("/cp/src.bin", "/cp/new/deeper/dst.bin")
    assert (server["root"] / "cp/new/deeper/dst.bin").read_bytes() == data
    fs.pipe_file("/cp/other", b"other")
    fs.cp_file("/cp/other", "/cp/new/deeper/dst.bin")  # replaces
    assert fs.cat_file("/cp/new/deeper/dst.bin") == b"other"
    with pytest.raises(FileNotFoundError):
        fs.cp_file("/cp/missing", "/cp/elsewhere/x")
    assert not fs.exists("/cp/elsewhere")
    fs.copy("/cp/new", "/cp/tree", recursive=True)
    assert fs.cat_file("/cp/tree/deeper/dst.bin") == b"other"


def test_writes_make_missing_directories(server):
    fs = fs_of(server)
    fs.pipe_file("/mk/a/b/piped", b"1")
    with fs.open("/mk/c/d/small", "wb") as f:
        f.write(b"2")
    with fs.open("/mk/e/f/large", "wb") as f:  # streamed: more than a block
        f.write(b"3" * (3 << 20))
    with fs.open("/mk/g/h/appended", "ab") as f:
        f.write(b"4")
    assert [fs.cat_file(p) for p in ["/mk/a/b/piped", "/mk/c/d/small", "/mk/g/h/appended"]] == [b"1", b"2", b"4"]
    assert fs.info("/mk/e/f/large")["size"] == 3 << 20


def acl_set(server, path, subject, rights):
    subprocess.run([server["exe"], "acl", "set", server["url"] + path.lstrip("/"), subject, rights],
                   env=dict(server["env"], LOCUS_TOKEN=os.environ["LOCUS_TOKEN"]), check=True, capture_output=True)


def test_parents_are_made_below_a_directory_that_takes_no_new_names(server):
    fs = fs_of(server)
    fs.makedirs("/locked/open")
    acl_set(server, "/locked/open", "admin", "rwl")
    acl_set(server, "/locked", "admin", "rl")
    fs.pipe_file("/locked/open/new/file", b"x")
    assert (server["root"] / "locked/open/new/file").read_bytes() == b"x"
    fs.makedirs("/locked/open", exist_ok=True)
    with pytest.raises(PermissionError):
        fs.pipe_file("/locked/elsewhere/file", b"x")


def test_create_mode_refuses_an_existing_file(server):
    fs = fs_of(server)
    fs.pipe_file("/excl", b"first", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file("/excl", b"second", mode="create")
    with pytest.raises(FileExistsError):
        fs.open("/excl", "xb")
    assert fs.cat_file("/excl") == b"first"
    with fs.open("/excl-new", "xb") as f:
        f.write(b"made")
    assert fs.cat_file("/excl-new") == b"made"


def test_exclusive_creation_holds_against_a_writer_in_between(server):
    # "xb" checks at open, and the server checks again when the file is stored: a file
    # made by another writer meanwhile is kept, and this one's close fails.
    fs, other = fs_of(server), fs_of(server)
    f = fs.open("/excl-race", "xb")
    f.write(os.urandom(6 << 20))  # past a block: the upload streams to the server
    other.pipe_file("/excl-race", b"theirs")
    with pytest.raises(FileExistsError):
        f.close()
    assert fs.cat_file("/excl-race") == b"theirs"
    assert uploads_in(server["root"]) == []
    # And a small one, stored in one request at close.
    f = fs.open("/excl-small", "xb")
    f.write(b"mine")
    other.pipe_file("/excl-small", b"theirs too")
    with pytest.raises(FileExistsError):
        f.close()
    assert fs.cat_file("/excl-small") == b"theirs too"


def test_a_large_write_streams_and_shows_only_when_closed(server):
    fs = fs_of(server)
    fs.makedirs("/stream", exist_ok=True)
    directory = server["root"] / "stream"
    block = os.urandom(1 << 20)
    f = fs.open("/stream/big", "wb")
    for _ in range(6):
        f.write(block)
    # Blocks have gone to the server (into the hidden file of the upload); the name
    # shows nothing yet.
    deadline = time.time() + 10
    while max([p.stat().st_size for p in uploads_in(directory)], default=0) < 5 << 20:
        assert time.time() < deadline, "the written blocks did not reach the server"
        time.sleep(0.01)
    assert not fs.exists("/stream/big")
    f.close()
    assert (directory / "big").read_bytes() == block * 6
    assert uploads_in(directory) == []


def test_a_transaction_stores_at_its_end_and_a_failed_one_stores_nothing(server):
    fs = fs_of(server)
    fs.makedirs("/tx", exist_ok=True)
    directory = server["root"] / "tx"
    with fs.transaction:
        for name in ["small", "large"]:
            with fs.open(f"/tx/{name}", "wb") as f:
                f.write(b"x" * (10 if name == "small" else 3 << 20))
            assert not fs.exists(f"/tx/{name}")
    assert fs.info("/tx/small")["size"] == 10 and fs.info("/tx/large")["size"] == 3 << 20
    with pytest.raises(RuntimeError):
        with fs.transaction:
            for name in ["small2", "large2"]:
                with fs.open(f"/tx/{name}", "wb") as f:
                    f.write(b"y" * (10 if name == "small2" else 3 << 20))
            raise RuntimeError("given up")
    assert not fs.exists("/tx/small2") and not fs.exists("/tx/large2")
    # The abandoned upload's connection closed: the server removes what it received.
    deadline = time.time() + 5
    while uploads_in(directory) and time.time() < deadline:
        time.sleep(0.05)
    assert uploads_in(directory) == []


def test_append_writes_at_the_end_without_reading_the_file(server):
    fs = fs_of(server)
    fs.makedirs("/app", exist_ok=True)
    fs.pipe_file("/app/log", b"start\n")
    # Take the read right away (write and list stay): an append that read the file first
    # would be refused.
    acl_set(server, "/app", "admin", "wl")
    with pytest.raises(PermissionError):
        fs.cat_file("/app/log")
    with fs.open("/app/log", "ab") as f:
        assert f.tell() == 6
        f.write(b"one\n")
    # Two appenders: each write lands at the end as it is made, as O_APPEND writes do.
    a, b = fs.open("/app/log", "ab"), fs.open("/app/log", "ab")
    a.write(b"a" * (3 << 20))  # more than a block: written as it goes
    b.write(b"b\n")
    b.close()
    a.write(b"\n")
    a.close()
    assert (server["root"] / "app/log").read_bytes() == b"start\none\n" + b"a" * (3 << 20) + b"b\n\n"


# Linux carries a process's peak RSS across fork and exec (getrusage's ru_maxrss would
# count the pytest process that started it, pandas and dask loaded), so the writer is a
# child forked by a fresh interpreter before it loads anything: its peak is its own.
WRITE_2_GIB = """
import os, sys
pid = os.fork()
if pid:
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
import resource, time
import fsspec
fs = fsspec.filesystem("locus", host="127.0.0.1", port=int(sys.argv[1]))
block = bytes(range(256)) * 4096  # 1 MiB
start = time.time()
with fs.open("/two-gib.bin", "wb") as f:
    for _ in range(2048):
        f.write(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.time() - start, flush=True)
"""


def test_writing_2_gib_keeps_the_writer_small(server):
    out = subprocess.run([sys.executable, "-c", WRITE_2_GIB, str(server["port"])], capture_output=True, text=True,
                         env=dict(os.environ), timeout=120)
    assert out.returncode == 0, out.stderr
    max_rss_kib, seconds = out.stdout.split()
    path = server["root"] / "two-gib.bin"
    try:
        assert path.stat().st_size == 2 << 30
        with open(path, "rb") as f:
            f.seek((2 << 30) - (1 << 20))
            assert f.read() == bytes(range(256)) * 4096
        print(f"2 GiB through fsspec: max RSS {int(max_rss_kib) / 1024:.0f} MiB, {float(seconds):.1f} s")
        assert int(max_rss_kib) < 256 * 1024, f"max RSS {max_rss_kib} KiB"
    finally:
        path.unlink()


def test_dask_writes_and_reads_parquet(server):
    import dask.dataframe as dd

    df = pd.DataFrame({"id": range(20_000), "k": [f"k{i % 13}" for i in range(20_000)], "x": [i / 4 for i in range(20_000)]})
    url = server["url"] + "dask/trips"  # a directory that does not exist yet
    dd.from_pandas(df, npartitions=4).to_parquet(url)
    fs = fs_of(server)
    assert len([p for p in fs.ls("/dask/trips", detail=False) if p.endswith(".parquet")]) == 4
    back = dd.read_parquet(url).compute()
    pd.testing.assert_frame_equal(back.sort_values("id").reset_index(drop=True), df, check_dtype=False)
    assert dd.read_parquet(url, columns=["x"])["x"].sum().compute() == df["x"].sum()
    by_k = dd.read_parquet(url).groupby("k")["x"].count().compute()
    assert by_k.sum() == len(df)
