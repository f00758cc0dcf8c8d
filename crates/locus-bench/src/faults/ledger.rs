//! What a scenario wrote and was told: every write's content (from a seeded generator)
//! and whether it was acknowledged, checked against what the server holds afterwards.

use crate::faults::RunOutcome;
use crate::BenchError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

// ---------------------------------------------------------------------------------
// Deterministic data and the ledger

/// SplitMix64: seeded, varied, reproducible.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(super) fn range_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// `len` bytes determined by `seed`.
pub(super) fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&r.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

pub(super) fn hash(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A size: mostly small, some medium, a few large (up to `max`).
pub(super) fn size(r: &mut Rng, max: usize) -> usize {
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
    pub(super) file: Mutex<std::fs::File>,
    pub(super) next: AtomicU64,
    pub(super) seed: u64,
}

/// One version tried under a path: None for a removal.
pub(super) struct Tried {
    pub(super) vid: u64,
    pub(super) body: Option<(u64, String, u64)>,
    pub(super) acked: bool,
}

impl Ledger {
    pub(super) fn create(path: &Path, seed: u64) -> Result<Ledger, BenchError> {
        let file = std::fs::File::create(path).map_err(|e| BenchError::io("ledger", e))?;
        Ok(Ledger { file: Mutex::new(file), next: AtomicU64::new(1), seed })
    }

    pub(super) fn line(&self, l: String) {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(l.as_bytes());
    }

    /// A new version of `path` (its contents made from a seed), recorded as tried;
    /// answers its id and bytes.
    pub(super) fn attempt(&self, path: &str, len: usize) -> (u64, Vec<u8>) {
        let vid = self.next.fetch_add(1, Ordering::Relaxed);
        let seed = self.seed.wrapping_mul(1_000_003).wrapping_add(vid);
        let data = content(seed, len);
        self.line(format!("try {path} {vid} {len} {} {seed}\n", hash(&data)));
        (vid, data)
    }

    /// A removal of `path` (as the source of a rename), recorded as tried.
    pub(super) fn attempt_removal(&self, path: &str) -> u64 {
        let vid = self.next.fetch_add(1, Ordering::Relaxed);
        self.line(format!("try {path} {vid} - - -\n"));
        vid
    }

    /// The version is now acknowledged (or, on an afs mount, kept).
    pub(super) fn ack(&self, path: &str, vid: u64) {
        self.line(format!("ack {path} {vid}\n"));
    }

    /// Reads a ledger file back: each path's versions in the order tried.
    pub(super) fn read(path: &Path) -> Result<BTreeMap<String, Vec<Tried>>, BenchError> {
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
pub(super) enum Seen {
    Absent,
    Bytes(Vec<u8>),
    Unreadable(String),
}

/// Compares the system's state with the ledger. `read` answers a path's state;
/// `listed` is every name in the workload's directories (paths), if it can be listed.
pub(super) fn check(
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

pub(super) fn note(out: &mut RunOutcome, s: String) {
    if out.notes.len() < 8 {
        out.notes.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

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
