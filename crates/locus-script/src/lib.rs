//! Scripts: small Lua programs that clients send to run at the server, next to the
//! data, combining dependent operations into one round trip (Scriptable RPC).
//!
//! - [`Engine`]: registered sources by SHA-256 id in a bounded cache, and a pool of
//!   interpreter threads that run calls in parallel, never on the file service's threads.
//! - [`Host`]: what a script's `fs.*` calls go through; the server implements it with a
//!   session acting as the calling subject, so scripts have exactly the caller's rights.
//! - [`Limits`]: instructions, memory, wall time and result size of one call.
//! - `bindings`: `fs.<op>` for every file operation, generated from the operation table.
//! - `lua_ser`: replies as Lua tables, built in one protected call.
//! - `stdlib`: buffers, named state (global, or attached to a file: [`ObjectStates`]),
//!   locks released when the call ends, messages to clients, time.
//! - [`StateStore`]: where named values and locks are kept: this server's memory
//!   ([`MemoryState`]), or a cluster's database, shared by its heads.
//! - [`ScriptRuns`]: calls running on the pool (cancellable) and the last ones that ended.
//! - [`ScriptError`]: every way a call can fail, mapped to wire codes.

mod bindings;
mod buffer;
mod call;
mod engine;
mod error;
mod lua_ser;
mod pool;
mod runs;
mod state_store;
mod stdlib;
mod value;

pub use call::Limits;
pub use engine::{CallOutcome, CallRequest, Engine, ReplyFn};
pub use error::ScriptError;
pub use runs::{ScriptRunInfo, ScriptRuns};
pub use state_store::{
    Change, MemoryState, Scope, StateStore, MAX_OBJECTS, MAX_OBJECT_KEYS, MAX_STATE_VALUE, MAX_SUBJECT_KEYS,
};
pub use stdlib::ObjectStates;

use locus_proto::Error as WireError;

/// Where a script's file operations and messages go.
pub trait Host: Send + 'static {
    /// Runs one operation of the table as the calling subject; returns the reply's
    /// metadata pages and its data.
    fn call(&mut self, op: u16, meta: &[u8], data: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError>;
    /// Pushes `data` to a connected client; false if it is not connected.
    fn push(&self, client: u64, data: &[u8]) -> bool;
    /// The id of the client that made the call.
    fn caller(&self) -> u64;
    /// The subject the call acts as (whose named `state` it sees).
    fn subject(&self) -> &str;
}

/// The id of a script source: its SHA-256 in hex.
pub fn script_id(source: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(source.as_bytes()))
}
