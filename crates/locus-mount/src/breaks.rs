//! Callback breaks: the thread that tells the kernel what a break (or a lost
//! connection) makes stale, how the mount takes breaks into its own caches, and what
//! the mount may answer before the server does while callbacks hold.

use crate::inodes;
use crate::known::Version;
use crate::listings::Known;
use crate::LocusFs;
use crate::CALLBACK_TTL;
use crate::RETRY_EVERY;
use std::collections::HashMap;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

/// What each file's pages in the kernel's cache hold: the size and modification time
/// the file had when the mount last let the kernel cache them (shared with the thread
/// that takes breaks, which keeps those pages when a connection is lost).
pub(crate) type Seen = Arc<parking_lot::Mutex<HashMap<u64, Version>>>;

/// Names the mount told the kernel are absent, to be trusted until a break (a negative
/// entry under callbacks), by directory inode: what a lost connection must make the
/// kernel forget, since it keeps the directories themselves (see [`take_breaks`]). At
/// most [`ABSENT_MAX`] are kept; past that, a lost connection forgets directories
/// whole, as a break does.
#[derive(Default)]
pub(crate) struct Absent {
    names: HashSet<(u64, std::ffi::OsString)>,
    overflowed: bool,
}

/// The most absent names [`Absent`] keeps.
const ABSENT_MAX: usize = 1 << 16;

impl Absent {
    /// The kernel was told `name` is not in the directory `parent`.
    pub(crate) fn insert(&mut self, parent: u64, name: &OsStr) {
        if self.names.len() >= ABSENT_MAX {
            self.overflowed = true;
        } else {
            self.names.insert((parent, name.to_os_string()));
        }
    }
}

/// Shared between the mount and the thread that takes breaks.
pub(crate) type AbsentNames = Arc<parking_lot::Mutex<Absent>>;

/// How many handles the kernel holds on each inode (open files and mappings), shared
/// with the thread that takes breaks.
pub(crate) type OpenFiles = Arc<parking_lot::Mutex<HashMap<u64, usize>>>;

/// Breaks that arrived and that the mount's own caches have not taken in yet.
#[derive(Default)]
pub(crate) struct Broken {
    paths: Vec<String>,
    /// Every promise is gone.
    all: bool,
}

/// Takes the server's callback breaks as they come: records them for the mount's own
/// caches, then tells the kernel to drop the attributes, pages, names and listings they
/// cover. It runs on a thread of its own, since a notification may wait for a request
/// the mount's thread is answering.
pub(crate) fn take_breaks(
    breaks: std::sync::mpsc::Receiver<locus_drivers::Break>,
    index: inodes::PathIndex,
    notifier: Arc<OnceLock<locus_fuse::Notifier>>,
    broken: Arc<parking_lot::Mutex<Broken>>,
    seen: Seen,
    open_files: OpenFiles,
    absent: AbsentNames,
) {
    use locus_drivers::Break;
    for b in breaks {
        // A break names what changed: its names, attributes and pages go. A lost
        // connection (every promise gone) says only that anything may have changed: the
        // kernel forgets names and attributes, except that a file whose pages it holds,
        // and that no one has open, keeps its name and pages and only its attributes are
        // asked for again. Its next open compares the server's version of it (size,
        // modification and change times, inode) with the one the pages were cached from
        // (`seen`), and keeps them only if they are the same (a new size drops them at
        // once); a name the server no longer has goes at its next look (`found_gone`).
        // The cache is revalidated, not thrown away.
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
        // On a lost connection, directories with names under them keep their own entry
        // (dropping it would drop every entry beneath, kept pages with them): their
        // attributes and listing go, and so do the absent names the kernel was told of.
        let (dirs, forget_absent) = match all {
            true => {
                let index = index.lock();
                let dirs: HashSet<u64> = index
                    .keys()
                    .filter_map(|p| locus_proto::path::split(p))
                    .filter_map(|(dir, _)| index.get(dir).copied())
                    .collect();
                let mut absent = absent.lock();
                let (names, whole) = (std::mem::take(&mut absent.names), std::mem::take(&mut absent.overflowed));
                (if whole { HashSet::new() } else { dirs }, names)
            }
            false => (HashSet::new(), HashSet::new()),
        };
        for (dir, name) in &forget_absent {
            let _ = notifier.inval_entry(*dir, name);
        }
        for path in paths {
            let (ino, parent) = {
                let index = index.lock();
                let parent =
                    locus_proto::path::split(&path).and_then(|(dir, name)| Some((*index.get(dir)?, name.to_string())));
                (index.get(&path).copied(), parent)
            };
            // Errors say the kernel has nothing cached there: nothing to drop.
            if let Some(ino) = ino {
                if all && seen.lock().contains_key(&ino) && !open_files.lock().contains_key(&ino) {
                    let _ = notifier.inval_inode(ino, -1, 0);
                    continue;
                }
                let _ = notifier.inval_inode(ino, 0, 0);
                if dirs.contains(&ino) {
                    continue;
                }
            }
            if let Some((dir, name)) = parent {
                let _ = notifier.inval_entry(dir, OsStr::new(&name));
                let _ = notifier.inval_inode(dir, 0, 0);
            }
        }
    }
}

impl LocusFs {
    /// How long what the server answers now may be trusted: until a break while the
    /// server holds this mount's callbacks, else the attribute timeout.
    pub(crate) fn ttl(&self) -> Duration {
        if self.callbacks && self.driver.callbacks_held() {
            CALLBACK_TTL
        } else {
            self.options.attr_timeout
        }
    }

    /// Drops from the mount's own caches what breaks since the last call cover.
    pub(crate) fn absorb(&mut self) {
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
    pub(crate) fn found_gone(&mut self, ino: u64) {
        if let (Some(gone), Some(path)) = (&self.gone, self.inodes.path(ino)) {
            let _ = gone.send(locus_drivers::Break::Paths(vec![path.to_string()]));
        }
    }

    /// Drops what the mount knew of `path` and of its directory's entries.
    pub(crate) fn forget(&mut self, path: &str) {
        if let Some(ino) = self.inodes.peek(path) {
            self.drop_fetched(|i| i == ino);
            self.attrs.remove(&ino);
            self.seen.lock().remove(&ino);
            self.listings.forget(ino);
            self.removable.remove(&ino);
        }
        if let Some(dir) = locus_proto::path::split(path).and_then(|(dir, _)| self.inodes.peek(dir)) {
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
    pub(crate) fn failed_behind(&mut self, wait: bool) -> usize {
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
    pub(crate) fn writing_back_under_callbacks(&self) -> bool {
        self.copies.is_some() && self.ttl() == CALLBACK_TTL
    }

    /// True when removing `path`, `name` in `parent`, may go without waiting for the
    /// server's answer: writing back (`afs`) under callbacks, the mount knows `name` is
    /// there and not a directory (by its attributes or the listing), and a removal in
    /// `parent` succeeded at the server while the callbacks held. Such a removal goes out
    /// at once, ahead of anything later on the connection; should it fail, the failure is
    /// logged and the name shows again.
    pub(crate) fn may_remove_behind(&self, parent: u64, name: &OsStr, path: &str) -> bool {
        self.writing_back_under_callbacks()
            && self.known_file(parent, name, path) == Some(true)
            && self.removable.get(&parent).is_some_and(|at| at.elapsed() < self.ttl())
    }

    /// True when renaming `from` (`name` in `parent`) to `to` (`newname` in `newparent`)
    /// may go without waiting, as a removal may (see [`Self::may_remove_behind`]): the
    /// source is known to be a file, the target known to be absent or a file, a removal
    /// in `parent` and a write in `newparent` succeeded at the server while the callbacks
    /// held. A refused rename comes back as a break of both names.
    pub(crate) fn may_rename_behind(
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
    pub(crate) fn known_file(&self, parent: u64, name: &OsStr, path: &str) -> Option<bool> {
        if let Some(attr) = self.inodes.peek(path).and_then(|ino| self.fresh(ino)) {
            return Some(!attr.is_dir());
        }
        match self.listings.find(parent, name.to_str()?, self.ttl()) {
            Known::Present(attr) => Some(!attr.is_dir()),
            _ => None,
        }
    }
}
