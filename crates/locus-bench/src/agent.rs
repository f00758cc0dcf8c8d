//! `locus bench agent`: what `locus run` costs a program, as the Parrot paper's Figure 4
//! measures it: getpid, stat, open+close, read and write of 1 B and 8 KB, and sequential
//! read bandwidth, run by a separate process (`locus bench syscalls`) in four settings:
//!
//! 1. a local file, unmodified;
//! 2. the same local file under `locus run` (what interposition costs local work), on its
//!    FUSE path and traced, the traced one also with the agent and the program on one
//!    CPU (`taskset -c 0`): on a virtual machine a stop that wakes the tracer on the other
//!    CPU costs tens of microseconds more;
//! 3. a remote file on a Locus server under `locus run` (`/locus/HOST:PORT/...`), both ways;
//! 4. the same server through `locus mount`.
//!
//! Parrot's own figures (parrot_run of CCTools 7.17 on this kind of machine, from the
//! issue that asked for this benchmark) are printed beside them for reference.

use crate::mount::rows;
use crate::stats::Summary;
use crate::BenchError;
use locus_testkit::peers;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Options of `locus bench agent`.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// Timed calls per row.
    #[arg(long, default_value_t = 5000)]
    pub iterations: usize,
    /// Size of the file read sequentially, in MiB.
    #[arg(long, default_value_t = 64)]
    pub size_mb: u64,
    /// Runs of each setting (the median per row is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
}

/// Options of `locus bench syscalls`, the measuring process.
#[derive(clap::Args, Debug, Clone)]
pub struct SyscallArgs {
    /// Directory holding the files measured.
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 5000)]
    pub iterations: usize,
    #[arg(long, default_value_t = 64)]
    pub size_mb: u64,
}

/// What one measuring process reports.
#[derive(Serialize, Deserialize)]
struct Measured {
    rows: Vec<(String, Summary)>,
    mbps: f64,
}

/// `locus bench syscalls`: measures the rows in `--dir` and prints them as JSON.
pub fn syscalls(args: SyscallArgs) -> Result<(), BenchError> {
    let (rows, mbps) = rows(&args.dir, args.iterations, args.size_mb).map_err(BenchError::Setup)?;
    let m = Measured { rows: rows.into_iter().map(|(n, s)| (n.to_string(), s)).collect(), mbps };
    println!("{}", serde_json::to_string(&m).expect("json"));
    Ok(())
}

/// Parrot's Figure 4 figures on this kind of machine: (row, parrot µs, unmodified µs).
const PARROT: [(&str, f64, f64); 4] =
    [("getpid", 122.0, 0.16), ("stat", 145.0, 1.1), ("open+close", 245.0, 2.6), ("read 8KB", 139.0, 0.7)];

fn measure(prefix: &[String], exe: &Path, dir: &Path, args: &AgentArgs, token: &str) -> Result<Measured, BenchError> {
    let mut runs = Vec::new();
    for _ in 0..args.repeat {
        let mut cmd = Command::new(prefix.first().map(PathBuf::from).unwrap_or_else(|| exe.to_path_buf()));
        cmd.args(prefix.iter().skip(1));
        if !prefix.is_empty() {
            cmd.arg(exe);
        }
        let out = cmd
            .args(["bench", "syscalls", "--dir"])
            .arg(dir)
            .args(["--iterations", &args.iterations.to_string(), "--size-mb", &args.size_mb.to_string()])
            .env("LOCUS_TOKEN", format!("admin:{token}"))
            .env_remove("RUST_BACKTRACE")
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| BenchError::io("bench syscalls", e))?;
        if !out.status.success() {
            return Err(BenchError::Setup(format!("bench syscalls in {} failed: {:?}", dir.display(), out.status)));
        }
        runs.push(
            serde_json::from_slice::<Measured>(&out.stdout)
                .map_err(|e| BenchError::Setup(format!("bench syscalls said: {e}")))?,
        );
    }
    let rows = runs[0]
        .rows
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.clone(), Summary::median(&runs.iter().map(|r| r.rows[i].1).collect::<Vec<_>>())))
        .collect();
    Ok(Measured { rows, mbps: crate::stats::median(runs.iter().map(|r| r.mbps).collect()) })
}

/// Runs the benchmark and prints the report.
pub fn run(args: AgentArgs) -> Result<(), BenchError> {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let work = tempfile::Builder::new()
        .prefix("locus-bench-agent-")
        .tempdir_in(base)
        .map_err(|e| BenchError::io("temp", e))?;
    let (export, local) = (work.path().join("export"), work.path().join("local"));
    std::fs::create_dir_all(export.join("rows")).map_err(|e| BenchError::io("mkdir", e))?;
    std::fs::create_dir_all(&local).map_err(|e| BenchError::io("mkdir", e))?;
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let (locus, token) = peers::start_locus(&exe, work.path(), &export)?;
    let agent =
        |how: &str| vec![exe.display().to_string(), "run".into(), "--interpose".into(), how.into(), "--".into()];
    let (fuse, traced) = (agent("fuse"), agent("trace"));
    let remote = PathBuf::from(format!("/locus/{}/rows", locus.addr));
    let settings: Vec<(&str, Measured)> = vec![
        ("local, unmodified", measure(&[], &exe, &local, &args, &token)?),
        ("local, locus run (FUSE path)", measure(&fuse, &exe, &local, &args, &token)?),
        ("local, locus run (traced)", measure(&traced, &exe, &local, &args, &token)?),
        ("local, locus run (traced) on one CPU", {
            let mut pinned = vec!["taskset".to_string(), "-c".into(), "0".into()];
            pinned.extend(traced.iter().cloned());
            measure(&pinned, &exe, &local, &args, &token)?
        }),
        ("remote, locus run (FUSE path)", measure(&fuse, &exe, &remote, &args, &token)?),
        ("remote, locus run (traced)", measure(&traced, &exe, &remote, &args, &token)?),
        ("remote, locus mount", {
            let mnt = work.path().join("mnt");
            let m = crate::mount::mount(&exe, &format!("locus://{}/", locus.addr), &mnt, &token)?;
            measure(&[], &exe, &m.dir.join("rows"), &args, &token)?
        }),
    ];
    let mut out = format!(
        "\n### bench agent: Figure 4 rows under `locus run` (p50 µs, {} calls, median of {} runs)\n\n| row |",
        args.iterations, args.repeat
    );
    for (name, _) in &settings {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str(" FUSE path ÷ unmodified (local) | traced ÷ unmodified (local) | parrot_run (reference) | parrot ÷ unmodified |\n|---|");
    out.push_str(&"---|".repeat(settings.len() + 4));
    out.push('\n');
    for (i, (row, _)) in settings[0].1.rows.iter().enumerate() {
        out.push_str(&format!("| {row} |"));
        for (_, m) in &settings {
            out.push_str(&format!(" {:.2} |", m.rows[i].1.p50));
        }
        for setting in [1, 2] {
            let ratio = settings[setting].1.rows[i].1.p50 / settings[0].1.rows[i].1.p50;
            out.push_str(&format!(" {ratio:.2}x |"));
        }
        match PARROT.iter().find(|p| p.0 == row) {
            Some((_, parrot, plain)) => out.push_str(&format!(" {parrot} | {:.0}x |\n", parrot / plain)),
            None => out.push_str(" | |\n"),
        }
    }
    out.push_str("| seq read MB/s |");
    for (_, m) in &settings {
        out.push_str(&format!(" {:.0} |", m.mbps));
    }
    let (plain, fuse, traced) = (settings[0].1.mbps, settings[1].1.mbps, settings[2].1.mbps);
    out.push_str(&format!(" {:.2}x | {:.2}x | | 0.56x |\n", fuse / plain, traced / plain));
    print!("{out}");
    Ok(())
}
