//! One request, read from its arguments and handed to the file system's method.

use crate::abi::{self, fattr, op, Args, InHeader, Malformed};
use crate::reply::*;
use crate::{Filesystem, Request, SetAttr, TimeOrNow};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// Whether the kernel waits for an answer to a request.
pub(crate) fn wants_reply(opcode: u32) -> bool {
    !matches!(opcode, op::FORGET | op::BATCH_FORGET)
}

/// How a request came: by a read of /dev/fuse, or in an entry of a queue's ring.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Via {
    Read,
    Ring(u16),
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Via::Read => f.write_str("read"),
            Via::Ring(qid) => write!(f, "ring {qid}"),
        }
    }
}

/// Whether a request from `uid` is served when the session belongs to `owner`: its
/// owner's are; anyone else's only where the kernel may send them on its own or for a
/// descriptor the owner handed over (reads, writes, syncs, releases, forgets).
fn allowed(h: &InHeader, owner: u32) -> bool {
    h.uid == owner
        || matches!(
            h.opcode,
            op::READ
                | op::READDIR
                | op::WRITE
                | op::FSYNC
                | op::FSYNCDIR
                | op::RELEASE
                | op::RELEASEDIR
                | op::FORGET
                | op::BATCH_FORGET
                | op::INTERRUPT
        )
}

/// Serves the request `h` with arguments `a`, leaving the answer in `out` (untouched for
/// requests without one). INIT and DESTROY are the session's; requests of users other
/// than `owner` are refused with `EACCES` (see [`allowed`]).
pub(crate) fn dispatch<F: Filesystem>(
    fs: &mut F,
    h: &InHeader,
    a: &Args<'_>,
    out: &mut Outgoing,
    via: Via,
    owner: u32,
) {
    out.reset();
    tracing::debug!(target: "locus_fuse::request", "{} #{} node {} ({via})", abi::op_name(h.opcode), h.unique, h.nodeid);
    if !allowed(h, owner) {
        return ReplyEmpty { out }.error(libc::EACCES);
    }
    if let Err(Malformed) = serve(fs, h, a, out) {
        tracing::warn!("malformed {} request ({} bytes)", abi::op_name(h.opcode), h.len);
        ReplyEmpty { out }.error(libc::EINVAL);
    }
}

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

fn set_time(valid: u32, given: u32, now: u32, secs: u64, nsecs: u32) -> Option<TimeOrNow> {
    if valid & now != 0 {
        Some(TimeOrNow::Now)
    } else if valid & given != 0 {
        let t = secs as i64;
        let at = if t >= 0 {
            UNIX_EPOCH + Duration::new(t as u64, nsecs.min(999_999_999))
        } else {
            UNIX_EPOCH - Duration::from_secs(t.unsigned_abs()) + Duration::from_nanos(u64::from(nsecs.min(999_999_999)))
        };
        Some(TimeOrNow::SpecificTime(at))
    } else {
        None
    }
}

fn serve<F: Filesystem>(fs: &mut F, h: &InHeader, a: &Args<'_>, out: &mut Outgoing) -> Result<(), Malformed> {
    let req = Request { header: h };
    let req = &req;
    let ino = h.nodeid;
    match h.opcode {
        op::LOOKUP => fs.lookup(req, ino, os(a.name(0)?), ReplyEntry { out }),
        op::FORGET => fs.forget(req, ino, a.u64(0)?),
        op::BATCH_FORGET => {
            let count = a.u32(0)? as usize;
            let each = a.rest.chunks_exact(16).take(count);
            for one in each {
                let node = u64::from_ne_bytes(one[0..8].try_into().map_err(|_| Malformed)?);
                let nlookup = u64::from_ne_bytes(one[8..16].try_into().map_err(|_| Malformed)?);
                fs.forget(req, node, nlookup);
            }
        }
        op::GETATTR => {
            let fh = (a.u32(0)? & abi::GETATTR_FH != 0).then_some(a.u64(8)?);
            fs.getattr(req, ino, fh, ReplyAttr { out })
        }
        op::SETATTR => {
            let valid = a.u32(0)?;
            let is = |bit: u32| valid & bit != 0;
            let set = SetAttr {
                fh: is(fattr::FH).then_some(a.u64(8)?),
                size: is(fattr::SIZE).then_some(a.u64(16)?),
                atime: set_time(valid, fattr::ATIME, fattr::ATIME_NOW, a.u64(32)?, a.u32(56)?),
                mtime: set_time(valid, fattr::MTIME, fattr::MTIME_NOW, a.u64(40)?, a.u32(60)?),
                mode: is(fattr::MODE).then_some(a.u32(68)?),
                uid: is(fattr::UID).then_some(a.u32(76)?),
                gid: is(fattr::GID).then_some(a.u32(80)?),
            };
            fs.setattr(req, ino, set, ReplyAttr { out })
        }
        op::READLINK => fs.readlink(req, ino, ReplyData { out }),
        op::SYMLINK => {
            let name = os(a.name(0)?);
            let target = Path::new(os(a.name(1)?));
            fs.symlink(req, ino, name, target, ReplyEntry { out })
        }
        op::MKDIR => fs.mkdir(req, ino, os(a.name(0)?), a.u32(0)?, a.u32(4)?, ReplyEntry { out }),
        op::UNLINK => fs.unlink(req, ino, os(a.name(0)?), ReplyEmpty { out }),
        op::RMDIR => fs.rmdir(req, ino, os(a.name(0)?), ReplyEmpty { out }),
        op::RENAME | op::RENAME2 => {
            let flags = if h.opcode == op::RENAME2 { a.u32(8)? } else { 0 };
            fs.rename(req, ino, os(a.name(0)?), a.u64(0)?, os(a.name(1)?), flags, ReplyEmpty { out })
        }
        op::LINK => fs.link(req, a.u64(0)?, ino, os(a.name(0)?), ReplyEntry { out }),
        op::OPEN => fs.open(req, ino, a.u32(0)? as i32, ReplyOpen { out }),
        op::CREATE => {
            let (flags, mode, umask) = (a.u32(0)? as i32, a.u32(4)?, a.u32(8)?);
            fs.create(req, ino, os(a.name(0)?), mode, umask, flags, ReplyCreate { out })
        }
        op::READ => {
            let lock_owner = (a.u32(20)? & abi::READ_LOCKOWNER != 0).then_some(a.u64(24)?);
            let (fh, offset, size, flags) = (a.u64(0)?, a.u64(8)? as i64, a.u32(16)?, a.u32(32)? as i32);
            fs.read(req, ino, fh, offset, size, flags, lock_owner, ReplyData { out })
        }
        op::WRITE => {
            let (fh, offset, size, write_flags) = (a.u64(0)?, a.u64(8)? as i64, a.u32(16)? as usize, a.u32(20)?);
            let lock_owner = (write_flags & abi::WRITE_LOCKOWNER != 0).then_some(a.u64(24)?);
            let data = a.rest.get(..size).ok_or(Malformed)?;
            fs.write(req, ino, fh, offset, data, write_flags, a.u32(32)? as i32, lock_owner, ReplyWrite { out })
        }
        op::FLUSH => fs.flush(req, ino, a.u64(0)?, a.u64(16)?, ReplyEmpty { out }),
        op::RELEASE => {
            let (fh, flags, release_flags) = (a.u64(0)?, a.u32(8)? as i32, a.u32(12)?);
            let lock_owner = Some(a.u64(16)?).filter(|&o| o != 0);
            fs.release(req, ino, fh, flags, lock_owner, release_flags & abi::RELEASE_FLUSH != 0, ReplyEmpty { out })
        }
        op::FSYNC => fs.fsync(req, ino, a.u64(0)?, a.u32(8)? & abi::FSYNC_FDATASYNC != 0, ReplyEmpty { out }),
        op::OPENDIR => fs.opendir(req, ino, a.u32(0)? as i32, ReplyOpen { out }),
        op::READDIR => {
            let (fh, offset, size) = (a.u64(0)?, a.u64(8)? as i64, a.u32(16)? as usize);
            fs.readdir(req, ino, fh, offset, ReplyDirectory { out, size })
        }
        op::RELEASEDIR => ReplyEmpty { out }.ok(),
        op::FSYNCDIR => fs.fsyncdir(req, ino, a.u64(0)?, a.u32(8)? & abi::FSYNC_FDATASYNC != 0, ReplyEmpty { out }),
        op::STATFS => fs.statfs(req, ino, ReplyStatfs { out }),
        op::GETXATTR => fs.getxattr(req, ino, os(a.name(0)?), a.u32(0)?, ReplyXattr { out }),
        op::LISTXATTR => fs.listxattr(req, ino, a.u32(0)?, ReplyXattr { out }),
        op::ACCESS => fs.access(req, ino, a.u32(0)? as i32, ReplyEmpty { out }),
        op::IOCTL => ReplyEmpty { out }.error(libc::ENOTTY),
        // Answered with ENOSYS, the kernel stops sending them.
        op::INTERRUPT => ReplyEmpty { out }.error(libc::ENOSYS),
        _ => ReplyEmpty { out }.error(libc::ENOSYS),
    }
    Ok(())
}

/// A time a file system set, as SETATTR read it (for tests).
#[cfg(test)]
fn at(t: Option<TimeOrNow>) -> Option<std::time::SystemTime> {
    match t {
        Some(TimeOrNow::SpecificTime(t)) => Some(t),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setattr_times_are_read_as_given_or_now() {
        assert_eq!(
            set_time(fattr::ATIME, fattr::ATIME, fattr::ATIME_NOW, 5, 6),
            Some(TimeOrNow::SpecificTime(UNIX_EPOCH + Duration::new(5, 6)))
        );
        assert_eq!(
            set_time(fattr::ATIME | fattr::ATIME_NOW, fattr::ATIME, fattr::ATIME_NOW, 5, 6),
            Some(TimeOrNow::Now)
        );
        assert_eq!(set_time(0, fattr::ATIME, fattr::ATIME_NOW, 5, 6), None);
        let before = at(set_time(fattr::MTIME, fattr::MTIME, fattr::MTIME_NOW, (-2i64) as u64, 500_000_000));
        assert_eq!(before, Some(UNIX_EPOCH - Duration::from_millis(1500)));
    }
}
