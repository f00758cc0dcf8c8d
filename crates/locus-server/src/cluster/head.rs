//! The head's state: its configuration, the namespace ([`Meta`]), the pool of data
//! nodes, the cluster's keys, and the collection of versions no capability can name any
//! more.

use crate::cluster::meta_err;
use crate::cluster::objects::object_name;
use crate::cluster::HeadConfig;

use locus_client::nodes::NodeReads;
use locus_cluster::{Entry, Meta, MetaError, Node};
use locus_proto::capability::{self, KeyRing};
use locus_proto::ops::*;
use locus_proto::Error as WireError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Extra time a replaced version is kept after its last capability expired.
pub(crate) const GARBAGE_SLACK: Duration = Duration::from_secs(5);

/// How long the list of data nodes is trusted before it is read again.
pub(crate) const NODES_FRESH: Duration = Duration::from_secs(2);

/// Node id of the head's own object directory, used when no data node has joined.
pub(crate) const LOCAL_NODE: u64 = 0;

/// How many client numbers heads take from (20 bits: with a 32-bit count, client ids
/// stay below 2^52).
const CLIENT_NUMBERS: u64 = 1 << 20;

/// How long a head trusts its last read of which heads are alive.
const NUMBERS_FRESH: Duration = Duration::from_secs(2);

/// A head not heard from for this long is taken for dead (heads say they are alive
/// every [`NUMBERS_FRESH`] or so).
const NUMBERS_SEEN_WITHIN: Duration = Duration::from_secs(10);

/// A change announced to the other heads (`changes`): whether names were made or
/// removed, and the path.
pub(crate) type Change = (bool, String);

/// The state every connection to a head shares.
pub struct Head {
    pub config: HeadConfig,
    /// This head process's id among the heads of its namespace (for the healing lease).
    pub(crate) id: u64,
    /// A number below [`CLIENT_NUMBERS`] no other head process of the namespace holds:
    /// what this head's client ids carry above their count.
    pub(crate) client_number: u64,
    /// The client numbers of the heads heard from lately, as last read (see
    /// [`Head::numbers_alive`]).
    pub(crate) numbers_alive: Mutex<(Option<Instant>, Vec<u64>)>,
    /// Set once no version is left in the head's own directory while data nodes exist.
    pub(crate) local_moved: std::sync::atomic::AtomicBool,
    pub meta: Meta,
    /// The cluster's keys as last read from the namespace.
    pub(crate) keys: parking_lot::RwLock<KeyRing>,
    /// The wrap key that seals them in the namespace.
    pub(crate) sealing: crate::cluster::head_keys::HeadKeys,
    /// Object versions kept by the head itself while it has no data nodes.
    pub(crate) objects: PathBuf,
    /// Private copies of files open for writing and uploads in progress.
    pub(crate) staging: PathBuf,
    pub(crate) nodes: Mutex<(Option<Instant>, Vec<Node>)>,
    /// Bytes this head placed on each node since the node last reported its free space,
    /// so that writes between reports spread instead of piling on one node.
    pub(crate) placed: Mutex<HashMap<u64, u64>>,
    /// Object versions this head's clients have open (how many handles each): kept from
    /// collection while they are, though the file was replaced or removed meanwhile.
    pub(crate) open_versions: Mutex<HashMap<(u64, u64), usize>>,
    /// Connections to the data nodes, as the head's own subject.
    pub(crate) reads: NodeReads,
    /// The runtime that talks to data nodes (connection threads are single-threaded and
    /// must not block on their own I/O).
    pub(crate) io: Option<tokio::runtime::Runtime>,
    /// Where this head's changes go to be announced to the other heads (none: the
    /// engine has no other heads).
    pub(crate) announce: Mutex<Option<std::sync::mpsc::Sender<Vec<Change>>>>,
    /// The server this head answers for (its storelet host runs what the head runs
    /// itself while it has no data node).
    pub(crate) shared: std::sync::OnceLock<std::sync::Weak<crate::Shared>>,
    /// Listening for other heads' changes now (see `changes`).
    pub(crate) listening: std::sync::atomic::AtomicBool,
    /// The heads of the namespace heard from lately, as last read (see
    /// [`Head::heads_alive`]).
    pub(crate) heads: Mutex<(Option<Instant>, Vec<String>)>,
    /// Active-file results being made at this head: one run at a time for each.
    pub(crate) active_runs: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Scripts' messages to other heads' clients waiting for their receipts, by id
    /// (see `messages`).
    pub(crate) receipts: Mutex<HashMap<u64, std::sync::mpsc::Sender<bool>>>,
    /// Whether messages reach other heads' clients (the engine has other heads).
    pub(crate) messages_across: std::sync::atomic::AtomicBool,
    /// The cluster's certificate authority, when this head serves TLS.
    pub(crate) ca: std::sync::OnceLock<crate::cluster::cluster_ca::ClusterCa>,
    /// The TLS identities this head issued, by the address each data node advertised.
    pub(crate) issued: Mutex<HashMap<String, crate::cluster::keys::NodeTls>>,
    /// The modules each data node has been sent (and so compiled): a run there names
    /// them by hash (see `fanout::run_share`).
    pub(crate) modules_sent: Mutex<std::collections::HashSet<(u64, String)>>,
    /// Read-only runs' plans, kept for the next run over the same directory (see
    /// `cluster::plans`).
    pub(crate) plans: crate::cluster::plans::KeptPlans,
}

impl Drop for Head {
    fn drop(&mut self) {
        if let Some(rt) = self.io.take() {
            rt.shutdown_background();
        }
    }
}

impl Head {
    /// Opens the namespace (creating it on first start, with `admin` owning the root)
    /// and the head's state under `state_dir`.
    pub fn open(config: HeadConfig, state_dir: &std::path::Path) -> Result<Head, crate::ServerError> {
        let cfg = |e: MetaError| crate::ServerError::Config(format!("cluster namespace at {}: {e}", config.meta));
        let meta = Meta::open(&config.meta, crate::config::ADMIN_SUBJECT).map_err(cfg)?;
        let (sealing, keys) = crate::cluster::head_keys::HeadKeys::open(&meta, state_dir)
            .map_err(|e| crate::ServerError::Config(format!("cluster key: {e}")))?;
        let client_number = meta.claim_head_number(CLIENT_NUMBERS).map_err(cfg)?;
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
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).expect("the OS provides randomness");
        Ok(Head {
            config,
            id: u64::from_le_bytes(id),
            client_number,
            numbers_alive: Mutex::new((None, Vec::new())),
            modules_sent: Mutex::default(),
            plans: Default::default(),
            local_moved: std::sync::atomic::AtomicBool::new(false),
            meta,
            keys: parking_lot::RwLock::new(keys),
            sealing,
            objects,
            staging,
            nodes: Mutex::new((None, Vec::new())),
            placed: Mutex::new(HashMap::new()),
            open_versions: Mutex::new(HashMap::new()),
            reads: NodeReads::default(),
            io: Some(io),
            announce: Mutex::new(None),
            active_runs: Mutex::new(HashMap::new()),
            heads: Mutex::new((None, Vec::new())),
            listening: std::sync::atomic::AtomicBool::new(false),
            shared: std::sync::OnceLock::new(),
            receipts: Mutex::new(HashMap::new()),
            messages_across: std::sync::atomic::AtomicBool::new(false),
            ca: std::sync::OnceLock::new(),
            issued: Mutex::new(HashMap::new()),
        })
    }

    /// What the ids of this head's clients start from: its client number above a
    /// 32-bit count, so an id one head gave (kept in shared script state for
    /// `msg.send`, say) names no client of another head, and says which head it is on.
    /// Ids stay below 2^52, exact in any Lua number.
    pub(crate) fn client_id_base(&self) -> u64 {
        self.client_number << 32
    }

    /// Whether `client` is (or was) a client of this head process.
    pub(crate) fn is_own_client(&self, client: u64) -> bool {
        client >> 32 == self.client_number
    }

    /// The client numbers of the heads heard from lately (this one's included),
    /// refreshed every few seconds by the collector; empty if never read.
    pub(crate) fn numbers_alive(&self) -> Vec<u64> {
        let mut cached = self.numbers_alive.lock();
        if cached.0.is_none_or(|at| at.elapsed() >= NUMBERS_FRESH) {
            match self.meta.head_numbers_alive(self.client_number, NUMBERS_SEEN_WITHIN.as_secs()) {
                Ok(numbers) => *cached = (Some(Instant::now()), numbers),
                Err(e) => tracing::warn!("cannot record this head's client number as alive: {e}"),
            }
        }
        cached.1.clone()
    }

    /// The head itself as the node of a run (while it has no data node).
    pub(crate) fn here() -> Node {
        Node { id: LOCAL_NODE, addr: String::new(), http: None, free: u64::MAX, seen: 0, draining: false }
    }

    pub(crate) fn io(&self) -> &tokio::runtime::Handle {
        self.io.as_ref().expect("present until drop").handle()
    }

    /// Runs `f` on the head's I/O runtime and waits for it, from a thread that must not
    /// block its own runtime on it.
    pub(crate) fn block<T: Send>(&self, f: impl Future<Output = T> + Send) -> T {
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

    pub(crate) fn forget_nodes(&self) {
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

    /// Queues a replaced or removed version's bytes for removal once no capability for
    /// it can still be valid.
    pub(crate) fn retire(&self, old: &Entry) -> Result<(), WireError> {
        // Another name of the file (a hard link) still has that version.
        if old.links > 1 && self.meta.names_version(old.object, old.version).map_err(meta_err)? {
            return Ok(());
        }
        let after = capability::now() + (self.config.capability_ttl + GARBAGE_SLACK).as_secs();
        self.meta.add_garbage(old, after).map_err(meta_err)
    }

    /// Drops versions whose time has come from their nodes; answers how many.
    pub async fn collect_garbage(&self) -> usize {
        // Versions open here are pushed past the time a collector (of this head or
        // another on the same namespace) could next reach them, and skipped now.
        let open: Vec<(u64, u64)> = self.open_versions.lock().keys().copied().collect();
        let until = capability::now() + (self.config.capability_ttl + GARBAGE_SLACK).as_secs();
        if let Err(e) = self.meta.hold_garbage(&open, until) {
            tracing::warn!("holding the versions open at this head: {e}");
        }
        let Ok(due) = self.meta.due_garbage(capability::now()) else { return 0 };
        let due = due.into_iter().filter(|g| !open.contains(&(g.object, g.version)));
        let nodes = self.nodes().unwrap_or_default();
        let mut dropped = 0;
        for g in due {
            let mut all = true;
            // A node a current file lists for this version holds a copy put there since
            // (healing may copy back to a node that once lost it): that copy stays.
            let listed = match self.meta.file_of(g.object, g.version) {
                Ok(Some(e)) => match e.content {
                    locus_cluster::Content::Nodes(ids) => ids,
                    locus_cluster::Content::Inline(_) => Vec::new(),
                },
                Ok(None) => Vec::new(),
                Err(_) => continue,
            };
            for id in g.nodes.iter().filter(|id| !listed.contains(id)) {
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

    /// Counts a handle open on `entry`'s version (a file whose bytes are on nodes).
    pub(crate) fn hold(&self, entry: &Entry) {
        if matches!(entry.content, locus_cluster::Content::Nodes(_)) {
            *self.open_versions.lock().entry((entry.object, entry.version)).or_default() += 1;
        }
    }

    /// Ends the count [`Head::hold`] began.
    pub(crate) fn release(&self, entry: &Entry) {
        let mut open = self.open_versions.lock();
        if let Some(n) = open.get_mut(&(entry.object, entry.version)) {
            *n -= 1;
            if *n == 0 {
                open.remove(&(entry.object, entry.version));
            }
        }
    }

    /// Runs [`Head::collect_garbage`] every few seconds on the head's runtime, and
    /// healing ([`Head::heal`]) beside it.
    pub fn start_collector(self: &Arc<Self>) {
        let healer = Arc::downgrade(self);
        self.io().spawn(async move {
            loop {
                // Often: a node that went down is noticed here, and its copies begin,
                // within this of its timeout (a round with nothing to do is two reads).
                tokio::time::sleep(Duration::from_millis(250)).await;
                let Some(head) = healer.upgrade() else { return };
                head.heal().await;
            }
        });
        let head = Arc::downgrade(self);
        self.io().spawn(async move {
            for round in 1u64.. {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let Some(head) = head.upgrade() else { return };
                head.refresh_keys();
                head.heads_alive();
                head.numbers_alive();
                head.collect_garbage().await;
                // Every 30 s: script state of files gone (removed or replaced through
                // any head, or in a writable run) goes too, and so do messages to
                // other heads' clients that no head took.
                if round % 15 == 0 {
                    if let Err(e) = head.meta.sweep_script_values() {
                        tracing::warn!("cannot sweep the script state of removed files: {e}");
                    }
                    if let Err(e) = head.meta.sweep_letters() {
                        tracing::warn!("cannot sweep scripts' messages no head took: {e}");
                    }
                }
            }
        });
    }
}
