//! The Locus wire protocol, and nothing else: no I/O happens here.
//!
//! Everything that knows wire bytes lives in this crate so that the server, the client,
//! the fuzzers and the script bindings agree by construction.
//!
//! - [`ops`]: the operation table, the single source of truth for every request type,
//!   its code, its reply type and its documentation.
//! - [`frame`]: the 16-byte frame header, the handshake preamble and the size limits.
//! - [`types`]: attribute, directory-entry, ACL and statistics records carried in frames.
//! - [`error`]: wire error codes (POSIX errno values plus Locus' own) and the error body.
//! - [`auth`]: the HMAC challenge-response that proves a token without sending it.
//! - [`active`]: the file names that invoke active-file handlers.
//! - [`capability`]: the signed, expiring capabilities of third-party reads in a cluster.
//! - [`codec`]: encoding and decoding of frame metadata.
//! - [`chirp`]: the text of the Chirp protocol, which the server also speaks and a driver
//!   reaches.

pub mod active;
pub mod auth;
pub mod capability;
pub mod chirp;
pub mod codec;
pub mod error;
pub mod frame;
pub mod fuzz;
pub mod ops;
pub mod path;
pub mod types;

pub use error::{Code, Error};
pub use frame::{Header, Kind, Limits, HEADER_LEN};
pub use ops::{OpInfo, Operation, Shape, OPERATIONS};
pub use types::Rights;
