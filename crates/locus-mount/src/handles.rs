//! Opening files for the kernel: at the server, deferred until a read needs them (a
//! small file is fetched whole at its open), and the count of the kernel's handles.

use crate::convert::errno;
use crate::convert::locus_flags;
use crate::convert::FOPEN_NOFLUSH;
use crate::handle_table::{Behind, Handle};
use crate::known::version;
use crate::LocusFs;
use crate::CALLBACK_TTL;
use locus_drivers::Attr;
use locus_fuse::Request;
use locus_proto::types::open_flags;
use std::ffi::OsStr;

/// Files at most this large are fetched whole to be read (see [`LocusFs::fetch_small`]).
pub(crate) const WHOLE_MAX: u64 = 256 << 10;

impl LocusFs {
    /// The server handle behind a handle given to the kernel, opening the file at the
    /// server now if its open was deferred.
    pub(crate) fn real(&mut self, fh: u64) -> Result<u64, i32> {
        let ino = match self.handles.get(fh) {
            Some(Handle { ino, behind: Behind::Deferred(None), .. }) => *ino,
            Some(Handle { behind: Behind::Deferred(Some(h)), .. }) => return Ok(*h),
            _ => return Ok(fh),
        };
        let path = self.path(ino)?;
        let opened = self.driver.open(&path, open_flags::READ, 0).map_err(errno)?;
        self.handles.rebind(fh, Behind::Deferred(Some(opened.handle)));
        self.handles.opened_at_server(ino, opened.handle);
        Ok(opened.handle)
    }

    /// The whole content of `ino`, fetched in one round trip (a streamed `get`, refused as
    /// an open would be) where it is a small file and callbacks hold: reading a small
    /// file then costs one round trip, not an open and a read (`grep -r`, a compiler
    /// reading headers). Its handle answers reads from it ([`handle_table::Handle::known`](crate::handle_table::Handle::known)) without
    /// being opened at the server, unless the name is about to go ([`LocusFs::pin`]),
    /// until a break drops it ([`LocusFs::drop_fetched`]). `None` for a large or active
    /// file, without callbacks, or where the fetch fails: the caller opens the file at
    /// the server as before (and reports that error).
    pub(crate) fn fetch_small(&mut self, ino: u64) -> Option<Vec<u8>> {
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
    pub(crate) fn open_whole(&mut self, ino: u64) -> Option<(u64, bool)> {
        let content = self.fetch_small(ino)?;
        let now = self.fresh(ino).map(version)?;
        let keep = self.seen.lock().insert(ino, now) == Some(now);
        let fh = self.handles.own(ino, Behind::Deferred(None), Some(content));
        Some((fh, keep))
    }

    /// Drops the contents fetched for handles not open at the server, of the inodes
    /// `of` picks: their next read opens the file there.
    pub(crate) fn drop_fetched(&mut self, of: impl Fn(u64) -> bool) {
        self.handles.drop_fetched(of);
    }

    /// The server handle behind a handle given to the kernel, if the file is open at
    /// the server.
    pub(crate) fn opened(&self, fh: u64) -> Option<u64> {
        match self.handles.behind(fh) {
            Behind::Copy(_) => None,
            Behind::Deferred(real) => real,
            Behind::Server => Some(fh),
        }
    }

    /// Opens at the server every deferred open of `ino`, before its name goes away.
    pub(crate) fn pin(&mut self, ino: Option<u64>) {
        let Some(ino) = ino else { return };
        for (fh, _) in self.handles.on(ino, |b| b == Behind::Deferred(None)) {
            let _ = self.real(fh);
        }
    }

    /// `ino` changed through `fh` (`None`: by path): other handles' known content is stale.
    pub(crate) fn forget_known(&mut self, ino: u64, fh: Option<u64>) {
        self.handles.forget_known(ino, fh);
    }

    /// Opens `ino` for the kernel: answers the handle and the `FOPEN_*` flags.
    pub(crate) fn open_handle(&mut self, ino: u64, flags: i32) -> Result<(u64, u32), i32> {
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
            self.handles.server(ino, opened.handle, None);
            return Ok((opened.handle, locus_fuse::consts::FOPEN_DIRECT_IO | no_flush));
        }
        if !read_only || self.unstored(ino).is_some() {
            if let Some((fh, kept)) = self.open_copy(ino, flags) {
                return Ok((fh, no_flush | if kept { locus_fuse::consts::FOPEN_KEEP_CACHE } else { 0 }));
            }
        }
        let cached = self.fresh(ino).map(version);
        if read_only && cached.is_some() && self.seen.lock().get(&ino) == cached.as_ref() {
            // Unchanged within the attribute timeout and its pages are cached: the kernel
            // may well read nothing from the server.
            let fh = self.handles.own(ino, Behind::Deferred(None), None);
            return Ok((fh, locus_fuse::consts::FOPEN_KEEP_CACHE | no_flush));
        }
        if read_only {
            if let Some((fh, keep)) = self.open_whole(ino) {
                return Ok((fh, no_flush | if keep { locus_fuse::consts::FOPEN_KEEP_CACHE } else { 0 }));
            }
        }
        let path = self.path(ino)?;
        let opened = self.driver.open(&path, locus_flags(flags), 0).map_err(errno);
        if opened == Err(libc::ENOENT) {
            self.found_gone(ino);
        }
        let opened = opened?;
        // Keep the cached pages only if the file is as it was when last opened.
        let now = version(&opened.attr);
        let keep = self.seen.lock().insert(ino, now) == Some(now);
        let empty = !read_only && opened.attr.size == 0 && opened.attr.is_file();
        self.handles.server(ino, opened.handle, empty.then(Vec::new));
        self.remember(ino, &opened.attr);
        if !read_only {
            self.wrote_in(ino);
        }
        Ok((opened.handle, no_flush | if keep { locus_fuse::consts::FOPEN_KEEP_CACHE } else { 0 }))
    }

    /// Makes `name` in `parent` and opens it for the kernel: answers its inode, its
    /// attributes and the handle.
    pub(crate) fn create_handle(
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
        self.seen.lock().insert(ino, version(&opened.attr));
        self.handles.server(ino, opened.handle, (opened.attr.size == 0).then(Vec::new));
        self.wrote_in(ino);
        Ok((ino, opened.attr, opened.handle))
    }

    /// Counts the kernel's handles on `ino` (`by` is 1 at an open, -1 at a release):
    /// the pages of a file open when a connection is lost are dropped, not kept to be
    /// revalidated, since reading them asks the mount nothing.
    pub(crate) fn opened_file(&mut self, ino: u64, by: isize) {
        let mut open = self.open_files.lock();
        let count = open.entry(ino).or_default();
        *count = count.saturating_add_signed(by);
        if *count == 0 {
            open.remove(&ino);
        }
    }
}
