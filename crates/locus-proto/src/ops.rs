//! The operation table: every request Locus understands, defined once.
//!
//! [`operation_table!`] lists each operation with its code, request fields, shape and
//! reply type. This crate expands it into request structs and the [`OPERATIONS`]
//! catalogue; the server expands it into its dispatch, the client into typed calls, and
//! the docs test checks `docs/protocol.md` against it. Adding an operation is one entry.

use crate::types::*;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// How the frames of an operation flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One request frame, one reply frame.
    Unary,
    /// One request frame, then reply frames flagged MORE until the last.
    StreamOut,
    /// Request frames flagged MORE until the last, then one reply frame.
    StreamIn,
}

/// Static facts about one operation, for dispatch, docs and bindings.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub code: u16,
    pub name: &'static str,
    pub shape: Shape,
    /// Request field names in wire order (also the positional order of script bindings).
    pub fields: &'static [&'static str],
    pub reply: &'static str,
    pub doc: &'static str,
}

/// Implemented by every request struct: ties it to its code and reply type.
pub trait Operation: Serialize + DeserializeOwned + Send + 'static {
    const INFO: OpInfo;
    /// What a successful reply's metadata decodes to.
    type Reply: Serialize + DeserializeOwned + Send + 'static;
}

/// A bit of [`Put`]'s `mode`: the upload makes a new file, and fails with `EXIST`
/// (nothing changed) if the name is taken when it ends, however it came to be taken
/// meanwhile (create-only writes: S3's `If-None-Match: *`, fsspec's `mode="create"`).
/// The mode's other bits above the permissions are ignored.
pub const PUT_NEW: u32 = 1 << 31;

/// Invokes `$callback!` with the whole operation table.
///
/// Each entry reads: doc comment, code, struct name, method name, shape, `{ fields }`,
/// `->` reply type. Callbacks in other crates match the same pattern.
#[macro_export]
macro_rules! operation_table {
    ($callback:ident) => {
        $callback! {
            /// Starts the handshake; answered with the server's challenge.
            0x01 Hello hello Unary { version: u16, client: String } -> Challenge;
            /// Proves the subject's token (see `auth`); answered with the server's proof.
            /// `server` is the address the client dialled, which the proof covers.
            0x02 Auth auth Unary { subject: String, nonce: Vec<u8>, proof: Vec<u8>, server: String } -> Welcome;
            /// Does nothing; measures the protocol's own round trip.
            0x03 Ping ping Unary {} -> ();
            /// The authenticated subject's name.
            0x04 Whoami whoami Unary {} -> String;
            /// Attributes of a path, following symbolic links.
            0x10 Stat stat Unary { path: String } -> Attr;
            /// Attributes of a path itself, not following a final symbolic link.
            0x11 Lstat lstat Unary { path: String } -> Attr;
            /// Attributes of an open handle's object, wherever it has been renamed to.
            0x12 Fstat fstat Unary { handle: u64 } -> Attr;
            /// Opens a path (flags from `open_flags`); the handle binds to the object.
            0x13 Open open Unary { path: String, flags: u32, mode: u32 } -> Opened;
            /// Releases a handle.
            0x14 Close close Unary { handle: u64 } -> ();
            /// Reads up to `len` bytes at `offset`; the bytes come back as frame data.
            0x15 Pread pread Unary { handle: u64, offset: u64, len: u32 } -> ();
            /// Writes the frame's data at `offset`; answers the count written.
            0x16 Pwrite pwrite Unary { handle: u64, offset: u64 } -> u64;
            /// Streams a whole file: first reply carries its attributes, data follows in frames.
            0x17 Get get StreamOut { path: String } -> Attr;
            /// Streams a whole file in; it replaces the target atomically when the last frame arrives
            /// (with [`PUT_NEW`] in `mode`, it is made only if nothing has the name by then).
            0x18 Put put StreamIn { path: String, mode: u32 } -> Attr;
            /// Lists a directory with each entry's attributes, in one or more frames.
            0x19 Readdir readdir StreamOut { path: String } -> Vec<DirEntry>;
            /// Creates a directory.
            0x1a Mkdir mkdir Unary { path: String, mode: u32 } -> ();
            /// Removes an empty directory.
            0x1b Rmdir rmdir Unary { path: String } -> ();
            /// Removes a name that is not a directory.
            0x1c Unlink unlink Unary { path: String } -> ();
            /// Renames `from` to `to`, replacing `to` as POSIX rename does.
            0x1d Rename rename Unary { from: String, to: String } -> ();
            /// Creates a symbolic link at `path` whose contents are `target`.
            0x1e Symlink symlink Unary { target: String, path: String } -> ();
            /// The contents of a symbolic link.
            0x1f Readlink readlink Unary { path: String } -> String;
            /// Creates a hard link `to` naming the same file as `from`.
            0x20 Link link Unary { from: String, to: String } -> ();
            /// Sets a file's size.
            0x21 Truncate truncate Unary { path: String, size: u64 } -> ();
            /// Sets a file's permission bits.
            0x22 Chmod chmod Unary { path: String, mode: u32 } -> ();
            /// Sets access and modification times.
            0x23 Utimes utimes Unary { path: String, atime: SetTime, mtime: SetTime } -> ();
            /// Flushes a handle's data to stable storage.
            0x24 Fsync fsync Unary { handle: u64 } -> ();
            /// File-system statistics of the export.
            0x25 Statfs statfs Unary { path: String } -> StatFs;
            /// Checks access as `access(2)` does with mode bits R=4, W=2, X=1 (0: existence).
            0x26 Access access Unary { path: String, mode: u32 } -> ();
            /// Sets the size of an open file.
            0x27 Ftruncate ftruncate Unary { handle: u64, size: u64 } -> ();
            /// Turns callbacks on for this connection: from now on every path it asks about
            /// is promised a break message (push topic 2), sent to connection `to` of the
            /// same subject (0: this one), when another client changes it or a name in it;
            /// at most `max` promises are kept (the oldest is broken first). Answers the
            /// number the server grants.
            0x28 Callbacks callbacks Unary { max: u32, to: u64 } -> u32;
            /// As `put`, without waiting for the disk before replacing the target: seen at
            /// once, durable once the server's disk has it (a crash of its machine may lose
            /// it; `put` or `fsync` does not). What `locus mount` stores at close.
            0x29 PutCached put_cached StreamIn { path: String, mode: u32 } -> Attr;
            /// Copies a file's bytes to another name at the server, replacing `to` atomically
            /// as `put` does (readers see the old file or the new one) and as durably; the copy
            /// has the source's permission bits. Needs the read right where `from` is and the
            /// write right where `to` is; a directory `from` answers `EISDIR`.
            0x2a CopyFile copy Unary { from: String, to: String } -> Attr;
            /// The access-control list that governs a directory.
            0x30 AclGet acl_get Unary { path: String } -> Vec<AclEntry>;
            /// Sets (or, with no rights, removes) one subject's rights on a directory.
            0x31 AclSet acl_set Unary { path: String, subject: String, rights: Rights } -> ();
            /// Export I/O totals, per-device totals, per-operation counts and the `top` busiest files (admin).
            0x32 Stats stats Unary { top: u32 } -> StatsReport;
            /// Proposes moves of files between devices that even out their measured load (admin).
            0x33 RebalancePlan rebalance_plan Unary { max_moves: u32 } -> Rebalance;
            /// Plans as `rebalance_plan` does and carries the moves out online (admin); answers what was done.
            0x34 RebalanceApply rebalance_apply Unary { max_moves: u32 } -> Rebalance;
            /// Registers a Lua script (needs `x` at the root); answers its id, the SHA-256 of the source.
            0x40 ScriptRegister script_register Unary { source: String } -> String;
            /// Runs a registered script (or `source`, registering it) with arguments; the frame's data is its input buffer, the reply's data its output buffer.
            0x41 ScriptCall script_call Unary { id: String, source: Option<String>, args: Vec<Value> } -> Vec<Value>;
            /// Runs the WebAssembly module in the frame's data with `dir` preopened as `/` (writable if `write`); replies stream events: started, output as it is written (frame data), finished.
            0x50 StoreletRun storelet_run StreamOut { args: Vec<String>, env: Vec<(String, String)>, dir: String, write: bool } -> StoreletEvent;
            /// Storelet runs queued or running: the caller's own, or every one for an admin.
            0x51 StoreletPs storelet_ps Unary {} -> Vec<StoreletRunInfo>;
            /// Cancels a run (its owner or an admin).
            0x52 StoreletCancel storelet_cancel Unary { run: u64 } -> ();
            /// Storelet accounts: totals per subject and the most recent runs (the caller's own, or all for an admin).
            0x53 StoreletStats storelet_stats Unary {} -> StoreletReport;
            /// The active-file handlers registered at the server (looking up a missing name that invokes one runs it).
            0x58 Handlers handlers Unary {} -> Vec<HandlerInfo>;
            /// Attributes of a file and, on a cluster head, where to read it from data nodes (a capability included).
            0x60 Locate locate Unary { path: String } -> Located;
            /// Reads bytes of an object version at a data node, under a capability from the head; the reply's data holds them.
            0x61 ObjectRead object_read Unary { capability: Capability, offset: u64, len: u32 } -> ();
            /// Stores an object version at a data node (the head only); acknowledged once durable.
            0x62 ObjectPut object_put StreamIn { object: u64, version: u64 } -> Attr;
            /// Removes an object version at a data node (the head only, once no read can need it).
            0x63 ObjectDrop object_drop Unary { object: u64, version: u64 } -> ();
            /// A data node joins a head (as the subject `locus-node`), announcing its address, free space, a fresh nonce, the object versions (`object`, `version`) it found damaged since it last joined, its I/O totals and the versions it served most (`object`, `version`, load); joins are its heartbeats. The head replies with the node's id, the cluster's keys sealed under a key derived from the node's token and both nonces, and the namespace's heads.
            0x64 NodeJoin node_join Unary { addr: String, http: Option<String>, free: u64, nonce: Vec<u8>, damaged: Vec<(u64, u64)>, io: IoCounters, busiest: Vec<(u64, u64, u64)> } -> NodeWelcome;
            /// A signed HTTP URL of a file on a cluster head, good for `ttl_s` seconds, through which any HTTP client may read it as the caller (read right needed).
            0x65 Share share Unary { path: String, ttl_s: u64 } -> String;
            /// Runs the WebAssembly module in the frame's data at a data node over its share of a directory (the head only, for `subject`); replies stream as `storelet_run`'s. The data may be left out when `module` (the module's SHA-256, hex) names one the node has compiled; a node that has not answers `ENOENT`. A nonzero `plan` (read-only runs) asks the node to keep the tree it makes of `files` under that number; with `files` empty, the run is over the tree kept under it, and a node that keeps none answers `ENOENT`. With `write`, the run works on copies, and before its last event the node reports each file it wrote (kept aside for `object_adopt`) and each it removed.
            0x66 NodeRun node_run StreamOut { subject: String, files: Vec<ViewFile>, args: Vec<String>, env: Vec<(String, String)>, write: bool, module: String, plan: u64 } -> StoreletEvent;
            /// Replaces the cluster key (admin, on a head): nodes learn the new key when they next join; capabilities signed with the old one stop working once the longest of them has expired.
            0x67 KeyRotate key_rotate Unary {} -> ();
            /// Checks a version a data node was just given against the head's CRC-32 of its bytes and records its block checksums (the head only); a mismatch fails, removing the version unless it was sealed before (a sealed version is only compared).
            0x68 ObjectSeal object_seal Unary { object: u64, version: u64, crc: u32 } -> ();
            /// Copies a version to this data node from one of the nodes `from` (the head only), reading under `capability` (signed for `locus-node`) at most `rate` bytes a second (0: unlimited), each block checked at the source, then records its block checksums.
            0x69 ObjectFetch object_fetch Unary { capability: Capability, from: Vec<String>, rate: u64 } -> ();
            /// The data nodes of a cluster head, their state and the versions each holds (admin).
            0x6a NodeList node_list Unary {} -> Vec<NodeInfo>;
            /// Drains a data node (admin): no new versions go to it, and those it holds are copied to other nodes, then dropped from it.
            0x6b NodeDrain node_drain Unary { node: u64 } -> ();
            /// Forgets a data node that holds no version any file names (admin): drain it first, or let a dead node's versions be copied.
            0x6c NodeRemove node_remove Unary { node: u64 } -> ();
            /// Starts a third-party write of `size` bytes to a file on a cluster head (write right needed): answers the data nodes to send them to and a write capability, or nothing when the file is to go through the head (too small, or no data nodes).
            0x6d WriteBegin write_begin Unary { path: String, mode: u32, size: u64 } -> Option<WriteTarget>;
            /// Stores the bytes of a new version at a data node under a write capability from the head for the nodes `nodes` (this node among them; exactly its size; started before the capability expires; a version already there is never replaced).
            0x6e ObjectWrite object_write StreamIn { capability: Capability, nodes: Vec<u64> } -> Attr;
            /// Makes a version written to data nodes the file's current one, once every node has checked it against `crc` (the CRC-32 of its bytes); answers the file's attributes.
            0x6f WriteCommit write_commit Unary { path: String, mode: u32, target: WriteTarget, crc: u32 } -> Attr;
            /// Makes a file a writable run wrote at this data node (reported as `token`) the object version `object`.`version` and records its block checksums (the head only); answers its CRC-32.
            0x70 ObjectAdopt object_adopt Unary { token: String, object: u64, version: u64 } -> u32;
        }
    };
}

macro_rules! define_operations {
    ($( $(#[doc = $doc:literal])* $code:literal $name:ident $method:ident $shape:ident
        { $($field:ident : $fty:ty),* $(,)? } -> $reply:ty; )*) => {
        $(
            $(#[doc = $doc])*
            #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
            pub struct $name { $(pub $field: $fty),* }

            impl Operation for $name {
                const INFO: OpInfo = OpInfo {
                    code: $code,
                    name: stringify!($method),
                    shape: Shape::$shape,
                    fields: &[$(stringify!($field)),*],
                    reply: stringify!($reply),
                    doc: concat!($($doc),*),
                };
                type Reply = $reply;
            }
        )*

        /// Every operation, in table order.
        pub const OPERATIONS: &[OpInfo] = &[$(<$name as Operation>::INFO),*];
    };
}

operation_table!(define_operations);

/// Looks an operation up by its wire code.
pub fn by_code(code: u16) -> Option<&'static OpInfo> {
    OPERATIONS.iter().find(|o| o.code == code)
}

/// Looks an operation up by its name.
pub fn by_name(name: &str) -> Option<&'static OpInfo> {
    OPERATIONS.iter().find(|o| o.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, encode};

    #[test]
    fn codes_and_names_are_unique() {
        for (i, a) in OPERATIONS.iter().enumerate() {
            for b in &OPERATIONS[i + 1..] {
                assert_ne!(a.code, b.code, "{} and {}", a.name, b.name);
                assert_ne!(a.name, b.name);
            }
        }
        assert_eq!(by_code(0x10).unwrap().name, "stat");
        assert_eq!(by_name("readdir").unwrap().shape, Shape::StreamOut);
    }

    #[test]
    fn requests_round_trip_and_reject_junk() {
        let r = Rename { from: "a".into(), to: "b/c".into() };
        let bytes = encode(&r);
        assert_eq!(decode::<Rename>(&bytes).unwrap(), r);
        let mut junk = bytes.clone();
        junk.push(0);
        assert!(decode::<Rename>(&junk).is_err());
        assert!(decode::<Rename>(&bytes[..bytes.len() - 1]).is_err());
    }
}

#[cfg(test)]
mod docs_tests {
    use super::*;

    /// `docs/protocol.md` lists every operation with its code, name and shape.
    #[test]
    fn docs_list_every_operation() {
        let doc = include_str!("../../../docs/protocol.md");
        for op in OPERATIONS {
            let row = format!("| {:#04x} | `{}` | {:?} |", op.code, op.name, op.shape);
            assert!(doc.contains(&row), "docs/protocol.md lacks the row starting {row}");
        }
        let rows = doc.lines().filter(|l| l.starts_with("| 0x")).count();
        assert_eq!(rows, OPERATIONS.len(), "docs/protocol.md lists operations the code does not have");
    }
}
