//! Third-party writes: a client sends a large file's bytes straight to the data nodes
//! the head chose (SPIRAL's transfer, for writes), so that write throughput grows with
//! the nodes instead of stopping at the head's link.
//!
//! 1. `write_begin`: the head checks the write right, picks `--replication` nodes and
//!    answers a [`WriteTarget`]: a write capability (its subject may store exactly
//!    `size` bytes as one new version, until it expires) and the head's seal over the
//!    write. The version is pending: a `garbage` row drops its bytes from the nodes
//!    unless it is committed, and no reader can see it.
//! 2. `object_write` at every node (the client sends each node every byte).
//! 3. `write_commit`: the head checks its seal, has every node check the version
//!    against the client's CRC-32 (`object_seal`), and commits it in one transaction
//!    that also takes it out of `garbage`; the old version is retired as after any
//!    write.

use crate::cluster::head::{GARBAGE_SLACK, LOCAL_NODE};
use crate::cluster::meta_err;
use crate::cluster::Head;
use locus_cluster::{Content, Entry, Kind as EntryKind, MetaError};
use locus_proto::capability::{self, Grant};
use locus_proto::ops::ObjectSeal;
use locus_proto::types::WriteTarget;
use locus_proto::{Code, Error as WireError};
use std::sync::Arc;

/// The slowest transfer a write capability allows for (its lifetime grows by a second
/// per this many bytes), so a large file on a slow link is not cut off.
const SLOWEST: u64 = 1 << 20;

impl Head {
    /// Begins a third-party write of `size` bytes to `path` by `who` (whose right to
    /// write there the caller checked); `None` when the file goes through the head.
    pub(crate) fn begin_write(&self, who: &str, path: &str, size: u64) -> Result<Option<WriteTarget>, WireError> {
        if size < self.config.tp_threshold || size <= self.config.inline_max {
            return Ok(None);
        }
        let candidates = self.candidates(size)?;
        if candidates.iter().any(|n| n.id == LOCAL_NODE) {
            return Ok(None);
        }
        let chosen: Vec<_> = candidates.into_iter().take(self.config.replication).collect();
        if chosen.len() < self.config.replication {
            return Err(WireError::new(
                Code::NOSPC,
                format!(
                    "{} of {} data node(s) needed have room for {size} bytes",
                    chosen.len(),
                    self.config.replication
                ),
            ));
        }
        let object = match self.meta.get(path).map_err(meta_err)? {
            Some(e) if e.kind == EntryKind::Dir => return Err(MetaError::IsDir(path.into()).into()),
            Some(e) => e.object,
            None => self.meta.next_id().map_err(meta_err)?,
        };
        let version = self.meta.next_id().map_err(meta_err)?;
        let expires = capability::now() + self.config.capability_ttl.as_secs() + size / SLOWEST;
        let key = self.key();
        let cap = capability::sign_for(Grant::Write, &key, who, object, version, size, expires);
        let node_ids: Vec<u64> = chosen.iter().map(|n| n.id).collect();
        // Never committed, its bytes go once no commit could name them any more.
        let after = expires + (self.config.capability_ttl + GARBAGE_SLACK).as_secs();
        self.meta.add_garbage_on(object, version, &node_ids, after).map_err(meta_err)?;
        let mut placed = self.placed.lock();
        for id in &node_ids {
            *placed.entry(*id).or_default() += size;
        }
        Ok(Some(WriteTarget {
            object,
            version,
            seal: capability::write_seal(&key, &cap, path, &node_ids),
            node_ids,
            nodes: chosen.into_iter().map(|n| n.addr).collect(),
            node_token: capability::node_token(&key, who),
            capability: cap,
        }))
    }

    /// Commits a third-party write `who` made to `path` (whose right to write there the
    /// caller checked again): answers the new entry.
    pub(crate) async fn commit_write(
        self: Arc<Self>,
        who: String,
        path: String,
        mode: u32,
        target: WriteTarget,
        crc: u32,
    ) -> Result<Entry, WireError> {
        let c = &target.capability;
        let now = capability::now();
        let keys = self.keys();
        let began_here = keys.valid(now).into_iter().any(|k| {
            locus_proto::auth::proofs_equal(&capability::write_seal(k, c, &path, &target.node_ids), &target.seal)
                && capability::verify_for(Grant::Write, k, c, &who, now).is_ok()
        });
        if !began_here {
            return Err(WireError::new(
                Code::ACCES,
                format!("{path}: not a write this cluster began for {who} at this path, or its time ran out"),
            ));
        }
        let nodes = self.nodes()?;
        for id in &target.node_ids {
            let node = nodes
                .iter()
                .find(|n| n.id == *id)
                .ok_or_else(|| WireError::new(Code::IO, format!("data node {id} is gone")))?;
            let seal = ObjectSeal { object: c.object, version: c.version, crc };
            self.writer(node).await?.call(seal).await.map_err(|e| {
                WireError::new(
                    Code::IO,
                    format!("{path}: data node {id} at {} did not keep the bytes sent: {e}", node.addr),
                )
            })?;
        }
        let entry = Entry {
            path,
            kind: EntryKind::File,
            mode: mode & 0o7777,
            size: c.size,
            mtime_ns: locus_cluster::now_ns(),
            object: c.object,
            version: c.version,
            content: Content::Nodes(target.node_ids.clone()),
        };
        if let Some(old) = self.meta.commit_pending(&entry).map_err(meta_err)? {
            self.retire(&old)?;
        }
        Ok(entry)
    }
}
