//! Always-on I/O accounting: per file, per device, per export and per operation, kept
//! across restarts.
//!
//! Each read or write costs a few relaxed atomic adds: counts, bytes, total service time
//! and a power-of-two histogram of service times (for the 99th percentile), on the
//! file, on the device that holds it and on the export. An open handle holds its file's
//! entry directly, so reads and writes never look anything up. Lerna's accounting and
//! the rebalancing built on it read from here.
//!
//! A file's entry also carries what moving its content between devices needs: which
//! device holds it, a gate that writers pass shared and a move's final switch holds
//! exclusively, and the descriptors of the handles open on it (see `devices`).

use locus_proto::types::{FileStats, IoCounters, OpStats};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Histogram buckets: bucket 0 holds times under 1 µs (1024 ns), bucket i times under
/// 2^i µs; the last holds everything slower (over 18 minutes).
const BUCKETS: usize = 31;

/// Service times in power-of-two buckets.
#[derive(Debug)]
struct Histogram([AtomicU64; BUCKETS]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Histogram {
    fn bucket(ns: u64) -> usize {
        ((64 - (ns >> 10).leading_zeros()) as usize).min(BUCKETS - 1)
    }

    fn add(&self, ns: u64) {
        self.0[Self::bucket(ns)].fetch_add(1, Relaxed);
    }

    fn counts(&self) -> Vec<u64> {
        self.0.iter().map(|c| c.load(Relaxed)).collect()
    }

    fn restore(&self, counts: &[u64]) {
        for (c, &n) in self.0.iter().zip(counts) {
            c.store(n, Relaxed);
        }
    }

    /// The upper bound of the bucket that holds the 99th percentile.
    fn p99(&self) -> u64 {
        let counts = self.counts();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = total - total / 100;
        let mut seen = 0;
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return 1024u64 << i;
            }
        }
        1024u64 << (BUCKETS - 1)
    }
}

/// Read and write counters of one file, one device or the whole export.
#[derive(Debug, Default)]
pub struct IoStats {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    read_ns: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    write_ns: AtomicU64,
    read_times: Histogram,
    write_times: Histogram,
}

/// [`IoStats`] as saved across restarts.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SavedIo {
    counts: [u64; 6],
    read_times: Vec<u64>,
    write_times: Vec<u64>,
}

impl IoStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Records one read of `bytes` that took `took`.
    pub fn read(&self, bytes: u64, took: Duration) {
        let ns = took.as_nanos() as u64;
        Self::add(&self.reads, 1);
        Self::add(&self.read_bytes, bytes);
        Self::add(&self.read_ns, ns);
        self.read_times.add(ns);
    }

    /// Records one write of `bytes` that took `took`.
    pub fn write(&self, bytes: u64, took: Duration) {
        let ns = took.as_nanos() as u64;
        Self::add(&self.writes, 1);
        Self::add(&self.write_bytes, bytes);
        Self::add(&self.write_ns, ns);
        self.write_times.add(ns);
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> IoCounters {
        IoCounters {
            reads: self.reads.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            read_ns: self.read_ns.load(Relaxed),
            writes: self.writes.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            write_ns: self.write_ns.load(Relaxed),
            read_p99_ns: self.read_times.p99(),
            write_p99_ns: self.write_times.p99(),
        }
    }

    fn save(&self) -> SavedIo {
        let s = self.snapshot();
        SavedIo {
            counts: [s.reads, s.read_bytes, s.read_ns, s.writes, s.write_bytes, s.write_ns],
            read_times: self.read_times.counts(),
            write_times: self.write_times.counts(),
        }
    }

    fn restore(&self, saved: &SavedIo) {
        let fields = [&self.reads, &self.read_bytes, &self.read_ns, &self.writes, &self.write_bytes, &self.write_ns];
        for (c, &n) in fields.into_iter().zip(&saved.counts) {
            c.store(n, Relaxed);
        }
        self.read_times.restore(&saved.read_times);
        self.write_times.restore(&saved.write_times);
    }
}

/// What the store keeps per file path: its counters, the device that holds its content,
/// and what moving that content needs.
#[derive(Debug, Default)]
pub struct FileEntry {
    stats: IoStats,
    device: AtomicU32,
    /// Writers through handles hold it shared; a move's final switch exclusively.
    gate: RwLock<()>,
    /// The descriptors of handles open on the file (a move puts the new copy under
    /// each descriptor's number).
    handles: Mutex<Vec<RawFd>>,
}

impl FileEntry {
    /// The device that holds the file's content.
    pub fn device(&self) -> u32 {
        self.device.load(Relaxed)
    }

    /// Records that the content now lives on `device`.
    pub fn set_device(&self, device: u32) {
        self.device.store(device, Relaxed);
    }

    /// Held by a move while it switches the file to its new copy: no write is under way.
    pub fn exclusive(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.gate.write()
    }

    /// Held shared by writers and by opens while they register, so a move's switch
    /// waits for them.
    pub fn shared(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.gate.read()
    }

    /// The descriptors of the handles open on the file.
    pub fn handles(&self) -> Vec<RawFd> {
        self.handles.lock().clone()
    }
}

/// A file's entry together with its device's and the export's counters, so one call
/// updates all three.
#[derive(Clone, Debug)]
pub struct FileIo {
    entry: Arc<FileEntry>,
    export: Arc<IoStats>,
    devices: Arc<Vec<IoStats>>,
}

impl FileIo {
    fn device(&self) -> Option<&IoStats> {
        self.devices.get(self.entry.device() as usize)
    }

    /// Records a read on the file, its device and the export.
    pub fn read(&self, bytes: u64, took: Duration) {
        self.entry.stats.read(bytes, took);
        self.export.read(bytes, took);
        if let Some(d) = self.device() {
            d.read(bytes, took);
        }
    }

    /// Records a write on the file, its device and the export.
    pub fn write(&self, bytes: u64, took: Duration) {
        self.entry.stats.write(bytes, took);
        self.export.write(bytes, took);
        if let Some(d) = self.device() {
            d.write(bytes, took);
        }
    }

    /// Held while writing through a handle, so that a move never switches the file
    /// under a write.
    pub fn writing(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.entry.shared()
    }

    /// The file's entry.
    pub fn entry(&self) -> &Arc<FileEntry> {
        &self.entry
    }

    /// Records a handle's descriptor, for moves.
    pub fn register(&self, fd: RawFd) {
        self.entry.handles.lock().push(fd);
    }

    /// Forgets a handle's descriptor.
    pub fn unregister(&self, fd: RawFd) {
        self.entry.handles.lock().retain(|&f| f != fd);
    }
}

/// Operation codes are 16 bits, but the table uses only the low byte.
const OP_SLOTS: usize = 256;

/// All counters of one export.
pub struct Counters {
    export: Arc<IoStats>,
    devices: Arc<Vec<IoStats>>,
    files: Mutex<HashMap<String, Arc<FileEntry>>>,
    op_count: Vec<AtomicU64>,
    op_ns: Vec<AtomicU64>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters::new(1)
    }
}

/// The counters as saved across restarts (operation counts are not: they describe the
/// server's own run).
#[derive(Default, Serialize, Deserialize)]
struct Saved {
    export: SavedIo,
    devices: Vec<SavedIo>,
    files: HashMap<String, (u32, SavedIo)>,
}

impl Counters {
    /// Counters for an export of `devices` devices.
    pub fn new(devices: usize) -> Counters {
        Counters {
            export: Arc::default(),
            devices: Arc::new((0..devices.max(1)).map(|_| IoStats::default()).collect()),
            files: Mutex::default(),
            op_count: (0..OP_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            op_ns: (0..OP_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn io(&self, entry: Arc<FileEntry>) -> FileIo {
        FileIo { entry, export: self.export.clone(), devices: self.devices.clone() }
    }

    /// The counters of the file at `path` (relative to the export root).
    pub fn file(&self, path: &str) -> FileIo {
        let mut files = self.files.lock();
        let entry = match files.get(path) {
            Some(f) => f.clone(),
            None => files.entry(path.to_string()).or_default().clone(),
        };
        self.io(entry)
    }

    /// The counters of the file at `path`, whose content is on `device`.
    pub fn file_on(&self, path: &str, device: u32) -> FileIo {
        let io = self.file(path);
        io.entry.set_device(device);
        io
    }

    /// The entry of `path`, if it has one.
    pub fn entry(&self, path: &str) -> Option<Arc<FileEntry>> {
        self.files.lock().get(path).cloned()
    }

    /// Keeps a file's counters under its new name, and, for a directory, those of
    /// everything beneath it (which takes a pass over every entry).
    pub fn renamed(&self, from: &str, to: &str, directory: bool) {
        let mut files = self.files.lock();
        if let Some(c) = files.remove(from) {
            files.insert(to.to_string(), c);
        }
        if !directory {
            return;
        }
        let prefix = format!("{from}/");
        let under: Vec<String> = files.keys().filter(|k| k.starts_with(&prefix)).cloned().collect();
        for old in under {
            let c = files.remove(&old).expect("listed");
            files.insert(format!("{to}/{}", &old[prefix.len()..]), c);
        }
    }

    /// Forgets a removed file.
    pub fn removed(&self, path: &str) {
        self.files.lock().remove(path);
    }

    /// Records one operation by code and service time.
    pub fn op(&self, code: u16, took: Duration) {
        let slot = code as usize % OP_SLOTS;
        self.op_count[slot].fetch_add(1, Relaxed);
        self.op_ns[slot].fetch_add(took.as_nanos() as u64, Relaxed);
    }

    /// The export totals.
    pub fn export(&self) -> IoCounters {
        self.export.snapshot()
    }

    /// The totals of each device, in order.
    pub fn devices(&self) -> Vec<IoCounters> {
        self.devices.iter().map(IoStats::snapshot).collect()
    }

    /// Counts of every operation that has run at least once.
    pub fn ops(&self) -> Vec<OpStats> {
        locus_proto::OPERATIONS
            .iter()
            .filter_map(|o| {
                let slot = o.code as usize % OP_SLOTS;
                let count = self.op_count[slot].load(Relaxed);
                (count > 0).then(|| OpStats { op: o.name.to_string(), count, total_ns: self.op_ns[slot].load(Relaxed) })
            })
            .collect()
    }

    /// Every file with counters.
    pub fn all(&self) -> Vec<FileStats> {
        self.files
            .lock()
            .iter()
            .map(|(path, e)| FileStats { path: path.clone(), device: e.device(), io: e.stats.snapshot() })
            .collect()
    }

    /// The `top` files with the most load ([`IoCounters::load`]).
    pub fn busiest(&self, top: usize) -> Vec<FileStats> {
        let mut all = self.all();
        all.sort_by(|a, b| b.io.load().cmp(&a.io.load()).then_with(|| a.path.cmp(&b.path)));
        all.truncate(top);
        all
    }

    /// Writes the counters to `path` (through a temporary file and a rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let saved = Saved {
            export: self.export.save(),
            devices: self.devices.iter().map(IoStats::save).collect(),
            files: self.files.lock().iter().map(|(p, e)| (p.clone(), (e.device(), e.stats.save()))).collect(),
        };
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(&saved).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, path)
    }

    /// Adds what `save` wrote to `path`, if anything (a missing or damaged file is
    /// skipped: accounting starts over rather than the server not starting).
    pub fn restore(&self, path: &Path) {
        let Ok(bytes) = std::fs::read(path) else { return };
        let saved: Saved = match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{}: not restored: {e}", path.display());
                return;
            }
        };
        self.export.restore(&saved.export);
        for (d, s) in self.devices.iter().zip(&saved.devices) {
            d.restore(s);
        }
        let mut files = self.files.lock();
        for (p, (device, io)) in saved.files {
            let entry = FileEntry::default();
            entry.stats.restore(&io);
            entry.set_device(device.min(self.devices.len() as u32 - 1));
            files.insert(p, Arc::new(entry));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busiest_orders_by_load_and_follows_renames() {
        let c = Counters::default();
        c.file("a").read(10, Duration::from_micros(1));
        c.file("b").write(100_000, Duration::from_micros(1));
        c.renamed("b", "c", false);
        let top = c.busiest(5);
        assert_eq!(top[0].path, "c");
        assert_eq!(top[0].io.write_bytes, 100_000);
        assert_eq!(top[1].path, "a");
        assert_eq!(c.export().read_bytes + c.export().write_bytes, 100_010);
        c.removed("a");
        assert_eq!(c.busiest(5).len(), 1);
        c.file("d/e").read(1, Duration::ZERO);
        c.renamed("d", "f", true);
        assert!(c.entry("f/e").is_some() && c.entry("d/e").is_none(), "a directory's files follow it");
    }

    #[test]
    fn p99_comes_from_the_slowest_percent() {
        let h = Histogram::default();
        assert_eq!(h.p99(), 0);
        for _ in 0..990 {
            h.add(3_000); // 3 µs: bucket under 4 µs
        }
        for _ in 0..10 {
            h.add(5_000_000); // 5 ms
        }
        assert_eq!(h.p99(), 4096, "99% are under 4 µs");
        h.add(5_000_000);
        assert!(h.p99() >= 5_000_000 && h.p99() < 10_000_000, "{}", h.p99());
    }

    #[test]
    fn counters_survive_a_save_and_a_restore_on_their_devices() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("accounts.json");
        let c = Counters::new(2);
        c.file_on("x", 1).read(4096, Duration::from_micros(50));
        c.file("y").write(10, Duration::from_micros(5));
        c.save(&path).unwrap();
        let back = Counters::new(2);
        back.restore(&path);
        assert_eq!(back.export(), c.export());
        assert_eq!(back.devices(), c.devices());
        assert_eq!(back.devices()[1].read_bytes, 4096);
        let mut files = back.all();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        assert_eq!(files, {
            let mut f = c.all();
            f.sort_by(|a, b| a.path.cmp(&b.path));
            f
        });
        assert_eq!(files[0].device, 1);
        std::fs::write(&path, b"{broken").unwrap();
        Counters::new(2).restore(&path); // skipped, not a panic
    }
}
