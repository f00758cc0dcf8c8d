//! The FUSE protocol, spoken by `locus mount` and `locus run`: the kernel's requests
//! handed to a [`Filesystem`], its replies sent back, and notifications the other way.
//!
//! Two transports carry the same requests ([`Transport`]):
//! - **classic**: one `read(2)` of /dev/fuse per request and one `writev(2)` per reply;
//! - **io_uring** (Linux 6.14 and later, with `/sys/module/fuse/parameters/enable_uring`
//!   set): the kernel puts requests into buffers registered on an io_uring, and a reply
//!   goes back with the fetch of the next request in one submission. Even then the
//!   kernel sends FORGET and INTERRUPT over /dev/fuse, which the same ring reads.
//!
//! The file system is served by one thread (`&mut self`), as both transports see it;
//! notifications ([`Notifier`]) may come from any thread. We wrote this crate rather
//! than use `fuser` because `fuser` reads /dev/fuse only and keeps its request parsing
//! to itself.
//!
//! Rooms: `abi` (the kernel's layouts), `reply` (answers), `dispatch` (a request to a
//! method), `session` (start-up and the classic loop), `uring` (the io_uring loop),
//! `mount` (mounting and unmounting), `notify`.

mod abi;
mod dispatch;
mod mount;
mod notify;
mod reply;
mod session;
mod uring;

pub use mount::{mount, BackgroundSession, MountOption};
pub use notify::Notifier;
pub use reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr,
};
pub use session::{Session, Transport, TransportChoice};

use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;

/// `FOPEN_*` flags an open may answer.
pub mod consts {
    /// Bypass the page cache for this open file.
    pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
    /// Keep the file's cached pages at this open.
    pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
    /// Let the kernel keep a directory's listing between opens (ABI 7.28).
    pub const FOPEN_CACHE_DIR: u32 = 1 << 3;
    /// Send no FLUSH when a descriptor of this handle is closed (ABI 7.35).
    pub const FOPEN_NOFLUSH: u32 = 1 << 5;
}

/// The kind of a node, as directory entries and attributes say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    NamedPipe,
    CharDevice,
    BlockDevice,
    Directory,
    RegularFile,
    Symlink,
    Socket,
}

impl FileType {
    /// The `S_IF*` bits of this kind.
    pub(crate) fn mode_bits(self) -> u32 {
        match self {
            FileType::NamedPipe => libc::S_IFIFO,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Directory => libc::S_IFDIR,
            FileType::RegularFile => libc::S_IFREG,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Socket => libc::S_IFSOCK,
        }
    }
}

/// A node's attributes, as the kernel caches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileType,
    /// Permission bits (`0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    /// `FUSE_ATTR_*` flags; 0 for an ordinary node.
    pub flags: u32,
}

/// A time a SETATTR sets: a given one, or the server's now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeOrNow {
    SpecificTime(SystemTime),
    Now,
}

/// What a SETATTR changes: each field present is to be set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    /// The open file the change came through (`ftruncate`, `futimens`).
    pub fh: Option<u64>,
}

/// Who asked: the calling process's ids, as the kernel saw them.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    header: &'a abi::InHeader,
}

impl Request<'_> {
    /// The caller's user id.
    pub fn uid(&self) -> u32 {
        self.header.uid
    }
    /// The caller's group id.
    pub fn gid(&self) -> u32 {
        self.header.gid
    }
    /// The caller's process id (0 for requests the kernel makes on its own).
    pub fn pid(&self) -> u32 {
        self.header.pid
    }
}

/// What the file system asks of the kernel at FUSE_INIT.
#[derive(Debug)]
pub struct KernelConfig {
    pub(crate) max_write: u32,
    pub(crate) max_readahead: u32,
    kernel_max_readahead: u32,
}

/// The largest write (and read) the kernel will send in one request.
pub const MAX_WRITE_LIMIT: u32 = 1 << 20;

impl KernelConfig {
    /// Asks for writes of up to `max_write` bytes in one request (at most 1 MiB);
    /// answers the largest allowed when it is more.
    pub fn set_max_write(&mut self, max_write: u32) -> Result<(), u32> {
        if max_write > MAX_WRITE_LIMIT {
            return Err(MAX_WRITE_LIMIT);
        }
        self.max_write = max_write.max(4096);
        Ok(())
    }

    /// Asks the kernel to read ahead at most `bytes`, up to its own limit; answers that
    /// limit when it is less.
    pub fn set_max_readahead(&mut self, bytes: u32) -> Result<(), u32> {
        if bytes > self.kernel_max_readahead {
            return Err(self.kernel_max_readahead);
        }
        self.max_readahead = bytes;
        Ok(())
    }
}

/// A file system served through FUSE. Each method answers its request through its
/// reply object; a method that drops its reply unanswered answers `EIO`. Requests this
/// trait has no method for are answered `ENOSYS` (the kernel then stops sending most of
/// them), RELEASEDIR with success, IOCTL with `ENOTTY`.
#[allow(clippy::too_many_arguments)]
pub trait Filesystem {
    /// FUSE_INIT: before any other request; an error refuses the mount.
    fn init(&mut self, req: &Request<'_>, config: &mut KernelConfig) -> Result<(), i32>;
    /// The kernel let go of the file system (unmounted, or the session ended).
    fn destroy(&mut self);
    fn lookup(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry<'_>);
    /// The kernel forgets `nlookup` lookups of `ino` (no reply).
    fn forget(&mut self, req: &Request<'_>, ino: u64, nlookup: u64);
    fn getattr(&mut self, req: &Request<'_>, ino: u64, fh: Option<u64>, reply: ReplyAttr<'_>);
    fn setattr(&mut self, req: &Request<'_>, ino: u64, set: SetAttr, reply: ReplyAttr<'_>);
    fn readlink(&mut self, req: &Request<'_>, ino: u64, reply: ReplyData<'_>);
    fn mkdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry<'_>);
    fn unlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty<'_>);
    fn rmdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty<'_>);
    fn symlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, link: &Path, reply: ReplyEntry<'_>);
    /// `flags`: `RENAME_NOREPLACE`, `RENAME_EXCHANGE` (0 for a plain rename).
    fn rename(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty<'_>,
    );
    fn link(&mut self, req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry<'_>);
    fn open(&mut self, req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen<'_>);
    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate<'_>,
    );
    fn read(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        flags: i32,
        lock_owner: Option<u64>,
        reply: ReplyData<'_>,
    );
    fn write(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        write_flags: u32,
        flags: i32,
        lock_owner: Option<u64>,
        reply: ReplyWrite<'_>,
    );
    fn flush(&mut self, req: &Request<'_>, ino: u64, fh: u64, lock_owner: u64, reply: ReplyEmpty<'_>);
    fn release(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        flags: i32,
        lock_owner: Option<u64>,
        flush: bool,
        reply: ReplyEmpty<'_>,
    );
    fn fsync(&mut self, req: &Request<'_>, ino: u64, fh: u64, datasync: bool, reply: ReplyEmpty<'_>);
    fn opendir(&mut self, req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen<'_>);
    fn readdir(&mut self, req: &Request<'_>, ino: u64, fh: u64, offset: i64, reply: ReplyDirectory<'_>);
    fn fsyncdir(&mut self, req: &Request<'_>, ino: u64, fh: u64, datasync: bool, reply: ReplyEmpty<'_>);
    fn statfs(&mut self, req: &Request<'_>, ino: u64, reply: ReplyStatfs<'_>);
    fn getxattr(&mut self, req: &Request<'_>, ino: u64, name: &OsStr, size: u32, reply: ReplyXattr<'_>);
    fn listxattr(&mut self, req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr<'_>);
    fn access(&mut self, req: &Request<'_>, ino: u64, mask: i32, reply: ReplyEmpty<'_>);
}
