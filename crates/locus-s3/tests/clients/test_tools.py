"""The `aws` CLI, rclone, s3fs-fuse and pyarrow against `locus serve --s3-port`, run as
their users run them. A tool that is missing fails its test, naming what to install."""

import os
import shutil
import subprocess
import time

import pytest


def need(tool, package):
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed: apt-get install {package} (.ci/run does)")
    return path


def tree(tmp_path, name="src"):
    src = tmp_path / name
    for rel, size in [("a.txt", 10), ("sub/b.bin", 70_000), ("sub/deeper/c.csv", 3), ("empty.dat", 0),
                      ("big.bin", 9 << 20)]:
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))
    return src


def run(cmd, env=None, **kw):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def same_tree(a, b):
    r = subprocess.run(["diff", "-r", str(a), str(b)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_aws_cli_cp_sync_ls(server, tmp_path):
    aws = need("aws", "awscli (or pip install awscli)")
    key, secret = server["admin"]
    env = dict(os.environ, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret, AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    ep = ["--endpoint-url", server["endpoint"]]
    src = tree(tmp_path)
    run([aws, *ep, "s3", "mb", "s3://aws-cli"], env)
    run([aws, *ep, "s3", "cp", "--recursive", str(src), "s3://aws-cli/copied"], env)
    same_tree(src, server["root"] / "aws-cli" / "copied")
    listing = run([aws, *ep, "s3", "ls", "--recursive", "s3://aws-cli/"], env)
    assert "copied/sub/deeper/c.csv" in listing and "copied/big.bin" in listing
    assert run([aws, *ep, "s3", "ls", "s3://aws-cli/copied/"], env).split().count("PRE") == 1
    # sync: a changed file and a new one go up; with --delete, a removed one goes.
    (src / "a.txt").write_bytes(b"changed, and longer than before")
    (src / "new.txt").write_bytes(b"new")
    (src / "sub" / "b.bin").unlink()
    out = run([aws, *ep, "s3", "sync", "--delete", str(src), "s3://aws-cli/copied"], env)
    assert "new.txt" in out and "a.txt" in out
    same_tree(src, server["root"] / "aws-cli" / "copied")
    back = tmp_path / "back"
    run([aws, *ep, "s3", "sync", "s3://aws-cli/copied", str(back)], env)
    same_tree(src, back)
    # A copy between keys at the server: past 8 MiB the CLI copies in parts
    # (UploadPartCopy, a range of the source each).
    large = os.urandom(20 << 20)
    (server["root"] / "aws-cli" / "large.bin").write_bytes(large)
    run([aws, *ep, "s3", "cp", "s3://aws-cli/large.bin", "s3://aws-cli/again/large.bin"], env)
    assert (server["root"] / "aws-cli" / "again" / "large.bin").read_bytes() == large


def test_rclone_copy_check_sync_with_md5(server, tmp_path):
    rclone = need("rclone", "rclone")
    key, secret = server["admin"]
    # rclone's S3 library fails on a CA bundle it is pointed at for plain HTTP.
    base = {k: v for k, v in os.environ.items() if k not in ("AWS_CA_BUNDLE",)}
    env = dict(base, RCLONE_CONFIG=str(tmp_path / "rclone.conf"),
               RCLONE_CONFIG_LOCUS_TYPE="s3", RCLONE_CONFIG_LOCUS_PROVIDER="Other",
               RCLONE_CONFIG_LOCUS_ACCESS_KEY_ID=key, RCLONE_CONFIG_LOCUS_SECRET_ACCESS_KEY=secret,
               RCLONE_CONFIG_LOCUS_ENDPOINT=server["endpoint"], RCLONE_CONFIG_LOCUS_FORCE_PATH_STYLE="true")
    src = tree(tmp_path)
    run([rclone, "mkdir", "locus:rclone"], env)
    run([rclone, "copy", str(src), "locus:rclone/data"], env)
    same_tree(src, server["root"] / "rclone" / "data")
    # check compares MD5s (the ETags of what was written through S3) and sizes.
    out = subprocess.run([rclone, "check", str(src), "locus:rclone/data"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "0 differences found" in out.stderr and "hashes could not be checked" not in out.stderr, out.stderr
    # A file changed on the server behind the door is a difference.
    (server["root"] / "rclone" / "data" / "a.txt").write_bytes(b"changed behind the door")
    out = subprocess.run([rclone, "check", str(src), "locus:rclone/data"], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "a.txt" in out.stderr, out.stderr
    # (S3 keeps no empty directories: the local one goes too, for the comparison.)
    (src / "sub" / "deeper" / "c.csv").unlink()
    (src / "sub" / "deeper").rmdir()
    run([rclone, "sync", str(src), "locus:rclone/data"], env)
    same_tree(src, server["root"] / "rclone" / "data")
    run([rclone, "check", str(src), "locus:rclone/data"], env)


def test_s3fs_fuse_mounts_a_bucket(server, tmp_path):
    s3fs = need("s3fs", "s3fs")
    key, secret = server["admin"]
    passwd = tmp_path / "passwd"
    passwd.write_text(f"{key}:{secret}\n")
    passwd.chmod(0o600)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mkdir", "-p", str(server["root"] / "s3fs")], check=True)
    proc = subprocess.Popen([s3fs, "s3fs", str(mnt), "-f", "-o", f"passwd_file={passwd}", "-o",
                             f"url={server['endpoint']}", "-o", "use_path_request_style", "-o", "sigv4",
                             "-o", "endpoint=us-east-1", "-o", "stat_cache_expire=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 20
        while not os.path.ismount(mnt):
            assert proc.poll() is None, "s3fs exited: " + proc.stdout.read()
            assert time.time() < deadline, "s3fs did not mount"
            time.sleep(0.1)
        src = tree(tmp_path)
        run(["cp", "-r", str(src), str(mnt / "copied")])
        listing = run(["ls", "-lR", str(mnt)])
        assert "deeper" in listing and "c.csv" in listing
        same_tree(src, mnt / "copied")
        same_tree(src, server["root"] / "s3fs" / "copied")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        proc.terminate()
        proc.wait(timeout=10)


def test_pyarrow_s3filesystem_reads_and_writes_parquet(server, s3):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    key, secret = server["admin"]
    host = server["endpoint"].removeprefix("http://")
    s3fs_ = fs.S3FileSystem(access_key=key, secret_key=secret, endpoint_override=host, scheme="http",
                            region="us-east-1")
    s3.create_bucket(Bucket="arrow")
    table = pa.table({"n": list(range(100_000)), "s": [f"row {i}" for i in range(100_000)]})
    pq.write_table(table, "arrow/dir/t.parquet", filesystem=s3fs_)
    assert (server["root"] / "arrow" / "dir" / "t.parquet").stat().st_size > 0
    back = pq.read_table("arrow/dir/t.parquet", filesystem=s3fs_)
    assert back.equals(table)
    assert pq.read_table("arrow/dir/t.parquet", filesystem=s3fs_, columns=["n"]).column("n").to_pylist()[-1] == 99_999
    infos = s3fs_.get_file_info(fs.FileSelector("arrow", recursive=True))
    assert "arrow/dir/t.parquet" in [i.path for i in infos]
