//! The Python package (`python/`): its wheel builds with maturin (through `pip install
//! ./python`, as a user installs it), and its tests (the client, errors, scripts,
//! storelets, and pandas and pyarrow reading and writing CSV and Parquet through
//! `locus://` URLs) pass against this build's `locus serve`. The virtual environment
//! lives under `target/python-venv` and is reused by later runs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    let status = cmd.status().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(status.success(), "{shown} failed: {status}");
}

#[test]
fn the_python_package_builds_and_its_tests_pass() {
    let repo: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let venv = repo.join("target/python-venv");
    if !venv.join("bin/pip").exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv));
    }
    let pip = venv.join("bin/pip");
    run(Command::new(&pip).args(["install", "-q", "--disable-pip-version-check"]).args([
        "maturin>=1.5,<2",
        "pytest",
        "pandas",
        "pyarrow",
        "fsspec",
    ]));
    // The cargo running this test holds target/'s build lock: maturin builds elsewhere.
    run(Command::new(&pip)
        .args(["install", "-q", "--disable-pip-version-check", "--force-reinstall", "--no-deps"])
        .arg(repo.join("python"))
        .env("CARGO_TARGET_DIR", repo.join("target/python-build")));
    // Run from the environment, not python/, so the installed package is what is tested.
    run(Command::new(venv.join("bin/pytest"))
        .args(["-q", "-p", "no:cacheprovider"])
        .arg(repo.join("python/tests"))
        .current_dir(&venv)
        .env("LOCUS_BIN", env!("CARGO_BIN_EXE_locus")));
}
