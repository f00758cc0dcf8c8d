//! Protocol drivers behind one trait, so `locus mount` and `locus run` work the
//! same over every kind of remote storage, as Parrot's drivers do.
//!
//! - [`locus::LocusDriver`]: a Locus server, every operation.
//! - [`chirp::ChirpDriver`]: CCTools' `chirp_server`, a server we did not write.
//! - [`http::HttpDriver`]: any HTTP or HTTPS server, read-only: `HEAD` for attributes,
//!   `GET` with `Range` for reads; no directory listings.
//! - [`local::LocalDriver`]: a directory of this machine (`file:///path`).
//!
//! Every driver speaks paths beneath its base and answers errors as a [`DriverError`]
//! carrying the errno a program should see and its [`ErrorClass`]: an answer, a
//! transient failure (trying again may help) or a permanent one (it never will).

pub mod chirp;
pub mod http;
pub mod local;
pub mod locus;

pub use locus_proto::types::{open_flags, Attr, DirEntry, Opened, SetTime, StatFs, Time};

/// What kind of failure a [`DriverError`] is, which decides what a program sees
/// (Parrot's error triage): an errno, a retry, or a clear stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The server answered: the operation failed with the errno.
    Answer,
    /// The server could not be reached or went away; trying again later may help.
    Transient,
    /// The driver can never do this (a listing over HTTP, a protocol violation); no
    /// errno describes it honestly.
    Permanent,
}

/// A failed driver call: the errno for the program, a message, and its class.
#[derive(Debug, Clone)]
pub struct DriverError {
    pub errno: i32,
    pub message: String,
    pub class: ErrorClass,
}

impl DriverError {
    /// An answer: the operation failed with `errno`.
    pub fn errno(errno: i32, message: impl Into<String>) -> DriverError {
        DriverError { errno, message: message.into(), class: ErrorClass::Answer }
    }

    /// The server could not be reached or went away.
    pub fn transient(message: impl Into<String>) -> DriverError {
        DriverError { errno: libc::EIO, message: message.into(), class: ErrorClass::Transient }
    }

    /// A request the driver can never satisfy; `errno` is what a mount (which cannot
    /// stop the program) answers instead.
    pub fn permanent(errno: i32, message: impl Into<String>) -> DriverError {
        DriverError { errno, message: message.into(), class: ErrorClass::Permanent }
    }

    /// True when the server could not be reached.
    pub fn is_transient(&self) -> bool {
        self.class == ErrorClass::Transient
    }

    /// The driver cannot do this at all (a read-only or listing-less protocol).
    pub fn unsupported(what: &str, driver: &str) -> DriverError {
        let errno =
            if matches!(what, "readdir" | "readlink" | "link" | "symlink") { libc::EOPNOTSUPP } else { libc::EROFS };
        DriverError::errno(errno, format!("{what}: not supported by the {driver} driver"))
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DriverError {}

/// What a server's callback breaks tell a cache (see [`Driver::callbacks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Break {
    /// These paths changed (content, attributes or existence), and so did their
    /// directories' listings.
    Paths(Vec<String>),
    /// The promises are gone (the connection that held them or heard them was lost):
    /// nothing cached under them can be trusted.
    All,
}

/// Result of a driver call.
pub type Result<T> = std::result::Result<T, DriverError>;

/// What every protocol driver provides. Paths are absolute within the driver's base;
/// handles are the driver's own. Writing operations default to `EROFS`.
pub trait Driver: Send {
    /// A short name for messages (`locus`, `chirp`, `http`).
    fn name(&self) -> &'static str;
    /// How long calls keep retrying an unreachable server before failing with `EIO`
    /// (drivers that cannot reconnect ignore it).
    fn set_retry(&mut self, _window: std::time::Duration) {}
    /// Attributes of a path, not following a final symbolic link.
    fn lstat(&mut self, path: &str) -> Result<Attr>;
    /// A directory's entries with their attributes.
    fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>>;
    /// Asks for the listings of `dirs` without waiting, for a caller that expects to
    /// read them soon (a program walking a tree): a later [`Driver::readdir`] of one of
    /// them answers from what came. The caller drops them ([`Driver::drop_ahead`]) once
    /// they may be out of date. Nothing where the protocol cannot.
    fn list_ahead(&mut self, _dirs: &[String]) {}
    /// Forgets the listings asked for by [`Driver::list_ahead`].
    fn drop_ahead(&mut self) {}
    /// Opens a path with Locus `open_flags`.
    fn open(&mut self, path: &str, flags: u32, mode: u32) -> Result<Opened>;
    fn close(&mut self, handle: u64) -> Result<()>;
    fn fstat(&mut self, handle: u64) -> Result<Attr>;
    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>>;
    fn pwrite(&mut self, _handle: u64, _offset: u64, _data: &[u8]) -> Result<u64> {
        Err(DriverError::unsupported("write", self.name()))
    }
    /// Writes all of `data` at `offset`, without waiting for the server where the driver
    /// can; an error then shows at the next [`Driver::settle`] of the handle.
    fn pwrite_behind(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<()> {
        match self.pwrite(handle, offset, data)? {
            n if n as usize == data.len() => Ok(()),
            _ => Err(DriverError::errno(libc::EIO, "short write")),
        }
    }
    /// Waits for the handle's writes behind; answers the first error among them.
    fn settle(&mut self, _handle: u64) -> Result<()> {
        Ok(())
    }
    /// [`Driver::settle`], then the file's attributes after its writes, in the same
    /// round trip where the driver can ask for them before the answers are in.
    fn settle_stat(&mut self, handle: u64) -> Result<Attr> {
        self.settle(handle)?;
        self.fstat(handle)
    }
    fn ftruncate(&mut self, _handle: u64, _size: u64) -> Result<()> {
        Err(DriverError::unsupported("truncate", self.name()))
    }
    fn fsync(&mut self, _handle: u64) -> Result<()> {
        Ok(())
    }
    fn mkdir(&mut self, _path: &str, _mode: u32) -> Result<()> {
        Err(DriverError::unsupported("mkdir", self.name()))
    }
    fn rmdir(&mut self, _path: &str) -> Result<()> {
        Err(DriverError::unsupported("rmdir", self.name()))
    }
    fn unlink(&mut self, _path: &str) -> Result<()> {
        Err(DriverError::unsupported("unlink", self.name()))
    }
    /// Removes a file without waiting for the server where the driver can: the request
    /// goes out now, ahead of every later one, and a failure shows in
    /// [`Driver::failed_behind`]. For a caller that knows the removal will succeed.
    fn unlink_behind(&mut self, path: &str) -> Result<()> {
        self.unlink(path)
    }
    /// Renames without waiting for the server where the driver can, as
    /// [`Driver::unlink_behind`] removes; a failure shows under both names.
    fn rename_behind(&mut self, from: &str, to: &str) -> Result<()> {
        self.rename(from, to)
    }
    /// The names changed behind (removals, renames) whose change failed since the last
    /// call, with their errors; with `wait`, after waiting for every one still
    /// unanswered. With callbacks on, each failure also arrives as a [`Break`] of its
    /// paths.
    fn failed_behind(&mut self, _wait: bool) -> Vec<(String, DriverError)> {
        Vec::new()
    }
    fn rename(&mut self, _from: &str, _to: &str) -> Result<()> {
        Err(DriverError::unsupported("rename", self.name()))
    }
    fn symlink(&mut self, _target: &str, _path: &str) -> Result<()> {
        Err(DriverError::unsupported("symlink", self.name()))
    }
    fn readlink(&mut self, _path: &str) -> Result<String> {
        Err(DriverError::unsupported("readlink", self.name()))
    }
    fn link(&mut self, _from: &str, _to: &str) -> Result<()> {
        Err(DriverError::unsupported("link", self.name()))
    }
    fn truncate(&mut self, _path: &str, _size: u64) -> Result<()> {
        Err(DriverError::unsupported("truncate", self.name()))
    }
    fn chmod(&mut self, _path: &str, _mode: u32) -> Result<()> {
        Err(DriverError::unsupported("chmod", self.name()))
    }
    fn utimes(&mut self, _path: &str, _atime: SetTime, _mtime: SetTime) -> Result<()> {
        Err(DriverError::unsupported("utimes", self.name()))
    }
    /// Sets the times of a file open as `handle`, without waiting for the server where
    /// the driver can; an error then shows at the next [`Driver::settle`] of the handle.
    fn utimes_behind(&mut self, path: &str, atime: SetTime, mtime: SetTime, _handle: u64) -> Result<()> {
        self.utimes(path, atime, mtime)
    }
    /// Sets times, then answers the attributes (of the open `handle` if given), in one
    /// round trip where the driver can send both at once.
    fn utimes_stat(&mut self, path: &str, atime: SetTime, mtime: SetTime, handle: Option<u64>) -> Result<Attr> {
        self.utimes(path, atime, mtime)?;
        match handle {
            Some(h) => self.fstat(h),
            None => self.lstat(path),
        }
    }
    /// Whether a listing of the directory `path` names everything that can be looked up
    /// in it. One whose entries come into being when first named (`/locus` of `locus
    /// run`, where any `HOST:PORT` connects) says no, so that no absence is cached there.
    fn lists_all(&self, _path: &str) -> bool {
        true
    }
    /// Turns callbacks on, with at most `max` promises: from now on the server tells,
    /// through the returned channel, when a path this driver asked about changes. None
    /// where the protocol has no callbacks.
    fn callbacks(&mut self, _max: u32) -> Option<std::sync::mpsc::Receiver<Break>> {
        None
    }
    /// True while the server holds this driver's promises: what it answers now may be
    /// cached until a [`Break`] says otherwise.
    fn callbacks_held(&self) -> bool {
        false
    }
    /// Paths answered since the last call without a promise, though callbacks are on
    /// (a server bound reached): a cache keeps what it knows of them only for its
    /// timeout. While the last answer is such, [`Driver::callbacks_held`] says no.
    fn take_unpromised(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// True when, once callbacks are on, they cover every path this driver will ever
    /// serve (one server), so that a cache may be told so for good.
    fn callbacks_cover_all(&self) -> bool {
        false
    }
    /// File-system statistics; zeros where the protocol has none.
    fn statfs(&mut self, _path: &str) -> Result<StatFs> {
        Ok(StatFs { bsize: 4096, frsize: 4096, namemax: 255, ..Default::default() })
    }
    /// `access(2)` with R=4, W=2, X=1; by default, existence only.
    fn access(&mut self, path: &str, _mode: u32) -> Result<()> {
        self.lstat(path).map(drop)
    }
    /// A whole file and its attributes, for staging; by default open, read, close.
    fn read_file(&mut self, path: &str) -> Result<(Vec<u8>, Attr)> {
        let opened = self.open(path, open_flags::READ, 0)?;
        let mut data = Vec::with_capacity(opened.attr.size.min(WHOLE_FILE_CHUNK as u64) as usize);
        let read = loop {
            match self.pread(opened.handle, data.len() as u64, WHOLE_FILE_CHUNK) {
                Ok(piece) if piece.is_empty() => break Ok(()),
                Ok(piece) => data.extend_from_slice(&piece),
                Err(e) => break Err(e),
            }
        };
        let _ = self.close(opened.handle);
        read.map(|()| (data, opened.attr))
    }
    /// As [`Driver::write_file`], where the server need not have it on disk before it
    /// answers (a file stored at close; `fsync` is what asks for the disk).
    fn store_file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        self.write_file(path, mode, data)
    }
    /// Replaces a whole file (created with `mode` if missing); answers its new attributes.
    fn write_file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        let flags = open_flags::WRITE | open_flags::CREATE | open_flags::TRUNCATE;
        let opened = self.open(path, flags, mode)?;
        let mut written = 0usize;
        let outcome = loop {
            if written == data.len() {
                break self.fstat(opened.handle);
            }
            let end = (written + WHOLE_FILE_CHUNK as usize).min(data.len());
            match self.pwrite(opened.handle, written as u64, &data[written..end]) {
                Ok(n) => written += n as usize,
                Err(e) => break Err(e),
            }
        };
        let _ = self.close(opened.handle);
        outcome
    }
}

/// Bytes per call when [`Driver::read_file`] and [`Driver::write_file`] go piece by piece.
const WHOLE_FILE_CHUNK: u32 = 1 << 20;

/// The driver for a URL and the path within it: `locus://` and `locus+tls://`,
/// `chirp://HOST:PORT/path`, `http://`, `https://` and `file:///path`.
pub fn connect(url: &str) -> Result<(Box<dyn Driver>, String)> {
    let bad = |why: &str| DriverError::errno(libc::EINVAL, format!("{url}: {why}"));
    let (scheme, _) = url.split_once("://").ok_or_else(|| bad("not a URL"))?;
    match scheme {
        "locus" | "locus+tls" => {
            let (d, path) = locus::LocusDriver::connect(url)?;
            Ok((Box::new(d), path))
        }
        "chirp" => {
            let (d, path) = chirp::ChirpDriver::connect(url)?;
            Ok((Box::new(d), path))
        }
        "http" | "https" => Ok((Box::new(http::HttpDriver::new(url)?), "/".to_string())),
        "file" => Ok((Box::new(local::LocalDriver::new(&url["file://".len()..])?), "/".to_string())),
        _ => Err(bad("unknown scheme (locus, locus+tls, chirp, http, https, file)")),
    }
}

pub use locus_proto::path::join;

/// Runs `f` again with backoff (50 ms doubling to 2 s) while it fails transiently, up to
/// `window`; answers its last outcome.
pub fn retry_transient<T>(window: std::time::Duration, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + window;
    let mut pause = Duration::from_millis(50);
    loop {
        match f() {
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}
