//! What the mount knows between requests: the attributes the server answered, the
//! names in listed directories (and those read ahead), paths of inodes, and the
//! bookkeeping when the mount itself changes something.

use crate::convert::errno;
use crate::convert::file_attr;
use crate::convert::is_active;
use crate::inodes;
use crate::LocusFs;
use crate::CALLBACK_TTL;
use locus_drivers::Attr;
use locus_drivers::Time;
use locus_fuse::ReplyEntry;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

/// Which version of a file pages were cached from: its size, modification and change
/// times, and the server's inode number. A program can set the modification time back
/// (`cp -p`, `rsync -t`, `touch -r`), not the change time; a file replaced by a rename
/// has another inode.
pub(crate) type Version = (u64, Time, Time, u64);

/// The version `attr` describes.
pub(crate) fn version(attr: &Attr) -> Version {
    (attr.size, attr.mtime, attr.ctime, attr.ino)
}

impl LocusFs {
    /// Keeps attributes the server just answered.
    pub(crate) fn remember(&mut self, ino: u64, attr: &Attr) {
        self.attrs.insert(ino, (attr.clone(), Instant::now()));
    }

    /// Attributes of `ino` answered by the server recently enough to trust (see [`Self::ttl`]).
    pub(crate) fn fresh(&self, ino: u64) -> Option<&Attr> {
        let ttl = self.ttl();
        self.attrs.get(&ino).filter(|(_, at)| at.elapsed() < ttl).map(|(a, _)| a)
    }

    /// Forgets what was known of a directory whose entries changed (its times and link
    /// count did too), and of the entry at `path` in it.
    pub(crate) fn changed(&mut self, parent: u64, path: Option<&str>) {
        self.attrs.remove(&parent);
        if let Some(ino) = path.and_then(|p| self.inodes.peek(p)) {
            self.attrs.remove(&ino);
        }
    }

    /// A name of the file `ino` was made or removed here: the link count the kernel and
    /// this cache keep for its other names (other inodes here, one per path) is stale.
    pub(crate) fn links_changed(&mut self, ino: Option<u64>) {
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
    pub(crate) fn file_changed(&mut self, ino: u64) {
        if let Some((parent, name)) = self.entry_of(ino) {
            self.listings.changed(parent, &name);
        }
    }

    /// The server just said what `ino` is: its entry in its directory's listing says so.
    pub(crate) fn file_known(&mut self, ino: u64, attr: Attr) {
        if let Some((parent, name)) = self.entry_of(ino) {
            self.listings.refresh(parent, &name, attr);
        }
    }

    /// The directory inode and name under which `ino` was looked up.
    pub(crate) fn entry_of(&self, ino: u64) -> Option<(u64, String)> {
        let (dir, name) = locus_proto::path::split(self.inodes.path(ino)?)?;
        Some((self.inodes.peek(dir)?, name.to_string()))
    }

    /// `name` was made in `parent` with `attr`.
    pub(crate) fn added(&mut self, parent: u64, name: &OsStr, attr: &Attr) {
        self.listings.added(parent, name.to_str().unwrap_or_default(), Some(attr.clone()));
    }

    /// Lists `dir` from the server into the listings, and answers the entries.
    pub(crate) fn list(&mut self, dir: u64) -> Result<Arc<Vec<locus_drivers::DirEntry>>, i32> {
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
    pub(crate) fn list_ahead(&mut self, dir: u64, path: &str, entries: &[locus_drivers::DirEntry]) {
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

    pub(crate) fn child(&self, parent: u64, name: &OsStr) -> Result<String, i32> {
        let name = name.to_str().ok_or(libc::EINVAL)?;
        let dir = self.inodes.path(parent).ok_or(libc::ESTALE)?;
        Ok(inodes::join(dir, name))
    }

    pub(crate) fn path(&self, ino: u64) -> Result<String, i32> {
        self.inodes.path(ino).map(str::to_string).ok_or(libc::ESTALE)
    }

    /// Replies with the entry for `path`, giving it an inode number, which it answers.
    pub(crate) fn entry(&mut self, path: String, attr: &Attr, reply: ReplyEntry) -> u64 {
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
    pub(crate) fn active(&self, ino: u64) -> bool {
        self.inodes.path(ino).is_some_and(is_active)
    }

    pub(crate) fn lstat(&mut self, path: &str) -> Result<Attr, i32> {
        self.driver.lstat(path).map_err(errno)
    }

    /// The server let the mount write in the directory of `ino` just now.
    pub(crate) fn wrote_in(&mut self, ino: u64) {
        if let Some((dir, _)) = self.entry_of(ino) {
            self.wrote_in_dir(dir);
        }
    }

    /// The server let the mount write in `dir` just now (kept only when writing back).
    pub(crate) fn wrote_in_dir(&mut self, dir: u64) {
        if self.copies.is_some() {
            self.writable.insert(dir, Instant::now());
        }
    }

    /// The server let the mount remove a name from `dir` just now (kept only while
    /// writing back under callbacks, the one mode that acts on it).
    pub(crate) fn removed_in(&mut self, dir: u64) {
        if self.writing_back_under_callbacks() {
            self.removable.insert(dir, Instant::now());
        }
    }

    /// True when the server let the mount write in `dir` within the attribute timeout:
    /// a file may then be made or written there locally, its store checked at close.
    pub(crate) fn may_write_in(&self, dir: u64) -> bool {
        self.writable.get(&dir).is_some_and(|at| at.elapsed() < self.ttl())
    }
}
