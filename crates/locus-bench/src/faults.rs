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

use crate::BenchError;
use locus_client::{Client, ClientError, ConnectOptions, Credentials};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
// Deterministic data and the ledger

/// SplitMix64: seeded, varied, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// `len` bytes determined by `seed`.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&r.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

fn hash(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A size: mostly small, some medium, a few large (up to `max`).
fn size(r: &mut Rng, max: usize) -> usize {
    match r.below(10) {
        0..=4 => r.below(4096) as usize,
        5..=7 => 4096 + r.below(256 << 10) as usize,
        _ => (256 << 10) + r.below(max.saturating_sub(256 << 10).max(1) as u64) as usize,
    }
    .min(max)
}

/// The record of what the workload attempted and what the system acknowledged,
/// appended (and flushed) as each happens.
pub struct Ledger {
    file: Mutex<std::fs::File>,
    next: AtomicU64,
    seed: u64,
}

/// One version tried under a path: None for a removal.
struct Tried {
    vid: u64,
    body: Option<(u64, String, u64)>,
    acked: bool,
}

impl Ledger {
    fn create(path: &Path, seed: u64) -> Result<Ledger, BenchError> {
        let file = std::fs::File::create(path).map_err(|e| BenchError::io("ledger", e))?;
        Ok(Ledger { file: Mutex::new(file), next: AtomicU64::new(1), seed })
    }

    fn line(&self, l: String) {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(l.as_bytes());
    }

    /// A new version of `path` (its contents made from a seed), recorded as tried;
    /// answers its id and bytes.
    fn attempt(&self, path: &str, len: usize) -> (u64, Vec<u8>) {
        let vid = self.next.fetch_add(1, Ordering::Relaxed);
        let seed = self.seed.wrapping_mul(1_000_003).wrapping_add(vid);
        let data = content(seed, len);
        self.line(format!("try {path} {vid} {len} {} {seed}\n", hash(&data)));
        (vid, data)
    }

    /// A removal of `path` (as the source of a rename), recorded as tried.
    fn attempt_removal(&self, path: &str) -> u64 {
        let vid = self.next.fetch_add(1, Ordering::Relaxed);
        self.line(format!("try {path} {vid} - - -\n"));
        vid
    }

    /// The version is now acknowledged (or, on an afs mount, kept).
    fn ack(&self, path: &str, vid: u64) {
        self.line(format!("ack {path} {vid}\n"));
    }

    /// Reads a ledger file back: each path's versions in the order tried.
    fn read(path: &Path) -> Result<BTreeMap<String, Vec<Tried>>, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::io("ledger", e))?;
        let mut out: BTreeMap<String, Vec<Tried>> = BTreeMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                ["try", p, vid, "-", "-", "-"] => out.entry(p.to_string()).or_default().push(Tried {
                    vid: vid.parse().unwrap_or(0),
                    body: None,
                    acked: false,
                }),
                ["try", p, vid, len, h, seed] => out.entry(p.to_string()).or_default().push(Tried {
                    vid: vid.parse().unwrap_or(0),
                    body: Some((len.parse().unwrap_or(0), h.to_string(), seed.parse().unwrap_or(0))),
                    acked: false,
                }),
                ["ack", p, vid] => {
                    let vid: u64 = vid.parse().unwrap_or(0);
                    if let Some(t) = out.get_mut(*p).and_then(|v| v.iter_mut().find(|t| t.vid == vid)) {
                        t.acked = true;
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

/// What a path holds now, as the checker sees it.
enum Seen {
    Absent,
    Bytes(Vec<u8>),
    Unreadable(String),
}

/// Compares the system's state with the ledger. `read` answers a path's state;
/// `listed` is every name in the workload's directories (paths), if it can be listed.
fn check(
    ledger: &Path,
    mut read: impl FnMut(&str) -> Seen,
    listed: Option<Vec<String>>,
    out: &mut RunOutcome,
) -> Result<(), BenchError> {
    let versions = Ledger::read(ledger)?;
    for (path, tried) in &versions {
        let last_ack = tried.iter().rposition(|t| t.acked);
        let seen = read(path);
        if last_ack.is_some() {
            out.checked += 1;
        }
        let matches: Vec<usize> = match &seen {
            Seen::Unreadable(e) => {
                if last_ack.is_some() {
                    out.lost += 1;
                    note(out, format!("{path}: acknowledged but unreadable: {e}"));
                }
                continue;
            }
            Seen::Absent => (0..tried.len()).filter(|&i| tried[i].body.is_none()).collect(),
            Seen::Bytes(b) => {
                let h = hash(b);
                (0..tried.len()).filter(|&i| tried[i].body.as_ref().is_some_and(|(_, th, _)| *th == h)).collect()
            }
        };
        match (matches.last(), last_ack, &seen) {
            (Some(&i), Some(a), _) if i < a => {
                out.lost += 1;
                note(out, format!("{path}: holds version {} older than acknowledged {}", tried[i].vid, tried[a].vid));
            }
            (Some(_), _, _) => {}
            (None, None, Seen::Absent) => {}
            (None, Some(a), Seen::Absent) => {
                out.lost += 1;
                note(out, format!("{path}: acknowledged version {} is gone", tried[a].vid));
            }
            (None, _, Seen::Bytes(b)) => {
                let prefix = tried.iter().any(|t| {
                    t.body
                        .as_ref()
                        .is_some_and(|&(len, _, seed)| b.len() < len as usize && content(seed, b.len()) == *b)
                });
                if prefix {
                    out.half_written += 1;
                    note(out, format!("{path}: {} bytes, a strict prefix of a version tried", b.len()));
                } else {
                    out.corrupted += 1;
                    note(out, format!("{path}: {} bytes matching no version tried", b.len()));
                }
            }
            (None, _, Seen::Unreadable(_)) => {}
        }
    }
    for name in listed.unwrap_or_default() {
        if !versions.contains_key(&name) {
            out.half_written += 1;
            note(out, format!("{name}: a name the workload never wrote"));
        }
    }
    Ok(())
}

fn note(out: &mut RunOutcome, s: String) {
    if out.notes.len() < 8 {
        out.notes.push(s);
    }
}

// ---------------------------------------------------------------------------------
// Processes

/// A `locus` process (server, node, head or mount); killed when dropped.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn signal(&self, sig: rustix::process::Signal) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }

    /// `kill -9`, and reaps it.
    fn kill9(&mut self) {
        self.signal(rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the process to end by itself.
    fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One run's working directory, programs and network helpers.
struct World {
    exe: PathBuf,
    dir: tempfile::TempDir,
    /// Network namespace to remove when done.
    netns: Option<String>,
    /// Mount points to detach when done (tmpfs, FUSE).
    mounts: Vec<PathBuf>,
}

impl Drop for World {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).stderr(Stdio::null()).status();
        }
        if let Some(ns) = &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
    }
}

fn setup(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(e.to_string())
}

impl World {
    fn new(exe: &Path) -> Result<World, BenchError> {
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let dir =
            tempfile::Builder::new().prefix("locus-faults-").tempdir_in(base).map_err(|e| BenchError::io("temp", e))?;
        Ok(World { exe: exe.to_path_buf(), dir, netns: None, mounts: Vec::new() })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A `locus` command with this run's home and the admin's credentials, logging
    /// (appending) to `NAME.log`.
    fn locus(&self, name: &str, netns: Option<&str>) -> Result<(Command, PathBuf), BenchError> {
        let mut c = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        let log = self.path(&format!("{name}.log"));
        let f =
            std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(|e| BenchError::io("log", e))?;
        c.env("LOCUS_HOME", self.path("home"))
            .env("LOCUS_TOKEN", format!("admin:{TOKEN}"))
            .env("LOCUS_LOG", "warn,locus_server::cluster::node=info")
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(f));
        // Nothing outlives the bench: if it dies, so do the processes it started.
        // SAFETY: one system call between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, || {
                rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                    .map_err(std::io::Error::from)
            });
        }
        Ok((c, log))
    }

    /// `locus serve FLAGS` named `name` at `addr`, over `NAME/export` and `NAME/state`
    /// (kept across restarts), once it accepts connections.
    fn serve(&self, name: &str, addr: &str, flags: &[&str], netns: Option<&str>) -> Result<Proc, BenchError> {
        let (root, state) = (self.path(&format!("{name}/export")), self.path(&format!("{name}/state")));
        for d in [&root, &state] {
            std::fs::create_dir_all(d).map_err(|e| BenchError::io("server dirs", e))?;
        }
        let tokens = state.join("tokens");
        if !tokens.exists() {
            std::fs::write(&tokens, format!("admin {TOKEN}\n{NODE} {TOKEN}\n"))
                .map_err(|e| BenchError::io("tokens", e))?;
        }
        let (mut c, log) = self.locus(name, netns)?;
        if flags.contains(&"--data-node") {
            // Data nodes join as the node subject, which may do nothing else at a head.
            c.env("LOCUS_TOKEN", format!("{NODE}:{TOKEN}"));
        }
        c.args(["serve", "--listen", addr, "--threads", "2"]).arg("--root").arg(&root).arg("--state").arg(&state);
        c.args(flags);
        let child = c.spawn().map_err(|e| BenchError::io("locus serve", e))?;
        let mut p = Proc { child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        let sock: std::net::SocketAddr = addr.parse().map_err(setup)?;
        while std::net::TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_err() {
            if let Ok(Some(s)) = p.child.try_wait() {
                return Err(setup(format!("{name} exited at start ({s}): {}", p.log_tail())));
            }
            if Instant::now() > deadline {
                return Err(setup(format!("{name} is not listening on {addr}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(p)
    }
}

fn local_addr() -> Result<String, BenchError> {
    Ok(format!("127.0.0.1:{}", locus_testkit::peers::free_port()?))
}

fn sh(args: &[&str]) -> Result<(), BenchError> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| BenchError::io(args[0], e))?;
    if !out.status.success() {
        return Err(setup(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Client workloads (native protocol)

/// The subject data nodes join a head as.
const NODE: &str = locus_proto::capability::NODE_SUBJECT;

fn options(addr: &str) -> ConnectOptions {
    ConnectOptions {
        addr: addr.to_string(),
        credentials: Credentials { subject: "admin".into(), token: TOKEN.into() },
        tls_ca: None,
        tls_name: None,
        deadlines: Default::default(),
    }
}

/// What the workload's clients share.
struct Ctx {
    ledger: Ledger,
    stop: AtomicBool,
    errors: AtomicU64,
    nospc: AtomicU64,
    /// Reads during the run that answered bytes other than the last acknowledged.
    bad_reads: AtomicU64,
    acks: AtomicU64,
    /// Server addresses; a client that loses its connection tries the next.
    addrs: Vec<String>,
    max_size: usize,
    seed: u64,
}

impl Ctx {
    fn failed(&self, e: &ClientError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if e.code() == locus_proto::Code::NOSPC {
            self.nospc.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The workload a client runs.
#[derive(Clone, Copy, PartialEq)]
enum Work {
    /// New files, and now and then a new version of one of its own.
    Puts,
    /// As `Puts`, and reads of its own files, compared with the last acknowledged bytes.
    PutsReads,
    /// A file put under a staging name, then renamed over one of a few final names.
    Renames,
}

/// Connects to one of the servers (the `turn`th), or answers None.
async fn connect(ctx: &Ctx, turn: &mut usize) -> Option<Client> {
    let addr = &ctx.addrs[*turn % ctx.addrs.len()];
    match tokio::time::timeout(Duration::from_secs(5), Client::connect(&options(addr))).await {
        Ok(Ok(c)) => Some(c),
        _ => {
            *turn += 1;
            None
        }
    }
}

async fn worker(ctx: Arc<Ctx>, id: usize, work: Work) {
    let mut rng = Rng(ctx.seed ^ ((id as u64 + 1) * 0x5851_F42D_4C95_7F2D));
    let mut turn = 0;
    let mut client: Option<Client> = None;
    // Each path is written by this client only; the bytes of its last acknowledged version.
    let mut mine: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    let mut k = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        let c = match &client {
            Some(c) if !c.is_closed() => c.clone(),
            _ => match connect(&ctx, &mut turn).await {
                Some(c) => {
                    client = Some(c.clone());
                    c
                }
                None => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        k += 1;
        let result = match work {
            Work::PutsReads if rng.below(3) == 0 && !mine.is_empty() => {
                let i = rng.below(mine.len() as u64) as usize;
                let (path, expect) = &mine[i];
                match (c.read_file(path).await, expect) {
                    (Ok(got), Some(want)) => {
                        if got != *want {
                            ctx.bad_reads.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    }
                    (Ok(_), None) | (Err(_), None) => Ok(()),
                    (Err(e), Some(_)) => Err(e),
                }
            }
            Work::Renames => {
                let stage = format!("/r{id}-s{k}");
                let (vid, data) = ctx.ledger.attempt(&stage, size(&mut rng, ctx.max_size));
                match c.write_file(&stage, 0o644, &data).await {
                    Ok(_) => {
                        ctx.ledger.ack(&stage, vid);
                        let target = format!("/r{id}-f{}", rng.below(3));
                        let gone = ctx.ledger.attempt_removal(&stage);
                        // The target's new version is the staged bytes: the same seed.
                        let tv = ctx.ledger.next.fetch_add(1, Ordering::Relaxed);
                        let seed = ctx.seed.wrapping_mul(1_000_003).wrapping_add(vid);
                        ctx.ledger.line(format!("try {target} {tv} {} {} {seed}\n", data.len(), hash(&data)));
                        match c.rename(&stage, &target).await {
                            Ok(()) => {
                                ctx.ledger.ack(&stage, gone);
                                ctx.ledger.ack(&target, tv);
                                ctx.acks.fetch_add(1, Ordering::Relaxed);
                                Ok(())
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Err(e) => Err(e),
                }
            }
            Work::Puts | Work::PutsReads => {
                let path = if rng.below(5) == 0 && !mine.is_empty() {
                    mine[rng.below(mine.len() as u64) as usize].0.clone()
                } else {
                    format!("/w{id}-{k}")
                };
                let (vid, data) = ctx.ledger.attempt(&path, size(&mut rng, ctx.max_size));
                let r = c.write_file(&path, 0o644, &data).await;
                match r {
                    Ok(_) => {
                        ctx.ledger.ack(&path, vid);
                        ctx.acks.fetch_add(1, Ordering::Relaxed);
                        match mine.iter_mut().find(|(p, _)| *p == path) {
                            Some(m) => m.1 = Some(data),
                            None => mine.push((path, Some(data))),
                        }
                        Ok(())
                    }
                    Err(e) => {
                        // Its state is unknown now: reads may see either version.
                        if let Some(m) = mine.iter_mut().find(|(p, _)| *p == path) {
                            m.1 = None;
                        }
                        Err(e)
                    }
                }
            }
        };
        if let Err(e) = result {
            ctx.failed(&e);
            if e.is_transient() || c.is_closed() {
                client = None;
            } else {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// The running workload: clients on a runtime of their own.
struct Workload {
    ctx: Arc<Ctx>,
    rt: tokio::runtime::Runtime,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    fn start(
        world: &World,
        seed: u64,
        addrs: Vec<String>,
        clients: usize,
        work: Work,
        max_size: usize,
    ) -> Result<Workload, BenchError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| BenchError::io("runtime", e))?;
        let ctx = Arc::new(Ctx {
            ledger: Ledger::create(&world.path("ledger"), seed)?,
            stop: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            nospc: AtomicU64::new(0),
            bad_reads: AtomicU64::new(0),
            acks: AtomicU64::new(0),
            addrs,
            max_size,
            seed,
        });
        let tasks = (0..clients).map(|i| rt.spawn(worker(ctx.clone(), i, work))).collect();
        Ok(Workload { ctx, rt, tasks })
    }

    /// Waits until the clients have `n` acknowledgements (or `limit` passes).
    fn wait_acks(&self, n: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.ctx.acks.load(Ordering::Relaxed) < n {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// A put of a new file through `addr` until one is acknowledged (recorded in the
    /// ledger like the workload's); answers when, or None after `limit`.
    fn probe(&self, addr: &str, name: &str, len: usize, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        let mut n = 0;
        self.rt.block_on(async {
            while Instant::now() < deadline {
                if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(3), Client::connect(&options(addr))).await {
                    while Instant::now() < deadline && !c.is_closed() {
                        n += 1;
                        let path = format!("/{name}-{n}");
                        let (vid, data) = self.ctx.ledger.attempt(&path, len);
                        match tokio::time::timeout(Duration::from_secs(5), c.write_file(&path, 0o644, &data)).await {
                            Ok(Ok(_)) => {
                                self.ctx.ledger.ack(&path, vid);
                                return Some(Instant::now());
                            }
                            Ok(Err(e)) if !e.is_transient() => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            _ => break,
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            None
        })
    }

    /// Stops the clients and answers the counters.
    fn stop(self, out: &mut RunOutcome) {
        self.ctx.stop.store(true, Ordering::Relaxed);
        let tasks = self.tasks;
        let finished = self.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), async {
                for t in tasks {
                    let _ = t.await;
                }
            })
            .await
            .is_ok()
        });
        if !finished {
            note(out, "a client was still waiting 30 s after the workload stopped (a call without a deadline)".into());
        }
        out.errors += self.ctx.errors.load(Ordering::Relaxed);
        let bad = self.ctx.bad_reads.load(Ordering::Relaxed);
        if bad > 0 {
            out.corrupted += bad;
            note(out, format!("{bad} reads during the run answered other bytes than acknowledged"));
        }
        self.rt.shutdown_timeout(Duration::from_secs(1));
    }
}

/// Checks through a new client of `addr`: every ledger path read back, and the root
/// listed for names nobody wrote (those in `ignore` excepted).
fn check_through(world: &World, addr: &str, ignore: &[&str], out: &mut RunOutcome) -> Result<(), BenchError> {
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| BenchError::io("runtime", e))?;
    let client = rt.block_on(async {
        for _ in 0..100 {
            if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(5), Client::connect(&options(addr))).await {
                return Some(c);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    });
    let client = client.ok_or_else(|| setup(format!("the checker cannot connect to {addr}")))?;
    let listed = rt.block_on(client.readdir("/")).ok().map(|entries| {
        entries
            .into_iter()
            .map(|e| e.name)
            .filter(|n| !ignore.contains(&n.as_str()))
            .map(|n| format!("/{n}"))
            .collect::<Vec<_>>()
    });
    if listed.is_none() {
        note(out, "the checker could not list /".into());
    }
    let read = |path: &str| {
        let mut last = String::new();
        for _ in 0..3 {
            match rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), client.read_file(path)).await }) {
                Ok(Ok(b)) => return Seen::Bytes(b),
                Ok(Err(e)) if e.code() == locus_proto::Code::NOENT => return Seen::Absent,
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "no answer in 20 s".into(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Seen::Unreadable(last)
    };
    check(&world.path("ledger"), read, listed, out)?;
    out.stale_temp_files = stale_temp_files(world.dir.path());
    Ok(())
}

/// Files named `.__locus_put_*` (uploads in progress) under the servers' directories.
fn stale_temp_files(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        // Not into mount points or the mount's cache.
        if name == "mnt" || name == "cache" {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => n += stale_temp_files(&e.path()),
            Ok(_) if name.starts_with(".__locus_put_") => n += 1,
            _ => {}
        }
    }
    n
}

/// Waits (at most 30 s) until a new write of `len` bytes through `addr` is acknowledged,
/// and records how long after the fault that was.
fn await_recovery(load: &Workload, out: &mut RunOutcome, fault: Instant, addr: &str, len: usize, what: &str) {
    let back = load.probe(addr, "probe", len, Duration::from_secs(30));
    recovered(out, fault, back, what);
}

/// Lets the workload run on a little, stops it, and checks everything through `addr`.
fn finish(
    world: &World,
    load: Workload,
    rng: &mut Rng,
    addr: &str,
    mut out: RunOutcome,
) -> Result<RunOutcome, BenchError> {
    std::thread::sleep(rng.range_ms(200, 600));
    load.stop(&mut out);
    check_through(world, addr, &[], &mut out)?;
    Ok(out)
}

fn recovered(out: &mut RunOutcome, fault: Instant, back: Option<Instant>, what: &str) {
    match back {
        Some(t) => out.recovery_s = t.duration_since(fault).as_secs_f64(),
        None => {
            out.recovery_s = fault.elapsed().as_secs_f64();
            note(out, format!("{what} did not recover"));
        }
    }
}

// ---------------------------------------------------------------------------------
// Scenarios: one server, cluster, PostgreSQL

fn server_kill(exe: &Path, seed: u64, work: Work) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let world = World::new(exe)?;
    let addr = local_addr()?;
    let mut server = world.serve("srv", &addr, &[], None)?;
    let load = Workload::start(&world, seed, vec![addr.clone()], 4, work, 2 << 20)?;
    let mut out = RunOutcome::default();
    load.wait_acks(4, Duration::from_secs(20));
    std::thread::sleep(rng.range_ms(100, 1200));
    let fault = Instant::now();
    server.kill9();
    std::thread::sleep(rng.range_ms(0, 300));
    let _server = world.serve("srv", &addr, &[], None)?;
    await_recovery(&load, &mut out, fault, &addr, 1000, "the restarted server");
    finish(&world, load, &mut rng, &addr, out)
}

fn disk_full(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let mut world = World::new(exe)?;
    let export = world.path("srv/export");
    std::fs::create_dir_all(&export).map_err(|e| BenchError::io("mkdir", e))?;
    sh(&["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", export.to_str().unwrap_or("")])?;
    world.mounts.push(export.clone());
    // Space the administrator frees once the disk is full: 2-6 MiB, beside the export's
    // root (a name the workload does not list: it is made before the server starts).
    let ballast = export.join("ballast");
    std::fs::write(&ballast, vec![7u8; (2 << 20) + rng.below(4 << 20) as usize])
        .map_err(|e| BenchError::io("ballast", e))?;
    let addr = local_addr()?;
    let _server = world.serve("srv", &addr, &[], None)?;
    let load = Workload::start(&world, seed, vec![addr.clone()], 3, Work::PutsReads, 1 << 20)?;
    let mut out = RunOutcome::default();
    // Full: the clients see ENOSPC.
    let deadline = Instant::now() + Duration::from_secs(30);
    while load.ctx.nospc.load(Ordering::Relaxed) < 3 + rng.below(5) {
        if Instant::now() > deadline {
            note(&mut out, "the export never filled up (no ENOSPC in 30 s)".into());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let fault = Instant::now();
    // Still serving while full: a listing answers.
    let serving = load.rt.block_on(async {
        let c = Client::connect(&options(&addr)).await.ok()?;
        c.readdir("/").await.ok()
    });
    if serving.is_none() {
        note(&mut out, "the server did not answer a listing while its disk was full".into());
    }
    std::thread::sleep(rng.range_ms(100, 500));
    std::fs::remove_file(&ballast).map_err(|e| BenchError::io("free space", e))?;
    let back = load.probe(&addr, "probe", 1000, Duration::from_secs(30));
    recovered(&mut out, fault, back, "the server after space was freed");
    if load.ctx.nospc.load(Ordering::Relaxed) == 0 {
        note(&mut out, "no put failed with ENOSPC".into());
    }
    load.stop(&mut out);
    check_through(&world, &addr, &[], &mut out)?;
    Ok(out)
}

/// A head (`flags`) at `head_addr` and `nodes` data nodes joined to it; answers once a
/// file too large to live in the namespace is stored.
fn cluster(
    world: &World,
    head_addr: &str,
    flags: &[&str],
    nodes: usize,
) -> Result<(Proc, Vec<(Proc, String)>), BenchError> {
    let mut hf = vec!["--head"];
    hf.extend_from_slice(flags);
    let head = world.serve("head", head_addr, &hf, None)?;
    let url = format!("locus://{head_addr}/");
    let mut ns = Vec::new();
    for i in 0..nodes {
        let a = local_addr()?;
        let p = world.serve(&format!("n{i}"), &a, &["--data-node", &url], None)?;
        wait_joined(&p, &format!("n{i}"))?;
        ns.push((p, a));
    }
    Ok((head, ns))
}

/// Waits until data node `p` says (in its log) that it joined its head.
fn wait_joined(p: &Proc, name: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&p.log).unwrap_or_default().contains("joined the cluster") {
        if Instant::now() > deadline {
            return Err(setup(format!("{name} did not join its head: {}", p.log_tail())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn node_kill(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let world = World::new(exe)?;
    let head_addr = local_addr()?;
    let (_head, mut nodes) = cluster(&world, &head_addr, &["--replication", "2"], 3)?;
    let load = Workload::start(&world, seed, vec![head_addr.clone()], 4, Work::PutsReads, 1 << 20)?;
    let mut out = RunOutcome::default();
    load.wait_acks(4, Duration::from_secs(20));
    std::thread::sleep(rng.range_ms(100, 1200));
    let victim = rng.below(nodes.len() as u64) as usize;
    let fault = Instant::now();
    nodes[victim].0.kill9();
    // Service is back when a file that must go to the nodes is stored again.
    let back = load.probe(&head_addr, "probe", 200_000, Duration::from_secs(30));
    recovered(&mut out, fault, back, "puts with a node dead");
    std::thread::sleep(rng.range_ms(300, 900));
    load.stop(&mut out);
    check_through(&world, &head_addr, &[], &mut out)?;
    Ok(out)
}

fn head_kill_sqlite(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let world = World::new(exe)?;
    let head_addr = local_addr()?;
    let (mut head, _nodes) = cluster(&world, &head_addr, &[], 1)?;
    let load = Workload::start(&world, seed, vec![head_addr.clone()], 4, Work::Puts, 1 << 20)?;
    let mut out = RunOutcome::default();
    load.wait_acks(4, Duration::from_secs(20));
    std::thread::sleep(rng.range_ms(100, 1200));
    let fault = Instant::now();
    head.kill9();
    let _head = world.serve("head", &head_addr, &["--head"], None)?;
    await_recovery(&load, &mut out, fault, &head_addr, 200_000, "the restarted head");
    finish(&world, load, &mut rng, &head_addr, out)
}

/// PostgreSQL for the runs of a scenario: one cluster (started on first use), a new
/// database per run.
pub struct Postgres(Option<locus_testkit::TestPostgres>);

impl Postgres {
    /// None started yet.
    pub fn new() -> Postgres {
        Postgres(None)
    }

    /// The cluster and the URL of a new database for run `seed`.
    fn database(&mut self, seed: u64) -> Result<(&locus_testkit::TestPostgres, String), BenchError> {
        if self.0.is_none() {
            if !locus_testkit::TestPostgres::installed() {
                return Err(setup("PostgreSQL is not installed (apt-get install postgresql)"));
            }
            self.0 = Some(locus_testkit::TestPostgres::start());
        }
        let pg = self.0.as_ref().ok_or_else(|| setup("PostgreSQL"))?;
        let n = NEXT_DB.fetch_add(1, Ordering::Relaxed);
        let url = pg.database(&format!("faults_{seed}_{n}")).ok_or_else(|| setup("createdb failed"))?;
        Ok((pg, url))
    }
}

impl Default for Postgres {
    fn default() -> Self {
        Self::new()
    }
}

static NEXT_DB: AtomicU64 = AtomicU64::new(0);

fn head_kill_postgres(exe: &Path, seed: u64, pg: &mut Postgres) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let (_, meta) = pg.database(seed)?;
    let world = World::new(exe)?;
    let (a_addr, b_addr) = (local_addr()?, local_addr()?);
    let (mut a, _nodes) = cluster(&world, &a_addr, &["--meta", &meta], 1)?;
    // Every head of a namespace holds the wrap key of the cluster key (made by the first).
    let wrap = locus_server::cluster::keys::WRAP_FILE;
    std::fs::create_dir_all(world.path("head-b/state")).map_err(|e| BenchError::io("head-b state", e))?;
    std::fs::copy(world.path(&format!("head/state/{wrap}")), world.path(&format!("head-b/state/{wrap}")))
        .map_err(|e| BenchError::io("copy the wrap key", e))?;
    let _b = world.serve("head-b", &b_addr, &["--head", "--meta", &meta], None)?;
    let load = Workload::start(&world, seed, vec![a_addr.clone(), b_addr.clone()], 4, Work::Puts, 1 << 20)?;
    let mut out = RunOutcome::default();
    load.wait_acks(4, Duration::from_secs(20));
    std::thread::sleep(rng.range_ms(100, 1200));
    let fault = Instant::now();
    a.kill9();
    await_recovery(&load, &mut out, fault, &b_addr, 200_000, "puts through the other head");
    finish(&world, load, &mut rng, &b_addr, out)
}

fn postgres_restart(exe: &Path, seed: u64, pg: &mut Postgres) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let (pg, meta) = pg.database(seed)?;
    let world = World::new(exe)?;
    let head_addr = local_addr()?;
    let (_head, _nodes) = cluster(&world, &head_addr, &["--meta", &meta], 1)?;
    let load = Workload::start(&world, seed, vec![head_addr.clone()], 4, Work::Puts, 1 << 20)?;
    let mut out = RunOutcome::default();
    load.wait_acks(4, Duration::from_secs(20));
    std::thread::sleep(rng.range_ms(100, 1200));
    let fault = Instant::now();
    if !pg.restart() {
        return Err(setup("PostgreSQL did not restart"));
    }
    let pg_back = fault.elapsed().as_secs_f64();
    let back = load.probe(&head_addr, "probe", 200_000, Duration::from_secs(30));
    recovered(&mut out, fault, back, "the head after PostgreSQL restarted");
    eprintln!("postgres-restart seed {seed}: PostgreSQL accepted connections again after {pg_back:.2} s, the head stored a file after {:.2} s", out.recovery_s);
    finish(&world, load, &mut rng, &head_addr, out)
}

// ---------------------------------------------------------------------------------
// Scenarios: locus mount --consistency afs

/// `locus mount --consistency afs` of `url` on `WORLD/mnt`, its copies in `WORLD/cache`.
fn mount(world: &World, url: &str, retry_s: u64) -> Result<Proc, BenchError> {
    let mnt = world.path("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| BenchError::io("mkdir", e))?;
    let (mut c, log) = world.locus("mount", None)?;
    c.args(["mount", url]).arg(&mnt).args(["--consistency", "afs", "--retry-secs", &retry_s.to_string()]);
    c.arg("--cache-dir").arg(world.path("cache"));
    let child = c.spawn().map_err(|e| BenchError::io("locus mount", e))?;
    let mut p = Proc { child, log };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !locus_mount::is_mounted(&mnt) {
        if let Ok(Some(s)) = p.child.try_wait() {
            return Err(setup(format!("locus mount exited ({s}): {}", p.log_tail())));
        }
        if Instant::now() > deadline {
            return Err(setup("locus mount did not mount"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(p)
}

fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(mnt).stderr(Stdio::null()).status();
    let _ = Command::new("umount").arg("-l").arg(mnt).stderr(Stdio::null()).status();
}

/// close(2) of `f`, with its result (Rust's drop ignores it; on afs it is the store's).
fn close(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    nix::unistd::close(f.into_raw_fd()).map_err(std::io::Error::from)
}

/// Writes `data` to `path` in 64 KiB writes; answers the open file.
fn write_all(path: &Path, data: &[u8]) -> std::io::Result<std::fs::File> {
    let mut f = std::fs::File::create(path)?;
    for chunk in data.chunks(64 << 10) {
        f.write_all(chunk)?;
    }
    Ok(f)
}

/// Files written through the mount and closed (some after fsync): acknowledged at the
/// call that returned 0. Files stored once, then opened again and rewritten and left
/// open: the new version is kept (see the module's doc). The directory is listed first,
/// so that the mount knows which names are free and makes new files as local copies.
struct MountWork {
    errors: u64,
    held: Vec<std::fs::File>,
}

fn mount_writes(ledger: &Ledger, mnt: &Path, rng: &mut Rng, closed: usize, open: usize) -> MountWork {
    let mut w = MountWork { errors: 0, held: Vec::new() };
    let _ = std::fs::read_dir(mnt).map(|d| d.count());
    for i in 0..closed + open {
        let name = if i < closed { format!("/m-c{i}") } else { format!("/m-o{i}") };
        let (vid, data) = ledger.attempt(&name, size(rng, 512 << 10));
        let f = match write_all(&mnt.join(&name[1..]), &data) {
            Ok(f) => f,
            Err(_) => {
                w.errors += 1;
                continue;
            }
        };
        if rng.below(3) == 0 {
            match f.sync_all() {
                Ok(()) => ledger.ack(&name, vid),
                Err(_) => w.errors += 1,
            }
        }
        match close(f) {
            Ok(()) => ledger.ack(&name, vid),
            Err(_) => {
                w.errors += 1;
                continue;
            }
        }
        if i >= closed {
            // Written again in a local copy, and left open.
            let (vid, data) = ledger.attempt(&name, size(rng, 512 << 10));
            match write_all(&mnt.join(&name[1..]), &data) {
                Ok(f) => {
                    ledger.ack(&name, vid);
                    w.held.push(f);
                }
                Err(_) => w.errors += 1,
            }
        }
    }
    w
}

/// A direct client of `addr` polled until every kept file has its bytes (or `limit`).
fn wait_stored(world: &World, addr: &str, names: &[String], limit: Duration) -> Option<Instant> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    let versions = Ledger::read(&world.path("ledger")).ok()?;
    let deadline = Instant::now() + limit;
    rt.block_on(async {
        while Instant::now() < deadline {
            if let Ok(c) = Client::connect(&options(addr)).await {
                let mut all = true;
                for n in names {
                    let want =
                        versions.get(n).and_then(|v| v.iter().rev().find(|t| t.acked)).and_then(|t| t.body.clone());
                    let ok = match (c.read_file(n).await, want) {
                        (Ok(b), Some((_, h, _))) => hash(&b) == h,
                        _ => false,
                    };
                    if !ok {
                        all = false;
                        break;
                    }
                }
                if all {
                    return Some(Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    })
}

fn mount_kill(exe: &Path, seed: u64, sigterm: bool) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let mut world = World::new(exe)?;
    let addr = local_addr()?;
    let _server = world.serve("srv", &addr, &[], None)?;
    let url = format!("locus://{addr}/");
    let mut m = mount(&world, &url, 5)?;
    world.mounts.push(world.path("mnt"));
    let ledger = Ledger::create(&world.path("ledger"), seed)?;
    let (closed, open) = (2 + rng.below(6) as usize, 1 + rng.below(4) as usize);
    let mut w = mount_writes(&ledger, &world.path("mnt"), &mut rng, closed, open);
    let kept: Vec<String> = (closed..closed + open).map(|i| format!("/m-o{i}")).collect();
    let mut out = RunOutcome { errors: w.errors, ..Default::default() };
    std::thread::sleep(rng.range_ms(0, 300));
    let fault = Instant::now();
    let back = if sigterm {
        m.signal(rustix::process::Signal::TERM);
        let exited = m.wait_exit(Duration::from_secs(20));
        for f in w.held.drain(..) {
            let _ = close(f);
        }
        if !exited {
            note(&mut out, "the mount did not exit within 20 s of SIGTERM".into());
            m.kill9();
        }
        detach(&world.path("mnt"));
        wait_stored(&world, &addr, &kept, Duration::from_secs(5))
    } else {
        m.kill9();
        for f in w.held.drain(..) {
            let _ = close(f);
        }
        detach(&world.path("mnt"));
        let _m2 = mount(&world, &url, 5)?;
        let t = wait_stored(&world, &addr, &kept, Duration::from_secs(15));
        let _ = Command::new("fusermount3").arg("-u").arg(world.path("mnt")).stderr(Stdio::null()).status();
        t
    };
    recovered(&mut out, fault, back, "the unsaved copies (stored by the mount)");
    check_through(&world, &addr, &[], &mut out)?;
    Ok(out)
}

/// Files made and closed through an afs mount in a directory, then `rm -r` of the
/// directory (each removal answered by the mount is acknowledged), then `kill -9` of the
/// mount at once; a new mount over the same cache dir. The server must not keep what
/// the mount said it removed.
fn mount_kill_rm(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let mut world = World::new(exe)?;
    let addr = local_addr()?;
    let _server = world.serve("srv", &addr, &[], None)?;
    let url = format!("locus://{addr}/");
    let mut m = mount(&world, &url, 5)?;
    world.mounts.push(world.path("mnt"));
    let ledger = Ledger::create(&world.path("ledger"), seed)?;
    let mnt = world.path("mnt");
    let mut out = RunOutcome::default();
    let tree = mnt.join("m-tree");
    let dir_vid = ledger.next.fetch_add(1, Ordering::Relaxed);
    if std::fs::create_dir(&tree).is_err() {
        return Err(setup("mkdir through the mount failed"));
    }
    // The directory is known to the ledger as a name that ends removed.
    let n = 2 + rng.below(10) as usize;
    let mut files = Vec::new();
    for i in 0..n {
        let name = format!("/m-tree/f{i}");
        let (vid, data) = ledger.attempt(&name, size(&mut rng, 128 << 10));
        match write_all(&mnt.join(&name[1..]), &data).and_then(close) {
            Ok(()) => {
                ledger.ack(&name, vid);
                files.push(name);
            }
            Err(_) => out.errors += 1,
        }
    }
    let _ = std::fs::read_dir(&tree).map(|d| d.count());
    std::thread::sleep(rng.range_ms(0, 200));
    let removals: Vec<(String, u64)> = files.iter().map(|f| (f.clone(), ledger.attempt_removal(f))).collect();
    ledger.line(format!("try /m-tree {dir_vid} - - -\n"));
    match std::fs::remove_dir_all(&tree) {
        Ok(()) => {
            for (f, vid) in &removals {
                ledger.ack(f, *vid);
            }
            ledger.ack("/m-tree", dir_vid);
        }
        Err(_) => out.errors += 1,
    }
    let fault = Instant::now();
    m.kill9();
    detach(&mnt);
    let _m2 = mount(&world, &url, 5)?;
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| BenchError::io("runtime", e))?;
    let back = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(c) = Client::connect(&options(&addr)).await {
                if c.stat("/m-tree").await.is_err_and(|e| e.code() == locus_proto::Code::NOENT) {
                    return Some(Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    });
    recovered(&mut out, fault, back, "the removal (made at the server by the mount)");
    let _ = Command::new("fusermount3").arg("-u").arg(&mnt).stderr(Stdio::null()).status();
    check_through(&world, &addr, &[], &mut out)?;
    Ok(out)
}

fn mount_link_cut(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
    let mut rng = Rng(seed);
    let mut world = World::new(exe)?;
    // The server in a network namespace of its own, reached over a veth link whose
    // root side is set down and up again.
    let ns = "lf-faults";
    let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
    let _ = Command::new("ip").args(["link", "del", "lf-root"]).stderr(Stdio::null()).status();
    sh(&["ip", "netns", "add", ns])?;
    world.netns = Some(ns.into());
    sh(&["ip", "link", "add", "lf-root", "type", "veth", "peer", "name", "lf-srv"])?;
    sh(&["ip", "link", "set", "lf-srv", "netns", ns])?;
    sh(&["ip", "addr", "add", "10.79.0.2/24", "dev", "lf-root"])?;
    sh(&["ip", "link", "set", "lf-root", "up"])?;
    sh(&["ip", "-n", ns, "addr", "add", "10.79.0.1/24", "dev", "lf-srv"])?;
    sh(&["ip", "-n", ns, "link", "set", "lf-srv", "up"])?;
    sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
    let addr = "10.79.0.1:9610".to_string();
    let _server = world.serve("srv", &addr, &[], Some(ns))?;
    let url = format!("locus://{addr}/");
    let retry_s = 2;
    let _m = mount(&world, &url, retry_s)?;
    world.mounts.push(world.path("mnt"));
    let ledger = Arc::new(Ledger::create(&world.path("ledger"), seed)?);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (ledger, stop, mnt, seed) = (ledger.clone(), stop.clone(), world.path("mnt"), seed);
        std::thread::spawn(move || {
            let mut rng = Rng(seed ^ 0xA5A5);
            let (mut errors, mut i) = (0u64, 0);
            // Listed: the mount knows which names are free and makes files as local copies.
            let _ = std::fs::read_dir(&mnt).map(|d| d.count());
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let name = format!("/m-l{i}");
                let (vid, data) = ledger.attempt(&name, size(&mut rng, 256 << 10));
                let f = match write_all(&mnt.join(&name[1..]), &data) {
                    Ok(f) => f,
                    Err(_) => {
                        errors += 1;
                        continue;
                    }
                };
                // Every write returned: the copy is the mount's to keep (acknowledged
                // by close, or kept when close reports a failed store).
                if close(f).is_err() {
                    errors += 1;
                }
                ledger.ack(&name, vid);
                std::thread::sleep(Duration::from_millis(20));
            }
            errors
        })
    };
    std::thread::sleep(rng.range_ms(300, 900));
    let fault = Instant::now();
    sh(&["ip", "link", "set", "lf-root", "down"])?;
    // Down long enough for the heartbeat to give the connection up and the retry window
    // to pass after it: closes then fail to store, and the mount must keep their copies.
    let heartbeat = locus_client::HEARTBEAT_EVERY + locus_client::HEARTBEAT_TIMEOUT;
    std::thread::sleep(heartbeat + Duration::from_secs(retry_s + 4));
    sh(&["ip", "link", "set", "lf-root", "up"])?;
    std::thread::sleep(rng.range_ms(500, 1500));
    stop.store(true, Ordering::Relaxed);
    let mut out = RunOutcome::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !writer.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if writer.is_finished() {
        out.errors = writer.join().unwrap_or(0);
    } else {
        note(&mut out, "a write through the mount still hung 30 s after the link came back".into());
    }
    // Everything the mount kept is at the server once it has caught up.
    let versions = Ledger::read(&world.path("ledger"))?;
    let names: Vec<String> =
        versions.iter().filter(|(_, v)| v.iter().any(|t| t.acked)).map(|(n, _)| n.clone()).collect();
    let back = wait_stored(&world, &addr, &names, Duration::from_secs(15));
    recovered(&mut out, fault, back, "the mount's kept copies after the link came back");
    check_through(&world, &addr, &[], &mut out)?;
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger_with(lines: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ledger");
        std::fs::write(&p, lines).unwrap();
        (d, p)
    }

    #[test]
    fn the_checker_tells_lost_corrupted_and_half_written_apart() {
        let v1 = content(11, 100);
        let v2 = content(12, 100);
        let lines = format!(
            "try /a 1 100 {} 11\nack /a 1\ntry /a 2 100 {} 12\n\
             try /b 3 100 {} 11\nack /b 3\n\
             try /c 4 100 {} 12\n\
             try /d 5 100 {} 11\nack /d 5\ntry /d 6 - - -\n",
            hash(&v1),
            hash(&v2),
            hash(&v1),
            hash(&v2),
            hash(&v1)
        );
        let (_d, p) = ledger_with(&lines);
        let state = |path: &str| match path {
            "/a" => Seen::Bytes(v2.clone()),        // a later, unacknowledged version: fine
            "/b" => Seen::Absent,                   // acknowledged and gone: lost
            "/c" => Seen::Bytes(v2[..40].to_vec()), // a prefix: half-written
            "/d" => Seen::Absent,                   // an attempted removal: fine
            _ => Seen::Absent,
        };
        let mut out = RunOutcome::default();
        check(&p, state, Some(vec!["/a".into(), "/zz".into()]), &mut out).unwrap();
        assert_eq!((out.checked, out.lost, out.corrupted, out.half_written), (3, 1, 0, 2), "{:?}", out.notes);
        let mut out = RunOutcome::default();
        check(&p, |_| Seen::Bytes(b"junk".to_vec()), None, &mut out).unwrap();
        assert_eq!((out.corrupted, out.lost), (4, 0));
    }
}
