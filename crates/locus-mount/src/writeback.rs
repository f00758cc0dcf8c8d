//! Whole-file copies on local disk, for `--consistency afs`: a file opened for writing
//! is written here and stored at the server in one round trip when it is closed or
//! synced; a copy stored and not changed since answers later opens of the file without
//! fetching it again, while the server's callback says it is current.
//!
//! Copies are unnamed files in the cache directory (created and unlinked at once, so a
//! crash leaves nothing behind), bounded in total size: clean copies no handle uses go
//! first, least recently used first. A file that would outgrow [`Copies::file_max`]
//! leaves the cache and is written through (the mount "spills" it).

use locus_drivers::{Attr, Time};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One file's local copy.
pub struct LocalCopy {
    file: File,
    /// What the file is: the server's attributes when fetched or stored, with the size
    /// and modification time of the local writes since.
    pub attr: Attr,
    /// Written (or truncated) since it was last stored.
    pub dirty: bool,
    /// The name exists at the server (false for a create not stored yet).
    pub at_server: bool,
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
        let mut buf = vec![0; end.saturating_sub(offset) as usize];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
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

    /// The server now holds exactly this copy, whose attributes are `attr`.
    pub fn stored(&mut self, attr: Attr) {
        self.attr = attr;
        self.dirty = false;
        self.at_server = true;
    }

    /// True when the copy is what the server has, by its size and modification time.
    pub fn current(&self, attr: &Attr) -> bool {
        !self.dirty && self.at_server && (self.attr.size, self.attr.mtime) == (attr.size, attr.mtime)
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
}

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
        Ok(Copies { dir: dir.to_path_buf(), limit, copies: HashMap::new(), clock: 0 })
    }

    /// The largest file kept as a copy: an eighth of the cache, so that a few open
    /// files fit beside the clean ones.
    pub fn file_max(&self) -> u64 {
        self.limit / 8
    }

    /// The copy of `ino`, marked as used now.
    pub fn get(&mut self, ino: u64) -> Option<&mut LocalCopy> {
        self.clock += 1;
        let clock = self.clock;
        self.copies.get_mut(&ino).map(|c| {
            c.used = clock;
            c
        })
    }

    /// The copy of `ino`, if it has one and the local writes are not yet stored (what
    /// the file is then is the copy, not the server's answer).
    pub fn dirty(&self, ino: u64) -> Option<&LocalCopy> {
        self.copies.get(&ino).filter(|c| c.dirty || !c.at_server)
    }

    /// Starts a copy of `ino` holding `content`, described by `attr`.
    pub fn start(&mut self, ino: u64, content: &[u8], attr: Attr, at_server: bool) -> io::Result<&mut LocalCopy> {
        // Unique among the mounts of every process (several share a directory).
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{made}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        std::fs::remove_file(&path)?;
        file.write_all_at(content, 0)?;
        let copy = LocalCopy { file, attr, dirty: !at_server, at_server, unlinked: false, handles: 0, used: 0 };
        self.copies.insert(ino, copy);
        self.make_room();
        Ok(self.get(ino).expect("just inserted"))
    }

    /// Writes `data` at `offset` (at the end for `append`); answers the new size.
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8], append: bool) -> Result<u64, Refused> {
        let max = self.file_max();
        let copy = self.copies.get_mut(&ino).ok_or(Refused::Io(io::Error::other("no copy")))?;
        let at = if append { copy.attr.size } else { offset };
        let end = at.checked_add(data.len() as u64).filter(|&end| end <= max).ok_or(Refused::TooLarge)?;
        copy.file.write_all_at(data, at).map_err(Refused::Io)?;
        let size = copy.attr.size.max(end);
        copy.touched(size);
        self.make_room();
        Ok(size)
    }

    /// Sets the copy's size.
    pub fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Refused> {
        let max = self.file_max();
        let copy = self.copies.get_mut(&ino).ok_or(Refused::Io(io::Error::other("no copy")))?;
        if size > max {
            return Err(Refused::TooLarge);
        }
        copy.file.set_len(size).map_err(Refused::Io)?;
        copy.touched(size);
        Ok(())
    }

    /// The files made here that the server does not have yet.
    pub fn unstored_names(&self) -> Vec<u64> {
        self.copies.iter().filter(|(_, c)| !c.at_server && !c.unlinked).map(|(&ino, _)| ino).collect()
    }

    /// Forgets the copy of `ino`.
    pub fn remove(&mut self, ino: u64) -> Option<LocalCopy> {
        self.copies.remove(&ino)
    }

    /// Drops clean copies no handle uses, least recently used first, until the copies
    /// fit the limit (copies being written stay: they leave by being stored).
    fn make_room(&mut self) {
        let mut total: u64 = self.copies.values().map(|c| c.attr.size).sum();
        if total <= self.limit {
            return;
        }
        let mut idle: Vec<(u64, u64, u64)> = self
            .copies
            .iter()
            .filter(|(_, c)| c.handles == 0 && !c.dirty && c.at_server)
            .map(|(&ino, c)| (c.used, ino, c.attr.size))
            .collect();
        idle.sort_unstable();
        for (_, ino, size) in idle {
            if total <= self.limit {
                break;
            }
            self.copies.remove(&ino);
            total -= size;
        }
    }
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
