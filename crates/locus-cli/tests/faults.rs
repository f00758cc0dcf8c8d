//! The short form of `locus bench faults`: each scenario that does not involve a mount,
//! twice with varied timing, and nothing acknowledged may be lost, corrupted or
//! half-written (see `locus_bench::faults` for the ledger and the checker).
//!
//! The mount scenarios `mount-kill`, `mount-sigterm` and `mount-kill-rm` run here too;
//! `mount-link-cut` (a network namespace) stays in `locus bench faults` only: it found
//! stored files holding bytes no write made after the link came back (BENCHMARKS.md
//! "Faults"), which is not fixed yet.

use std::path::Path;

fn run(scenario: &str) {
    let exe = Path::new(env!("CARGO_BIN_EXE_locus"));
    let r = locus_bench::faults::run_scenario(exe, scenario, 2, 1, true);
    assert_eq!(r.failed_runs, 0, "{scenario}: {:?}", r.notes);
    assert!(r.checked > 0, "{scenario}: nothing acknowledged was checked");
    assert_eq!((r.lost, r.corrupted, r.half_written), (0, 0, 0), "{scenario}: {:?}", r.notes);
}

#[test]
fn server_killed_during_puts_loses_nothing_acknowledged() {
    run("server-kill-puts");
}

#[test]
fn server_killed_during_renames_loses_nothing_acknowledged() {
    run("server-kill-renames");
}

#[test]
fn a_full_export_fails_puts_with_enospc_and_loses_nothing() {
    if locus_testkit::require("root", rustix::process::geteuid().is_root(), "run as root: it mounts a tmpfs") {
        run("disk-full");
    }
}

#[test]
fn a_data_node_killed_with_replication_two_loses_nothing() {
    run("node-kill");
}

#[test]
fn a_sqlite_head_killed_and_restarted_loses_nothing() {
    run("head-kill-sqlite");
}

#[test]
fn a_postgres_head_killed_leaves_the_other_serving_everything() {
    if locus_testkit::require_postgres() {
        run("head-kill-postgres");
    }
}

#[test]
fn postgres_restarted_under_load_loses_nothing() {
    if locus_testkit::require_postgres() {
        run("postgres-restart");
    }
}

#[test]
fn an_afs_mount_killed_with_unsaved_writes_loses_none_of_them() {
    if locus_testkit::require_fuse() {
        run("mount-kill");
    }
}

#[test]
fn an_afs_mount_stopped_by_sigterm_stores_its_unsaved_writes() {
    if locus_testkit::require_fuse() {
        run("mount-sigterm");
    }
}

#[test]
fn an_afs_mount_killed_right_after_rm_r_leaves_nothing_it_removed() {
    if locus_testkit::require_fuse() {
        run("mount-kill-rm");
    }
}
