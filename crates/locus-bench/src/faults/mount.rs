//! Scenarios of `locus mount --consistency afs` under faults: the mount killed (SIGKILL,
//! SIGTERM, a removal racing the restart) and its link cut, files written closed and open.

use crate::faults::ledger::{hash, note, size, Ledger, Rng};
use crate::faults::workload::{check_through, options, recovered};
use crate::faults::world::{local_addr, setup, sh, Proc, World};
use crate::faults::RunOutcome;
use crate::BenchError;
use locus_client::Client;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------
// Scenarios: locus mount --consistency afs

/// `locus mount --consistency afs` of `url` on `WORLD/mnt`, its copies in `WORLD/cache`.
pub(super) fn mount(world: &World, url: &str, retry_s: u64) -> Result<Proc, BenchError> {
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

pub(super) fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(mnt).stderr(Stdio::null()).status();
    let _ = Command::new("umount").arg("-l").arg(mnt).stderr(Stdio::null()).status();
}

/// close(2) of `f`, with its result (Rust's drop ignores it; on afs it is the store's).
pub(super) fn close(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    nix::unistd::close(f.into_raw_fd()).map_err(std::io::Error::from)
}

/// Writes `data` to `path` in 64 KiB writes; answers the open file.
pub(super) fn write_all(path: &Path, data: &[u8]) -> std::io::Result<std::fs::File> {
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
pub(super) struct MountWork {
    pub(super) errors: u64,
    pub(super) held: Vec<std::fs::File>,
}

pub(super) fn mount_writes(ledger: &Ledger, mnt: &Path, rng: &mut Rng, closed: usize, open: usize) -> MountWork {
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
pub(super) fn wait_stored(world: &World, addr: &str, names: &[String], limit: Duration) -> Option<Instant> {
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

pub(super) fn mount_kill(exe: &Path, seed: u64, sigterm: bool) -> Result<RunOutcome, BenchError> {
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
pub(super) fn mount_kill_rm(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
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

pub(super) fn mount_link_cut(exe: &Path, seed: u64) -> Result<RunOutcome, BenchError> {
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
