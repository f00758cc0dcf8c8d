//! Changes to the export made by anything but this server's clients (an editor on the
//! server machine, a storelet writing beside the data, a restore from backup) break
//! callbacks too: each directory that holds a promised path, or whose listing is
//! promised, is watched with inotify, and a thread turns its events into breaks.
//!
//! A directory stays watched while a promise needs it (each holds the watch of its
//! directory, and a listing's of the directory itself) or until it goes away. Watches are
//! bounded: by the server's own maximum (by default half the kernel's
//! `fs.inotify.max_user_watches`), and per subject through its bound on promises. Where
//! no watch can be added (either bound, or the kernel's ENOSPC), the promise that needs
//! it is refused ([`crate::callbacks`]), so the client does not trust what it cannot be
//! told about.

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

/// The directories being watched.
pub struct Watcher {
    fd: OwnedFd,
    /// The export's directory on each device (a directory of the namespace may be on
    /// any), opened once: directories to watch are found beneath them as the store finds
    /// them, never outside.
    roots: Vec<OwnedFd>,
    watches: parking_lot::Mutex<Watches>,
    /// The most kernel watches this server keeps (below `fs.inotify.max_user_watches`).
    max: usize,
}

#[derive(Default)]
struct Watches {
    /// The canonical path of each watch's directory.
    by_wd: HashMap<i32, String>,
    /// Each watched directory: its watches (one per device it is on), how many promises
    /// need it, and an id telling it from a later watch of the same path.
    by_dir: HashMap<String, Dir>,
    next_id: u64,
}

struct Dir {
    wds: Vec<i32>,
    users: usize,
    id: u64,
}

/// A promise's hold on a watched directory (see [`Watcher::acquire`]).
#[derive(Clone, Debug)]
pub struct WatchRef {
    dir: String,
    id: u64,
}

/// Why a directory could not be watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchRefused {
    /// The server's own bound on watches ([`Watcher::new`]'s `max`) is reached.
    Limit,
    /// The kernel's is (`fs.inotify.max_user_watches`, ENOSPC).
    Kernel,
}

/// The watches a server keeps by default: half the kernel's per-user limit (the
/// server's user may watch other things), or 8192 if it cannot be read.
pub fn default_max_watches() -> usize {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(8192, |n| (n / 2).max(1))
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
    /// A watcher over the export's directories on each device, keeping at most `max`
    /// kernel watches.
    pub fn new(roots: Vec<PathBuf>, max: usize) -> std::io::Result<Watcher> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let roots = roots.iter().map(|r| rustix::fs::open(r, flags, Mode::empty())).collect::<Result<_, _>>()?;
        Ok(Watcher { fd, roots, watches: Default::default(), max })
    }

    /// Watches the directory `dir` (canonical, `/a/b`) for one more promise; while it
    /// does not exist, its nearest existing ancestor, where its making will show. Answers
    /// the hold to [`Watcher::release`] when the promise goes (none where nothing could
    /// be watched: not a directory on any device), or why no watch could be added.
    pub fn acquire(&self, dir: &str) -> Result<Option<WatchRef>, WatchRefused> {
        let mut dir = dir;
        loop {
            match self.watch_one(dir)? {
                Some(found) => return Ok(found),
                None if dir == "/" => return Ok(None),
                None => {
                    dir = match dir.rfind('/') {
                        Some(0) | None => "/",
                        Some(i) => &dir[..i],
                    }
                }
            }
        }
    }

    /// Gives back a hold from [`Watcher::acquire`]: the last one removes the watch.
    pub fn release(&self, hold: &WatchRef) {
        let mut w = self.watches.lock();
        let Some(d) = w.by_dir.get_mut(&hold.dir) else { return };
        if d.id != hold.id {
            return;
        }
        d.users = d.users.saturating_sub(1);
        if d.users > 0 {
            return;
        }
        let d = w.by_dir.remove(&hold.dir).expect("present");
        for wd in d.wds {
            w.by_wd.remove(&wd);
            let _ = inotify::remove_watch(&self.fd, wd);
        }
    }

    /// True when `dir` is watched: changes of the names in it are reported.
    pub fn watching(&self, dir: &str) -> bool {
        self.watches.lock().by_dir.contains_key(dir)
    }

    /// Kernel watches held now.
    pub fn count(&self) -> usize {
        self.watches.lock().by_wd.len()
    }

    /// Holds `dir` watched on every device where it exists: `Ok(None)` if it exists on
    /// none, `Ok(Some(None))` if it exists but nothing could be watched there.
    #[allow(clippy::type_complexity)]
    fn watch_one(&self, dir: &str) -> Result<Option<Option<WatchRef>>, WatchRefused> {
        let mut w = self.watches.lock();
        if let Some(d) = w.by_dir.get_mut(dir) {
            d.users += 1;
            return Ok(Some(Some(WatchRef { dir: dir.to_string(), id: d.id })));
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
        let (mut wds, mut found_any) = (Vec::new(), false);
        let rel = match dir.trim_start_matches('/') {
            "" => ".",
            rel => rel,
        };
        let mut refused = None;
        for root in &self.roots {
            // Resolved beneath the root (no `..` out, no symbolic link), then watched
            // through its descriptor's name in /proc.
            let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
            let open = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let Ok(found) = rustix::fs::openat2(root, rel, open, Mode::empty(), resolve) else { continue };
            found_any = true;
            if w.by_wd.len() + wds.len() >= self.max {
                refused = Some(WatchRefused::Limit);
                break;
            }
            let at = format!("/proc/self/fd/{}", found.as_raw_fd());
            match inotify::add_watch(&self.fd, at.as_str(), flags) {
                // The same directory through another name: already watched under it.
                Ok(wd) if w.by_wd.contains_key(&wd) => {}
                Ok(wd) => wds.push(wd),
                Err(rustix::io::Errno::NOSPC) => {
                    refused = Some(WatchRefused::Kernel);
                    break;
                }
                // Not on this device, or not a directory: nothing to watch there.
                Err(_) => {}
            }
        }
        if let Some(why) = refused {
            for wd in wds {
                let _ = inotify::remove_watch(&self.fd, wd);
            }
            return Err(why);
        }
        if !found_any {
            return Ok(None);
        }
        if wds.is_empty() {
            return Ok(Some(None));
        }
        w.next_id += 1;
        let id = w.next_id;
        for &wd in &wds {
            w.by_wd.insert(wd, dir.to_string());
        }
        w.by_dir.insert(dir.to_string(), Dir { wds, users: 1, id });
        Ok(Some(Some(WatchRef { dir: dir.to_string(), id })))
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
                // The directory went away (or the watch was removed): the promises that
                // held it keep their holds, which find nothing to give back.
                let mut w = self.watches.lock();
                w.by_wd.remove(&event.wd());
                if let Some(d) = w.by_dir.get_mut(&dir) {
                    d.wds.retain(|&wd| wd != event.wd());
                    if d.wds.is_empty() {
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
                Some(name) if !name.is_empty() => locus_proto::path::canonical(&format!("{dir}/{name}")),
                _ => Some(dir),
            };
            let Some(path) = path else { continue };
            *batch.entry(path).or_default() |= names;
        }
    }
}
