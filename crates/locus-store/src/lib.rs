//! The exported directory tree: every path a client names is resolved here, beneath the
//! export root and without races, checked against the ACLs, and counted.
//!
//! - [`Store`]: the operations on paths, each taking the acting subject.
//! - [`OpenFile`] and [`PutFile`]: what an open handle and an upload in progress hold.
//! - [`acl`]: per-directory access-control lists.
//! - [`counters`]: per-file, per-export and per-operation I/O counters.
//! - [`error`]: [`StoreError`], mapped to wire codes.
//! - [`RemovalObserver`]: told when an object leaves the export, so what others attach
//!   to objects (scripts' per-file state) goes with it.
//!
//! Confinement: the parent directory of every name is opened with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, and the final component is acted on through
//! that descriptor with no-follow semantics. A final symlink is followed by hand (at most
//! 40 hops), each hop resolved again beneath the root, so a symlink that points out, or
//! one swapped in during an operation, fails instead of escaping.

pub mod acl;
pub mod counters;
pub mod error;

pub use acl::{Acl, ACL_FILE, RESERVED_PREFIX};
pub use counters::{Counters, FileIo};
pub use error::{Result, StoreError};

use error::OsContext;
use locus_proto::types::{open_flags, Attr, DirEntry, Rights, SetTime, StatFs, StatsReport, Time};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Longest path accepted from a client, as PATH_MAX.
pub const MAX_PATH: usize = 4096;
/// Symlink hops followed before giving ELOOP, as Linux does.
const MAX_HOPS: usize = 40;

/// An object's identity on the server: device and inode numbers.
pub type ObjectId = (u64, u64);

/// Told when an object leaves the export through the store: its last name removed by
/// `unlink`, `rmdir`, or replaced by `rename` or a finished `put`. Other parts of the
/// server attach things to objects (scripts' per-file state) and drop them here.
/// Removals made on the server's disk behind the store's back are not seen.
pub trait RemovalObserver: Send + Sync {
    /// True while anything is attached or could be (a script holds a handle); when
    /// false, removals are not looked up at all.
    fn watching(&self) -> bool;
    /// The object is gone.
    fn removed(&self, object: ObjectId);
}

// `struct stat` field types differ between architectures; the casts are for the others.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn object_id(st: &rustix::fs::Stat) -> ObjectId {
    (st.st_dev as u64, st.st_ino as u64)
}

/// The object `name` in `dir` stands for, when removing that name removes the object (a
/// directory, or a file with one link) and `observer` is watching.
fn last_link(observer: Option<&Arc<dyn RemovalObserver>>, dir: BorrowedFd<'_>, name: &str) -> Option<ObjectId> {
    if !observer?.watching() {
        return None;
    }
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir();
    (is_dir || st.st_nlink <= 1).then_some(object_id(&st))
}

/// Tells `observer` that `gone` left the export, if it did.
fn report_removed(observer: Option<&Arc<dyn RemovalObserver>>, gone: Option<ObjectId>) {
    if let (Some(o), Some(id)) = (observer, gone) {
        o.removed(id);
    }
}

/// An export: a directory tree shared with clients.
pub struct Store {
    root: OwnedFd,
    root_key: ObjectId,
    acls: acl::AclCache,
    counters: Counters,
    removals: std::sync::OnceLock<Arc<dyn RemovalObserver>>,
}

/// A name located beneath the root: the directory holding it, opened, and the final
/// component (`.` when the path names a directory itself).
struct Target {
    dir: Option<OwnedFd>,
    name: String,
    /// The normalized path relative to the root, for counters and messages.
    rel: String,
    /// What `locate` learned of the final name while checking it for a symlink (not a
    /// symlink, so this is also what following it gives); saves stating it again.
    stat: Option<rustix::fs::Stat>,
}

impl Target {
    fn dir<'a>(&'a self, store: &'a Store) -> BorrowedFd<'a> {
        self.dir.as_ref().map(|d| d.as_fd()).unwrap_or(store.root.as_fd())
    }
}

/// An open file as a handle holds it; the object stays bound across renames.
pub struct OpenFile {
    pub file: File,
    pub readable: bool,
    pub writable: bool,
    /// Opened to append: writes go to the end whatever their offset.
    pub append: bool,
    /// Counters of the file, charged on every read and write through this handle.
    pub io: FileIo,
    pub rel: String,
}

/// An upload in progress: bytes go to a hidden temporary file that replaces the target
/// only when [`PutFile::finish`] is called, so a failed upload leaves the old file intact.
pub struct PutFile {
    file: File,
    dir: Option<OwnedFd>,
    store_root: OwnedFd,
    tmp: String,
    name: String,
    mode: u32,
    done: bool,
    pub io: FileIo,
    removals: Option<Arc<dyn RemovalObserver>>,
}

// `struct stat` field types differ between architectures; the casts are for the others.
#[allow(clippy::unnecessary_cast)]
fn attr_of(st: &rustix::fs::Stat) -> Attr {
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

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// Splits a client path into (parent, final name, normalized relative path).
fn split(path: &str) -> Result<(String, String, String)> {
    if path.len() > MAX_PATH {
        return Err(StoreError::Os { op: "resolve", path: path.chars().take(64).collect(), errno: Errno::NAMETOOLONG });
    }
    if path.contains('\0') {
        return Err(StoreError::Invalid("path contains a NUL byte".into()));
    }
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if comps.iter().any(|c| c.starts_with(RESERVED_PREFIX)) {
        return Err(StoreError::Reserved { path: path.to_string() });
    }
    let rel = comps.join("/");
    Ok(match comps.split_last() {
        None => (".".into(), ".".into(), rel),
        Some((&"..", _)) => (rel.clone(), ".".into(), rel),
        Some((last, [])) => (".".into(), last.to_string(), rel),
        Some((last, parents)) => (parents.join("/"), last.to_string(), rel),
    })
}

fn to_timespec(t: SetTime) -> Timespec {
    match t {
        SetTime::Omit => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        SetTime::Now => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
        SetTime::At(t) => Timespec { tv_sec: t.sec, tv_nsec: t.nsec as _ },
    }
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS provides randomness");
    hex::encode(b)
}

impl Store {
    /// Opens an export rooted at `root`. When the root has no ACL yet, `initial_acl`
    /// becomes its ACL (this is how a fresh export gets its first administrator).
    pub fn new(root: &Path, initial_acl: &Acl) -> Result<Store> {
        let shown = root.display().to_string();
        let fd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .ctx("open export root", &shown)?;
        let st = rustix::fs::fstat(&fd).ctx("stat", &shown)?;
        let store = Store {
            root: fd,
            root_key: object_id(&st),
            acls: acl::AclCache::default(),
            counters: Counters::default(),
            removals: std::sync::OnceLock::new(),
        };
        if acl::read_acl(store.root.as_fd())?.is_none() {
            store.write_acl(store.root.as_fd(), initial_acl)?;
        }
        Ok(store)
    }

    /// The export's counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Sets who is told of removals (once; later calls are ignored).
    pub fn observe_removals(&self, observer: Arc<dyn RemovalObserver>) {
        let _ = self.removals.set(observer);
    }

    fn open_dir(&self, parent: &str, shown: &str) -> Result<Option<OwnedFd>> {
        if parent == "." {
            return Ok(None);
        }
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        rustix::fs::openat2(&self.root, parent, flags, Mode::empty(), resolve_flags()).ctx("resolve", shown).map(Some)
    }

    /// Finds the directory holding `path` and its final name, following a final symlink
    /// when `follow` is set.
    fn locate(&self, path: &str, follow: bool) -> Result<Target> {
        let (mut parent, mut name, mut rel) = split(path)?;
        let mut dir = self.open_dir(&parent, path)?;
        if !follow || name == "." {
            return Ok(Target { dir, name, rel, stat: None });
        }
        for _ in 0..MAX_HOPS {
            let d = dir.as_ref().map(|d| d.as_fd()).unwrap_or(self.root.as_fd());
            let st = match rustix::fs::statat(d, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => return Ok(Target { dir, name, rel, stat: None }),
                Err(e) => return Err(e).ctx("stat", path),
            };
            if st.st_mode as u32 & locus_proto::types::S_IFMT != locus_proto::types::S_IFLNK {
                return Ok(Target { dir, name, rel, stat: Some(st) });
            }
            let link = rustix::fs::readlinkat(d, name.as_str(), Vec::new()).ctx("readlink", path)?;
            let link =
                link.to_str().map_err(|_| StoreError::Invalid(format!("{path}: symlink target is not UTF-8")))?;
            if link.starts_with('/') {
                return Err(StoreError::Escape { path: path.to_string() });
            }
            let joined = if parent == "." { link.to_string() } else { format!("{parent}/{link}") };
            (parent, name, rel) = split(&joined)?;
            dir = self.open_dir(&parent, path)?;
            if name == "." {
                return Ok(Target { dir, name, rel, stat: None });
            }
        }
        Err(StoreError::Os { op: "resolve", path: path.to_string(), errno: Errno::LOOP })
    }

    fn rights_in(&self, dir: BorrowedFd<'_>, who: &str) -> Result<Rights> {
        Ok(self.acl_of(dir)?.rights_of(who))
    }

    /// The ACL in force in `dir`.
    fn acl_of(&self, dir: BorrowedFd<'_>) -> Result<Arc<Acl>> {
        // Names directly beneath the root are the common case; the root's identity is known.
        let known = (dir.as_raw_fd() == self.root.as_raw_fd()).then_some(self.root_key);
        self.acls.effective(dir, known, self.root_key)
    }

    fn check(&self, dir: BorrowedFd<'_>, who: &str, need: Rights, path: &str) -> Result<()> {
        if self.rights_in(dir, who)?.contains(need) {
            Ok(())
        } else {
            Err(StoreError::Denied { path: path.to_string(), need })
        }
    }

    /// Locates `path` and checks `need` on the directory that holds it.
    fn locate_checked(&self, who: &str, path: &str, follow: bool, need: Rights) -> Result<Target> {
        let t = self.locate(path, follow)?;
        self.check(t.dir(self), who, need, path)?;
        Ok(t)
    }

    /// Opens the directory that `path` names (following symlinks) for reading.
    fn open_target_dir(&self, path: &str) -> Result<OwnedFd> {
        let t = self.locate(path, true)?;
        self.open_located_dir(&t, path)
    }

    fn open_located_dir(&self, t: &Target, path: &str) -> Result<OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat2(t.dir(self), t.name.as_str(), flags, Mode::empty(), resolve_flags()).ctx("opendir", path)
    }

    /// Opens the directory `path` for code to run in: needs `r` and `l` there, and `w`
    /// too when `write` is set.
    pub fn open_workdir(&self, who: &str, path: &str, write: bool) -> Result<OwnedFd> {
        let dir = self.open_target_dir(path)?;
        let mut need = Rights::READ.union(Rights::LIST);
        if write {
            need = need.union(Rights::WRITE);
        }
        self.check(dir.as_fd(), who, need, path)?;
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
            None => rustix::fs::statat(t.dir(self), t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ctx("stat", path)?,
        };
        Ok(attr_of(&st))
    }

    /// `lstat`: a final symlink is described, not followed.
    pub fn lstat(&self, who: &str, path: &str) -> Result<Attr> {
        let t = self.locate_checked(who, path, false, Rights::LIST)?;
        let st = rustix::fs::statat(t.dir(self), t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ctx("lstat", path)?;
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
        let fd =
            rustix::fs::openat2(t.dir(self), t.name.as_str(), o, Mode::from_raw_mode(mode & 0o7777), resolve_flags())
                .ctx("open", path)?;
        Ok(OpenFile {
            file: File::from(fd),
            readable,
            writable,
            append: flags & open_flags::APPEND != 0,
            io: self.counters.file(&t.rel),
            rel: t.rel,
        })
    }

    /// Lists a directory with each entry's attributes (Locus' own files are hidden).
    pub fn readdir(&self, who: &str, path: &str) -> Result<Vec<DirEntry>> {
        let dir = self.open_target_dir(path)?;
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
        Ok(out)
    }

    /// Creates a directory; it inherits its parent's ACL until it is given its own.
    pub fn mkdir(&self, who: &str, path: &str, mode: u32) -> Result<()> {
        let t = self.locate_checked(who, path, false, Rights::WRITE)?;
        rustix::fs::mkdirat(t.dir(self), t.name.as_str(), Mode::from_raw_mode(mode & 0o7777)).ctx("mkdir", path)
    }

    /// Removes an empty directory (its hidden ACL file does not count as content).
    pub fn rmdir(&self, who: &str, path: &str) -> Result<()> {
        let t = self.locate_checked(who, path, false, Rights::DELETE)?;
        let d = t.dir(self);
        let gone = last_link(self.removals.get(), d, &t.name);
        match rustix::fs::unlinkat(d, t.name.as_str(), AtFlags::REMOVEDIR) {
            Err(Errno::NOTEMPTY) if self.only_acl_inside(d, &t.name)? => {
                let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let sub = rustix::fs::openat(d, t.name.as_str(), flags, Mode::empty()).ctx("rmdir", path)?;
                rustix::fs::unlinkat(&sub, ACL_FILE, AtFlags::empty()).ctx("rmdir", path)?;
                rustix::fs::unlinkat(d, t.name.as_str(), AtFlags::REMOVEDIR).ctx("rmdir", path)?;
            }
            r => r.ctx("rmdir", path)?,
        }
        report_removed(self.removals.get(), gone);
        self.acls.invalidate();
        Ok(())
    }

    fn only_acl_inside(&self, dir: BorrowedFd<'_>, name: &str) -> Result<bool> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let sub = rustix::fs::openat(dir, name, flags, Mode::empty()).ctx("rmdir", name)?;
        for entry in rustix::fs::Dir::read_from(&sub).ctx("readdir", name)? {
            let entry = entry.ctx("readdir", name)?;
            let n = entry.file_name().to_bytes();
            if n != b"." && n != b".." && n != ACL_FILE.as_bytes() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Removes a name that is not a directory.
    pub fn unlink(&self, who: &str, path: &str) -> Result<()> {
        let t = self.locate_checked(who, path, false, Rights::DELETE)?;
        let gone = last_link(self.removals.get(), t.dir(self), &t.name);
        rustix::fs::unlinkat(t.dir(self), t.name.as_str(), AtFlags::empty()).ctx("unlink", path)?;
        report_removed(self.removals.get(), gone);
        self.counters.removed(&t.rel);
        Ok(())
    }

    /// Renames `from` to `to` (needs `d` where it leaves and `w` where it arrives).
    pub fn rename(&self, who: &str, from: &str, to: &str) -> Result<()> {
        let a = self.locate_checked(who, from, false, Rights::DELETE)?;
        let b = self.locate_checked(who, to, false, Rights::WRITE)?;
        // The object replaced at `to`, unless it is the one being renamed (another link).
        let replaced = last_link(self.removals.get(), b.dir(self), &b.name).filter(|&id| {
            rustix::fs::statat(a.dir(self), a.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| object_id(&st) != id)
        });
        rustix::fs::renameat(a.dir(self), a.name.as_str(), b.dir(self), b.name.as_str()).ctx("rename", from)?;
        report_removed(self.removals.get(), replaced);
        self.counters.renamed(&a.rel, &b.rel);
        self.acls.invalidate();
        Ok(())
    }

    /// Creates a symlink at `path` holding `target` (which is not checked: following it is).
    pub fn symlink(&self, who: &str, target: &str, path: &str) -> Result<()> {
        if target.is_empty() || target.len() > MAX_PATH || target.contains('\0') {
            return Err(StoreError::Invalid("bad symlink target".into()));
        }
        let t = self.locate_checked(who, path, false, Rights::WRITE)?;
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
        rustix::fs::linkat(a.dir(self), a.name.as_str(), b.dir(self), b.name.as_str(), AtFlags::empty()).ctx("link", to)
    }

    /// Sets the size of the file at `path`.
    pub fn truncate(&self, who: &str, path: &str, size: u64) -> Result<()> {
        let f = self.open(who, path, open_flags::WRITE, 0)?;
        rustix::fs::ftruncate(&f.file, size).ctx("truncate", path)
    }

    /// Sets permission bits of the object at `path` (following symlinks).
    pub fn chmod(&self, who: &str, path: &str, mode: u32) -> Result<()> {
        let t = self.locate_checked(who, path, true, Rights::WRITE)?;
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(t.dir(self), t.name.as_str(), flags, Mode::empty()).ctx("chmod", path)?;
        // An O_PATH descriptor cannot be fchmod'ed; its /proc entry names exactly this object.
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::chmodat(rustix::fs::CWD, proc_path.as_str(), Mode::from_raw_mode(mode & 0o7777), AtFlags::empty())
            .ctx("chmod", path)
    }

    /// Sets access and modification times of the object at `path`.
    pub fn utimes(&self, who: &str, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        let t = self.locate_checked(who, path, true, Rights::WRITE)?;
        let times = Timestamps { last_access: to_timespec(atime), last_modification: to_timespec(mtime) };
        rustix::fs::utimensat(t.dir(self), t.name.as_str(), &times, AtFlags::SYMLINK_NOFOLLOW).ctx("utimes", path)
    }

    /// File-system statistics of the file system that holds `path`.
    pub fn statfs(&self, who: &str, path: &str) -> Result<StatFs> {
        let t = self.locate_checked(who, path, true, Rights::LIST)?;
        let s = rustix::fs::fstatvfs(t.dir(self)).ctx("statfs", path)?;
        Ok(StatFs {
            bsize: s.f_bsize,
            frsize: s.f_frsize,
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            namemax: s.f_namemax,
        })
    }

    /// Checks existence and, for mode bits R=4, W=2, X=1, the ACL right each needs.
    pub fn access(&self, who: &str, path: &str, mode: u32) -> Result<()> {
        let t = self.locate_checked(who, path, true, Rights::LIST)?;
        let st = rustix::fs::statat(t.dir(self), t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ctx("access", path)?;
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
        Ok(StatsReport {
            export: self.counters.export(),
            ops: self.counters.ops(),
            busiest: self.counters.busiest(top.min(10_000) as usize),
            clients: 0,
        })
    }

    /// Starts an upload that will replace `path` when finished.
    pub fn begin_put(&self, who: &str, path: &str, mode: u32) -> Result<PutFile> {
        let t = self.locate_checked(who, path, true, Rights::WRITE)?;
        if t.name == "." {
            return Err(StoreError::Os { op: "put", path: path.to_string(), errno: Errno::ISDIR });
        }
        let tmp = format!("{RESERVED_PREFIX}_put_{}", random_hex());
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(t.dir(self), tmp.as_str(), flags, Mode::from_raw_mode(0o600)).ctx("put", path)?;
        Ok(PutFile {
            file: File::from(fd),
            dir: t.dir,
            store_root: self.root.try_clone().map_err(|e| StoreError::Invalid(e.to_string()))?,
            tmp,
            name: t.name,
            mode: mode & 0o7777,
            done: false,
            io: self.counters.file(&t.rel),
            removals: self.removals.get().cloned(),
        })
    }
}

impl OpenFile {
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
        Ok(attr_of(&rustix::fs::fstat(&self.file).ctx("fstat", &self.rel)?))
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
            match rustix::io::pread(&self.file, &mut buf[got..], offset + got as u64) {
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
        let start = Instant::now();
        let mut done = 0;
        while done < data.len() {
            match rustix::io::pwrite(&self.file, &data[done..], offset + done as u64) {
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
        rustix::fs::fsync(&self.file).ctx("fsync", &self.rel)
    }

    /// Sets the size of the open file.
    pub fn ftruncate(&self, size: u64) -> Result<()> {
        self.need(true)?;
        rustix::fs::ftruncate(&self.file, size).ctx("ftruncate", &self.rel)
    }
}

impl PutFile {
    /// Appends a chunk of the upload.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        use std::io::Write;
        let start = Instant::now();
        self.file.write_all(data).map_err(|e| StoreError::Os {
            op: "put",
            path: self.name.clone(),
            errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
        })?;
        self.io.write(data.len() as u64, start.elapsed());
        Ok(())
    }

    /// Makes the upload durable and moves it over the target in one atomic rename.
    pub fn finish(mut self) -> Result<Attr> {
        let dir = self.dir.as_ref().map(|d| d.as_fd()).unwrap_or(self.store_root.as_fd());
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(self.mode)).ctx("put", &self.name)?;
        rustix::fs::fdatasync(&self.file).ctx("put", &self.name)?;
        let replaced = last_link(self.removals.as_ref(), dir, &self.name);
        rustix::fs::renameat(dir, self.tmp.as_str(), dir, self.name.as_str()).ctx("put", &self.name)?;
        report_removed(self.removals.as_ref(), replaced);
        self.done = true;
        Ok(attr_of(&rustix::fs::fstat(&self.file).ctx("put", &self.name)?))
    }
}

impl Drop for PutFile {
    fn drop(&mut self) {
        if !self.done {
            let dir = self.dir.as_ref().map(|d| d.as_fd()).unwrap_or(self.store_root.as_fd());
            let _ = rustix::fs::unlinkat(dir, self.tmp.as_str(), AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
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
}
