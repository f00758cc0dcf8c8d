//! `locus mount`: a Locus export as a local file system, through FUSE, so unmodified
//! programs use remote data.
//!
//! [`LocusFs`] implements `locus_fuse::Filesystem` over a protocol driver (`locus-drivers`:
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
//! The rooms: `filesystem` (the kernel's requests, `impl Filesystem` alone) calls into
//! `known` (attributes, names, listings), `handles` (opening files), `afs` (write-back,
//! over `writeback` and `journal`) and `breaks` (callbacks); those are methods of the one
//! [`LocusFs`] split by concern, and call one another's methods where a concern needs
//! another's, while their files import one way (checked by the house rules in
//! crates/locus-cli/tests/house.rs). `handle_table` (every handle given to the kernel and
//! what it stands for), `convert`, `inodes`, `listings` and `options` depend on none of
//! them; the timings and bounds they share are here.
//!
//! Errors keep their errno: the drivers answer POSIX codes (Locus' own codes and
//! Chirp's map to the closest errno), and a lost connection is `EIO`.

/// Answers `$reply` with the error of `$e`, or gives its value.
macro_rules! ok_or_reply {
    ($e:expr, $reply:ident) => {
        match $e {
            Ok(v) => v,
            Err(code) => return $reply.error(code),
        }
    };
}

mod afs;
mod breaks;
mod convert;
mod filesystem;
mod freshen;
mod handle_table;
mod handles;
mod inodes;
mod journal;
mod known;
mod listings;
mod options;
mod writeback;

pub use options::{Consistency, MountOptions};

use breaks::{take_breaks, AbsentNames, Broken, OpenFiles, Seen};
use inodes::Inodes;
use listings::Listings;
use locus_drivers::{Attr, Driver};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use writeback::Copies;

/// How long the kernel and the mount trust what a held callback covers: until a break,
/// in practice.
pub(crate) const CALLBACK_TTL: Duration = Duration::from_secs(24 * 3600);

/// How often unsaved copies whose store failed are tried again.
pub(crate) const RETRY_EVERY: Duration = Duration::from_secs(5);

/// The most content kept per handle in [`handle_table::Handle::known`](crate::handle_table::Handle::known).
pub(crate) const KNOWN_MAX: usize = 8 << 20;

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
    /// Names the kernel was told are absent until a break.
    absent: AbsentNames,
    /// Every handle given to the kernel, and the server handles open on each inode.
    handles: handle_table::HandleTable,
    /// The attributes last answered by the server for each inode, and when.
    attrs: HashMap<u64, (Attr, Instant)>,
    /// Names in recently listed directories.
    listings: Listings,
    /// Handles written through since their last flush, which then learns the attributes
    /// the writes left: the pages they put in the kernel's cache stay valid after it.
    written: HashSet<u64>,
    /// How the mount puts known content into the kernel's cache, once its session exists.
    notifier: Arc<OnceLock<locus_fuse::Notifier>>,
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
    /// Reads listed directories' attributes again once walks pause ([`freshen`]).
    freshener: Option<freshen::Freshener>,
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
        let (seen, open_files, absent) = (Seen::default(), OpenFiles::default(), AbsentNames::default());
        let callbacks = breaks.is_some();
        let mut gone = None;
        if let Some(from_server) = breaks {
            // The mount's own breaks (names found gone after a lost connection) join
            // the server's on the way to the thread that tells the kernel.
            let (tx, breaks) = std::sync::mpsc::channel();
            gone = Some(tx.clone());
            let (index, n, b, s, o, a) =
                (inodes.index(), notifier.clone(), broken.clone(), seen.clone(), open_files.clone(), absent.clone());
            let forward = move || from_server.into_iter().try_for_each(|b| tx.send(b));
            let spawned = std::thread::Builder::new()
                .name("locus-breaks".into())
                .spawn(move || take_breaks(breaks, index, n, b, s, o, a))
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
            writable: HashMap::new(),
            removable: HashMap::new(),
            driver,
            inodes,
            listings: Listings::default(),
            options,
            seen,
            gone,
            open_files,
            absent,
            handles: handle_table::HandleTable::default(),
            attrs: HashMap::new(),
            written: HashSet::new(),
            notifier,
            broken,
            statfs: None,
            ahead_since: None,
            walked: HashSet::new(),
            freshener: None,
        };
        fs.recover();
        fs
    }

    /// What the process running the mount uses to ask it to store before it goes.
    pub fn control(&self) -> Arc<Control> {
        self.control.clone()
    }

    /// Has the kernel's attributes of directories it listed read again through `root`,
    /// where the kernel shows this file system's root, once walks pause: the kernel
    /// marks them stale at each listing, and would ask once per directory on the next
    /// walk ([`freshen`]). Only while callbacks let the kernel trust attributes long.
    pub fn freshen_through(&mut self, root: std::path::PathBuf) {
        self.freshener = freshen::Freshener::start(root);
    }

    /// Where the session's notifier goes once the session exists (`Session::notifier`):
    /// with it, content the mount wrote whole is handed to the kernel's page cache, so
    /// that reading it back costs no round trip (the kernel does not keep a page that
    /// writes covered only in part, such as a file's last).
    pub fn notifier_slot(&self) -> Arc<OnceLock<locus_fuse::Notifier>> {
        self.notifier.clone()
    }
}
