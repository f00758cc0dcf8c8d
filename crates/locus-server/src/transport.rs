//! The byte streams under a connection, and the frame writer.
//!
//! Plain TCP keeps its raw socket so bulk reads go out with `sendfile` (no copy through
//! user space); TLS streams copy through a buffer, as encryption needs.

use bytes::Bytes;
use locus_proto::frame::{Header, Kind, FLAG_MORE, HEADER_LEN};
use locus_store::OpenFile;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter, Interest};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

/// The write half of a connection.
pub enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// The read half of a connection.
pub enum ReadHalf {
    Plain(tokio::net::tcp::OwnedReadHalf),
    Tls(tokio::io::ReadHalf<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl ReadHalf {
    /// The TCP socket, when bytes can be moved from it without passing through user space.
    pub fn plain_socket(&self) -> Option<&TcpStream> {
        match self {
            ReadHalf::Plain(r) => Some(r.as_ref()),
            ReadHalf::Tls(_) => None,
        }
    }
}

impl tokio::io::AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

/// Keeps a connection's thread polling its socket for a moment after a reply, so that
/// a client in conversation finds it awake.
///
/// An idle thread sleeps in `epoll_wait`, and its CPU halts; in a VM, waking a halted
/// vCPU costs 20–70 µs, as much as the rest of a round trip. A client that sends its
/// next request as soon as it has the reply (a `stat` after a `stat`, a file read in
/// small pieces) thus pays for a wake-up on every request. Polling for about one round
/// trip keeps the thread running through that gap. It yields between polls, so other
/// connections on the thread and a client on the same CPU still run. While a script's
/// interpreter makes the reply, the thread sleeps instead, leaving it the CPU, and polls
/// once told the reply is out. One connection of a thread polls at a time.
///
/// Polls that miss back off: after the n-th miss in a row the connection skips its next
/// 2^(n-1) - 1 polls (at most 63), and a hit starts over. A client that pauses between
/// requests thus soon costs almost nothing, while one that resumes conversation after a
/// pause is polled for again within a request or two. The rule counts hits and misses
/// only, not gaps, since a gap measured without polling includes the wake-up, whose cost
/// varies from machine to machine.
pub struct IdlePoll {
    window: std::time::Duration,
    /// Polls in a row that ended without a request.
    misses: u32,
    /// Waits left before the next poll.
    skip: u32,
}

impl IdlePoll {
    /// Polls for at most `window` (zero: never).
    pub fn new(window: std::time::Duration) -> Self {
        IdlePoll { window, misses: 0, skip: 0 }
    }

    /// Waits until `reader` has bytes or the window has passed, polling, unless backing
    /// off (then returns at once). If the last reply is made on another thread, which
    /// signals `answered` once it is out, first sleeps until then.
    pub async fn wait<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        reader: &mut tokio::io::BufReader<R>,
        answered: Option<&tokio::sync::Notify>,
    ) {
        use tokio::io::AsyncBufRead;
        if let Some(answered) = answered {
            let ready = std::future::poll_fn(|cx| Pin::new(&mut *reader).poll_fill_buf(cx).map(|_| ()));
            tokio::select! {
                biased;
                _ = answered.notified() => {}
                _ = ready => {}
            }
        }
        if self.window.is_zero() || !reader.buffer().is_empty() {
            return;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        // With several connections in conversation the thread is kept awake by them all
        // anyway, and more pollers would only add system calls.
        let Some(_poller) = Poller::claim() else { return };
        let until = Instant::now() + self.window;
        loop {
            let ready =
                std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *reader).poll_fill_buf(cx).is_ready())).await;
            if ready {
                self.misses = 0;
                return;
            }
            if Instant::now() >= until {
                self.misses += 1;
                self.skip = (1 << (self.misses - 1).min(6)) - 1;
                return;
            }
            // Lets a client on this CPU run, then this thread's other connections and its
            // I/O driver, which notices the socket's bytes.
            std::thread::yield_now();
            tokio::task::yield_now().await;
        }
    }
}

thread_local! {
    /// Whether a connection of this thread is polling now.
    static POLLING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread's right to poll, given back when dropped (also if the poll is cancelled).
struct Poller;

impl Poller {
    fn claim() -> Option<Poller> {
        POLLING.with(|p| (!p.replace(true)).then_some(Poller))
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        POLLING.with(|p| p.set(false));
    }
}

/// Reads at least this many bytes go out with sendfile on plain TCP.
pub const SENDFILE_MIN: u64 = 64 * 1024;
/// Size of the data frames of a streamed `get`.
pub const STREAM_CHUNK: usize = 4 << 20;

/// What follows a reply's metadata.
pub enum Body {
    None,
    /// Bytes already in memory.
    Bytes(Bytes),
    /// `len` bytes of an open file at `offset`, already clamped to the file's size.
    File {
        file: Arc<OpenFile>,
        offset: u64,
        len: u64,
    },
    /// A whole file, sent as data frames of [`STREAM_CHUNK`] bytes until end of file.
    Stream(Arc<OpenFile>),
    /// Frames produced over time elsewhere (a storelet's events), each sent as it
    /// arrives; only answers that come `later` carry one.
    Events(EventStream),
}

/// Frames produced over time, and how many data bytes are queued in them (producers
/// wait while too many are, so a client that reads slowly holds its producer back).
pub struct EventStream {
    pub frames: tokio::sync::mpsc::UnboundedReceiver<EventFrame>,
    pub queued: Arc<std::sync::atomic::AtomicUsize>,
}

/// One frame of an [`EventStream`].
pub struct EventFrame {
    pub kind: Kind,
    pub more: bool,
    pub meta: Vec<u8>,
    pub data: Bytes,
    /// Consecutive mergeable frames with the same metadata may be sent as one frame
    /// carrying all their data (output written in many small pieces).
    pub mergeable: bool,
}

/// Writes frames to a connection, buffering small ones so that replies to pipelined
/// requests leave in as few system calls as possible.
pub struct FrameWriter {
    out: BufWriter<WriteHalf>,
    /// Large reads go out with sendfile (plain TCP only; see [`crate::Sendfile`]).
    sendfile: bool,
}

/// Size of a connection's write buffer.
const WRITE_BUFFER: usize = 128 * 1024;
/// Largest piece of a file read into memory at once on its way to the socket.
const COPY_CHUNK: usize = 4 << 20;
/// Buffers of [`COPY_CHUNK`] bytes between transfers, shared by all connections, so that
/// a transfer does not fault in fresh pages and an idle connection holds none.
static IDLE_BUFFERS: parking_lot::Mutex<Vec<Vec<u8>>> = parking_lot::Mutex::new(Vec::new());
/// Idle buffers kept at most.
const IDLE_BUFFERS_MAX: usize = 8;

impl FrameWriter {
    /// A writer over a connection's write half; `sendfile` only on plain TCP.
    pub fn new(w: WriteHalf, sendfile: bool) -> Self {
        let sendfile = sendfile && matches!(w, WriteHalf::Plain(_));
        FrameWriter { out: BufWriter::with_capacity(WRITE_BUFFER, w), sendfile }
    }

    /// Writes one frame whose data is in memory.
    pub async fn frame(
        &mut self,
        kind: Kind,
        more: bool,
        op: u16,
        id: u32,
        meta: &[u8],
        data: &[u8],
    ) -> io::Result<()> {
        self.out.write_all(&frame_header(kind, more, op, id, meta, data).encode()).await?;
        self.out.write_all(meta).await?;
        self.out.write_all(data).await
    }

    /// Writes a reply: one frame per metadata page, the body after the last.
    pub async fn reply(&mut self, op: u16, id: u32, metas: &[Vec<u8>], body: Body) -> io::Result<()> {
        let streaming = matches!(body, Body::Stream(_));
        for (i, meta) in metas.iter().enumerate() {
            let last = i + 1 == metas.len();
            if !last {
                self.frame(Kind::Reply, true, op, id, meta, &[]).await?;
                continue;
            }
            match &body {
                Body::None | Body::Stream(_) => self.frame(Kind::Reply, streaming, op, id, meta, &[]).await?,
                Body::Events(_) => unreachable!("event streams are sent by reply_later"),
                Body::Bytes(b) => self.frame(Kind::Reply, false, op, id, meta, b).await?,
                Body::File { file, offset, len } => self.file_frame(op, id, meta, file, *offset, *len).await?,
            }
        }
        if let Body::Stream(file) = body {
            self.stream(op, id, &file).await?;
        }
        Ok(())
    }

    async fn file_frame(
        &mut self,
        op: u16,
        id: u32,
        meta: &[u8],
        file: &OpenFile,
        offset: u64,
        len: u64,
    ) -> io::Result<()> {
        let h = Header { kind: Kind::Reply, flags: 0, op, id, meta_len: meta.len() as u32, data_len: len as u32 };
        self.out.write_all(&h.encode()).await?;
        self.out.write_all(meta).await?;
        self.file_data(file, offset, len).await.map(drop)
    }

    /// Writes exactly `len` bytes of `file` from `offset` after a header that announced
    /// them: by sendfile when large and allowed, else through memory. Returns how many
    /// came from the file; if it ended early the rest is zeros.
    async fn file_data(&mut self, file: &OpenFile, offset: u64, len: u64) -> io::Result<u64> {
        let start = Instant::now();
        let sent = if self.sendfile && len >= SENDFILE_MIN {
            self.out.flush().await?;
            match self.out.get_ref() {
                WriteHalf::Plain(w) => sendfile_all(w.as_ref(), file, offset, len).await?,
                WriteHalf::Tls(_) => unreachable!("sendfile is only set on plain TCP"),
            }
        } else {
            self.copy_data(file, offset, len).await?
        };
        if sent < len {
            self.out.write_all(&vec![0u8; (len - sent) as usize]).await?;
        }
        file.io.read(sent, start.elapsed());
        Ok(sent)
    }

    /// Writes up to `len` bytes of `file` from `offset` through a buffer borrowed from
    /// [`IDLE_BUFFERS`]; returns how many the file had.
    async fn copy_data(&mut self, file: &OpenFile, offset: u64, len: u64) -> io::Result<u64> {
        let mut buf = IDLE_BUFFERS.lock().pop().unwrap_or_else(|| vec![0u8; COPY_CHUNK]);
        let result = async {
            let mut sent = 0u64;
            while sent < len {
                let want = (len - sent).min(COPY_CHUNK as u64) as usize;
                let got = file.read_into(offset + sent, &mut buf[..want]).map_err(io::Error::other)?;
                self.out.write_all(&buf[..got]).await?;
                sent += got as u64;
                if got < want {
                    break;
                }
            }
            Ok(sent)
        }
        .await;
        let mut idle = IDLE_BUFFERS.lock();
        if idle.len() < IDLE_BUFFERS_MAX {
            idle.push(buf);
        }
        result
    }

    /// Sends a whole file as data frames flagged MORE, then an empty closing frame, or
    /// an error frame if the file shrank under the transfer (the client must not trust
    /// the zeros that then filled the frames already announced).
    async fn stream(&mut self, op: u16, id: u32, file: &OpenFile) -> io::Result<()> {
        let size = file.stat().map_err(io::Error::other)?.size;
        let mut offset = 0u64;
        let mut intact = true;
        while offset < size {
            let len = (size - offset).min(STREAM_CHUNK as u64);
            let h = Header { kind: Kind::Reply, flags: FLAG_MORE, op, id, meta_len: 0, data_len: len as u32 };
            self.out.write_all(&h.encode()).await?;
            let sent = self.file_data(file, offset, len).await?;
            intact &= sent == len;
            offset += len;
        }
        if intact {
            self.frame(Kind::Reply, false, op, id, &[], &[]).await
        } else {
            let err =
                locus_proto::Error::new(locus_proto::Code::IO, "the file shrank while it was being sent; try again");
            self.frame(Kind::Error, false, op, id, &locus_proto::codec::encode(&err), &[]).await
        }
    }

    /// Sends buffered frames.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.out.flush().await
    }
}

/// The header of a frame whose metadata and data are in memory.
fn frame_header(kind: Kind, more: bool, op: u16, id: u32, meta: &[u8], data: &[u8]) -> Header {
    Header {
        kind,
        flags: if more { FLAG_MORE } else { 0 },
        op,
        id,
        meta_len: meta.len() as u32,
        data_len: data.len() as u32,
    }
}

/// Sends `len` bytes of `file` from `offset` with sendfile; returns how many were sent
/// (fewer only if the file ended early).
async fn sendfile_all(sock: &TcpStream, file: &OpenFile, mut offset: u64, len: u64) -> io::Result<u64> {
    let mut sent = 0u64;
    while sent < len {
        sock.writable().await?;
        let r = sock.try_io(Interest::WRITABLE, || {
            let want = (len - sent).min(1 << 30) as usize;
            rustix::fs::sendfile(sock.as_fd(), file.file.as_fd(), Some(&mut offset), want).map_err(io::Error::from)
        });
        match r {
            Ok(0) => break,
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// What [`FrameWriter::try_frame_now`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectWrite {
    /// The frame is on the socket.
    Sent,
    /// The frame is whole in the buffer, but the socket took no more: someone must flush.
    Buffered,
    /// The buffer had no room for the frame; nothing was written.
    NoRoom,
    /// The connection failed.
    Failed,
}

impl FrameWriter {
    /// Writes one frame and flushes, without waiting and from any thread: the frame goes
    /// whole into the buffer or not at all. Lets a script's interpreter thread answer the
    /// caller itself instead of waking the connection's thread to do it.
    pub fn try_frame_now(&mut self, kind: Kind, more: bool, op: u16, id: u32, meta: &[u8], data: &[u8]) -> DirectWrite {
        let len = HEADER_LEN + meta.len() + data.len();
        if len > WRITE_BUFFER - self.out.buffer().len() {
            return DirectWrite::NoRoom;
        }
        let h = frame_header(kind, more, op, id, meta, data);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // With room for it, a buffered writer copies a piece in without touching the socket.
        for piece in [&h.encode()[..], meta, data] {
            match Pin::new(&mut self.out).poll_write(&mut cx, piece) {
                Poll::Ready(Ok(n)) if n == piece.len() => {}
                _ => return DirectWrite::Failed,
            }
        }
        match Pin::new(&mut self.out).poll_flush(&mut cx) {
            Poll::Ready(Ok(())) => DirectWrite::Sent,
            Poll::Ready(Err(_)) => DirectWrite::Failed,
            Poll::Pending => DirectWrite::Buffered,
        }
    }

    /// Writes raw bytes (the preamble) and flushes them.
    pub async fn out_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes).await?;
        self.out.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::IdlePoll;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncWriteExt, BufReader};

    #[tokio::test(flavor = "current_thread")]
    async fn idle_poll_backs_off_after_misses_and_starts_over_on_a_hit() {
        let window = Duration::from_millis(60);
        let (mut client, server) = tokio::io::duplex(64);
        let mut reader = BufReader::new(server);
        let mut idle = IdlePoll::new(window);
        let polled = |started: Instant| started.elapsed() >= window;

        // Nothing comes: the first two waits poll for the whole window (misses 1 and 2),
        // then one is skipped, then it polls again (miss 3), then three are skipped.
        let mut pattern = Vec::new();
        for _ in 0..8 {
            let started = Instant::now();
            idle.wait(&mut reader, None).await;
            pattern.push(polled(started));
        }
        assert_eq!(pattern, [true, true, false, true, false, false, false, true]);

        // Bytes end a poll before the window does, and a hit starts over.
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            client.write_all(b"x").await.unwrap();
            client
        });
        idle.skip = 0;
        let started = Instant::now();
        idle.wait(&mut reader, None).await;
        assert!(!polled(started), "kept polling after bytes came");
        assert_eq!(reader.buffer(), b"x");
        assert_eq!((idle.misses, idle.skip), (0, 0));
        drop(writer.await.unwrap());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn one_connection_of_a_thread_polls_at_a_time() {
        let window = Duration::from_millis(200);
        let (_c1, s1) = tokio::io::duplex(64);
        let (_c2, s2) = tokio::io::duplex(64);
        let first = tokio::spawn(async move { IdlePoll::new(window).wait(&mut BufReader::new(s1), None).await });
        tokio::task::yield_now().await; // the first connection starts polling
        let mut second = BufReader::new(s2);
        let started = Instant::now();
        IdlePoll::new(window).wait(&mut second, None).await;
        assert!(started.elapsed() < window / 3, "two connections of a thread polled at once");
        first.await.unwrap();
        // Once the first is done, the next may poll.
        let started = Instant::now();
        IdlePoll::new(window).wait(&mut second, None).await;
        assert!(started.elapsed() >= window);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn idle_poll_sleeps_until_a_reply_made_elsewhere_is_out() {
        let window = Duration::from_millis(50);
        let (_client, server) = tokio::io::duplex(64);
        let mut reader = BufReader::new(server);
        let mut idle = IdlePoll::new(window);
        let answered = std::sync::Arc::new(tokio::sync::Notify::new());
        let teller = answered.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            teller.notify_one();
        });
        // Neither bytes nor the window end the wait before the reply is out; then it polls.
        let started = Instant::now();
        idle.wait(&mut reader, Some(&answered)).await;
        assert!(started.elapsed() >= Duration::from_millis(100) + window, "{:?}", started.elapsed());
    }
}
