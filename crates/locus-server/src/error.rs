//! The server crate's error type: what can stop a server from starting or serving.

use locus_store::StoreError;

/// Why the server could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("export: {0}")]
    Store(#[from] StoreError),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("configuration: {0}")]
    Config(String),
}

impl ServerError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ServerError::Io { context: context.into(), source }
    }
}
