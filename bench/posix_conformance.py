#!/usr/bin/env python3
"""POSIX conformance checks for a directory: open flags and create modes, truncation,
renames over files and directories, link counts, unlink of open files, timestamps,
permissions and ownership, long names, fifos, symbolic links and xattrs.

Run: python3 bench/posix_conformance.py DIR [--json]
Each check runs in a fresh subdirectory of DIR and prints `NAME PASS` or `NAME FAIL
detail`. The same checks run against a local directory, `locus mount` in each consistency
mode, `locus run` and sshfs (bench/posix_conformance.sh), so every difference from the
local directory shows; crates/locus-cli/tests/conformance.rs holds Locus to the local
answers except where DIFFERENCES (below) says why not.
"""
import errno
import fcntl
import json
import os
import stat
import sys
import time

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect_errno(fn, *codes):
    try:
        fn()
    except OSError as e:
        if e.errno in codes:
            return
        raise AssertionError(f"errno {errno.errorcode.get(e.errno, e.errno)}, expected {[errno.errorcode[c] for c in codes]}")
    raise AssertionError(f"succeeded, expected {[errno.errorcode[c] for c in codes]}")


def write(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=0o644):
    fd = os.open(path, flags, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path):
    with open(path, "rb") as f:
        return f.read()


@check
def create_exclusive(d):
    p = os.path.join(d, "f")
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    expect_errno(lambda: os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), errno.EEXIST)


@check
def create_read_only(d):
    # What flock(1) and lock-file makers do.
    p = os.path.join(d, "lock")
    os.close(os.open(p, os.O_CREAT | os.O_RDONLY, 0o600))
    assert os.path.isfile(p), "not created"
    q = os.path.join(d, "lock2")
    os.close(os.open(q, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o600))
    assert os.path.isfile(q), "not created with O_EXCL"


@check
def create_mode(d):
    p = os.path.join(d, "f")
    old = os.umask(0)
    try:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o640))
    finally:
        os.umask(old)
    got = stat.S_IMODE(os.stat(p).st_mode)
    assert got == 0o640, oct(got)


@check
def open_truncate(d):
    p = os.path.join(d, "f")
    write(p, b"hello")
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
    assert os.stat(p).st_size == 0, os.stat(p).st_size


@check
def open_append(d):
    p = os.path.join(d, "f")
    write(p, b"one")
    write(p, b"two", os.O_WRONLY | os.O_APPEND)
    assert read(p) == b"onetwo", read(p)


@check
def open_directory_on_file(d):
    p = os.path.join(d, "f")
    write(p, b"x")
    expect_errno(lambda: os.open(p, os.O_RDONLY | os.O_DIRECTORY), errno.ENOTDIR)


@check
def read_after_write_same_descriptor(d):
    p = os.path.join(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"abcdef")
        os.lseek(fd, 2, os.SEEK_SET)
        assert os.read(fd, 3) == b"cde"
    finally:
        os.close(fd)


@check
def pwrite_past_end_leaves_a_hole(d):
    p = os.path.join(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"z", 8191)
    finally:
        os.close(fd)
    data = read(p)
    assert len(data) == 8192 and data[:8191] == bytes(8191) and data[-1:] == b"z", len(data)


@check
def ftruncate_grows_and_shrinks(d):
    p = os.path.join(d, "f")
    write(p, b"abcdef")
    fd = os.open(p, os.O_RDWR)
    try:
        os.ftruncate(fd, 10)
        os.ftruncate(fd, 3)
    finally:
        os.close(fd)
    assert read(p) == b"abc", read(p)
    os.truncate(p, 5)
    assert read(p) == b"abc\0\0", read(p)


@check
def rename_over_file(d):
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    write(a, b"new")
    write(b, b"old")
    os.rename(a, b)
    assert not os.path.exists(a) and read(b) == b"new"


@check
def rename_directory_over_empty_directory(d):
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    os.mkdir(a)
    write(os.path.join(a, "inside"), b"x")
    os.mkdir(b)
    os.rename(a, b)
    assert read(os.path.join(b, "inside")) == b"x"


@check
def rename_directory_over_full_directory_fails(d):
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    os.mkdir(a)
    os.mkdir(b)
    write(os.path.join(b, "keep"), b"x")
    expect_errno(lambda: os.rename(a, b), errno.ENOTEMPTY, errno.EEXIST)
    assert read(os.path.join(b, "keep")) == b"x"


@check
def rename_file_over_directory_fails(d):
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    write(a, b"x")
    os.mkdir(b)
    expect_errno(lambda: os.rename(a, b), errno.EISDIR)
    expect_errno(lambda: os.rename(b, a), errno.ENOTDIR)


@check
def hard_link_counts(d):
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    write(a, b"x")
    os.link(a, b)
    assert os.stat(a).st_nlink == 2, os.stat(a).st_nlink
    os.unlink(a)
    assert os.stat(b).st_nlink == 1, os.stat(b).st_nlink


@check
def directory_link_counts(d):
    os.mkdir(os.path.join(d, "s1"))
    os.mkdir(os.path.join(d, "s2"))
    assert os.stat(d).st_nlink == 4, os.stat(d).st_nlink


@check
def unlink_open_file_keeps_it_readable(d):
    p = os.path.join(d, "f")
    write(p, b"still here")
    fd = os.open(p, os.O_RDONLY)
    try:
        os.unlink(p)
        assert not os.path.exists(p)
        assert os.pread(fd, 100, 0) == b"still here"
    finally:
        os.close(fd)


@check
def unlink_open_file_keeps_it_writable(d):
    p = os.path.join(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.unlink(p)
        os.write(fd, b"scratch")
        assert os.pread(fd, 100, 0) == b"scratch"
    finally:
        os.close(fd)


@check
def set_times(d):
    p = os.path.join(d, "f")
    write(p, b"x")
    os.utime(p, (1_000_000_000, 1_100_000_000))
    st = os.stat(p)
    assert int(st.st_mtime) == 1_100_000_000, st.st_mtime
    assert int(st.st_atime) == 1_000_000_000, st.st_atime


@check
def write_moves_mtime(d):
    p = os.path.join(d, "f")
    write(p, b"x")
    os.utime(p, (1_000_000_000, 1_000_000_000))
    write(p, b"y", os.O_WRONLY)
    assert os.stat(p).st_mtime > time.time() - 3600, os.stat(p).st_mtime


@check
def chmod_shows(d):
    p = os.path.join(d, "f")
    write(p, b"x")
    os.chmod(p, 0o600)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    os.chmod(p, 0o755)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o755


@check
def owner_is_the_caller(d):
    p = os.path.join(d, "f")
    write(p, b"x")
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()), (st.st_uid, st.st_gid)


@check
def long_names(d):
    ok = os.path.join(d, "n" * 255)
    write(ok, b"x")
    assert read(ok) == b"x"
    expect_errno(lambda: write(os.path.join(d, "n" * 256), b"x"), errno.ENAMETOOLONG)


@check
def mkdir_rmdir_errors(d):
    p = os.path.join(d, "s")
    os.mkdir(p)
    expect_errno(lambda: os.mkdir(p), errno.EEXIST)
    write(os.path.join(p, "f"), b"x")
    expect_errno(lambda: os.rmdir(p), errno.ENOTEMPTY)
    expect_errno(lambda: os.rmdir(os.path.join(p, "f")), errno.ENOTDIR)


@check
def readdir_sees_changes(d):
    write(os.path.join(d, "a"), b"x")
    os.rename(os.path.join(d, "a"), os.path.join(d, "b"))
    os.mkdir(os.path.join(d, "c"))
    assert sorted(os.listdir(d)) == ["b", "c"], os.listdir(d)


@check
def symbolic_links(d):
    write(os.path.join(d, "target"), b"x")
    os.symlink("target", os.path.join(d, "link"))
    assert os.readlink(os.path.join(d, "link")) == "target"
    assert read(os.path.join(d, "link")) == b"x"
    assert stat.S_ISLNK(os.lstat(os.path.join(d, "link")).st_mode)


@check
def fifos(d):
    p = os.path.join(d, "fifo")
    os.mkfifo(p, 0o600)
    assert stat.S_ISFIFO(os.stat(p).st_mode)


@check
def xattrs(d):
    p = os.path.join(d, "f")
    write(p, b"x")
    os.setxattr(p, "user.locus", b"value")
    assert os.getxattr(p, "user.locus") == b"value"
    assert "user.locus" in os.listxattr(p)


@check
def fsync_and_fdatasync(d):
    fd = os.open(os.path.join(d, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x")
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)


@check
def flock_works(d):
    fd = os.open(os.path.join(d, "lock"), os.O_CREAT | os.O_RDONLY, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@check
def statvfs_answers(d):
    s = os.statvfs(d)
    assert s.f_bsize > 0 and s.f_blocks > 0, s


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    root = sys.argv[1]
    results = {}
    for fn in CHECKS:
        d = os.path.join(root, f"conformance-{fn.__name__}-{os.getpid()}")
        try:
            os.mkdir(d)
            fn(d)
            results[fn.__name__] = "PASS"
        except AssertionError as e:
            results[fn.__name__] = f"FAIL {e}"
        except OSError as e:
            results[fn.__name__] = f"FAIL {errno.errorcode.get(e.errno, e.errno)}: {e.strerror}"
    if "--json" in sys.argv:
        print(json.dumps(results))
    else:
        for name, r in results.items():
            print(f"{name} {r}")


if __name__ == "__main__":
    main()
