//! `locus mount`: a Locus export as a local file system, through FUSE, so unmodified
//! programs use remote data.
//!
//! [`LocusFs`] implements `fuser::Filesystem` over a protocol driver (`locus-drivers`:
//! a Locus server, a chirp_server, or an HTTP server read-only). Inode numbers
//! are local: each path the kernel looks up gets one ([`inodes::Inodes`]), and renames
//! move the paths beneath. Open files are server handles, which bind to the object as
//! POSIX does: a file removed or renamed while open stays readable and writable.
//! Attributes and names (present or absent) are cached by the kernel: with
//! [`Consistency::Sprite`] (the default) until the server's callback break says they
//! changed, else (or while the promises are not held) for `attr_timeout`, an NFS-like
//! attribute cache; file data by the kernel's page cache, dropped on open when the
//! file's size or modification time changed, or by a break. The mount keeps the attributes
//! the server answered too, for `attr_timeout`, so that a kernel question right after
//! an open costs no round trip, and directory listings ([`listings`]), so that looking up
//! a name, present or absent, in a recently listed directory costs none either. A file
//! opened for reading whose attributes are that fresh and whose pages are cached is
//! opened at the server only if a read needs it (as the attribute cache, it trusts what
//! it learned within the timeout; `make` reopens the same headers for every compile).
//!
//! Writes are sent behind: each `write(2)` is answered at once and the server's replies
//! are collected when the file is flushed, so their errors show at `close` or `fsync`.
//! The kernel's own write-back cache is not used: with it the kernel never again takes a
//! cached file's size from the server, so changes made by other clients would not show.
//! Permissions are the server's: its ACLs decide every operation.
//!
//! Errors keep their errno: the drivers answer POSIX codes (Locus' own codes and
//! Chirp's map to the closest errno), and a lost connection is `EIO`.

mod inodes;
mod journal;
mod listings;
mod writeback;

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use inodes::Inodes;
use listings::{Known, Listings};
use locus_drivers::{Attr, Driver, DriverError, SetTime, Time};
use locus_proto::types::{open_flags, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use writeback::{Copies, Refused};

/// How a mount keeps what it caches consistent with the server and its other clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Consistency {
    /// Attributes, names, listings and pages are trusted for the attribute timeout, then
    /// asked for again: another client's change may stay unseen that long.
    Nfs,
    /// The server promises a callback for everything the mount asks about, and breaks
    /// it when another client changes the path; until then the kernel and the mount
    /// trust what they have indefinitely. Writes go through to the server as they are
    /// made (behind, as always), so other clients never read stale data once a write
    /// is answered and its break has arrived. Where the driver has no callbacks, it is
    /// [`Consistency::Nfs`].
    #[default]
    Sprite,
    /// As [`Consistency::Sprite`] for what the mount reads, and files opened for writing
    /// are written back: into a whole-file copy on local disk ([`writeback`]), stored at
    /// the server in one round trip when closed or synced. Other clients see a file's
    /// new content once it is closed (AFS's close-to-open), and errors of the store show
    /// at `close` or `fsync`. A file made where the mount's callbacks say the name is
    /// free, in a directory the server let it write in within the attribute timeout, is
    /// made at the server by that store: creating, writing and closing a small file is
    /// one round trip.
    Afs,
}

/// How a mount behaves.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may trust attributes and names without asking again, when
    /// no callback covers them.
    pub attr_timeout: Duration,
    pub consistency: Consistency,
    /// The most callback promises the server keeps for the mount (the oldest are
    /// broken to make room).
    pub max_promises: u32,
    /// Where [`Consistency::Afs`] keeps its local copies.
    pub cache_dir: std::path::PathBuf,
    /// The most bytes of local copies (a file larger than an eighth of it is written
    /// through instead), and of copies not yet stored (a writer past it waits for
    /// stores).
    pub cache_limit: u64,
    /// What the mount shows (its URL): the journal's records name it, and a mount
    /// stores at start only the unsaved copies an earlier mount of the same origin left.
    pub origin: String,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            attr_timeout: Duration::from_secs(1),
            consistency: Consistency::default(),
            max_promises: 1 << 18,
            cache_dir: writeback::default_dir(),
            cache_limit: 1 << 30,
            origin: String::new(),
        }
    }
}

/// How long the kernel and the mount trust what a held callback covers: until a break,
/// in practice.
const CALLBACK_TTL: Duration = Duration::from_secs(24 * 3600);

/// What each file's pages in the kernel's cache hold: the size and modification time
/// the file had when the mount last let the kernel cache them (shared with the thread
/// that takes breaks, which keeps those pages when a connection is lost).
type Seen = Arc<parking_lot::Mutex<HashMap<u64, (u64, Time)>>>;

/// How many handles the kernel holds on each inode (open files and mappings), shared
/// with the thread that takes breaks.
type OpenFiles = Arc<parking_lot::Mutex<HashMap<u64, usize>>>;

/// Breaks that arrived and that the mount's own caches have not taken in yet.
#[derive(Default)]
struct Broken {
    paths: Vec<String>,
    /// Every promise is gone.
    all: bool,
}

/// The directory and name of a path (`/` for a name at the root).
fn split_path(path: &str) -> Option<(&str, &str)> {
    let (dir, name) = path.rsplit_once('/')?;
    Some((if dir.is_empty() { "/" } else { dir }, name))
}

/// Takes the server's callback breaks as they come: records them for the mount's own
/// caches, then tells the kernel to drop the attributes, pages, names and listings they
/// cover. It runs on a thread of its own, since a notification may wait for a request
/// the mount's thread is answering.
fn take_breaks(
    breaks: std::sync::mpsc::Receiver<locus_drivers::Break>,
    index: inodes::PathIndex,
    notifier: Arc<OnceLock<fuser::Notifier>>,
    broken: Arc<parking_lot::Mutex<Broken>>,
    seen: Seen,
    open_files: OpenFiles,
) {
    use locus_drivers::Break;
    for b in breaks {
        // A break names what changed: its names, attributes and pages go. A lost
        // connection (every promise gone) says only that anything may have changed: the
        // kernel forgets names and attributes, except that a file whose pages it holds,
        // and that no one has open, keeps its name and pages and only its attributes are
        // asked for again. Its next open compares the server's size and modification
        // time with those the pages were cached at (`seen`), and keeps them only if they
        // are the same (a new size drops them at once); a name the server no longer has
        // goes at its next look (`found_gone`). The cache is revalidated, not thrown
        // away.
        let (paths, all) = match b {
            Break::Paths(paths) => {
                tracing::debug!(?paths, "callback broken");
                broken.lock().paths.extend(paths.iter().cloned());
                (paths, false)
            }
            Break::All => {
                broken.lock().all = true;
                (index.lock().keys().cloned().collect(), true)
            }
        };
        let Some(notifier) = notifier.get() else { continue };
        for path in paths {
            let (ino, parent) = {
                let index = index.lock();
                let parent = split_path(&path).and_then(|(dir, name)| Some((*index.get(dir)?, name.to_string())));
                (index.get(&path).copied(), parent)
            };
            // Errors say the kernel has nothing cached there: nothing to drop.
            if let Some(ino) = ino {
                if all && seen.lock().contains_key(&ino) && !open_files.lock().contains_key(&ino) {
                    let _ = notifier.inval_inode(ino, -1, 0);
                    continue;
                }
                let _ = notifier.inval_inode(ino, 0, 0);
            }
            if let Some((dir, name)) = parent {
                let _ = notifier.inval_entry(dir, OsStr::new(&name));
                let _ = notifier.inval_inode(dir, 0, 0);
            }
        }
    }
}

/// Whether a FUSE file system is mounted on `mountpoint`, by /proc/self/mountinfo (the
/// mount point is field 5; the type follows the ` - ` separator).
pub fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let target = mountpoint.to_string_lossy();
    info.lines().any(|l| {
        let on_target = l.split(' ').nth(4) == Some(target.as_ref());
        let fuse = l.split_once(" - ").is_some_and(|(_, rest)| rest.starts_with("fuse"));
        on_target && fuse
    })
}

/// A remote directory as a FUSE file system.
pub struct LocusFs {
    driver: Box<dyn Driver>,
    inodes: Inodes,
    options: MountOptions,
    /// Size and modification time of each file when last opened, to keep its cached
    /// pages only while it is unchanged.
    seen: Seen,
    /// Where the mount reports a name it found gone at the server after a lost
    /// connection (its kernel entry was kept for its cached pages), to drop it.
    gone: Option<std::sync::mpsc::Sender<locus_drivers::Break>>,
    /// The kernel's handles on each inode ([`LocusFs::opened_file`]).
    open_files: OpenFiles,
    /// Server handles open on each inode: how a file removed while open is still
    /// described (the kernel asks for its attributes without a handle).
    open: HashMap<u64, Vec<u64>>,
    /// The attributes last answered by the server for each inode, and when.
    attrs: HashMap<u64, (Attr, Instant)>,
    /// Names in recently listed directories.
    listings: Listings,
    /// Read-only opens not yet made at the server, by the handle given to the kernel:
    /// the inode, and the server handle once a read needed one.
    lazy: HashMap<u64, (u64, Option<u64>)>,
    next_lazy: u64,
    /// Handles written through since their last flush, which then learns the attributes
    /// the writes left: the pages they put in the kernel's cache stay valid after it.
    written: HashSet<u64>,
    /// The whole content of files opened for writing while empty and written only
    /// through that handle since, up to [`KNOWN_MAX`]: reads on the handle answer from it
    /// (programs that read back what they write, as `as` does, cost no round trip).
    /// Also, by the handle given to the kernel, small files fetched whole at their open
    /// or first read ([`LocusFs::fetch_small`]).
    known: HashMap<u64, Vec<u8>>,
    /// How the mount puts known content into the kernel's cache, once its session exists.
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Whether the driver turned callbacks on (they hold only while
    /// `Driver::callbacks_held` says so).
    callbacks: bool,
    /// Breaks not yet taken in by the mount's own caches.
    broken: Arc<parking_lot::Mutex<Broken>>,
    /// The file-system statistics last answered, and when: `find` asks for each
    /// directory it enters.
    statfs: Option<(locus_drivers::StatFs, Instant)>,
    /// Local copies of files written back (`--consistency afs`; `None` otherwise).
    copies: Option<Copies>,
    /// Handles given to the kernel on local copies: the inode and the Locus open flags.
    copy_handles: HashMap<u64, (u64, u32)>,
    /// Directories the server let the mount write in, and when it last did: where files
    /// may be made and written locally before the server has a say.
    writable: HashMap<u64, Instant>,
    /// Directories where a removal lately succeeded at the server, and when: later
    /// removals there are sent without waiting (see [`LocusFs::may_remove_behind`]).
    removable: HashMap<u64, Instant>,
    /// While listings asked for ahead are outstanding, [`Listings::changes`] when the
    /// first of them was asked for: once it moves, they may be out of date.
    ahead_since: Option<u64>,
    /// Directories whose subdirectories were asked for ahead since then.
    walked: HashSet<u64>,
    /// What the process running the mount asks of it from outside the FUSE loop.
    control: Arc<Control>,
    /// When unsaved copies no handle uses were last tried again.
    retried: Instant,
    /// Storing everything on request from outside the FUSE loop's own requests: the
    /// kernel is not handed pages meanwhile.
    closing: bool,
}

/// Between a mount and the process running it: a request to store everything before
/// it goes (taken at the next `statfs` of the mount point, which the process makes to
/// deliver it), and how many copies are not stored yet.
#[derive(Default)]
pub struct Control {
    store_all: AtomicBool,
    unsaved: AtomicU64,
}

impl Control {
    /// Asks the mount to store every unsaved copy (and wait for every change sent
    /// behind) when it answers the next `statfs`.
    pub fn request_store(&self) {
        self.store_all.store(true, Ordering::SeqCst);
    }

    /// Copies the mount holds that the server does not have yet.
    pub fn unsaved(&self) -> u64 {
        self.unsaved.load(Ordering::SeqCst)
    }
}

/// How often unsaved copies whose store failed are tried again.
const RETRY_EVERY: Duration = Duration::from_secs(5);

/// The most content kept per handle in [`LocusFs::known`].
const KNOWN_MAX: usize = 8 << 20;
/// Files at most this large are fetched whole to be read (see [`LocusFs::fetch_small`]).
const WHOLE_MAX: u64 = 256 << 10;

/// Handles of opens deferred until a read needs them are numbered from here (the
/// drivers' own handles are far below).
const FIRST_LAZY: u64 = 1 << 63;

fn errno(e: DriverError) -> i32 {
    if e.class != locus_drivers::ErrorClass::Answer {
        tracing::warn!("{e}");
    }
    e.errno
}

fn system_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
    }
}

fn set_time(t: Option<TimeOrNow>) -> SetTime {
    match t {
        None => SetTime::Omit,
        Some(TimeOrNow::Now) => SetTime::Now,
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            SetTime::At(Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() })
        }
    }
}

fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    let kind = match a.mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        0o020000 => FileType::CharDevice,
        0o060000 => FileType::BlockDevice,
        0o010000 => FileType::NamedPipe,
        0o140000 => FileType::Socket,
        _ => FileType::RegularFile,
    };
    FileAttr {
        ino,
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind,
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink as u32,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// `open(2)` flags as Locus open flags.
fn locus_flags(flags: i32) -> u32 {
    let mut f = match flags & libc::O_ACCMODE {
        libc::O_WRONLY => open_flags::WRITE,
        libc::O_RDWR => open_flags::READ | open_flags::WRITE,
        _ => open_flags::READ,
    };
    for (posix, locus) in [
        (libc::O_APPEND, open_flags::APPEND),
        (libc::O_CREAT, open_flags::CREATE),
        (libc::O_EXCL, open_flags::EXCLUSIVE),
        (libc::O_TRUNC, open_flags::TRUNCATE),
        (libc::O_DIRECTORY, open_flags::DIRECTORY),
        (libc::O_NOFOLLOW, open_flags::NOFOLLOW),
    ] {
        if flags & posix != 0 {
            f |= locus;
        }
    }
    f
}

impl LocusFs {
    /// A file system showing `base` (a directory path on the server) through `driver`.
    pub fn new(mut driver: Box<dyn Driver>, base: &str, options: MountOptions) -> LocusFs {
        let breaks = match options.consistency {
            Consistency::Sprite | Consistency::Afs => driver.callbacks(options.max_promises),
            Consistency::Nfs => None,
        };
        let inodes = Inodes::new(base);
        let notifier = Arc::new(OnceLock::new());
        let broken = Arc::new(parking_lot::Mutex::new(Broken::default()));
        let (seen, open_files) = (Seen::default(), OpenFiles::default());
        let callbacks = breaks.is_some();
        let mut gone = None;
        if let Some(from_server) = breaks {
            // The mount's own breaks (names found gone after a lost connection) join
            // the server's on the way to the thread that tells the kernel.
            let (tx, breaks) = std::sync::mpsc::channel();
            gone = Some(tx.clone());
            let (index, n, b, s, o) =
                (inodes.index(), notifier.clone(), broken.clone(), seen.clone(), open_files.clone());
            let forward = move || from_server.into_iter().try_for_each(|b| tx.send(b));
            let spawned = std::thread::Builder::new()
                .name("locus-breaks".into())
                .spawn(move || take_breaks(breaks, index, n, b, s, o))
                .and_then(|_| std::thread::Builder::new().name("locus-breaks-in".into()).spawn(forward));
            if let Err(e) = spawned {
                tracing::warn!("no thread for callback breaks: {e}");
            }
        }
        let copies = match options.consistency {
            Consistency::Afs => Copies::new(&options.cache_dir, options.cache_limit, &options.origin)
                .map_err(|e| tracing::warn!("{}: {e}; files are written through", options.cache_dir.display()))
                .ok(),
            _ => None,
        };
        let mut fs = LocusFs {
            control: Arc::default(),
            retried: Instant::now(),
            closing: false,
            callbacks,
            copies,
            copy_handles: HashMap::new(),
            writable: HashMap::new(),
            removable: HashMap::new(),
            driver,
            inodes,
            listings: Listings::default(),
            options,
            seen,
            gone,
            open_files,
            open: HashMap::new(),
            attrs: HashMap::new(),
            lazy: HashMap::new(),
            next_lazy: FIRST_LAZY,
            written: HashSet::new(),
            known: HashMap::new(),
            notifier,
            broken,
            statfs: None,
            ahead_since: None,
            walked: HashSet::new(),
        };
        fs.recover();
        fs
    }

    /// What the process running the mount uses to ask it to store before it goes.
    pub fn control(&self) -> Arc<Control> {
        self.control.clone()
    }

    /// How long what the server answers now may be trusted: until a break while the
    /// server holds this mount's callbacks, else the attribute timeout.
    fn ttl(&self) -> Duration {
        if self.callbacks && self.driver.callbacks_held() {
            CALLBACK_TTL
        } else {
            self.options.attr_timeout
        }
    }

    /// Drops from the mount's own caches what breaks since the last call cover.
    fn absorb(&mut self) {
        if !self.callbacks {
            return;
        }
        let broken = std::mem::take(&mut *self.broken.lock());
        if broken.all {
            // (`seen` stays: what the kernel's pages hold, which the next open compares
            // with what the server answers then.)
            self.drop_fetched(|_| true);
            self.attrs.clear();
            self.listings.clear();
            self.removable.clear();
        }
        for path in &broken.paths {
            self.forget(path);
        }
        // Answers the server could not promise: trusted only for the attribute timeout
        // (the kernel was told that one), so the mount drops its own copy now.
        for path in self.driver.take_unpromised() {
            self.forget(&path);
        }
        self.failed_behind(false);
        if self.retried.elapsed() >= RETRY_EVERY {
            self.retry_unsaved();
        }
    }

    /// The server says `ino`'s name is gone, which the kernel still holds (kept with its
    /// pages across a lost connection): the kernel is told to drop it.
    fn found_gone(&mut self, ino: u64) {
        if let (Some(gone), Some(path)) = (&self.gone, self.inodes.path(ino)) {
            let _ = gone.send(locus_drivers::Break::Paths(vec![path.to_string()]));
        }
    }

    /// Drops what the mount knew of `path` and of its directory's entries.
    fn forget(&mut self, path: &str) {
        if let Some(ino) = self.inodes.peek(path) {
            self.drop_fetched(|i| i == ino);
            self.attrs.remove(&ino);
            self.seen.lock().remove(&ino);
            self.listings.forget(ino);
            self.removable.remove(&ino);
        }
        if let Some(dir) = split_path(path).and_then(|(dir, _)| self.inodes.peek(dir)) {
            self.attrs.remove(&dir);
            self.listings.forget(dir);
            self.removable.remove(&dir);
        }
    }

    /// Takes the removals and renames sent without waiting that failed (after waiting
    /// for all of them with `wait`): the names were answered as changed, so what the
    /// mount knows of them is dropped and the next look asks the server, where they are
    /// as they were (the driver also reports each as a break, which drops them from the
    /// kernel's caches). Answers how many names failed.
    fn failed_behind(&mut self, wait: bool) -> usize {
        let failed = self.driver.failed_behind(wait);
        for (path, e) in &failed {
            tracing::warn!(
                "{path}: the server refused a change sent without waiting (errno {}): {}",
                e.errno,
                e.message
            );
            self.forget(path);
        }
        failed.len()
    }

    /// Writing back (`afs`) with callbacks held: what the mount knows stays true until a
    /// break says otherwise, so it may act on it before the server answers.
    fn writing_back_under_callbacks(&self) -> bool {
        self.copies.is_some() && self.ttl() == CALLBACK_TTL
    }

    /// True when removing `path`, `name` in `parent`, may go without waiting for the
    /// server's answer: writing back (`afs`) under callbacks, the mount knows `name` is
    /// there and not a directory (by its attributes or the listing), and a removal in
    /// `parent` succeeded at the server while the callbacks held. Such a removal goes out
    /// at once, ahead of anything later on the connection; should it fail, the failure is
    /// logged and the name shows again.
    fn may_remove_behind(&self, parent: u64, name: &OsStr, path: &str) -> bool {
        self.writing_back_under_callbacks()
            && self.known_file(parent, name, path) == Some(true)
            && self.removable.get(&parent).is_some_and(|at| at.elapsed() < self.ttl())
    }

    /// True when renaming `from` (`name` in `parent`) to `to` (`newname` in `newparent`)
    /// may go without waiting, as a removal may (see [`Self::may_remove_behind`]): the
    /// source is known to be a file, the target known to be absent or a file, a removal
    /// in `parent` and a write in `newparent` succeeded at the server while the callbacks
    /// held. A refused rename comes back as a break of both names.
    fn may_rename_behind(
        &self,
        (parent, name, from): (u64, &OsStr, &str),
        (newparent, newname, to): (u64, &OsStr, &str),
    ) -> bool {
        let ttl = self.ttl();
        let target_absent =
            || newname.to_str().is_some_and(|n| matches!(self.listings.find(newparent, n, ttl), Known::Absent));
        self.may_remove_behind(parent, name, from)
            && (self.known_file(newparent, newname, to) == Some(true) || target_absent())
            && self.may_write_in(newparent)
    }

    /// Whether `name` in `parent` (at `path`) is a non-directory, as far as the mount
    /// knows it now (fresh attributes or the listing): `None` when it does not know.
    fn known_file(&self, parent: u64, name: &OsStr, path: &str) -> Option<bool> {
        if let Some(attr) = self.inodes.peek(path).and_then(|ino| self.fresh(ino)) {
            return Some(!attr.is_dir());
        }
        match self.listings.find(parent, name.to_str()?, self.ttl()) {
            Known::Present(attr) => Some(!attr.is_dir()),
            _ => None,
        }
    }

    /// Where the session's notifier goes once the session exists (`Session::notifier`):
    /// with it, content the mount wrote whole is handed to the kernel's page cache, so
    /// that reading it back costs no round trip (the kernel does not keep a page that
    /// writes covered only in part, such as a file's last).
    pub fn notifier_slot(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// The server handle behind a handle given to the kernel, opening the file at the
    /// server now if its open was deferred.
    fn real(&mut self, fh: u64) -> Result<u64, i32> {
        let Some(&(ino, real)) = self.lazy.get(&fh) else { return Ok(fh) };
        if let Some(h) = real {
            return Ok(h);
        }
        let path = self.path(ino)?;
        let opened = self.driver.open(&path, open_flags::READ, 0).map_err(errno)?;
        self.lazy.insert(fh, (ino, Some(opened.handle)));
        self.open.entry(ino).or_default().push(opened.handle);
        Ok(opened.handle)
    }

    /// The whole content of `ino`, fetched in one round trip (a streamed `get`, refused as
    /// an open would be) where it is a small file and callbacks hold: reading a small
    /// file then costs one round trip, not an open and a read (`grep -r`, a compiler
    /// reading headers). Its handle answers reads from it ([`LocusFs::known`]) without
    /// being opened at the server, unless the name is about to go ([`LocusFs::pin`]),
    /// until a break drops it ([`LocusFs::drop_fetched`]). `None` for a large or active
    /// file, without callbacks, or where the fetch fails: the caller opens the file at
    /// the server as before (and reports that error).
    fn fetch_small(&mut self, ino: u64) -> Option<Vec<u8>> {
        let small = self.fresh(ino).is_some_and(|a| a.is_file() && a.size <= WHOLE_MAX);
        if !small || self.ttl() != CALLBACK_TTL || self.active(ino) {
            return None;
        }
        let path = self.path(ino).ok()?;
        let (content, attr) = self.driver.read_file(&path).ok()?;
        self.remember(ino, &attr);
        Some(content)
    }

    /// Opens a small file for reading by fetching it ([`LocusFs::fetch_small`]), on a
    /// handle not open at the server; also answers whether the kernel may keep the
    /// pages it has (only if the file is as it was when last opened).
    fn open_whole(&mut self, ino: u64) -> Option<(u64, bool)> {
        let content = self.fetch_small(ino)?;
        let now = self.fresh(ino).map(|a| (a.size, a.mtime))?;
        let keep = self.seen.lock().insert(ino, now) == Some(now);
        let fh = self.next_lazy;
        self.next_lazy += 1;
        self.lazy.insert(fh, (ino, None));
        self.known.insert(fh, content);
        Some((fh, keep))
    }

    /// Drops the contents fetched for handles not open at the server, of the inodes
    /// `of` picks: their next read opens the file there.
    fn drop_fetched(&mut self, of: impl Fn(u64) -> bool) {
        let lazy = &self.lazy;
        self.known.retain(|fh, _| !lazy.get(fh).is_some_and(|&(ino, real)| real.is_none() && of(ino)));
    }

    /// The server handle behind a handle given to the kernel, if the file is open at
    /// the server.
    fn opened(&self, fh: u64) -> Option<u64> {
        if self.copy_handles.contains_key(&fh) {
            return None;
        }
        match self.lazy.get(&fh) {
            Some(&(_, real)) => real,
            None => Some(fh),
        }
    }

    /// Opens at the server every deferred open of `ino`, before its name goes away.
    fn pin(&mut self, ino: Option<u64>) {
        let Some(ino) = ino else { return };
        let deferred: Vec<u64> =
            self.lazy.iter().filter(|(_, &(i, h))| i == ino && h.is_none()).map(|(&fh, _)| fh).collect();
        for fh in deferred {
            let _ = self.real(fh);
        }
    }

    /// `ino` changed through `fh` (`None`: by path): other handles' known content is stale.
    fn forget_known(&mut self, ino: u64, fh: Option<u64>) {
        for h in self.open.get(&ino).into_iter().flatten() {
            if Some(*h) != fh {
                self.known.remove(h);
            }
        }
    }

    /// Keeps attributes the server just answered.
    fn remember(&mut self, ino: u64, attr: &Attr) {
        self.attrs.insert(ino, (attr.clone(), Instant::now()));
    }

    /// Attributes of `ino` answered by the server recently enough to trust (see [`Self::ttl`]).
    fn fresh(&self, ino: u64) -> Option<&Attr> {
        let ttl = self.ttl();
        self.attrs.get(&ino).filter(|(_, at)| at.elapsed() < ttl).map(|(a, _)| a)
    }

    /// Forgets what was known of a directory whose entries changed (its times and link
    /// count did too), and of the entry at `path` in it.
    fn changed(&mut self, parent: u64, path: Option<&str>) {
        self.attrs.remove(&parent);
        if let Some(ino) = path.and_then(|p| self.inodes.peek(p)) {
            self.attrs.remove(&ino);
        }
    }

    /// A name of the file `ino` was made or removed here: the link count the kernel and
    /// this cache keep for its other names (other inodes here, one per path) is stale.
    fn links_changed(&mut self, ino: Option<u64>) {
        let Some((server_ino, dev)) = ino.and_then(|i| self.attrs.get(&i)).map(|(a, _)| (a.ino, a.dev)) else {
            return;
        };
        let others: Vec<u64> = self
            .attrs
            .iter()
            .filter(|(i, (a, _))| Some(**i) != ino && a.ino == server_ino && a.dev == dev && !a.is_dir())
            .map(|(i, _)| *i)
            .collect();
        for other in others {
            self.attrs.remove(&other);
            if let Some(notifier) = self.notifier.get() {
                // A negative offset: the attributes only, the cached pages stay.
                let _ = notifier.inval_inode(other, -1, 0);
            }
        }
    }

    /// The attributes of `ino` changed here (written, truncated, chmod): its entry in
    /// its directory's listing no longer describes it.
    fn file_changed(&mut self, ino: u64) {
        if let Some((parent, name)) = self.entry_of(ino) {
            self.listings.changed(parent, &name);
        }
    }

    /// The server just said what `ino` is: its entry in its directory's listing says so.
    fn file_known(&mut self, ino: u64, attr: Attr) {
        if let Some((parent, name)) = self.entry_of(ino) {
            self.listings.refresh(parent, &name, attr);
        }
    }

    /// The directory inode and name under which `ino` was looked up.
    fn entry_of(&self, ino: u64) -> Option<(u64, String)> {
        let (dir, name) = split_path(self.inodes.path(ino)?)?;
        Some((self.inodes.peek(dir)?, name.to_string()))
    }

    /// `name` was made in `parent` with `attr`.
    fn added(&mut self, parent: u64, name: &OsStr, attr: &Attr) {
        self.listings.added(parent, name.to_str().unwrap_or_default(), Some(attr.clone()));
    }

    /// Lists `dir` from the server into the listings, and answers the entries.
    fn list(&mut self, dir: u64) -> Result<Arc<Vec<locus_drivers::DirEntry>>, i32> {
        let stored = self.store_new_in(dir);
        let path = self.path(dir)?;
        // Listings asked for ahead answer only while nothing changed since they were:
        // not here (the listings hear of every change the mount makes, and new files
        // just stored may be missing from them) nor at the server (a break makes the
        // mount forget a listing, which counts as a change).
        if self.ahead_since.is_some_and(|at| stored || at != self.listings.changes()) {
            self.driver.drop_ahead();
            self.ahead_since = None;
            self.walked.clear();
        }
        let entries = Arc::new(self.driver.readdir(&path).map_err(errno)?);
        if self.driver.lists_all(&path) {
            self.listings.store(dir, &entries);
            self.list_ahead(dir, &path, &entries);
        }
        Ok(entries)
    }

    /// A program that lists a directory and then one of its subdirectories is walking
    /// the tree (`find`, `ls -R`, `du`, `grep -r`): the listings of the other
    /// subdirectories of both are asked for at once, without waiting, and each arrives
    /// while the program works through the ones before it. A round trip per directory
    /// then costs one for many. Only while callbacks hold: a listing that waits to be
    /// read is then as good as one the mount keeps.
    fn list_ahead(&mut self, dir: u64, path: &str, entries: &[locus_drivers::DirEntry]) {
        let parent = self.inodes.parent_of(dir);
        let ttl = self.ttl();
        if !self.callbacks || ttl != CALLBACK_TTL || parent == dir {
            return;
        }
        let Some(siblings) = self.listings.entries(parent, ttl) else { return };
        let Ok(parent_path) = self.path(parent) else { return };
        let mut dirs = Vec::new();
        for (at, base, list) in [(dir, path, entries), (parent, parent_path.as_str(), &siblings[..])] {
            if !self.walked.insert(at) {
                continue;
            }
            for e in list.iter().filter(|e| e.attr.is_dir()) {
                let child = inodes::join(base, &e.name);
                let listed = self.inodes.peek(&child).is_some_and(|ino| self.listings.entries(ino, ttl).is_some());
                if !listed && child != path {
                    dirs.push(child);
                }
            }
        }
        if !dirs.is_empty() {
            self.ahead_since.get_or_insert(self.listings.changes());
            self.driver.list_ahead(&dirs);
        }
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<String, i32> {
        let name = name.to_str().ok_or(libc::EINVAL)?;
        let dir = self.inodes.path(parent).ok_or(libc::ESTALE)?;
        Ok(inodes::join(dir, name))
    }

    fn path(&self, ino: u64) -> Result<String, i32> {
        self.inodes.path(ino).map(str::to_string).ok_or(libc::ESTALE)
    }

    /// Replies with the entry for `path`, giving it an inode number, which it answers.
    fn entry(&mut self, path: String, attr: &Attr, reply: ReplyEntry) -> u64 {
        let active = is_active(&path);
        let ino = self.inodes.lookup(path);
        if active {
            // An active file may still be growing: nothing about it is cached.
            reply.entry(&Duration::ZERO, &file_attr(ino, attr), 0);
        } else {
            self.remember(ino, attr);
            reply.entry(&self.ttl(), &file_attr(ino, attr), 0);
        }
        ino
    }

    /// True when the file `ino` names may be an active file (see [`is_active`]).
    fn active(&self, ino: u64) -> bool {
        self.inodes.path(ino).is_some_and(is_active)
    }

    fn lstat(&mut self, path: &str) -> Result<Attr, i32> {
        self.driver.lstat(path).map_err(errno)
    }

    /// The server let the mount write in the directory of `ino` just now.
    fn wrote_in(&mut self, ino: u64) {
        if let Some((dir, _)) = self.entry_of(ino) {
            self.wrote_in_dir(dir);
        }
    }

    /// The server let the mount write in `dir` just now (kept only when writing back).
    fn wrote_in_dir(&mut self, dir: u64) {
        if self.copies.is_some() {
            self.writable.insert(dir, Instant::now());
        }
    }

    /// The server let the mount remove a name from `dir` just now (kept only while
    /// writing back under callbacks, the one mode that acts on it).
    fn removed_in(&mut self, dir: u64) {
        if self.writing_back_under_callbacks() {
            self.removable.insert(dir, Instant::now());
        }
    }

    /// True when the server let the mount write in `dir` within the attribute timeout:
    /// a file may then be made or written there locally, its store checked at close.
    fn may_write_in(&self, dir: u64) -> bool {
        self.writable.get(&dir).is_some_and(|at| at.elapsed() < self.ttl())
    }

    /// What a file written back is now, while the server does not know it yet.
    fn unstored(&self, ino: u64) -> Option<Attr> {
        self.copies.as_ref()?.dirty(ino).map(|c| c.attr.clone())
    }

    /// A handle on the local copy of `ino`, for `open(2)` flags `flags`.
    fn copy_handle(&mut self, ino: u64, flags: i32) -> u64 {
        let fh = self.next_lazy;
        self.next_lazy += 1;
        self.copy_handles.insert(fh, (ino, locus_flags(flags)));
        if let Some(copy) = self.copies.as_mut().and_then(|c| c.get(ino)) {
            copy.handles += 1;
        }
        fh
    }

    /// Opens `ino` on its local copy, made now if it has none (fetched whole, unless
    /// truncated by the open), or `None` where the file is opened at the server: not
    /// writing back, an active file, not a plain file, a file with other names or too
    /// large, or a directory the mount has not been let write in lately.
    fn open_copy(&mut self, ino: u64, flags: i32) -> Option<(u64, bool)> {
        let truncate = flags & libc::O_TRUNC != 0;
        let fresh = self.fresh(ino).cloned();
        let copies = self.copies.as_mut()?;
        let file_max = copies.file_max();
        let kept =
            copies.get(ino).is_some_and(|c| c.dirty || !c.at_server || fresh.as_ref().is_some_and(|a| c.current(a)));
        if !kept {
            // A file also open at the server is written there: a copy stored later
            // would undo those writes.
            if self.open.contains_key(&ino) {
                return None;
            }
            let attr = fresh?;
            let writable = attr.mode & 0o222 != 0 && self.entry_of(ino).is_some_and(|(dir, _)| self.may_write_in(dir));
            if self.active(ino) || !attr.is_file() || attr.nlink > 1 || attr.size > file_max || !writable {
                return None;
            }
            let path = self.path(ino).ok()?;
            let (content, attr) = if truncate { (Vec::new(), attr) } else { self.driver.read_file(&path).ok()? };
            let started = self.copies.as_mut()?.start(ino, &path, &content, attr, true);
            if let Err(e) = started {
                tracing::warn!("local copy: {e}");
                return None;
            }
        }
        if truncate {
            let path = self.path(ino).ok()?;
            if self.copies.as_mut()?.truncate(ino, &path, 0).is_err() {
                return None;
            }
            self.sync_pin(ino);
        }
        Some((self.copy_handle(ino, flags), kept))
    }

    /// Stores the local copy of `ino` at the server if it has writes the server lacks
    /// (with `durable`, also if the server may not have them on disk yet, and asking that
    /// it has before it answers); the pages it now holds go to the kernel's cache. A
    /// store that fails leaves the copy as it was, unsaved and journaled.
    fn store(&mut self, ino: u64, durable: bool) -> Result<(), i32> {
        self.try_store(ino, durable).map_err(errno)
    }

    /// [`Self::store`], answering the driver's error.
    fn try_store(&mut self, ino: u64, durable: bool) -> Result<(), DriverError> {
        let Some(copy) = self.copies.as_mut().and_then(|c| c.get(ino)) else { return Ok(()) };
        if copy.unlinked || !(copy.dirty || durable && !copy.durable) {
            return Ok(());
        }
        let content =
            copy.contents().map_err(|e| DriverError::errno(e.raw_os_error().unwrap_or(libc::EIO), e.to_string()))?;
        let mode = copy.attr.mode & 0o7777;
        let path = self.path(ino).map_err(|e| DriverError::errno(e, "no path"))?;
        let attr = match durable {
            true => self.driver.write_file(&path, mode, &content),
            false => self.driver.store_file(&path, mode, &content),
        };
        let attr = match attr {
            Ok(attr) => attr,
            Err(e) => {
                if let Some(copy) = self.copies.as_mut().and_then(|c| c.get(ino)) {
                    copy.failed = Some(Instant::now());
                }
                return Err(e);
            }
        };
        if let Some(copies) = self.copies.as_mut() {
            copies.stored(ino, attr.clone(), durable);
            if let Some(copy) = copies.get(ino) {
                copy.failed = None;
            }
        }
        self.sync_pin(ino);
        self.wrote_in(ino);
        self.remember(ino, &attr);
        self.seen.lock().insert(ino, (attr.size, attr.mtime));
        self.file_known(ino, attr);
        if let (true, Some(notifier), false) = (content.len() <= KNOWN_MAX, self.notifier.get(), self.closing) {
            if let Err(e) = notifier.store(ino, 0, &content) {
                tracing::debug!("notify store: {e}");
            }
        }
        Ok(())
    }

    /// Keeps the mount's hold on the inode of a copy while it is unsaved (so its path
    /// is known, and follows renames, until it is stored), and lets go after.
    fn sync_pin(&mut self, ino: u64) {
        let Some(copy) = self.copies.as_mut().and_then(|c| c.get(ino)) else { return };
        let unsaved = copy.unsaved.is_some();
        if unsaved && !copy.pinned {
            copy.pinned = true;
            if let Some(path) = self.inodes.path(ino).map(str::to_string) {
                self.inodes.lookup(path);
            }
            self.control.unsaved.fetch_add(1, Ordering::SeqCst);
        } else if !unsaved && copy.pinned {
            copy.pinned = false;
            self.inodes.forget(ino, 1);
            self.control.unsaved.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// True for a failed store worth trying again later, its copy kept: the server
    /// could not be reached or was full; an answer that refuses the file (no right, a
    /// removed directory) would only come again.
    fn worth_keeping(e: &DriverError) -> bool {
        e.class != locus_drivers::ErrorClass::Answer || [libc::ENOSPC, libc::EDQUOT, libc::EIO].contains(&e.errno)
    }

    /// A store of `ino` failed with `e` where the copy is kept: it is made durable on
    /// the local disk and tried again later (and by the next mount, should this one go).
    fn kept(&mut self, ino: u64, e: &DriverError) {
        if let Some(copies) = self.copies.as_mut() {
            copies.keep(ino);
            let at = copies.journal_dir().display().to_string();
            tracing::warn!(
                "{}: not stored ({}); kept unsaved in {at}, to be tried again",
                self.path(ino).unwrap_or_default(),
                e.message
            );
        }
    }

    /// Tries again to store the unsaved copies no handle uses (their last store failed).
    fn retry_unsaved(&mut self) {
        self.retried = Instant::now();
        let Some(copies) = &self.copies else { return };
        let idle: Vec<u64> = copies
            .unsaved()
            .into_iter()
            .filter(|&ino| self.copies.as_ref().and_then(|c| c.dirty(ino)).is_some_and(|c| c.handles == 0))
            .collect();
        for ino in idle {
            match self.try_store(ino, false) {
                Ok(()) => tracing::info!("{}: stored on a later try", self.path(ino).unwrap_or_default()),
                Err(e) if Self::worth_keeping(&e) => {
                    self.kept(ino, &e);
                    break; // the server is away: the others would wait as long
                }
                Err(e) => {
                    // Refused for good: the copy stays in the journal for whoever looks
                    // (and the next mount tries once more), but this mount lets it go.
                    tracing::warn!(
                        "{}: refused ({}); its content is kept in {}",
                        self.path(ino).unwrap_or_default(),
                        e.message,
                        self.copies.as_ref().map(|c| c.journal_dir().display().to_string()).unwrap_or_default()
                    );
                    self.copies.as_mut().map(|c| c.keep(ino));
                    self.unpin_and_drop(ino);
                }
            }
        }
    }

    /// Lets go of the copy of `ino` without touching its journal files.
    fn unpin_and_drop(&mut self, ino: u64) {
        if let Some(copy) = self.copies.as_mut().and_then(|c| c.remove(ino)) {
            if copy.pinned {
                self.inodes.forget(ino, 1);
                self.control.unsaved.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Stores every unsaved copy, open or not (as `fsync` does), settles every write
    /// sent behind and waits for every removal and rename sent behind: what a mount
    /// does before it goes (a signal, `locus umount`, `destroy`). Copies whose store
    /// fails stay journaled, on the local disk, for the next mount. Answers how many.
    pub fn store_all(&mut self) -> usize {
        let written: Vec<u64> = self.written.iter().copied().collect();
        for h in written {
            if let Err(e) = self.driver.settle(h) {
                tracing::warn!("a write sent behind failed: {}", e.message);
            }
        }
        self.failed_behind(true);
        let unsaved = self.copies.as_ref().map(|c| c.unsaved()).unwrap_or_default();
        let mut left = 0;
        let mut away = false;
        for ino in unsaved {
            // A store that failed just now (a signal's store, then `destroy`'s) is not
            // waited for again.
            let failed_now = self.copies.as_mut().and_then(|c| c.get(ino)).and_then(|c| c.failed);
            away |= failed_now.is_some_and(|at| at.elapsed() < Duration::from_secs(2));
            let stored =
                if away { Err(DriverError::errno(libc::EIO, "the server is away")) } else { self.try_store(ino, true) };
            if let Err(e) = stored {
                away |= Self::worth_keeping(&e);
                left += 1;
                self.kept(ino, &e);
            }
        }
        if left > 0 {
            tracing::warn!("{left} files not stored; the next mount of this URL over the same --cache-dir stores them");
        }
        left
    }

    /// Stores what mounts of the same origin over the same cache directory left unsaved
    /// (killed, or the server away when they went): each copy is stored under its name
    /// if the server still has the version it was based on (or, for a file made there,
    /// still has no file by that name); else beside it, as `NAME.locus-conflict-TIME`,
    /// never over the other writer's version. What cannot be stored now stays for the
    /// next mount.
    fn recover(&mut self) {
        let Some(copies) = &self.copies else { return };
        let own = copies.journal_dir().to_path_buf();
        for orphans in journal::orphans(&self.options.cache_dir, &self.options.origin, &own) {
            for (record, data) in &orphans.records {
                match self.recover_one(record, data) {
                    Ok(to) => {
                        journal::forget_record(data);
                        let _ = std::fs::remove_file(data);
                        if to == record.path {
                            tracing::info!("{to}: stored what an earlier mount left unsaved");
                        } else {
                            tracing::warn!(
                                "{}: changed at the server since an earlier mount wrote it; its version is stored as {to}",
                                record.path
                            );
                        }
                    }
                    Err(e) => tracing::warn!(
                        "{}: left unsaved by an earlier mount, not stored now ({}); kept in {}",
                        record.path,
                        e.message,
                        data.display()
                    ),
                }
            }
            orphans.tidy();
        }
    }

    /// Stores one record's copy (see [`Self::recover`]); answers where it went.
    fn recover_one(&mut self, record: &journal::Record, data: &Path) -> Result<String, DriverError> {
        let content = std::fs::read(data).map_err(|e| DriverError::errno(libc::EIO, e.to_string()))?;
        let now = match self.driver.lstat(&record.path) {
            Ok(attr) => Some(attr),
            Err(e) if e.errno == libc::ENOENT => None,
            Err(e) => return Err(e),
        };
        let unchanged = match (&now, record.base) {
            (Some(a), Some((size, mtime))) => a.is_file() && (a.size, a.mtime) == (size, mtime),
            (None, None) => true,
            _ => false,
        };
        let to = match unchanged {
            true => record.path.clone(),
            false => format!("{}.locus-conflict-{}", record.path, writeback::now().sec),
        };
        self.driver.write_file(&to, record.mode, &content)?;
        Ok(to)
    }

    /// Moves `ino` off its local copy: stores it, then opens each of its handles at the
    /// server, where their next requests go (a file grown past what a copy may hold, or
    /// changed in a way only the server can make).
    fn spill(&mut self, ino: u64) -> Result<(), i32> {
        self.store(ino, false)?;
        let handles: Vec<(u64, u32)> =
            self.copy_handles.iter().filter(|(_, &(i, _))| i == ino).map(|(&fh, &(_, flags))| (fh, flags)).collect();
        let path = self.path(ino)?;
        for (fh, flags) in handles {
            let flags = flags & !(open_flags::CREATE | open_flags::EXCLUSIVE | open_flags::TRUNCATE);
            let opened = self.driver.open(&path, flags, 0).map_err(errno)?;
            self.copy_handles.remove(&fh);
            self.lazy.insert(fh, (ino, Some(opened.handle)));
            self.open.entry(ino).or_default().push(opened.handle);
        }
        self.copies.as_mut().map(|c| c.remove(ino));
        Ok(())
    }

    /// Stores the files made in `dir` that the server does not have yet, before the
    /// server is asked what `dir` holds (an error shows again at their close). Answers
    /// whether there were any.
    fn store_new_in(&mut self, dir: u64) -> bool {
        let Some(copies) = &self.copies else { return false };
        let mut any = false;
        for ino in copies.unstored_names() {
            if self.entry_of(ino).is_some_and(|(parent, _)| parent == dir) {
                any = true;
                if let Err(e) = self.store(ino, false) {
                    tracing::debug!("storing a new file before listing: errno {e}");
                }
            }
        }
        any
    }

    /// Makes `name` in `parent` as a local copy only, where the mount knows the name is
    /// free and the server let it write there lately (see [`Consistency::Afs`]); the
    /// store at close makes it at the server. Answers its inode and attributes.
    fn create_locally(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32) -> Option<(u64, Attr)> {
        let name_str = name.to_str()?;
        let free = self.listings.find(parent, name_str, self.ttl()) == Known::Absent;
        if !self.writing_back_under_callbacks() || !free || !self.may_write_in(parent) {
            return None;
        }
        let path = self.child(parent, name).ok()?;
        if is_active(&path) {
            return None;
        }
        let (uid, gid) = self.fresh(parent).map_or((req.uid(), req.gid()), |a| (a.uid, a.gid));
        let now = writeback::now();
        let attr = Attr {
            mode: S_IFREG | (mode & 0o7777),
            nlink: 1,
            uid,
            gid,
            blksize: 4096,
            atime: now,
            mtime: now,
            ctime: now,
            ..Attr::default()
        };
        let ino = self.inodes.lookup(path.clone());
        if let Err(e) = self.copies.as_mut()?.start(ino, &path, &[], attr.clone(), false) {
            tracing::warn!("local copy: {e}");
            return None;
        }
        self.sync_pin(ino);
        self.changed(parent, None);
        self.added(parent, name, &attr);
        self.remember(ino, &attr);
        Some((ino, attr))
    }

    /// A handle on the copy of `ino` was closed. With the last, the copy is stored if it
    /// still has to be (its flush said whether that worked). A store that failed keeps
    /// the copy, journaled on the local disk: where the server was away or full, the
    /// mount still shows it and tries again later; where the server refused it, the
    /// mount lets it go (a file never made at the server loses its name here) but its
    /// content stays in the journal, logged, for the next mount to try. A removed copy
    /// is dropped.
    fn release_copy(&mut self, ino: u64) {
        let Some(copy) = self.copies.as_mut().and_then(|c| c.get(ino)) else { return };
        copy.handles -= 1;
        if copy.handles > 0 {
            return;
        }
        // A store that failed just now (at the flush of this close) is not waited for
        // again: the copy is kept for a later try.
        let failed_now = copy.failed.is_some_and(|at| at.elapsed() < Duration::from_secs(2));
        let stored = match failed_now {
            true => Err(DriverError {
                errno: libc::EIO,
                message: "its store failed at close".into(),
                class: locus_drivers::ErrorClass::Transient,
            }),
            false => self.try_store(ino, false),
        };
        let Some(copy) = self.copies.as_mut().and_then(|c| c.get(ino)) else { return };
        if copy.unlinked {
            self.copies.as_mut().map(|c| c.remove(ino));
            return;
        }
        let never_made = !copy.at_server;
        match &stored {
            Ok(()) => return, // kept: it answers later opens while current
            Err(e) if Self::worth_keeping(e) => return self.kept(ino, e),
            Err(e) => {
                let dir = self.copies.as_ref().map(|c| c.journal_dir().display().to_string()).unwrap_or_default();
                tracing::warn!(
                    "{}: refused by the server (errno {}: {}); its content is kept in {dir}",
                    self.path(ino).unwrap_or_default(),
                    e.errno,
                    e.message
                );
                self.copies.as_mut().map(|c| c.keep(ino));
                self.unpin_and_drop(ino);
            }
        }
        if never_made {
            if let (Some((parent, name)), Ok(path)) = (self.entry_of(ino), self.path(ino)) {
                self.listings.removed(parent, &name);
                self.changed(parent, Some(&path));
                self.inodes.unlinked(&path);
            }
        }
    }

    /// The name of `ino` is gone: its local copy is not stored again, and is dropped
    /// once no handle uses it. Answers whether the name existed only here.
    fn copy_unlinked(&mut self, ino: Option<u64>) -> bool {
        let Some((ino, copies)) = ino.zip(self.copies.as_mut()) else { return false };
        let Some(copy) = copies.get(ino) else { return false };
        let (local_only, idle) = (!copy.at_server, copy.handles == 0);
        copies.unlink(ino);
        self.sync_pin(ino);
        if idle {
            self.copies.as_mut().map(|c| c.remove(ino));
        }
        local_only
    }
}

/// `FOPEN_NOFLUSH` (FUSE ABI 7.35, honoured by kernels since 5.16): the kernel sends no
/// `flush` when a descriptor of this handle is closed.
const FOPEN_NOFLUSH: u32 = 1 << 5;

macro_rules! ok_or_reply {
    ($e:expr, $reply:ident) => {
        match $e {
            Ok(v) => v,
            Err(code) => return $reply.error(code),
        }
    };
}

/// True for a path whose name may invoke an active-file handler: its attributes are not
/// cached and it is read without the page cache, since it may still be growing.
fn is_active(path: &str) -> bool {
    locus_proto::active::may_invoke(path.rsplit('/').next().unwrap_or(path))
}

impl LocusFs {
    /// Opens `ino` for the kernel: answers the handle and the `FOPEN_*` flags.
    fn open_handle(&mut self, ino: u64, flags: i32) -> Result<(u64, u32), i32> {
        let read_only = flags & (libc::O_ACCMODE | libc::O_TRUNC | libc::O_CREAT) == libc::O_RDONLY;
        // A handle that cannot write has nothing to flush: its close costs the kernel no
        // request (a compiler opens and closes each header it reads).
        let no_flush = if read_only { FOPEN_NOFLUSH } else { 0 };
        if flags & libc::O_TRUNC != 0 {
            self.file_changed(ino);
        }
        if read_only && self.active(ino) {
            // Read past the size the kernel knows: the output may still be growing, and
            // the server answers each read when its bytes are there (0 at the end).
            let path = self.path(ino)?;
            let opened = self.driver.open(&path, locus_flags(flags), 0).map_err(errno)?;
            self.open.entry(ino).or_default().push(opened.handle);
            return Ok((opened.handle, fuser::consts::FOPEN_DIRECT_IO | no_flush));
        }
        if !read_only || self.unstored(ino).is_some() {
            if let Some((fh, kept)) = self.open_copy(ino, flags) {
                return Ok((fh, no_flush | if kept { fuser::consts::FOPEN_KEEP_CACHE } else { 0 }));
            }
        }
        let cached = self.fresh(ino).map(|a| (a.size, a.mtime));
        if read_only && cached.is_some() && self.seen.lock().get(&ino) == cached.as_ref() {
            // Unchanged within the attribute timeout and its pages are cached: the kernel
            // may well read nothing from the server.
            let fh = self.next_lazy;
            self.next_lazy += 1;
            self.lazy.insert(fh, (ino, None));
            return Ok((fh, fuser::consts::FOPEN_KEEP_CACHE | no_flush));
        }
        if read_only {
            if let Some((fh, keep)) = self.open_whole(ino) {
                return Ok((fh, no_flush | if keep { fuser::consts::FOPEN_KEEP_CACHE } else { 0 }));
            }
        }
        let path = self.path(ino)?;
        let opened = self.driver.open(&path, locus_flags(flags), 0).map_err(errno)?;
        // Keep the cached pages only if the file is as it was when last opened.
        let now = (opened.attr.size, opened.attr.mtime);
        let keep = self.seen.lock().insert(ino, now) == Some(now);
        self.open.entry(ino).or_default().push(opened.handle);
        self.remember(ino, &opened.attr);
        if !read_only && opened.attr.size == 0 && opened.attr.is_file() {
            self.known.insert(opened.handle, Vec::new());
        }
        if !read_only {
            self.wrote_in(ino);
        }
        Ok((opened.handle, no_flush | if keep { fuser::consts::FOPEN_KEEP_CACHE } else { 0 }))
    }

    /// Makes `name` in `parent` and opens it for the kernel: answers its inode, its
    /// attributes and the handle.
    fn create_handle(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(u64, Attr, u64), i32> {
        if let Some((ino, attr)) = self.create_locally(req, parent, name, mode) {
            // Made by this open: stored at its close even where it is opened read-only.
            let fh = self.copy_handle(ino, flags | libc::O_CREAT);
            return Ok((ino, attr, fh));
        }
        let path = self.child(parent, name)?;
        let flags = locus_flags(flags) | open_flags::CREATE;
        // The server creates only for a writer; `open(O_CREAT | O_RDONLY)` (lock and
        // marker files, `flock FILE CMD`) makes the file as a local disk does, on a
        // handle that also may write. Should the file be there already and refuse
        // writing, it is opened for reading as asked.
        let as_writer = if flags & open_flags::WRITE == 0 { flags | open_flags::WRITE } else { flags };
        let opened = match self.driver.open(&path, as_writer, mode & 0o7777) {
            Err(e) if as_writer != flags && e.errno == libc::EACCES && flags & open_flags::EXCLUSIVE == 0 => {
                self.driver.open(&path, flags & !open_flags::CREATE, 0)
            }
            opened => opened,
        };
        let opened = opened.map_err(errno)?;
        self.changed(parent, None);
        self.added(parent, name, &opened.attr);
        let ino = self.inodes.lookup(path);
        self.remember(ino, &opened.attr);
        self.seen.lock().insert(ino, (opened.attr.size, opened.attr.mtime));
        self.open.entry(ino).or_default().push(opened.handle);
        if opened.attr.size == 0 {
            self.known.insert(opened.handle, Vec::new());
        }
        self.wrote_in(ino);
        Ok((ino, opened.attr, opened.handle))
    }

    /// Counts the kernel's handles on `ino` (`by` is 1 at an open, -1 at a release):
    /// the pages of a file open when a connection is lost are dropped, not kept to be
    /// revalidated, since reading them asks the mount nothing.
    fn opened_file(&mut self, ino: u64, by: isize) {
        let mut open = self.open_files.lock();
        let count = open.entry(ino).or_default();
        *count = count.saturating_add_signed(by);
        if *count == 0 {
            open.remove(&ino);
        }
    }
}

impl Filesystem for LocusFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        self.absorb();
        let path = ok_or_reply!(self.child(parent, name), reply);
        if let Some(attr) = self.inodes.peek(&path).and_then(|ino| self.unstored(ino)) {
            self.entry(path, &attr, reply);
            return;
        }
        let name = name.to_str().unwrap_or_default();
        if self.listings.worth_relisting(parent, self.ttl()) {
            // One round trip either way; listing again answers the next lookups too.
            let _ = self.list(parent);
        }
        let found = match self.listings.find(parent, name, self.ttl()) {
            Known::Present(attr) => Ok(attr),
            // A name that invokes an active-file handler is not in listings: ask.
            Known::Absent if !locus_proto::active::may_invoke(name) => Err(libc::ENOENT),
            Known::Absent | Known::Unknown => {
                let found = self.lstat(&path);
                match &found {
                    Ok(_) if locus_proto::active::may_invoke(name) => {}
                    Ok(attr) => self.listings.added(parent, name, Some(attr.clone())),
                    Err(libc::ENOENT) => drop(self.listings.removed(parent, name)),
                    Err(_) => {}
                }
                found
            }
        };
        match found {
            Ok(attr) => drop(self.entry(path, &attr, reply)),
            // Inode 0: the kernel remembers that the name is absent for the timeout (make
            // and compilers look up many names that do not exist), unless it may appear
            // by being named.
            Err(libc::ENOENT) => {
                let lists_all = self.inodes.path(parent).is_some_and(|dir| self.driver.lists_all(dir));
                let ttl = if lists_all { self.ttl() } else { Duration::ZERO };
                reply.entry(&ttl, &file_attr(0, &Attr::default()), 0)
            }
            Err(code) => reply.error(code),
        }
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
        if self.inodes.path(ino).is_none() {
            self.attrs.remove(&ino);
            self.listings.forget(ino);
            if let Some(copies) = &mut self.copies {
                if copies.get(ino).is_some_and(|c| c.handles == 0 && c.unsaved.is_none()) {
                    copies.remove(ino);
                }
            }
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, fh: Option<u64>, reply: ReplyAttr) {
        self.absorb();
        if let Some(attr) = self.unstored(ino) {
            return reply.attr(&self.ttl(), &file_attr(ino, &attr));
        }
        let active = self.active(ino);
        if let Some(attr) = self.fresh(ino).filter(|_| !active) {
            return reply.attr(&self.ttl(), &file_attr(ino, attr));
        }
        let fh = fh.and_then(|h| self.opened(h));
        let by_handle = fh.or_else(|| self.open.get(&ino).and_then(|v| v.first().copied()));
        let attr = match by_handle {
            Some(h) => self.driver.fstat(h).map_err(errno),
            None => self.path(ino).and_then(|p| self.lstat(&p)),
        };
        if let (Err(libc::ENOENT), None) = (&attr, by_handle) {
            self.found_gone(ino);
        }
        let attr = ok_or_reply!(attr, reply);
        if active {
            return reply.attr(&Duration::ZERO, &file_attr(ino, &attr));
        }
        self.remember(ino, &attr);
        reply.attr(&self.ttl(), &file_attr(ino, &attr));
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let copied = self.copies.as_mut().and_then(|c| c.get(ino)).map(|c| c.handles > 0 || c.dirty);
        if let (Some(true), Some(size), None, None, None, None, None) = (copied, size, mode, uid, gid, atime, mtime) {
            // A size set on a file being written back is set in its copy.
            let path = ok_or_reply!(self.path(ino), reply);
            match self.copies.as_mut().map(|c| c.truncate(ino, &path, size)) {
                Some(Ok(())) => {
                    self.sync_pin(ino);
                    self.file_changed(ino);
                    let attr = self.unstored(ino).unwrap_or_default();
                    return reply.attr(&self.ttl(), &file_attr(ino, &attr));
                }
                Some(Err(Refused::Io(e))) => return reply.error(e.raw_os_error().unwrap_or(libc::EIO)),
                _ => {}
            }
        }
        if copied.is_some() {
            // Anything else only the server can do: the file leaves its copy first.
            ok_or_reply!(self.spill(ino), reply);
        }
        let path = ok_or_reply!(self.path(ino), reply);
        let fh = match fh {
            Some(h) => Some(ok_or_reply!(self.real(h), reply)),
            None => None,
        };
        if uid.is_some() || gid.is_some() {
            // Ownership is the server's: a chown that changes nothing (as `tar` and
            // `cp -p` do) succeeds, any other is refused.
            let now = ok_or_reply!(self.lstat(&path), reply);
            if uid.is_some_and(|u| u != now.uid) || gid.is_some_and(|g| g != now.gid) {
                return reply.error(libc::EPERM);
            }
        }
        let only_times = mode.is_none() && size.is_none() && (atime.is_some() || mtime.is_some());
        if only_times && self.inodes.removed(ino) {
            // A removed file has no name to set times by; the kernel sends them as it
            // drops the inode of a file written before its removal.
            return match self.attrs.get(&ino) {
                Some((attr, _)) => reply.attr(&self.ttl(), &file_attr(ino, attr)),
                None => reply.error(libc::ENOENT),
            };
        }
        self.file_changed(ino);
        let known = self.attrs.get(&ino).map(|(a, _)| a.clone()).filter(Attr::is_file);
        if let (true, Some(h), Some(mut attr)) = (only_times, fh, known) {
            // Times set on an open file (`cp -p`, `tar`) go behind its writes, and the
            // attributes the mount knows, with the new times, answer.
            ok_or_reply!(self.driver.utimes_behind(&path, set_time(atime), set_time(mtime), h).map_err(errno), reply);
            let at = |t: Option<TimeOrNow>, old: Time| match set_time(t) {
                SetTime::Omit => old,
                SetTime::Now => writeback::now(),
                SetTime::At(t) => t,
            };
            attr.atime = at(atime, attr.atime);
            attr.mtime = at(mtime, attr.mtime);
            self.seen.lock().remove(&ino);
            self.written.insert(h);
            return reply.attr(&self.ttl(), &file_attr(ino, &attr));
        }
        let result = (|| -> Result<Attr, DriverError> {
            if let Some(mode) = mode {
                self.driver.chmod(&path, mode & 0o7777)?;
            }
            if let Some(size) = size {
                match fh {
                    Some(h) => self.driver.ftruncate(h, size)?,
                    None => self.driver.truncate(&path, size)?,
                }
                self.forget_known(ino, fh);
                if let Some(h) = fh {
                    match usize::try_from(size).ok().filter(|&size| size <= KNOWN_MAX) {
                        Some(size) => self.known.get_mut(&h).map_or((), |content| content.resize(size, 0)),
                        None => drop(self.known.remove(&h)),
                    }
                }
            }
            if atime.is_some() || mtime.is_some() {
                return self.driver.utimes_stat(&path, set_time(atime), set_time(mtime), fh);
            }
            match fh {
                Some(h) => self.driver.fstat(h),
                None => self.driver.lstat(&path),
            }
        })();
        let attr = ok_or_reply!(result.map_err(errno), reply);
        self.remember(ino, &attr);
        reply.attr(&self.ttl(), &file_attr(ino, &attr));
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let path = ok_or_reply!(self.path(ino), reply);
        let target = ok_or_reply!(self.driver.readlink(&path).map_err(errno), reply);
        reply.data(target.as_bytes());
    }

    fn mkdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let path = ok_or_reply!(self.child(parent, name), reply);
        ok_or_reply!(self.driver.mkdir(&path, mode & !umask & 0o7777).map_err(errno), reply);
        self.changed(parent, None);
        let attr = ok_or_reply!(self.lstat(&path), reply);
        self.added(parent, name, &attr);
        let ino = self.entry(path, &attr, reply);
        self.listings.made(ino);
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let path = ok_or_reply!(self.child(parent, name), reply);
        self.pin(self.inodes.peek(&path));
        let behind = self.may_remove_behind(parent, name, &path);
        if !self.copy_unlinked(self.inodes.peek(&path)) {
            if behind {
                tracing::debug!("{path}: removed without waiting");
                ok_or_reply!(self.driver.unlink_behind(&path).map_err(errno), reply);
            } else {
                ok_or_reply!(self.driver.unlink(&path).map_err(errno), reply);
                self.removed_in(parent);
            }
        }
        self.links_changed(self.inodes.peek(&path));
        self.changed(parent, Some(&path));
        self.listings.removed(parent, name.to_str().unwrap_or_default());
        self.inodes.unlinked(&path);
        reply.ok();
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let path = ok_or_reply!(self.child(parent, name), reply);
        if let Some(dir) = self.inodes.peek(&path) {
            self.store_new_in(dir);
        }
        ok_or_reply!(self.driver.rmdir(&path).map_err(errno), reply);
        self.changed(parent, Some(&path));
        self.listings.removed(parent, name.to_str().unwrap_or_default());
        if let Some(ino) = self.inodes.peek(&path) {
            self.listings.forget(ino);
        }
        self.inodes.unlinked(&path);
        reply.ok();
    }

    fn symlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, link: &Path, reply: ReplyEntry) {
        let path = ok_or_reply!(self.child(parent, name), reply);
        let target = ok_or_reply!(link.to_str().ok_or(libc::EINVAL), reply);
        ok_or_reply!(self.driver.symlink(target, &path).map_err(errno), reply);
        self.changed(parent, None);
        let attr = ok_or_reply!(self.lstat(&path), reply);
        self.added(parent, name, &attr);
        self.entry(path, &attr, reply);
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        if flags != 0 {
            // RENAME_NOREPLACE and RENAME_EXCHANGE are not in the protocol.
            return reply.error(libc::EINVAL);
        }
        let from = ok_or_reply!(self.child(parent, name), reply);
        let to = ok_or_reply!(self.child(newparent, newname), reply);
        self.pin(self.inodes.peek(&to));
        if let Some(ino) =
            self.inodes.peek(&from).filter(|&ino| self.copies.as_ref().is_some_and(|c| c.dirty(ino).is_some()))
        {
            // A file made here is made at the server before it is renamed there.
            ok_or_reply!(self.store(ino, false), reply);
        }
        if self.may_rename_behind((parent, name, &from), (newparent, newname, &to)) {
            tracing::debug!("{from} -> {to}: renamed without waiting");
            ok_or_reply!(self.driver.rename_behind(&from, &to).map_err(errno), reply);
        } else {
            ok_or_reply!(self.driver.rename(&from, &to).map_err(errno), reply);
            // The server let the mount remove from `parent` and write in `newparent`.
            self.removed_in(parent);
            self.wrote_in_dir(newparent);
        }
        self.copy_unlinked(self.inodes.peek(&to));
        self.changed(parent, Some(&to));
        self.changed(newparent, Some(&from));
        let attr = self.listings.removed(parent, name.to_str().unwrap_or_default());
        self.listings.removed(newparent, newname.to_str().unwrap_or_default());
        self.listings.added(newparent, newname.to_str().unwrap_or_default(), attr);
        self.inodes.rename(&from, &to);
        if let Some(copies) = self.copies.as_mut() {
            // Unsaved copies beneath a renamed directory: their records follow.
            for ino in copies.unsaved() {
                if let Some(path) = self.inodes.path(ino) {
                    copies.moved(ino, path);
                }
            }
        }
        reply.ok();
    }

    fn link(&mut self, _req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry) {
        let from = ok_or_reply!(self.path(ino), reply);
        let to = ok_or_reply!(self.child(newparent, newname), reply);
        if self.copies.as_mut().is_some_and(|c| c.get(ino).is_some()) {
            // A file with two names is written through (a copy is stored by one name).
            ok_or_reply!(self.spill(ino), reply);
        }
        ok_or_reply!(self.driver.link(&from, &to).map_err(errno), reply);
        self.links_changed(Some(ino));
        self.changed(newparent, Some(&from));
        self.file_changed(ino);
        let attr = ok_or_reply!(self.lstat(&to), reply);
        self.added(newparent, newname, &attr);
        self.entry(to, &attr, reply);
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        self.absorb();
        match self.open_handle(ino, flags) {
            Ok((fh, open_flags)) => {
                self.opened_file(ino, 1);
                reply.opened(fh, open_flags)
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.create_handle(req, parent, name, mode & !umask, flags) {
            Ok((ino, attr, fh)) => {
                self.opened_file(ino, 1);
                reply.created(&self.ttl(), &file_attr(ino, &attr), 0, fh, 0)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if let Some(&(ino, _)) = self.copy_handles.get(&fh) {
            let copy = self.copies.as_mut().and_then(|c| c.get(ino));
            let data =
                copy.map(|c| c.read(offset as u64, size)).unwrap_or_else(|| Err(std::io::Error::other("no copy")));
            let data = ok_or_reply!(data.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)), reply);
            return reply.data(&data);
        }
        if let Some(&(ino, None)) = self.lazy.get(&fh) {
            // Not open at the server: a break since drops what it fetched, and a read
            // from the start of a small file fetches it whole.
            self.absorb();
            if offset == 0 && !self.known.contains_key(&fh) {
                if let Some(content) = self.fetch_small(ino) {
                    self.known.insert(fh, content);
                }
            }
        }
        if let Some(content) = self.known.get(&fh) {
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(content.len());
            let end = start.saturating_add(size as usize).min(content.len());
            return reply.data(&content[start..end]);
        }
        let fh = ok_or_reply!(self.real(fh), reply);
        let data = ok_or_reply!(self.driver.pread(fh, offset as u64, size).map_err(errno), reply);
        reply.data(&data);
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if let Some(&(_, flags)) = self.copy_handles.get(&fh) {
            let append = flags & open_flags::APPEND != 0;
            let path = ok_or_reply!(self.path(ino), reply);
            let mut result = self.copies.as_mut().map(|c| c.write(ino, &path, offset as u64, data, append));
            if matches!(result, Some(Err(Refused::Full))) {
                // Unsaved copies fill the cache: the writer waits while those no handle
                // uses are stored, then, if that was not enough, this file is stored and
                // written through (a server away past the retry window is its error).
                self.retry_unsaved();
                result = self.copies.as_mut().map(|c| c.write(ino, &path, offset as u64, data, append));
            }
            match result {
                Some(Ok(_)) => {
                    self.sync_pin(ino);
                    self.file_changed(ino);
                    return reply.written(data.len() as u32);
                }
                Some(Err(Refused::Io(e))) => return reply.error(e.raw_os_error().unwrap_or(libc::EIO)),
                // Grown past what a copy holds, or no room left for unsaved bytes:
                // written through from here on.
                Some(Err(Refused::TooLarge | Refused::Full)) | None => ok_or_reply!(self.spill(ino), reply),
            }
        }
        // Written behind: an error shows at the flush (close) or fsync of the file.
        let fh = ok_or_reply!(self.real(fh), reply);
        ok_or_reply!(self.driver.pwrite_behind(fh, offset as u64, data).map_err(errno), reply);
        self.written.insert(fh);
        self.forget_known(ino, Some(fh));
        if let Some(content) = self.known.get_mut(&fh) {
            let start = offset as usize;
            match start.checked_add(data.len()).filter(|&end| end <= KNOWN_MAX) {
                Some(end) => {
                    if content.len() < end {
                        content.resize(end, 0);
                    }
                    content[start..end].copy_from_slice(data);
                }
                None => drop(self.known.remove(&fh)),
            }
        }
        // Our own write changed the file: its next open must not trust the old pages
        // (until the flush learns what the file is now).
        self.seen.lock().remove(&ino);
        if let Some((attr, _)) = self.attrs.get_mut(&ino) {
            attr.size = attr.size.max(offset as u64 + data.len() as u64);
        }
        self.file_changed(ino);
        reply.written(data.len() as u32);
    }

    fn flush(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _lock_owner: u64, reply: ReplyEmpty) {
        if let Some(&(_, flags)) = self.copy_handles.get(&fh) {
            // Closing a file opened for writing (or made by this open) stores it: its
            // errors show here.
            if flags & (open_flags::WRITE | open_flags::CREATE) != 0 {
                ok_or_reply!(self.store(ino, false), reply);
            }
            return reply.ok();
        }
        // A deferred open that was never needed has nothing to flush.
        let Some(fh) = self.opened(fh) else { return reply.ok() };
        if !self.written.remove(&fh) {
            ok_or_reply!(self.driver.settle(fh).map_err(errno), reply);
            return reply.ok();
        }
        // The pages this handle wrote are in the kernel's cache: once the server says
        // what the file now is, an open that finds it so keeps them.
        let attr = ok_or_reply!(self.driver.settle_stat(fh).map_err(errno), reply);
        if self.open.get(&ino).is_some_and(|h| h.len() == 1) {
            self.seen.lock().insert(ino, (attr.size, attr.mtime));
            let content = self.known.get(&fh).filter(|c| c.len() as u64 == attr.size);
            if let (Some(content), Some(notifier)) = (content, self.notifier.get()) {
                if let Err(e) = notifier.store(ino, 0, content) {
                    tracing::debug!("notify store: {e}");
                }
            }
        }
        self.remember(ino, &attr);
        self.file_known(ino, attr);
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.opened_file(ino, -1);
        if self.copy_handles.remove(&fh).is_some() {
            self.release_copy(ino);
            return reply.ok();
        }
        self.known.remove(&fh);
        let fh = match self.lazy.remove(&fh) {
            Some((_, Some(real))) => real,
            Some((_, None)) => return reply.ok(),
            None => fh,
        };
        self.known.remove(&fh);
        self.written.remove(&fh);
        if let Some(handles) = self.open.get_mut(&ino) {
            handles.retain(|&h| h != fh);
            if handles.is_empty() {
                self.open.remove(&ino);
            }
        }
        ok_or_reply!(self.driver.close(fh).map_err(errno), reply);
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _datasync: bool, reply: ReplyEmpty) {
        if self.copy_handles.contains_key(&fh) {
            // What fsync acknowledges is on the server's disk.
            ok_or_reply!(self.store(ino, true), reply);
            return reply.ok();
        }
        let Some(fh) = self.opened(fh) else { return reply.ok() };
        ok_or_reply!(self.driver.settle(fh).map_err(errno), reply);
        ok_or_reply!(self.driver.fsync(fh).map_err(errno), reply);
        reply.ok();
    }

    /// Where removals and renames went without waiting, `fsync` of a directory waits for
    /// them: an error says one failed (the names are as the server has them).
    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        match self.failed_behind(true) {
            0 => reply.ok(),
            _ => reply.error(libc::EIO),
        }
    }

    /// The kernel let go of the mount (unmounted): everything unsaved is stored now.
    fn destroy(&mut self) {
        self.closing = true;
        self.store_all();
    }

    fn opendir(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        if self.callbacks && self.driver.callbacks_cover_all() {
            // With callbacks, the kernel may keep listings between opens (a break of the
            // directory drops them). Saying that opening directories is not implemented
            // does that and more: the kernel stops sending opens and releases of
            // directories (two requests per directory a `find` walks), and caches what
            // `readdir` answers. Only said when the one server behind the mount promised
            // callbacks: it holds for the life of the mount.
            return reply.error(libc::ENOSYS);
        }
        self.absorb();
        // Else the kernel keeps this directory's listing only while callbacks hold.
        let cache_dir = 1 << 3; // FOPEN_CACHE_DIR (ABI 7.28), honoured by kernels since 4.20
        let flags = if self.ttl() == CALLBACK_TTL { cache_dir | fuser::consts::FOPEN_KEEP_CACHE } else { 0 };
        reply.opened(0, flags);
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        self.absorb();
        let path = ok_or_reply!(self.path(ino), reply);
        // A fresh listing answers (a large directory takes several requests to read,
        // and `find` reads each directory twice); else the server is asked.
        let entries = match self.listings.entries(ino, self.ttl()) {
            Some(entries) => entries,
            None => ok_or_reply!(self.list(ino), reply),
        };
        let parent = self.inodes.parent_of(ino);
        let dots = [(ino, FileType::Directory, ".".to_string()), (parent, FileType::Directory, "..".to_string())];
        // Entries get inode numbers only when looked up; until then a stable stand-in.
        let rest = entries.iter().map(|e| {
            let kind = file_attr(0, &e.attr).kind;
            let child = inodes::join(&path, &e.name);
            (self.inodes.peek(&child).unwrap_or(e.attr.ino | 1 << 63), kind, e.name.clone())
        });
        let all: Vec<_> = dots.into_iter().chain(rest).collect();
        for (i, (child, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(child, (i + 1) as i64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn getxattr(&mut self, _req: &Request<'_>, _ino: u64, _name: &OsStr, _size: u32, reply: fuser::ReplyXattr) {
        // The protocol has no extended attributes. ENOSYS tells the kernel so once: it
        // stops asking (it asked before every write, for `security.capability`) and
        // answers EOPNOTSUPP to programs, as for a file system without xattrs.
        reply.error(libc::ENOSYS);
    }

    fn listxattr(&mut self, _req: &Request<'_>, _ino: u64, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn ioctl(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _flags: u32,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(libc::ENOTTY);
    }

    fn statfs(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyStatfs) {
        if self.control.store_all.swap(false, Ordering::SeqCst) {
            // The process running the mount asks it to store before it goes, and waits
            // for this answer (the server is not asked for counts now: it may be away).
            self.closing = true;
            self.store_all();
            self.closing = false;
            let s = self.statfs.as_ref().map(|(s, _)| s.clone()).unwrap_or_default();
            return reply.statfs(
                s.blocks,
                s.bfree,
                s.bavail,
                s.files,
                s.ffree,
                s.bsize as u32,
                s.namemax as u32,
                s.frsize as u32,
            );
        }
        if self.retried.elapsed() >= RETRY_EVERY {
            self.retry_unsaved();
        }
        // Counts of free space a second old are as good as new to anyone asking.
        let s = match &self.statfs {
            Some((s, at)) if at.elapsed() < Duration::from_secs(1) => s.clone(),
            _ => {
                let path = ok_or_reply!(self.path(ino), reply);
                let s = ok_or_reply!(self.driver.statfs(&path).map_err(errno), reply);
                self.statfs = Some((s.clone(), Instant::now()));
                s
            }
        };
        reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize as u32, s.namemax as u32, s.frsize as u32);
    }

    fn access(&mut self, _req: &Request<'_>, ino: u64, mask: i32, reply: ReplyEmpty) {
        if self.copies.as_ref().and_then(|c| c.dirty(ino)).is_some_and(|c| !c.at_server) {
            // Made here and not stored yet: the server does not know it, its maker may.
            return reply.ok();
        }
        let path = ok_or_reply!(self.path(ino), reply);
        ok_or_reply!(self.driver.access(&path, mask as u32).map_err(errno), reply);
        reply.ok();
    }
}
