//! The mount's side of write-back (`--consistency afs`): opening and writing local
//! copies ([`crate::writeback`]), storing them at close, `fsync` and exit, trying failed
//! stores again, and storing what an earlier mount left in the journal.

use crate::convert::errno;
use crate::convert::is_active;
use crate::convert::locus_flags;
use crate::handle_table::Behind;
use crate::journal;
use crate::known::version;
use crate::listings::Known;
use crate::writeback;
use crate::LocusFs;
use crate::KNOWN_MAX;
use locus_drivers::Attr;
use locus_drivers::DriverError;
use locus_fuse::Request;
use locus_proto::types::open_flags;
use locus_proto::types::S_IFREG;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

impl LocusFs {
    /// What a file written back is now, while the server does not know it yet.
    pub(crate) fn unstored(&self, ino: u64) -> Option<Attr> {
        self.copies.as_ref()?.dirty(ino).map(|c| c.attr.clone())
    }

    /// A handle on the local copy of `ino`, for `open(2)` flags `flags`.
    pub(crate) fn copy_handle(&mut self, ino: u64, flags: i32) -> u64 {
        let fh = self.handles.own(ino, Behind::Copy(locus_flags(flags)), None);
        if let Some(copy) = self.copies.as_mut().and_then(|c| c.get(ino)) {
            copy.handles += 1;
        }
        fh
    }

    /// Opens `ino` on its local copy, made now if it has none (fetched whole, unless
    /// truncated by the open), or `None` where the file is opened at the server: not
    /// writing back, an active file, not a plain file, a file with other names or too
    /// large, or a directory the mount has not been let write in lately.
    pub(crate) fn open_copy(&mut self, ino: u64, flags: i32) -> Option<(u64, bool)> {
        let truncate = flags & libc::O_TRUNC != 0;
        let fresh = self.fresh(ino).cloned();
        let copies = self.copies.as_mut()?;
        let file_max = copies.file_max();
        let kept =
            copies.get(ino).is_some_and(|c| c.dirty || !c.at_server || fresh.as_ref().is_some_and(|a| c.current(a)));
        if !kept {
            // A file also open at the server is written there: a copy stored later
            // would undo those writes.
            if !self.handles.at_server(ino).is_empty() {
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
    pub(crate) fn store(&mut self, ino: u64, durable: bool) -> Result<(), i32> {
        self.try_store(ino, durable).map_err(errno)
    }

    /// [`Self::store`], answering the driver's error.
    pub(crate) fn try_store(&mut self, ino: u64, durable: bool) -> Result<(), DriverError> {
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
        self.seen.lock().insert(ino, version(&attr));
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
    pub(crate) fn sync_pin(&mut self, ino: u64) {
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
    pub(crate) fn worth_keeping(e: &DriverError) -> bool {
        e.class != locus_drivers::ErrorClass::Answer || [libc::ENOSPC, libc::EDQUOT, libc::EIO].contains(&e.errno)
    }

    /// A store of `ino` failed with `e` where the copy is kept: it is made durable on
    /// the local disk and tried again later (and by the next mount, should this one go).
    pub(crate) fn kept(&mut self, ino: u64, e: &DriverError) {
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
    pub(crate) fn retry_unsaved(&mut self) {
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
                    if let Some(c) = self.copies.as_mut() {
                        c.keep(ino);
                    }
                    self.unpin_and_drop(ino);
                }
            }
        }
    }

    /// Lets go of the copy of `ino` without touching its journal files.
    pub(crate) fn unpin_and_drop(&mut self, ino: u64) {
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
    pub(crate) fn recover(&mut self) {
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
    pub(crate) fn recover_one(&mut self, record: &journal::Record, data: &Path) -> Result<String, DriverError> {
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
    pub(crate) fn spill(&mut self, ino: u64) -> Result<(), i32> {
        self.store(ino, false)?;
        let path = self.path(ino)?;
        for (fh, behind) in self.handles.on(ino, |b| matches!(b, Behind::Copy(_))) {
            let Behind::Copy(flags) = behind else { continue };
            let flags = flags & !(open_flags::CREATE | open_flags::EXCLUSIVE | open_flags::TRUNCATE);
            let opened = self.driver.open(&path, flags, 0).map_err(errno)?;
            self.handles.rebind(fh, Behind::Deferred(Some(opened.handle)));
            self.handles.opened_at_server(ino, opened.handle);
        }
        self.copies.as_mut().map(|c| c.remove(ino));
        Ok(())
    }

    /// Stores the files made in `dir` that the server does not have yet, before the
    /// server is asked what `dir` holds (an error shows again at their close). Answers
    /// whether there were any.
    pub(crate) fn store_new_in(&mut self, dir: u64) -> bool {
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
    pub(crate) fn create_locally(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
    ) -> Option<(u64, Attr)> {
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
    pub(crate) fn release_copy(&mut self, ino: u64) {
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
                if let Some(c) = self.copies.as_mut() {
                    c.keep(ino);
                }
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
    pub(crate) fn copy_unlinked(&mut self, ino: Option<u64>) -> bool {
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
