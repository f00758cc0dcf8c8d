//! The S3 door (`locus serve --s3-port`) driven by real S3 clients: boto3 (every
//! operation, presigned URLs, multipart, conditions, refusals, an active file), the `aws`
//! CLI, rclone, `s3fs-fuse` and pyarrow's `S3FileSystem` (`crates/locus-s3/tests/clients`).
//! The Python clients come from PyPI into `target/s3-venv`; rclone and s3fs are Debian's
//! (`.ci/run` installs them), and a missing one fails its test with the package to install.

mod common;

use common::{python_venv, repo, run_ok};
use std::process::Command;

#[test]
fn s3_clients_work_against_the_s3_door() {
    let venv = python_venv("s3-venv", &["pytest", "boto3", "awscli", "pyarrow"]);
    run_ok(
        Command::new(venv.join("bin/pytest"))
            .args(["-q", "-p", "no:cacheprovider"])
            .arg(repo().join("crates/locus-s3/tests/clients"))
            .current_dir(&venv)
            .env("PATH", format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default()))
            .env("LOCUS_BIN", env!("CARGO_BIN_EXE_locus")),
    );
}
