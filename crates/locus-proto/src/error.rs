//! Wire error codes and the error body of an error frame.
//!
//! Codes below 1000 are Linux errno values, so a POSIX error crosses the wire unchanged
//! and a client maps it back with [`Code::errno`]. Codes from 1000 up are Locus' own
//! conditions, each mapped to the closest errno for programs that only know errno.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A stable wire error code: an errno value (< 1000) or a Locus condition (>= 1000).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Code(pub u32);

impl Code {
    pub const PERM: Code = Code(1);
    pub const NOENT: Code = Code(2);
    pub const IO: Code = Code(5);
    pub const BADF: Code = Code(9);
    pub const AGAIN: Code = Code(11);
    pub const NOMEM: Code = Code(12);
    pub const ACCES: Code = Code(13);
    pub const BUSY: Code = Code(16);
    pub const EXIST: Code = Code(17);
    pub const XDEV: Code = Code(18);
    pub const NOTDIR: Code = Code(20);
    pub const ISDIR: Code = Code(21);
    pub const INVAL: Code = Code(22);
    pub const FBIG: Code = Code(27);
    pub const NOSPC: Code = Code(28);
    pub const ROFS: Code = Code(30);
    pub const NAMETOOLONG: Code = Code(36);
    pub const NOSYS: Code = Code(38);
    pub const NOTEMPTY: Code = Code(39);
    pub const LOOP: Code = Code(40);
    pub const PROTO: Code = Code(71);
    pub const NOTSUP: Code = Code(95);
    pub const TIMEDOUT: Code = Code(110);
    pub const CANCELED: Code = Code(125);

    /// The frame or its metadata could not be decoded.
    pub const BAD_REQUEST: Code = Code(1000);
    /// The challenge-response failed: unknown subject or wrong token.
    pub const AUTH_FAILED: Code = Code(1001);
    /// An operation other than the handshake was sent before authenticating.
    pub const NOT_AUTHENTICATED: Code = Code(1002);
    /// The operation code is not in this server's operation table.
    pub const UNKNOWN_OP: Code = Code(1003);
    /// A frame, argument or result exceeds a configured size limit.
    pub const TOO_LARGE: Code = Code(1004);
    /// A resource limit (instructions, memory, time, output, I/O, a budget) ended the call.
    pub const LIMIT: Code = Code(1005);
    /// The server is shutting down or the connection is closing.
    pub const SHUTDOWN: Code = Code(1006);
    /// No script is registered under this id (or it was evicted): register it again.
    pub const NO_SCRIPT: Code = Code(1007);
    /// A script failed to compile or raised an error.
    pub const SCRIPT_ERROR: Code = Code(1008);

    /// The errno a POSIX program should see for this code.
    pub fn errno(self) -> i32 {
        match self {
            Code::BAD_REQUEST => Code::INVAL.0 as i32,
            Code::AUTH_FAILED | Code::NOT_AUTHENTICATED => Code::ACCES.0 as i32,
            Code::UNKNOWN_OP => Code::NOSYS.0 as i32,
            Code::TOO_LARGE => 7,  // E2BIG
            Code::LIMIT => 122,    // EDQUOT: a quota of some resource was exceeded
            Code::SHUTDOWN => 108, // ESHUTDOWN
            Code::NO_SCRIPT => Code::NOENT.0 as i32,
            Code::SCRIPT_ERROR => Code::IO.0 as i32,
            Code(c) if c < 1000 => c as i32,
            _ => Code::IO.0 as i32,
        }
    }

    /// A code from an errno value reported by the operating system.
    pub fn from_errno(errno: i32) -> Code {
        if errno > 0 && errno < 1000 {
            Code(errno as u32)
        } else {
            Code::IO
        }
    }

    /// A short symbolic name, for messages and logs.
    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "EPERM",
            2 => "ENOENT",
            5 => "EIO",
            7 => "E2BIG",
            9 => "EBADF",
            11 => "EAGAIN",
            12 => "ENOMEM",
            13 => "EACCES",
            16 => "EBUSY",
            17 => "EEXIST",
            18 => "EXDEV",
            20 => "ENOTDIR",
            21 => "EISDIR",
            22 => "EINVAL",
            27 => "EFBIG",
            28 => "ENOSPC",
            30 => "EROFS",
            31 => "EMLINK",
            36 => "ENAMETOOLONG",
            38 => "ENOSYS",
            39 => "ENOTEMPTY",
            40 => "ELOOP",
            61 => "ENODATA",
            71 => "EPROTO",
            95 => "ENOTSUP",
            110 => "ETIMEDOUT",
            125 => "ECANCELED",
            1000 => "BAD_REQUEST",
            1001 => "AUTH_FAILED",
            1002 => "NOT_AUTHENTICATED",
            1003 => "UNKNOWN_OP",
            1004 => "TOO_LARGE",
            1005 => "LIMIT",
            1006 => "SHUTDOWN",
            1007 => "NO_SCRIPT",
            1008 => "SCRIPT_ERROR",
            _ => "ERROR",
        }
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The body of an error frame: a code and a message meant for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} ({code})")]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    /// An error with a code and a message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error { code, message: message.into() }
    }

    /// An I/O error as a wire error with its errno, saying what failed.
    pub fn io(what: &str, e: std::io::Error) -> Self {
        // An error without an errno is EIO (5).
        Error::new(Code::from_errno(e.raw_os_error().unwrap_or(5)), format!("{what}: {e}"))
    }
}
