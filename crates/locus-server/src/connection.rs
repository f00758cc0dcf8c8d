//! One connection from accept to close: its thread and runtime, the frame loop that reads
//! requests and hands them to the session ([`Connection`]), replies written in order or
//! later, pushes (callback breaks, events) forwarded, keepalive and heartbeats.

use crate::dispatch::{self, Encoded};
use crate::session::Session;
use crate::session_io::{reply_later, Connection, Outbox};
use crate::transport::{FrameWriter, IdlePoll, ReadHalf, WriteHalf};
use crate::{login, splice, Push, PushQueue, Shared, DRAIN_TIMEOUT};
use bytes::{Bytes, BytesMut};
use locus_proto::frame::{self, Header, Kind, HEADER_LEN};
use locus_proto::{codec, Code, Error as WireError, Limits};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// TCP keepalive on every connection (both ends set it): probes after this much idle
/// time, then every [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`] times, so a peer whose
/// host vanished is noticed even with no heartbeat.
pub const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_PROBES: u32 = 3;

/// Turns TCP keepalive on for `socket` ([`KEEPALIVE_IDLE`]); failures are only logged.
fn keepalive(socket: &TcpStream) {
    use rustix::net::sockopt;
    let set = sockopt::set_socket_keepalive(socket, true)
        .and_then(|()| sockopt::set_tcp_keepidle(socket, KEEPALIVE_IDLE))
        .and_then(|()| sockopt::set_tcp_keepintvl(socket, KEEPALIVE_INTERVAL))
        .and_then(|()| sockopt::set_tcp_keepcnt(socket, KEEPALIVE_PROBES));
    if let Err(e) = set {
        tracing::debug!("TCP keepalive: {e}");
    }
}

/// A connection handed from the acceptor to a connection thread.
pub(crate) struct Accepted {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) peer: std::net::SocketAddr,
    pub(crate) permit: tokio::sync::OwnedSemaphorePermit,
}

/// Runs one connection thread: a single-threaded runtime serving the connections it is
/// handed until the acceptor goes away, then draining them for at most [`DRAIN_TIMEOUT`].
pub(crate) fn connection_thread(
    shared: Arc<Shared>,
    mut incoming: mpsc::UnboundedReceiver<Accepted>,
    stop: watch::Receiver<bool>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return tracing::error!("connection thread runtime: {e}"),
    };
    rt.block_on(async move {
        let mut tasks = tokio::task::JoinSet::new();
        while let Some(Accepted { stream, peer, permit }) = incoming.recv().await {
            // A data node's identity may change as it joins its head: each connection
            // gets the one current when it was accepted.
            let tls = shared.tls.read().clone();
            let (shared, stop) = (shared.clone(), stop.clone());
            tasks.spawn(async move {
                let result = match TcpStream::from_std(stream) {
                    Ok(stream) => serve(shared, tls, stream, stop).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    tracing::debug!(%peer, "connection ended: {e}");
                }
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, async { while tasks.join_next().await.is_some() {} }).await;
    });
}

/// Runs `read` until `deadline`, if there is one: a peer that has not authenticated by
/// then is closed, whether it sends nothing or sends slowly.
async fn until<T>(
    deadline: Option<tokio::time::Instant>,
    read: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    match deadline {
        None => read.await,
        Some(d) => tokio::time::timeout_at(d, read)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "did not authenticate in time"))),
    }
}

/// Reads exactly `len` bytes (already checked against the limits) into space split off
/// `pool`, without zero-filling; once the split-off buffers are dropped, `reserve` reuses
/// their memory, so bulk writes do not fault in fresh pages for every frame.
async fn read_vec(r: &mut (impl AsyncRead + Unpin), pool: &mut BytesMut, len: u32) -> std::io::Result<Bytes> {
    use bytes::BufMut;
    let len = len as usize;
    pool.clear();
    pool.reserve(len.max(64 * 1024));
    while pool.len() < len {
        let want = len - pool.len();
        if r.read_buf(&mut (&mut *pool).limit(want)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(pool.split_to(len).freeze())
}

async fn serve(
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stream: TcpStream,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    keepalive(&stream);
    // A new peer has this long from here to finish TLS, send its preamble and
    // authenticate; until it has, its frames are small (see `frame_loop`).
    let deadline = tokio::time::Instant::now() + shared.config.auth_timeout;
    let sendfile = tls.is_none() && shared.config.sendfile.use_for(stream.local_addr()?.ip(), stream.peer_addr()?.ip());
    let mut link = login::Link { local: stream.local_addr()?, peer: stream.peer_addr()?, exporter: Vec::new() };
    let (reader, writer) = match tls {
        Some(acceptor) => {
            let tls = until(Some(deadline), acceptor.accept(stream)).await?;
            link.exporter = tls
                .get_ref()
                .1
                .export_keying_material(
                    vec![0; locus_proto::auth::TLS_EXPORTER_LEN],
                    locus_proto::auth::TLS_EXPORTER_LABEL,
                    None,
                )
                .map_err(std::io::Error::other)?;
            let (r, w) = tokio::io::split(tls);
            (ReadHalf::Tls(r), WriteHalf::Tls(w))
        }
        None => {
            let (r, w) = stream.into_split();
            (ReadHalf::Plain(r), WriteHalf::Plain(w))
        }
    };
    let mut reader = BufReader::with_capacity(256 * 1024, reader);
    let mut writer = FrameWriter::new(writer, sendfile);

    let mut preamble = [0u8; 8];
    until(Some(deadline), reader.read_exact(&mut preamble)).await?;
    frame::parse_preamble(&preamble).map_err(std::io::Error::other)?;
    writer.out_raw(&frame::preamble(frame::VERSION)).await?;

    let (push_tx, push_rx) = mpsc::unbounded_channel();
    let pushes = PushQueue { tx: push_tx, waiting: Arc::new(AtomicUsize::new(0)) };
    let client_id = shared.registry.add(pushes.clone());
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let pusher = tokio::spawn(forward_pushes(push_rx, writer.clone(), pushes.waiting.clone()));
    let answered = Arc::new(tokio::sync::Notify::new());
    let outbox = Outbox {
        writer: writer.clone(),
        runtime: tokio::runtime::Handle::current(),
        pushes: pushes.waiting,
        answered: answered.clone(),
    };
    let mut session = Session::new(shared.clone(), client_id, Some(outbox));
    session.set_link(link);
    // Each arm owns the session, so it (its handles, runs and promises) ends before the
    // connection leaves the registry.
    let result = match head_of(&shared) {
        #[cfg(feature = "cluster")]
        Some(head) => {
            let mut session = crate::cluster::HeadSession::new(session, head);
            frame_loop(&shared, &mut session, &mut reader, &writer, &answered, stop, deadline).await
        }
        _ => {
            let mut session = session;
            frame_loop(&shared, &mut session, &mut reader, &writer, &answered, stop, deadline).await
        }
    };
    pusher.abort();
    shared.registry.remove(client_id);
    result
}

/// The cluster this server heads, if it is a head.
#[cfg(feature = "cluster")]
fn head_of(shared: &Shared) -> Option<Arc<crate::cluster::Head>> {
    shared.head.clone()
}

/// A server built without the `cluster` feature heads no cluster.
#[cfg(not(feature = "cluster"))]
fn head_of(_: &Shared) -> Option<std::convert::Infallible> {
    None
}

async fn forward_pushes(
    mut rx: mpsc::UnboundedReceiver<Push>,
    writer: Arc<tokio::sync::Mutex<FrameWriter>>,
    waiting: Arc<AtomicUsize>,
) {
    while let Some(p) = rx.recv().await {
        let mut w = writer.lock().await;
        if w.frame(Kind::Push, false, p.topic, 0, &p.meta, &p.data).await.is_err() || w.flush().await.is_err() {
            return;
        }
        waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn frame_loop<S: Connection>(
    shared: &Shared,
    session: &mut S,
    reader: &mut BufReader<ReadHalf>,
    writer: &Arc<tokio::sync::Mutex<FrameWriter>>,
    answered: &tokio::sync::Notify,
    mut stop: watch::Receiver<bool>,
    auth_deadline: tokio::time::Instant,
) -> std::io::Result<()> {
    let mut pool = BytesMut::new();
    let mut pipe = splice::SplicePipe::default();
    let pwrite_code = <locus_proto::ops::Pwrite as locus_proto::Operation>::INFO.code;
    let mut idle = IdlePoll::new(shared.config.poll_window);
    // Whether the last request is answered on another thread (a script's interpreter).
    let mut answered_elsewhere = false;
    loop {
        let mut head = [0u8; HEADER_LEN];
        idle.wait(reader, answered_elsewhere.then_some(answered)).await;
        // An unknown peer reads under its deadline and sends small frames.
        let deadline = (!session.authenticated()).then_some(auth_deadline);
        // A peer that sends heartbeats and hears breaks must keep sending them.
        let silent = session.heartbeat_deadline();
        tokio::select! {
            r = until(deadline, reader.read_exact(&mut head)) => match r {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            },
            _ = stop.changed() => return Ok(()),
            _ = tokio::time::sleep(silent.unwrap_or_default()), if silent.is_some() => {
                tracing::info!("a connection that hears callback breaks stopped sending heartbeats: closing it");
                return Ok(());
            }
        }
        let limits =
            if deadline.is_some() { Limits::BEFORE_AUTH } else { session.request_limits(shared.config.limits) };
        let header = match Header::decode(&head, limits) {
            Ok(h) if h.kind == Kind::Request => h,
            Ok(h) => return broken(writer, &head, format!("clients send requests, not {:?} frames", h.kind)).await,
            Err(e) => return broken(writer, &head, e.to_string()).await,
        };
        let meta = until(deadline, read_vec(reader, &mut pool, header.meta_len)).await?;
        let started = Instant::now();
        let direct = (header.op == pwrite_code
            && header.data_len >= splice::SPLICE_MIN
            && session.authenticated()
            && reader.get_ref().plain_socket().is_some())
        .then(|| session.direct_write_target(&meta))
        .flatten();
        // Held while the request may change files (not while its bytes are awaited).
        let serving;
        let outcome = if let Some((file, offset)) = direct {
            serving = shared.callbacks.serving();
            match splice::receive_into_file(reader, &mut pipe, &file, offset, header.data_len as u64).await? {
                Ok(n) => {
                    session.wrote_directly(&file);
                    Ok(dispatch::Answer::from(n).encode())
                }
                Err(errno) => Err(locus_store::StoreError::Os { op: "write", path: file.rel.clone(), errno }.into()),
            }
        } else {
            let data = until(deadline, read_vec(reader, &mut pool, header.data_len)).await?;
            serving = shared.callbacks.serving();
            if session.is_uploading(header.id) {
                session.put_more(header.id, &data, header.more())
            } else if !session.authenticated() && header.op > 0x03 {
                Err(WireError::new(Code::NOT_AUTHENTICATED, "authenticate first"))
            } else {
                session.set_current(header.id, header.more());
                dispatch::dispatch(session, header.op, &meta, data)
            }
        };
        drop(serving);
        let took = started.elapsed();
        shared.store.counters().op(header.op, took);
        answered_elsewhere = matches!(outcome, Ok(Encoded { deferred: true, .. }));
        // Counted for Prometheus once the reply is out, off its path.
        let result = outcome.as_ref().map(drop).map_err(|e| e.code);
        let unpromised = session.take_unpromised();
        let mut w = writer.lock().await;
        if !unpromised.is_empty() {
            // Before the reply, on the same connection: the client reads it first.
            w.frame(Kind::Push, false, frame::PUSH_NO_PROMISE, 0, &codec::encode(&unpromised), &[]).await?;
        }
        match outcome {
            Ok(enc) if enc.deferred => {}
            Ok(Encoded { later: Some(later), .. }) => {
                drop(w);
                tokio::spawn(reply_later(writer.clone(), header.op, header.id, later));
                shared.metrics.answered(header.op, result, took);
                continue;
            }
            Ok(enc) => w.reply(header.op, header.id, &enc.metas, enc.body).await?,
            Err(err) => w.frame(Kind::Error, false, header.op, header.id, &codec::encode(&err), &[]).await?,
        }
        if reader.buffer().is_empty() {
            w.flush().await?;
        }
        drop(w);
        shared.metrics.answered(header.op, result, took);
    }
}

/// Answers a frame that cannot be parsed with an error frame, then ends the connection.
async fn broken(writer: &tokio::sync::Mutex<FrameWriter>, head: &[u8; HEADER_LEN], why: String) -> std::io::Result<()> {
    let id = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let err = WireError::new(Code::BAD_REQUEST, format!("broken frame, closing: {why}"));
    let mut w = writer.lock().await;
    w.frame(Kind::Error, false, 0, id, &codec::encode(&err), &[]).await?;
    w.flush().await?;
    Err(std::io::Error::other(why))
}
