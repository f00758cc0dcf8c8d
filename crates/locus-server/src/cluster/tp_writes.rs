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

/// The slowest transfer a write allows for (the time to commit it grows by a second
/// per this many bytes), so a large file on a slow link is not cut off.
const SLOWEST: u64 = 1 << 20;

/// A commit is refused this close to the time its pending version is due for removal
/// (a collector may be dropping its bytes).
const COMMIT_MARGIN: u64 = 10;

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
        // A whole file written anew is a new file under the name, as `put` makes one on a
        // single server (its temporary file renamed over the name): another name the
        // old one had (a hard link) keeps the old bytes.
        if let Some(e) = self.meta.get(path).map_err(meta_err)?.filter(|e| e.kind == EntryKind::Dir) {
            return Err(MetaError::IsDir(e.path).into());
        }
        let object = self.meta.next_id().map_err(meta_err)?;
        let version = self.meta.next_id().map_err(meta_err)?;
        // The capability only starts uploads (a node checks it on the first frame), so it
        // lives as long as a read capability; the commit may come later, until the
        // pending version is due for removal.
        let ttl = self.config.capability_ttl.as_secs();
        let expires = capability::now() + ttl;
        let key = self.key();
        let node_ids: Vec<u64> = chosen.iter().map(|n| n.id).collect();
        let cap = capability::sign_for(Grant::Write(&node_ids), &key, who, object, version, size, expires);
        // Never committed, its bytes go once no commit could name them any more.
        let after = expires + size / SLOWEST + ttl + GARBAGE_SLACK.as_secs() + COMMIT_MARGIN;
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
        // Signed by this cluster, for this subject, path and nodes. Its expiry bounded
        // when uploads could start; the commit's own bound is the pending row's.
        let began_here = keys.valid(now).into_iter().any(|k| {
            locus_proto::auth::proofs_equal(&capability::write_seal(k, c, &path, &target.node_ids), &target.seal)
                && capability::verify_for(Grant::Write(&target.node_ids), k, c, &who, c.expires).is_ok()
        });
        if !began_here {
            return Err(WireError::new(Code::ACCES, format!("{path}: not a write this cluster began for {who} here")));
        }
        // Still pending (not committed already, not about to be dropped) before any node
        // is asked anything: a sealed version is never sealed again.
        let (object, version, ids) = (c.object, c.version, &target.node_ids);
        if !self.meta.is_pending(object, version, ids, now + COMMIT_MARGIN).map_err(meta_err)? {
            return Err(WireError::new(
                Code::NOENT,
                format!("{path}: version {version} is not pending (its time ran out, or it was committed already)"),
            ));
        }
        let nodes = self.nodes()?;
        let mut seals = tokio::task::JoinSet::new();
        for id in ids {
            let node = nodes
                .iter()
                .find(|n| n.id == *id)
                .cloned()
                .ok_or_else(|| WireError::new(Code::IO, format!("data node {id} is gone")))?;
            let (head, path) = (self.clone(), path.clone());
            // The node reads the whole version back: a second per 100 MiB beyond the usual.
            let limit =
                locus_client::Deadlines::default().request + std::time::Duration::from_secs(c.size / (100 << 20));
            seals.spawn(async move {
                let seal = ObjectSeal { object, version, crc };
                let sealed = match head.writer(&node).await {
                    Ok(client) => client.call_within(seal, limit).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.message),
                };
                sealed.map_err(|e| {
                    let (id, addr) = (node.id, &node.addr);
                    WireError::new(
                        Code::IO,
                        format!("{path}: data node {id} at {addr} did not keep the bytes sent: {e}"),
                    )
                })
            });
        }
        while let Some(sealed) = seals.join_next().await {
            sealed.map_err(|_| WireError::new(Code::IO, "a seal task failed"))??;
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
            links: 1,
        };
        if let Some(old) = self.meta.commit_pending(&entry, capability::now() + COMMIT_MARGIN).map_err(meta_err)? {
            self.retire(&old)?;
        }
        Ok(entry)
    }
}
