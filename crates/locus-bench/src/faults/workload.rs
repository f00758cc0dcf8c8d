//! The load a scenario runs while it injects its fault (native-protocol clients), and
//! how a run is judged: every acknowledged write read back through a fresh client, recovery
//! timed.

use crate::faults::ledger::{check, hash, note, size, Ledger, Rng, Seen};
use crate::faults::world::{setup, World};
use crate::faults::{RunOutcome, TOKEN};
use crate::BenchError;
use locus_client::{Client, ClientError, ConnectOptions, Credentials};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------
// Client workloads (native protocol)

/// Connection options for the benchmark's clients at `addr`.
pub(super) fn options(addr: &str) -> ConnectOptions {
    ConnectOptions {
        addr: addr.to_string(),
        credentials: Credentials { subject: "admin".into(), token: TOKEN.into() },
        tls_ca: None,
        tls_name: None,
        deadlines: Default::default(),
    }
}

/// What the workload's clients share.
pub(super) struct Ctx {
    pub(super) ledger: Ledger,
    pub(super) stop: AtomicBool,
    pub(super) errors: AtomicU64,
    pub(super) nospc: AtomicU64,
    /// Reads during the run that answered bytes other than the last acknowledged.
    pub(super) bad_reads: AtomicU64,
    pub(super) acks: AtomicU64,
    /// Server addresses; a client that loses its connection tries the next.
    pub(super) addrs: Vec<String>,
    pub(super) max_size: usize,
    pub(super) seed: u64,
}

impl Ctx {
    pub(super) fn failed(&self, e: &ClientError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if e.code() == locus_proto::Code::NOSPC {
            self.nospc.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The workload a client runs.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Work {
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
pub(super) struct Workload {
    pub(super) ctx: Arc<Ctx>,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    pub(super) fn start(
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
    pub(super) fn wait_acks(&self, n: u64, limit: Duration) -> bool {
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
    pub(super) fn probe(&self, addr: &str, name: &str, len: usize, limit: Duration) -> Option<Instant> {
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
    pub(super) fn stop(self, out: &mut RunOutcome) {
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
pub(super) fn check_through(
    world: &World,
    addr: &str,
    ignore: &[&str],
    out: &mut RunOutcome,
) -> Result<(), BenchError> {
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
pub(super) fn stale_temp_files(dir: &Path) -> u64 {
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
pub(super) fn await_recovery(
    load: &Workload,
    out: &mut RunOutcome,
    fault: Instant,
    addr: &str,
    len: usize,
    what: &str,
) {
    let back = load.probe(addr, "probe", len, Duration::from_secs(30));
    recovered(out, fault, back, what);
}

/// Lets the workload run on a little, stops it, and checks everything through `addr`.
pub(super) fn finish(
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

pub(super) fn recovered(out: &mut RunOutcome, fault: Instant, back: Option<Instant>, what: &str) {
    match back {
        Some(t) => out.recovery_s = t.duration_since(fault).as_secs_f64(),
        None => {
            out.recovery_s = fault.elapsed().as_secs_f64();
            note(out, format!("{what} did not recover"));
        }
    }
}
