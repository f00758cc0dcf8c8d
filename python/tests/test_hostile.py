"""Path tricks through the Python package (part of the hostile-input corpus, beside
crates/locus-client/tests/hostile.rs): nothing outside the export is read or made, and
every refusal is an OSError or ValueError, never a crash."""

import os

import pytest

import locus

CANARY = b"canary: outside the export"

TRICKS = [
    "/../canary", "../canary", "/d/../../canary", "/./../canary", "//../canary",
    "/out", "/abs", "/etc/passwd", "/d%2F..%2F..%2Fcanary", "/%2e%2e/canary",
    "/d/a.txt\0/../../canary", "/" + "x" * 300, "/" + "../" * 200 + "canary", "/d/" * 3000,
]


def test_path_tricks_stay_inside_the_export(server):
    root = server["root"]
    (root.parent / "canary").write_bytes(CANARY)
    (root / "d").mkdir(exist_ok=True)
    (root / "d" / "a.txt").write_bytes(b"alpha\n")
    for name, target in [("out", "../canary"), ("abs", str(root.parent / "canary"))]:
        if not (root / name).is_symlink():
            os.symlink(target, root / name)
    before = sorted(os.listdir(root.parent))
    c = locus.Client(server["url"])
    for path in TRICKS:
        for op in (c.read, c.stat, c.listdir):
            try:
                got = op(path)
            except (OSError, ValueError):
                continue
            assert CANARY not in repr(got).encode(), f"{op.__name__}({path!r}) read the canary"
            assert op is not c.stat or "canary" not in path, f"stat({path!r}) answered {got}"
        for op in (lambda p: c.write(p + "-new", b"planted"), lambda p: c.mkdir(p + "-dir")):
            try:
                op(path)
            except (OSError, ValueError):
                pass
    assert sorted(os.listdir(root.parent)) == before, "something was made beside the export"
    assert (root.parent / "canary").read_bytes() == CANARY
