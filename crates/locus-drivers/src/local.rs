//! The local-files driver: a directory of this machine (`file:///path`), through the
//! same trait as the remote drivers, so a mount list can name local and remote data
//! alike. Paths are taken lexically beneath the base (no `..` above it).

use crate::{Attr, DirEntry, Driver, DriverError, Opened, Result, SetTime, StatFs, Time};
use locus_proto::types::open_flags;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

/// Files beneath one local directory.
pub struct LocalDriver {
    base: PathBuf,
    open: HashMap<u64, File>,
    next: u64,
}

fn io_error(what: &str, e: std::io::Error) -> DriverError {
    DriverError::errno(e.raw_os_error().unwrap_or(libc::EIO), format!("{what}: {e}"))
}

/// The attributes of local metadata, as the wire types carry them.
pub fn attr_of(m: &std::fs::Metadata) -> Attr {
    Attr {
        dev: m.dev(),
        ino: m.ino(),
        mode: m.mode(),
        nlink: m.nlink(),
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev(),
        size: m.size(),
        blksize: m.blksize() as u32,
        blocks: m.blocks(),
        atime: Time { sec: m.atime(), nsec: m.atime_nsec() as u32 },
        mtime: Time { sec: m.mtime(), nsec: m.mtime_nsec() as u32 },
        ctime: Time { sec: m.ctime(), nsec: m.ctime_nsec() as u32 },
    }
}

fn file_time(t: SetTime) -> Option<std::time::SystemTime> {
    match t {
        SetTime::Omit => None,
        SetTime::Now => Some(std::time::SystemTime::now()),
        SetTime::At(t) if t.sec >= 0 => {
            Some(std::time::UNIX_EPOCH + std::time::Duration::new(t.sec as u64, t.nsec.min(999_999_999)))
        }
        SetTime::At(t) => Some(std::time::UNIX_EPOCH - std::time::Duration::from_secs(t.sec.unsigned_abs())),
    }
}

impl LocalDriver {
    /// A driver for everything beneath the directory `base`.
    pub fn new(base: &str) -> Result<LocalDriver> {
        let base = PathBuf::from(if base.is_empty() { "/" } else { base });
        let m = std::fs::metadata(&base).map_err(|e| io_error(&base.display().to_string(), e))?;
        if !m.is_dir() {
            return Err(DriverError::errno(libc::ENOTDIR, format!("{}: not a directory", base.display())));
        }
        Ok(LocalDriver { base, open: HashMap::new(), next: 1 })
    }

    /// The local path of `path`, refusing any `..` that would climb above the base.
    fn local(&self, path: &str) -> Result<PathBuf> {
        let mut out = self.base.clone();
        let mut depth = 0usize;
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." if depth == 0 => {
                    return Err(DriverError::errno(libc::EACCES, format!("{path}: outside the base")))
                }
                ".." => {
                    out.pop();
                    depth -= 1;
                }
                name => {
                    out.push(name);
                    depth += 1;
                }
            }
        }
        Ok(out)
    }

    fn handle(&self, handle: u64) -> Result<&File> {
        self.open.get(&handle).ok_or_else(|| DriverError::errno(libc::EBADF, "not open"))
    }
}

impl Driver for LocalDriver {
    fn name(&self) -> &'static str {
        "local"
    }
    fn lstat(&mut self, path: &str) -> Result<Attr> {
        std::fs::symlink_metadata(self.local(path)?).map(|m| attr_of(&m)).map_err(|e| io_error(path, e))
    }
    fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>> {
        let dir = self.local(path)?;
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| io_error(path, e))? {
            let entry = entry.map_err(|e| io_error(path, e))?;
            // An entry removed since the listing began is simply not listed.
            let Ok(m) = entry.metadata() else { continue };
            out.push(DirEntry { name: entry.file_name().to_string_lossy().into_owned(), attr: attr_of(&m) });
        }
        Ok(out)
    }
    fn open(&mut self, path: &str, flags: u32, mode: u32) -> Result<Opened> {
        let local = self.local(path)?;
        let mut o = OpenOptions::new();
        let write = flags & (open_flags::WRITE | open_flags::APPEND) != 0;
        o.read(flags & open_flags::READ != 0 || !write)
            .write(write)
            .append(flags & open_flags::APPEND != 0)
            .truncate(flags & open_flags::TRUNCATE != 0)
            .mode(mode);
        if flags & open_flags::CREATE != 0 {
            if flags & open_flags::EXCLUSIVE != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
        }
        let mut custom = 0;
        if flags & open_flags::DIRECTORY != 0 {
            custom |= libc::O_DIRECTORY;
        }
        if flags & open_flags::NOFOLLOW != 0 {
            custom |= libc::O_NOFOLLOW;
        }
        let file = o.custom_flags(custom).open(&local).map_err(|e| io_error(path, e))?;
        let attr = file.metadata().map(|m| attr_of(&m)).map_err(|e| io_error(path, e))?;
        let handle = self.next;
        self.next += 1;
        self.open.insert(handle, file);
        Ok(Opened { handle, attr, location: None })
    }
    fn close(&mut self, handle: u64) -> Result<()> {
        self.open.remove(&handle).map(drop).ok_or_else(|| DriverError::errno(libc::EBADF, "not open"))
    }
    fn fstat(&mut self, handle: u64) -> Result<Attr> {
        self.handle(handle)?.metadata().map(|m| attr_of(&m)).map_err(|e| io_error("fstat", e))
    }
    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        let n = self.handle(handle)?.read_at(&mut buf, offset).map_err(|e| io_error("pread", e))?;
        buf.truncate(n);
        Ok(buf)
    }
    fn pwrite(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<u64> {
        self.handle(handle)?.write_all_at(data, offset).map_err(|e| io_error("pwrite", e))?;
        Ok(data.len() as u64)
    }
    fn ftruncate(&mut self, handle: u64, size: u64) -> Result<()> {
        self.handle(handle)?.set_len(size).map_err(|e| io_error("ftruncate", e))
    }
    fn fsync(&mut self, handle: u64) -> Result<()> {
        self.handle(handle)?.sync_all().map_err(|e| io_error("fsync", e))
    }
    fn mkdir(&mut self, path: &str, mode: u32) -> Result<()> {
        std::fs::DirBuilder::new().mode(mode).create(self.local(path)?).map_err(|e| io_error(path, e))
    }
    fn rmdir(&mut self, path: &str) -> Result<()> {
        std::fs::remove_dir(self.local(path)?).map_err(|e| io_error(path, e))
    }
    fn unlink(&mut self, path: &str) -> Result<()> {
        std::fs::remove_file(self.local(path)?).map_err(|e| io_error(path, e))
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        std::fs::rename(self.local(from)?, self.local(to)?).map_err(|e| io_error(from, e))
    }
    fn symlink(&mut self, target: &str, path: &str) -> Result<()> {
        std::os::unix::fs::symlink(target, self.local(path)?).map_err(|e| io_error(path, e))
    }
    fn readlink(&mut self, path: &str) -> Result<String> {
        let target = std::fs::read_link(self.local(path)?).map_err(|e| io_error(path, e))?;
        Ok(target.to_string_lossy().into_owned())
    }
    fn link(&mut self, from: &str, to: &str) -> Result<()> {
        std::fs::hard_link(self.local(from)?, self.local(to)?).map_err(|e| io_error(from, e))
    }
    fn truncate(&mut self, path: &str, size: u64) -> Result<()> {
        let f = OpenOptions::new().write(true).open(self.local(path)?).map_err(|e| io_error(path, e))?;
        f.set_len(size).map_err(|e| io_error(path, e))
    }
    fn chmod(&mut self, path: &str, mode: u32) -> Result<()> {
        std::fs::set_permissions(self.local(path)?, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_error(path, e))
    }
    fn utimes(&mut self, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        let f = File::open(self.local(path)?).map_err(|e| io_error(path, e))?;
        let mut times = std::fs::FileTimes::new();
        if let Some(t) = file_time(atime) {
            times = times.set_accessed(t);
        }
        if let Some(t) = file_time(mtime) {
            times = times.set_modified(t);
        }
        f.set_times(times).map_err(|e| io_error(path, e))
    }
    fn statfs(&mut self, path: &str) -> Result<StatFs> {
        let s = rustix::fs::statvfs(self.local(path)?).map_err(|e| io_error(path, e.into()))?;
        Ok(StatFs::from(&s))
    }
}
