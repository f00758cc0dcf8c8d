//! The exported directory tree: every path a client names is resolved here, beneath the
//! export root and without races, checked against the ACLs, and counted.
//!
//! - [`Store`]: the operations on paths, each taking the acting subject.
//! - [`OpenFile`] and [`PutFile`]: what an open handle and an upload in progress hold.
//! - [`acl`]: per-directory access-control lists.
//! - [`counters`]: per-file, per-device, per-export and per-operation I/O accounting.
//! - `devices`: several storage directories under one namespace, and moving files
//!   between them to even out their load.
//! - [`error`]: [`StoreError`], mapped to wire codes.
//! - [`RemovalObserver`]: told when an object leaves the export, so what others attach
//!   to objects (scripts' per-file state) goes with it.
//!
//! Confinement: the parent directory of every name is opened with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, and the final component is acted on through
//! that descriptor with no-follow semantics. A final symlink is followed by hand (at most
//! 40 hops), each hop resolved again beneath the root, so a symlink that points out, or
//! one swapped in during an operation, fails instead of escaping. All of that is in
//! `resolve.rs`, the file to audit; `handles.rs` holds open files and uploads,
//! `removals.rs` unlink, rmdir and the removal observer, and this file the other
//! operations.

pub mod acl;
pub mod counters;
mod devices;
pub mod error;
mod handles;
mod removals;
mod resolve;
mod view;

pub use acl::{Acl, ACL_FILE, RESERVED_PREFIX};
pub use counters::{Counters, FileEntry, FileIo};
pub use error::{Result, StoreError};
pub use view::CodeView;

use error::OsContext;
use handles::{random_hex, sweep_stale_uploads};
use locus_proto::types::{open_flags, Attr, DeviceStats, DirEntry, Rights, SetTime, StatFs, StatsReport, Time};
use removals::{last_link, report_removed};
use resolve::{resolve_flags, Target};
use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use handles::{OpenFile, PutFile};
pub use removals::RemovalObserver;

/// An object's identity on the server: device and inode numbers.
pub type ObjectId = (u64, u64);

/// The identity of the object `st` describes.
// `struct stat` field types differ between architectures; the casts are for the others.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn object_id(st: &rustix::fs::Stat) -> ObjectId {
    (st.st_dev as u64, st.st_ino as u64)
}

pub use resolve::MAX_PATH;

/// An export: a directory tree shared with clients, whose files may live on several
/// devices (see `devices`).
pub struct Store {
    root: OwnedFd,
    root_key: ObjectId,
    acls: acl::AclCache,
    counters: Counters,
    removals: std::sync::OnceLock<Arc<dyn RemovalObserver>>,
    /// The devices; the first is the root.
    devices: Vec<devices::Device>,
    /// Held by changes to the namespace when there are several devices.
    namespace: Arc<parking_lot::Mutex<()>>,
    /// Where interrupted moves are recorded (the state directory's `intents`).
    intents: Option<PathBuf>,
    /// The directories code is running over now (see [`view::LiveViews`]): a rename or
    /// link into or within one waits until the run ends (`EBUSY`), so a view never shows
    /// what was refused when it was made.
    views: view::LiveViews,
}

// `struct stat` field types differ between architectures; the casts are for the others.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn attr_of(st: &rustix::fs::Stat) -> Attr {
    Attr {
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
        mode: st.st_mode as u32,
        nlink: st.st_nlink as u64,
        uid: st.st_uid as u32,
        gid: st.st_gid as u32,
        rdev: st.st_rdev as u64,
        size: st.st_size as u64,
        blksize: st.st_blksize as u32,
        blocks: st.st_blocks as u64,
        atime: Time { sec: st.st_atime as i64, nsec: st.st_atime_nsec as u32 },
        mtime: Time { sec: st.st_mtime as i64, nsec: st.st_mtime_nsec as u32 },
        ctime: Time { sec: st.st_ctime as i64, nsec: st.st_ctime_nsec as u32 },
    }
}

fn to_timespec(t: SetTime) -> Timespec {
    match t {
        SetTime::Omit => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        SetTime::Now => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
        SetTime::At(t) => Timespec { tv_sec: t.sec, tv_nsec: t.nsec as _ },
    }
}

impl Store {
    /// Opens an export rooted at `root`. When the root has no ACL yet, `initial_acl`
    /// becomes its ACL (this is how a fresh export gets its first administrator).
    pub fn new(root: &Path, initial_acl: &Acl) -> Result<Store> {
        Store::with_devices(root, &[], initial_acl, None)
    }

    /// Opens an export whose namespace is `root` and whose files live on `root` and on
    /// each of `more` (see `devices`). With `state`, interrupted moves are recorded in
    /// `state/intents` and finished or undone now.
    pub fn with_devices(root: &Path, more: &[PathBuf], initial_acl: &Acl, state: Option<&Path>) -> Result<Store> {
        let first = devices::Device::open(root)?;
        let st = rustix::fs::fstat(&first.root).ctx("stat", &root.display().to_string())?;
        let root_fd = first.root.try_clone().map_err(|e| StoreError::Invalid(e.to_string()))?;
        let mut all = vec![first];
        for path in more {
            all.push(devices::Device::open(path)?);
        }
        let intents = state.map(|s| s.join("intents"));
        if let Some(dir) = &intents {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Invalid(format!("{}: {e}", dir.display())))?;
        }
        let store = Store {
            root: root_fd,
            root_key: object_id(&st),
            acls: acl::AclCache::default(),
            counters: Counters::new(all.len()),
            removals: std::sync::OnceLock::new(),
            devices: all,
            namespace: Arc::default(),
            intents,
            views: view::LiveViews::default(),
        };
        if acl::read_acl(store.root.as_fd())?.is_none() {
            store.write_acl(store.root.as_fd(), initial_acl)?;
        }
        store.repair();
        sweep_stale_uploads(store.devices.iter().map(|d| d.path.clone()).collect());
        Ok(store)
    }

    /// How many devices hold the export's files.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Held by changes to the namespace when there are several devices; with one, `None`.
    fn names_lock(&self) -> Option<parking_lot::MutexGuard<'_, ()>> {
        self.multi().then(|| self.namespace.lock())
    }

    /// The export's counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Opens the directory `path` for code to run in: needs `r` and `l` there, and `w`
    /// too when `write` is set.
    ///
    /// With several devices, the code sees the directory as the namespace shows it (a
    /// read-only union of its copies on every device, see `devices`), and a writable run
    /// is refused with `EROFS`.
    pub fn open_workdir(&self, who: &str, path: &str, write: bool) -> Result<OwnedFd> {
        let t = self.locate(path, true)?;
        let dir = self.open_located_dir(&t, path)?;
        let mut need = Rights::READ.union(Rights::LIST);
        if write {
            need = need.union(Rights::WRITE);
        }
        self.check(dir.as_fd(), who, need, path)?;
        if self.multi() {
            if write {
                // A union of several devices is read-only.
                return Err(StoreError::Os { op: "run writable code in", path: path.to_string(), errno: Errno::ROFS });
            }
            if let Some(union) = self.union_view(&t.rel, &dir) {
                return Ok(union);
            }
        }
        Ok(dir)
    }

    /// The rights `who` holds in the directory `path`.
    pub fn rights(&self, who: &str, path: &str) -> Result<Rights> {
        let t = self.locate(path, true)?;
        // A path naming a directory that locating already opened (the root, asked on
        // every script call, or `a/..`) is not opened a second time.
        if t.name == "." {
            return self.rights_in(t.dir(self), who);
        }
        let dir = self.open_located_dir(&t, path)?;
        self.rights_in(dir.as_fd(), who)
    }

    /// `stat`, following symlinks.
    pub fn stat(&self, who: &str, path: &str) -> Result<Attr> {
        let t = self.locate_checked(who, path, true, Rights::LIST)?;
        let st = match t.stat {
            Some(st) => st,
            None => {
                let (alt, _) = self.home(&t)?;
                rustix::fs::statat(self.home_dir(&t, &alt), t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .ctx("stat", path)?
            }
        };
        Ok(attr_of(&st))
    }

    /// `lstat`: a final symlink is described, not followed.
    pub fn lstat(&self, who: &str, path: &str) -> Result<Attr> {
        let t = self.locate_checked(who, path, false, Rights::LIST)?;
        let (alt, _) = self.home(&t)?;
        let st = rustix::fs::statat(self.home_dir(&t, &alt), t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .ctx("lstat", path)?;
        Ok(attr_of(&st))
    }

    /// Opens a file with Locus `open_flags`.
    pub fn open(&self, who: &str, path: &str, flags: u32, mode: u32) -> Result<OpenFile> {
        if flags & !open_flags::ALL != 0 {
            return Err(StoreError::Invalid(format!("unknown open flags {flags:#x}")));
        }
        let readable = flags & open_flags::READ != 0;
        let writable = flags & open_flags::WRITE != 0;
        let creates = flags & (open_flags::CREATE | open_flags::TRUNCATE) != 0;
        if (creates || flags & open_flags::APPEND != 0) && !writable {
            return Err(StoreError::Invalid("create, truncate and append need write access".into()));
        }
        let mut need = Rights(0);
        if readable {
            need = need.union(Rights::READ);
        }
        if writable {
            need = need.union(Rights::WRITE);
        }
        if need.0 == 0 {
            need = Rights::LIST;
        }
        let mut o = OFlags::CLOEXEC | OFlags::NOFOLLOW;
        o |= match (readable, writable) {
            (true, true) => OFlags::RDWR,
            (false, true) => OFlags::WRONLY,
            _ => OFlags::RDONLY,
        };
        for (bit, f) in [
            (open_flags::CREATE, OFlags::CREATE),
            (open_flags::EXCLUSIVE, OFlags::EXCL),
            (open_flags::TRUNCATE, OFlags::TRUNC),
            (open_flags::APPEND, OFlags::APPEND),
            (open_flags::DIRECTORY, OFlags::DIRECTORY),
        ] {
            if flags & bit != 0 {
                o |= f;
            }
        }
        let follow = flags & open_flags::NOFOLLOW == 0;
        let t = self.locate_checked(who, path, follow, need)?;
        let io = self.counters.file(&t.rel);
        // openat2 refuses a mode without O_CREAT (EINVAL); clients may send one anyway.
        let mode = match flags & open_flags::CREATE {
            0 => Mode::empty(),
            _ => Mode::from_raw_mode(mode & 0o7777),
        };
        if !self.multi() {
            let fd = rustix::fs::openat2(t.dir(self), t.name.as_str(), o, mode, resolve_flags()).ctx("open", path)?;
            return Ok(OpenFile::new(File::from(fd), readable, writable, flags & open_flags::APPEND != 0, io, t.rel));
        }
        // Several devices: find (or place) the file, open and register it while no move
        // can switch it (and, to create, while no other name can appear).
        let _names = (flags & open_flags::CREATE != 0).then(|| self.namespace.lock());
        let entry = io.entry().clone();
        let _moves = entry.shared();
        // Where the name was before the lock may not be where it is now: a move can have
        // switched it since, so it is looked up again.
        let mut t = t;
        t.stat = None;
        let found = self.find_home(&t)?;
        let exists = found.is_some();
        let (mut alt, mut device) = found.unwrap_or((None, 0));
        if !exists && flags & open_flags::CREATE != 0 {
            device = self.place();
            if device != 0 {
                alt = Some(self.mkdirs_on(device as usize, devices::parent_of(&t.rel))?);
            }
        }
        let fd = rustix::fs::openat2(self.home_dir(&t, &alt), t.name.as_str(), o, mode, resolve_flags())
            .ctx("open", path)?;
        io.entry().set_device(device);
        let mut file = OpenFile::new(File::from(fd), readable, writable, flags & open_flags::APPEND != 0, io, t.rel);
        file.io.register(file.file.as_raw_fd());
        file.registered = true;
        Ok(file)
    }

    /// Lists a directory with each entry's attributes (Locus' own files are hidden).
    pub fn readdir(&self, who: &str, path: &str) -> Result<Vec<DirEntry>> {
        let t = self.locate(path, true)?;
        let dir = self.open_located_dir(&t, path)?;
        self.check(dir.as_fd(), who, Rights::LIST, path)?;
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir).ctx("readdir", path)? {
            let entry = entry.ctx("readdir", path)?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." || name.starts_with(RESERVED_PREFIX) {
                continue;
            }
            match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => out.push(DirEntry { name: name.to_string(), attr: attr_of(&st) }),
                Err(Errno::NOENT) => continue, // removed while we listed
                Err(e) => return Err(e).ctx("stat", name),
            }
        }
        if self.multi() {
            self.list_elsewhere(&t.rel, &mut out)?;
        }
        Ok(out)
    }

    /// Creates a directory; it inherits its parent's ACL until it is given its own.
    pub fn mkdir(&self, who: &str, path: &str, mode: u32) -> Result<()> {
        let t = self.locate_checked(who, path, false, Rights::WRITE)?;
        let _names = self.names_lock();
        self.not_elsewhere(&t)?;
        rustix::fs::mkdirat(t.dir(self), t.name.as_str(), Mode::from_raw_mode(mode & 0o7777)).ctx("mkdir", path)
    }

    /// Renames `from` to `to` (needs `d` where it leaves and `w` where it arrives).
    pub fn rename(&self, who: &str, from: &str, to: &str) -> Result<()> {
        let a = self.locate_checked(who, from, false, Rights::DELETE)?;
        let b = self.locate_checked(who, to, false, Rights::WRITE)?;
        self.views.not_within(&a.rel, from)?;
        self.views.not_within(&b.rel, to)?;
        if self.multi() {
            return self.rename_across(&a, &b, from);
        }
        // The object replaced at `to`, unless it is the one being renamed (another link).
        let replaced = last_link(self.removals.get(), b.dir(self), &b.name).filter(|&id| {
            rustix::fs::statat(a.dir(self), a.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| object_id(&st) != id)
        });
        rustix::fs::renameat(a.dir(self), a.name.as_str(), b.dir(self), b.name.as_str()).ctx("rename", from)?;
        report_removed(self.removals.get(), replaced);
        let directory = rustix::fs::statat(b.dir(self), b.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir());
        self.counters.renamed(&a.rel, &b.rel, directory);
        self.acls.invalidate();
        Ok(())
    }

    /// `rename` with several devices: a file is renamed on its device (replacing the name
    /// wherever it was), a directory on every device that has it.
    fn rename_across(&self, a: &Target, b: &Target, from: &str) -> Result<()> {
        let _names = self.namespace.lock();
        let (a_alt, a_dev) = self.home(a)?;
        let a_dir = self.home_dir(a, &a_alt);
        let st = rustix::fs::statat(a_dir, a.name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ctx("rename", from)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
            if self.home(b)?.0.is_some() {
                return Err(StoreError::Os { op: "rename", path: from.to_string(), errno: Errno::NOTDIR });
            }
            if self.has_content_elsewhere(&b.rel)? {
                return Err(StoreError::Os { op: "rename", path: from.to_string(), errno: Errno::NOTEMPTY });
            }
            let intent = self.intend_rename_dir(&a.rel, &b.rel)?;
            rustix::fs::renameat(a.dir(self), a.name.as_str(), b.dir(self), b.name.as_str()).ctx("rename", from)?;
            let moved = self.rename_dir_elsewhere(&a.rel, &b.rel);
            if let Some(p) = intent {
                let _ = std::fs::remove_file(p);
            }
            moved?;
        } else {
            let b_dir =
                if a_dev == 0 { None } else { Some(self.mkdirs_on(a_dev as usize, devices::parent_of(&b.rel))?) };
            let target = b_dir.as_ref().map_or(b.dir(self), |d| d.as_fd());
            rustix::fs::renameat(a_dir, a.name.as_str(), target, b.name.as_str()).ctx("rename", from)?;
            self.drop_duplicates(&b.rel, a_dev);
        }
        self.counters.renamed(&a.rel, &b.rel, rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir());
        self.acls.invalidate();
        Ok(())
    }

    /// Creates a symlink at `path` holding `target` (which is not checked: following it is).
    pub fn symlink(&self, who: &str, target: &str, path: &str) -> Result<()> {
        if target.is_empty() || target.len() > MAX_PATH || target.contains('\0') {
            return Err(StoreError::Invalid("bad symlink target".into()));
        }
        let t = self.locate_checked(who, path, false, Rights::WRITE)?;
        let _names = self.names_lock();
        self.not_elsewhere(&t)?;
        rustix::fs::symlinkat(target, t.dir(self), t.name.as_str()).ctx("symlink", path)
    }

    /// The target of a symlink.
    pub fn readlink(&self, who: &str, path: &str) -> Result<String> {
        let t = self.locate_checked(who, path, false, Rights::LIST)?;
        let link = rustix::fs::readlinkat(t.dir(self), t.name.as_str(), Vec::new()).ctx("readlink", path)?;
        link.into_string().map_err(|_| StoreError::Invalid(format!("{path}: symlink target is not UTF-8")))
    }

    /// Creates a hard link `to` for the file `from`.
    pub fn link(&self, who: &str, from: &str, to: &str) -> Result<()> {
        let a = self.locate_checked(who, from, false, Rights::READ)?;
        let b = self.locate_checked(who, to, false, Rights::WRITE)?;
        self.views.not_within(&b.rel, to)?;
        let _names = self.names_lock();
        self.not_elsewhere(&b)?;
        let (a_alt, a_dev) = self.home(&a)?;
        // A hard link lives on its file's device.
        let b_alt = if a_dev == 0 { None } else { Some(self.mkdirs_on(a_dev as usize, devices::parent_of(&b.rel))?) };
        let (a_dir, b_dir) = (self.home_dir(&a, &a_alt), self.home_dir(&b, &b_alt));
        rustix::fs::linkat(a_dir, a.name.as_str(), b_dir, b.name.as_str(), AtFlags::empty()).ctx("link", to)
    }

    /// Sets the size of the file at `path`.
    pub fn truncate(&self, who: &str, path: &str, size: u64) -> Result<()> {
        let f = self.open(who, path, open_flags::WRITE, 0)?;
        rustix::fs::ftruncate(&*f.file, size).ctx("truncate", path)
    }

    /// Sets permission bits of the object at `path` (following symlinks).
    pub fn chmod(&self, who: &str, path: &str, mode: u32) -> Result<()> {
        let t = self.locate_checked(who, path, true, Rights::WRITE)?;
        let (alt, _) = self.home(&t)?;
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd =
            rustix::fs::openat(self.home_dir(&t, &alt), t.name.as_str(), flags, Mode::empty()).ctx("chmod", path)?;
        // An O_PATH descriptor cannot be fchmod'ed; its /proc entry names exactly this object.
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::chmodat(rustix::fs::CWD, proc_path.as_str(), Mode::from_raw_mode(mode & 0o7777), AtFlags::empty())
            .ctx("chmod", path)
    }

    /// Sets access and modification times of the object at `path`.
    pub fn utimes(&self, who: &str, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        let t = self.locate_checked(who, path, true, Rights::WRITE)?;
        let (alt, _) = self.home(&t)?;
        let times = Timestamps { last_access: to_timespec(atime), last_modification: to_timespec(mtime) };
        rustix::fs::utimensat(self.home_dir(&t, &alt), t.name.as_str(), &times, AtFlags::SYMLINK_NOFOLLOW)
            .ctx("utimes", path)
    }

    /// File-system statistics of the file system that holds `path`.
    pub fn statfs(&self, who: &str, path: &str) -> Result<StatFs> {
        let t = self.locate_checked(who, path, true, Rights::LIST)?;
        let mut s = rustix::fs::fstatvfs(t.dir(self)).ctx("statfs", path)?;
        // Several devices: their space together, in the first one's units.
        for d in &self.devices[1..] {
            if let Ok(o) = rustix::fs::fstatvfs(&d.root) {
                let scale = |n: u64| n * o.f_frsize / s.f_frsize.max(1);
                s.f_blocks += scale(o.f_blocks);
                s.f_bfree += scale(o.f_bfree);
                s.f_bavail += scale(o.f_bavail);
                s.f_files += o.f_files;
                s.f_ffree += o.f_ffree;
            }
        }
        Ok(StatFs::from(&s))
    }

    /// Checks existence and, for mode bits R=4, W=2, X=1, the ACL right each needs.
    pub fn access(&self, who: &str, path: &str, mode: u32) -> Result<()> {
        let t = self.locate_checked(who, path, true, Rights::LIST)?;
        let (alt, _) = self.home(&t)?;
        let st = rustix::fs::statat(self.home_dir(&t, &alt), t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .ctx("access", path)?;
        let rights = self.rights_in(t.dir(self), who)?;
        let wanted = [(4, Rights::READ, 0o444), (2, Rights::WRITE, 0o222), (1, Rights::LIST, 0o111)];
        for (bit, right, perm_bits) in wanted {
            if mode & bit != 0 && (!rights.contains(right) || st.st_mode as u32 & perm_bits == 0) {
                return Err(StoreError::Os { op: "access", path: path.to_string(), errno: Errno::ACCESS });
            }
        }
        Ok(())
    }

    /// The ACL in force on the directory `path`.
    pub fn acl_get(&self, who: &str, path: &str) -> Result<Acl> {
        let dir = self.open_target_dir(path)?;
        self.check(dir.as_fd(), who, Rights::LIST, path)?;
        Ok((*self.acl_of(dir.as_fd())?).clone())
    }

    /// Sets one subject's rights on the directory `path`, which then has an ACL of its
    /// own (a copy of what it inherited, changed).
    pub fn acl_set(&self, who: &str, path: &str, subject: &str, rights: Rights) -> Result<()> {
        if !Acl::valid_subject(subject) {
            return Err(StoreError::Invalid(format!("bad subject name {subject:?}")));
        }
        let dir = self.open_target_dir(path)?;
        self.check(dir.as_fd(), who, Rights::ADMIN, path)?;
        let mut acl = (*self.acl_of(dir.as_fd())?).clone();
        acl.set(subject, rights);
        self.write_acl(dir.as_fd(), &acl)
    }

    fn write_acl(&self, dir: BorrowedFd<'_>, acl: &Acl) -> Result<()> {
        let tmp = format!("{RESERVED_PREFIX}_acl_{}", random_hex());
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, tmp.as_str(), flags, Mode::from_raw_mode(0o600)).ctx("write ACL", &tmp)?;
        let text = acl.render();
        let written = rustix::io::write(&fd, text.as_bytes()).and_then(|_| rustix::fs::fsync(&fd));
        if let Err(e) = written.and_then(|_| rustix::fs::renameat(dir, tmp.as_str(), dir, ACL_FILE)) {
            let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            return Err(e).ctx("write ACL", ACL_FILE);
        }
        self.acls.invalidate();
        Ok(())
    }

    /// Export totals, per-operation counts and the busiest files; needs `a` at the root.
    pub fn stats(&self, who: &str, top: u32) -> Result<StatsReport> {
        self.check(self.root.as_fd(), who, Rights::ADMIN, "/")?;
        let devices = self
            .devices
            .iter()
            .zip(self.counters.devices())
            .enumerate()
            .map(|(i, (d, io))| {
                let (free_bytes, total_bytes) = d.space();
                DeviceStats { index: i as u32, path: d.path.display().to_string(), io, total_bytes, free_bytes }
            })
            .collect();
        Ok(StatsReport {
            export: self.counters.export(),
            ops: self.counters.ops(),
            busiest: self.counters.busiest(top.min(10_000) as usize),
            clients: 0,
            devices,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::resolve::split;
    #[test]
    fn uploads_a_killed_server_left_are_swept_at_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        let stale = dir.path().join(format!("a/b/{}_put_0123", super::RESERVED_PREFIX));
        std::fs::write(&stale, b"partial").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        std::fs::File::options().write(true).open(&stale).unwrap().set_modified(old).unwrap();
        let kept = dir.path().join("a/b/.__locus_putnot");
        std::fs::write(&kept, b"a user's file").unwrap();
        // An upload begun as the store opens is no one's leftover.
        let live = dir.path().join(format!("a/{}_put_4567", super::RESERVED_PREFIX));
        std::fs::write(&live, b"in progress").unwrap();
        let _store = super::Store::new(dir.path(), &super::Acl::default()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stale.exists() {
            assert!(std::time::Instant::now() < deadline, "the stale upload is still there");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(kept.exists() && live.exists());
    }

    use super::*;

    #[test]
    fn split_normalizes_and_refuses_reserved_names() {
        assert_eq!(split("/").unwrap(), (".".into(), ".".into(), "".into()));
        assert_eq!(split("/a//./b/").unwrap(), ("a".into(), "b".into(), "a/b".into()));
        assert_eq!(split("x").unwrap(), (".".into(), "x".into(), "x".into()));
        assert_eq!(split("a/..").unwrap(), ("a/..".into(), ".".into(), "a/..".into()));
        assert!(matches!(split("a/.__locus_acl"), Err(StoreError::Reserved { .. })));
        assert!(split("a\0b").is_err());
        assert!(split(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn an_upload_appends_files_from_outside_the_export_whole_and_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let (export, outside) = (tmp.path().join("export"), tmp.path().join("parts"));
        std::fs::create_dir_all(&export).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let mut initial = Acl::default();
        initial.set("admin", Rights::ALL);
        let store = Store::new(&export, &initial).unwrap();
        let first: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(outside.join("1"), &first).unwrap();
        std::fs::write(outside.join("2"), b"tail").unwrap();
        // From another file system (tmpfs), where copy_file_range answers EXDEV: the copy
        // goes through memory instead.
        let shm = tempfile::tempdir_in("/dev/shm").expect("/dev/shm for a file on another file system");
        let other: Vec<u8> = (0..1_500_000u32).map(|i| (i % 241) as u8).collect();
        std::fs::write(shm.path().join("3"), &other).unwrap();
        let mut put = store.begin_put("admin", "/whole.bin", 0o644).unwrap();
        put.write(b"head").unwrap();
        for part in [outside.join("1"), shm.path().join("3"), outside.join("2")] {
            let f = std::fs::File::open(part).unwrap();
            let n = put.append_file(&f, 0, u64::MAX).unwrap();
            assert_eq!(n, f.metadata().unwrap().len());
        }
        // A range of one, from each kind of file system.
        for part in [outside.join("1"), shm.path().join("3")] {
            assert_eq!(put.append_file(&std::fs::File::open(part).unwrap(), 1000, 5).unwrap(), 5);
        }
        assert!(!export.join("whole.bin").exists(), "nothing shows before the upload ends");
        let attr = put.finish().unwrap();
        let want = [&b"head"[..], &first, &other, b"tail", &first[1000..1005], &other[1000..1005]].concat();
        assert_eq!(attr.size, want.len() as u64);
        assert_eq!(std::fs::read(export.join("whole.bin")).unwrap(), want);
    }

    #[test]
    fn rights_at_the_root_follow_its_acl_by_any_spelling() {
        let tmp = tempfile::tempdir().unwrap();
        let mut initial = Acl::default();
        initial.set("admin", Rights::ALL);
        let store = Store::new(tmp.path(), &initial).unwrap();
        store.mkdir("admin", "/sub", 0o755).unwrap();
        store.acl_set("admin", "/sub", "bob", Rights::READ).unwrap();
        for root in ["/", "", "/./", "."] {
            assert_eq!(store.rights("bob", root).unwrap(), Rights::default(), "{root:?}");
        }
        store.acl_set("admin", "/", "bob", Rights::EXECUTE).unwrap();
        for root in ["/", "", "/./", "."] {
            assert_eq!(store.rights("bob", root).unwrap(), Rights::EXECUTE, "{root:?}");
        }
        assert_eq!(store.rights("bob", "/sub").unwrap(), Rights::READ);
        assert_eq!(store.rights("bob", "/sub/..").unwrap(), Rights::EXECUTE);
    }

    #[test]
    fn an_upload_adopts_a_file_of_its_file_system_and_refuses_one_of_another() {
        let tmp = tempfile::tempdir().unwrap();
        let (export, outside) = (tmp.path().join("export"), tmp.path().join("assembled"));
        std::fs::create_dir_all(&export).unwrap();
        let mut initial = Acl::default();
        initial.set("admin", Rights::ALL);
        let store = Store::new(&export, &initial).unwrap();
        std::fs::write(&outside, b"assembled elsewhere").unwrap();
        let mut put = store.begin_put("admin", "/adopted", 0o640).unwrap();
        assert_eq!(put.adopt(&outside).unwrap(), 19);
        put.finish().unwrap();
        assert!(outside.exists(), "the file keeps its own name");
        assert_eq!(std::fs::read(export.join("adopted")).unwrap(), b"assembled elsewhere");
        // From tmpfs: EXDEV, and the upload goes on as it was.
        let shm = tempfile::tempdir_in("/dev/shm").expect("/dev/shm for a file on another file system");
        std::fs::write(shm.path().join("x"), b"other").unwrap();
        let mut put = store.begin_put("admin", "/adopted", 0o640).unwrap();
        assert!(matches!(put.adopt(&shm.path().join("x")), Err(StoreError::Os { errno: Errno::XDEV, .. })));
        put.write(b"written").unwrap();
        // Only before any byte was written.
        std::fs::write(&outside, b"late").unwrap();
        assert!(put.adopt(&outside).is_err());
        put.finish().unwrap();
        assert_eq!(std::fs::read(export.join("adopted")).unwrap(), b"written");
        assert!(shm.path().join("x").exists() && outside.exists());
        // Into a set-group-ID directory of another group: the file takes that group, as
        // a file made there would (the test runs as root, who may give it).
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        store.mkdir("admin", "/shared", 0o755).unwrap();
        std::os::unix::fs::chown(export.join("shared"), None, Some(100)).unwrap();
        std::fs::set_permissions(export.join("shared"), std::fs::Permissions::from_mode(0o2775)).unwrap();
        let grouped = tmp.path().join("grouped");
        std::fs::write(&grouped, b"g").unwrap();
        let mut put = store.begin_put("admin", "/shared/g", 0o644).unwrap();
        put.adopt(&grouped).unwrap();
        put.finish().unwrap();
        assert_eq!(std::fs::metadata(export.join("shared/g")).unwrap().gid(), 100);
    }
}
