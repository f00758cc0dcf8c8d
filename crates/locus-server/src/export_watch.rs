//! Changes to the export made by anything but this server's clients (an editor on the
//! server machine, a storelet writing beside the data, a restore from backup) break
//! callbacks too: each directory that holds a promised path, or whose listing is
//! promised, is watched with inotify, and a thread turns its events into breaks.
//!
//! A directory stays watched until it goes away; at the kernel's limit on watches
//! (`fs.inotify.max_user_watches`) no more are added, and changes made beside the server
//! in directories that could not be watched are not seen (a warning says so, once).

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// The directories being watched.
pub struct Watcher {
    fd: OwnedFd,
    /// The export's directory on each device (a directory of the namespace may be on
    /// any), opened once: directories to watch are found beneath them as the store finds
    /// them, never outside.
    roots: Vec<OwnedFd>,
    watches: parking_lot::Mutex<Watches>,
    warned: AtomicBool,
}

#[derive(Default)]
struct Watches {
    /// The canonical path of each watch's directory.
    by_wd: HashMap<i32, String>,
    /// Watches per directory (one per device it is on).
    by_dir: HashMap<String, usize>,
}

/// How often reports waiting for a decision are looked at again.
pub const TICK: std::time::Duration = std::time::Duration::from_millis(2);

/// How long the watcher lets events gather once one arrives: a client's store makes
/// five or six (a temporary made, written, moved over the name), and one wake-up for
/// them all leaves the cores to the server's connections.
const GATHER: std::time::Duration = std::time::Duration::from_millis(1);

/// A change the watcher saw: the path, and whether names were made or removed.
#[derive(Clone)]
pub struct LocalChange {
    pub path: String,
    pub names: bool,
}

impl Watcher {
    /// A watcher over the export's directories on each device.
    pub fn new(roots: Vec<PathBuf>) -> std::io::Result<Watcher> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let roots = roots.iter().map(|r| rustix::fs::open(r, flags, Mode::empty())).collect::<Result<_, _>>()?;
        Ok(Watcher { fd, roots, watches: Default::default(), warned: AtomicBool::new(false) })
    }

    /// Watches the directory `dir` (canonical, `/a/b`) if it is not watched yet; while it
    /// does not exist, its nearest existing ancestor, where its making will show.
    pub fn watch(&self, dir: &str) {
        let mut dir = dir;
        while !self.watch_one(dir) && dir != "/" {
            dir = match dir.rfind('/') {
                Some(0) | None => "/",
                Some(i) => &dir[..i],
            };
        }
    }

    /// True when `dir` is watched: changes of the names in it are reported.
    pub fn watching(&self, dir: &str) -> bool {
        self.watches.lock().by_dir.contains_key(dir)
    }

    /// Watches `dir` on every device where it exists; false if it exists on none.
    fn watch_one(&self, dir: &str) -> bool {
        let mut w = self.watches.lock();
        if w.by_dir.contains_key(dir) {
            return true;
        }
        let flags = WatchFlags::MODIFY
            | WatchFlags::ATTRIB
            | WatchFlags::CLOSE_WRITE
            | WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR
            | WatchFlags::EXCL_UNLINK;
        let (mut added, mut found_any) = (0, false);
        let rel = match dir.trim_start_matches('/') {
            "" => ".",
            rel => rel,
        };
        for root in &self.roots {
            // Resolved beneath the root (no `..` out, no symbolic link), then watched
            // through its descriptor's name in /proc.
            let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
            let open = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let Ok(found) = rustix::fs::openat2(root, rel, open, Mode::empty(), resolve) else { continue };
            found_any = true;
            let at = format!("/proc/self/fd/{}", found.as_raw_fd());
            match inotify::add_watch(&self.fd, at.as_str(), flags) {
                Ok(wd) => {
                    w.by_wd.insert(wd, dir.to_string());
                    added += 1;
                }
                Err(rustix::io::Errno::NOSPC) => {
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "fs.inotify.max_user_watches reached: changes made beside the server in \
                             directories not yet watched will not break callbacks"
                        );
                    }
                }
                // Not on this device, or not a directory: nothing to watch there.
                Err(_) => {}
            }
        }
        // A directory that is not there yet is tried again at its next promise.
        if added > 0 {
            w.by_dir.insert(dir.to_string(), added);
        }
        found_any
    }

    /// Reads events until the descriptor fails, handing each change to `on`, and `None`
    /// every [`TICK`] while `on` answers that it has reports waiting for a decision.
    /// Events that arrive together are handed over once per path.
    pub fn run(&self, mut on: impl FnMut(Option<LocalChange>) -> bool) {
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 << 10];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        let mut waiting = false;
        // Paths seen since the last hand-over, and whether names were made or removed.
        let mut batch: HashMap<String, bool> = HashMap::new();
        loop {
            let event = match reader.next() {
                Ok(e) => e,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    for (path, names) in batch.drain() {
                        waiting = on(Some(LocalChange { path, names }));
                    }
                    let mut fds = [rustix::event::PollFd::new(&self.fd, rustix::event::PollFlags::IN)];
                    let tick = rustix::time::Timespec { tv_sec: 0, tv_nsec: TICK.as_nanos() as _ };
                    match rustix::event::poll(&mut fds, waiting.then_some(&tick)) {
                        Ok(0) => waiting = on(None),
                        Ok(_) => std::thread::sleep(GATHER),
                        Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return tracing::warn!("inotify: {e}"),
                    }
                    continue;
                }
                Err(e) => return tracing::warn!("inotify: {e}"),
            };
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                // Events were lost: everything watched may have changed.
                let dirs: Vec<String> = self.watches.lock().by_dir.keys().cloned().collect();
                batch.extend(dirs.into_iter().map(|path| (path, true)));
                continue;
            }
            let Some(dir) = self.watches.lock().by_wd.get(&event.wd()).cloned() else { continue };
            if flags.contains(ReadFlags::IGNORED) {
                let mut w = self.watches.lock();
                w.by_wd.remove(&event.wd());
                if let Some(n) = w.by_dir.get_mut(&dir) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        w.by_dir.remove(&dir);
                    }
                }
                continue;
            }
            let names = flags.intersects(
                ReadFlags::CREATE
                    | ReadFlags::DELETE
                    | ReadFlags::MOVED_FROM
                    | ReadFlags::MOVED_TO
                    | ReadFlags::DELETE_SELF
                    | ReadFlags::MOVE_SELF,
            );
            let name = event.file_name().map(|n| n.to_string_lossy());
            if name.as_ref().is_some_and(|n| n.starts_with(locus_store::acl::RESERVED_PREFIX)) {
                // The store's own files (a put's temporary, an ACL): no client names them,
                // and their coming and going changes no listing a client sees.
                continue;
            }
            let path = match name {
                Some(name) if !name.is_empty() => crate::callbacks::canonical(&format!("{dir}/{name}")),
                _ => Some(dir),
            };
            let Some(path) = path else { continue };
            *batch.entry(path).or_default() |= names;
        }
    }
}
