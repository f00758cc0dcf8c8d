//! The FUSE protocol, spoken by `locus mount` and `locus run`: the kernel's requests
//! handed to a [`Filesystem`], its replies sent back, and notifications the other way.
//!
//! Two transports carry the same requests ([`Transport`]):
//! - **classic**: one `read(2)` of /dev/fuse per request and one `writev(2)` per reply;
//! - **io_uring** (Linux 6.14 and later, with `/sys/module/fuse/parameters/enable_uring`
//!   set): the kernel puts requests into buffers registered on an io_uring, and a reply
//!   goes back with the fetch of the next request in one submission. Even then the
//!   kernel sends FORGET and INTERRUPT over /dev/fuse, which another thread reads.
//!
//! The file system (`&mut self`) serves one request at a time: the classic transport
//! has one thread; over io_uring a thread per CPU takes turns on it, so that a request
//! is answered on the CPU that made it. Notifications ([`Notifier`]) may come from any
//! thread. We wrote this crate rather
//! than use `fuser` because `fuser` reads /dev/fuse only and keeps its request parsing
//! to itself.
//!
//! Rooms: `abi` (the kernel's layouts), `reply` (answers), `dispatch` (a request to a
//! method), `classic` (/dev/fuse reads and writes), `uring` (the io_uring queues),
//! `notify`, `session` (INIT, then one of the two transports), `mount` (mounting); each
//! imports only rooms listed before it.

mod abi;
mod classic;
mod dispatch;
mod mount;
mod notify;
mod reply;
mod session;
mod uring;

pub use classic::serve_one_request;
pub use mount::{mount, BackgroundSession, MountOption};
pub use notify::Notifier;
pub use reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr,
};
pub use session::{Session, Transport, TransportChoice, URING_SETTING};

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
/// reply object; a method that drops its reply unanswered answers `EIO`. A method not
/// implemented answers `ENOSYS` (the kernel then stops sending most such requests), as
/// do requests this trait has no method for; RELEASEDIR is answered with success, IOCTL
/// with `ENOTTY`.
#[allow(clippy::too_many_arguments)]
pub trait Filesystem {
    /// FUSE_INIT: before any other request; an error refuses the mount.
    fn init(&mut self, _req: &Request<'_>, _config: &mut KernelConfig) -> Result<(), i32> {
        Ok(())
    }
    /// The kernel let go of the file system (unmounted, or the session ended).
    fn destroy(&mut self) {}
    fn lookup(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, reply: ReplyEntry<'_>) {
        reply.error(libc::ENOSYS);
    }
    /// The kernel forgets `nlookup` lookups of `ino` (no reply).
    fn forget(&mut self, _req: &Request<'_>, _ino: u64, _nlookup: u64) {}
    fn getattr(&mut self, _req: &Request<'_>, _ino: u64, _fh: Option<u64>, reply: ReplyAttr<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn setattr(&mut self, _req: &Request<'_>, _ino: u64, _set: SetAttr, reply: ReplyAttr<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn readlink(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyData<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        _parent: u64,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry<'_>,
    ) {
        reply.error(libc::ENOSYS);
    }
    fn unlink(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, reply: ReplyEmpty<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn rmdir(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, reply: ReplyEmpty<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn symlink(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, _link: &Path, reply: ReplyEntry<'_>) {
        reply.error(libc::ENOSYS);
    }
    /// `flags`: `RENAME_NOREPLACE`, `RENAME_EXCHANGE` (0 for a plain rename).
    fn rename(
        &mut self,
        _req: &Request<'_>,
        _parent: u64,
        _name: &OsStr,
        _newparent: u64,
        _newname: &OsStr,
        _flags: u32,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(libc::ENOSYS);
    }
    fn link(&mut self, _req: &Request<'_>, _ino: u64, _newparent: u64, _newname: &OsStr, reply: ReplyEntry<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn open(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn create(
        &mut self,
        _req: &Request<'_>,
        _parent: u64,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate<'_>,
    ) {
        reply.error(libc::ENOSYS);
    }
    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _offset: i64,
        _size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData<'_>,
    ) {
        reply.error(libc::ENOSYS);
    }
    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _offset: i64,
        _data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite<'_>,
    ) {
        reply.error(libc::ENOSYS);
    }
    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock_owner: u64, reply: ReplyEmpty<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(libc::ENOSYS);
    }
    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn opendir(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn readdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _offset: i64, reply: ReplyDirectory<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn getxattr(&mut self, _req: &Request<'_>, _ino: u64, _name: &OsStr, _size: u32, reply: ReplyXattr<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn listxattr(&mut self, _req: &Request<'_>, _ino: u64, _size: u32, reply: ReplyXattr<'_>) {
        reply.error(libc::ENOSYS);
    }
    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty<'_>) {
        reply.error(libc::ENOSYS);
    }
}
