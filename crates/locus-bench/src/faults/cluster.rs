//! Scenarios of a cluster under faults: a data node killed, a head killed (on SQLite and on
//! PostgreSQL), PostgreSQL restarted under a head.

use crate::faults::ledger::Rng;
use crate::faults::workload::{await_recovery, check_through, finish, recovered, Work, Workload};
use crate::faults::world::{local_addr, setup, Proc, World};
use crate::faults::RunOutcome;
use crate::BenchError;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A head (`flags`) at `head_addr` and `nodes` data nodes joined to it; answers once a
/// file too large to live in the namespace is stored.
pub(super) fn cluster(
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
pub(super) fn wait_joined(p: &Proc, name: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&p.log).unwrap_or_default().contains("joined the cluster") {
        if Instant::now() > deadline {
            return Err(setup(format!("{name} did not join its head: {}", p.log_tail())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

pub(super) fn node_kill(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
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

pub(super) fn head_kill_sqlite(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
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
    pub(super) fn database(&mut self, seed: u64) -> Result<(&locus_testkit::TestPostgres, String), BenchError> {
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

pub(super) static NEXT_DB: AtomicU64 = AtomicU64::new(0);

pub(super) fn head_kill_postgres(exe: &Path, seed: u64, pg: &mut Postgres) -> Result<RunOutcome, BenchError> {
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

pub(super) fn postgres_restart(exe: &Path, seed: u64, pg: &mut Postgres) -> Result<RunOutcome, BenchError> {
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
