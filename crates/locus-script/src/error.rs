//! Why a script call failed.

use locus_proto::{Code, Error as WireError};

/// Every way a script call can fail.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ScriptError {
    /// The source does not compile.
    #[error("script does not compile: {0}")]
    Compile(String),
    /// The script raised an error (the message keeps its line number).
    #[error("script error: {0}")]
    Runtime(String),
    /// A resource limit ended the call.
    #[error("script exceeded its {limit} limit ({detail})")]
    Limit { limit: &'static str, detail: String },
    /// No script with this id is registered (or it was evicted); register it again.
    #[error("no script {0} (register it again)")]
    NoScript(String),
    /// Every interpreter is busy and the queue is full.
    #[error("all script workers are busy; try again")]
    Busy,
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
    /// Someone with the right to (its subject, an admin) stopped the call.
    #[error("the script call was cancelled")]
    Cancelled,
    /// The call was lost with its interpreter (a panic, or the server shutting down).
    #[error("the script worker went away")]
    Gone,
}

impl ScriptError {
    /// The wire code.
    pub fn code(&self) -> Code {
        match self {
            ScriptError::Compile(_) | ScriptError::Runtime(_) => Code::SCRIPT_ERROR,
            ScriptError::Limit { .. } => Code::LIMIT,
            ScriptError::NoScript(_) => Code::NO_SCRIPT,
            ScriptError::Busy => Code::AGAIN,
            ScriptError::Invalid(_) => Code::INVAL,
            ScriptError::Cancelled => Code::CANCELED,
            ScriptError::Gone => Code::IO,
        }
    }
}

impl From<ScriptError> for WireError {
    fn from(e: ScriptError) -> Self {
        WireError::new(e.code(), e.to_string())
    }
}
