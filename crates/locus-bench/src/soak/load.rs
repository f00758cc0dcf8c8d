//! The clients' side of a soak: each kind's operation (small files, a mount's files),
//! paced at its rate, and the meters that record what each interval did.

use super::{SHARED_FILES, SMALL_FILES};
use locus_client::blocking;
use locus_client::types::open_flags;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one kind of client did in the current interval.
#[derive(Default)]
pub(super) struct Meter {
    pub(super) samples: Vec<Duration>,
    pub(super) errors: u64,
    pub(super) first_errors: Vec<String>,
}

pub(super) type Meters = Arc<BTreeMap<&'static str, Mutex<Meter>>>;

pub(super) fn record(meters: &Meters, kind: &str, took: Duration, result: Result<(), String>) {
    if let Some(m) = meters.get(kind) {
        let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => m.samples.push(took),
            Err(e) => {
                m.errors += 1;
                if m.first_errors.len() < 3 {
                    m.first_errors.push(e);
                }
            }
        }
    }
}

/// A fixed rate of operations: waits for the next slot, or says to stop.
pub(super) struct Pace {
    pub(super) period: Duration,
    pub(super) next: Instant,
}

impl Pace {
    /// The first slot is now.
    pub(super) fn new(rate: f64) -> Pace {
        let period = Duration::from_secs_f64(1.0 / rate.max(1e-3));
        Pace { period, next: Instant::now().checked_sub(period).unwrap_or_else(Instant::now) }
    }

    /// Sleeps until the next slot (checking `stop`); a client more than a second behind
    /// skips ahead rather than bursting. Returns false when told to stop.
    pub(super) fn wait(&mut self, stop: &AtomicBool) -> bool {
        self.next += self.period;
        let now = Instant::now();
        if now > self.next + Duration::from_secs(1) {
            self.next = now;
        }
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= self.next {
                return true;
            }
            std::thread::sleep((self.next - now).min(Duration::from_millis(100)));
        }
        false
    }
}

/// Runs `op` at `rate` until `stop`, recording each call under `kind`.
pub(super) fn paced(
    stop: &AtomicBool,
    meters: &Meters,
    kind: &str,
    rate: f64,
    mut op: impl FnMut(u64) -> Result<(), String>,
) {
    let mut pace = Pace::new(rate);
    let mut i = 0u64;
    while pace.wait(stop) {
        let t = Instant::now();
        let r = op(i);
        record(meters, kind, t.elapsed(), r);
        i += 1;
    }
}

/// Lines of a storelet's output.
pub(super) fn lines(out: &[u8]) -> usize {
    out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count()
}

pub(super) fn small_op(c: &blocking::Client, dir: &str, i: u64, payload: &[u8]) -> Result<(), String> {
    let e = |e: locus_client::ClientError| e.to_string();
    let f = format!("{dir}/f{}", i as usize % SMALL_FILES);
    match i % 7 {
        0 => c.run(|c| c.stat(&f)).map(drop).map_err(e),
        1 => c
            .run(|c| async {
                let h = c.open(&f, open_flags::READ, 0).await?;
                let data = c.pread(h.handle, 0, 4096).await;
                c.close(h.handle).await?;
                data.map(drop)
            })
            .map_err(e),
        2 => c.run(|c| c.write_file(&f, 0o644, payload)).map(drop).map_err(e),
        3 => {
            let got = c.run(|c| c.read_file(&f)).map_err(e)?;
            if got.len() != payload.len() {
                return Err(format!("{f}: read {} bytes, wrote {}", got.len(), payload.len()));
            }
            Ok(())
        }
        4 => c.run(|c| c.readdir(dir)).map(drop).map_err(e),
        5 => {
            let d = format!("{dir}/churn-{i}");
            c.run(|c| async {
                c.mkdir(&d, 0o755).await?;
                c.rmdir(&d).await
            })
            .map_err(e)
        }
        _ => {
            let t = format!("{dir}/tmp-{i}");
            c.run(|c| async {
                c.write_file(&t, 0o644, b"x").await?;
                c.unlink(&t).await
            })
            .map_err(e)
        }
    }
}

/// One file operation through a mount at `dir`: its own files in `mnt-M/own`, written,
/// read back, removed; the shared files (which the changer rewrites) listed and read.
pub(super) fn mount_op(dir: &Path, m: usize, i: u64) -> Result<(), String> {
    let e = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let own = dir.join(format!("mnt-{m}/own/f{}", (i / 5) % 4));
    let body = format!("mount file {i}\n").repeat(200);
    match i % 5 {
        0 => std::fs::write(&own, &body).map_err(|x| e("write", &own, x)),
        1 => {
            let got = std::fs::read(&own).map_err(|x| e("read", &own, x))?;
            let wrote = format!("mount file {}\n", i - 1).repeat(200);
            if got != wrote.as_bytes() {
                return Err(format!("read {}: {} bytes, not what was written", own.display(), got.len()));
            }
            Ok(())
        }
        2 => {
            let shared = dir.join("shared");
            std::fs::read_dir(&shared)
                .map_err(|x| e("ls", &shared, x))?
                .try_for_each(|d| d.map(drop))
                .map_err(|x| e("ls", &shared, x))
        }
        3 => {
            let f = dir.join(format!("shared/s{}", (i / 5) as usize % SHARED_FILES));
            std::fs::read(&f).map(drop).map_err(|x| e("read", &f, x))
        }
        _ => std::fs::remove_file(&own).map_err(|x| e("rm", &own, x)),
    }
}
