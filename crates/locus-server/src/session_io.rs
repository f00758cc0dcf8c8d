//! What a session and its connection see of each other: what the frame loop needs of a
//! session ([`Connection`]), the session's way out to its connection ([`Outbox`]: replies
//! finished later, pushes), and how long a silent heartbeating peer is trusted.

use crate::dispatch::{self, Encoded};
use crate::transport;
use crate::transport::{DirectWrite, FrameWriter};
use bytes::BytesMut;
use locus_proto::frame::Kind;
use locus_proto::{codec, Error as WireError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Largest frame made by merging a backlog of small output events.
const MERGED_FRAME_MAX: usize = 1 << 20;

/// What the frame loop needs of a connection's session besides its operations.
pub trait Connection: dispatch::Handler {
    /// True once the handshake has succeeded.
    fn authenticated(&self) -> bool;
    /// The largest frames the peer may send now, the server's being `server`.
    fn request_limits(&self, server: locus_proto::Limits) -> locus_proto::Limits {
        server
    }
    /// Records the id and MORE flag of the frame about to be dispatched.
    fn set_current(&mut self, id: u32, more: bool);
    /// True when `id` is an upload in progress (its next frames are continuations).
    fn is_uploading(&self, id: u32) -> bool;
    /// Handles a continuation frame of an upload.
    fn put_more(&mut self, id: u32, data: &[u8], more: bool) -> Result<Encoded, WireError>;
    /// Appends `len` bytes of `from` (a file of the server's own, outside the export)
    /// from offset `at` to upload `id`, which goes on; answers how many bytes came
    /// (fewer where `from` ends first). By default through memory; a plain server's
    /// session copies in the kernel.
    fn put_file(&mut self, id: u32, from: &std::fs::File, at: u64, len: u64) -> Result<u64, WireError> {
        let mut buf = vec![0u8; 1 << 20];
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(buf.len() as u64) as usize;
            let n = match rustix::io::pread(from, &mut buf[..want], at + done) {
                Ok(0) => break,
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(WireError::new(locus_proto::Code::IO, format!("reading a part: {e}"))),
            };
            self.put_more(id, &buf[..n], true)?;
            done += n as u64;
        }
        Ok(done)
    }
    /// Makes the file at `from` (the server's own, outside the export) upload `id`'s
    /// content without a copy, where nothing was sent to it yet; answers its size, or
    /// `None` where it cannot (another file system, a cluster head): the caller sends
    /// the bytes instead.
    fn put_adopt(&mut self, _id: u32, _from: &std::path::Path) -> Result<Option<u64>, WireError> {
        Ok(None)
    }
    /// For a `pwrite` whose data may go straight from the socket into a file: the file
    /// and offset (see [`crate::Session::direct_write_target`]).
    fn direct_write_target(&self, _meta: &[u8]) -> Option<(Arc<locus_store::OpenFile>, u64)> {
        None
    }
    /// A `pwrite` went straight into `file`: other clients' promises on it break.
    fn wrote_directly(&self, _file: &locus_store::OpenFile) {}
    /// Paths the request just handled holds no callback promise on, though callbacks
    /// are on: sent as a `PUSH_NO_PROMISE` before its reply.
    fn take_unpromised(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// How long the connection may stay silent before it is taken for dead: set once
    /// it sends heartbeats and callback breaks go to it (see [`HEARTBEAT_DEAD`]).
    fn heartbeat_deadline(&self) -> Option<std::time::Duration> {
        None
    }
}

/// How long a connection that sends heartbeats (pings, every
/// `locus_client::HEARTBEAT_EVERY`) and receives callback breaks may stay silent before
/// the server takes it for dead: it closes it, and the promises whose breaks went to it
/// go (a frozen peer or a cut link would otherwise hold them, and let breaks vanish).
pub const HEARTBEAT_DEAD: std::time::Duration = std::time::Duration::from_secs(8);

/// How a reply made on another thread (by a script's interpreter) reaches its client:
/// written to the socket right there when the connection's writer is free and no push
/// waits to go first, else handed to a task on the connection's own thread. The direct
/// way saves a thread wake-up per script call.
#[derive(Clone)]
pub struct Outbox {
    pub(crate) writer: Arc<tokio::sync::Mutex<FrameWriter>>,
    pub(crate) runtime: tokio::runtime::Handle,
    /// Pushes queued for this client and not yet written.
    pub(crate) pushes: Arc<AtomicUsize>,
    /// Told after each reply, so the connection's thread, asleep while a script ran,
    /// polls for the next request (see `transport::IdlePoll`).
    pub(crate) answered: Arc<tokio::sync::Notify>,
}

impl Outbox {
    /// Sends the reply to request `id` (operation `op`).
    pub fn reply(&self, op: u16, id: u32, outcome: Result<Encoded, WireError>) {
        self.send(op, id, outcome);
        self.answered.notify_one();
    }

    fn send(&self, op: u16, id: u32, outcome: Result<Encoded, WireError>) {
        if self.pushes.load(Ordering::SeqCst) == 0 {
            if let Ok(mut w) = self.writer.try_lock() {
                let written = match &outcome {
                    Ok(Encoded { metas, body: transport::Body::Bytes(data), later: None, .. }) if metas.len() == 1 => {
                        w.try_frame_now(Kind::Reply, false, op, id, &metas[0], data)
                    }
                    Err(err) => w.try_frame_now(Kind::Error, false, op, id, &codec::encode(err), &[]),
                    Ok(_) => DirectWrite::NoRoom,
                };
                match written {
                    // A failed connection is noticed and closed by its own thread.
                    DirectWrite::Sent | DirectWrite::Failed => return,
                    DirectWrite::Buffered => {
                        drop(w);
                        let writer = self.writer.clone();
                        self.runtime.spawn(async move { writer.lock().await.flush().await });
                        return;
                    }
                    DirectWrite::NoRoom => {}
                }
            }
        }
        self.runtime.spawn(reply_later(self.writer.clone(), op, id, Box::pin(std::future::ready(outcome))));
    }
}

/// Sends the reply of a request answered elsewhere, whenever it is ready: a storelet's
/// events, or a script's reply that its interpreter thread could not write itself.
pub(crate) async fn reply_later(
    writer: Arc<tokio::sync::Mutex<FrameWriter>>,
    op: u16,
    id: u32,
    later: dispatch::Later,
) {
    let outcome = later.await;
    if let Ok(Encoded { body: transport::Body::Events(mut events), .. }) = outcome {
        // Frame by frame as they come, so other replies interleave with a long stream.
        let mut next = events.frames.recv().await;
        while let Some(e) = next.take() {
            let mut data = BytesMut::from(&e.data[..]);
            while e.mergeable && data.len() < MERGED_FRAME_MAX {
                match events.frames.try_recv() {
                    Ok(f) if f.mergeable && f.meta == e.meta => data.extend_from_slice(&f.data),
                    Ok(f) => {
                        next = Some(f);
                        break;
                    }
                    Err(_) => break,
                }
            }
            let mut w = writer.lock().await;
            if w.frame(e.kind, e.more, op, id, &e.meta, &data).await.is_err() || w.flush().await.is_err() {
                return;
            }
            drop(w);
            events.queued.fetch_sub(data.len(), Ordering::Relaxed);
            if next.is_none() {
                next = events.frames.recv().await;
            }
        }
        return;
    }
    let mut w = writer.lock().await;
    let sent = match outcome {
        Ok(enc) => w.reply(op, id, &enc.metas, enc.body).await,
        Err(err) => w.frame(Kind::Error, false, op, id, &codec::encode(&err), &[]).await,
    };
    if sent.is_ok() {
        let _ = w.flush().await;
    }
}
