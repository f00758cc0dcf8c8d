//! The web console in a real headless browser: Playwright for Python drives Debian's
//! `chromium` (`tests/console/test_console.py`) against this build's `locus serve
//! --http-port`. The screenshots in `docs/console/` are the ones this test takes. The
//! virtual environment lives under `target/console-venv` and is reused by later runs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    let status = cmd.status().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(status.success(), "{shown} failed: {status}");
}

#[test]
fn the_console_works_in_a_real_browser() {
    assert!(
        Command::new("sh").args(["-c", "command -v chromium"]).status().is_ok_and(|s| s.success()),
        "this test needs Debian's chromium package (apt-get install chromium; .ci/run installs it)"
    );
    let repo: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let venv = repo.join("target/console-venv");
    if !venv.join("bin/pip").exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv));
    }
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check"])
        .args(["playwright==1.65.2", "pytest"]));
    let shots = repo.join("docs/console");
    std::fs::create_dir_all(&shots).unwrap();
    run(Command::new(venv.join("bin/pytest"))
        .args(["-q", "-p", "no:cacheprovider"])
        .arg(repo.join("crates/locus-cli/tests/console/test_console.py"))
        .current_dir(&venv)
        .env("LOCUS_BIN", env!("CARGO_BIN_EXE_locus"))
        .env("SCREENSHOTS", &shots));
}
