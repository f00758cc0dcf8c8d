//! The web console in a real headless browser: Playwright for Python drives Debian's
//! `chromium` (`tests/console/test_console.py`) against this build's `locus serve
//! --http-port`. The screenshots in `docs/console/` are the ones this test takes. The
//! virtual environment lives under `target/console-venv` and is reused by later runs.

mod common;

use common::{python_venv, repo, run_ok};
use std::process::Command;

#[test]
fn the_console_works_in_a_real_browser() {
    assert!(
        Command::new("sh").args(["-c", "command -v chromium"]).status().is_ok_and(|s| s.success()),
        "this test needs Debian's chromium package (apt-get install chromium; .ci/run installs it)"
    );
    let venv = python_venv("console-venv", &["playwright==1.65.2", "pytest"]);
    let repo = repo();
    let shots = repo.join("docs/console");
    std::fs::create_dir_all(&shots).unwrap();
    run_ok(
        Command::new(venv.join("bin/pytest"))
            .args(["-q", "-p", "no:cacheprovider"])
            .arg(repo.join("crates/locus-cli/tests/console/test_console.py"))
            .current_dir(&venv)
            .env("LOCUS_BIN", env!("CARGO_BIN_EXE_locus"))
            .env("SCREENSHOTS", &shots),
    );
}
