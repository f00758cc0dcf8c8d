//! The Locus client library: an async [`Client`] over one connection, with pipelining
//! (any number of requests in flight, matched to replies by id) and typed calls derived
//! from the operation table, plus a [`blocking::Client`] facade for synchronous code.
//!
//! - [`Client::call`] runs any operation of the table: `client.call(Stat { path })`.
//! - Named helpers (`stat`, `pread`, `get`, `put`, ...) cover the common cases.
//! - [`url`]: `locus://HOST:PORT/path` URLs. [`credentials`]: where tokens come from.
//! - [`error`]: [`ClientError`], with the errno a program should see.

pub mod blocking;
pub mod consistency;
pub mod credentials;
pub mod error;
pub mod nodes;
pub mod url;

pub use credentials::Credentials;
pub use error::{ClientError, Result};
pub use locus_proto::ops;
pub use locus_proto::types;
pub use url::LocusUrl;

use bytes::{Bytes, BytesMut};
use locus_proto::frame::{self, Header, Kind, Limits, FLAG_MORE, HEADER_LEN};
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{auth, codec, Error as WireError, Operation};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// One frame received from the server.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub meta: Bytes,
    pub data: Bytes,
}

/// A message the server pushed to this client.
#[derive(Debug, Clone)]
pub struct PushMessage {
    pub topic: u16,
    pub meta: Bytes,
    pub data: Bytes,
}

enum Waiter {
    One(oneshot::Sender<Result<Frame>>),
    Many(mpsc::UnboundedSender<Result<Frame>>),
    /// One reply whose data the read loop receives straight into this buffer's spare
    /// capacity (taken out when the reply's header arrives), so it is not copied again.
    Into(oneshot::Sender<Result<Frame>>, BytesMut),
}

type BoxRead = Box<dyn AsyncRead + Unpin + Send>;
type BoxWrite = Box<dyn AsyncWrite + Unpin + Send>;

struct Inner {
    writer: tokio::sync::Mutex<BufWriter<BoxWrite>>,
    waiters: Mutex<HashMap<u32, Waiter>>,
    closed: Mutex<bool>,
    next_id: AtomicU32,
    pushes: Mutex<Option<mpsc::UnboundedSender<PushMessage>>>,
    /// Paths the server said it holds no callback promise on (`PUSH_NO_PROMISE`), not
    /// yet taken ([`Client::take_unpromised`]).
    unpromised: Mutex<Vec<String>>,
    /// Told when the heartbeat finds the server gone: the read loop ends the connection.
    dead: Arc<tokio::sync::Notify>,
}

/// How often a connection with [`Client::keep_alive`] pings the server.
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a heartbeat's ping may go unanswered before the server is taken for gone.
pub const HEARTBEAT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// Turns TCP keepalive on for a connection's socket: probes after 10 s idle, every 2 s,
/// 3 times (the server does the same on its end).
fn keepalive(socket: RawFd) {
    let set = |level, name, v: libc::c_int| {
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `socket` is the connection's open socket; `v` is an int of the size given.
        unsafe { libc::setsockopt(socket, level, name, (&v as *const libc::c_int).cast(), size) };
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
}

/// How to reach and authenticate to a server.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// `HOST:PORT`, as the user wrote it: the login proof covers it, so the server checks
    /// that it names the server.
    pub addr: String,
    pub credentials: Credentials,
    /// Connect with TLS, trusting the certificate(s) in this PEM file.
    pub tls_ca: Option<PathBuf>,
    /// Host name the server's certificate must carry (defaults to the host of `addr`).
    pub tls_name: Option<String>,
    /// How long to wait for the server before giving up on it.
    pub deadlines: Deadlines,
}

/// How long a client waits before it gives up on a server (or data node) that does not
/// answer: one that hangs, rather than dies, then costs a bounded wait, and reads fail
/// over to the next replica or the head. Streams are bounded by progress: each frame
/// must come (or go) within `request`, however long the whole transfer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Connecting, TLS and the handshake.
    pub connect: Duration,
    /// A request's reply; each frame of a streamed reply; each frame sent. Operations
    /// that carry out long work (`rebalance_apply`, storelet runs) are bounded by the
    /// server's own limits instead.
    pub request: Duration,
    /// One read at a data node, before the client tries the next replica or the head.
    pub node_read: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: Duration::from_secs(10),
            request: Duration::from_secs(60),
            node_read: Duration::from_secs(10),
        }
    }
}

impl ConnectOptions {
    /// Options for `url`, with credentials found as [`Credentials::find`] does and, for a
    /// `locus+tls://` URL, the CA file in `LOCUS_TLS_CA` or the local server's certificate.
    pub fn for_url(url: &LocusUrl) -> Result<ConnectOptions> {
        let authority = url.authority();
        let credentials = Credentials::find(&authority)?;
        let tls_ca = url.tls.then(|| {
            std::env::var_os("LOCUS_TLS_CA")
                .map(PathBuf::from)
                .unwrap_or_else(|| credentials::locus_home().join("server").join("cert.pem"))
        });
        Ok(ConnectOptions {
            addr: authority,
            credentials,
            tls_ca,
            tls_name: Some(url.host.clone()),
            deadlines: Deadlines::default(),
        })
    }
}

/// A connection to a Locus server. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    client_id: u64,
    subject: String,
    /// Third-party reads: where the open handles of a cluster head's large files can be
    /// read from, and the connections to data nodes.
    nodes: Arc<nodes::NodeReads>,
    /// How long to wait for the server.
    deadlines: Deadlines,
}

/// The reply of an operation sent with [`Client::start_with`], not yet waited for.
pub struct Pending<R> {
    rx: oneshot::Receiver<Result<Frame>>,
    decode: fn(&[u8]) -> Result<R>,
    /// When the reply is overdue (counted from when the request was sent), and the
    /// connection to give up on then.
    deadline: tokio::time::Instant,
    conn: std::sync::Weak<Inner>,
}

impl<R> Pending<R> {
    /// Waits for the reply (at most until its deadline).
    pub async fn wait(self) -> Result<R> {
        let decode = self.decode;
        let frame = self.frame().await?;
        decode(&frame.meta)
    }

    async fn frame(self) -> Result<Frame> {
        match tokio::time::timeout_at(self.deadline, self.rx).await {
            Ok(frame) => frame.map_err(|_| ClientError::Closed)?,
            Err(_) => Err(self.conn.upgrade().map_or(ClientError::Closed, |inner| abandon(&inner))),
        }
    }

    /// Moves the reply's deadline to `after` from now, when that is sooner (a read at a
    /// data node waits less than a request to the head).
    pub fn within(mut self, after: Duration) -> Self {
        self.deadline = self.deadline.min(tokio::time::Instant::now() + after);
        self
    }

    /// The reply if it has come, without waiting: `None` while it has not (it arrives
    /// while the connection's read loop runs).
    pub fn try_wait(&mut self) -> Option<Result<R>> {
        match self.rx.try_recv() {
            Ok(frame) => Some(frame.and_then(|f| (self.decode)(&f.meta))),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(ClientError::Closed)),
        }
    }

    /// Waits for the reply and its data (a `pread` sent ahead).
    pub async fn wait_with_data(self) -> Result<(R, Bytes)> {
        let decode = self.decode;
        let frame = self.frame().await?;
        Ok((decode(&frame.meta)?, frame.data))
    }
}

/// A listing asked for with [`Client::start_readdir`], not yet waited for. Dropping it
/// drops the pages when they come.
pub struct PendingListing {
    pages: mpsc::UnboundedReceiver<Result<Frame>>,
    /// How long each page may take, and the connection to give up on then.
    deadline: Duration,
    conn: std::sync::Weak<Inner>,
    /// The entries of the pages come so far.
    got: Vec<DirEntry>,
    /// Set once the last page (or an error) came.
    ended: Option<Result<()>>,
}

impl PendingListing {
    fn take(&mut self, frame: Result<Frame>) {
        let page = frame.and_then(|f| Ok((codec::decode::<Vec<DirEntry>>(&f.meta)?, f.header.more())));
        match page {
            Ok((entries, more)) => {
                self.got.extend(entries);
                if !more {
                    self.ended = Some(Ok(()));
                }
            }
            Err(e) => self.ended = Some(Err(e)),
        }
    }

    /// The whole listing if it has come, without waiting (pages arrive while the
    /// connection's read loop runs); `None` while it has not.
    pub fn try_entries(&mut self) -> Option<Result<&[DirEntry], &ClientError>> {
        while self.ended.is_none() {
            match self.pages.try_recv() {
                Ok(frame) => self.take(frame),
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => self.ended = Some(Err(ClientError::Closed)),
            }
        }
        self.ended.as_ref().map(|r| r.as_ref().map(|()| &self.got[..]))
    }

    /// Waits for the whole listing (each page within the request deadline).
    pub async fn wait(mut self) -> Result<Vec<DirEntry>> {
        while self.ended.is_none() {
            let frame = next_frame(&mut self.pages, self.deadline, &self.conn).await;
            self.take(frame);
        }
        self.ended.take().expect("ended").map(|()| self.got)
    }
}

/// Size of the data frames of a streamed `put`.
pub const PUT_CHUNK: usize = 1 << 20;

impl Client {
    /// Connects and authenticates, within the options' connect deadline.
    pub async fn connect(opts: &ConnectOptions) -> Result<Client> {
        match tokio::time::timeout(opts.deadlines.connect, Self::connect_now(opts)).await {
            Ok(client) => client,
            Err(_) => Err(ClientError::TimedOut(format!(
                "{} did not answer the connection within {:?}",
                opts.addr, opts.deadlines.connect
            ))),
        }
    }

    /// Connects and authenticates, however long it takes.
    async fn connect_now(opts: &ConnectOptions) -> Result<Client> {
        let tcp = TcpStream::connect(&opts.addr).await?;
        tcp.set_nodelay(true)?;
        keepalive(std::os::fd::AsRawFd::as_raw_fd(&tcp));
        let socket = opts.tls_ca.is_none().then(|| std::os::fd::AsRawFd::as_raw_fd(&tcp));
        // The login proof covers this TLS session's exporter secret (none on plain TCP).
        let mut exporter = Vec::new();
        let (r, w): (BoxRead, BoxWrite) = match &opts.tls_ca {
            None => {
                let (r, w) = tcp.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(ca) => {
                let tls = tls_connect(tcp, ca, opts).await?;
                exporter = tls
                    .get_ref()
                    .1
                    .export_keying_material(vec![0; auth::TLS_EXPORTER_LEN], auth::TLS_EXPORTER_LABEL, None)
                    .map_err(|e| ClientError::Protocol(format!("TLS exporter: {e}")))?;
                let (r, w) = tokio::io::split(tls);
                (Box::new(r), Box::new(w))
            }
        };
        let mut reader = BufReader::with_capacity(256 * 1024, r);
        let mut writer = BufWriter::with_capacity(128 * 1024, w);
        writer.write_all(&frame::preamble(frame::VERSION)).await?;
        writer.flush().await?;
        let mut pre = [0u8; 8];
        reader.read_exact(&mut pre).await?;
        // Something other than a Locus server answered at this address (another service,
        // or a middlebox while the route to ours is gone): ours may be back later, so
        // this fails as a connection does, which callers retry.
        frame::parse_preamble(&pre).map_err(|e| {
            ClientError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", opts.addr)))
        })?;

        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(writer),
            waiters: Mutex::new(HashMap::new()),
            closed: Mutex::new(false),
            next_id: AtomicU32::new(1),
            pushes: Mutex::new(None),
            unpromised: Mutex::new(Vec::new()),
            dead: Arc::new(tokio::sync::Notify::new()),
        });
        tokio::spawn(read_loop(reader, socket, Arc::downgrade(&inner), inner.dead.clone()));
        let nodes = Arc::new(nodes::NodeReads::with_deadlines(opts.deadlines));
        let mut client = Client { inner, client_id: 0, subject: String::new(), nodes, deadlines: opts.deadlines };

        let challenge = client
            .call(Hello { version: frame::VERSION, client: format!("locus-client {}", env!("CARGO_PKG_VERSION")) })
            .await?;
        // An older server would take a proof that is not bound to it: never send one.
        if challenge.version < frame::MIN_VERSION {
            return Err(ClientError::Protocol(format!(
                "the server at {} speaks Locus protocol {}, older than this client's {}: upgrade the server",
                opts.addr,
                challenge.version,
                frame::VERSION
            )));
        }
        let mut nonce = vec![0u8; auth::NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the OS provides randomness");
        let c = &opts.credentials;
        let bind = auth::Binding { server: &opts.addr, tls: &exporter };
        let proof = auth::client_proof(c.token.as_bytes(), &challenge.nonce, &nonce, &c.subject, &bind);
        let auth = Auth { subject: c.subject.clone(), nonce: nonce.clone(), proof, server: opts.addr.clone() };
        let welcome = match client.call(auth).await {
            Ok(w) => w,
            Err(ClientError::Remote(e)) => return Err(ClientError::Auth(e.message)),
            Err(e) => return Err(e),
        };
        let expected = auth::server_proof(c.token.as_bytes(), &challenge.nonce, &nonce, &c.subject, &bind);
        if !auth::proofs_equal(&expected, &welcome.proof) {
            return Err(ClientError::Auth("the server could not prove it knows the token".into()));
        }
        client.client_id = welcome.client_id;
        client.subject = welcome.subject;
        client.nodes.set_head(welcome.head, opts.tls_ca.is_none());
        Ok(client)
    }

    /// Connects to the server of a URL with credentials found for it.
    pub async fn connect_url(url: &LocusUrl) -> Result<Client> {
        Client::connect(&ConnectOptions::for_url(url)?).await
    }

    /// True once the connection has ended.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.lock()
    }

    /// This connection's id on the server (the address for pushes to it).
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// The authenticated subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Takes the paths the server said, since the last call, that it holds no callback
    /// promise on (`PUSH_NO_PROMISE`, which arrives before the reply it concerns): what
    /// those replies said may be cached only for the client's own timeout.
    pub fn take_unpromised(&self) -> Vec<String> {
        std::mem::take(&mut *self.inner.unpromised.lock())
    }

    /// Sends a heartbeat on this connection, every [`HEARTBEAT_EVERY`], while it is
    /// open: the server then keeps it only while they come (it is where callback
    /// breaks go), and a ping unanswered for [`HEARTBEAT_TIMEOUT`] ends the connection
    /// here (a frozen server or a cut link), so pushes' subscribers see the end and
    /// calls fail as transient. Needs a runtime that runs while the client is idle.
    pub fn keep_alive(&self) {
        let (weak, template) = (Arc::downgrade(&self.inner), self.clone());
        // The task must not keep the connection open: it holds it only to ping.
        let (client_id, subject, nodes) = (template.client_id, template.subject.clone(), template.nodes.clone());
        let deadlines = template.deadlines;
        drop(template);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(HEARTBEAT_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                if *inner.closed.lock() {
                    return;
                }
                let dead = inner.dead.clone();
                let client = Client { inner, client_id, subject: subject.clone(), nodes: nodes.clone(), deadlines };
                match tokio::time::timeout(HEARTBEAT_TIMEOUT, client.ping()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(ClientError::Remote(_))) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        dead.notify_one();
                        return;
                    }
                }
            }
        });
    }

    /// Messages the server pushes to this client from now on.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<PushMessage> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.inner.pushes.lock() = Some(tx);
        rx
    }

    fn register(&self, waiter: Waiter) -> Result<u32> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let closed = self.inner.closed.lock();
        if *closed {
            return Err(ClientError::Closed);
        }
        self.inner.waiters.lock().insert(id, waiter);
        Ok(id)
    }

    async fn send(&self, op: u16, id: u32, more: bool, meta: &[u8], data: &[u8]) -> Result<()> {
        let h = Header {
            kind: Kind::Request,
            flags: if more { FLAG_MORE } else { 0 },
            op,
            id,
            meta_len: meta.len() as u32,
            data_len: data.len() as u32,
        };
        // A peer that stops reading fills the socket: a frame that cannot go out within
        // the request deadline gives the connection up (a frame may be half sent).
        let written = tokio::time::timeout(self.deadlines.request, async {
            let mut w = self.inner.writer.lock().await;
            w.write_all(&h.encode()).await?;
            w.write_all(meta).await?;
            w.write_all(data).await?;
            w.flush().await
        })
        .await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.inner.waiters.lock().remove(&id);
                Err(e.into())
            }
            Err(_) => Err(abandon(&self.inner)),
        }
    }

    /// Waits for a single reply within `limit`; gives the connection up if it does not
    /// come (the server, or the link, hangs).
    async fn reply_within(&self, limit: Option<Duration>, rx: oneshot::Receiver<Result<Frame>>) -> Result<Frame> {
        let Some(limit) = limit else { return rx.await.map_err(|_| ClientError::Closed)? };
        match tokio::time::timeout(limit, rx).await {
            Ok(frame) => frame.map_err(|_| ClientError::Closed)?,
            Err(_) => Err(abandon(&self.inner)),
        }
    }

    /// The deadline of operation `op`'s reply: none for operations that carry out long
    /// work the server bounds itself.
    fn deadline_of(&self, op: u16) -> Option<Duration> {
        let long = [<RebalanceApply as Operation>::INFO.code, <RebalancePlan as Operation>::INFO.code];
        (!long.contains(&op)).then_some(self.deadlines.request)
    }

    /// This connection's deadlines.
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }

    /// Sends one request frame without waiting for (or routing) any reply; returns its id.
    /// For protocol tests and tools that drive frames by hand.
    pub async fn send_request(&self, op: u16, meta: &[u8], data: &[u8], more: bool) -> Result<u32> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(op, id, more, meta, data).await?;
        Ok(id)
    }

    /// Sends a request with bulk data and waits for its single reply frame.
    pub async fn call_raw(&self, op: u16, meta: &[u8], data: &[u8]) -> Result<Frame> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Waiter::One(tx))?;
        self.send(op, id, false, meta, data).await?;
        self.reply_within(self.deadline_of(op), rx).await
    }

    /// Runs an operation and decodes its reply.
    pub async fn call<O: Operation>(&self, req: O) -> Result<O::Reply> {
        Ok(self.call_with(req, &[]).await?.0)
    }

    /// Runs an operation with request data; returns the reply and the reply's data.
    pub async fn call_with<O: Operation>(&self, req: O, data: &[u8]) -> Result<(O::Reply, Bytes)> {
        let f = self.call_raw(O::INFO.code, &codec::encode(&req), data).await?;
        Ok((codec::decode(&f.meta)?, f.data))
    }

    /// Sends an operation and answers at once, without waiting for its reply, which
    /// [`Pending::wait`] collects later: writes behind. The server runs the requests of
    /// one connection in order, so later requests see the operation's effect.
    pub async fn start_with<O: Operation>(&self, req: O, data: &[u8]) -> Result<Pending<O::Reply>> {
        self.start_as(req, data, Waiter::One).await
    }

    /// [`Client::start_with`] with the reply routed by the waiter `waiter` makes.
    async fn start_as<O: Operation>(
        &self,
        req: O,
        data: &[u8],
        waiter: impl FnOnce(oneshot::Sender<Result<Frame>>) -> Waiter,
    ) -> Result<Pending<O::Reply>> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(waiter(tx))?;
        self.send(O::INFO.code, id, false, &codec::encode(&req), data).await?;
        Ok(Pending {
            rx,
            decode: |meta| Ok(codec::decode::<O::Reply>(meta)?),
            deadline: tokio::time::Instant::now() + self.deadlines.request,
            conn: Arc::downgrade(&self.inner),
        })
    }

    /// Runs a streamed-reply operation; frames arrive on the returned channel until one
    /// without the MORE flag.
    pub async fn call_stream<O: Operation>(&self, req: O) -> Result<mpsc::UnboundedReceiver<Result<Frame>>> {
        self.call_stream_with(req, &[]).await
    }

    /// [`Client::call_stream`] with request data.
    pub async fn call_stream_with<O: Operation>(
        &self,
        req: O,
        data: &[u8],
    ) -> Result<mpsc::UnboundedReceiver<Result<Frame>>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.register(Waiter::Many(tx))?;
        self.send(O::INFO.code, id, false, &codec::encode(&req), data).await?;
        Ok(rx)
    }

    /// Turns callbacks on for this connection (at most `max` promises): the server then
    /// tells the connection whose id is `to` (0: this one), in `PUSH_BREAK` pushes, when
    /// a path this connection asked about changes. Answers the number of promises granted.
    pub async fn callbacks(&self, max: u32, to: u64) -> Result<u32> {
        self.call(Callbacks { max, to }).await
    }

    /// Round trip of the protocol itself.
    pub async fn ping(&self) -> Result<()> {
        self.call(Ping {}).await
    }

    /// Attributes of `path`, following symlinks.
    pub async fn stat(&self, path: &str) -> Result<Attr> {
        self.call(Stat { path: path.into() }).await
    }

    /// Attributes of `path` itself.
    pub async fn lstat(&self, path: &str) -> Result<Attr> {
        self.call(Lstat { path: path.into() }).await
    }

    /// Attributes of an open handle.
    pub async fn fstat(&self, handle: u64) -> Result<Attr> {
        self.call(Fstat { handle }).await
    }

    /// Opens `path` with `open_flags`; returns the handle and attributes.
    ///
    /// On a cluster head, a large file's reply says where its bytes are; reads of the
    /// handle then go straight to the data nodes (see [`Client::pread`]).
    pub async fn open(&self, path: &str, flags: u32, mode: u32) -> Result<Opened> {
        let opened = self.call(Open { path: path.into(), flags, mode }).await?;
        if let Some(location) = &opened.location {
            self.nodes.remember(opened.handle, location.clone());
        }
        Ok(opened)
    }

    /// Closes a handle.
    pub async fn close(&self, handle: u64) -> Result<()> {
        self.nodes.forget(handle);
        self.call(Close { handle }).await
    }

    /// Forgets where a handle's bytes are (for callers that send `close` themselves).
    pub fn forget_location(&self, handle: u64) {
        self.nodes.forget(handle);
    }

    /// Reads up to `len` bytes at `offset` (fewer at end of file): from the data nodes
    /// when the handle has a location and one answers, else from the server.
    pub async fn pread(&self, handle: u64, offset: u64, len: u32) -> Result<Bytes> {
        if let Some(location) = self.nodes.location(handle) {
            match self.nodes.read(&location, offset, len).await {
                Ok(data) => return Ok(data),
                // The head serves the bytes itself from here on.
                Err(_) => self.nodes.forget(handle),
            }
        }
        Ok(self.call_with(Pread { handle, offset, len }, &[]).await?.1)
    }

    /// Sends a read ahead of need: to a data node when the handle has a location (its
    /// reply's data holds the bytes, as a `pread`'s does), else to the server.
    pub async fn pread_ahead(&self, handle: u64, offset: u64, len: u32) -> Result<Pending<()>> {
        if let Some(location) = self.nodes.location(handle) {
            if let Ok(p) = self.nodes.read_ahead(&location, offset, len).await {
                return Ok(p);
            }
            self.nodes.forget(handle);
        }
        self.start_with(Pread { handle, offset, len }, &[]).await
    }

    /// [`Client::pread_ahead`] whose reply is received straight into `dest`, an empty
    /// buffer with room for `len` bytes: the data of the reply is then `dest` frozen (its
    /// pointer is `dest`'s), with no copy out of the connection's receive buffer. Reads
    /// of a data node's handle, and replies larger than `dest`, arrive elsewhere.
    pub async fn pread_into(&self, handle: u64, offset: u64, len: u32, dest: BytesMut) -> Result<Pending<()>> {
        if self.nodes.location(handle).is_some() || dest.capacity() - dest.len() < len as usize {
            return self.pread_ahead(handle, offset, len).await;
        }
        self.start_as(Pread { handle, offset, len }, &[], |tx| Waiter::Into(tx, dest)).await
    }

    /// Writes `data` at `offset`.
    pub async fn pwrite(&self, handle: u64, offset: u64, data: &[u8]) -> Result<u64> {
        Ok(self.call_with(Pwrite { handle, offset }, data).await?.0)
    }

    /// Writes `data` at `offset` without waiting for the answer (see [`Client::start_with`]).
    pub async fn pwrite_behind(&self, handle: u64, offset: u64, data: &[u8]) -> Result<Pending<u64>> {
        self.start_with(Pwrite { handle, offset }, data).await
    }

    /// Sets a file's times and answers its attributes afterwards (of the open `handle`
    /// if given), both requests in flight at once: one round trip.
    pub async fn utimes_stat(&self, path: &str, atime: SetTime, mtime: SetTime, handle: Option<u64>) -> Result<Attr> {
        let stat = async {
            match handle {
                Some(h) => self.fstat(h).await,
                None => self.lstat(path).await,
            }
        };
        let (set, attr) = tokio::join!(self.utimes(path, atime, mtime), stat);
        set?;
        attr
    }

    /// Lists a directory with attributes.
    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.start_readdir(path).await?.wait().await
    }

    /// Asks for a directory's listing without waiting for it: a client that expects to
    /// read several directories soon (a tree walk) sends for them all at once.
    pub async fn start_readdir(&self, path: &str) -> Result<PendingListing> {
        let pages = self.call_stream(Readdir { path: path.into() }).await?;
        let (deadline, conn) = (self.deadlines.request, Arc::downgrade(&self.inner));
        Ok(PendingListing { pages, deadline, conn, got: Vec::new(), ended: None })
    }

    /// Streams the file at `path` into `sink`, calling `progress` with the byte count so
    /// far after each chunk; returns the file's attributes.
    pub async fn get(
        &self,
        path: &str,
        sink: &mut (impl AsyncWrite + Unpin),
        mut progress: impl FnMut(u64, &Attr),
    ) -> Result<Attr> {
        if self.nodes.is_head() {
            let located = self.call(Locate { path: path.into() }).await?;
            if let Some(location) = located.location {
                return nodes::get(self, path, &located.attr, &location, sink, &mut progress).await;
            }
        }
        let mut rx = self.call_stream(Get { path: path.into() }).await?;
        let (limit, conn) = (self.deadlines.request, Arc::downgrade(&self.inner));
        let first = next_frame(&mut rx, limit, &conn).await?;
        let attr: Attr = codec::decode(&first.meta)?;
        let mut more = first.header.more();
        let mut done = 0u64;
        while more {
            let frame = next_frame(&mut rx, limit, &conn).await?;
            sink.write_all(&frame.data).await?;
            done += frame.data.len() as u64;
            progress(done, &attr);
            more = frame.header.more();
        }
        sink.flush().await?;
        Ok(attr)
    }

    /// Reads a whole file into memory.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.get(path, &mut out, |_, _| {}).await?;
        Ok(out)
    }

    /// Streams `source` to `path` (mode `mode`), replacing it atomically when done;
    /// calls `progress` with the byte count after each chunk.
    pub async fn put(
        &self,
        path: &str,
        mode: u32,
        source: &mut (impl AsyncRead + Unpin),
        progress: impl FnMut(u64),
    ) -> Result<Attr> {
        self.upload(Put { path: path.into(), mode }, source, progress).await
    }

    /// Streams `source` as the data of a `StreamIn` request (`put`, `object_put`).
    pub async fn upload<O: Operation>(
        &self,
        req: O,
        source: &mut (impl AsyncRead + Unpin),
        mut progress: impl FnMut(u64),
    ) -> Result<O::Reply> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Waiter::One(tx))?;
        let meta = codec::encode(&req);
        let mut chunk = vec![0u8; PUT_CHUNK];
        let mut next = vec![0u8; PUT_CHUNK];
        let mut n = read_full(source, &mut chunk).await?;
        let mut sent = 0u64;
        let mut first = true;
        loop {
            // Read ahead one chunk so the last frame can be flagged as such.
            let m = if n == PUT_CHUNK { read_full(source, &mut next).await? } else { 0 };
            let more = m > 0;
            self.send(O::INFO.code, id, more, if first { &meta } else { &[] }, &chunk[..n]).await?;
            sent += n as u64;
            progress(sent);
            first = false;
            if !more {
                break;
            }
            std::mem::swap(&mut chunk, &mut next);
            n = m;
        }
        let f = self.reply_within(self.commit_deadline(sent), rx).await?;
        Ok(codec::decode(&f.meta)?)
    }

    /// [`Self::upload`] of bytes already in memory: the frames are cut from `data`
    /// itself (a small file's store costs no staging buffers of a chunk each).
    pub async fn upload_bytes<O: Operation>(&self, req: O, data: &[u8]) -> Result<O::Reply> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Waiter::One(tx))?;
        let meta = codec::encode(&req);
        let mut chunks = data.chunks(PUT_CHUNK).peekable();
        let mut first: &[u8] = &meta;
        loop {
            let chunk = chunks.next().unwrap_or_default();
            let more = chunks.peek().is_some();
            self.send(O::INFO.code, id, more, std::mem::take(&mut first), chunk).await?;
            if !more {
                break;
            }
        }
        let f = self.reply_within(self.commit_deadline(data.len() as u64), rx).await?;
        Ok(codec::decode(&f.meta)?)
    }

    /// How long the reply to an upload of `bytes` may take once they are sent: the
    /// server stores them (a cluster head, on its data nodes) before it answers, so the
    /// request deadline grows by a second per 10 MiB.
    fn commit_deadline(&self, bytes: u64) -> Option<Duration> {
        Some(self.deadlines.request + Duration::from_secs(bytes / (10 << 20)))
    }

    /// Writes a whole file from memory.
    pub async fn write_file(&self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        self.upload_bytes(Put { path: path.into(), mode }, data).await
    }

    /// Writes a whole file from memory without the server waiting for its disk
    /// (`put_cached`): what a close stores, where only `fsync` promises durability.
    pub async fn write_file_cached(&self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        self.upload_bytes(PutCached { path: path.into(), mode }, data).await
    }

    /// Creates a directory.
    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        self.call(Mkdir { path: path.into(), mode }).await
    }

    /// Removes an empty directory.
    pub async fn rmdir(&self, path: &str) -> Result<()> {
        self.call(Rmdir { path: path.into() }).await
    }

    /// Removes a file, symlink or other non-directory.
    pub async fn unlink(&self, path: &str) -> Result<()> {
        self.call(Unlink { path: path.into() }).await
    }

    /// Renames `from` to `to`.
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.call(Rename { from: from.into(), to: to.into() }).await
    }

    /// Creates a symlink at `path` pointing to `target`.
    pub async fn symlink(&self, target: &str, path: &str) -> Result<()> {
        self.call(Symlink { target: target.into(), path: path.into() }).await
    }

    /// The target of a symlink.
    pub async fn readlink(&self, path: &str) -> Result<String> {
        self.call(Readlink { path: path.into() }).await
    }

    /// Creates a hard link.
    pub async fn link(&self, from: &str, to: &str) -> Result<()> {
        self.call(Link { from: from.into(), to: to.into() }).await
    }

    /// Sets a file's size.
    pub async fn truncate(&self, path: &str, size: u64) -> Result<()> {
        self.call(Truncate { path: path.into(), size }).await
    }

    /// Sets permission bits.
    pub async fn chmod(&self, path: &str, mode: u32) -> Result<()> {
        self.call(Chmod { path: path.into(), mode }).await
    }

    /// Sets access and modification times.
    pub async fn utimes(&self, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        self.call(Utimes { path: path.into(), atime, mtime }).await
    }

    /// Flushes an open file to stable storage.
    pub async fn fsync(&self, handle: u64) -> Result<()> {
        self.call(Fsync { handle }).await
    }

    /// Sets an open file's size.
    pub async fn ftruncate(&self, handle: u64, size: u64) -> Result<()> {
        self.call(Ftruncate { handle, size }).await
    }

    /// File-system statistics.
    pub async fn statfs(&self, path: &str) -> Result<StatFs> {
        self.call(Statfs { path: path.into() }).await
    }

    /// Checks access (R=4, W=2, X=1, 0 for existence).
    pub async fn access(&self, path: &str, mode: u32) -> Result<()> {
        self.call(Access { path: path.into(), mode }).await
    }

    /// The ACL in force on a directory.
    pub async fn acl_get(&self, path: &str) -> Result<Vec<AclEntry>> {
        self.call(AclGet { path: path.into() }).await
    }

    /// Sets a subject's rights on a directory.
    pub async fn acl_set(&self, path: &str, subject: &str, rights: Rights) -> Result<()> {
        self.call(AclSet { path: path.into(), subject: subject.into(), rights }).await
    }

    /// Server statistics with the `top` busiest files.
    pub async fn stats(&self, top: u32) -> Result<StatsReport> {
        self.call(Stats { top }).await
    }

    /// Registers a Lua script; returns its id (the SHA-256 of the source).
    pub async fn script_register(&self, source: &str) -> Result<String> {
        self.call(ScriptRegister { source: source.into() }).await
    }

    /// Calls a registered script by id with arguments and an input buffer; returns its
    /// results and its output buffer.
    pub async fn script_call_id(&self, id: &str, args: Vec<Value>, input: &[u8]) -> Result<(Vec<Value>, Bytes)> {
        self.call_with(ScriptCall { id: id.into(), source: None, args }, input).await
    }

    /// Calls the script `source` by its id; if the server does not know it (never
    /// registered, or evicted from its cache) the call is repeated with the source,
    /// which registers it. One round trip in the common case.
    pub async fn script_call(&self, source: &str, args: Vec<Value>, input: &[u8]) -> Result<(Vec<Value>, Bytes)> {
        let id = script_id(source);
        match self.script_call_id(&id, args.clone(), input).await {
            Err(ClientError::Remote(e)) if e.code == locus_proto::Code::NO_SCRIPT => {
                self.call_with(ScriptCall { id, source: Some(source.into()), args }, input).await
            }
            other => other,
        }
    }

    /// Starts a WebAssembly module (WASI preview 1) at the server with the directory
    /// `dir` preopened as `/` (writable if `write`); its events arrive as it runs.
    pub async fn storelet_start(
        &self,
        module: &[u8],
        dir: &str,
        args: Vec<String>,
        write: bool,
    ) -> Result<StoreletRun> {
        self.storelet_start_env(module, dir, args, Vec::new(), write).await
    }

    /// [`Client::storelet_start`] with environment variables.
    pub async fn storelet_start_env(
        &self,
        module: &[u8],
        dir: &str,
        args: Vec<String>,
        env: Vec<(String, String)>,
        write: bool,
    ) -> Result<StoreletRun> {
        let frames = self.call_stream_with(ops::StoreletRun { args, env, dir: dir.into(), write }, module).await?;
        Ok(StoreletRun { frames, done: false })
    }

    /// Runs a storelet to the end and collects its output and account.
    pub async fn storelet_run(
        &self,
        module: &[u8],
        dir: &str,
        args: Vec<String>,
        write: bool,
    ) -> Result<StoreletOutput> {
        let mut run = self.storelet_start(module, dir, args, write).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(update) = run.next().await? {
            match update {
                StoreletUpdate::Started { .. } => {}
                StoreletUpdate::Stdout(b) => stdout.extend_from_slice(&b),
                StoreletUpdate::Stderr(b) => stderr.extend_from_slice(&b),
                StoreletUpdate::Finished(result) => return Ok(StoreletOutput { result, stdout, stderr }),
            }
        }
        Err(ClientError::Closed)
    }

    /// The active-file handlers the server has registered.
    pub async fn handlers(&self) -> Result<Vec<HandlerInfo>> {
        self.call(Handlers {}).await
    }

    /// Storelet runs queued or running (the caller's own; all of them for an admin).
    pub async fn storelet_ps(&self) -> Result<Vec<StoreletRunInfo>> {
        self.call(StoreletPs {}).await
    }

    /// Cancels a storelet run.
    pub async fn storelet_cancel(&self, run: u64) -> Result<()> {
        self.call(StoreletCancel { run }).await
    }

    /// Storelet accounts (the caller's own; everyone's for an admin).
    pub async fn storelet_stats(&self) -> Result<StoreletReport> {
        self.call(StoreletStats {}).await
    }

    /// The subject the server knows this connection as.
    pub async fn whoami(&self) -> Result<String> {
        self.call(Whoami {}).await
    }
}

/// What a running storelet reports.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreletUpdate {
    /// It left the server's queue; `run` names it for [`Client::storelet_cancel`].
    Started {
        run: u64,
        module: String,
    },
    Stdout(Bytes),
    Stderr(Bytes),
    /// It ended; its account. Nothing follows.
    Finished(StoreletResult),
}

/// A storelet run in progress; read its updates with [`StoreletRun::next`].
pub struct StoreletRun {
    frames: mpsc::UnboundedReceiver<Result<Frame>>,
    done: bool,
}

impl StoreletRun {
    /// The next update, `None` after [`StoreletUpdate::Finished`]. A run stopped by a
    /// limit or cancelled ends with an error (code `LIMIT` or `CANCELED`).
    pub async fn next(&mut self) -> Result<Option<StoreletUpdate>> {
        if self.done {
            return Ok(None);
        }
        let frame = match self.frames.recv().await {
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                self.done = true;
                return Err(e);
            }
            None => return Err(ClientError::Closed),
        };
        self.done = !frame.header.more();
        Ok(Some(match codec::decode::<StoreletEvent>(&frame.meta)? {
            StoreletEvent::Started { run, module } => StoreletUpdate::Started { run, module },
            StoreletEvent::Stdout => StoreletUpdate::Stdout(frame.data),
            StoreletEvent::Stderr => StoreletUpdate::Stderr(frame.data),
            StoreletEvent::Finished(r) => StoreletUpdate::Finished(r),
        }))
    }
}

/// A finished storelet run: its account and everything it wrote.
#[derive(Debug, Clone)]
pub struct StoreletOutput {
    pub result: StoreletResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The id of a script: the SHA-256 of its source, in hex (as the server computes it).
pub fn script_id(source: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(source.as_bytes()))
}

/// The next frame of a streamed reply, within `limit` of asking; gives the connection
/// up if none comes (a stream that makes progress is never cut).
async fn next_frame(
    rx: &mut mpsc::UnboundedReceiver<Result<Frame>>,
    limit: Duration,
    conn: &std::sync::Weak<Inner>,
) -> Result<Frame> {
    match tokio::time::timeout(limit, rx.recv()).await {
        Ok(frame) => frame.unwrap_or(Err(ClientError::Closed)),
        Err(_) => Err(conn.upgrade().map_or(ClientError::Closed, |inner| abandon(&inner))),
    }
}

/// Gives a connection up after a reply did not come in time: it is closed to new
/// requests, every request waiting on it fails with [`ClientError::TimedOut`] (their
/// fate is unknown), and its sending side is shut so the server ends it when it wakes.
/// Answers the error for the request that timed out.
fn abandon(inner: &Arc<Inner>) -> ClientError {
    let why = || ClientError::TimedOut("the server did not answer in time; the connection was given up".into());
    *inner.closed.lock() = true;
    inner.pushes.lock().take();
    for (_, w) in inner.waiters.lock().drain() {
        match w {
            Waiter::One(tx) | Waiter::Into(tx, _) => drop(tx.send(Err(why()))),
            Waiter::Many(tx) => drop(tx.send(Err(why()))),
        }
    }
    let inner = inner.clone();
    tokio::spawn(async move {
        let shut = async { inner.writer.lock().await.get_mut().shutdown().await };
        let _ = tokio::time::timeout(Duration::from_secs(1), shut).await;
    });
    why()
}

async fn read_full(r: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let m = r.read(&mut buf[n..]).await?;
        if m == 0 {
            break;
        }
        n += m;
    }
    Ok(n)
}

/// Reads one frame; its data goes into the buffer `dest_for` gives for its header when
/// that has room, else into space split off `pool`.
async fn read_frame(
    r: &mut BufReader<BoxRead>,
    socket: Option<RawFd>,
    pool: &mut BytesMut,
    dest_for: impl FnOnce(&Header) -> Option<BytesMut>,
) -> Result<Frame> {
    let mut head = [0u8; HEADER_LEN];
    r.read_exact(&mut head).await?;
    let header = Header::decode(&head, Limits::CLIENT).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let meta = read_exact_buf(r, None, pool, header.meta_len as usize).await?;
    let len = header.data_len as usize;
    let data = match dest_for(&header).filter(|d| d.capacity() - d.len() >= len) {
        Some(mut dest) => {
            read_into(r, socket, &mut dest, len).await?;
            dest.freeze()
        }
        None => read_exact_buf(r, socket, pool, len).await?,
    };
    Ok(Frame { header, meta, data })
}

/// The buffer a reply's data should be received into: the one its waiter registered
/// with [`Client::pread_into`], if any.
fn registered_dest(inner: &std::sync::Weak<Inner>, header: &Header) -> Option<BytesMut> {
    if header.kind != Kind::Reply || header.data_len == 0 {
        return None;
    }
    match inner.upgrade()?.waiters.lock().get_mut(&header.id) {
        Some(Waiter::Into(_, dest)) => Some(std::mem::take(dest)),
        _ => None,
    }
}

/// Bodies at least this large are read with the socket's low-water mark raised.
const LOWAT_MIN: usize = 1 << 20;
/// The low-water mark while such a body arrives: the reader is woken once per this many
/// bytes, not once per segment (a wake-up that crosses CPUs costs tens of µs in a VM).
const LOWAT: usize = 256 << 10;

/// Sets the socket's receive low-water mark (`SO_RCVLOWAT`): it is readable once this
/// many bytes wait. The socket belongs to this connection and outlives its reader.
fn set_rcvlowat(socket: RawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `socket` is the connection's open socket; `v` is an int of the size given.
    unsafe { libc::setsockopt(socket, libc::SOL_SOCKET, libc::SO_RCVLOWAT, (&v as *const libc::c_int).cast(), size) };
}

/// Reads exactly `len` bytes, without zero-filling, into space split off `pool`. Once
/// every `Bytes` split from the pool is dropped, `reserve` reuses its memory, so a long
/// transfer does not fault in fresh pages for every frame.
async fn read_exact_buf(
    r: &mut BufReader<BoxRead>,
    socket: Option<RawFd>,
    pool: &mut BytesMut,
    len: usize,
) -> Result<Bytes> {
    pool.clear();
    pool.reserve(len.max(POOL_MIN));
    read_into(r, socket, pool, len).await?;
    Ok(pool.split_to(len).freeze())
}

/// Appends exactly `len` bytes to `buf`, which has room for them.
async fn read_into(r: &mut BufReader<BoxRead>, socket: Option<RawFd>, buf: &mut BytesMut, len: usize) -> Result<()> {
    use bytes::BufMut;
    let end = buf.len() + len;
    let lowat = socket.filter(|_| len >= LOWAT_MIN);
    let mut mark = 1;
    while buf.len() < end {
        let want = end - buf.len();
        if let Some(s) = lowat {
            // Never more than what is still to come, or the last piece would never wake us;
            // set only when it changes (once a body, then lowered near its end).
            let next = want.saturating_sub(r.buffer().len()).clamp(1, LOWAT);
            if next != mark {
                set_rcvlowat(s, next);
                mark = next;
            }
        }
        if r.read_buf(&mut (&mut *buf).limit(want)).await? == 0 {
            return Err(ClientError::Closed);
        }
    }
    if let (Some(s), true) = (lowat, mark != 1) {
        set_rcvlowat(s, 1);
    }
    Ok(())
}

/// Smallest reservation of the receive pool, so small frames share one allocation.
const POOL_MIN: usize = 4 << 20;

/// Routes frames from the server to their waiters until the connection ends, then fails
/// every request still waiting.
async fn read_loop(
    mut reader: BufReader<BoxRead>,
    socket: Option<RawFd>,
    inner: std::sync::Weak<Inner>,
    dead: Arc<tokio::sync::Notify>,
) {
    let mut pool = BytesMut::new();
    loop {
        let frame = tokio::select! {
            f = read_frame(&mut reader, socket, &mut pool, |h| registered_dest(&inner, h)) => f,
            // The heartbeat found the server gone.
            _ = dead.notified() => Err(ClientError::Closed),
        };
        let Some(inner) = inner.upgrade() else { return };
        let frame = match frame {
            Ok(f) => f,
            Err(_) => {
                *inner.closed.lock() = true;
                // Subscribers see the end of their pushes.
                inner.pushes.lock().take();
                for (_, w) in inner.waiters.lock().drain() {
                    match w {
                        Waiter::One(tx) | Waiter::Into(tx, _) => drop(tx.send(Err(ClientError::Closed))),
                        Waiter::Many(tx) => drop(tx.send(Err(ClientError::Closed))),
                    }
                }
                return;
            }
        };
        if frame.header.kind == Kind::Push {
            if frame.header.op == frame::PUSH_NO_PROMISE {
                if let Ok(paths) = codec::decode::<Vec<String>>(&frame.meta) {
                    let mut unpromised = inner.unpromised.lock();
                    unpromised.extend(paths);
                    // Kept for a caller that takes them; bounded for one that does not.
                    let over = unpromised.len().saturating_sub(4096);
                    unpromised.drain(..over);
                }
            }
            if let Some(tx) = inner.pushes.lock().as_ref() {
                let _ = tx.send(PushMessage { topic: frame.header.op, meta: frame.meta, data: frame.data });
            }
            continue;
        }
        let id = frame.header.id;
        let result = if frame.header.kind == Kind::Error {
            match codec::decode::<WireError>(&frame.meta) {
                Ok(e) => Err(ClientError::Remote(e)),
                Err(e) => Err(ClientError::Protocol(e.message)),
            }
        } else {
            Ok(frame)
        };
        let mut waiters = inner.waiters.lock();
        let last = result.as_ref().map_or(true, |f| !f.header.more());
        match waiters.get(&id) {
            Some(Waiter::Many(tx)) => {
                let _ = tx.send(result);
                if last {
                    waiters.remove(&id);
                }
            }
            Some(Waiter::One(_) | Waiter::Into(..)) => {
                if let Some(Waiter::One(tx) | Waiter::Into(tx, _)) = waiters.remove(&id) {
                    let _ = tx.send(result);
                }
            }
            None => {} // a reply nobody waits for any more
        }
    }
}

async fn tls_connect(
    tcp: TcpStream,
    ca: &std::path::Path,
    opts: &ConnectOptions,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let pem = std::fs::read(ca).map_err(|e| ClientError::Config(format!("TLS CA file {}: {e}", ca.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| ClientError::Config(format!("TLS CA file: {e}")))?;
        roots.add(cert).map_err(|e| ClientError::Config(format!("TLS CA file: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = opts.tls_name.clone().unwrap_or_else(|| {
        opts.addr.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']']).to_string()).unwrap_or_default()
    });
    let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| ClientError::Config(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    Ok(connector.connect(name, tcp).await?)
}

/// An [`AsyncWrite`] that discards bytes but counts them (for benchmarks and `get` to nowhere).
#[derive(Default)]
pub struct CountingSink(pub u64);

impl AsyncWrite for CountingSink {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.0 += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
