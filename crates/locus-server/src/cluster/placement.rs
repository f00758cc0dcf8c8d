//! Where a file's bytes are read from: the nodes holding its version (a location
//! and a capability, for a third-party read), or the head itself reading them from a
//! node.

use crate::cluster::attr_of;
use crate::cluster::head::LOCAL_NODE;
use crate::cluster::objects::object_name;
use crate::cluster::Head;
use crate::dispatch::Answer;
use crate::dispatch::Reply;
use crate::transport::EventFrame;
use crate::transport::EventStream;
use locus_proto::codec;
use locus_proto::frame::Kind;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use locus_cluster::{Content, Entry, Kind as EntryKind};
use locus_proto::capability::{self, HEAD_SUBJECT};
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Up to `len` bytes of `bytes` from `offset`.
pub(crate) fn slice(bytes: &[u8], offset: u64, len: u32) -> Bytes {
    let start = (offset.min(bytes.len() as u64)) as usize;
    Bytes::copy_from_slice(&bytes[start..start.saturating_add(len as usize).min(bytes.len())])
}

impl Head {
    /// Where `subject` can read `e`'s current version from, when it is large enough and
    /// on data nodes.
    pub fn location(&self, subject: &str, e: &Entry) -> Result<Option<Location>, WireError> {
        let Content::Nodes(ids) = &e.content else { return Ok(None) };
        if e.kind != EntryKind::File || e.size < self.config.tp_threshold || ids.is_empty() || ids.contains(&LOCAL_NODE)
        {
            return Ok(None);
        }
        self.location_for(subject, e, ids).map(Some)
    }

    /// A data node's URL from which `subject` can read `e`'s current version over HTTP
    /// (the first node holding it that serves HTTP), when it is large enough. None
    /// while this head serves TLS: a node's HTTP door is plain, and a redirect there
    /// would send the capability and the bytes readable.
    pub fn http_location(&self, subject: &str, e: &Entry) -> Option<String> {
        if self.ca.get().is_some() {
            return None;
        }
        let location = self.location(subject, e).ok()??;
        let nodes = self.nodes().ok()?;
        let http = location.nodes.iter().find_map(|addr| nodes.iter().find(|n| &n.addr == addr)?.http.clone())?;
        let c = &location.capability;
        Some(format!("http://{http}/o/{}.{}?c={}", c.object, c.version, crate::http::encode_capability(c)))
    }

    pub(crate) fn location_for(&self, subject: &str, e: &Entry, ids: &[u64]) -> Result<Location, WireError> {
        let nodes = self.nodes()?;
        let mut holders: Vec<&locus_cluster::Node> =
            ids.iter().filter_map(|id| nodes.iter().find(|n| n.id == *id)).collect();
        // Nodes that stopped sending heartbeats last: a client tries them only if no
        // live one answers.
        holders.sort_by_key(|n| !self.is_live(n));
        let addrs: Vec<String> = holders.into_iter().map(|n| n.addr.clone()).collect();
        let expires = capability::now() + self.config.capability_ttl.as_secs();
        let key = self.key();
        Ok(Location {
            nodes: addrs,
            capability: capability::sign(&key, subject, e.object, e.version, e.size, expires),
            node_token: capability::node_token(&key, subject),
        })
    }

    /// Reads bytes of `e`'s version itself (for clients below the threshold, and those
    /// whose nodes did not answer).
    pub async fn read(self: Arc<Self>, e: Entry, offset: u64, len: u32) -> Result<Bytes, WireError> {
        let len = (len as u64).min(e.size.saturating_sub(offset)) as usize;
        match &e.content {
            Content::Inline(bytes) => Ok(slice(bytes, offset, len as u32)),
            Content::Nodes(ids) if ids.contains(&LOCAL_NODE) => {
                let file = std::fs::File::open(self.objects.join(object_name(e.object, e.version)))
                    .map_err(|err| WireError::io(&e.path, err))?;
                let mut buf = vec![0u8; len];
                let n = file.read_at(&mut buf, offset).map_err(|err| WireError::io(&e.path, err))?;
                buf.truncate(n);
                Ok(buf.into())
            }
            Content::Nodes(ids) => {
                let location = self.location_for(HEAD_SUBJECT, &e, ids)?;
                let head = self.clone();
                self.io()
                    .spawn(async move { head.reads.read(&location, offset, len as u32).await })
                    .await
                    .map_err(|_| WireError::new(Code::IO, "head I/O task failed"))?
                    .map_err(|err| {
                        WireError::new(Code::IO, format!("{}: no data node holding it answers: {err}", e.path))
                    })
            }
        }
    }
}

/// An answer that comes from `f`, run on the head's runtime.
pub(crate) fn later<T: serde::Serialize + Send + 'static>(
    head: &Head,
    f: impl Future<Output = Result<Answer<T>, WireError>> + Send + 'static,
) -> Reply<T> {
    let task = head.io().spawn(f);
    Ok(Answer::later(Box::pin(async move {
        task.await.map_err(|_| WireError::new(Code::IO, "head I/O task failed"))?.map(Answer::encode)
    })))
}

/// A `get` reply: the attributes, then the bytes as data frames as they are read.
pub(crate) fn stream_file(head: Arc<Head>, e: Entry) -> Reply<Attr> {
    let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
    let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let frame =
        |more: bool, meta: Vec<u8>, data: Bytes| EventFrame { kind: Kind::Reply, more, meta, data, mergeable: false };
    let _ = tx.send(frame(true, codec::encode(&attr_of(&e)), Bytes::new()));
    let stream = EventStream { frames, queued: queued.clone() };
    let io = head.io().clone();
    io.spawn(async move {
        let mut at = 0u64;
        while at < e.size {
            // Hold back while the client is slow to take what is queued.
            while queued.load(std::sync::atomic::Ordering::Relaxed) > 8 << 20 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let len = (e.size - at).min(1 << 20) as u32;
            match head.clone().read(e.clone(), at, len).await {
                Ok(data) if !data.is_empty() => {
                    at += data.len() as u64;
                    queued.fetch_add(data.len(), std::sync::atomic::Ordering::Relaxed);
                    if tx.send(frame(true, Vec::new(), data)).is_err() {
                        return;
                    }
                }
                Ok(_) => break,
                Err(err) => {
                    let _ = tx.send(EventFrame {
                        kind: Kind::Error,
                        more: false,
                        meta: codec::encode(&err),
                        data: Bytes::new(),
                        mergeable: false,
                    });
                    return;
                }
            }
        }
        let _ = tx.send(frame(false, Vec::new(), Bytes::new()));
    });
    Ok(Answer::events(stream))
}
