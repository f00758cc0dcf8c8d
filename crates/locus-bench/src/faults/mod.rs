//! `locus bench faults`: fault injection with an independent checker.
//!
//! Each scenario starts real `locus` processes, runs a workload, injects one fault
//! (`kill -9` of a server, a head, a data node, PostgreSQL or a mount; a full file system;
//! a cut link), recovers, and then checks the result against a ledger the workload wrote
//! as it went: for every attempted change a line `try PATH VERSION SIZE HASH SEED`
//! (`- -` for a removal), and a line `ack PATH VERSION` once the system acknowledged it
//! (a put or rename answered, a `close` or `fsync` that returned 0). The checker reads
//! only that file and the system as a new client sees it after recovery:
//!
//! - **lost**: a path whose last acknowledged version is gone (absent, an older version,
//!   or unreadable);
//! - **corrupted**: contents that match no version the workload tried to write there
//!   (also a read during the run that answered wrong bytes);
//! - **half-written**: contents that are a strict prefix of a version tried there, or a
//!   name in the workload's directory that the workload never wrote;
//! - **errors**: operations that failed with an error (allowed: a fault may make an
//!   operation fail, but only with an error).
//!
//! Under a path, an unacknowledged attempt may or may not have happened: any version at
//! or after the last acknowledged one is accepted. On `locus mount --consistency afs`,
//! whose intended behaviour is to keep each unsaved copy in its cache directory until
//! the server has it (journalled, stored by the next mount, stored before SIGTERM ends
//! it, kept when a store fails), a file whose every `write` returned counts as
//! acknowledged too (`keep` lines): that is the promise the mount scenarios check.

mod cluster;
mod ledger;
mod mount;
mod server;
mod workload;
mod world;

use crate::faults::cluster::{head_kill_postgres, head_kill_sqlite, node_kill, postgres_restart, Postgres};
use crate::faults::mount::{mount_kill, mount_kill_rm, mount_link_cut};
use crate::faults::server::{disk_full, server_kill};
use crate::faults::workload::Work;
use crate::faults::world::setup;
use crate::BenchError;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// Options of `locus bench faults`.
#[derive(clap::Args, Debug, Clone)]
pub struct FaultsArgs {
    /// Runs of each scenario, each with its own seed (varied timing and sizes).
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Scenarios to run (repeatable; default: all): server-kill-puts,
    /// server-kill-renames, disk-full, node-kill, head-kill-sqlite, head-kill-postgres,
    /// postgres-restart, mount-kill, mount-sigterm, mount-kill-rm, mount-link-cut.
    #[arg(long = "scenario", value_name = "NAME")]
    pub scenarios: Vec<String>,
    /// The first run's seed; run i uses SEED + i.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Print each run's outcome as it ends (to stderr).
    #[arg(long)]
    pub verbose: bool,
}

/// The scenarios, in the order they run, with what each does.
pub const SCENARIOS: &[(&str, &str)] = &[
    ("server-kill-puts", "kill -9 of `locus serve` while 4 clients put files of 0-2 MiB; restart over the same root"),
    ("server-kill-renames", "kill -9 of `locus serve` while 4 clients put and rename files over others; restart"),
    ("disk-full", "the export on a 16 MiB tmpfs fills during puts (ENOSPC); space freed; service resumes"),
    ("node-kill", "kill -9 of one of 3 data nodes (replication 2) during puts and reads through the head"),
    ("head-kill-sqlite", "kill -9 of a head (SQLite namespace) during puts; restart over the same state"),
    ("head-kill-postgres", "two heads on one PostgreSQL: kill -9 of one during puts; clients go on through the other"),
    ("postgres-restart", "PostgreSQL stopped (immediate) and started again under a head's puts"),
    ("mount-kill", "kill -9 of an afs mount with files written and still open; a new mount over the same cache dir"),
    ("mount-sigterm", "SIGTERM of an afs mount with files written and still open"),
    (
        "mount-kill-rm",
        "kill -9 of an afs mount right after `rm -r` of a tree it answered; a new mount over the same cache dir",
    ),
    ("mount-link-cut", "the link to the server down for 12 s (the heartbeat's 6 s, the mount's 2 s retry window, 4 s more) during afs write-back"),
];

/// The subject data nodes log in as.
const NODE: &str = locus_proto::capability::NODE_SUBJECT;

const TOKEN: &str = "faults-bench-token";

/// One run's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunOutcome {
    /// Acknowledged writes whose final state was checked.
    pub checked: u64,
    pub lost: u64,
    pub corrupted: u64,
    pub half_written: u64,
    /// Operations that failed with an error.
    pub errors: u64,
    /// Seconds from the fault until service was back (a new write acknowledged).
    pub recovery_s: f64,
    /// Partial uploads left on the servers' disks (hidden temporary files that nothing
    /// removes): not a violation, space a crash leaks.
    pub stale_temp_files: u64,
    /// What went wrong, in words (violations and failures to recover).
    pub notes: Vec<String>,
}

impl RunOutcome {
    /// True when nothing acknowledged was lost, corrupted or half-written, and the run
    /// recovered.
    pub fn clean(&self) -> bool {
        self.lost == 0 && self.corrupted == 0 && self.half_written == 0 && self.notes.is_empty()
    }
}

/// A scenario's results over its runs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub runs: usize,
    /// Runs that could not be set up or did not recover (see `notes`).
    pub failed_runs: usize,
    pub checked: u64,
    pub lost: u64,
    pub corrupted: u64,
    pub half_written: u64,
    pub errors: u64,
    pub max_recovery_s: f64,
    pub stale_temp_files: u64,
    /// The first few notes, each with its run's seed.
    pub notes: Vec<String>,
}

// ---------------------------------------------------------------------------------
// Running

/// Runs scenario `name` once with `seed`, using `exe` as the `locus` program (and `pg`
/// for the scenarios on PostgreSQL).
pub fn run_one(exe: &Path, name: &str, seed: u64, pg: &mut Postgres) -> Result<RunOutcome, BenchError> {
    match name {
        "server-kill-puts" => server_kill(exe, seed, Work::Puts),
        "server-kill-renames" => server_kill(exe, seed, Work::Renames),
        "disk-full" => disk_full(exe, seed),
        "node-kill" => node_kill(exe, seed),
        "head-kill-sqlite" => head_kill_sqlite(exe, seed),
        "head-kill-postgres" => head_kill_postgres(exe, seed, pg),
        "postgres-restart" => postgres_restart(exe, seed, pg),
        "mount-kill" => mount_kill(exe, seed, false),
        "mount-sigterm" => mount_kill(exe, seed, true),
        "mount-kill-rm" => mount_kill_rm(exe, seed),
        "mount-link-cut" => mount_link_cut(exe, seed),
        other => Err(setup(format!(
            "no scenario {other}; there are: {}",
            SCENARIOS.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Runs scenario `name` `runs` times (seeds `seed`, `seed + 1`, ...) and sums them up.
pub fn run_scenario(exe: &Path, name: &str, runs: usize, seed: u64, verbose: bool) -> ScenarioResult {
    let mut r = ScenarioResult { scenario: name.to_string(), runs, ..Default::default() };
    let mut pg = Postgres::new();
    for i in 0..runs {
        let s = seed + i as u64;
        let started = Instant::now();
        match run_one(exe, name, s, &mut pg) {
            Ok(o) => {
                if verbose {
                    eprintln!("{name} seed {s}: {o:?} ({:.1} s)", started.elapsed().as_secs_f64());
                }
                r.checked += o.checked;
                r.lost += o.lost;
                r.corrupted += o.corrupted;
                r.half_written += o.half_written;
                r.errors += o.errors;
                r.max_recovery_s = r.max_recovery_s.max(o.recovery_s);
                r.stale_temp_files += o.stale_temp_files;
                if o.notes.iter().any(|n| n.contains("did not recover") || n.contains("still")) {
                    r.failed_runs += 1;
                }
                for n in o.notes {
                    if r.notes.len() < 6 {
                        r.notes.push(format!("seed {s}: {n}"));
                    }
                }
            }
            Err(e) => {
                if verbose {
                    eprintln!("{name} seed {s}: failed: {e}");
                }
                r.failed_runs += 1;
                if r.notes.len() < 6 {
                    r.notes.push(format!("seed {s}: {e}"));
                }
            }
        }
    }
    r
}

/// Runs the benchmark and prints the table (or JSON).
pub fn run(args: FaultsArgs) -> Result<(), BenchError> {
    if !rustix::process::geteuid().is_root() {
        return Err(setup("locus bench faults mounts file systems and makes network namespaces: run it as root"));
    }
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let names: Vec<String> = if args.scenarios.is_empty() {
        SCENARIOS.iter().map(|s| s.0.to_string()).collect()
    } else {
        args.scenarios.clone()
    };
    for n in &names {
        if !SCENARIOS.iter().any(|s| s.0 == n) {
            return Err(setup(format!(
                "no scenario {n}; there are: {}",
                SCENARIOS.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let mut results = Vec::new();
    for n in &names {
        let r = run_scenario(&exe, n, args.runs, args.seed, args.verbose);
        if !args.json {
            if results.is_empty() {
                println!("| scenario | runs | acknowledged writes checked | lost | corrupted | half-written | errors reported | max recovery s | failed runs | stale temp files |");
                println!("|---|---|---|---|---|---|---|---|---|---|");
            }
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
                r.scenario,
                r.runs,
                r.checked,
                r.lost,
                r.corrupted,
                r.half_written,
                r.errors,
                r.max_recovery_s,
                r.failed_runs,
                r.stale_temp_files
            );
        }
        results.push(r);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results).map_err(setup)?);
    } else {
        let notes: Vec<String> =
            results.iter().flat_map(|r| r.notes.iter().map(move |n| format!("- {}: {n}", r.scenario))).collect();
        if !notes.is_empty() {
            println!("\nNotes:");
            for n in notes {
                println!("{n}");
            }
        }
    }
    Ok(())
}
