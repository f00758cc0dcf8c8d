//! The Locus server as a library: [`Server::run`] takes a bound listener and a shutdown
//! signal, so the `locus serve` binary and the tests start it the same way.
//!
//! Its public face is what the CLI, the console and the tests need: [`Server`],
//! [`ServerConfig`], [`Shared`], a [`Session`] acting as a subject with its [`Handler`]
//! (the console's file calls), and the modules below. The rest are rooms of its own.
//!
//! Public:
//! - [`acting`]: acting as a subject for the web console, on one server or a head alike.
//! - [`active`]: active files, whose lookup runs a registered handler.
//! - [`callbacks`]: promises to tell a client when what it cached changes (AFS).
//! - [`chirp`]: the Chirp endpoint, for CCTools' clients (`locus serve --chirp-port`).
//! - [`cluster`]: the cluster's wing: a head (with the `cluster` feature), whose namespace
//!   is in a database and whose file contents are on data nodes, and a data node's side
//!   (joining, objects, keys).
//! - [`config`]: [`ServerConfig`], the token file and the TLS identity.
//! - [`http`]: the HTTP endpoint of heads and data nodes (`GET` with `Range`, `HEAD`,
//!   redirects to data nodes) and the response bodies the console shares.
//! - [`login`]: the login proof bound to the dialled address (and the TLS exporter).
//! - [`metrics`]: Prometheus metrics, served by `locus serve --metrics ADDR`.
//! - [`script_host`]: the file service a script's `fs.*` calls reach (a nested session).
//! - [`storelet_host`]: storelet runs and active-file handlers submitted, queued and run.
//!
//! Rooms: `connection` (one connection's thread, frame loop and pushes), `dispatch` (the
//! [`Handler`] trait generated from the operation table in `locus-proto`), `session` (one
//! connection's state, and `session/handler.rs`, the operations on the store),
//! `transport` (byte streams and the frame writer, sendfile on TCP), `splice` (file bytes
//! into a socket without a copy), `export_watch` (inotify on the export, so changes made
//! beside the server break callbacks), `error` ([`ServerError`]).
//!
//! Each connection is one task that reads a frame, runs it to completion and queues the
//! reply; replies are flushed when no further request is already buffered, so a client
//! that pipelines gets its replies batched. A bad request gets an error frame and the
//! connection goes on; only a broken frame (bad header, oversized) closes it.

pub mod acting;
pub mod active;
pub mod callbacks;
pub mod chirp;
pub mod cluster;
pub mod config;
mod connection;
mod dispatch;
mod error;
mod export_watch;
pub mod http;
pub mod login;
pub mod metrics;
pub mod script_host;
mod session;
mod session_io;
mod splice;
pub mod storelet_host;
mod transport;

pub use config::{Sendfile, ServerConfig, Tokens};
pub use connection::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
pub use dispatch::{Answer, Handler, Reply};
pub use error::ServerError;
pub use session::Session;
pub use session_io::{Connection, Outbox, HEARTBEAT_DEAD};
pub use transport::Body;

use bytes::Bytes;
use connection::{connection_thread, Accepted};
use locus_store::{Acl, Store};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

/// A message pushed to a client outside any request (callbacks from scripts, later).
#[derive(Debug, Clone)]
pub struct Push {
    pub topic: u16,
    pub meta: Vec<u8>,
    pub data: Bytes,
}

/// Connected clients, by id, with a way to push messages to each.
#[derive(Default)]
pub struct Registry {
    next: AtomicU64,
    clients: Mutex<HashMap<u64, PushQueue>>,
    /// The subject each connection authenticated as.
    subjects: Mutex<HashMap<u64, Arc<str>>>,
}

/// The way to one client's pusher task, and how many messages wait in it (a reply sent
/// straight from another thread must not overtake them).
#[derive(Clone)]
struct PushQueue {
    tx: mpsc::UnboundedSender<Push>,
    waiting: Arc<AtomicUsize>,
}

impl Registry {
    fn add(&self, queue: PushQueue) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.clients.lock().insert(id, queue);
        id
    }

    fn remove(&self, id: u64) {
        self.clients.lock().remove(&id);
        self.subjects.lock().remove(&id);
    }

    /// Connection `id` authenticated as `subject`.
    pub fn authenticated(&self, id: u64, subject: &str) {
        self.subjects.lock().insert(id, subject.into());
    }

    /// The subject connection `id` authenticated as, if it is connected and did.
    pub fn subject(&self, id: u64) -> Option<Arc<str>> {
        self.subjects.lock().get(&id).cloned()
    }

    /// Clients connected now.
    pub fn count(&self) -> usize {
        self.clients.lock().len()
    }

    /// Queues a message for a client; false if it is not connected.
    pub fn push(&self, client: u64, msg: Push) -> bool {
        let clients = self.clients.lock();
        let Some(q) = clients.get(&client) else { return false };
        q.waiting.fetch_add(1, Ordering::SeqCst);
        if q.tx.send(msg).is_ok() {
            return true;
        }
        q.waiting.fetch_sub(1, Ordering::SeqCst);
        false
    }
}

/// What every connection of a server shares.
pub struct Shared {
    pub config: ServerConfig,
    pub store: Store,
    pub tokens: Tokens,
    pub registry: Registry,
    /// Promises of callback breaks to clients that cache.
    pub callbacks: callbacks::Callbacks,
    /// Registered scripts and the interpreter pool that runs them.
    pub scripts: locus_script::Engine,
    /// Queues, runs and accounts for storelets.
    pub storelets: storelet_host::StoreletHost,
    /// Handlers, results and runs of active files.
    pub active: active::ActiveFiles,
    /// Counts of requests for Prometheus.
    pub metrics: metrics::Metrics,
    /// The cluster this server heads, if it is a head.
    #[cfg(feature = "cluster")]
    pub head: Option<Arc<cluster::Head>>,
    /// The cluster's keys, once this server has joined a head as a data node.
    node_key: parking_lot::RwLock<Option<Arc<locus_proto::capability::KeyRing>>>,
    /// On a data node: versions found damaged since the last heartbeat told the head.
    damaged: parking_lot::Mutex<Vec<(u64, u64)>>,
    /// On a data node: the id its head gave it at the last join (0: none yet).
    node_id: std::sync::atomic::AtomicU64,
    /// On a data node: the trees of its shares of runs, kept for the next run over the
    /// same plan (see `cluster::plans`).
    pub(crate) kept_trees: cluster::plans::KeptTrees,
    /// The address the native protocol listens on, once [`Server::run`] has started:
    /// which addresses name this server in a login (see [`login`]).
    listen: std::sync::OnceLock<std::net::SocketAddr>,
    /// How connections are served: TLS with this acceptor, or plain TCP (`None`). A
    /// data node's changes when its head issues it a certificate.
    pub(crate) tls: parking_lot::RwLock<Option<tokio_rustls::TlsAcceptor>>,
}

/// Drops the state scripts attached to a file (`state.of`) when the file leaves the export.
struct DropScriptState(Arc<locus_script::ObjectStates>);

impl locus_store::RemovalObserver for DropScriptState {
    fn watching(&self) -> bool {
        self.0.watching()
    }

    fn removed(&self, object: locus_store::ObjectId) {
        self.0.forget(object);
    }
}

/// A configured server, ready to run on a listener.
pub struct Server {
    shared: Arc<Shared>,
}

/// The I/O accounting kept across restarts, in the state directory.
pub const ACCOUNTS_FILE: &str = "io-accounts.json";
/// How often the accounting is saved while the server runs.
const ACCOUNTS_SAVED_EVERY: Duration = Duration::from_secs(60);

/// How long a shutdown waits for connections to finish their current request.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

impl Server {
    /// Prepares the export and state directories, loads tokens (creating an admin token
    /// on first start) and the TLS identity when enabled.
    pub fn new(config: ServerConfig, tokens: Tokens) -> Result<Server, ServerError> {
        #[cfg(not(feature = "cluster"))]
        if config.head.is_some() {
            return Err(ServerError::Config(
                "this build of locus-server has no cluster head (build it with the `cluster` feature)".into(),
            ));
        }
        config.prepare()?;
        let mut initial = Acl::default();
        initial.set(config::ADMIN_SUBJECT, locus_proto::Rights::ALL);
        let store = Store::with_devices(&config.root, &config.devices, &initial, Some(&config.state_dir))?;
        store.counters().restore(&config.state_dir.join(ACCOUNTS_FILE));
        let storelets = storelet_host::StoreletHost::start(config.storelets, &config.state_dir)
            .map_err(|e| ServerError::Config(e.to_string()))?;
        let active = active::ActiveFiles::new(&config.state_dir, config.active_cache_bytes).map_err(|e| {
            ServerError::Config(format!("{}: {e}", config.state_dir.join(active::RESULTS_DIR).display()))
        })?;
        #[cfg(feature = "cluster")]
        let head = match &config.head {
            Some(h) => Some(Arc::new(cluster::Head::open(h.clone(), &config.state_dir)?)),
            None => None,
        };
        // A TLS head serves a certificate of its cluster's authority (written over the
        // state directory's identity first); a data node, the one its head issued it,
        // once it has one; any other TLS server, its own.
        #[cfg(feature = "cluster")]
        if let (Some(head), true) = (&head, config.tls) {
            let names: Vec<String> = config.names.iter().map(|n| n.host.clone()).collect();
            head.serve_tls(&config.state_dir, &names)?;
        }
        // A data node's kept identity first (with or without --tls); one that does not
        // load is forgotten, so that the next join issues and serves a new one.
        let issued = cluster::node::issued_identity(&config.state_dir).filter(|_| config.data_node);
        let kept = issued.and_then(|(cert, key)| match config::acceptor_from(&cert, &key) {
            Ok(acceptor) => Some(acceptor),
            Err(e) => {
                tracing::warn!("the TLS identity this node kept does not load ({e}): forgotten until it joins");
                let _ = (std::fs::remove_file(&cert), std::fs::remove_file(&key));
                None
            }
        });
        let tls = match (kept, config.tls) {
            (Some(acceptor), _) => Some(acceptor),
            (None, true) => Some(config::tls_acceptor(&config.state_dir)?),
            (None, false) => None,
        };
        // A head's scripts keep their values and locks in the namespace, shared with
        // every other head; one server's, in memory.
        #[cfg(feature = "cluster")]
        let script_state: Arc<dyn locus_script::StateStore> = match &head {
            Some(h) => Arc::new(cluster::HeadScriptState::new(h.clone())),
            None => Arc::new(locus_script::MemoryState::default()),
        };
        #[cfg(not(feature = "cluster"))]
        let script_state: Arc<dyn locus_script::StateStore> = Arc::new(locus_script::MemoryState::default());
        let scripts =
            locus_script::Engine::keeping_state_in(config.script_workers, config.script_cache, 4096, script_state);
        store.observe_removals(Arc::new(DropScriptState(scripts.object_states())));
        let callbacks = callbacks::Callbacks::new(config.promises);
        let shared = Arc::new(Shared {
            config,
            store,
            tokens,
            registry: Registry::default(),
            callbacks,
            scripts,
            storelets,
            active,
            metrics: metrics::Metrics::default(),
            #[cfg(feature = "cluster")]
            head,
            node_key: parking_lot::RwLock::new(None),
            damaged: parking_lot::Mutex::new(Vec::new()),
            node_id: std::sync::atomic::AtomicU64::new(0),
            kept_trees: Default::default(),
            listen: std::sync::OnceLock::new(),
            tls: parking_lot::RwLock::new(tls),
        });
        #[cfg(feature = "cluster")]
        if let Some(head) = &shared.head {
            shared.registry.next.store(head.client_id_base(), Ordering::Relaxed);
            head.start_collector();
            head.start_changes(Arc::downgrade(&shared));
            head.start_messages(Arc::downgrade(&shared));
        }
        Ok(Server { shared })
    }

    /// What the connections share (the store, the registry).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serves connections from `listener` until `shutdown` completes, then stops
    /// accepting and gives open connections a moment to finish.
    ///
    /// Connections are spread over [`ServerConfig::threads`] connection threads, each a
    /// single-threaded runtime that owns its connections for their whole life. A thread
    /// is then woken only by its own sockets, so the kernel can keep it on the CPU of the
    /// client it serves; a work-stealing pool, whose workers wake each other, defeats that
    /// and costs a cross-CPU wake-up (about 70 µs in a VM) on every request.
    pub async fn run(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        if let Ok(addr) = listener.local_addr() {
            let _ = self.shared.listen.set(addr);
        }
        let limit = Arc::new(Semaphore::new(self.shared.config.max_connections));
        let (stop_tx, stop_rx) = watch::channel(false);
        let threads = self.shared.config.threads.max(1);
        let mut workers = Vec::with_capacity(threads);
        let mut finished = Vec::with_capacity(threads);
        for i in 0..threads {
            let (tx, rx) = mpsc::unbounded_channel::<Accepted>();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
            let (shared, stop) = (self.shared.clone(), stop_rx.clone());
            let spawned = std::thread::Builder::new().name(format!("locus-conn-{i}")).spawn(move || {
                connection_thread(shared, rx, stop);
                let _ = done_tx.send(());
            });
            match spawned {
                Ok(_) => {
                    workers.push(tx);
                    finished.push(done_rx);
                }
                Err(e) => tracing::error!("cannot start connection thread: {e}"),
            }
        }
        if workers.is_empty() {
            tracing::error!("no connection threads; not serving");
            return;
        }
        tokio::pin!(shutdown);
        let saver = {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ACCOUNTS_SAVED_EVERY).await;
                    shared.save_accounts();
                }
            })
        };
        let mut next = 0usize;
        loop {
            let permit = tokio::select! {
                p = limit.clone().acquire_owned() => p.expect("semaphore is never closed"),
                _ = &mut shutdown => break,
            };
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
            };
            let Ok(stream) = stream.into_std() else { continue };
            next = (next + 1) % workers.len();
            let _ = workers[next].send(Accepted { stream, peer, permit });
        }
        let _ = stop_tx.send(true);
        drop(workers);
        for done in finished {
            let _ = done.await;
        }
        saver.abort();
        self.shared.save_accounts();
    }
}

impl Shared {
    /// True on a cluster head (whose files are in a namespace and on data nodes, not in
    /// its export).
    pub fn is_head(&self) -> bool {
        #[cfg(feature = "cluster")]
        return self.head.is_some();
        #[cfg(not(feature = "cluster"))]
        false
    }

    /// On a cluster head: a data node's HTTP URL from which `subject` reads the file at
    /// `path` straight (third-party transfer), when the file is on data nodes and large
    /// enough, the head does not serve TLS, and the file is still the version `seen`
    /// describes (its attributes as the caller checked them); `None` elsewhere. The
    /// caller has checked `subject`'s right to read it.
    pub fn node_url(&self, subject: &str, path: &str, seen: &locus_proto::types::Attr) -> Option<String> {
        #[cfg(feature = "cluster")]
        if let Some(head) = &self.head {
            let entry = head.meta.get(path).ok()??;
            let now = cluster::attr_of(&entry);
            if (now.ino, now.size, now.mtime) != (seen.ino, seen.size, seen.mtime) {
                return None;
            }
            return head.http_location(subject, &entry);
        }
        let _ = (subject, path, seen);
        None
    }

    /// On a cluster head: each data node's name (`node ID (ADDR)`) and I/O totals as its
    /// last heartbeat gave them (the load the web console plots); `None` elsewhere.
    pub fn data_node_io(&self) -> Option<Vec<(String, locus_proto::types::IoCounters)>> {
        #[cfg(feature = "cluster")]
        if let Some(head) = &self.head {
            let addrs: HashMap<u64, String> =
                head.nodes().unwrap_or_default().into_iter().map(|n| (n.id, n.addr)).collect();
            let io = head.meta.node_io().unwrap_or_default();
            return Some(
                io.into_iter().filter_map(|(id, io)| Some((format!("node {id} ({})", addrs.get(&id)?), io))).collect(),
            );
        }
        None
    }

    /// On a data node its head issued a TLS identity: the file of the cluster's
    /// authority it checks other nodes against (its links to nodes are then TLS).
    pub fn cluster_ca(&self) -> Option<std::path::PathBuf> {
        let ca = self.config.state_dir.join(cluster::node::CLUSTER_CA_FILE);
        (self.tls.read().is_some() && ca.exists()).then_some(ca)
    }

    /// The cluster's keys (current, and the previous one until its time is up), once
    /// this server has joined a head as a data node.
    pub fn node_key(&self) -> Option<Arc<locus_proto::capability::KeyRing>> {
        self.node_key.read().clone()
    }

    /// Whether `dialled`, the address a client's login proof covers, names this server
    /// reached at `local` (see [`login`]).
    pub fn names_this_server(&self, local: std::net::SocketAddr, dialled: &str) -> bool {
        let listen = self.listen.get().copied().unwrap_or(local);
        login::names_this_server(&self.config.names, listen, local, dialled)
    }

    /// Makes this server a data node of the cluster whose keys these are.
    pub fn set_node_key(&self, keys: locus_proto::capability::KeyRing) {
        *self.node_key.write() = Some(Arc::new(keys));
    }

    /// On a data node: the id its head gave it, once it has joined.
    pub fn node_id(&self) -> Option<u64> {
        Some(self.node_id.load(std::sync::atomic::Ordering::Relaxed)).filter(|id| *id != 0)
    }

    /// Records the id a head gave this data node when it joined.
    pub fn set_node_id(&self, id: u64) {
        self.node_id.store(id, std::sync::atomic::Ordering::Relaxed);
    }

    /// On a data node: notes a version whose checksum failed (it was moved aside), for
    /// the head to hear of at the next heartbeat.
    pub fn report_damaged(&self, object: u64, version: u64) {
        // It was moved aside: a kept tree could name it.
        self.kept_trees.damaged(object, version);
        self.requeue_damaged(&[(object, version)]);
    }

    /// On a data node: puts back damaged versions the head did not hear of.
    pub fn requeue_damaged(&self, versions: &[(u64, u64)]) {
        let mut damaged = self.damaged.lock();
        for v in versions {
            if !damaged.contains(v) {
                damaged.push(*v);
            }
        }
    }

    /// The damaged versions not yet reported (the caller puts them back with
    /// [`Shared::requeue_damaged`] if the head does not hear them).
    pub fn take_damaged(&self) -> Vec<(u64, u64)> {
        std::mem::take(&mut *self.damaged.lock())
    }

    /// Saves the I/O accounting to the state directory (logged if it cannot be).
    pub fn save_accounts(&self) {
        let path = self.config.state_dir.join(ACCOUNTS_FILE);
        if let Err(e) = self.store.counters().save(&path) {
            tracing::warn!("cannot save {}: {e}", path.display());
        }
    }
}
