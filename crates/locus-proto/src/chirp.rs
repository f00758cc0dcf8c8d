//! The text of the Chirp protocol (CCTools' `chirp_server` and `chirp` client): command
//! lines, result codes, stat lines and ACL rights. Locus' Chirp endpoint (in the server)
//! and its Chirp driver (a client) both use these, so they agree by construction.
//!
//! A Chirp command is one line of words separated by spaces; paths are percent-encoded
//! where a byte would break the line. Every command is answered by a line holding a
//! result: a count or zero, or a negative code (an error, see [`code_of_errno`]). Some
//! results are followed by a stat line, listing lines or raw bytes.

use crate::types::{open_flags, Attr, Rights, StatFs, Time};

/// Longest line either side accepts (a command, a result, a stat line, a name in a
/// listing). Longer input is a broken peer.
pub const MAX_LINE: usize = 64 * 1024;

/// Chirp's result codes, from CCTools' `chirp_protocol.h`.
pub mod code {
    pub const NOT_AUTHENTICATED: i64 = -1;
    pub const NOT_AUTHORIZED: i64 = -2;
    pub const DOESNT_EXIST: i64 = -3;
    pub const ALREADY_EXISTS: i64 = -4;
    pub const TOO_BIG: i64 = -5;
    pub const NO_SPACE: i64 = -6;
    pub const NO_MEMORY: i64 = -7;
    pub const INVALID_REQUEST: i64 = -8;
    pub const TOO_MANY_OPEN: i64 = -9;
    pub const BUSY: i64 = -10;
    pub const TRY_AGAIN: i64 = -11;
    pub const BAD_FD: i64 = -12;
    pub const IS_DIR: i64 = -13;
    pub const NOT_DIR: i64 = -14;
    pub const NOT_EMPTY: i64 = -15;
    pub const CROSS_DEVICE_LINK: i64 = -16;
    pub const OFFLINE: i64 = -17;
    pub const TIMED_OUT: i64 = -18;
    pub const DISCONNECTED: i64 = -19;
    pub const NO_SUCH_PROCESS: i64 = -21;
    pub const IS_A_PIPE: i64 = -22;
    pub const NOT_SUPPORTED: i64 = -23;
    pub const NAME_TOO_LONG: i64 = -24;
    pub const UNKNOWN: i64 = -127;
}

/// (errno, Chirp code) pairs; the first pair for a code gives its errno.
const ERRNO_CODES: [(i32, i64); 25] = [
    (13, code::NOT_AUTHORIZED), // EACCES
    (1, code::NOT_AUTHORIZED),  // EPERM
    (30, code::NOT_AUTHORIZED), // EROFS
    (2, code::DOESNT_EXIST),
    (17, code::ALREADY_EXISTS),
    (27, code::TOO_BIG),
    (28, code::NO_SPACE),
    (122, code::NO_SPACE), // EDQUOT
    (12, code::NO_MEMORY),
    (22, code::INVALID_REQUEST),
    (38, code::INVALID_REQUEST), // ENOSYS
    (24, code::TOO_MANY_OPEN),   // EMFILE
    (23, code::TOO_MANY_OPEN),   // ENFILE
    (16, code::BUSY),
    (11, code::TRY_AGAIN),
    (9, code::BAD_FD),
    (21, code::IS_DIR),
    (20, code::NOT_DIR),
    (39, code::NOT_EMPTY),
    (18, code::CROSS_DEVICE_LINK),
    (110, code::TIMED_OUT),
    (3, code::NO_SUCH_PROCESS),
    (29, code::IS_A_PIPE), // ESPIPE
    (95, code::NOT_SUPPORTED),
    (36, code::NAME_TOO_LONG),
];

/// The Chirp result code for an errno (`UNKNOWN` for one Chirp has no code for).
pub fn code_of_errno(errno: i32) -> i64 {
    ERRNO_CODES.iter().find(|(e, _)| *e == errno).map_or(code::UNKNOWN, |(_, c)| *c)
}

/// The errno for a negative Chirp result code; `None` for the codes that say the
/// server or connection is gone (`OFFLINE`, `DISCONNECTED`), which are not errors of
/// the call, and EIO for codes without an errno.
pub fn errno_of_code(code: i64) -> Option<i32> {
    match code {
        code::OFFLINE | code::DISCONNECTED => None,
        code::NOT_AUTHENTICATED => Some(13),
        c => Some(ERRNO_CODES.iter().find(|(_, k)| *k == c).map_or(5, |(e, _)| *e)),
    }
}

/// A stat line: dev ino mode nlink uid gid rdev size blksize blocks atime mtime ctime.
pub fn stat_line(a: &Attr) -> String {
    format!(
        "{} {} {} {} {} {} {} {} {} {} {} {} {}",
        a.dev as i64,
        a.ino as i64,
        a.mode,
        a.nlink,
        a.uid,
        a.gid,
        a.rdev,
        a.size,
        a.blksize,
        a.blocks,
        a.atime.sec,
        a.mtime.sec,
        a.ctime.sec
    )
}

/// Parses a stat line; `None` when it has fewer than 13 numbers.
pub fn parse_stat_line(line: &str) -> Option<Attr> {
    let f: Vec<i64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    if f.len() < 13 {
        return None;
    }
    let t = |s: i64| Time { sec: s, nsec: 0 };
    Some(Attr {
        dev: f[0] as u64,
        ino: f[1] as u64,
        mode: f[2] as u32,
        nlink: f[3] as u64,
        uid: f[4] as u32,
        gid: f[5] as u32,
        rdev: f[6] as u64,
        size: f[7] as u64,
        blksize: f[8] as u32,
        blocks: f[9] as u64,
        atime: t(f[10]),
        mtime: t(f[11]),
        ctime: t(f[12]),
    })
}

/// A statfs line: type bsize blocks bfree bavail files ffree (Locus reports type 0).
pub fn statfs_line(s: &StatFs) -> String {
    format!("0 {} {} {} {} {} {}", s.bsize, s.blocks, s.bfree, s.bavail, s.files, s.ffree)
}

/// Parses a statfs line; `None` when it has fewer than 7 numbers.
pub fn parse_statfs_line(line: &str) -> Option<StatFs> {
    let f: Vec<u64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    (f.len() >= 7).then(|| StatFs {
        bsize: f[1],
        frsize: f[1],
        blocks: f[2],
        bfree: f[3],
        bavail: f[4],
        files: f[5],
        ffree: f[6],
        namemax: 255,
    })
}

/// Percent-encodes what would break a command line (spaces, controls, `%`, non-ASCII).
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Chirp's ACL letters as Locus rights. Chirp's `p` (put: create but not overwrite)
/// and `v(...)` (reserve a directory) have no Locus equivalent: `p` is accepted only
/// beside `w`, which includes it, and `v` is refused rather than widened or dropped.
pub fn rights_of_text(text: &str) -> Result<Rights, String> {
    if text.contains('v') || (text.contains('p') && !text.contains('w')) {
        return Err(format!("{text}: Locus has no 'p' (without 'w') or 'v' right"));
    }
    Rights::parse(&text.replace('p', ""))
}

/// A command line sent by a Chirp client, with its paths decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Whoami {
        max: u64,
    },
    Stat {
        path: String,
    },
    Lstat {
        path: String,
    },
    Fstat {
        fd: u64,
    },
    /// `flags` are Locus [`open_flags`], from Chirp's letters.
    Open {
        path: String,
        flags: u32,
        mode: u32,
    },
    Close {
        fd: u64,
    },
    Pread {
        fd: u64,
        len: u64,
        offset: u64,
    },
    /// `len` bytes of data follow the line.
    Pwrite {
        fd: u64,
        len: u64,
        offset: u64,
    },
    Fsync {
        fd: u64,
    },
    Ftruncate {
        fd: u64,
        size: u64,
    },
    Fstatfs {
        fd: u64,
    },
    Getfile {
        path: String,
    },
    /// `len` bytes of data follow once the server has answered 0.
    Putfile {
        path: String,
        mode: u32,
        len: u64,
    },
    Getdir {
        path: String,
    },
    Getlongdir {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Unlink {
        path: String,
    },
    /// Removes a file or a whole tree.
    Rmall {
        path: String,
    },
    Rename {
        from: String,
        to: String,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    Readlink {
        path: String,
        max: u64,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    /// `chown`/`lchown`: Chirp servers accept and ignore owners (they check `w`).
    Chown {
        path: String,
    },
    Utime {
        path: String,
        atime: i64,
        mtime: i64,
    },
    Access {
        path: String,
        mode: u32,
    },
    Getacl {
        path: String,
    },
    Setacl {
        path: String,
        subject: String,
        rights: String,
    },
    Statfs {
        path: String,
    },
    /// `hash ALGORITHM PATH`, and the older `md5 PATH`.
    Hash {
        algorithm: String,
        path: String,
    },
}

/// Why a command line could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// A command this side does not know (Chirp answers `INVALID_REQUEST`).
    Unknown(String),
    /// A known command with missing, extra or malformed words.
    Malformed(String),
}

/// Parses one command line (without its newline).
pub fn parse_command(line: &str) -> Result<Command, ParseError> {
    let mut words = line.split(' ').filter(|w| !w.is_empty());
    let name = words.next().unwrap_or_default();
    let args: Vec<&str> = words.collect();
    let bad = || ParseError::Malformed(format!("{name}: bad arguments"));
    let want = |n: usize| if args.len() == n { Ok(()) } else { Err(bad()) };
    let path = |i: usize| decode_path(args[i]).ok_or_else(bad);
    let num = |i: usize| args[i].parse::<u64>().map_err(|_| bad());
    let int = |i: usize| args[i].parse::<i64>().map_err(|_| bad());
    let mode = |i: usize| args[i].parse::<u32>().map(|m| m & 0o7777).map_err(|_| bad());
    Ok(match name {
        "whoami" => {
            want(1)?;
            Command::Whoami { max: num(0)? }
        }
        "stat" | "lstat" | "getfile" | "getdir" | "getlongdir" | "rmdir" | "unlink" | "rmall" | "getacl" | "statfs"
        | "md5" => {
            want(1)?;
            let path = path(0)?;
            match name {
                "stat" => Command::Stat { path },
                "lstat" => Command::Lstat { path },
                "getfile" => Command::Getfile { path },
                "getdir" => Command::Getdir { path },
                "getlongdir" => Command::Getlongdir { path },
                "rmdir" => Command::Rmdir { path },
                "unlink" => Command::Unlink { path },
                "rmall" => Command::Rmall { path },
                "getacl" => Command::Getacl { path },
                "statfs" => Command::Statfs { path },
                _ => Command::Hash { algorithm: "md5".into(), path },
            }
        }
        "fstat" | "close" | "fsync" | "fstatfs" => {
            want(1)?;
            let fd = num(0)?;
            match name {
                "fstat" => Command::Fstat { fd },
                "close" => Command::Close { fd },
                "fsync" => Command::Fsync { fd },
                _ => Command::Fstatfs { fd },
            }
        }
        "open" => {
            want(3)?;
            Command::Open { path: path(0)?, flags: open_letters(args[1]).ok_or_else(bad)?, mode: mode(2)? }
        }
        "pread" | "pwrite" => {
            want(3)?;
            let (fd, len, offset) = (num(0)?, num(1)?, num(2)?);
            match name {
                "pread" => Command::Pread { fd, len, offset },
                _ => Command::Pwrite { fd, len, offset },
            }
        }
        "ftruncate" => {
            want(2)?;
            Command::Ftruncate { fd: num(0)?, size: num(1)? }
        }
        "putfile" => {
            want(3)?;
            Command::Putfile { path: path(0)?, mode: mode(1)?, len: num(2)? }
        }
        "mkdir" | "chmod" | "access" => {
            want(2)?;
            let (path, mode) = (path(0)?, mode(1)?);
            match name {
                "mkdir" => Command::Mkdir { path, mode },
                "chmod" => Command::Chmod { path, mode },
                _ => Command::Access { path, mode },
            }
        }
        "rename" | "link" | "symlink" => {
            want(2)?;
            let (a, b) = (path(0)?, path(1)?);
            match name {
                "rename" => Command::Rename { from: a, to: b },
                "link" => Command::Link { from: a, to: b },
                _ => Command::Symlink { target: a, path: b },
            }
        }
        "readlink" | "truncate" => {
            want(2)?;
            let (path, n) = (path(0)?, num(1)?);
            match name {
                "readlink" => Command::Readlink { path, max: n },
                _ => Command::Truncate { path, size: n },
            }
        }
        "chown" | "lchown" => {
            want(3)?;
            int(1)?;
            int(2)?;
            Command::Chown { path: path(0)? }
        }
        "utime" => {
            want(3)?;
            Command::Utime { path: path(0)?, atime: int(1)?, mtime: int(2)? }
        }
        "setacl" => {
            want(3)?;
            Command::Setacl { path: path(0)?, subject: args[1].to_string(), rights: args[2].to_string() }
        }
        "hash" => {
            want(2)?;
            Command::Hash { algorithm: args[0].to_string(), path: path(1)? }
        }
        _ => return Err(ParseError::Unknown(name.chars().take(64).collect())),
    })
}

/// Decodes a percent-encoded path; `None` if it is not UTF-8 or holds a NUL.
fn decode_path(word: &str) -> Option<String> {
    let path = percent_encoding::percent_decode_str(word).decode_utf8().ok()?;
    (!path.contains('\0')).then(|| path.into_owned())
}

/// Chirp's open letters (`r`, `w`, `a`, `t`, `c`, `x`, `s`) as Locus open flags.
fn open_letters(letters: &str) -> Option<u32> {
    let mut flags = 0;
    for l in letters.chars() {
        flags |= match l {
            'r' => open_flags::READ,
            'w' => open_flags::WRITE,
            'a' => open_flags::APPEND,
            't' => open_flags::TRUNCATE,
            'c' => open_flags::CREATE,
            'x' => open_flags::EXCLUSIVE,
            's' => 0, // synchronous writes: every Locus write reaches the file at once
            _ => return None,
        };
    }
    Some(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_with_decoded_paths() {
        assert_eq!(
            parse_command("open /a%20b.txt rwc 420"),
            Ok(Command::Open {
                path: "/a b.txt".into(),
                flags: open_flags::READ | open_flags::WRITE | open_flags::CREATE,
                mode: 0o644
            })
        );
        assert_eq!(parse_command("pread 3 100 0"), Ok(Command::Pread { fd: 3, len: 100, offset: 0 }));
        assert_eq!(parse_command("hash md5 /x"), Ok(Command::Hash { algorithm: "md5".into(), path: "/x".into() }));
        assert_eq!(parse_command("md5 /x"), Ok(Command::Hash { algorithm: "md5".into(), path: "/x".into() }));
        assert!(matches!(parse_command("pread 3 -1 0"), Err(ParseError::Malformed(_))));
        assert!(matches!(parse_command("stat"), Err(ParseError::Malformed(_))));
        assert!(matches!(parse_command("stat /a /b"), Err(ParseError::Malformed(_))));
        assert!(matches!(parse_command("open /a q 0"), Err(ParseError::Malformed(_))));
        assert!(matches!(parse_command("stat /a%00b"), Err(ParseError::Malformed(_))));
        assert!(matches!(parse_command("frobnicate /"), Err(ParseError::Unknown(_))));
    }

    #[test]
    fn errno_and_codes_round_trip() {
        for errno in [2, 13, 17, 20, 21, 22, 39, 9, 36] {
            assert_eq!(errno_of_code(code_of_errno(errno)), Some(errno));
        }
        assert_eq!(code_of_errno(1), code::NOT_AUTHORIZED);
        assert_eq!(code_of_errno(12345), code::UNKNOWN);
        assert_eq!(errno_of_code(code::UNKNOWN), Some(5));
        assert_eq!(errno_of_code(code::DISCONNECTED), None);
    }

    #[test]
    fn stat_lines_round_trip() {
        let t = |sec| Time { sec, nsec: 0 };
        let a = Attr {
            dev: 1,
            ino: 2,
            mode: 0o100644,
            nlink: 1,
            uid: 3,
            gid: 4,
            rdev: 0,
            size: 5,
            blksize: 4096,
            blocks: 8,
            atime: t(10),
            mtime: t(11),
            ctime: t(12),
        };
        assert_eq!(parse_stat_line(&stat_line(&a)), Some(a));
        assert_eq!(parse_stat_line("1 2 3"), None);
    }

    #[test]
    fn rights_map_without_widening() {
        assert_eq!(rights_of_text("rwldpa").unwrap(), Rights::parse("rwlda").unwrap());
        assert!(rights_of_text("rlp").is_err());
        assert!(rights_of_text("v(rwl)").is_err());
        assert!(rights_of_text("rq").is_err());
    }
}
