//! The store's error type, mapped to wire codes (and so to errno) in one place.

use locus_proto::{Code, Error as WireError, Rights};
use rustix::io::Errno;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The operating system refused; the errno is kept.
    #[error("{op} {path}: {}", .errno)]
    Os { op: &'static str, path: String, errno: Errno },
    /// The subject lacks a right that the operation needs.
    #[error("{path}: permission denied (needs '{need}' right)")]
    Denied { path: String, need: Rights },
    /// The path would leave the export root (`..`, an absolute or escaping symlink).
    #[error("{path}: path escapes the export root")]
    Escape { path: String },
    /// The path names a file that Locus keeps for itself (ACLs, uploads in progress).
    #[error("{path}: name is reserved by Locus")]
    Reserved { path: String },
    /// The arguments cannot be satisfied (bad flags, malformed path).
    #[error("{0}")]
    Invalid(String),
    /// The handle is not open (or not open in the needed mode) on this connection.
    #[error("bad handle {0}")]
    BadHandle(u64),
}

impl StoreError {
    /// The wire code for this error.
    pub fn code(&self) -> Code {
        match self {
            StoreError::Os { errno, .. } => Code::from_errno(errno.raw_os_error()),
            StoreError::Denied { .. } | StoreError::Escape { .. } | StoreError::Reserved { .. } => Code::ACCES,
            StoreError::Invalid(_) => Code::INVAL,
            StoreError::BadHandle(_) => Code::BADF,
        }
    }
}

impl From<StoreError> for WireError {
    fn from(e: StoreError) -> Self {
        WireError::new(e.code(), e.to_string())
    }
}

/// Attaches the operation and path to an OS error.
pub(crate) trait OsContext<T> {
    fn ctx(self, op: &'static str, path: &str) -> Result<T, StoreError>;
}

impl<T> OsContext<T> for Result<T, Errno> {
    fn ctx(self, op: &'static str, path: &str) -> Result<T, StoreError> {
        self.map_err(|errno| {
            if errno == Errno::XDEV && op != "rename" && op != "link" {
                // openat2 with RESOLVE_BENEATH reports an escape as EXDEV.
                StoreError::Escape { path: path.to_string() }
            } else {
                StoreError::Os { op, path: path.to_string(), errno }
            }
        })
    }
}

/// Result of a store operation.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
