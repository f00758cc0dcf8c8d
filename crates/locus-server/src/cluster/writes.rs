//! A new version: staged in a private file while a handle writes it, stored on
//! the chosen nodes (or kept inline in the namespace), then committed.

use crate::cluster::head::LOCAL_NODE;
use crate::cluster::meta_err;
use crate::cluster::objects::object_name;
use crate::cluster::Head;

use locus_client::Client;
use locus_cluster::{Content, Entry, Kind as EntryKind, Node};
use locus_proto::capability::{self, HEAD_SUBJECT};
use locus_proto::ops::*;
use locus_proto::{Code, Error as WireError};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

/// The CRC-32 of a staged file (what a node checks the version it stored against).
async fn crc_of(staged: &std::path::Path) -> Result<u32, WireError> {
    let staged = staged.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&staged).map_err(|e| WireError::io("staged copy", e))?;
        crate::cluster::checksums::compute(&file).map(|(_, whole)| whole).map_err(|e| WireError::io("staged copy", e))
    })
    .await
    .map_err(|_| WireError::new(Code::IO, "checksum task failed"))?
}

/// A private copy of a file being written: it becomes the file's next version.
pub(crate) struct Staged {
    pub(crate) path: String,
    pub(crate) tmp: PathBuf,
    pub(crate) file: std::fs::File,
    pub(crate) mode: u32,
    /// The version it started from (none for a new file).
    pub(crate) base: Option<Entry>,
    /// Changed since it was made or last committed.
    pub(crate) dirty: bool,
    /// A whole new file replacing what the name had (`put`), not the same file written
    /// (a handle, `truncate`): it gets a new object, as a file renamed over the name
    /// would, and another name the old one had (a hard link) keeps the old bytes.
    pub(crate) fresh: bool,
    /// Made only if nothing has the name when it is committed (a `put` with `PUT_NEW`).
    pub(crate) new_only: bool,
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

impl Head {
    /// The data nodes a new version may go to (live, not draining, with room), most free
    /// space first; the head's own directory when no node has joined.
    pub(crate) fn candidates(&self, size: u64) -> Result<Vec<Node>, WireError> {
        let all = self.nodes()?;
        if all.is_empty() {
            return Ok(vec![Head::here()]);
        }
        let placed = self.placed.lock();
        let recent = |n: &Node| placed.get(&n.id).copied().unwrap_or(0);
        let mut nodes: Vec<Node> = all
            .into_iter()
            .map(|mut n| {
                n.free = n.free.saturating_sub(recent(&n));
                n
            })
            .filter(|n| n.free >= size && !n.draining && self.is_live(n))
            .collect();
        // Free space decides in steps of 1% of the most free (at least 1 GiB): nodes
        // within a step of each other take turns, the one given least lately first.
        let step = (nodes.iter().map(|n| n.free).max().unwrap_or(0) / 100).max(1 << 30);
        nodes.sort_by_key(|n| (std::cmp::Reverse(n.free / step), recent(n), n.id));
        Ok(nodes)
    }

    /// The head's connection to a data node (for storing, dropping and running).
    pub(crate) async fn writer(&self, node: &Node) -> Result<Client, WireError> {
        let token = capability::node_token(&self.key(), HEAD_SUBJECT);
        self.reads
            .connect(&node.addr, HEAD_SUBJECT, &token)
            .await
            .map_err(|e| WireError::new(Code::IO, format!("data node {} at {}: {e}", node.id, node.addr)))
    }

    /// Stores the staged bytes as version `version` of `object` on
    /// [`HeadConfig::replication`] nodes (skipping nodes that fail); answers the nodes
    /// once every one has them on stable storage.
    pub(crate) async fn store(
        &self,
        staged: &std::path::Path,
        object: u64,
        version: u64,
        size: u64,
    ) -> Result<Vec<u64>, WireError> {
        let mut ids = Vec::new();
        let mut failures = Vec::new();
        for node in self.candidates(size)? {
            if ids.len() == self.config.replication {
                break;
            }
            if node.id == LOCAL_NODE {
                let to = self.objects.join(object_name(object, version));
                std::fs::copy(staged, &to).map_err(|e| WireError::io("store locally", e))?;
                std::fs::File::open(&to).and_then(|f| f.sync_all()).map_err(|e| WireError::io("store locally", e))?;
                return Ok(vec![LOCAL_NODE]);
            }
            match self.store_on(&node, staged, object, version, size).await {
                Ok(()) => {
                    *self.placed.lock().entry(node.id).or_default() += size;
                    ids.push(node.id);
                }
                Err(e) => failures.push(e.message),
            }
        }
        if ids.len() < self.config.replication {
            return Err(WireError::new(
                Code::NOSPC,
                format!(
                    "{} of {} data node(s) needed stored {size} bytes ({})",
                    ids.len(),
                    self.config.replication,
                    failures.join("; ")
                ),
            ));
        }
        Ok(ids)
    }

    pub(crate) async fn store_on(
        &self,
        node: &Node,
        staged: &std::path::Path,
        object: u64,
        version: u64,
        size: u64,
    ) -> Result<(), WireError> {
        let client = self.writer(node).await?;
        let mut file = tokio::fs::File::open(staged).await.map_err(|e| WireError::io("staged copy", e))?;
        let stored = client.upload(ObjectPut { object, version }, &mut file, |_| {}).await.map_err(|e| {
            self.reads.note(&node.addr, &e);
            WireError::new(Code::IO, format!("data node {} at {}: {e}", node.id, node.addr))
        })?;
        if stored.size != size {
            return Err(WireError::new(
                Code::IO,
                format!("data node {} stored {} of {size} bytes", node.id, stored.size),
            ));
        }
        // The node checks what it stored against what was sent, and keeps checksums.
        let crc = crc_of(staged).await?;
        client
            .call(ObjectSeal { object, version, crc })
            .await
            .map_err(|e| WireError::new(Code::IO, format!("data node {} at {}: {e}", node.id, node.addr)))
    }

    /// Makes the staged copy the new version of its file and queues the old version's
    /// bytes for removal. Acknowledged (returns) only once both are durable.
    pub(crate) async fn commit(self: Arc<Self>, staged: &Staged) -> Result<Entry, WireError> {
        let size = staged.file.metadata().map_err(|e| WireError::io(&staged.path, e))?.len();
        let version = self.meta.next_id().map_err(meta_err)?;
        let object = match &staged.base {
            Some(e) if !staged.fresh => e.object,
            _ => self.meta.next_id().map_err(meta_err)?,
        };
        let content = if size <= self.config.inline_max {
            let mut bytes = vec![0u8; size as usize];
            staged.file.read_exact_at(&mut bytes, 0).map_err(|e| WireError::io(&staged.path, e))?;
            Content::Inline(bytes)
        } else {
            let head = self.clone();
            let tmp = staged.tmp.clone();
            let nodes = self
                .io()
                .spawn(async move { head.store(&tmp, object, version, size).await })
                .await
                .map_err(|_| WireError::new(Code::IO, "head I/O task failed"))??;
            Content::Nodes(nodes)
        };
        let entry = Entry {
            path: staged.path.clone(),
            kind: EntryKind::File,
            mode: staged.mode,
            size,
            mtime_ns: locus_cluster::now_ns(),
            object,
            version,
            content,
            links: 1,
        };
        let old = match staged.new_only {
            true => self.meta.commit_new(&entry).map(|()| None),
            false => self.meta.commit(&entry),
        };
        let old = match old {
            Ok(old) => old,
            Err(e) => {
                // Not committed: the bytes just stored on the nodes are no one's.
                let _ = self.retire(&entry);
                return Err(meta_err(e));
            }
        };
        if let Some(old) = old {
            self.retire(&old)?;
        }
        Ok(entry)
    }
}
