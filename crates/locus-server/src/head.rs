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

use crate::dispatch::{Answer, Encoded, Handler};
use crate::session::Session;
use crate::transport::{Body, EventFrame, EventStream};
use crate::Connection;
use bytes::Bytes;
use locus_client::nodes::NodeReads;
use locus_client::Client;
use locus_cluster::{normalise, split, Content, Entry, Kind as EntryKind, Meta, MetaError, Node};
use locus_proto::capability::{self, KeyRing, HEAD_SUBJECT, NODE_SUBJECT};
use locus_proto::frame::Kind;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{codec, Code, Error as WireError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a head serves its cluster.
#[derive(Clone, Debug)]
pub struct HeadConfig {
    /// Where the namespace is: a SQLite file's path, or a `postgres://` URL.
    pub meta: String,
    /// Files at least this large are read from data nodes (third-party transfer).
    pub tp_threshold: u64,
    /// Files at most this large live in the namespace, not on data nodes.
    pub inline_max: u64,
    /// Data nodes that hold each version.
    pub replication: usize,
    /// How long a capability is valid.
    pub capability_ttl: Duration,
    /// `host:port` of the head's HTTP endpoint, for the URLs `share` makes.
    pub http: Option<String>,
    /// The longest lifetime a shared URL may be given (`locus serve --share-max-ttl`);
    /// a longer ask is refused with `EINVAL`, and a URL expiring further ahead is not
    /// honoured, so a URL cannot be made to live forever.
    pub share_max_ttl: Duration,
    /// After a key rotation, how long the head goes on signing with the old key while
    /// the data nodes learn the new one (they rejoin every [`crate::node::REJOIN_EVERY`]).
    pub key_grace: Duration,
}

/// The default of [`HeadConfig::share_max_ttl`]: seven days.
pub const SHARE_MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

impl HeadConfig {
    /// The defaults, with the namespace at `meta`.
    pub fn new(meta: impl Into<String>) -> Self {
        HeadConfig {
            meta: meta.into(),
            tp_threshold: 1 << 20,
            inline_max: 64 << 10,
            replication: 1,
            capability_ttl: Duration::from_secs(60),
            http: None,
            share_max_ttl: SHARE_MAX_TTL,
            key_grace: crate::node::REJOIN_EVERY + Duration::from_secs(5),
        }
    }
}

/// Extra time a replaced version is kept after its last capability expired.
const GARBAGE_SLACK: Duration = Duration::from_secs(5);
/// How long the list of data nodes is trusted before it is read again.
const NODES_FRESH: Duration = Duration::from_secs(2);
/// Node id of the head's own object directory, used when no data node has joined.
const LOCAL_NODE: u64 = 0;

/// The state every connection to a head shares.
pub struct Head {
    pub config: HeadConfig,
    pub meta: Meta,
    /// The cluster's keys as last read from the namespace.
    keys: parking_lot::RwLock<KeyRing>,
    /// The wrap key that seals them in the namespace.
    sealing: crate::keys::HeadKeys,
    /// Object versions kept by the head itself while it has no data nodes.
    objects: PathBuf,
    /// Private copies of files open for writing and uploads in progress.
    staging: PathBuf,
    nodes: Mutex<(Option<Instant>, Vec<Node>)>,
    /// Bytes this head placed on each node since the node last reported its free space,
    /// so that writes between reports spread instead of piling on one node.
    placed: Mutex<HashMap<u64, u64>>,
    /// Connections to the data nodes, as the head's own subject.
    reads: NodeReads,
    /// The runtime that talks to data nodes (connection threads are single-threaded and
    /// must not block on their own I/O).
    io: Option<tokio::runtime::Runtime>,
}

impl Drop for Head {
    fn drop(&mut self) {
        if let Some(rt) = self.io.take() {
            rt.shutdown_background();
        }
    }
}

fn meta_err(e: MetaError) -> WireError {
    e.into()
}

/// An I/O error as a wire error with its errno, saying what failed.
pub(crate) fn io_err(what: &str, e: std::io::Error) -> WireError {
    WireError::new(Code::from_errno(e.raw_os_error().unwrap_or(libc::EIO)), format!("{what}: {e}"))
}

/// Attributes of a namespace entry, as `stat` gives them.
pub fn attr_of(e: &Entry) -> Attr {
    let t = Time { sec: e.mtime_ns.div_euclid(1_000_000_000), nsec: e.mtime_ns.rem_euclid(1_000_000_000) as u32 };
    let kind = if e.kind == EntryKind::Dir { S_IFDIR } else { S_IFREG };
    Attr {
        dev: 0,
        ino: e.object,
        mode: kind | (e.mode & 0o7777),
        nlink: if e.kind == EntryKind::Dir { 2 } else { 1 },
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

impl Head {
    /// Opens the namespace (creating it on first start, with `admin` owning the root)
    /// and the head's state under `state_dir`.
    pub fn open(config: HeadConfig, state_dir: &std::path::Path) -> Result<Head, crate::ServerError> {
        let cfg = |e: MetaError| crate::ServerError::Config(format!("cluster namespace at {}: {e}", config.meta));
        let meta = Meta::open(&config.meta, crate::config::ADMIN_SUBJECT).map_err(cfg)?;
        let (sealing, keys) = crate::keys::HeadKeys::open(&meta, state_dir)
            .map_err(|e| crate::ServerError::Config(format!("cluster key: {e}")))?;
        let objects = state_dir.join("objects");
        let staging = state_dir.join("staging");
        for dir in [&objects, &staging] {
            std::fs::create_dir_all(dir).map_err(|e| crate::ServerError::io("create head state", e))?;
        }
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("locus-head-io")
            .enable_all()
            .build()
            .map_err(|e| crate::ServerError::io("start the head's runtime", e))?;
        Ok(Head {
            config,
            meta,
            keys: parking_lot::RwLock::new(keys),
            sealing,
            objects,
            staging,
            nodes: Mutex::new((None, Vec::new())),
            placed: Mutex::new(HashMap::new()),
            reads: NodeReads::default(),
            io: Some(io),
        })
    }

    fn io(&self) -> &tokio::runtime::Handle {
        self.io.as_ref().expect("present until drop").handle()
    }

    /// Runs `f` on the head's I/O runtime and waits for it, from a thread that must not
    /// block its own runtime on it.
    fn block<T: Send>(&self, f: impl Future<Output = T> + Send) -> T {
        let handle = self.io().clone();
        std::thread::scope(|s| s.spawn(move || handle.block_on(f)).join().expect("head I/O thread panicked"))
    }

    /// The data nodes that have joined (read again every [`NODES_FRESH`]).
    pub fn nodes(&self) -> Result<Vec<Node>, WireError> {
        let mut cached = self.nodes.lock();
        if cached.0.is_none_or(|at| at.elapsed() > NODES_FRESH) {
            cached.1 = self.meta.nodes().map_err(meta_err)?;
            cached.0 = Some(Instant::now());
        }
        Ok(cached.1.clone())
    }

    fn forget_nodes(&self) {
        self.nodes.lock().0 = None;
    }

    /// The key this head signs capabilities and URLs with now (shared with the data
    /// nodes): the current one, or the one before during the grace after a rotation.
    pub fn key(&self) -> Vec<u8> {
        self.keys.read().signing(capability::now(), self.config.key_grace.as_secs()).to_vec()
    }

    /// The cluster's keys, as the nodes get them.
    pub fn keys(&self) -> KeyRing {
        self.keys.read().clone()
    }

    /// Reads the keys again from the namespace (another head may have rotated them).
    pub fn refresh_keys(&self) {
        match self.sealing.load(&self.meta) {
            Ok(keys) => *self.keys.write() = keys,
            Err(e) => tracing::warn!("cannot read the cluster key again: {e}"),
        }
    }

    /// Replaces the cluster key: nodes learn the new one when they next join; the head
    /// signs with the old one for [`HeadConfig::key_grace`] more, and nodes accept it
    /// until the last capability it signed has expired.
    pub fn rotate_key(&self) -> Result<(), String> {
        let lifetime = (self.config.capability_ttl + Duration::from_secs(2)).as_secs();
        let keys = self.sealing.rotate(&self.meta, self.config.key_grace.as_secs(), lifetime)?;
        *self.keys.write() = keys;
        Ok(())
    }

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
    /// (the first node holding it that serves HTTP), when it is large enough.
    pub fn http_location(&self, subject: &str, e: &Entry) -> Option<String> {
        let location = self.location(subject, e).ok()??;
        let nodes = self.nodes().ok()?;
        let http = location.nodes.iter().find_map(|addr| nodes.iter().find(|n| &n.addr == addr)?.http.clone())?;
        let c = &location.capability;
        Some(format!("http://{http}/o/{}.{}?c={}", c.object, c.version, crate::http::encode_capability(c)))
    }

    fn location_for(&self, subject: &str, e: &Entry, ids: &[u64]) -> Result<Location, WireError> {
        let nodes = self.nodes()?;
        let addrs: Vec<String> =
            ids.iter().filter_map(|id| nodes.iter().find(|n| n.id == *id)).map(|n| n.addr.clone()).collect();
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
                    .map_err(|err| io_err(&e.path, err))?;
                let mut buf = vec![0u8; len];
                let n = file.read_at(&mut buf, offset).map_err(|err| io_err(&e.path, err))?;
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

    /// The data nodes a new version may go to, most free space first; the head's own
    /// directory when no node has joined.
    fn candidates(&self, size: u64) -> Result<Vec<Node>, WireError> {
        let all = self.nodes()?;
        if all.is_empty() {
            return Ok(vec![Node { id: LOCAL_NODE, addr: String::new(), http: None, free: u64::MAX }]);
        }
        let placed = self.placed.lock();
        let recent = |n: &Node| placed.get(&n.id).copied().unwrap_or(0);
        let mut nodes: Vec<Node> = all
            .into_iter()
            .map(|mut n| {
                n.free = n.free.saturating_sub(recent(&n));
                n
            })
            .filter(|n| n.free >= size)
            .collect();
        // Free space decides in steps of 1% of the most free (at least 1 GiB): nodes
        // within a step of each other take turns, the one given least lately first.
        let step = (nodes.iter().map(|n| n.free).max().unwrap_or(0) / 100).max(1 << 30);
        nodes.sort_by_key(|n| (std::cmp::Reverse(n.free / step), recent(n), n.id));
        Ok(nodes)
    }

    /// The head's connection to a data node (for storing, dropping and running).
    async fn writer(&self, node: &Node) -> Result<Client, WireError> {
        let token = capability::node_token(&self.key(), HEAD_SUBJECT);
        self.reads
            .connect(&node.addr, HEAD_SUBJECT, &token)
            .await
            .map_err(|e| WireError::new(Code::IO, format!("data node {} at {}: {e}", node.id, node.addr)))
    }

    /// Stores the staged bytes as version `version` of `object` on
    /// [`HeadConfig::replication`] nodes (skipping nodes that fail); answers the nodes
    /// once every one has them on stable storage.
    async fn store(
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
                std::fs::copy(staged, &to).map_err(|e| io_err("store locally", e))?;
                std::fs::File::open(&to).and_then(|f| f.sync_all()).map_err(|e| io_err("store locally", e))?;
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

    async fn store_on(
        &self,
        node: &Node,
        staged: &std::path::Path,
        object: u64,
        version: u64,
        size: u64,
    ) -> Result<(), WireError> {
        let client = self.writer(node).await?;
        let mut file = tokio::fs::File::open(staged).await.map_err(|e| io_err("staged copy", e))?;
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
        Ok(())
    }

    /// Makes the staged copy the new version of its file and queues the old version's
    /// bytes for removal. Acknowledged (returns) only once both are durable.
    async fn commit(self: Arc<Self>, staged: &Staged) -> Result<Entry, WireError> {
        let size = staged.file.metadata().map_err(|e| io_err(&staged.path, e))?.len();
        let version = self.meta.next_id().map_err(meta_err)?;
        let object = match &staged.base {
            Some(e) => e.object,
            None => self.meta.next_id().map_err(meta_err)?,
        };
        let content = if size <= self.config.inline_max {
            let mut bytes = vec![0u8; size as usize];
            staged.file.read_exact_at(&mut bytes, 0).map_err(|e| io_err(&staged.path, e))?;
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
        };
        let old = self.meta.commit(&entry).map_err(meta_err)?;
        if let Some(old) = old {
            self.retire(&old)?;
        }
        Ok(entry)
    }

    /// Queues a replaced or removed version's bytes for removal once no capability for
    /// it can still be valid.
    fn retire(&self, old: &Entry) -> Result<(), WireError> {
        let after = capability::now() + (self.config.capability_ttl + GARBAGE_SLACK).as_secs();
        self.meta.add_garbage(old, after).map_err(meta_err)
    }

    /// Drops versions whose time has come from their nodes; answers how many.
    pub async fn collect_garbage(&self) -> usize {
        let Ok(due) = self.meta.due_garbage(capability::now()) else { return 0 };
        let nodes = self.nodes().unwrap_or_default();
        let mut dropped = 0;
        for g in due {
            let mut all = true;
            for id in &g.nodes {
                if *id == LOCAL_NODE {
                    let _ = std::fs::remove_file(self.objects.join(object_name(g.object, g.version)));
                    continue;
                }
                let Some(node) = nodes.iter().find(|n| n.id == *id) else { continue };
                let done = match self.writer(node).await {
                    Ok(c) => match c.call(ObjectDrop { object: g.object, version: g.version }).await {
                        Ok(()) => true,
                        Err(e) => {
                            self.reads.note(&node.addr, &e);
                            false
                        }
                    },
                    Err(_) => false,
                };
                all &= done;
            }
            // A node that is down keeps its copy until it answers again.
            if all && self.meta.forget_garbage(&g).is_ok() {
                dropped += 1;
            }
        }
        dropped
    }

    /// Runs [`Head::collect_garbage`] every few seconds on the head's runtime.
    pub fn start_collector(self: &Arc<Self>) {
        let head = Arc::downgrade(self);
        self.io().spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let Some(head) = head.upgrade() else { return };
                head.refresh_keys();
                head.collect_garbage().await;
            }
        });
    }
}

/// Runs one share per node at once and hands their events on as they arrive: one
/// `Started`, every node's output, then one `Finished` adding up the accounts (the
/// highest exit code), or the first node's error.
async fn merge_runs(
    head: Arc<Head>,
    subject: String,
    shares: Vec<(Node, Vec<ViewFile>)>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    module: Bytes,
    tx: tokio::sync::mpsc::UnboundedSender<EventFrame>,
) {
    let frame = |kind: Kind, more: bool, meta: Vec<u8>, data: Bytes| EventFrame {
        kind,
        more,
        meta,
        data,
        mergeable: kind == Kind::Reply && more,
    };
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut running = 0;
    for (node, files) in shares {
        let req = NodeRun { subject: subject.clone(), files, args: args.clone(), env: env.clone() };
        let (head, module, events_tx) = (head.clone(), module.clone(), events_tx.clone());
        running += 1;
        tokio::spawn(async move {
            let frames = match head.writer(&node).await {
                Ok(c) => c.call_stream_with(req, &module).await.map_err(|e| WireError::new(e.code(), e.to_string())),
                Err(e) => Err(e),
            };
            match frames {
                Ok(mut frames) => {
                    while let Some(f) = frames.recv().await {
                        let last = f.as_ref().map_or(true, |f| !f.header.more());
                        let _ = events_tx
                            .send(f.map_err(|e| WireError::new(e.code(), format!("data node {}: {e}", node.id))));
                        if last {
                            return;
                        }
                    }
                    let _ = events_tx.send(Err(WireError::new(Code::IO, format!("data node {} went away", node.id))));
                }
                Err(e) => drop(events_tx.send(Err(e))),
            }
        });
    }
    drop(events_tx);
    let mut total = StoreletResult::default();
    let mut started = false;
    while running > 0 {
        let Some(event) = events.recv().await else { break };
        let f = match event {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.send(frame(Kind::Error, false, codec::encode(&e), Bytes::new()));
                return;
            }
        };
        match codec::decode::<StoreletEvent>(&f.meta) {
            Ok(StoreletEvent::Started { module, .. }) if !started => {
                started = true;
                let _ = tx.send(frame(
                    Kind::Reply,
                    true,
                    codec::encode(&StoreletEvent::Started { run: 0, module }),
                    Bytes::new(),
                ));
            }
            Ok(StoreletEvent::Started { .. }) => {}
            Ok(e @ (StoreletEvent::Stdout | StoreletEvent::Stderr)) => {
                let _ = tx.send(frame(Kind::Reply, true, codec::encode(&e), f.data));
            }
            Ok(StoreletEvent::Finished(r)) => {
                running -= 1;
                total.module = r.module;
                total.exit_code = total.exit_code.max(r.exit_code);
                total.fuel += r.fuel;
                total.cpu_us += r.cpu_us;
                total.peak_memory = total.peak_memory.max(r.peak_memory);
                total.wall_us = total.wall_us.max(r.wall_us);
                total.output_bytes += r.output_bytes;
                total.read_bytes += r.read_bytes;
                total.write_bytes += r.write_bytes;
                total.files_opened += r.files_opened;
            }
            Err(e) => {
                let _ = tx.send(frame(Kind::Error, false, codec::encode(&e), Bytes::new()));
                return;
            }
        }
    }
    let _ = tx.send(frame(Kind::Reply, false, codec::encode(&StoreletEvent::Finished(total)), Bytes::new()));
}

/// Up to `len` bytes of `bytes` from `offset`.
fn slice(bytes: &[u8], offset: u64, len: u32) -> Bytes {
    let start = (offset.min(bytes.len() as u64)) as usize;
    Bytes::copy_from_slice(&bytes[start..start.saturating_add(len as usize).min(bytes.len())])
}

/// The file name of an object version (on the head's own directory).
fn object_name(object: u64, version: u64) -> String {
    format!("{object}.{version}")
}

/// A private copy of a file being written: it becomes the file's next version.
struct Staged {
    path: String,
    tmp: PathBuf,
    file: std::fs::File,
    mode: u32,
    /// The version it started from (none for a new file).
    base: Option<Entry>,
    /// Changed since it was made or last committed.
    dirty: bool,
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// An open handle on a head.
struct HeadHandle {
    entry: Entry,
    staged: Option<Staged>,
}

/// One connection to a head. Authentication, `ping`, `whoami` and `stats` are the
/// ordinary server's; the namespace and file operations are the cluster's.
pub struct HeadSession {
    inner: Session,
    head: Arc<Head>,
    handles: HashMap<u64, HeadHandle>,
    next_handle: u64,
    puts: HashMap<u32, Staged>,
    current: (u32, bool),
}

type Reply<T> = Result<Answer<T>, WireError>;

fn not_here<T>(what: &str) -> Reply<T> {
    Err(WireError::new(Code::NOTSUP, format!("{what} is not available on a cluster head yet")))
}

/// Refuses unless `rights` (in directory `dir`) include `need`.
fn check(rights: Rights, need: Rights, dir: &str) -> Result<(), WireError> {
    match rights.contains(need) {
        true => Ok(()),
        false => Err(WireError::new(Code::ACCES, format!("{dir}: permission denied (needs '{need}' right)"))),
    }
}

/// The directory whose ACL governs `path`: itself for a directory, else its parent.
fn governing(path: &str, is_dir: bool) -> &str {
    if is_dir {
        return path;
    }
    split(path).map_or("/", |(parent, _)| parent)
}

impl HeadSession {
    /// A session for a new connection.
    pub fn new(inner: Session, head: Arc<Head>) -> Self {
        HeadSession { inner, head, handles: HashMap::new(), next_handle: 1, puts: HashMap::new(), current: (0, false) }
    }

    /// The subject of the connection: never the nodes' or the head's own subject, which
    /// act through `node_join` (and at the nodes) only.
    fn who(&self) -> Result<String, WireError> {
        match self.inner.subject() {
            None => Err(WireError::new(Code::NOT_AUTHENTICATED, "authenticate first")),
            Some(s @ (NODE_SUBJECT | HEAD_SUBJECT)) => {
                Err(WireError::new(Code::ACCES, format!("{s} may only join the cluster as a data node")))
            }
            Some(s) => Ok(s.to_string()),
        }
    }

    /// Checks that the subject holds `need` in directory `dir`.
    /// True when `who` holds `r` and `l` in `dir` and in every directory above it up to
    /// one `known` already says (answers are kept there).
    fn readable_dir(&self, who: &str, dir: &str, known: &mut HashMap<String, bool>) -> Result<bool, WireError> {
        if let Some(&yes) = known.get(dir) {
            return Ok(yes);
        }
        let parent = governing(dir, false);
        let yes = parent != dir
            && self.readable_dir(who, parent, known)?
            && self.head.meta.rights(who, dir).map_err(meta_err)?.contains(Rights::READ.union(Rights::LIST));
        known.insert(dir.to_string(), yes);
        Ok(yes)
    }

    fn need(&self, dir: &str, need: Rights) -> Result<String, WireError> {
        let who = self.who()?;
        check(self.head.meta.rights(&who, dir).map_err(meta_err)?, need, dir)?;
        Ok(who)
    }

    /// Checks that the subject holds `need` in the directory of `path`, and answers the
    /// subject and the entry at `path` (one transaction).
    fn need_entry(&self, path: &str, need: Rights) -> Result<(String, Entry), WireError> {
        let who = self.who()?;
        let dir = governing(path, false);
        let (rights, entry) = self.head.meta.rights_and_get(&who, dir, path).map_err(meta_err)?;
        check(rights, need, dir)?;
        Ok((who, entry.ok_or_else(|| MetaError::NotFound(path.into()))?))
    }

    fn entry(&self, path: &str) -> Result<Entry, WireError> {
        self.head.meta.get(path).map_err(meta_err)?.ok_or_else(|| MetaError::NotFound(path.into()).into())
    }

    /// A private copy of `path` to write: empty, or holding `base`'s bytes.
    fn stage(&self, path: &str, mode: u32, base: Option<Entry>, copy: bool) -> Result<Staged, WireError> {
        let mut name = [0u8; 12];
        getrandom::fill(&mut name).expect("the OS provides randomness");
        let tmp = self.head.staging.join(hex::encode(name));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io_err("staging", e))?;
        let staged = Staged { path: path.into(), tmp, file, mode, base, dirty: !copy };
        if let (true, Some(base)) = (copy, staged.base.clone()) {
            let head = self.head.clone();
            let mut at = 0u64;
            while at < base.size {
                let len = (base.size - at).min(4 << 20) as u32;
                let data = self.head.block(head.clone().read(base.clone(), at, len))?;
                if data.is_empty() {
                    break;
                }
                staged.file.write_all_at(&data, at).map_err(|e| io_err(path, e))?;
                at += data.len() as u64;
            }
        }
        Ok(staged)
    }

    fn staged(&mut self, handle: u64) -> Result<&mut Staged, WireError> {
        let h =
            self.handles.get_mut(&handle).ok_or_else(|| WireError::new(Code::BADF, format!("bad handle {handle}")))?;
        h.staged.as_mut().ok_or_else(|| WireError::new(Code::BADF, "the handle is not open for writing"))
    }

    /// Appends a frame of upload `id` to its staged copy; after the last one, the copy
    /// becomes the file's new version.
    fn upload(&mut self, id: u32, data: &[u8], more: bool) -> Reply<Attr> {
        let staged = self.puts.get_mut(&id).expect("the upload was started");
        let at = staged.file.metadata().map_err(|e| io_err("staging", e))?.len();
        if let Err(e) = staged.file.write_all_at(data, at) {
            self.puts.remove(&id);
            return Err(io_err("staging", e));
        }
        if more {
            return Ok(Answer::deferred());
        }
        let staged = self.puts.remove(&id).expect("present");
        let head = self.head.clone();
        later(&self.head, async move { Ok(attr_of(&head.commit(&staged).await?).into()) })
    }

    /// Commits a handle's private copy now, waiting for it (fsync).
    fn commit_now(&mut self, handle: u64) -> Result<(), WireError> {
        let head = self.head.clone();
        let h =
            self.handles.get_mut(&handle).ok_or_else(|| WireError::new(Code::BADF, format!("bad handle {handle}")))?;
        let Some(staged) = h.staged.as_mut().filter(|s| s.dirty) else { return Ok(()) };
        let committed = head.block(head.clone().commit(staged))?;
        staged.dirty = false;
        staged.base = Some(committed.clone());
        h.entry = committed;
        Ok(())
    }
}

/// An answer that comes from `f`, run on the head's runtime.
fn later<T: serde::Serialize + Send + 'static>(
    head: &Head,
    f: impl Future<Output = Result<Answer<T>, WireError>> + Send + 'static,
) -> Reply<T> {
    let task = head.io().spawn(f);
    Ok(Answer::later(Box::pin(async move {
        task.await.map_err(|_| WireError::new(Code::IO, "head I/O task failed"))?.map(Answer::encode)
    })))
}

/// A `get` reply: the attributes, then the bytes as data frames as they are read.
fn stream_file(head: Arc<Head>, e: Entry) -> Reply<Attr> {
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

impl Connection for HeadSession {
    fn authenticated(&self) -> bool {
        self.inner.authenticated()
    }

    fn set_current(&mut self, id: u32, more: bool) {
        self.current = (id, more);
    }

    fn is_uploading(&self, id: u32) -> bool {
        self.puts.contains_key(&id)
    }

    fn put_more(&mut self, id: u32, data: &[u8], more: bool) -> Result<Encoded, WireError> {
        self.upload(id, data, more).map(Answer::encode)
    }
}

impl Handler for HeadSession {
    fn hello(&mut self, req: Hello, data: Bytes) -> Reply<Challenge> {
        self.inner.hello(req, data)
    }

    fn auth(&mut self, req: Auth, data: Bytes) -> Reply<Welcome> {
        let mut answer = self.inner.auth(req, data)?;
        answer.pages.iter_mut().for_each(|w| w.head = true);
        Ok(answer)
    }

    fn ping(&mut self, req: Ping, data: Bytes) -> Reply<()> {
        self.inner.ping(req, data)
    }

    fn whoami(&mut self, req: Whoami, data: Bytes) -> Reply<String> {
        self.inner.whoami(req, data)
    }

    fn stat(&mut self, req: Stat, _: Bytes) -> Reply<Attr> {
        let path = normalise(&req.path).map_err(meta_err)?;
        Ok(attr_of(&self.need_entry(&path, Rights::LIST)?.1).into())
    }

    fn lstat(&mut self, req: Lstat, data: Bytes) -> Reply<Attr> {
        self.stat(Stat { path: req.path }, data)
    }

    fn fstat(&mut self, req: Fstat, _: Bytes) -> Reply<Attr> {
        let h = self.handles.get(&req.handle).ok_or_else(|| WireError::new(Code::BADF, "bad handle"))?;
        let mut attr = attr_of(&h.entry);
        if let Some(s) = &h.staged {
            attr.size = s.file.metadata().map_err(|e| io_err(&s.path, e))?.len();
        }
        Ok(attr.into())
    }

    fn open(&mut self, req: Open, _: Bytes) -> Reply<Opened> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let writing = req.flags & (open_flags::WRITE | open_flags::TRUNCATE | open_flags::APPEND) != 0;
        let need = if writing || req.flags & open_flags::CREATE != 0 { Rights::WRITE } else { Rights::READ };
        let who = self.need(governing(&path, false), need)?;
        let existing = self.head.meta.get(&path).map_err(meta_err)?;
        let entry = match existing {
            Some(_) if req.flags & open_flags::CREATE != 0 && req.flags & open_flags::EXCLUSIVE != 0 => {
                return Err(MetaError::Exists(path).into())
            }
            Some(e) if e.kind == EntryKind::Dir && writing => return Err(MetaError::IsDir(path).into()),
            Some(e) if e.kind != EntryKind::Dir && req.flags & open_flags::DIRECTORY != 0 => {
                return Err(MetaError::NotDir(path).into())
            }
            Some(e) => e,
            None if req.flags & open_flags::CREATE != 0 => {
                let id = self.head.meta.next_id().map_err(meta_err)?;
                let e = Entry::empty(path.clone(), EntryKind::File, req.mode, id);
                match self.head.meta.create(&e) {
                    Ok(()) => e,
                    Err(MetaError::Exists(_)) => self.entry(&path)?,
                    Err(err) => return Err(err.into()),
                }
            }
            None => return Err(MetaError::NotFound(path).into()),
        };
        let staged = if writing {
            let truncate = req.flags & open_flags::TRUNCATE != 0;
            Some(self.stage(&path, entry.mode, Some(entry.clone()), !truncate)?)
        } else {
            None
        };
        let location = if staged.is_none() { self.head.location(&who, &entry)? } else { None };
        let attr = attr_of(&entry);
        let handle = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(handle, HeadHandle { entry, staged });
        Ok(Opened { handle, attr, location }.into())
    }

    fn close(&mut self, req: Close, _: Bytes) -> Reply<()> {
        let h = self.handles.remove(&req.handle).ok_or_else(|| WireError::new(Code::BADF, "bad handle"))?;
        match h.staged.filter(|s| s.dirty) {
            Some(staged) => {
                let head = self.head.clone();
                later(&self.head, async move { head.commit(&staged).await.map(|_| ().into()) })
            }
            None => Ok(().into()),
        }
    }

    fn pread(&mut self, req: Pread, _: Bytes) -> Reply<()> {
        let h = self.handles.get(&req.handle).ok_or_else(|| WireError::new(Code::BADF, "bad handle"))?;
        if h.entry.kind == EntryKind::Dir {
            return Err(MetaError::IsDir(h.entry.path.clone()).into());
        }
        let len = req.len.min(self.inner.max_data());
        if let Some(s) = &h.staged {
            let mut buf = vec![0u8; len as usize];
            let n = s.file.read_at(&mut buf, req.offset).map_err(|e| io_err(&s.path, e))?;
            buf.truncate(n);
            return Ok(Answer::with_body((), Body::Bytes(buf.into())));
        }
        if let Content::Inline(bytes) = &h.entry.content {
            return Ok(Answer::with_body((), Body::Bytes(slice(bytes, req.offset, len))));
        }
        let (head, entry) = (self.head.clone(), h.entry.clone());
        later(
            &self.head,
            async move { Ok(Answer::with_body((), Body::Bytes(head.read(entry, req.offset, len).await?))) },
        )
    }

    fn pwrite(&mut self, req: Pwrite, data: Bytes) -> Reply<u64> {
        let s = self.staged(req.handle)?;
        s.file.write_all_at(&data, req.offset).map_err(|e| io_err(&s.path, e))?;
        s.dirty = true;
        Ok((data.len() as u64).into())
    }

    fn get(&mut self, req: Get, _: Bytes) -> Reply<Attr> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let (_, e) = self.need_entry(&path, Rights::READ)?;
        if e.kind == EntryKind::Dir {
            return Err(MetaError::IsDir(path).into());
        }
        stream_file(self.head.clone(), e)
    }

    fn put_cached(&mut self, req: PutCached, data: Bytes) -> Reply<Attr> {
        // Data nodes store objects durably either way.
        self.put(Put { path: req.path, mode: req.mode }, data)
    }

    fn put(&mut self, req: Put, data: Bytes) -> Reply<Attr> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        let base = self.head.meta.get(&path).map_err(meta_err)?;
        if base.as_ref().is_some_and(|b| b.kind == EntryKind::Dir) {
            return Err(MetaError::IsDir(path).into());
        }
        let staged = self.stage(&path, req.mode & 0o7777, base, false)?;
        let id = self.current.0;
        self.puts.insert(id, staged);
        self.upload(id, &data, self.current.1)
    }

    fn readdir(&mut self, req: Readdir, _: Bytes) -> Reply<Vec<DirEntry>> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(&path, Rights::LIST)?;
        let entries: Vec<DirEntry> = self
            .head
            .meta
            .list(&path)
            .map_err(meta_err)?
            .iter()
            .map(|e| DirEntry { name: split(&e.path).map_or("", |(_, n)| n).to_string(), attr: attr_of(e) })
            .collect();
        Ok(crate::session::listing(&entries))
    }

    fn mkdir(&mut self, req: Mkdir, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        let id = self.head.meta.next_id().map_err(meta_err)?;
        let e = Entry::empty(path, EntryKind::Dir, req.mode, id);
        Ok(self.head.meta.create(&e).map_err(meta_err)?.into())
    }

    fn rmdir(&mut self, req: Rmdir, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::DELETE)?;
        self.head.meta.remove(&path, true).map_err(meta_err)?;
        Ok(().into())
    }

    fn unlink(&mut self, req: Unlink, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::DELETE)?;
        let old = self.head.meta.remove(&path, false).map_err(meta_err)?;
        self.head.retire(&old)?;
        Ok(().into())
    }

    fn rename(&mut self, req: Rename, _: Bytes) -> Reply<()> {
        let from = normalise(&req.from).map_err(meta_err)?;
        let to = normalise(&req.to).map_err(meta_err)?;
        self.need(governing(&from, false), Rights::DELETE)?;
        self.need(governing(&to, false), Rights::WRITE)?;
        if let Some(replaced) = self.head.meta.rename(&from, &to).map_err(meta_err)? {
            self.head.retire(&replaced)?;
        }
        Ok(().into())
    }

    fn symlink(&mut self, _: Symlink, _: Bytes) -> Reply<()> {
        not_here("symlink")
    }

    fn readlink(&mut self, _: Readlink, _: Bytes) -> Reply<String> {
        not_here("readlink")
    }

    fn link(&mut self, _: Link, _: Bytes) -> Reply<()> {
        not_here("link")
    }

    fn truncate(&mut self, req: Truncate, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let (_, e) = self.need_entry(&path, Rights::WRITE)?;
        if e.kind == EntryKind::Dir {
            return Err(MetaError::IsDir(path).into());
        }
        let staged = self.stage(&path, e.mode, Some(e), req.size > 0)?;
        staged.file.set_len(req.size).map_err(|err| io_err(&path, err))?;
        self.head.block(self.head.clone().commit(&staged))?;
        Ok(().into())
    }

    fn chmod(&mut self, req: Chmod, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        Ok(self.head.meta.set_mode(&path, req.mode).map_err(meta_err)?.into())
    }

    fn utimes(&mut self, req: Utimes, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        let ns = match req.mtime {
            SetTime::Omit => return Ok(().into()),
            SetTime::Now => locus_cluster::now_ns(),
            SetTime::At(t) => t.sec * 1_000_000_000 + t.nsec as i64,
        };
        Ok(self.head.meta.set_mtime(&path, ns).map_err(meta_err)?.into())
    }

    fn fsync(&mut self, req: Fsync, _: Bytes) -> Reply<()> {
        Ok(self.commit_now(req.handle)?.into())
    }

    fn statfs(&mut self, _: Statfs, _: Bytes) -> Reply<StatFs> {
        self.who()?;
        let free: u64 = self.head.nodes()?.iter().map(|n| n.free).sum();
        let bsize = 4096;
        Ok(StatFs {
            bsize,
            frsize: bsize,
            blocks: free / bsize,
            bfree: free / bsize,
            bavail: free / bsize,
            files: 0,
            ffree: 0,
            namemax: 255,
        }
        .into())
    }

    fn access(&mut self, req: Access, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let e = self.entry(&path)?;
        let mut need = Rights(0);
        if req.mode & 4 != 0 {
            need = need.union(if e.kind == EntryKind::Dir { Rights::LIST } else { Rights::READ });
        }
        if req.mode & 2 != 0 {
            need = need.union(Rights::WRITE);
        }
        self.need(governing(&path, e.kind == EntryKind::Dir), need)?;
        Ok(().into())
    }

    fn ftruncate(&mut self, req: Ftruncate, _: Bytes) -> Reply<()> {
        let s = self.staged(req.handle)?;
        s.file.set_len(req.size).map_err(|e| io_err(&s.path, e))?;
        s.dirty = true;
        Ok(().into())
    }

    fn callbacks(&mut self, _: Callbacks, _: Bytes) -> Reply<u32> {
        // Several heads share a namespace in the database; none sees another's changes.
        Err(WireError::new(Code::NOTSUP, "a cluster head does not promise callbacks"))
    }

    fn acl_get(&mut self, req: AclGet, _: Bytes) -> Reply<Vec<AclEntry>> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.who()?;
        Ok(self.head.meta.acl(&path).map_err(meta_err)?.into())
    }

    fn acl_set(&mut self, req: AclSet, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(&path, Rights::ADMIN)?;
        Ok(self.head.meta.acl_set(&path, &req.subject, req.rights).map_err(meta_err)?.into())
    }

    fn stats(&mut self, req: Stats, data: Bytes) -> Reply<StatsReport> {
        self.inner.stats(req, data)
    }

    fn rebalance_plan(&mut self, _: RebalancePlan, _: Bytes) -> Reply<Rebalance> {
        not_here("rebalancing")
    }

    fn rebalance_apply(&mut self, _: RebalanceApply, _: Bytes) -> Reply<Rebalance> {
        not_here("rebalancing")
    }

    fn script_register(&mut self, _: ScriptRegister, _: Bytes) -> Reply<String> {
        not_here("scripts")
    }

    fn script_call(&mut self, _: ScriptCall, _: Bytes) -> Reply<Vec<Value>> {
        not_here("scripts")
    }

    /// Runs the module on every data node over the files of `dir` that the node holds
    /// (small files, which live at the head, go to the node with the fewest), and
    /// streams the nodes' output back as it comes; the result adds up their accounts.
    fn storelet_run(&mut self, req: StoreletRun, data: Bytes) -> Reply<StoreletEvent> {
        if req.write {
            return not_here("a writable storelet run");
        }
        let dir = normalise(&req.dir).map_err(meta_err)?;
        let who = self.need("/", Rights::EXECUTE)?;
        self.need(&dir, Rights::READ.union(Rights::LIST))?;
        if self.entry(&dir)?.kind != EntryKind::Dir {
            return Err(MetaError::NotDir(dir).into());
        }
        let nodes = self.head.nodes()?;
        if nodes.is_empty() {
            return not_here("a storelet run without data nodes");
        }
        let mut shares: Vec<(Node, Vec<ViewFile>)> = nodes.into_iter().map(|n| (n, Vec::new())).collect();
        let prefix = if dir == "/" { 0 } else { dir.len() };
        // Only what the subject may read goes into the nodes' views: a file is left out
        // when any directory between `dir` and it lacks `r` or `l` for the subject.
        let mut readable: HashMap<String, bool> = HashMap::from([(dir.clone(), true)]);
        for e in self.head.meta.files_under(&dir).map_err(meta_err)? {
            if !self.readable_dir(&who, governing(&e.path, false), &mut readable)? {
                continue;
            }
            let path = e.path[prefix..].trim_start_matches('/').to_string();
            let (at, inline) = match e.content {
                Content::Nodes(ids) => match shares.iter().position(|(n, _)| ids.first() == Some(&n.id)) {
                    Some(i) => (i, None),
                    None => continue,
                },
                Content::Inline(bytes) => {
                    let fewest = (0..shares.len()).min_by_key(|&i| shares[i].1.len()).expect("nodes exist");
                    (fewest, Some(bytes))
                }
            };
            shares[at].1.push(ViewFile { path, object: e.object, version: e.version, inline });
        }
        let head = self.head.clone();
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stream = EventStream { frames, queued };
        self.head.io().spawn(merge_runs(head, who, shares, req.args, req.env, data, tx));
        Ok(Answer::events(stream))
    }

    fn storelet_ps(&mut self, _: StoreletPs, _: Bytes) -> Reply<Vec<StoreletRunInfo>> {
        not_here("storelets")
    }

    fn storelet_cancel(&mut self, _: StoreletCancel, _: Bytes) -> Reply<()> {
        not_here("storelets")
    }

    fn storelet_stats(&mut self, _: StoreletStats, _: Bytes) -> Reply<StoreletReport> {
        not_here("storelets")
    }

    fn handlers(&mut self, _: Handlers, _: Bytes) -> Reply<Vec<HandlerInfo>> {
        Ok(Vec::new().into())
    }

    fn locate(&mut self, req: Locate, _: Bytes) -> Reply<Located> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let (who, e) = self.need_entry(&path, Rights::READ)?;
        Ok(Located { attr: attr_of(&e), location: self.head.location(&who, &e)? }.into())
    }

    fn object_read(&mut self, _: ObjectRead, _: Bytes) -> Reply<()> {
        not_here("object_read (a data node's operation)")
    }

    fn object_put(&mut self, _: ObjectPut, _: Bytes) -> Reply<Attr> {
        not_here("object_put (a data node's operation)")
    }

    fn object_drop(&mut self, _: ObjectDrop, _: Bytes) -> Reply<()> {
        not_here("object_drop (a data node's operation)")
    }

    fn share(&mut self, req: Share, _: Bytes) -> Reply<String> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let (who, _) = self.need_entry(&path, Rights::READ)?;
        let max = self.head.config.share_max_ttl.as_secs();
        if req.ttl_s > max {
            return Err(WireError::new(
                Code::INVAL,
                format!(
                    "a shared URL may live at most {max} s on this head (asked {} s): ask for less, or start \
                     the head with a larger --share-max-ttl",
                    req.ttl_s
                ),
            ));
        }
        let expires = capability::now().saturating_add(req.ttl_s);
        let sig = capability::url_signature(&self.head.key(), &who, &path, expires);
        let encoded: String = path
            .split('/')
            .map(|p| percent_encoding::utf8_percent_encode(p, percent_encoding::NON_ALPHANUMERIC).to_string())
            .collect::<Vec<_>>()
            .join("/");
        let subject = percent_encoding::utf8_percent_encode(&who, percent_encoding::NON_ALPHANUMERIC);
        let rel = format!("{encoded}?s={subject}&e={expires}&sig={sig}");
        Ok(match &self.head.config.http {
            Some(http) => format!("http://{http}{rel}"),
            None => rel,
        }
        .into())
    }

    fn node_run(&mut self, _: NodeRun, _: Bytes) -> Reply<StoreletEvent> {
        not_here("node_run (a data node's operation)")
    }

    fn node_join(&mut self, req: NodeJoin, _: Bytes) -> Reply<NodeWelcome> {
        // Only the nodes' own subject joins; its token seals the keys for the node.
        let subject =
            self.inner.subject().ok_or_else(|| WireError::new(Code::NOT_AUTHENTICATED, "authenticate first"))?;
        let token = match self.inner.token_of(NODE_SUBJECT) {
            Some(token) if subject == NODE_SUBJECT => token,
            _ => {
                return Err(WireError::new(
                    Code::ACCES,
                    format!(
                    "data nodes join as {NODE_SUBJECT} (make its token at the head with `locus token {NODE_SUBJECT}`)"
                ),
                ))
            }
        };
        if req.nonce.len() < 16 {
            return Err(WireError::new(Code::INVAL, "a join needs a fresh nonce of at least 16 bytes"));
        }
        let node = self.head.meta.join_node(&req.addr, req.http.as_deref(), req.free).map_err(meta_err)?;
        self.head.forget_nodes();
        self.head.placed.lock().remove(&node);
        tracing::info!(node, addr = %req.addr, free = req.free, "data node joined");
        let (nonce, sealed) = crate::keys::seal_for_node(&self.head.keys(), &token, &req.nonce, &req.addr);
        Ok(NodeWelcome { node, nonce, sealed }.into())
    }

    fn key_rotate(&mut self, _: KeyRotate, _: Bytes) -> Reply<()> {
        let who = self.need("/", Rights::ADMIN)?;
        self.head.rotate_key().map_err(|e| WireError::new(Code::IO, format!("cannot rotate the cluster key: {e}")))?;
        tracing::info!(by = %who, "cluster key rotated");
        Ok(().into())
    }
}
