//! Protocol drivers behind one trait, so `locus mount` (and later `locus run`) work the
//! same over every kind of remote storage, as Parrot's drivers do.
//!
//! - [`locus::LocusDriver`]: a Locus server, every operation.
//! - [`chirp::ChirpDriver`]: CCTools' `chirp_server`, a server we did not write.
//! - [`http::HttpDriver`]: any HTTP or HTTPS server, read-only: `HEAD` for attributes,
//!   `GET` with `Range` for reads; no directory listings.
//!
//! Every driver speaks paths beneath its base and answers errors as a [`DriverError`]
//! carrying the errno a program should see and whether trying again may help.

pub mod chirp;
pub mod http;
pub mod locus;

pub use locus_proto::types::{Attr, DirEntry, Opened, SetTime, StatFs, Time};

/// A failed driver call: the errno for the program, a message, and whether the failure
/// is transient (the server unreachable) rather than an answer.
#[derive(Debug, Clone)]
pub struct DriverError {
    pub errno: i32,
    pub message: String,
    pub transient: bool,
}

impl DriverError {
    /// An answer: the operation failed with `errno`.
    pub fn errno(errno: i32, message: impl Into<String>) -> DriverError {
        DriverError { errno, message: message.into(), transient: false }
    }

    /// The server could not be reached or went away.
    pub fn transient(message: impl Into<String>) -> DriverError {
        DriverError { errno: libc::EIO, message: message.into(), transient: true }
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
    /// Opens a path with Locus `open_flags`.
    fn open(&mut self, path: &str, flags: u32, mode: u32) -> Result<Opened>;
    fn close(&mut self, handle: u64) -> Result<()>;
    fn fstat(&mut self, handle: u64) -> Result<Attr>;
    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>>;
    fn pwrite(&mut self, _handle: u64, _offset: u64, _data: &[u8]) -> Result<u64> {
        Err(DriverError::unsupported("write", self.name()))
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
    /// File-system statistics; zeros where the protocol has none.
    fn statfs(&mut self, _path: &str) -> Result<StatFs> {
        Ok(StatFs { bsize: 4096, frsize: 4096, namemax: 255, ..Default::default() })
    }
    /// `access(2)` with R=4, W=2, X=1; by default, existence only.
    fn access(&mut self, path: &str, _mode: u32) -> Result<()> {
        self.lstat(path).map(drop)
    }
}

/// The driver for a URL and the path within it: `locus://` and `locus+tls://`,
/// `chirp://HOST:PORT/path`, `http://` and `https://`.
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
        _ => Err(bad("unknown scheme (locus, locus+tls, chirp, http, https)")),
    }
}
