//! Scenarios of one server under faults: killed under each workload, its disk filled.

use crate::faults::ledger::{note, Rng};
use crate::faults::workload::{await_recovery, check_through, finish, options, recovered, Work, Workload};
use crate::faults::world::{local_addr, sh, World};
use crate::faults::RunOutcome;
use crate::BenchError;
use locus_client::Client;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------
// Scenarios: one server, cluster, PostgreSQL

pub(super) fn server_kill(exe: &Path, seed: u64, work: Work) -> Result<RunOutcome, BenchError> {
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

pub(super) fn disk_full(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
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
