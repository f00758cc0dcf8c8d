//! Third-party writes: on a cluster head, a large file's bytes go straight to the data
//! nodes the head chose, so writes scale with the nodes instead of the head's link.
//!
//! The client asks the head (`write_begin`), sends every byte to each node it names
//! (`object_write`, all nodes fed from one read of the source, so replication costs
//! the client's link and not the head's), then asks the head to commit
//! (`write_commit`) with the CRC-32 of what it sent, which every node checks its copy
//! against. Until the commit no reader sees the new version; a write never committed is
//! dropped by the head. Off with `LOCUS_THIRD_PARTY=0`, as reads are; a client over TLS
//! to its head writes to the nodes over TLS too.

use crate::receive::ReadAhead;
use crate::{Client, Result, Waiter};
use locus_proto::ops::{ObjectWrite, Put, WriteBegin, WriteCommit};
use locus_proto::types::{Attr, WriteTarget};
use locus_proto::{codec, Operation};
use tokio::io::AsyncRead;
use tokio::sync::oneshot;

/// Files at least this large are offered to a head for a third-party write (its
/// default threshold; the head answers whether it takes them).
pub const TP_WRITE_MIN: u64 = 1 << 20;

impl Client {
    /// Streams `size` bytes from `source` to `path` (mode `mode`), replacing it
    /// atomically when done, as [`Client::put`] does; on a cluster head a file of at
    /// least [`TP_WRITE_MIN`] bytes goes straight to the data nodes.
    pub async fn put_sized(
        &self,
        path: &str,
        mode: u32,
        source: &mut (impl AsyncRead + Unpin),
        size: u64,
        progress: impl FnMut(u64),
    ) -> Result<Attr> {
        match self.write_target(path, mode, size).await? {
            Some(target) => self.write_to_nodes(path, mode, target, source, progress).await,
            None => self.upload(Put { path: path.into(), mode }, source, progress).await,
        }
    }

    /// Where to send a new version of `size` bytes, if the server is a head that takes
    /// a third-party write of it.
    ///
    /// A create-only write (`PUT_NEW` in `mode`) goes through the head, which checks
    /// the name when it commits.
    pub(crate) async fn write_target(&self, path: &str, mode: u32, size: u64) -> Result<Option<WriteTarget>> {
        if !self.nodes.is_head() || size < TP_WRITE_MIN || mode & locus_proto::ops::PUT_NEW != 0 {
            return Ok(None);
        }
        self.call(WriteBegin { path: path.into(), mode, size }).await
    }

    /// Sends the bytes to every node of `target`, then has the head commit them.
    pub(crate) async fn write_to_nodes(
        &self,
        path: &str,
        mode: u32,
        target: WriteTarget,
        source: &mut (impl AsyncRead + Unpin),
        mut progress: impl FnMut(u64),
    ) -> Result<Attr> {
        let cap = &target.capability;
        let mut uploads = Vec::new();
        for addr in &target.nodes {
            let node = self.nodes.connect(addr, &cap.subject, &target.node_token).await?;
            let (tx, rx) = oneshot::channel();
            let id = node.register(Waiter::One(tx))?;
            uploads.push((node, id, rx));
        }
        let meta = codec::encode(&ObjectWrite { capability: cap.clone(), nodes: target.node_ids.clone() });
        let mut chunks = ReadAhead::new(source).await?;
        let (mut sent, mut first) = (0u64, true);
        let mut crc = crc32fast::Hasher::new();
        while let Some((chunk, more)) = chunks.next().await? {
            crc.update(chunk);
            let head: &[u8] = if first { &meta } else { &[] };
            for (node, id, _) in &uploads {
                node.send(ObjectWrite::INFO.code, *id, more, head, chunk).await?;
            }
            sent += chunk.len() as u64;
            progress(sent);
            first = false;
        }
        for (node, _, rx) in uploads {
            let frame = node.reply_within(self.commit_deadline(sent), rx).await?;
            let _: Attr = codec::decode(&frame.meta)?;
        }
        // The head has every node read its copy back against the CRC before it commits.
        let commit = WriteCommit { path: path.into(), mode, target, crc: crc.finalize() };
        let limit = self.commit_deadline(sent).unwrap_or(self.deadlines.request);
        self.call_within(commit, limit).await
    }
}
