//! The Python package (`python/`): its wheel builds with maturin (through `pip install
//! ./python`, as a user installs it), and its tests (the client, errors, scripts,
//! storelets, pandas, pyarrow and dask reading and writing CSV and Parquet through
//! `locus://` URLs, fsspec's own abstract test suite, writes streamed in little memory)
//! pass against this build's `locus serve`. The virtual environment lives under
//! `target/python-venv` and is reused by later runs; what the tests need comes from PyPI.

mod common;

use common::{python_venv, repo, run_ok};
use std::process::Command;

#[test]
fn the_python_package_builds_and_its_tests_pass() {
    let repo = repo();
    let venv =
        python_venv("python-venv", &["maturin>=1.5,<2", "pytest", "pandas", "pyarrow", "fsspec", "dask[dataframe]"]);
    let pip = venv.join("bin/pip");
    // The cargo running this test holds target/'s build lock: maturin builds elsewhere.
    run_ok(
        Command::new(&pip)
            .args(["install", "-q", "--disable-pip-version-check", "--force-reinstall", "--no-deps"])
            .arg(repo.join("python"))
            .env("CARGO_TARGET_DIR", repo.join("target/python-build")),
    );
    // Run from the environment, not python/, so the installed package is what is tested.
    run_ok(
        Command::new(venv.join("bin/pytest"))
            .args(["-q", "-p", "no:cacheprovider"])
            .arg(repo.join("python/tests"))
            .current_dir(&venv)
            .env("LOCUS_BIN", env!("CARGO_BIN_EXE_locus")),
    );
}
