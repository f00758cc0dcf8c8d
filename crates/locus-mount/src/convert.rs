//! Conversions between the kernel's words (FUSE attributes, `open(2)` flags, times,
//! errno) and the drivers' (Locus attributes and open flags).

use locus_drivers::Attr;
use locus_drivers::DriverError;
use locus_drivers::SetTime;
use locus_drivers::Time;
use locus_fuse::FileAttr;
use locus_fuse::FileType;
use locus_fuse::TimeOrNow;
use locus_proto::types::open_flags;
use locus_proto::types::{S_IFDIR, S_IFLNK, S_IFMT};
use std::time::Duration;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

pub(crate) fn errno(e: DriverError) -> i32 {
    if e.class != locus_drivers::ErrorClass::Answer {
        tracing::warn!("{e}");
    }
    e.errno
}

pub(crate) fn system_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
    }
}

pub(crate) fn set_time(t: Option<TimeOrNow>) -> SetTime {
    match t {
        None => SetTime::Omit,
        Some(TimeOrNow::Now) => SetTime::Now,
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            SetTime::At(Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() })
        }
    }
}

pub(crate) fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    let kind = match a.mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        0o020000 => FileType::CharDevice,
        0o060000 => FileType::BlockDevice,
        0o010000 => FileType::NamedPipe,
        0o140000 => FileType::Socket,
        _ => FileType::RegularFile,
    };
    FileAttr {
        ino,
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        kind,
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink as u32,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// `open(2)` flags as Locus open flags.
pub(crate) fn locus_flags(flags: i32) -> u32 {
    let mut f = match flags & libc::O_ACCMODE {
        libc::O_WRONLY => open_flags::WRITE,
        libc::O_RDWR => open_flags::READ | open_flags::WRITE,
        _ => open_flags::READ,
    };
    for (posix, locus) in [
        (libc::O_APPEND, open_flags::APPEND),
        (libc::O_CREAT, open_flags::CREATE),
        (libc::O_EXCL, open_flags::EXCLUSIVE),
        (libc::O_TRUNC, open_flags::TRUNCATE),
        (libc::O_DIRECTORY, open_flags::DIRECTORY),
        (libc::O_NOFOLLOW, open_flags::NOFOLLOW),
    ] {
        if flags & posix != 0 {
            f |= locus;
        }
    }
    f
}

/// `FOPEN_NOFLUSH` (FUSE ABI 7.35, honoured by kernels since 5.16): the kernel sends no
/// `flush` when a descriptor of this handle is closed.
pub(crate) const FOPEN_NOFLUSH: u32 = 1 << 5;

/// True for a path whose name may invoke an active-file handler: its attributes are not
/// cached and it is read without the page cache, since it may still be growing.
pub(crate) fn is_active(path: &str) -> bool {
    locus_proto::active::may_invoke(path.rsplit('/').next().unwrap_or(path))
}
