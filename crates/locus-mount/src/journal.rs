//! The write-back journal: what a mount has written that the server does not have yet,
//! kept on local disk so that neither a killed mount nor a failed store loses it.
//!
//! Each mount owns a directory `m-PID-N` in the cache directory, locked (`flock`) for
//! its life. An unsaved copy is a named file `N.data` there, and its record `N.rec`
//! names the mount (its URL), the remote path, and the server's version the writes
//! were based on (size and modification time; none for a file made here), written to a
//! temporary name and renamed into place, so a record is whole or absent. The record
//! goes once the server has the copy. Nothing is synced to the local disk on the way
//! (a sync costs more than a small file's whole store): a killed mount loses nothing,
//! since the files are in the kernel's cache; a copy that must outlive a failed store
//! or the mount is synced then ([`sync`]), record, bytes and directory. A mount that starts finds the
//! directories whose lock is free (their mount is gone) and takes over the records
//! made for its own URL ([`Journal::orphans`]); files without a record there are clean
//! copies, and go.

use locus_drivers::Time;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The first line of every record, naming its format.
const MAGIC: &str = "locus-writeback 1";

/// What one record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The URL of the mount that wrote it: only a mount of the same URL stores it.
    pub origin: String,
    /// The file's path at the server.
    pub path: String,
    /// The server's size and modification time the writes were based on; `None` for a
    /// file made by the mount, which the server did not have.
    pub base: Option<(u64, Time)>,
    /// The permission bits to store the file with.
    pub mode: u32,
}

/// One mount's own journal directory.
pub struct Journal {
    dir: PathBuf,
    /// Held locked while the mount lives: a mount that starts leaves this directory alone.
    _lock: File,
    origin: String,
    next: u64,
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: true when the lock was taken.
fn try_lock(file: &File) -> bool {
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Whether `path` is this user's own: a real directory or file (no symbolic link),
/// owned by the effective user.
fn owned(path: &Path, dir: bool) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        m.uid() == me && if dir { m.file_type().is_dir() } else { m.file_type().is_file() }
    })
}

/// Makes `cache_dir` (0700) if it is missing, and refuses one that is not this user's
/// own or that others may read or write into: unsaved copies are the user's data, and
/// a planted record would be uploaded by the next mount.
pub fn private_dir(cache_dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(cache_dir)?;
    if !owned(cache_dir, true) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: the write-back cache must be a directory of your own", cache_dir.display()),
        ));
    }
    let mode = std::fs::metadata(cache_dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(cache_dir, std::fs::Permissions::from_mode(mode & 0o700))?;
    }
    Ok(())
}

/// Opens (making it 0600 if missing) a file that must not be a symbolic link.
fn open_private(path: &Path, create_new: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = File::options();
    o.read(true).write(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
    if create_new {
        o.create_new(true);
    } else {
        o.create(true).truncate(false);
    }
    o.open(path)
}

impl Journal {
    /// Makes this mount's directory in `cache_dir`, locked, for records of `origin`.
    pub fn open(cache_dir: &Path, origin: &str) -> io::Result<Journal> {
        use std::os::unix::fs::DirBuilderExt;
        private_dir(cache_dir)?;
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        // A directory left by an earlier process of the same id is not taken: its
        // records are for a later mount to find.
        let dir = loop {
            let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = cache_dir.join(format!("m-{}-{made}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        };
        let lock = open_private(&dir.join("lock"), false)?;
        if !try_lock(&lock) {
            return Err(io::Error::other(format!("{}: locked by another mount", dir.display())));
        }
        Ok(Journal { dir, _lock: lock, origin: origin.to_string(), next: 0 })
    }

    /// The mount's own directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new named file for a copy's bytes.
    pub fn data_file(&mut self) -> io::Result<(File, PathBuf)> {
        loop {
            let name = self.dir.join(format!("{}.data", self.next));
            self.next += 1;
            match open_private(&name, true) {
                Ok(file) => return Ok((file, name)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes the record of the copy in `data` (path, base, mode), atomically.
    pub fn record(&self, data: &Path, path: &str, base: Option<(u64, Time)>, mode: u32) -> io::Result<()> {
        let record = Record { origin: self.origin.clone(), path: path.to_string(), base, mode };
        write_record(data, &record)
    }
}

impl Drop for Journal {
    /// A mount that goes with nothing unsaved leaves no directory behind.
    fn drop(&mut self) {
        let empty =
            std::fs::read_dir(&self.dir).is_ok_and(|d| d.filter_map(|e| e.ok()).all(|e| e.file_name() == "lock"));
        if empty {
            let _ = std::fs::remove_file(self.dir.join("lock"));
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// The record file of the copy held in `data`.
pub fn record_path(data: &Path) -> PathBuf {
    data.with_extension("rec")
}

/// Writes `record` for `data` atomically: a temporary file, renamed.
pub fn write_record(data: &Path, record: &Record) -> io::Result<()> {
    let tmp = data.with_extension("rec.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = open_private(&tmp, true)?;
    f.write_all(encode(record).as_bytes())?;
    std::fs::rename(&tmp, record_path(data))
}

/// Removes the record of the copy in `data` (the server has it, or it no longer
/// stands for a file).
pub fn forget_record(data: &Path) {
    let _ = std::fs::remove_file(record_path(data));
}

/// Makes sure a copy kept past its close is on the local disk: its bytes, its record
/// and the directory holding them.
pub fn sync(file: &File, data: &Path) {
    let _ = file.sync_data();
    if let Ok(record) = File::open(record_path(data)) {
        let _ = record.sync_data();
    }
    if let Some(dir) = data.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// The records of a mount that is gone (its directory's lock was free), taken over by
/// a mount of the same origin; its lock is held while this lives.
pub struct Orphans {
    pub dir: PathBuf,
    _lock: File,
    /// Each record with the file holding its copy's bytes.
    pub records: Vec<(Record, PathBuf)>,
}

impl Orphans {
    /// Removes the directory if nothing in it is still to be stored.
    pub fn tidy(self) {
        let rest = std::fs::read_dir(&self.dir)
            .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.file_name() != "lock").count())
            .unwrap_or(1);
        if rest == 0 {
            let _ = std::fs::remove_file(self.dir.join("lock"));
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// The journals in `cache_dir` of mounts that are gone, with the records they hold for
/// `origin` (files there without a record, or with a torn one, are clean copies and
/// temporaries: they are removed). `own` is the caller's directory, skipped.
pub fn orphans(cache_dir: &Path, origin: &str, own: &Path) -> Vec<Orphans> {
    if let Err(e) = private_dir(cache_dir) {
        tracing::warn!("unsaved copies not recovered: {e}");
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(cache_dir) else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let dir = entry.path();
        let is_journal = entry.file_name().to_str().is_some_and(|n| n.starts_with("m-"));
        if !is_journal || dir == own || !owned(&dir, true) {
            continue;
        }
        let Ok(lock) = open_private(&dir.join("lock"), false) else {
            continue;
        };
        if !try_lock(&lock) {
            continue; // a live mount's
        }
        let mut records = Vec::new();
        let names: Vec<PathBuf> =
            std::fs::read_dir(&dir).map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect()).unwrap_or_default();
        for name in &names {
            match name.extension().and_then(|e| e.to_str()) {
                // Only this user's own regular files: nothing planted, nothing linked.
                Some("data") if owned(name, false) => {
                    let rec = record_path(name);
                    let record = owned(&rec, false)
                        .then(|| std::fs::read_to_string(&rec).ok().and_then(|t| decode(&t)))
                        .flatten();
                    match record {
                        Some(r) if r.origin == origin => records.push((r, name.clone())),
                        Some(_) => {} // another server's: left for a mount of it
                        None => {
                            let _ = std::fs::remove_file(name);
                            let _ = std::fs::remove_file(record_path(name));
                        }
                    }
                }
                Some("tmp") => drop(std::fs::remove_file(name)),
                Some("rec") if !name.with_extension("data").exists() => drop(std::fs::remove_file(name)),
                _ => {}
            }
        }
        found.push(Orphans { dir, _lock: lock, records });
    }
    found
}

/// `s` with `%`, controls and spaces as `%XX`, so a record is lines of words.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b == b'%' || b <= b' ' || b == 0x7f {
            out.push_str(&format!("%{b:02x}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn encode(r: &Record) -> String {
    let base = match r.base {
        Some((size, t)) => format!("{size} {} {}", t.sec, t.nsec),
        None => "none".into(),
    };
    format!("{MAGIC}\norigin {}\npath {}\nbase {base}\nmode {:o}\nend\n", escape(&r.origin), escape(&r.path), r.mode)
}

/// A record, or `None` when it is not whole (`end` is its last line).
fn decode(text: &str) -> Option<Record> {
    let mut lines = text.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let mut field = |name: &str| lines.next()?.strip_prefix(name)?.strip_prefix(' ').map(str::to_string);
    let origin = unescape(&field("origin")?)?;
    let path = unescape(&field("path")?)?;
    let base = field("base")?;
    let mode = u32::from_str_radix(&field("mode")?, 8).ok()?;
    if lines.next()? != "end" {
        return None;
    }
    let base = match base.as_str() {
        "none" => None,
        b => {
            let mut w = b.split(' ').map(str::parse::<i64>);
            let (size, sec, nsec) = (w.next()?.ok()?, w.next()?.ok()?, w.next()?.ok()?);
            Some((size as u64, Time { sec, nsec: nsec as u32 }))
        }
    };
    Some(Record { origin, path, base, mode })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsaved_copies_are_private_and_planted_records_are_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let cache = tempfile::tempdir().unwrap();
        let dir = cache.path().join("wb");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut j = Journal::open(&dir, "locus://h:1/").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "the cache directory is made private");
        assert_eq!(mode(j.dir()), 0o700);
        let (_f, data) = j.data_file().unwrap();
        j.record(&data, "/x", None, 0o644).unwrap();
        assert_eq!(mode(&data), 0o600);
        assert_eq!(mode(&record_path(&data)), 0o600);
        // A dead mount's journal whose data is a symbolic link (to a secret) is not taken.
        let planted = dir.join("m-1-0");
        std::fs::create_dir(&planted).unwrap();
        std::fs::write(cache.path().join("secret"), b"key").unwrap();
        std::os::unix::fs::symlink(cache.path().join("secret"), planted.join("0.data")).unwrap();
        write_record(
            &planted.join("0.data"),
            &Record { origin: "locus://h:1/".into(), path: "/stolen".into(), base: None, mode: 0o644 },
        )
        .unwrap();
        let found = orphans(&dir, "locus://h:1/", j.dir());
        assert!(found.iter().all(|o| o.records.is_empty()), "a linked copy was taken for recovery");
    }

    #[test]
    fn records_read_back_and_a_dead_mounts_journal_is_found_by_its_origin_only() {
        let cache = tempfile::tempdir().unwrap();
        let r = Record {
            origin: "locus://h:1/d".into(),
            path: "/d/a b%\nc".into(),
            base: Some((5, Time { sec: 7, nsec: 9 })),
            mode: 0o640,
        };
        assert_eq!(decode(&encode(&r)), Some(r.clone()));
        let made = Record { base: None, ..r.clone() };
        assert_eq!(decode(&encode(&made)), Some(made));
        assert_eq!(decode(&encode(&r).replace("end\n", "")), None, "a torn record is no record");

        let mut j = Journal::open(cache.path(), "locus://h:1/d").unwrap();
        let (mut f, data) = j.data_file().unwrap();
        f.write_all(b"unsaved").unwrap();
        j.record(&data, "/d/x", None, 0o644).unwrap();
        let (_, clean) = j.data_file().unwrap();
        let own = j.dir().to_path_buf();
        // While the mount lives its journal is not anyone's to take.
        let other = cache.path().join("elsewhere");
        assert!(orphans(cache.path(), "locus://h:1/d", &other).iter().all(|o| o.records.is_empty()));
        drop(j);
        let found = orphans(cache.path(), "locus://other:1/d", &other);
        assert!(found.iter().all(|o| o.records.is_empty()), "another origin's records are not taken");
        assert!(data.exists() && !clean.exists(), "a copy without a record is clean: it goes");
        drop(found); // its lock, held while the records are handled
        let found = orphans(cache.path(), "locus://h:1/d", &other);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].dir, own);
        assert_eq!(found[0].records[0].0.path, "/d/x");
        assert_eq!(std::fs::read(&found[0].records[0].1).unwrap(), b"unsaved");
    }
}
