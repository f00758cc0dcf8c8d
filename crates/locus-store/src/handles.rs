//! Open files and uploads: an [`OpenFile`] is a descriptor with the rights it was
//! opened with and its I/O accounting; a [`PutFile`] writes a whole file under a hidden
//! temporary name beside its target and renames it into place when finished (a killed
//! server's leftovers are swept at the next start).

use crate::attr_of;
use crate::devices;
use crate::error::OsContext;
use crate::error::Result;
use crate::removals::last_link;
use crate::removals::report_removed;
use crate::resolve::Target;
use crate::FileIo;
use crate::RemovalObserver;
use crate::Store;
use crate::StoreError;
use crate::RESERVED_PREFIX;
use locus_proto::types::{Attr, Rights};
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// An open file as a handle holds it; the object stays bound across renames, and, when
/// its content moves to another device, the descriptor is given the new copy.
pub struct OpenFile {
    /// Closed by the handle's drop, after it no longer stands for the file (a move may
    /// be switching it).
    pub file: ManuallyDrop<File>,
    pub readable: bool,
    pub writable: bool,
    /// Opened to append: writes go to the end whatever their offset.
    pub append: bool,
    /// Counters of the file, charged on every read and write through this handle.
    pub io: FileIo,
    pub rel: String,
    /// Its descriptor is in its file's entry, for moves.
    pub(crate) registered: bool,
}

/// An upload in progress: bytes go to a hidden temporary file that replaces the target
/// only when [`PutFile::finish`] is called, so a failed upload leaves the old file intact.
pub struct PutFile {
    pub(crate) file: File,
    pub(crate) dir: Option<OwnedFd>,
    pub(crate) store_root: OwnedFd,
    pub(crate) tmp: String,
    pub(crate) name: String,
    pub(crate) mode: u32,
    pub(crate) done: bool,
    /// Whether `finish` waits for the disk before the rename (the default).
    pub durable: bool,
    /// Whether `finish` refuses (`EEXIST`) to replace a file already at the name: a
    /// cluster's immutable object versions are never overwritten.
    pub no_replace: bool,
    pub io: FileIo,
    pub(crate) removals: Option<Arc<dyn RemovalObserver>>,
    /// The device it goes to, and, with several devices, the namespace lock and the
    /// directories on the other devices where an older copy may have to go.
    pub(crate) device: u32,
    pub(crate) namespace: Option<Arc<parking_lot::Mutex<()>>>,
    pub(crate) others: Vec<OwnedFd>,
}

pub(crate) fn random_hex() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS provides randomness");
    hex::encode(b)
}

impl OpenFile {
    /// A handle on an open file (for files the store did not open itself, such as
    /// active files' results).
    pub fn new(file: File, readable: bool, writable: bool, append: bool, io: FileIo, rel: String) -> OpenFile {
        OpenFile { file: ManuallyDrop::new(file), readable, writable, append, io, rel, registered: false }
    }

    fn need(&self, write: bool) -> Result<()> {
        if (write && !self.writable) || (!write && !self.readable) {
            return Err(StoreError::Os {
                op: if write { "write" } else { "read" },
                path: self.rel.clone(),
                errno: Errno::BADF,
            });
        }
        Ok(())
    }

    /// Attributes of the open object.
    pub fn stat(&self) -> Result<Attr> {
        Ok(attr_of(&rustix::fs::fstat(&*self.file).ctx("fstat", &self.rel)?))
    }

    /// Reads up to `len` bytes at `offset` into a new buffer (short at end of file),
    /// and counts the read.
    pub fn pread(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let start = Instant::now();
        let buf = self.read_at(offset, len)?;
        self.io.read(buf.len() as u64, start.elapsed());
        Ok(buf)
    }

    /// Reads like [`OpenFile::pread`] without counting, for callers that count themselves.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let got = self.read_into(offset, &mut buf)?;
        buf.truncate(got);
        Ok(buf)
    }

    /// Fills `buf` from `offset`, short only at end of file; returns how many bytes came.
    /// Does not count, like [`OpenFile::read_at`]; lets a caller reuse one buffer.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.need(false)?;
        let mut got = 0;
        while got < buf.len() {
            match rustix::io::pread(&*self.file, &mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e).ctx("read", &self.rel),
            }
        }
        Ok(got)
    }

    /// Checks that the handle may be read, for callers that move bytes themselves (sendfile).
    pub fn check_readable(&self) -> Result<()> {
        self.need(false)
    }

    /// Checks that the handle may be written, for callers that move bytes themselves (splice).
    pub fn check_writable(&self) -> Result<()> {
        self.need(true)
    }

    /// Writes `data` at `offset` (at the end for a handle opened to append).
    pub fn pwrite(&self, offset: u64, data: &[u8]) -> Result<u64> {
        self.need(true)?;
        let _moves = self.io.writing();
        let start = Instant::now();
        let mut done = 0;
        while done < data.len() {
            match rustix::io::pwrite(&*self.file, &data[done..], offset + done as u64) {
                Ok(n) => done += n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e).ctx("write", &self.rel),
            }
        }
        self.io.write(done as u64, start.elapsed());
        Ok(done as u64)
    }

    /// Flushes to stable storage.
    pub fn fsync(&self) -> Result<()> {
        rustix::fs::fsync(&*self.file).ctx("fsync", &self.rel)
    }

    /// Sets the size of the open file.
    pub fn ftruncate(&self, size: u64) -> Result<()> {
        self.need(true)?;
        let _moves = self.io.writing();
        rustix::fs::ftruncate(&*self.file, size).ctx("ftruncate", &self.rel)
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        // A move may be putting a new copy under this descriptor: close it only after.
        let _moves = self.registered.then(|| self.io.writing());
        if self.registered {
            self.io.unregister(self.file.as_raw_fd());
        }
        // SAFETY: dropped once, here; the field is not used after.
        unsafe { ManuallyDrop::drop(&mut self.file) };
    }
}

impl PutFile {
    /// Appends a chunk of the upload.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        let start = Instant::now();
        self.write_all(data)?;
        self.io.write(data.len() as u64, start.elapsed());
        Ok(())
    }

    /// Appends the whole of `from`, from its start to its end as it is now, in the kernel
    /// (`copy_file_range`; a read and a write where the file systems cannot), counted as
    /// `from`'s reads and this upload's writes; answers how many bytes came.
    pub fn copy_from(&mut self, from: &OpenFile) -> Result<u64> {
        from.check_readable()?;
        let start = Instant::now();
        let at = self.append_fd(&from.file, 0, u64::MAX, &from.rel)?;
        from.io.read(at, start.elapsed());
        self.io.write(at, start.elapsed());
        Ok(at)
    }

    /// Appends `len` bytes of `from` (a file outside the export: an S3 multipart upload
    /// in the state directory, say) from offset `at`, in the kernel as
    /// [`PutFile::copy_from`] does; counted as this upload's writes; answers how many
    /// bytes came (fewer where `from` ends first).
    pub fn append_file(&mut self, from: &File, at: u64, len: u64) -> Result<u64> {
        let start = Instant::now();
        let n = self.append_fd(from, at, len, "a file of the server's")?;
        self.io.write(n, start.elapsed());
        Ok(n)
    }

    /// Makes the file at `from` (outside the export, on the file system the upload goes
    /// to, written by nobody from now on) the upload's content in place of what was
    /// written so far, which must be nothing, by giving it a second name (so an S3
    /// multipart upload assembled in the state directory becomes the object without a
    /// copy, and is still there if the upload fails; its caller removes it). Answers its
    /// size. Across file systems this is `EXDEV`, and the upload is unchanged.
    pub fn adopt(&mut self, from: &std::path::Path) -> Result<u64> {
        let what = || from.display().to_string();
        if rustix::fs::fstat(&self.file).ctx("put", &self.name)?.st_size != 0 {
            return Err(StoreError::Invalid(format!("{}: an upload takes a file only before its bytes", self.name)));
        }
        let start = Instant::now();
        let flags = OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let file = File::from(rustix::fs::open(from, flags, Mode::empty()).ctx("put", &what())?);
        let opened = rustix::fs::fstat(&file).ctx("put", &what())?;
        // It must end as a file made in place would: with the owner and group the
        // directory gives (a set-group-ID directory's group, say), and no extended
        // attributes the directory would have given (a default ACL, a label). Where it
        // cannot, it is taken as from another file system (`EXDEV`): copied instead.
        let cannot = || StoreError::Os { op: "put", path: self.name.clone(), errno: Errno::XDEV };
        let made = rustix::fs::fstat(&self.file).ctx("put", &self.name)?;
        if (opened.st_uid, opened.st_gid) != (made.st_uid, made.st_gid)
            && rustix::fs::fchown(
                &file,
                Some(rustix::fs::Uid::from_raw(made.st_uid)),
                Some(rustix::fs::Gid::from_raw(made.st_gid)),
            )
            .is_err()
        {
            return Err(cannot());
        }
        let xattrs = match rustix::fs::flistxattr(&self.file, &mut [0u8; 0][..]) {
            Ok(n) => n,
            Err(Errno::NOTSUP) => 0,
            Err(_) => 1,
        };
        if xattrs > 0 {
            return Err(cannot());
        }
        let dir = self.dir.as_ref().map(|d| d.as_fd()).unwrap_or(self.store_root.as_fd());
        let tmp = format!("{RESERVED_PREFIX}_put_{}", random_hex());
        rustix::fs::linkat(rustix::fs::CWD, from, dir, tmp.as_str(), AtFlags::empty()).ctx("link", &what())?;
        // The name linked must be the file opened (nothing swapped it meanwhile).
        let linked = rustix::fs::statat(dir, tmp.as_str(), AtFlags::SYMLINK_NOFOLLOW);
        if !linked.is_ok_and(|l| (l.st_dev, l.st_ino) == (opened.st_dev, opened.st_ino)) {
            let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            return Err(StoreError::Invalid(format!("{}: changed while it was being taken", what())));
        }
        let _ = rustix::fs::unlinkat(dir, self.tmp.as_str(), AtFlags::empty());
        (self.file, self.tmp) = (file, tmp);
        let size = opened.st_size as u64;
        self.io.write(size, start.elapsed());
        Ok(size)
    }

    /// Copies `len` bytes of `from` from offset `at` onto the upload's end, uncounted;
    /// answers how many came.
    fn append_fd(&mut self, from: &File, at: u64, len: u64, what: &str) -> Result<u64> {
        let (mut done, mut kernel) = (0u64, true);
        let mut buf = Vec::new();
        while done < len {
            let want = (len - done).min(1 << 30) as usize;
            let mut from_at = at + done;
            let n = if kernel {
                match rustix::fs::copy_file_range(from, Some(&mut from_at), &self.file, None, want) {
                    Ok(n) => n,
                    Err(Errno::INTR | Errno::AGAIN) => continue,
                    // Across file systems, or on one that cannot: through memory.
                    Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP | Errno::PERM) => {
                        kernel = false;
                        buf.resize(1 << 20, 0);
                        continue;
                    }
                    Err(e) => return Err(e).ctx("copy", what),
                }
            } else {
                let take = want.min(buf.len());
                let n = match rustix::io::pread(from, &mut buf[..take], from_at) {
                    Ok(n) => n,
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e).ctx("copy", what),
                };
                self.write_all(&buf[..n])?;
                n
            };
            if n == 0 {
                break;
            }
            done += n as u64;
        }
        Ok(done)
    }

    /// Writes `data` at the upload's end, uncounted.
    fn write_all(&mut self, data: &[u8]) -> Result<()> {
        use std::io::Write;
        self.file.write_all(data).map_err(|e| StoreError::Os {
            op: "put",
            path: self.name.clone(),
            errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
        })
    }

    /// Makes the upload durable and moves it over the target in one atomic rename.
    pub fn finish(mut self) -> Result<Attr> {
        let dir = self.dir.as_ref().map(|d| d.as_fd()).unwrap_or(self.store_root.as_fd());
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(self.mode)).ctx("put", &self.name)?;
        if self.durable {
            rustix::fs::fdatasync(&self.file).ctx("put", &self.name)?;
        }
        let replaced = last_link(self.removals.as_ref(), dir, &self.name);
        let _names = self.namespace.as_ref().map(|n| n.lock());
        // With several devices the name may have been made on another one meanwhile:
        // an upload that must not replace finds it there (under the namespace's lock,
        // which every rename into the namespace holds).
        let elsewhere =
            |other: &OwnedFd| rustix::fs::statat(other, self.name.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok();
        if self.no_replace && self.others.iter().any(elsewhere) {
            return Err(StoreError::Os { op: "put", path: self.name.clone(), errno: Errno::EXIST });
        }
        match self.no_replace {
            true => rustix::fs::renameat_with(
                dir,
                self.tmp.as_str(),
                dir,
                self.name.as_str(),
                rustix::fs::RenameFlags::NOREPLACE,
            ),
            false => rustix::fs::renameat(dir, self.tmp.as_str(), dir, self.name.as_str()),
        }
        .ctx("put", &self.name)?;
        if self.durable {
            // The rename is on disk before the put is answered: a crash of the machine
            // cannot bring the old file back after the client was told the new one is there.
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let d = rustix::fs::openat(dir, ".", flags, Mode::empty()).ctx("put", &self.name)?;
            rustix::fs::fsync(&d).ctx("put", &self.name)?;
        }
        // With several devices, the name it replaced may have been on another one.
        for other in &self.others {
            if rustix::fs::statat(other, self.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| !rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
            {
                let _ = rustix::fs::unlinkat(other, self.name.as_str(), AtFlags::empty());
            }
        }
        self.io.entry().set_device(self.device);
        report_removed(self.removals.as_ref(), replaced);
        self.done = true;
        Ok(attr_of(&rustix::fs::fstat(&self.file).ctx("put", &self.name)?))
    }
}

/// Removes, in the background, the hidden files of uploads that a killed server left
/// under `roots` (every device): those made before this store opened cannot belong to a
/// live upload. A crash during a put must not leak its partial bytes forever.
pub(crate) fn sweep_stale_uploads(roots: Vec<PathBuf>) {
    // File times come from a coarser clock than this one: an upload begun just after the
    // store opened can carry a time a little before it. Two seconds of margin keep every
    // live upload (a server killed less than that before this start leaks its last one).
    let opened = std::time::SystemTime::now() - std::time::Duration::from_secs(2);
    let prefix = format!("{RESERVED_PREFIX}_put_");
    let sweep = move || {
        let mut dirs = roots;
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                let path = entry.path();
                if meta.is_dir() {
                    dirs.push(path);
                } else if meta.is_file()
                    && entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))
                    && meta.modified().is_ok_and(|m| m < opened)
                {
                    tracing::info!("{}: removing an upload a stopped server left", path.display());
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    };
    let _ = std::thread::Builder::new().name("locus-sweep".into()).spawn(sweep);
}

impl Drop for PutFile {
    fn drop(&mut self) {
        if !self.done {
            let dir = self.dir.as_ref().map(|d| d.as_fd()).unwrap_or(self.store_root.as_fd());
            let _ = rustix::fs::unlinkat(dir, self.tmp.as_str(), AtFlags::empty());
        }
    }
}

impl Store {
    /// Starts an upload that will replace `path` when finished.
    pub fn begin_put(&self, who: &str, path: &str, mode: u32) -> Result<PutFile> {
        let t = self.locate_checked(who, path, true, Rights::WRITE)?;
        if t.name == "." {
            return Err(StoreError::Os { op: "put", path: path.to_string(), errno: Errno::ISDIR });
        }
        // With several devices the upload goes where the file is, or is placed.
        let (mut dir, mut device, mut others) = (t.dir, 0, Vec::new());
        if self.multi() {
            let _names = self.namespace.lock();
            let probe = Target { dir: dir.take(), name: t.name.clone(), rel: t.rel.clone(), stat: None };
            let (alt, found) = match self.find_home(&probe)? {
                Some(home) => home,
                None => (None, self.place()),
            };
            device = found;
            dir = match (alt, device) {
                (Some(d), _) => Some(d),
                (None, 0) => probe.dir,
                (None, d) => Some(self.mkdirs_on(d as usize, devices::parent_of(&t.rel))?),
            };
            for d in (0..self.devices.len()).filter(|&d| d as u32 != device) {
                if let Some(fd) = self.dir_on(d, devices::parent_of(&t.rel))? {
                    others.push(fd);
                }
            }
        }
        let d = dir.as_ref().map_or(self.root.as_fd(), |d| d.as_fd());
        let tmp = format!("{RESERVED_PREFIX}_put_{}", random_hex());
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(d, tmp.as_str(), flags, Mode::from_raw_mode(0o600)).ctx("put", path)?;
        Ok(PutFile {
            file: File::from(fd),
            dir,
            store_root: self.root.try_clone().map_err(|e| StoreError::Invalid(e.to_string()))?,
            tmp,
            name: t.name,
            mode: mode & 0o7777,
            durable: true,
            no_replace: false,
            done: false,
            io: self.counters.file_on(&t.rel, device),
            removals: self.removals.get().cloned(),
            device,
            namespace: self.multi().then(|| self.namespace.clone()),
            others,
        })
    }
}
