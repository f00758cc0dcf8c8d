//! The kernel's requests (`impl locus_fuse::Filesystem`), each answered from what the mount
//! knows or by the driver.
//!
//! Longer than 700 lines because it is one trait impl, which Rust keeps in one file:
//! each method is short and hands the work to the rooms (`known`, `handles`, `afs`).

use crate::convert::errno;
use crate::convert::file_attr;
use crate::convert::set_time;
use crate::handle_table::{Behind, Handle};
use crate::inodes;
use crate::known::version;
use crate::listings::Known;
use crate::writeback;
use crate::writeback::Refused;
use crate::LocusFs;
use crate::CALLBACK_TTL;
use crate::KNOWN_MAX;
use crate::RETRY_EVERY;
use locus_drivers::Attr;
use locus_drivers::DriverError;
use locus_drivers::SetTime;
use locus_drivers::Time;
use locus_fuse::FileType;
use locus_fuse::Filesystem;
use locus_fuse::KernelConfig;
use locus_fuse::ReplyAttr;
use locus_fuse::ReplyCreate;
use locus_fuse::ReplyData;
use locus_fuse::ReplyDirectory;
use locus_fuse::ReplyEmpty;
use locus_fuse::ReplyEntry;
use locus_fuse::ReplyOpen;
use locus_fuse::ReplyStatfs;
use locus_fuse::ReplyWrite;
use locus_fuse::Request;
use locus_fuse::SetAttr;
use locus_fuse::TimeOrNow;
use locus_proto::types::open_flags;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

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
                if ttl == CALLBACK_TTL {
                    self.absent.lock().insert(parent, OsStr::new(name));
                }
                reply.entry(&ttl, &file_attr(0, &Attr::default()), 0)
            }
            Err(code) => reply.error(code),
        }
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
        if self.inodes.path(ino).is_none() {
            self.attrs.remove(&ino);
            self.seen.lock().remove(&ino);
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
        let by_handle = fh.or_else(|| self.handles.at_server(ino).first().copied());
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

    fn setattr(&mut self, _req: &Request<'_>, ino: u64, set: SetAttr, reply: ReplyAttr) {
        let SetAttr { mode, uid, gid, size, atime, mtime, fh } = set;
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
                        Some(size) => self.handles.known_mut(h).map_or((), |content| content.resize(size, 0)),
                        None => self.handles.set_known(h, None),
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
        if let Some(Handle { ino, behind: Behind::Copy(_), .. }) = self.handles.get(fh) {
            let ino = *ino;
            let copy = self.copies.as_mut().and_then(|c| c.get(ino));
            let data =
                copy.map(|c| c.read(offset as u64, size)).unwrap_or_else(|| Err(std::io::Error::other("no copy")));
            let data = ok_or_reply!(data.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)), reply);
            return reply.data(&data);
        }
        if let Some(&Handle { ino, behind: Behind::Deferred(None), .. }) = self.handles.get(fh) {
            // Not open at the server: a break since drops what it fetched, and a read
            // from the start of a small file fetches it whole.
            self.absorb();
            if offset == 0 && self.handles.known(fh).is_none() {
                if let Some(content) = self.fetch_small(ino) {
                    self.handles.set_known(fh, Some(content));
                }
            }
        }
        if let Some(content) = self.handles.known(fh) {
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
        if let Behind::Copy(flags) = self.handles.behind(fh) {
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
        if let Some(content) = self.handles.known_mut(fh) {
            let start = offset as usize;
            match start.checked_add(data.len()).filter(|&end| end <= KNOWN_MAX) {
                Some(end) => {
                    if content.len() < end {
                        content.resize(end, 0);
                    }
                    content[start..end].copy_from_slice(data);
                }
                None => self.handles.set_known(fh, None),
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
        if let Behind::Copy(flags) = self.handles.behind(fh) {
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
        if self.handles.at_server(ino).len() == 1 {
            self.seen.lock().insert(ino, version(&attr));
            let content = self.handles.known(fh).filter(|c| c.len() as u64 == attr.size);
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
        let fh = match self.handles.release(fh).map(|h| h.behind) {
            Some(Behind::Copy(_)) => {
                self.release_copy(ino);
                return reply.ok();
            }
            Some(Behind::Deferred(None)) => return reply.ok(),
            Some(Behind::Deferred(Some(real))) => real,
            Some(Behind::Server) | None => fh,
        };
        self.written.remove(&fh);
        self.handles.closed_at_server(ino, fh);
        ok_or_reply!(self.driver.close(fh).map_err(errno), reply);
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _datasync: bool, reply: ReplyEmpty) {
        if let Behind::Copy(_) = self.handles.behind(fh) {
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
        let flags = if self.ttl() == CALLBACK_TTL { cache_dir | locus_fuse::consts::FOPEN_KEEP_CACHE } else { 0 };
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
        if let Some(freshener) = self.freshener.as_ref().filter(|_| offset == 0 && self.ttl() == CALLBACK_TTL) {
            let root = self.inodes.path(1).unwrap_or("/");
            let relative = path.get(root.len()..).unwrap_or_default().trim_start_matches('/');
            freshener.listed(if relative.is_empty() { ".".into() } else { relative.to_string() });
        }
    }

    fn getxattr(&mut self, _req: &Request<'_>, _ino: u64, _name: &OsStr, _size: u32, reply: locus_fuse::ReplyXattr) {
        // The protocol has no extended attributes. ENOSYS tells the kernel so once: it
        // stops asking (it asked before every write, for `security.capability`) and
        // answers EOPNOTSUPP to programs, as for a file system without xattrs.
        reply.error(libc::ENOSYS);
    }

    fn listxattr(&mut self, _req: &Request<'_>, _ino: u64, size: u32, reply: locus_fuse::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
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
