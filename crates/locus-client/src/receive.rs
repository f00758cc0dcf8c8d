//! The receive loop: frames from the server routed to the requests waiting for
//! them (a streamed reply's data read straight into the buffer its waiter gave), pushes
//! to their subscriber, and every waiter failed when the connection ends.

use crate::error::Result;
use crate::BoxRead;
use crate::ClientError;
use crate::Frame;
use crate::Inner;
use crate::PushMessage;
use crate::Waiter;
use bytes::{Bytes, BytesMut};
use locus_proto::frame::{self, Header, Kind, Limits, HEADER_LEN};
use locus_proto::{codec, Error as WireError};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The next frame of a streamed reply, within `limit` of asking; gives the connection
/// up if none comes (a stream that makes progress is never cut).
pub(crate) async fn next_frame(
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
pub(crate) fn abandon(inner: &Arc<Inner>) -> ClientError {
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

/// A source read one chunk ahead, so that the chunk handed out is known to be the
/// last (its frame then goes without the MORE flag). An empty source gives one empty
/// chunk.
pub(crate) struct ReadAhead<'a, R> {
    source: &'a mut R,
    ahead: Vec<u8>,
    out: Vec<u8>,
    n: usize,
    done: bool,
}

impl<'a, R: AsyncRead + Unpin> ReadAhead<'a, R> {
    /// Reads the first chunk of `source`.
    pub(crate) async fn new(source: &'a mut R) -> Result<Self> {
        let mut ahead = vec![0u8; crate::PUT_CHUNK];
        let n = read_full(source, &mut ahead).await?;
        Ok(ReadAhead { source, ahead, out: vec![0u8; crate::PUT_CHUNK], n, done: false })
    }

    /// The next chunk, and whether more follow; `None` after the last.
    pub(crate) async fn next(&mut self) -> Result<Option<(&[u8], bool)>> {
        if self.done {
            return Ok(None);
        }
        let m = if self.n == crate::PUT_CHUNK { read_full(self.source, &mut self.out).await? } else { 0 };
        // `out` now holds the chunk after; swapped, it is `ahead` and the one to hand out is `out`.
        std::mem::swap(&mut self.ahead, &mut self.out);
        let n = std::mem::replace(&mut self.n, m);
        self.done = m == 0;
        Ok(Some((&self.out[..n], m > 0)))
    }
}

pub(crate) async fn read_full(r: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> Result<usize> {
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
pub(crate) async fn read_frame(
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
pub(crate) fn registered_dest(inner: &std::sync::Weak<Inner>, header: &Header) -> Option<BytesMut> {
    if header.kind != Kind::Reply || header.data_len == 0 {
        return None;
    }
    match inner.upgrade()?.waiters.lock().get_mut(&header.id) {
        Some(Waiter::Into(_, dest)) => Some(std::mem::take(dest)),
        _ => None,
    }
}

/// Bodies at least this large are read with the socket's low-water mark raised.
pub(crate) const LOWAT_MIN: usize = 1 << 20;

/// The low-water mark while such a body arrives: the reader is woken once per this many
/// bytes, not once per segment (a wake-up that crosses CPUs costs tens of µs in a VM).
pub(crate) const LOWAT: usize = 256 << 10;

/// Sets the socket's receive low-water mark (`SO_RCVLOWAT`): it is readable once this
/// many bytes wait. The socket belongs to this connection and outlives its reader.
pub(crate) fn set_rcvlowat(socket: RawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `socket` is the connection's open socket; `v` is an int of the size given.
    unsafe { libc::setsockopt(socket, libc::SOL_SOCKET, libc::SO_RCVLOWAT, (&v as *const libc::c_int).cast(), size) };
}

/// Reads exactly `len` bytes, without zero-filling, into space split off `pool`. Once
/// every `Bytes` split from the pool is dropped, `reserve` reuses its memory, so a long
/// transfer does not fault in fresh pages for every frame.
pub(crate) async fn read_exact_buf(
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
pub(crate) async fn read_into(
    r: &mut BufReader<BoxRead>,
    socket: Option<RawFd>,
    buf: &mut BytesMut,
    len: usize,
) -> Result<()> {
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
pub(crate) const POOL_MIN: usize = 4 << 20;

/// Routes frames from the server to their waiters until the connection ends, then fails
/// every request still waiting.
pub(crate) async fn read_loop(
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
