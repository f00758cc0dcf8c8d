//! Whole-file copies on local disk, for `--consistency afs`: a file opened for writing
//! is written here and stored at the server in one round trip when it is closed or
//! synced; a copy stored and not changed since answers later opens of the file without
//! fetching it again, while the server's callback says it is current.
//!
//! A copy of up to [`IN_MEMORY`] bytes is kept in memory (making a file costs more than a
//! small file's whole round trip on some disks); a larger one is an unnamed file in the
//! cache directory (created and unlinked at once, so a crash leaves nothing behind).
//! Copies are bounded in total size: clean copies no handle uses go
//! first, least recently used first. A file that would outgrow [`Copies::file_max`]
//! leaves the cache and is written through (the mount "spills" it).

use locus_drivers::{Attr, Time};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The largest copy kept in memory rather than in the cache directory.
pub const IN_MEMORY: u64 = 256 << 10;

/// Where a copy's bytes are.
enum Bytes {
    Memory(Vec<u8>),
    Disk(File),
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
            Bytes::Disk(file) => {
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

    /// The server now holds exactly this copy, whose attributes are `attr`, on its disk
    /// if `durable`.
    pub fn stored(&mut self, attr: Attr, durable: bool) {
        self.attr = attr;
        self.dirty = false;
        self.at_server = true;
        self.durable = durable;
    }

    /// True when the copy is what the server has, by its size and modification time.
    pub fn current(&self, attr: &Attr) -> bool {
        !self.dirty && self.at_server && (self.attr.size, self.attr.mtime) == (attr.size, attr.mtime)
    }

    /// The bytes it takes: in all, and in memory.
    fn weight(&self) -> (u64, u64) {
        match &self.bytes {
            Bytes::Memory(held) => (self.attr.size, held.len() as u64),
            Bytes::Disk(_) => (self.attr.size, 0),
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

/// The time now, as the protocol gives times.
pub fn now() -> Time {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

/// The copies of one mount, by inode.
pub struct Copies {
    dir: PathBuf,
    limit: u64,
    copies: HashMap<u64, LocalCopy>,
    clock: u64,
    /// The copies' bytes in all, and those held in memory.
    total: u64,
    in_memory: u64,
}

/// The most bytes of copies held in memory (the mount's own memory): beyond, clean idle
/// copies are dropped as when the cache is full.
pub const MEMORY_LIMIT: u64 = 64 << 20;

/// Why a write did not go into the local copy.
pub enum Refused {
    /// The file would be larger than a copy may be: store it and write through.
    TooLarge,
    Io(io::Error),
}

impl Copies {
    /// Copies in `dir` (made if missing), at most `limit` bytes in all.
    pub fn new(dir: &Path, limit: u64) -> io::Result<Copies> {
        std::fs::create_dir_all(dir)?;
        Ok(Copies { dir: dir.to_path_buf(), limit, copies: HashMap::new(), clock: 0, total: 0, in_memory: 0 })
    }

    /// The largest file kept as a copy: an eighth of the cache, so that a few open
    /// files fit beside the clean ones.
    pub fn file_max(&self) -> u64 {
        self.limit / 8
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

    /// Starts a copy of `ino` holding `content`, described by `attr`.
    pub fn start(&mut self, ino: u64, content: &[u8], attr: Attr, at_server: bool) -> io::Result<&mut LocalCopy> {
        let bytes = match content.len() as u64 <= IN_MEMORY {
            true => Bytes::Memory(content.to_vec()),
            false => Bytes::Disk(disk_file(&self.dir, content)?),
        };
        self.clock += 1;
        let copy = LocalCopy {
            bytes,
            attr,
            dirty: !at_server,
            at_server,
            durable: at_server,
            unlinked: false,
            handles: 0,
            used: self.clock,
        };
        self.remove(ino);
        self.reweigh((0, 0), copy.weight());
        self.copies.insert(ino, copy);
        self.make_room(ino);
        Ok(self.copies.get_mut(&ino).expect("make_room keeps it"))
    }

    /// Writes `data` at `offset` (at the end for `append`); answers the new size.
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8], append: bool) -> Result<u64, Refused> {
        let max = self.file_max();
        let copy = self.copies.get_mut(&ino).ok_or(Refused::Io(io::Error::other("no copy")))?;
        let before = copy.weight();
        let written = write_into(&self.dir, copy, offset, data, append, max);
        let (size, after) = (copy.attr.size, copy.weight());
        self.reweigh(before, after);
        written?;
        self.make_room(ino);
        Ok(size)
    }

    /// Sets the copy's size.
    pub fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Refused> {
        let max = self.file_max();
        let copy = self.copies.get_mut(&ino).ok_or(Refused::Io(io::Error::other("no copy")))?;
        if size > max {
            return Err(Refused::TooLarge);
        }
        let before = copy.weight();
        let result = match &mut copy.bytes {
            Bytes::Memory(held) if size <= IN_MEMORY => {
                held.resize(size as usize, 0);
                Ok(())
            }
            Bytes::Memory(held) => disk_file(&self.dir, held).and_then(|moved| {
                moved.set_len(size)?;
                copy.bytes = Bytes::Disk(moved);
                Ok(())
            }),
            Bytes::Disk(file) => file.set_len(size),
        };
        if result.is_ok() {
            copy.touched(size);
        }
        let after = copy.weight();
        self.reweigh(before, after);
        result.map_err(Refused::Io)
    }

    /// The files made here that the server does not have yet.
    pub fn unstored_names(&self) -> Vec<u64> {
        self.copies.iter().filter(|(_, c)| !c.at_server && !c.unlinked).map(|(&ino, _)| ino).collect()
    }

    /// Forgets the copy of `ino`.
    pub fn remove(&mut self, ino: u64) -> Option<LocalCopy> {
        let copy = self.copies.remove(&ino)?;
        self.reweigh(copy.weight(), (0, 0));
        Some(copy)
    }

    /// A copy's weight went from `before` to `after` (bytes in all, bytes in memory).
    fn reweigh(&mut self, before: (u64, u64), after: (u64, u64)) {
        self.total = self.total - before.0 + after.0;
        self.in_memory = self.in_memory - before.1 + after.1;
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
            .filter(|(&ino, c)| ino != keep && c.handles == 0 && !c.dirty && c.at_server)
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

/// Writes `data` into `copy` at `offset` (at its end for `append`), moving it to a file
/// in `dir` once it outgrows [`IN_MEMORY`]; a copy may be at most `max` bytes.
fn write_into(
    dir: &Path,
    copy: &mut LocalCopy,
    offset: u64,
    data: &[u8],
    append: bool,
    max: u64,
) -> Result<(), Refused> {
    let at = if append { copy.attr.size } else { offset };
    let end = at.checked_add(data.len() as u64).filter(|&end| end <= max).ok_or(Refused::TooLarge)?;
    if let (true, Bytes::Memory(held)) = (end > IN_MEMORY, &copy.bytes) {
        copy.bytes = Bytes::Disk(disk_file(dir, held).map_err(Refused::Io)?);
    }
    match &mut copy.bytes {
        Bytes::Memory(held) => {
            let (at, end) = (at as usize, end as usize);
            if held.len() < end {
                held.resize(end, 0);
            }
            held[at..end].copy_from_slice(data);
        }
        Bytes::Disk(file) => file.write_all_at(data, at).map_err(Refused::Io)?,
    }
    copy.touched(copy.attr.size.max(end));
    Ok(())
}

/// A file in `dir` holding `content`, with no name.
fn disk_file(dir: &Path, content: &[u8]) -> io::Result<File> {
    // Unique among the mounts of every process (several share a directory).
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{}-{made}", std::process::id()));
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
    std::fs::remove_file(&path)?;
    file.write_all_at(content, 0)?;
    Ok(file)
}

/// Where a mount keeps its copies by default: `$XDG_CACHE_HOME/locus/writeback`, else
/// `~/.cache/locus/writeback`, else a directory of the user's in the system's temporary
/// directory.
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|h| PathBuf::from(h).join(".cache")));
    match base {
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

    #[test]
    fn writes_read_back_and_a_copy_never_outgrows_its_share() {
        let dir = tempfile::tempdir().unwrap();
        let mut copies = Copies::new(dir.path(), 800).unwrap();
        copies.start(1, b"hello", attr(5), true).unwrap();
        assert!(copies.dirty(1).is_none(), "a fetched copy is clean");
        assert_eq!(copies.write(1, 5, b" world", false).ok(), Some(11));
        assert_eq!(copies.write(1, 0, b"!", true).ok(), Some(12), "append goes to the end");
        let copy = copies.dirty(1).expect("written");
        assert_eq!(copy.contents().unwrap(), b"hello world!");
        assert_eq!(copy.read(6, 100).unwrap(), b"world!");
        assert!(matches!(copies.write(1, 100, b"x", false), Err(Refused::TooLarge)), "an eighth of 800 is 100");
        copies.truncate(1, 4).ok().unwrap();
        assert_eq!(copies.get(1).unwrap().contents().unwrap(), b"hell");
        // Past IN_MEMORY a copy moves to an unnamed file in the directory.
        let mut big = Copies::new(dir.path(), 64 * IN_MEMORY).unwrap();
        big.start(2, b"head", attr(4), true).unwrap();
        let far = IN_MEMORY + 10;
        assert_eq!(big.write(2, far, b"tail", false).ok(), Some(far + 4));
        let all = big.get(2).unwrap().contents().unwrap();
        assert_eq!((&all[..4], &all[far as usize..]), (&b"head"[..], &b"tail"[..]));
        assert!(all[4..far as usize].iter().all(|&b| b == 0));
        assert!(matches!(big.get(2).unwrap().bytes, Bytes::Disk(_)));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "copies are unnamed");
    }

    #[test]
    fn copies_in_memory_stay_under_their_own_limit_and_are_counted_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let mut copies = Copies::new(dir.path(), 1 << 40).unwrap();
        let chunk = vec![7u8; IN_MEMORY as usize];
        for ino in 0..300 {
            copies.start(ino, &chunk, attr(IN_MEMORY), true).unwrap();
        }
        assert!(copies.in_memory <= MEMORY_LIMIT, "{} bytes in memory", copies.in_memory);
        assert_eq!(copies.in_memory, copies.copies.len() as u64 * IN_MEMORY);
        // Grown past IN_MEMORY, shrunk, removed: the counts follow.
        let ino = *copies.copies.keys().next().unwrap();
        copies.write(ino, IN_MEMORY, b"more", false).ok().unwrap();
        assert_eq!(copies.total, copies.copies.values().map(|c| c.attr.size).sum::<u64>());
        copies.truncate(ino, 10).ok().unwrap();
        copies.remove(ino);
        assert_eq!(copies.total, copies.copies.values().map(|c| c.attr.size).sum::<u64>());
        assert_eq!(copies.in_memory, copies.copies.len() as u64 * IN_MEMORY);
    }

    #[test]
    fn clean_idle_copies_make_room_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut copies = Copies::new(dir.path(), 800).unwrap();
        for ino in 1..=3 {
            copies.start(ino, &[0; 100], attr(100), true).unwrap();
        }
        copies.start(4, &[0; 100], attr(100), false).unwrap(); // made here: dirty
        copies.get(1).unwrap().handles = 1; // in use
        copies.get(2); // 3 is now the least recently used
        for ino in 5..=9 {
            copies.start(ino, &[0; 100], attr(100), true).unwrap();
        }
        // 900 bytes asked for: one clean idle copy went, the least recently used.
        assert!(copies.get(3).is_none());
        for kept in [1, 2, 4, 5, 6, 7, 8, 9] {
            assert!(copies.get(kept).is_some(), "copy {kept}");
        }
    }
}
