//! The Locus client library: an async [`Client`] over one connection, with pipelining
//! (any number of requests in flight, matched to replies by id) and typed calls derived
//! from the operation table, plus a [`blocking::Client`] facade for synchronous code.
//!
//! - [`Client::call`] runs any operation of the table: `client.call(Stat { path })`.
//! - Named helpers (`stat`, `pread`, `get`, `put`, ...) cover the common cases.
//! - [`url`]: `locus://HOST:PORT/path` URLs. [`credentials`]: where tokens come from.
//! - [`error`]: [`ClientError`], with the errno a program should see.
//!
//! Inside: `connect` makes a connection (TLS, preamble, login), `pending` registers and
//! sends requests and awaits their replies within deadlines, `receive` is the loop that
//! routes the server's frames to them, `storelets` holds the script and storelet calls,
//! [`nodes`] the third-party reads from a cluster's data nodes, `put_stream` uploads
//! whose bytes are given as they are made ([`PutStream`]); this file holds the
//! connection's state and the file-system calls.

pub mod blocking;
mod connect;
pub mod credentials;
pub mod error;
pub mod nodes;
mod options;
mod pending;
mod put_stream;
mod receive;
pub mod script_cache;
mod storelets;
mod tp_write;
pub mod url;

pub use credentials::Credentials;
pub use error::{ClientError, Result};
pub use locus_proto::ops;
pub use locus_proto::types;
pub use tp_write::TP_WRITE_MIN;
pub use url::LocusUrl;

use bytes::{Bytes, BytesMut};
use locus_proto::frame::Header;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{codec, Operation};
use parking_lot::Mutex;
use receive::{next_frame, ReadAhead};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};

pub use connect::{HEARTBEAT_EVERY, HEARTBEAT_TIMEOUT};
pub use options::{host_of, ConnectOptions, Deadlines};
pub use pending::{Pending, PendingListing};
pub use put_stream::PutStream;
pub use storelets::{script_id, StoreletOutput, StoreletRun, StoreletUpdate};

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
    /// A cluster head's word on the namespace's heads (see [`Client::heads`]).
    heads: Vec<String>,
}

/// Ends one connection when told to ([`Client::ender`]).
#[derive(Clone)]
pub struct ConnectionEnder(Arc<tokio::sync::Notify>);

impl ConnectionEnder {
    /// Ends the connection: its waiting requests fail, and so does every later one.
    pub fn end(&self) {
        self.0.notify_one();
    }
}

/// Size of the data frames of a streamed `put`.
pub const PUT_CHUNK: usize = 1 << 20;

/// How many request deadlines a [`Client::copy`] may wait for its reply.
pub const COPY_WAIT: u32 = 30;

impl Client {
    /// True once the connection has ended.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.lock()
    }

    /// This connection's id on the server (the address for pushes to it).
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// On a cluster head: the namespace's heads heard from lately (addresses, the one
    /// connected to among them), where a client may go on when this one is gone.
    pub fn heads(&self) -> &[String] {
        &self.heads
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

    /// A handle that ends this connection from anywhere (another thread, another
    /// runtime): the requests waiting on it fail at once, as when the connection is lost
    /// (transient). For a caller that learns by other means that the link is dead (the
    /// mount's callback listener, whose heartbeat found it silent), without pinging a
    /// connection that may be busy with bulk data.
    pub fn ender(&self) -> ConnectionEnder {
        ConnectionEnder(self.inner.dead.clone())
    }

    /// Messages the server pushes to this client from now on.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<PushMessage> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.inner.pushes.lock() = Some(tx);
        rx
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
        let mut chunks = ReadAhead::new(source).await?;
        let (mut sent, mut first) = (0u64, true);
        while let Some((chunk, more)) = chunks.next().await? {
            self.send(O::INFO.code, id, more, if first { &meta } else { &[] }, chunk).await?;
            sent += chunk.len() as u64;
            progress(sent);
            first = false;
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
    /// On a cluster head, one of at least [`TP_WRITE_MIN`] bytes goes straight to the
    /// data nodes (a third-party write).
    pub async fn write_file(&self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        if let Some(target) = self.write_target(path, mode, data.len() as u64).await? {
            return self.write_to_nodes(path, mode, target, &mut &data[..], |_| {}).await;
        }
        self.upload_bytes(Put { path: path.into(), mode }, data).await
    }

    /// Writes a whole file from memory without the server waiting for its disk
    /// (`put_cached`): what a close stores, where only `fsync` promises durability.
    /// On a cluster head (where every write is durable), as [`Client::write_file`].
    pub async fn write_file_cached(&self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        if let Some(target) = self.write_target(path, mode, data.len() as u64).await? {
            return self.write_to_nodes(path, mode, target, &mut &data[..], |_| {}).await;
        }
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

    /// Copies the file `from` to `to` at the server (`copy`): its bytes never cross the
    /// network, and `to` is replaced atomically as a `put` replaces it. Answers the
    /// copy's attributes. The server answers once every byte is copied, so the reply may
    /// take [`COPY_WAIT`] times the request deadline (a large file on a slow disk).
    pub async fn copy(&self, from: &str, to: &str) -> Result<Attr> {
        self.call_within(CopyFile { from: from.into(), to: to.into() }, self.deadlines.request * COPY_WAIT).await
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

    /// The subject the server knows this connection as.
    pub async fn whoami(&self) -> Result<String> {
        self.call(Whoami {}).await
    }
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
