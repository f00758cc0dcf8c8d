//! `locus bench storelets`: what running code beside the data buys, and what it costs
//! the file service, measured in one run.
//!
//! - find: `find -name GLOB` over a real source tree (Go's standard library by default)
//!   placed in the export, four ways side by side at each emulated round-trip time: the
//!   shipped `find` storelet at the server; a client-side traversal that lists each
//!   directory with attributes (one round trip per directory, like NFS READDIRPLUS); a
//!   client-side traversal that lists each directory and stats every entry (one round
//!   trip per file, like NFSv3 LOOKUP + GETATTR); and GNU `find` on the export directory.
//! - denial of service: the stat rate and latency of one client alone, then with eight
//!   hostile storelets running (busy loop, memory growth, output flood, file-open flood,
//!   two of each), in alternating rounds.

use crate::scripts::connect;
use crate::stats::{median, Summary};
use crate::BenchError;
use locus_client::{blocking, types::S_IFDIR, types::S_IFMT};
use locus_testkit::peers;
use locus_testkit::proxy::DelayProxy;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `locus bench storelets`.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreletsArgs {
    /// Source tree copied into the export (default: Go's standard library sources).
    #[arg(long)]
    pub tree: Option<PathBuf>,
    /// The `-name` glob to look for (`*` and `?` only).
    #[arg(long, default_value = "*_test.go")]
    pub name: String,
    /// Emulated round-trip times in milliseconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,10")]
    pub rtt_ms: Vec<f64>,
    /// Timed repeats of each find (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// The per-file traversal runs once at round-trip times of this many ms or more (it takes minutes).
    #[arg(long, default_value_t = 5.0)]
    pub slow_walk_once_ms: f64,
    /// Seconds of each stat measurement in the denial-of-service run.
    #[arg(long, default_value_t = 3.0)]
    pub dos_seconds: f64,
    /// The hostile programs, by mode of the `hostile` storelet (`open` opens a file in a loop).
    #[arg(long, value_delimiter = ',', default_value = "spin,spin,grow,grow,flood,flood,open,open")]
    pub hostile: Vec<String>,
    /// Rounds of (alone, under attack) in the denial-of-service run.
    #[arg(long, default_value_t = 3)]
    pub dos_rounds: usize,
}

/// Matches a file name against a glob of `*` and `?`.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Client-side find: lists every directory (attributes come with the names); with
/// `stat_each`, also stats every entry as a client without READDIRPLUS must.
fn walk(c: &blocking::Client, dir: &str, glob: &str, stat_each: bool) -> Result<usize, String> {
    let mut found = 0;
    for e in c.run(|c| c.readdir(dir)).map_err(|e| format!("{dir}: {e}"))? {
        let path = format!("{}/{}", dir.trim_end_matches('/'), e.name);
        let attr = if stat_each { c.run(|c| c.lstat(&path)).map_err(|e| format!("{path}: {e}"))? } else { e.attr };
        found += usize::from(glob_match(glob, &e.name));
        if attr.mode & S_IFMT == S_IFDIR {
            found += walk(c, &path, glob, stat_each)?;
        }
    }
    Ok(found)
}

/// Non-empty lines of a program's output: how many paths a find printed.
fn lines(out: &[u8]) -> usize {
    out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count()
}

fn timed<T>(f: impl FnOnce() -> Result<T, String>) -> Result<(Duration, T), String> {
    let t = Instant::now();
    let v = f()?;
    Ok((t.elapsed(), v))
}

fn ms(d: &[Duration]) -> f64 {
    median(d.iter().map(|d| d.as_secs_f64() * 1e3).collect())
}

/// Runs the benchmark and prints the report.
pub fn run(args: StoreletsArgs) -> Result<(), BenchError> {
    let setup = BenchError::Setup;
    let tree = match &args.tree {
        Some(t) => t.clone(),
        None => {
            let out = Command::new("go").args(["env", "GOROOT"]).output().map_err(|e| BenchError::io("go env", e))?;
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("src")
        }
    };
    // Memory-backed, as in `bench ops`: disk write-back makes this machine's timings swing.
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let work = tempfile::Builder::new()
        .prefix("locus-bench-storelets-")
        .tempdir_in(base)
        .map_err(|e| BenchError::io("temp dir", e))?;
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).map_err(|e| BenchError::io("mkdir", e))?;
    let status = Command::new("cp").arg("-a").arg(&tree).arg(root.join("tree")).status();
    if !status.is_ok_and(|s| s.success()) {
        return Err(setup(format!("cannot copy {} into the export", tree.display())));
    }
    let count = |kind: &str| -> Result<usize, BenchError> {
        let out = Command::new("find").arg(root.join("tree")).args(["-type", kind]).output();
        Ok(lines(&out.map_err(|e| BenchError::io("find", e))?.stdout))
    };
    let (files, dirs) = (count("f")?, count("d")?);
    let find = locus_storelet::build_shipped("find").map_err(setup)?;
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let (peer, token) = peers::start_locus(&exe, work.path(), &root)?;

    let mut out = format!(
        "\n### bench storelets: find -name '{}' over {} ({files} files, {dirs} directories; median of {} runs, ms)\n\n",
        args.name,
        tree.display(),
        args.repeat
    );
    out.push_str("| RTT ms | local GNU find | storelet find | storelet ÷ local | client readdir walk | client readdir+stat walk | readdir walk ÷ storelet | readdir+stat walk ÷ storelet |\n|---|---|---|---|---|---|---|---|\n");
    let local_find = || -> Result<usize, String> {
        let o = Command::new("find").arg(root.join("tree")).args(["-name", &args.name]).output();
        Ok(lines(&o.map_err(|e| e.to_string())?.stdout))
    };
    for &rtt in &args.rtt_ms {
        let proxy = if rtt > 0.0 {
            Some(
                DelayProxy::start(peer.addr, Duration::from_secs_f64(rtt / 2000.0))
                    .map_err(|e| BenchError::io("proxy", e))?,
            )
        } else {
            None
        };
        let c = connect(proxy.as_ref().map_or(peer.addr, |p| p.addr), &token).map_err(setup)?;
        let find_args = vec!["/".to_string(), "-name".to_string(), args.name.clone()];
        let storelet = || -> Result<usize, String> {
            let o = c.run(|c| c.storelet_run(&find, "/tree", find_args.clone(), false)).map_err(|e| e.to_string())?;
            Ok(lines(&o.stdout))
        };
        let (compile, _) = timed(storelet).map_err(setup)?;
        let (mut local, mut remote, mut walk_dirs, mut walk_files) = (vec![], vec![], vec![], vec![]);
        for r in 0..args.repeat {
            let (t, n_local) = timed(local_find).map_err(setup)?;
            local.push(t);
            let (t, n_storelet) = timed(storelet).map_err(setup)?;
            remote.push(t);
            let (t, n_walk) = timed(|| walk(&c, "/tree", &args.name, false)).map_err(setup)?;
            walk_dirs.push(t);
            if rtt < args.slow_walk_once_ms || r == 0 {
                let (t, n_stat_walk) = timed(|| walk(&c, "/tree", &args.name, true)).map_err(setup)?;
                walk_files.push(t);
                if n_stat_walk != n_local {
                    return Err(setup(format!("stat walk found {n_stat_walk}, local find {n_local}")));
                }
            }
            if n_storelet != n_local || n_walk != n_local {
                return Err(setup(format!("found {n_storelet} (storelet), {n_walk} (walk), {n_local} (local)")));
            }
        }
        let (l, s, wd, wf) = (ms(&local), ms(&remote), ms(&walk_dirs), ms(&walk_files));
        out.push_str(&format!(
            "| {rtt} | {l:.1} | {s:.1} | {:.2}x | {wd:.1} | {wf:.1}{} | {:.1}x | {:.1}x |\n",
            s / l,
            if walk_files.len() == 1 && args.repeat > 1 { " (1 run)" } else { "" },
            wd / s,
            wf / s
        ));
        eprintln!("rtt {rtt} ms done (first storelet run, compiling included: {:.0} ms)", compile.as_secs_f64() * 1e3);
    }
    out.push_str("\nThe storelet's time is the whole call seen by the client: upload of the module (it is sent with every run), queueing, instantiation of the cached compiled module, the walk, and its output. The first run of a module also compiles it; that run is not in the medians.\n");
    drop(peer);

    out.push_str(&dos(&args, work.path(), &root, &exe)?);
    print!("{out}");
    Ok(())
}

/// Measures `stat` on one connection for `secs`: calls per second and latency.
fn stat_for(c: &blocking::Client, secs: f64) -> Result<(f64, Summary), String> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut samples = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        c.run(|c| c.stat("/probe")).map_err(|e| e.to_string())?;
        samples.push(t.elapsed());
    }
    let rate = samples.len() as f64 / secs;
    Ok((rate, Summary::of(&mut samples)))
}

/// The denial-of-service run: a server whose eight storelet workers all run hostile
/// programs, which are restarted as they are stopped.
fn dos(args: &StoreletsArgs, work: &Path, root: &Path, exe: &Path) -> Result<String, BenchError> {
    let setup = BenchError::Setup;
    let work = work.join("dos");
    std::fs::create_dir_all(&work).map_err(|e| BenchError::io("mkdir", e))?;
    std::fs::write(root.join("probe"), b"probe").map_err(|e| BenchError::io("write", e))?;
    let hostile = Arc::new(locus_storelet::build_shipped("hostile").map_err(setup)?);
    let modes: Vec<Vec<String>> = args
        .hostile
        .iter()
        .map(|m| if m == "open" { vec![m.clone(), "/probe".into()] } else { vec![m.clone()] })
        .collect();
    let workers =
        [format!("--storelet-workers={}", modes.len()), format!("--storelet-runs-per-subject={}", modes.len())];
    let (peer, token) = peers::start_locus_with(exe, &work, root, &workers)?;
    let c = connect(peer.addr, &token).map_err(setup)?;
    // Compile the module before measuring (a first run would compile it).
    let warm =
        c.run(|c| c.storelet_run(&hostile, "/", vec!["nothing".into()], false)).map_err(|e| setup(e.to_string()))?;
    if warm.result.exit_code != 2 {
        return Err(setup("the hostile storelet did not start".into()));
    }
    let (mut alone, mut attacked) = (Vec::new(), Vec::new());
    let mut restarts = 0;
    for _ in 0..args.dos_rounds {
        alone.push(stat_for(&c, args.dos_seconds).map_err(setup)?);
        let stop = Arc::new(AtomicBool::new(false));
        let attackers: Vec<_> = modes
            .iter()
            .map(|mode| {
                let (stop, hostile, token, addr) = (stop.clone(), hostile.clone(), token.clone(), peer.addr);
                let argv = mode.clone();
                std::thread::spawn(move || -> Result<usize, String> {
                    let c = connect(addr, &token)?;
                    let mut runs = 0;
                    while !stop.load(Ordering::Relaxed) {
                        runs += 1;
                        c.run(|c| async {
                            let mut run = c.storelet_start(&hostile, "/", argv.clone(), false).await?;
                            while run.next().await?.is_some() {}
                            Ok::<(), locus_client::ClientError>(())
                        })
                        .ok();
                    }
                    Ok(runs)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let running = c.run(|c| c.storelet_ps()).map_err(|e| setup(e.to_string()))?;
        let busy = running.iter().filter(|r| r.running).count();
        attacked.push(stat_for(&c, args.dos_seconds).map_err(setup)?);
        stop.store(true, Ordering::Relaxed);
        for r in c.run(|c| c.storelet_ps()).map_err(|e| setup(e.to_string()))? {
            let _ = c.run(|c| c.storelet_cancel(r.run));
        }
        for a in attackers {
            restarts += a.join().map_err(|_| setup("attacker panicked".into()))?.map_err(setup)?;
        }
        if busy < modes.len() {
            eprintln!("only {busy} of {} hostile storelets were running during this round", modes.len());
        }
    }
    let rate = |v: &[(f64, Summary)]| median(v.iter().map(|x| x.0).collect());
    let sum = |v: &[(f64, Summary)]| Summary::median(&v.iter().map(|x| x.1).collect::<Vec<_>>());
    let (ra, rh, sa, sh) = (rate(&alone), rate(&attacked), sum(&alone), sum(&attacked));
    let report = c.run(|c| c.storelet_stats()).map_err(|e| setup(e.to_string()))?;
    let cpu: u64 = report.subjects.iter().map(|s| s.cpu_us).sum();
    Ok(format!(
        "\n### bench storelets: the file service under {} hostile storelets ({} rounds of {} s each way; medians)\n\n\
         | | stat/s | p50 µs | p99 µs |\n|---|---|---|---|\n\
         | alone | {ra:.0} | {:.1} | {:.1} |\n\
         | with {} hostile storelets | {rh:.0} | {:.1} | {:.1} |\n\
         | ratio | {:.2} | {:.2}x | {:.2}x |\n\n\
         Hostile programs (modes of the `hostile` storelet): {}, one storelet worker each; each restarted when a limit stopped it ({restarts} runs in all, {:.1} s of storelet CPU).\n",
        modes.len(),
        args.dos_rounds,
        args.dos_seconds,
        sa.p50,
        sa.p99,
        modes.len(),
        sh.p50,
        sh.p99,
        rh / ra,
        sh.p50 / sa.p50,
        sh.p99 / sa.p99,
        args.hostile.join(", "),
        cpu as f64 / 1e6
    ))
}
