//! The client's error type, with the errno a POSIX program should see.

use locus_proto::{Code, Error as WireError};

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{0}")]
    Remote(#[from] WireError),
    /// The connection failed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The connection is closed; the request's fate is unknown.
    #[error("connection closed")]
    Closed,
    /// The server (or a data node) did not answer within a deadline; the request's fate
    /// is unknown, and the connection it was sent on is given up.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// Something other than a Locus server answered at the address: a mistake for a
    /// first connection; a caller that reached a Locus server there before may take it
    /// for the server being away (something else answers while the route to it is gone).
    #[error("connection: {0}")]
    NotLocus(String),
    /// The server said something this client does not understand.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The handshake failed (wrong token, or a server that could not prove it has it).
    #[error("authentication: {0}")]
    Auth(String),
    /// A URL, credential or option is wrong.
    #[error("{0}")]
    Config(String),
}

impl ClientError {
    /// The wire code for this error (for a local failure, the closest code).
    pub fn code(&self) -> Code {
        match self {
            ClientError::Remote(e) => e.code,
            ClientError::Io(_) | ClientError::Closed => Code::IO,
            ClientError::TimedOut(_) => Code::TIMEDOUT,
            ClientError::Protocol(_) | ClientError::NotLocus(_) => Code::PROTO,
            ClientError::Auth(_) => Code::AUTH_FAILED,
            ClientError::Config(_) => Code::INVAL,
        }
    }

    /// The errno a POSIX program should see.
    pub fn errno(&self) -> i32 {
        self.code().errno()
    }

    /// True for failures that a retry on a new connection may cure (the server went away).
    pub fn is_transient(&self) -> bool {
        matches!(self, ClientError::Io(_) | ClientError::Closed | ClientError::TimedOut(_))
    }
}

/// Result of a client call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
