//! Always-on I/O counters: per file, per export and per operation.
//!
//! They cost a few relaxed atomic adds per operation. An open handle holds its file's
//! counters directly, so reads and writes never look anything up. Lerna's accounting
//! and rebalancing build on this one place.

use locus_proto::types::{FileStats, IoCounters, OpStats};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Read and write counters of one file or of the whole export.
#[derive(Debug, Default)]
pub struct IoStats {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    read_ns: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    write_ns: AtomicU64,
}

impl IoStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Records one read of `bytes` that took `took`.
    pub fn read(&self, bytes: u64, took: Duration) {
        Self::add(&self.reads, 1);
        Self::add(&self.read_bytes, bytes);
        Self::add(&self.read_ns, took.as_nanos() as u64);
    }

    /// Records one write of `bytes` that took `took`.
    pub fn write(&self, bytes: u64, took: Duration) {
        Self::add(&self.writes, 1);
        Self::add(&self.write_bytes, bytes);
        Self::add(&self.write_ns, took.as_nanos() as u64);
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
        }
    }
}

/// A file's counters together with the export's, so one call updates both.
#[derive(Clone, Debug)]
pub struct FileIo {
    file: Arc<IoStats>,
    export: Arc<IoStats>,
}

impl FileIo {
    /// Records a read on the file and the export.
    pub fn read(&self, bytes: u64, took: Duration) {
        self.file.read(bytes, took);
        self.export.read(bytes, took);
    }

    /// Records a write on the file and the export.
    pub fn write(&self, bytes: u64, took: Duration) {
        self.file.write(bytes, took);
        self.export.write(bytes, took);
    }
}

/// Operation codes are 16 bits, but the table uses only the low byte.
const OP_SLOTS: usize = 256;

/// All counters of one export.
pub struct Counters {
    export: Arc<IoStats>,
    files: Mutex<HashMap<String, Arc<IoStats>>>,
    op_count: Vec<AtomicU64>,
    op_ns: Vec<AtomicU64>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            export: Arc::default(),
            files: Mutex::default(),
            op_count: (0..OP_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            op_ns: (0..OP_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Counters {
    /// The counters of the file at `path` (relative to the export root).
    pub fn file(&self, path: &str) -> FileIo {
        let mut files = self.files.lock();
        let file = match files.get(path) {
            Some(f) => f.clone(),
            None => files.entry(path.to_string()).or_default().clone(),
        };
        FileIo { file, export: self.export.clone() }
    }

    /// Keeps a file's counters under its new name.
    pub fn renamed(&self, from: &str, to: &str) {
        let mut files = self.files.lock();
        if let Some(c) = files.remove(from) {
            files.insert(to.to_string(), c);
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

    /// The `top` files with the most bytes moved (reads plus writes).
    pub fn busiest(&self, top: usize) -> Vec<FileStats> {
        let mut all: Vec<FileStats> =
            self.files.lock().iter().map(|(path, s)| FileStats { path: path.clone(), io: s.snapshot() }).collect();
        let load = |f: &FileStats| (f.io.read_bytes + f.io.write_bytes, f.io.reads + f.io.writes);
        all.sort_by(|a, b| load(b).cmp(&load(a)).then_with(|| a.path.cmp(&b.path)));
        all.truncate(top);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busiest_orders_by_bytes_and_follows_renames() {
        let c = Counters::default();
        c.file("a").read(10, Duration::from_micros(1));
        c.file("b").write(100, Duration::from_micros(1));
        c.renamed("b", "c");
        let top = c.busiest(5);
        assert_eq!(top[0].path, "c");
        assert_eq!(top[0].io.write_bytes, 100);
        assert_eq!(top[1].path, "a");
        assert_eq!(c.export().read_bytes + c.export().write_bytes, 110);
        c.removed("a");
        assert_eq!(c.busiest(5).len(), 1);
    }
}
