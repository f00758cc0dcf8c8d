//! Whole-file copies on local disk, for `--consistency afs`: a file opened for writing
//! is written here and stored at the server in one round trip when it is closed or
//! synced; a copy stored and not changed since answers later opens of the file without
//! fetching it again, while the server's callback says it is current.
//!
//! A clean copy of up to [`IN_MEMORY`] bytes is kept in memory (making a file costs more
//! than a small file's whole round trip on some disks); a larger one is a file in the
//! mount's journal directory. A copy with writes the server does not have yet is always
//! such a named file, with a record in the [`journal`](crate::journal) naming its remote
//! path and the server's version it was based on, until the server has it: a killed
//! mount or a failed store leaves it there, and the next mount stores it.
//! Copies are bounded in total size: clean copies no handle uses go first, least
//! recently used first; unsaved bytes are bounded too ([`Refused::Full`]). A file that
//! would outgrow [`Copies::file_max`] leaves the cache and is written through (the
//! mount "spills" it).

use crate::journal::{self, Journal};
use locus_drivers::{Attr, Time};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The largest clean copy kept in memory rather than in the cache directory.
pub const IN_MEMORY: u64 = 256 << 10;

/// Where a copy's bytes are.
enum Bytes {
    Memory(Vec<u8>),
    /// A file in the journal directory, removed with the copy unless it holds writes
    /// the server does not have.
    Disk(File, PathBuf),
}

/// The journal record a copy with unsaved writes has: the remote path it names, and
/// the server's version (size, modification time) the writes were based on.
#[derive(Clone)]
pub struct Unsaved {
    pub path: String,
    pub base: Option<(u64, Time)>,
}

/// One file's local copy.
pub struct LocalCopy {
    bytes: Bytes,
    /// What the file is: the server's attributes when fetched or stored, with the size
    /// and modification time of the local writes since.
    pub attr: Attr,
    /// Written (or truncated) since it was last stored.
    pub dirty: bool,
    /// The name exists at the server (false for a create not stored yet).
    pub at_server: bool,
    /// The server has what the copy holds on its disk (stored with `fsync`'s promise,
    /// or fetched), not only in its memory.
    pub durable: bool,
    /// The name was removed while the copy was open: nothing is stored again.
    pub unlinked: bool,
    /// Handles the kernel holds on it.
    pub handles: usize,
    /// Its journal record, while it has writes the server lacks.
    pub unsaved: Option<Unsaved>,
    /// The mount holds a lookup of its inode while it is unsaved, so that its path
    /// stays known (and follows renames) until it is stored.
    pub pinned: bool,
    /// When its last store failed, if it did since it was last stored.
    pub failed: Option<std::time::Instant>,
    /// When last used, by the cache's clock (for eviction).
    used: u64,
}

impl LocalCopy {
    /// Reads up to `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(len as u64).min(self.attr.size);
        let range = offset.min(end) as usize..end as usize;
        match &self.bytes {
            Bytes::Memory(data) => Ok(data.get(range).unwrap_or_default().to_vec()),
            Bytes::Disk(file, _) => {
                let mut buf = vec![0; range.len()];
                file.read_exact_at(&mut buf, offset)?;
                Ok(buf)
            }
        }
    }

    /// The whole content, to store it.
    pub fn contents(&self) -> io::Result<Vec<u8>> {
        self.read(0, u32::MAX).and_then(|data| {
            if data.len() as u64 == self.attr.size {
                Ok(data)
            } else {
                Err(io::Error::other("local copy larger than 4 GiB"))
            }
        })
    }

    /// True when the copy is what the server has, by its size and modification time.
    pub fn current(&self, attr: &Attr) -> bool {
        !self.dirty && self.at_server && (self.attr.size, self.attr.mtime) == (attr.size, attr.mtime)
    }

    /// The file holding its bytes, if on disk.
    pub fn data_file(&self) -> Option<&Path> {
        match &self.bytes {
            Bytes::Disk(_, name) => Some(name),
            Bytes::Memory(_) => None,
        }
    }

    /// The bytes it takes: in all, in memory, and not yet stored.
    fn weight(&self) -> (u64, u64, u64) {
        let unsaved = if self.unsaved.is_some() { self.attr.size } else { 0 };
        match &self.bytes {
            Bytes::Memory(held) => (self.attr.size, held.len() as u64, unsaved),
            Bytes::Disk(..) => (self.attr.size, 0, unsaved),
        }
    }

    /// A local change: the copy is now `size` bytes, modified now.
    fn touched(&mut self, size: u64) {
        self.attr.size = size;
        self.attr.blocks = size.div_ceil(512);
        self.attr.mtime = now();
        self.attr.ctime = self.attr.mtime;
        self.dirty = true;
    }
}

impl Drop for LocalCopy {
    /// A copy's file goes with it, unless it holds writes the server does not have
    /// (its record then says where they belong, for the next mount).
    fn drop(&mut self) {
        if let (Bytes::Disk(_, name), true) = (&self.bytes, self.unsaved.is_none() || self.unlinked) {
            journal::forget_record(name);
            let _ = std::fs::remove_file(name);
        }
    }
}

/// The time now, as the protocol gives times.
pub fn now() -> Time {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

/// The copies of one mount, by inode.
pub struct Copies {
    limit: u64,
    /// (Before the journal: fields drop in order, and the journal's directory goes
    /// with it only once the clean copies' files have.)
    copies: HashMap<u64, LocalCopy>,
    clock: u64,
    /// The copies' bytes in all, those held in memory, and those not yet stored.
    total: u64,
    in_memory: u64,
    unsaved: u64,
    journal: Journal,
}

/// The most bytes of copies held in memory (the mount's own memory): beyond, clean idle
/// copies are dropped as when the cache is full.
pub const MEMORY_LIMIT: u64 = 64 << 20;

/// Why a write did not go into the local copy.
pub enum Refused {
    /// The file would be larger than a copy may be: store it and write through.
    TooLarge,
    /// The unsaved bytes of all copies would pass the cache's limit: store some first.
    Full,
    Io(io::Error),
}

impl Copies {
    /// Copies in a journal directory of this mount's own in `dir` (made if missing), at
    /// most `limit` bytes in all, for the mount of `origin` (its URL).
    pub fn new(dir: &Path, limit: u64, origin: &str) -> io::Result<Copies> {
        let journal = Journal::open(dir, origin)?;
        Ok(Copies { journal, limit, copies: HashMap::new(), clock: 0, total: 0, in_memory: 0, unsaved: 0 })
    }

    /// The mount's own journal directory.
    pub fn journal_dir(&self) -> &Path {
        self.journal.dir()
    }

    /// The largest file kept as a copy: an eighth of the cache, so that a few open
    /// files fit beside the clean ones.
    pub fn file_max(&self) -> u64 {
        self.limit / 8
    }

    /// The bytes of copies not yet stored.
    #[cfg(test)]
    pub fn unsaved_bytes(&self) -> u64 {
        self.unsaved
    }

    /// The copy of `ino`, marked as used now.
    pub fn get(&mut self, ino: u64) -> Option<&mut LocalCopy> {
        self.clock += 1;
        let copy = self.copies.get_mut(&ino)?;
        copy.used = self.clock;
        Some(copy)
    }

    /// The copy of `ino`, if it has one and the local writes are not yet stored (what
    /// the file is then is the copy, not the server's answer).
    pub fn dirty(&self, ino: u64) -> Option<&LocalCopy> {
        self.copies.get(&ino).filter(|c| c.dirty || !c.at_server)
    }

    /// Starts a copy of `ino` holding `content`, described by `attr`; a copy of a file
    /// the server does not have (`!at_server`) is journaled at once under `path`.
    pub fn start(
        &mut self,
        ino: u64,
        path: &str,
        content: &[u8],
        attr: Attr,
        at_server: bool,
    ) -> io::Result<&mut LocalCopy> {
        let bytes = match content.len() as u64 <= IN_MEMORY && at_server {
            true => Bytes::Memory(content.to_vec()),
            false => {
                let (file, name) = self.journal.data_file()?;
                file.write_all_at(content, 0)?;
                Bytes::Disk(file, name)
            }
        };
        self.clock += 1;
        let mut copy = LocalCopy {
            bytes,
            attr,
            dirty: !at_server,
            at_server,
            durable: at_server,
            unlinked: false,
            handles: 0,
            unsaved: None,
            pinned: false,
            failed: None,
            used: self.clock,
        };
        if !at_server {
            record(&self.journal, &mut copy, path)?;
        }
        self.remove(ino);
        let w = copy.weight();
        self.reweigh((0, 0, 0), w);
        self.copies.insert(ino, copy);
        self.make_room(ino);
        Ok(self.copies.get_mut(&ino).expect("make_room keeps it"))
    }

    /// Writes `data` at `offset` (at the end for `append`) into the copy of `ino`, whose
    /// path is `path`; answers the new size.
    pub fn write(&mut self, ino: u64, path: &str, offset: u64, data: &[u8], append: bool) -> Result<u64, Refused> {
        let max = self.file_max();
        let copy = self.copies.get(&ino).ok_or(Refused::Io(io::Error::other("no copy")))?;
        let at = if append { copy.attr.size } else { offset };
        let end = at.checked_add(data.len() as u64).filter(|&end| end <= max).ok_or(Refused::TooLarge)?;
        self.room_for(ino, end)?;
        self.journaled(ino, path).map_err(Refused::Io)?;
        let copy = self.copies.get_mut(&ino).expect("checked");
        let before = copy.weight();
        let written = write_into(copy, at, end, data);
        let (size, after) = (copy.attr.size, copy.weight());
        self.reweigh(before, after);
        written?;
        self.make_room(ino);
        Ok(size)
    }

    /// Sets the size of the copy of `ino`, whose path is `path`.
    pub fn truncate(&mut self, ino: u64, path: &str, size: u64) -> Result<(), Refused> {
        if size > self.file_max() {
            return Err(Refused::TooLarge);
        }
        self.room_for(ino, size)?;
        self.journaled(ino, path).map_err(Refused::Io)?;
        let copy = self.copies.get_mut(&ino).ok_or(Refused::Io(io::Error::other("no copy")))?;
        let before = copy.weight();
        let result = match &mut copy.bytes {
            Bytes::Disk(file, _) => file.set_len(size),
            Bytes::Memory(_) => Err(io::Error::other("an unsaved copy is on disk")),
        };
        if result.is_ok() {
            copy.touched(size);
        }
        let after = copy.weight();
        self.reweigh(before, after);
        result.map_err(Refused::Io)
    }

    /// Refuses a change that would leave the copy of `ino` `size` bytes long when the
    /// unsaved bytes would then pass the limit.
    fn room_for(&self, ino: u64, size: u64) -> Result<(), Refused> {
        let Some(copy) = self.copies.get(&ino) else { return Ok(()) };
        let now = if copy.unsaved.is_some() { copy.attr.size } else { 0 };
        let grows = size.max(copy.attr.size) > now;
        if grows && self.unsaved - now + size.max(copy.attr.size) > self.limit {
            return Err(Refused::Full);
        }
        Ok(())
    }

    /// Makes sure the copy of `ino` is a named file with a journal record naming `path`,
    /// before a local write changes it.
    fn journaled(&mut self, ino: u64, path: &str) -> io::Result<()> {
        let copy = self.copies.get_mut(&ino).ok_or(io::Error::other("no copy"))?;
        if copy.unsaved.is_some() {
            return Ok(());
        }
        let before = copy.weight();
        if let Bytes::Memory(held) = &copy.bytes {
            let (file, name) = self.journal.data_file()?;
            if let Err(e) = file.write_all_at(held, 0) {
                let _ = std::fs::remove_file(&name);
                return Err(e);
            }
            copy.bytes = Bytes::Disk(file, name);
        }
        // A removed file's copy is written on (its handles live on) but never stored.
        let recorded = if copy.unlinked { Ok(()) } else { record(&self.journal, copy, path) };
        let after = copy.weight();
        self.reweigh(before, after);
        recorded
    }

    /// The copy of `ino` is now at `path` (a directory above it was renamed): its
    /// record says so.
    pub fn moved(&mut self, ino: u64, path: &str) {
        let Some(copy) = self.copies.get_mut(&ino) else { return };
        if copy.unsaved.as_ref().is_some_and(|u| u.path != path) {
            if let Err(e) = record(&self.journal, copy, path) {
                tracing::warn!("{path}: journal record not rewritten: {e}");
            }
        }
    }

    /// The server now holds exactly the copy of `ino`, whose attributes are `attr`, on
    /// its disk if `durable`: its record goes.
    pub fn stored(&mut self, ino: u64, attr: Attr, durable: bool) {
        let Some(copy) = self.copies.get_mut(&ino) else { return };
        let before = copy.weight();
        copy.attr = attr;
        copy.dirty = false;
        copy.at_server = true;
        copy.durable = durable;
        if copy.unsaved.take().is_some() {
            if let Some(name) = copy.data_file() {
                journal::forget_record(name);
            }
        }
        let after = copy.weight();
        self.reweigh(before, after);
    }

    /// The name of `ino`'s copy is gone: nothing is stored again, and its record goes.
    pub fn unlink(&mut self, ino: u64) {
        let Some(copy) = self.copies.get_mut(&ino) else { return };
        let before = copy.weight();
        copy.unlinked = true;
        if copy.unsaved.take().is_some() {
            if let Some(name) = copy.data_file() {
                journal::forget_record(name);
            }
        }
        let after = copy.weight();
        self.reweigh(before, after);
    }

    /// A copy whose store failed stays until a later one succeeds: its bytes and
    /// record are made durable on the local disk.
    pub fn keep(&mut self, ino: u64) {
        if let Some(LocalCopy { bytes: Bytes::Disk(file, name), .. }) = self.copies.get(&ino) {
            journal::sync(file, name);
        }
    }

    /// The files made here that the server does not have yet.
    pub fn unstored_names(&self) -> Vec<u64> {
        self.copies.iter().filter(|(_, c)| !c.at_server && !c.unlinked).map(|(&ino, _)| ino).collect()
    }

    /// The copies with writes the server does not have, by inode.
    pub fn unsaved(&self) -> Vec<u64> {
        self.copies.iter().filter(|(_, c)| c.unsaved.is_some()).map(|(&ino, _)| ino).collect()
    }

    /// Forgets the copy of `ino`.
    pub fn remove(&mut self, ino: u64) -> Option<LocalCopy> {
        let copy = self.copies.remove(&ino)?;
        self.reweigh(copy.weight(), (0, 0, 0));
        Some(copy)
    }

    /// A copy's weight went from `before` to `after` (bytes in all, in memory, unsaved).
    fn reweigh(&mut self, before: (u64, u64, u64), after: (u64, u64, u64)) {
        self.total = self.total - before.0 + after.0;
        self.in_memory = self.in_memory - before.1 + after.1;
        self.unsaved = self.unsaved - before.2 + after.2;
    }

    /// Drops clean copies no handle uses other than `keep`'s, least recently used first,
    /// until the copies fit the limit (copies being written stay: they leave by being
    /// stored).
    fn make_room(&mut self, keep: u64) {
        let full = |c: &Copies| c.total > c.limit || c.in_memory > MEMORY_LIMIT;
        if !full(self) {
            return;
        }
        let mut idle: Vec<(u64, u64)> = self
            .copies
            .iter()
            .filter(|(&ino, c)| ino != keep && c.handles == 0 && !c.dirty && c.at_server && c.unsaved.is_none())
            .map(|(&ino, c)| (c.used, ino))
            .collect();
        idle.sort_unstable();
        for (_, ino) in idle {
            if !full(self) {
                break;
            }
            self.remove(ino);
        }
    }
}

/// Writes the journal record of `copy` (on disk) as the file at `path`: based on the
/// server's version it was a copy of, or on none for a file made here.
fn record(journal: &Journal, copy: &mut LocalCopy, path: &str) -> io::Result<()> {
    let base = match &copy.unsaved {
        Some(u) => u.base,
        None => copy.at_server.then_some((copy.attr.size, copy.attr.mtime)),
    };
    let Bytes::Disk(_, name) = &copy.bytes else { return Err(io::Error::other("an unsaved copy is on disk")) };
    journal.record(name, path, base, copy.attr.mode & 0o7777)?;
    copy.unsaved = Some(Unsaved { path: path.to_string(), base });
    Ok(())
}

/// Writes `data` into `copy` (on disk) from `at` to `end`.
fn write_into(copy: &mut LocalCopy, at: u64, end: u64, data: &[u8]) -> Result<(), Refused> {
    match &mut copy.bytes {
        Bytes::Memory(_) => return Err(Refused::Io(io::Error::other("an unsaved copy is on disk"))),
        Bytes::Disk(file, _) => file.write_all_at(data, at).map_err(Refused::Io)?,
    }
    copy.touched(copy.attr.size.max(end));
    Ok(())
}

/// Where a mount keeps its copies by default: `$XDG_CACHE_HOME/locus/writeback`, else
/// `~/.cache/locus/writeback`, else `$XDG_RUNTIME_DIR/locus/writeback`, else a directory of the user's in the system's temporary
/// directory.
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|h| PathBuf::from(h).join(".cache")));
    // Without a home, the per-user runtime directory (private by design); `/tmp` last, where
    // `journal::private_dir` refuses a directory another user made first.
    let runtime = || std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()).map(PathBuf::from);
    match base.or_else(runtime) {
        Some(base) => base.join("locus").join("writeback"),
        None => std::env::temp_dir().join(format!("locus-writeback-{}", unsafe { libc::getuid() })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(size: u64) -> Attr {
        Attr { mode: locus_proto::types::S_IFREG | 0o644, nlink: 1, size, ..Attr::default() }
    }

    /// The names in `dir` ending in `ext`.
    fn files(dir: &Path, ext: &str) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|e| e == ext))
            .count()
    }

    #[test]
    fn writes_read_back_and_a_copy_never_outgrows_its_share() {
        let dir = tempfile::tempdir().unwrap();
        let mut copies = Copies::new(dir.path(), 800, "o").unwrap();
        let own = copies.journal_dir().to_path_buf();
        copies.start(1, "/f", b"hello", attr(5), true).unwrap();
        assert!(copies.dirty(1).is_none(), "a fetched copy is clean");
        assert_eq!(files(&own, "data"), 0, "a small clean copy is in memory");
        assert_eq!(copies.write(1, "/f", 5, b" world", false).ok(), Some(11));
        assert_eq!(copies.write(1, "/f", 0, b"!", true).ok(), Some(12), "append goes to the end");
        assert_eq!((files(&own, "data"), files(&own, "rec")), (1, 1), "an unsaved copy is a named file, journaled");
        let copy = copies.dirty(1).expect("written");
        assert_eq!(copy.contents().unwrap(), b"hello world!");
        assert_eq!(copy.read(6, 100).unwrap(), b"world!");
        assert_eq!(std::fs::read(copy.data_file().unwrap()).unwrap(), b"hello world!");
        assert!(matches!(copies.write(1, "/f", 100, b"x", false), Err(Refused::TooLarge)), "an eighth of 800 is 100");
        copies.truncate(1, "/f", 4).ok().unwrap();
        assert_eq!(copies.get(1).unwrap().contents().unwrap(), b"hell");
        copies.stored(1, attr(4), false);
        assert_eq!((files(&own, "data"), files(&own, "rec")), (1, 0), "stored: the record goes");
        copies.remove(1);
        assert_eq!(files(&own, "data"), 0, "a clean copy's file goes with it");
        // A file made here is journaled at once; removed, its record and file go.
        copies.start(2, "/new", b"", attr(0), false).unwrap();
        assert_eq!(files(&own, "rec"), 1);
        copies.unlink(2);
        copies.remove(2);
        assert_eq!((files(&own, "data"), files(&own, "rec")), (0, 0));
    }

    #[test]
    fn unsaved_bytes_are_bounded_and_an_unsaved_copy_outlives_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        let mut copies = Copies::new(dir.path(), 800, "o").unwrap();
        let own = copies.journal_dir().to_path_buf();
        for ino in 1..=8 {
            copies.start(ino, &format!("/f{ino}"), b"", attr(0), false).unwrap();
            assert!(copies.write(ino, &format!("/f{ino}"), 0, &[1; 100], false).is_ok(), "{ino}");
        }
        assert_eq!(copies.unsaved_bytes(), 800);
        assert!(matches!(copies.write(1, "/f1", 0, &[2; 100], false), Ok(100)), "rewriting in place adds nothing");
        assert!(matches!(copies.write(9, "/f9", 0, b"x", false), Err(Refused::Io(_))));
        copies.start(9, "/f9", b"", attr(0), false).unwrap();
        assert!(matches!(copies.write(9, "/f9", 0, b"x", false), Err(Refused::Full)), "past the limit: store first");
        copies.stored(3, attr(100), false);
        assert_eq!(copies.unsaved_bytes(), 700);
        assert!(copies.write(9, "/f9", 0, b"x", false).is_ok());
        // The mount goes without storing: the records and bytes stay for the next one.
        drop(copies);
        assert_eq!((files(&own, "rec"), files(&own, "data")), (8, 8));
        let found = crate::journal::orphans(dir.path(), "o", Path::new("/nowhere"));
        let mut paths: Vec<_> = found[0].records.iter().map(|(r, _)| r.path.clone()).collect();
        paths.sort();
        assert_eq!(paths, ["/f1", "/f2", "/f4", "/f5", "/f6", "/f7", "/f8", "/f9"]);
        assert_eq!(
            found[0].records.iter().find(|(r, _)| r.path == "/f1").map(|(_, d)| std::fs::read(d).unwrap()),
            Some(vec![2; 100])
        );
    }

    #[test]
    fn copies_in_memory_stay_under_their_own_limit_and_are_counted_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let mut copies = Copies::new(dir.path(), 1 << 40, "o").unwrap();
        let chunk = vec![7u8; IN_MEMORY as usize];
        for ino in 0..300 {
            copies.start(ino, "/f", &chunk, attr(IN_MEMORY), true).unwrap();
        }
        assert!(copies.in_memory <= MEMORY_LIMIT, "{} bytes in memory", copies.in_memory);
        assert_eq!(copies.in_memory, copies.copies.len() as u64 * IN_MEMORY);
        // Written (so on disk), shrunk, removed: the counts follow.
        let ino = *copies.copies.keys().next().unwrap();
        copies.write(ino, "/f", IN_MEMORY, b"more", false).ok().unwrap();
        assert_eq!(copies.total, copies.copies.values().map(|c| c.attr.size).sum::<u64>());
        assert_eq!(copies.unsaved, IN_MEMORY + 4);
        copies.truncate(ino, "/f", 10).ok().unwrap();
        assert_eq!(copies.unsaved, 10);
        copies.remove(ino);
        assert_eq!(copies.total, copies.copies.values().map(|c| c.attr.size).sum::<u64>());
        assert_eq!(copies.in_memory, copies.copies.len() as u64 * IN_MEMORY);
    }

    #[test]
    fn clean_idle_copies_make_room_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut copies = Copies::new(dir.path(), 800, "o").unwrap();
        for ino in 1..=3 {
            copies.start(ino, "/f", &[0; 100], attr(100), true).unwrap();
        }
        copies.start(4, "/g", &[0; 100], attr(100), false).unwrap(); // made here: dirty
        copies.get(1).unwrap().handles = 1; // in use
        copies.get(2); // 3 is now the least recently used
        for ino in 5..=9 {
            copies.start(ino, "/f", &[0; 100], attr(100), true).unwrap();
        }
        // 900 bytes asked for: one clean idle copy went, the least recently used.
        assert!(copies.get(3).is_none());
        for kept in [1, 2, 4, 5, 6, 7, 8, 9] {
            assert!(copies.get(kept).is_some(), "copy {kept}");
        }
    }
}
