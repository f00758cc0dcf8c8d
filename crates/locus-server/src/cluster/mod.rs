//! A cluster head (`locus serve --head`): the namespace lives in [`locus_cluster::Meta`]
//! (SQLite, or PostgreSQL shared by several heads), file contents on data nodes.
//!
//! - Small files (up to [`HeadConfig::inline_max`]) live in the namespace itself.
//! - Larger ones are objects on data nodes, one immutable object file per version,
//!   written by the head and acknowledged once every replica has synced it and the
//!   namespace has committed the new version.
//! - A read of a file of at least [`HeadConfig::tp_threshold`] bytes is answered with
//!   the nodes that hold its version and a capability: the client reads from them
//!   (SPIRAL's third-party transfer). Anything else the head serves itself.
//! - A version replaced or removed stays on its nodes until every capability for it
//!   has expired ([`Head::collect_garbage`]): a read in flight never sees another one.
//!
//! Writes are whole-file, as in AFS: a handle opened for writing works on a private copy
//! that becomes the file's new version when it is closed (or synced).
//!
//! The wing's rooms: `config` ([`HeadConfig`]), `head` (the head's state: namespace,
//! node pool, keys, garbage collection), `head_keys` (the keys at rest: the wrap key and
//! the sealed ring), `http` (the head's HTTP door), `placement` (where a file's bytes are read from:
//! locations, third-party reads), `writes` (staging a new version and committing it on
//! nodes), `tp_writes` (third-party writes: clients send the bytes to the nodes), `healing` (heartbeats, draining, and copying versions until each has its
//! replicas), `fanout` (a storelet run across nodes, its outputs merged), `changes` (callbacks across heads: changes announced and heard on the engine), `session` (the
//! head's side of the protocol, [`HeadSession`]), `copies` (server-side copies), `links` (symbolic links), `active_files` (active files: handlers run on the node holding their input),
//! `script_state` (scripts' named values and locks, kept in the namespace for every head),
//! `rebalance` (moving versions between nodes by the load their heartbeats report), and for data nodes `node` (joining
//! a head), `objects` (the versions a node keeps, and the views of its runs), `checksums` (their
//! block checksums, checked on every read and by the scrub) and
//! `keys` (sealing the cluster's keys, in transit and at rest). The plain server reaches
//! the wing through [`HeadSession`] (a connection to a head) and the data-node methods
//! of `objects` that its [`crate::Session`] delegates to.
//!
//! The head's rooms (and `head_keys`, `http`) are built only with the crate's `cluster`
//! feature, which brings the namespace engines (SQLite, PostgreSQL); without it a server
//! refuses a [`HeadConfig`] at start and can still be a data node (`node`, `objects`,
//! `checksums`, `keys`, `config` are always built).
//!
//! `head`, `healing`, `placement`, `rebalance`, `tp_writes` and `writes` are one type's methods (`impl Head`) split by
//! concern; they name object versions as the data nodes do (`objects::object_name`), so
//! no import circle runs between them. `session` depends on the others and nothing
//! depends on it but the server's connection loop.

#[cfg(feature = "cluster")]
mod active_files;
#[cfg(feature = "cluster")]
mod changes;
pub mod checksums;
#[cfg(feature = "cluster")]
pub mod cluster_ca;
mod config;
#[cfg(feature = "cluster")]
mod copies;
#[cfg(feature = "cluster")]
mod fanout;
#[cfg(feature = "cluster")]
mod head;
#[cfg(feature = "cluster")]
pub mod head_keys;
#[cfg(feature = "cluster")]
mod healing;
#[cfg(feature = "cluster")]
pub(crate) mod http;
pub mod keys;
#[cfg(feature = "cluster")]
mod links;
#[cfg(feature = "cluster")]
mod messages;
pub mod node;
pub mod objects;
#[cfg(feature = "cluster")]
mod placement;
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) mod plans;
#[cfg(feature = "cluster")]
mod rebalance;
#[cfg(feature = "cluster")]
mod script_state;
#[cfg(feature = "cluster")]
mod session;
#[cfg(feature = "cluster")]
mod tp_writes;
#[cfg(feature = "cluster")]
mod writes;

#[cfg(feature = "cluster")]
use locus_cluster::{Entry, Kind as EntryKind, MetaError};
#[cfg(feature = "cluster")]
use locus_proto::types::*;
#[cfg(feature = "cluster")]
use locus_proto::Error as WireError;

pub use config::{HeadConfig, SHARE_MAX_TTL};
#[cfg(feature = "cluster")]
pub use head::Head;
#[cfg(feature = "cluster")]
pub use script_state::HeadScriptState;
#[cfg(feature = "cluster")]
pub use session::HeadSession;

#[cfg(feature = "cluster")]
fn meta_err(e: MetaError) -> WireError {
    e.into()
}

/// The directory whose ACL governs `path`: itself for a directory, else its parent.
#[cfg(feature = "cluster")]
pub(crate) fn governing(path: &str, is_dir: bool) -> &str {
    if is_dir {
        return path;
    }
    locus_cluster::split(path).map_or("/", |(parent, _)| parent)
}

/// Attributes of a namespace entry, as `stat` gives them.
#[cfg(feature = "cluster")]
pub fn attr_of(e: &Entry) -> Attr {
    let t = Time { sec: e.mtime_ns.div_euclid(1_000_000_000), nsec: e.mtime_ns.rem_euclid(1_000_000_000) as u32 };
    let kind = match e.kind {
        EntryKind::Dir => S_IFDIR,
        EntryKind::Symlink => S_IFLNK,
        EntryKind::File => S_IFREG,
    };
    Attr {
        dev: 0,
        ino: e.object,
        mode: kind | (e.mode & 0o7777),
        nlink: if e.kind == EntryKind::Dir { 2 } else { e.links.max(1) },
        uid: 0,
        gid: 0,
        rdev: 0,
        size: e.size,
        blksize: 1 << 20,
        blocks: e.size.div_ceil(512),
        atime: t,
        mtime: t,
        ctime: t,
    }
}
