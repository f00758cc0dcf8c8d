//! The kernel's FUSE protocol, as `include/uapi/linux/fuse.h` (7.42) defines it: opcodes,
//! flags, and the layouts of the structures this crate reads and writes, as byte
//! offsets. Requests are read with bounds checks ([`Args`]), never cast from bytes.

/// The protocol version this crate speaks: 7.42 is the first with io_uring; the
/// kernel and we use the smaller of its version and this.
pub(crate) const MAJOR: u32 = 7;
pub(crate) const MINOR: u32 = 42;
/// The oldest minor version we answer: every layout read and written here (INIT's
/// 64-byte answer among them) is at least this old.
pub(crate) const MINOR_MIN: u32 = 23;

/// Request opcodes.
pub(crate) mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const RENAME2: u32 = 45;
}

/// A request's name in logs (`LOOKUP`, `GETATTR`, ...), or its number.
pub(crate) fn op_name(opcode: u32) -> &'static str {
    match opcode {
        op::LOOKUP => "LOOKUP",
        op::FORGET => "FORGET",
        op::GETATTR => "GETATTR",
        op::SETATTR => "SETATTR",
        op::READLINK => "READLINK",
        op::SYMLINK => "SYMLINK",
        op::MKNOD => "MKNOD",
        op::MKDIR => "MKDIR",
        op::UNLINK => "UNLINK",
        op::RMDIR => "RMDIR",
        op::RENAME => "RENAME",
        op::LINK => "LINK",
        op::OPEN => "OPEN",
        op::READ => "READ",
        op::WRITE => "WRITE",
        op::STATFS => "STATFS",
        op::RELEASE => "RELEASE",
        op::FSYNC => "FSYNC",
        op::SETXATTR => "SETXATTR",
        op::GETXATTR => "GETXATTR",
        op::LISTXATTR => "LISTXATTR",
        op::REMOVEXATTR => "REMOVEXATTR",
        op::FLUSH => "FLUSH",
        op::INIT => "INIT",
        op::OPENDIR => "OPENDIR",
        op::READDIR => "READDIR",
        op::RELEASEDIR => "RELEASEDIR",
        op::FSYNCDIR => "FSYNCDIR",
        op::ACCESS => "ACCESS",
        op::CREATE => "CREATE",
        op::INTERRUPT => "INTERRUPT",
        op::DESTROY => "DESTROY",
        op::IOCTL => "IOCTL",
        op::BATCH_FORGET => "BATCH_FORGET",
        op::RENAME2 => "RENAME2",
        _ => "OTHER",
    }
}

/// The size of a request's first argument, the fixed structure before any names or
/// data. Over io_uring the kernel puts it in the entry's `op_in` and the rest in the
/// payload; over /dev/fuse one buffer holds both, split here. Requests of names alone
/// (LOOKUP, UNLINK, RMDIR, SYMLINK) have none.
pub(crate) fn first_arg_size(opcode: u32) -> usize {
    match opcode {
        op::FORGET | op::LINK | op::OPEN | op::OPENDIR | op::ACCESS | op::GETXATTR | op::LISTXATTR => 8,
        op::SETXATTR => 8,
        op::INTERRUPT | op::RENAME | op::MKDIR => 8,
        op::GETATTR | op::MKNOD | op::CREATE | op::FSYNC | op::FSYNCDIR | op::RENAME2 => 16,
        op::BATCH_FORGET => 8,
        op::RELEASE | op::RELEASEDIR | op::FLUSH => 24,
        op::IOCTL => 32,
        op::READ | op::READDIR | op::WRITE => 40,
        op::SETATTR => 88,
        op::INIT => 64,
        _ => 0,
    }
}

/// `fuse_in_header`: 40 bytes before every request.
pub(crate) const IN_HEADER: usize = 40;
/// `fuse_out_header`: 16 bytes before every reply and notification.
pub(crate) const OUT_HEADER: usize = 16;

/// `FUSE_INIT` flags (the low word, then `flags2` shifted by 32).
pub(crate) mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_getattr_in.getattr_flags`: the request names an open file.
pub(crate) const GETATTR_FH: u32 = 1;
/// `fuse_release_in.release_flags`: flush before releasing.
pub(crate) const RELEASE_FLUSH: u32 = 1;
/// `fuse_read_in.read_flags` / `fuse_write_in.write_flags`: `lock_owner` is valid.
pub(crate) const READ_LOCKOWNER: u32 = 1 << 1;
pub(crate) const WRITE_LOCKOWNER: u32 = 1 << 1;
/// `fuse_fsync_in.fsync_flags`: data only.
pub(crate) const FSYNC_FDATASYNC: u32 = 1;

/// `fuse_setattr_in.valid` bits.
pub(crate) mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// Notification codes (`fuse_out_header.error` of a message with `unique` 0).
pub(crate) mod notify {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const STORE: i32 = 4;
}

/// FUSE over io_uring: the commands of `IORING_OP_URING_CMD` on /dev/fuse.
pub(crate) mod uring {
    /// Gives the kernel an entry (two buffers); it completes when a request is in them.
    pub const CMD_REGISTER: u32 = 1;
    /// Hands back the reply written in an entry and waits for the next request.
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;
    /// `fuse_uring_req_header`: `in_out` (the in or out header), `op_in` (the first
    /// argument), then `fuse_uring_ent_in_out`.
    pub const IN_OUT: usize = 0;
    pub const OP_IN: usize = 128;
    pub const ENT_IN_OUT: usize = 256;
    /// Within `fuse_uring_ent_in_out`: `flags` u64, `commit_id` u64, `payload_sz` u32.
    pub const COMMIT_ID: usize = ENT_IN_OUT + 8;
    pub const PAYLOAD_SZ: usize = ENT_IN_OUT + 16;
    pub const HEADER_SIZE: usize = ENT_IN_OUT + 32;
}

/// Bounds-checked reads of a request's arguments: `arg`, the first argument's
/// structure, and `rest`, what follows it (names, written data).
pub(crate) struct Args<'a> {
    pub arg: &'a [u8],
    pub rest: &'a [u8],
}

/// A request shorter than its opcode's structure, or a name without its NUL.
#[derive(Debug)]
pub(crate) struct Malformed;

impl<'a> Args<'a> {
    pub fn u32(&self, at: usize) -> Result<u32, Malformed> {
        let b = self.arg.get(at..at + 4).ok_or(Malformed)?;
        Ok(u32::from_ne_bytes(b.try_into().map_err(|_| Malformed)?))
    }

    pub fn u64(&self, at: usize) -> Result<u64, Malformed> {
        let b = self.arg.get(at..at + 8).ok_or(Malformed)?;
        Ok(u64::from_ne_bytes(b.try_into().map_err(|_| Malformed)?))
    }

    /// The `n`th NUL-terminated name in `rest` (0 first).
    pub fn name(&self, n: usize) -> Result<&'a [u8], Malformed> {
        self.rest.split_inclusive(|&b| b == 0).nth(n).and_then(|name| name.strip_suffix(&[0])).ok_or(Malformed)
    }
}

/// Appends native-endian integers to a reply.
pub(crate) trait Put {
    fn u16(&mut self, v: u16);
    fn u32(&mut self, v: u32);
    fn u64(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_ne_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_ne_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_ne_bytes());
    }
}

/// `fuse_out_header`.
pub(crate) fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// `fuse_in_header`, read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Result<InHeader, Malformed> {
        let a = Args { arg: b.get(..IN_HEADER).ok_or(Malformed)?, rest: &[] };
        Ok(InHeader {
            len: a.u32(0)?,
            opcode: a.u32(4)?,
            unique: a.u64(8)?,
            nodeid: a.u64(16)?,
            uid: a.u32(24)?,
            gid: a.u32(28)?,
            pid: a.u32(32)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_need_their_nul() {
        let a = Args { arg: &[], rest: b"old\0new\0" };
        assert_eq!(a.name(0).unwrap(), b"old");
        assert_eq!(a.name(1).unwrap(), b"new");
        assert!(a.name(2).is_err());
        let a = Args { arg: &[], rest: b"unterminated" };
        assert!(a.name(0).is_err());
        let a = Args { arg: &[1, 2, 3], rest: &[] };
        assert!(a.u32(0).is_err());
        assert!(a.u64(0).is_err());
    }

    #[test]
    fn a_short_header_is_malformed() {
        assert!(InHeader::parse(&[0u8; IN_HEADER - 1]).is_err());
        let mut b = [0u8; IN_HEADER];
        b[4..8].copy_from_slice(&op::LOOKUP.to_ne_bytes());
        assert_eq!(InHeader::parse(&b).unwrap().opcode, op::LOOKUP);
    }
}
