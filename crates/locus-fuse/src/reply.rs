//! Replies: each kind of request gets a reply object whose methods write the answer's
//! bytes; the transport sends them once the file system's method returns.

use crate::abi::Put;
use crate::{FileAttr, FileType};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The answer to one request, as the file system left it.
#[derive(Default)]
pub(crate) struct Outgoing {
    /// The reply's body (after `fuse_out_header`).
    pub body: Vec<u8>,
    /// 0, or the errno answered.
    pub error: i32,
    /// Whether the file system answered at all (if not, the kernel gets `EIO`).
    pub replied: bool,
}

impl Outgoing {
    pub fn reset(&mut self) {
        self.body.clear();
        self.error = 0;
        self.replied = false;
    }

    fn error(&mut self, errno: i32) {
        self.body.clear();
        // The kernel takes negative errnos from 1 to 511 (it drops a reply with any
        // other, and its caller waits); 0 would read as success.
        self.error = if (1..512).contains(&errno) { -errno } else { -libc::EIO };
        self.replied = true;
    }

    fn ok(&mut self) {
        self.error = 0;
        self.replied = true;
    }
}

/// Seconds and nanoseconds of a time since the epoch (negative before it).
fn time(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                ((d.as_secs() as i64).wrapping_neg() as u64, 0)
            } else {
                ((-(d.as_secs() as i64) - 1) as u64, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

/// `fuse_attr`, 88 bytes.
fn put_attr(b: &mut Vec<u8>, a: &FileAttr) {
    let (at, atn) = time(a.atime);
    let (mt, mtn) = time(a.mtime);
    let (ct, ctn) = time(a.ctime);
    b.u64(a.ino);
    b.u64(a.size);
    b.u64(a.blocks);
    b.u64(at);
    b.u64(mt);
    b.u64(ct);
    b.u32(atn);
    b.u32(mtn);
    b.u32(ctn);
    b.u32(a.kind.mode_bits() | u32::from(a.perm));
    b.u32(a.nlink);
    b.u32(a.uid);
    b.u32(a.gid);
    b.u32(a.rdev);
    b.u32(a.blksize);
    b.u32(a.flags);
}

/// A validity time as the kernel takes it: seconds and nanoseconds.
fn valid(ttl: &Duration) -> (u64, u32) {
    (ttl.as_secs(), ttl.subsec_nanos())
}

/// `fuse_entry_out`, 128 bytes.
fn put_entry(b: &mut Vec<u8>, ttl: &Duration, attr: &FileAttr, generation: u64) {
    let (s, n) = valid(ttl);
    b.u64(attr.ino);
    b.u64(generation);
    b.u64(s);
    b.u64(s);
    b.u32(n);
    b.u32(n);
    put_attr(b, attr);
}

/// `fuse_open_out`, 16 bytes.
fn put_open(b: &mut Vec<u8>, fh: u64, flags: u32) {
    b.u64(fh);
    b.u32(flags);
    b.u32(0);
}

macro_rules! reply_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name<'a> {
            pub(crate) out: &'a mut Outgoing,
        }

        impl $name<'_> {
            /// Answers with an error (a positive errno).
            pub fn error(self, errno: i32) {
                self.out.error(errno);
            }
        }
    };
}

reply_type!(
    /// The answer to a request that returns nothing but success or an error.
    ReplyEmpty
);
reply_type!(
    /// The answer to LOOKUP, MKDIR, SYMLINK, LINK: a node and its attributes.
    ReplyEntry
);
reply_type!(
    /// The answer to GETATTR and SETATTR.
    ReplyAttr
);
reply_type!(
    /// The answer to READ and READLINK: bytes.
    ReplyData
);
reply_type!(
    /// The answer to OPEN and OPENDIR: a handle and `FOPEN_*` flags.
    ReplyOpen
);
reply_type!(
    /// The answer to CREATE: a node, its attributes, and an open handle.
    ReplyCreate
);
reply_type!(
    /// The answer to WRITE: how many bytes were taken.
    ReplyWrite
);
reply_type!(
    /// The answer to STATFS.
    ReplyStatfs
);
reply_type!(
    /// The answer to GETXATTR and LISTXATTR: a size, or the bytes.
    ReplyXattr
);

impl ReplyEmpty<'_> {
    /// Success.
    pub fn ok(self) {
        self.out.ok();
    }
}

impl ReplyEntry<'_> {
    /// The node `attr.ino` with `attr`, both valid for `ttl`.
    pub fn entry(self, ttl: &Duration, attr: &FileAttr, generation: u64) {
        put_entry(&mut self.out.body, ttl, attr, generation);
        self.out.ok();
    }
}

impl ReplyAttr<'_> {
    /// `attr`, valid for `ttl`.
    pub fn attr(self, ttl: &Duration, attr: &FileAttr) {
        let (s, n) = valid(ttl);
        let b = &mut self.out.body;
        b.u64(s);
        b.u32(n);
        b.u32(0);
        put_attr(b, attr);
        self.out.ok();
    }
}

impl ReplyData<'_> {
    /// The bytes read.
    pub fn data(self, data: &[u8]) {
        self.out.body.extend_from_slice(data);
        self.out.ok();
    }
}

impl ReplyOpen<'_> {
    /// Opened as handle `fh` with `FOPEN_*` `flags`.
    pub fn opened(self, fh: u64, flags: u32) {
        put_open(&mut self.out.body, fh, flags);
        self.out.ok();
    }
}

impl ReplyCreate<'_> {
    /// Made `attr.ino` and opened it as `fh`.
    pub fn created(self, ttl: &Duration, attr: &FileAttr, generation: u64, fh: u64, flags: u32) {
        put_entry(&mut self.out.body, ttl, attr, generation);
        put_open(&mut self.out.body, fh, flags);
        self.out.ok();
    }
}

impl ReplyWrite<'_> {
    /// `size` bytes written.
    pub fn written(self, size: u32) {
        self.out.body.u32(size);
        self.out.body.u32(0);
        self.out.ok();
    }
}

impl ReplyStatfs<'_> {
    /// The file system's counts (`fuse_kstatfs`).
    #[allow(clippy::too_many_arguments)]
    pub fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        let b = &mut self.out.body;
        for v in [blocks, bfree, bavail, files, ffree] {
            b.u64(v);
        }
        for v in [bsize, namelen, frsize, 0, 0, 0, 0, 0, 0, 0] {
            b.u32(v);
        }
        self.out.ok();
    }
}

impl ReplyXattr<'_> {
    /// The size a buffer needs (asked with size 0).
    pub fn size(self, size: u32) {
        self.out.body.u32(size);
        self.out.body.u32(0);
        self.out.ok();
    }

    /// The value or the list of names.
    pub fn data(self, data: &[u8]) {
        self.out.body.extend_from_slice(data);
        self.out.ok();
    }
}

/// The answer to READDIR: entries added until the kernel's buffer is full.
pub struct ReplyDirectory<'a> {
    pub(crate) out: &'a mut Outgoing,
    pub(crate) size: usize,
}

impl ReplyDirectory<'_> {
    /// Adds an entry (`offset` is where the next READDIR starts); true when it did not
    /// fit, so the caller stops.
    /// A name the kernel would refuse (empty, over 1024 bytes, or holding `/`, for
    /// which it fails the whole listing with `EIO`) is left out.
    pub fn add<N: AsRef<OsStr>>(&mut self, ino: u64, offset: i64, kind: FileType, name: N) -> bool {
        let name = name.as_ref().as_bytes();
        if name.is_empty() || name.len() > 1024 || name.contains(&b'/') {
            tracing::warn!(
                "a directory entry the kernel would refuse is left out: {:?}",
                String::from_utf8_lossy(name)
            );
            return false;
        }
        let len = (24 + name.len() + 7) & !7;
        if self.out.body.len() + len > self.size {
            return true;
        }
        let b = &mut self.out.body;
        b.u64(ino);
        b.u64(offset as u64);
        b.u32(name.len() as u32);
        b.u32(kind.mode_bits() >> 12);
        b.extend_from_slice(name);
        b.resize(b.len() + (len - 24 - name.len()), 0);
        false
    }

    /// The entries added are the answer.
    pub fn ok(self) {
        self.out.ok();
    }

    /// Answers with an error (a positive errno).
    pub fn error(self, errno: i32) {
        self.out.error(errno);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_reply_stops_at_the_kernels_size() {
        let mut out = Outgoing::default();
        let mut r = ReplyDirectory { out: &mut out, size: 64 };
        assert!(!r.add(1, 1, FileType::Directory, "."));
        assert!(!r.add(2, 2, FileType::RegularFile, "a-name"));
        assert!(!r.add(9, 9, FileType::RegularFile, "a/b"), "left out");
        assert!(!r.add(9, 9, FileType::RegularFile, ""), "left out");
        assert!(r.add(3, 3, FileType::RegularFile, "no-room-left"));
        r.ok();
        assert_eq!(out.body.len(), 64);
        assert!(out.replied);
    }

    #[test]
    fn times_before_the_epoch_keep_positive_nanoseconds() {
        let t = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(time(t), ((-2i64) as u64, 500_000_000));
        assert_eq!(time(UNIX_EPOCH + Duration::new(5, 7)), (5, 7));
    }

    #[test]
    fn an_error_is_a_negative_errno_the_kernel_takes() {
        let mut out = Outgoing::default();
        ReplyEmpty { out: &mut out }.error(libc::ENOENT);
        assert_eq!(out.error, -libc::ENOENT);
        for odd in [0, -5, 512, i32::MIN] {
            ReplyEmpty { out: &mut out }.error(odd);
            assert_eq!(out.error, -libc::EIO);
        }
    }
}
