//! `locus bench soak`: mixed clients against one `locus serve` for minutes, watching
//! whether the server keeps its pace and gives back what it takes.
//!
//! One server runs as a child process, so its resident memory, open descriptors and
//! threads are read from `/proc/PID/{status,fd,task}`. Against it, all at once:
//!
//! - small-op clients over the native protocol: stat, open+pread+close, a 4 KiB put and
//!   get, readdir, mkdir+rmdir and create+unlink churn, in turn;
//! - a large-file client: puts and gets of a file of tens of MiB, alternately;
//! - a script client: `script_call` of the read-if-modified-since script with a stale
//!   mtime, so each call is a stat and a read at the server;
//! - a storelet client: the shipped `find` storelet over a small tree now and then;
//! - `locus mount --consistency afs` mounts (callbacks on) where a client writes, reads
//!   back, lists and removes files and reads files shared with a changer: a native
//!   client that rewrites those shared files, so callback breaks flow to the mounts.
//!
//! The load is bounded on purpose (the machine is small and shared): every client is
//! paced at a fixed rate of operations (`--*-rate`), a closed loop that falls behind if
//! the server slows and catches up at most a second's worth. So throughput stays at the
//! offered load while the server keeps up and drops when it does not; p99 latency per
//! interval is the finer signal.
//!
//! The report: operations per second and p99 latency per client kind and interval; the
//! server's RSS, descriptors and threads before any client, after the warm-up, at the
//! end (clients still running) and after every client left (connections closed, mounts
//! unmounted, polled until back at the start level or `--settle-secs`). The checks: the
//! median throughput of the last intervals within 10% of the first intervals after the
//! warm-up, RSS growth under 10% over the same intervals, descriptors and threads back
//! at their start level, and no client errors. A failed check makes the command fail.

mod load;
mod report;

use load::{lines, mount_op, paced, small_op, Meter, Meters};

pub use report::{table, Check, Interval, KindInterval, Report, Resources};

use crate::scripts::connect;
use crate::soak::report::resources;
use crate::stats::median;
use crate::BenchError;
use locus_client::types::Value;
use locus_testkit::peers;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options of `locus bench soak`.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct SoakArgs {
    /// Minutes the clients run (fractions allowed).
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// Seconds the clients run, instead of --minutes (for quick checks).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Seconds per reported interval (default: a tenth of the run, at most 30).
    #[arg(long)]
    pub interval_secs: Option<f64>,
    /// Share of the run that is warm-up, before the start sample (0.1 = the first 10%).
    #[arg(long, default_value_t = 0.1)]
    pub warmup: f64,
    /// Small-op clients, each on its own connection.
    #[arg(long, default_value_t = 2)]
    pub small_clients: usize,
    /// Operations per second of each small-op client.
    #[arg(long, default_value_t = 250.0)]
    pub small_rate: f64,
    /// Size of the large file, in MiB.
    #[arg(long, default_value_t = 32)]
    pub large_mb: usize,
    /// Large puts and gets per second (alternately).
    #[arg(long, default_value_t = 1.0)]
    pub large_rate: f64,
    /// Script calls per second.
    #[arg(long, default_value_t = 50.0)]
    pub script_rate: f64,
    /// A Lua script for the script client instead of `read_if_modified.lua` (called with
    /// a file's path, 0 and 0; any answer that is not an error counts).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Seconds between storelet runs.
    #[arg(long, default_value_t = 5.0)]
    pub storelet_every: f64,
    /// `locus mount --consistency afs` mounts, each with one client.
    #[arg(long, default_value_t = 2)]
    pub mounts: usize,
    /// File operations per second of each mount's client.
    #[arg(long, default_value_t = 20.0)]
    pub mount_rate: f64,
    /// Rewrites per second of the shared files the mounts read (callback breaks).
    #[arg(long, default_value_t = 4.0)]
    pub change_rate: f64,
    /// Seconds to wait, polling, for descriptors and threads to come back after the clients leave.
    #[arg(long, default_value_t = 20.0)]
    pub settle_secs: f64,
}

/// The client kinds, in report order.
const KINDS: [&str; 6] = ["small", "large", "script", "storelet", "mount", "change"];
const SMALL_FILES: usize = 16;
const SHARED_FILES: usize = 8;
const TREE_DIRS: usize = 20;
const TREE_FILES: usize = 10;
const RIMS: &str = include_str!("../../../../examples/scripts/read_if_modified.lua");

/// Runs the soak and prints the report; fails if a check fails.
pub fn run(args: SoakArgs, json: bool) -> Result<(), BenchError> {
    let setup = BenchError::Setup;
    let duration = args.seconds.unwrap_or(args.minutes * 60.0);
    if duration <= 0.0 {
        return Err(setup("the run must last more than 0 seconds".into()));
    }
    let interval = args.interval_secs.unwrap_or((duration / 10.0).min(30.0)).max(0.1);
    let n = ((duration / interval).round() as usize).max(2);
    let warm = ((n as f64 * args.warmup).ceil() as usize).clamp(1, n - 1);
    let compare = ((n - warm) / 3).clamp(1, 3);

    // Memory-backed, as in the other benches: disk write-back makes timings swing.
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let work =
        tempfile::Builder::new().prefix("locus-bench-soak-").tempdir_in(base).map_err(|e| BenchError::io("temp", e))?;
    let root = work.path().join("export");
    let io = |what: &'static str| move |e| BenchError::io(what, e);
    let mut tree_files = 0;
    for d in 0..TREE_DIRS {
        let dir = root.join(format!("tree/d{d}"));
        std::fs::create_dir_all(&dir).map_err(io("mkdir"))?;
        for f in 0..TREE_FILES {
            let ext = if f % 2 == 0 { "txt" } else { "dat" };
            std::fs::write(dir.join(format!("f{f}.{ext}")), b"tree file\n").map_err(io("write"))?;
            tree_files += usize::from(f % 2 == 0);
        }
    }
    let small_payload = vec![b's'; 4096];
    for c in 0..args.small_clients {
        for f in 0..SMALL_FILES {
            let dir = root.join(format!("small-{c}"));
            std::fs::create_dir_all(&dir).map_err(io("mkdir"))?;
            std::fs::write(dir.join(format!("f{f}")), &small_payload).map_err(io("write"))?;
        }
    }
    std::fs::create_dir_all(root.join("script")).map_err(io("mkdir"))?;
    for f in 0..SMALL_FILES {
        std::fs::write(root.join(format!("script/f{f}")), vec![b'r'; 4096]).map_err(io("write"))?;
    }
    std::fs::create_dir_all(root.join("shared")).map_err(io("mkdir"))?;
    for f in 0..SHARED_FILES {
        std::fs::write(root.join(format!("shared/s{f}")), b"shared\n").map_err(io("write"))?;
    }
    std::fs::create_dir_all(root.join("large")).map_err(io("mkdir"))?;
    for m in 0..args.mounts {
        std::fs::create_dir_all(root.join(format!("mnt-{m}/own"))).map_err(io("mkdir"))?;
    }
    // Built once, before the server starts (Go's build takes a while the first time).
    let find = Arc::new(locus_storelet::build_shipped("find").map_err(setup)?);

    let exe = std::env::current_exe().map_err(io("current exe"))?;
    let (peer, token) = peers::start_locus(&exe, work.path(), &root)?;
    let pid = peer.pid();
    std::thread::sleep(Duration::from_millis(500));
    let idle = resources(pid);
    let mut mounted = Vec::new();
    for m in 0..args.mounts {
        let cache = work.path().join(format!("afs-cache-{m}"));
        let flags = ["--consistency", "afs", "--cache-dir", cache.to_str().unwrap_or_default()];
        let url = format!("locus://{}/", peer.addr);
        mounted.push(crate::mount::mount_with(&exe, &url, &work.path().join(format!("m{m}")), &token, &flags)?);
    }

    let meters: Meters = Arc::new(KINDS.iter().map(|k| (*k, Mutex::new(Meter::default()))).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients: Vec<std::thread::JoinHandle<Result<(), String>>> = Vec::new();
    let spawn = |clients: &mut Vec<_>, f: Box<dyn FnOnce() -> Result<(), String> + Send>| {
        clients.push(std::thread::spawn(f));
    };
    for c in 0..args.small_clients {
        let (stop, meters, token, addr, payload) =
            (stop.clone(), meters.clone(), token.clone(), peer.addr, small_payload.clone());
        let rate = args.small_rate;
        spawn(
            &mut clients,
            Box::new(move || {
                let client = connect(addr, &token)?;
                let dir = format!("/small-{c}");
                paced(&stop, &meters, "small", rate, |i| small_op(&client, &dir, i, &payload));
                Ok(())
            }),
        );
    }
    {
        let (stop, meters, token, addr) = (stop.clone(), meters.clone(), token.clone(), peer.addr);
        let (rate, size) = (args.large_rate, args.large_mb << 20);
        spawn(
            &mut clients,
            Box::new(move || {
                let client = connect(addr, &token)?;
                let mut data = vec![b'L'; size];
                paced(&stop, &meters, "large", rate, |i| {
                    let e = |e: locus_client::ClientError| e.to_string();
                    if i % 2 == 0 {
                        data[0] = (i % 251) as u8;
                        client.run(|c| c.write_file("/large/big", 0o644, &data)).map(drop).map_err(e)
                    } else {
                        let got = client.run(|c| c.read_file("/large/big")).map_err(e)?;
                        if got.len() != data.len() || got[0] != data[0] {
                            return Err(format!("large get: {} bytes, not the {} put", got.len(), data.len()));
                        }
                        Ok(())
                    }
                });
                Ok(())
            }),
        );
    }
    {
        let (stop, meters, token, addr) = (stop.clone(), meters.clone(), token.clone(), peer.addr);
        let rate = args.script_rate;
        let custom = match &args.script {
            Some(p) => Some(std::fs::read_to_string(p).map_err(io("read the script"))?),
            None => None,
        };
        spawn(
            &mut clients,
            Box::new(move || {
                let client = connect(addr, &token)?;
                paced(&stop, &meters, "script", rate, |i| {
                    let path = format!("/script/f{}", i as usize % SMALL_FILES);
                    let source = custom.as_deref().unwrap_or(RIMS);
                    let (values, data) = client
                        .run(|c| {
                            c.script_call(source, vec![Value::Str(path.clone()), Value::Int(0), Value::Int(0)], &[])
                        })
                        .map_err(|e| e.to_string())?;
                    match values.first() {
                        _ if custom.is_some() => Ok(()),
                        Some(Value::Str(s)) if s == "changed" && data.len() == 4096 => Ok(()),
                        other => Err(format!("script on {path}: {other:?}, {} bytes", data.len())),
                    }
                });
                Ok(())
            }),
        );
    }
    {
        let (stop, meters, token, addr, find) = (stop.clone(), meters.clone(), token.clone(), peer.addr, find.clone());
        let rate = 1.0 / args.storelet_every.max(0.01);
        spawn(
            &mut clients,
            Box::new(move || {
                let client = connect(addr, &token)?;
                let argv = vec!["/".to_string(), "-name".to_string(), "*.txt".to_string()];
                paced(&stop, &meters, "storelet", rate, |_| {
                    let o = client
                        .run(|c| c.storelet_run(&find, "/tree", argv.clone(), false))
                        .map_err(|e| e.to_string())?;
                    if o.result.exit_code != 0 || lines(&o.stdout) != tree_files {
                        return Err(format!(
                            "find storelet: exit {}, {} paths (expected {tree_files})",
                            o.result.exit_code,
                            lines(&o.stdout)
                        ));
                    }
                    Ok(())
                });
                Ok(())
            }),
        );
    }
    for (m, mnt) in mounted.iter().enumerate() {
        let (stop, meters, dir) = (stop.clone(), meters.clone(), mnt.dir.clone());
        let rate = args.mount_rate;
        spawn(
            &mut clients,
            Box::new(move || {
                paced(&stop, &meters, "mount", rate, |i| mount_op(&dir, m, i));
                Ok(())
            }),
        );
    }
    if args.mounts > 0 {
        let (stop, meters, token, addr) = (stop.clone(), meters.clone(), token.clone(), peer.addr);
        let rate = args.change_rate;
        spawn(
            &mut clients,
            Box::new(move || {
                let client = connect(addr, &token)?;
                paced(&stop, &meters, "change", rate, |i| {
                    let path = format!("/shared/s{}", i as usize % SHARED_FILES);
                    let body = format!("shared, version {i}\n");
                    client.run(|c| c.write_file(&path, 0o644, body.as_bytes())).map(drop).map_err(|e| e.to_string())
                });
                Ok(())
            }),
        );
    }

    // The intervals: RSS sampled every second (or more often in short runs).
    let started = Instant::now();
    let sample_every = Duration::from_secs_f64((interval / 5.0).min(1.0));
    let mut intervals = Vec::new();
    let mut start_res = Resources::default();
    let mut end_res = Resources::default();
    let mut errors: BTreeMap<String, u64> = KINDS.iter().map(|k| (k.to_string(), 0)).collect();
    let mut first_errors: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut last = started;
    for k in 0..n {
        let until = started + Duration::from_secs_f64(interval * (k + 1) as f64);
        let mut rss = Vec::new();
        loop {
            rss.push(resources(pid).rss_kib as f64);
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(sample_every));
        }
        let res = resources(pid);
        let now = Instant::now();
        let secs = (now - last).as_secs_f64();
        last = now;
        let mut row = Interval {
            t_s: (now - started).as_secs_f64(),
            rss_kib: median(rss) as u64,
            fds: res.fds,
            threads: res.threads,
            ..Default::default()
        };
        for (kind, meter) in meters.iter() {
            let m = std::mem::take(&mut *meter.lock().unwrap_or_else(|e| e.into_inner()));
            let mut samples = m.samples;
            let ops = samples.len() as u64;
            let p99 = crate::stats::Summary::of(&mut samples).p99 / 1e3;
            *errors.entry(kind.to_string()).or_default() += m.errors;
            if !m.first_errors.is_empty() {
                let e = first_errors.entry(kind.to_string()).or_default();
                e.extend(m.first_errors);
                e.truncate(3);
            }
            row.total_ops_per_s += ops as f64 / secs;
            row.kinds.insert(
                kind.to_string(),
                KindInterval { ops, ops_per_s: ops as f64 / secs, p99_ms: p99, errors: m.errors },
            );
        }
        if !json {
            eprintln!(
                "{:>7.0} s: {:.0} ops/s, RSS {} KiB, {} fds, {} threads",
                row.t_s, row.total_ops_per_s, row.rss_kib, row.fds, row.threads
            );
        }
        intervals.push(row);
        if k + 1 == warm {
            start_res = res;
        }
        if k + 1 == n {
            end_res = res;
        }
    }

    // Every client leaves: stop, close connections, unmount; then wait for the server.
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        match c.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                *errors.entry("connect".into()).or_default() += 1;
                first_errors.entry("connect".into()).or_default().push(e);
            }
            Err(_) => {
                *errors.entry("panic".into()).or_default() += 1;
            }
        }
    }
    drop(mounted);
    let left = Instant::now();
    let mut after = resources(pid);
    while left.elapsed().as_secs_f64() < args.settle_secs {
        std::thread::sleep(Duration::from_millis(500));
        after = resources(pid);
        if after.fds <= start_res.fds && after.threads <= start_res.threads && left.elapsed() >= Duration::from_secs(3)
        {
            break;
        }
    }
    let settle_s = left.elapsed().as_secs_f64();
    drop(peer);

    let post: Vec<&Interval> = intervals[warm..].iter().collect();
    let first = &post[..compare.min(post.len())];
    let lastk = &post[post.len().saturating_sub(compare)..];
    let med = |v: &[&Interval], f: &dyn Fn(&Interval) -> f64| median(v.iter().map(|i| f(i)).collect());
    let (t0, t1) = (med(first, &|i| i.total_ops_per_s), med(lastk, &|i| i.total_ops_per_s));
    let (r0, r1) = (med(first, &|i| i.rss_kib as f64), med(lastk, &|i| i.rss_kib as f64));
    let total_errors: u64 = errors.values().sum();
    let checks = vec![
        Check {
            name: "throughput, end vs start".into(),
            start: t0,
            end: t1,
            pass: t0 > 0.0 && (t1 / t0 - 1.0).abs() <= 0.10,
            rule: format!(
                "median total ops/s of the last {compare} intervals within 10% of the first {compare} after warm-up"
            ),
        },
        Check {
            name: "RSS growth after warm-up (KiB)".into(),
            start: r0,
            end: r1,
            pass: r0 > 0.0 && r1 < r0 * 1.10,
            rule: format!("median RSS of the last {compare} intervals under 110% of the first {compare} after warm-up"),
        },
        Check {
            name: "descriptors after clients left".into(),
            start: start_res.fds as f64,
            end: after.fds as f64,
            pass: after.fds <= start_res.fds,
            rule: "open descriptors after every client left at most those after warm-up".into(),
        },
        Check {
            name: "threads after clients left".into(),
            start: start_res.threads as f64,
            end: after.threads as f64,
            pass: after.threads <= start_res.threads,
            rule: "threads after every client left at most those after warm-up".into(),
        },
        Check {
            name: "client errors".into(),
            start: 0.0,
            end: total_errors as f64,
            pass: total_errors == 0,
            rule: "no operation of any client failed".into(),
        },
    ];
    let pass = checks.iter().all(|c| c.pass);
    let resources: BTreeMap<String, Resources> = [
        ("1 idle (before clients)", idle),
        ("2 start (after warm-up)", start_res),
        ("3 end (clients running)", end_res),
        ("4 after (clients left)", after),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let report = Report {
        args: args.clone(),
        duration_s: duration,
        interval_s: interval,
        warmup_intervals: warm,
        compare_intervals: compare,
        intervals,
        resources,
        settle_s,
        errors,
        first_errors,
        checks,
        pass,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| setup(e.to_string()))?);
    } else {
        print!("{}", table(&report));
    }
    if pass {
        Ok(())
    } else {
        let failed: Vec<&str> = report.checks.iter().filter(|c| !c.pass).map(|c| c.name.as_str()).collect();
        Err(setup(format!("soak: FAIL ({})", failed.join("; "))))
    }
}
