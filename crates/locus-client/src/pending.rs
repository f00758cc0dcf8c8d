//! Requests in flight: a reply awaited later (`Pending`), a listing read ahead
//! (`PendingListing`), and how a request is registered, sent and its reply awaited
//! within its deadline.

use crate::error::Result;
use crate::receive::abandon;
use crate::receive::next_frame;
use crate::Client;
use crate::ClientError;
use crate::Deadlines;
use crate::Frame;
use crate::Inner;
use crate::Waiter;
use bytes::Bytes;
use locus_proto::frame::{Header, Kind, FLAG_MORE};
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{codec, Operation};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

/// The reply of an operation sent with [`Client::start_with`], not yet waited for.
pub struct Pending<R> {
    pub(crate) rx: oneshot::Receiver<Result<Frame>>,
    pub(crate) decode: fn(&[u8]) -> Result<R>,
    /// When the reply is overdue (counted from when the request was sent), and the
    /// connection to give up on then.
    pub(crate) deadline: tokio::time::Instant,
    pub(crate) conn: std::sync::Weak<Inner>,
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
    pub(crate) pages: mpsc::UnboundedReceiver<Result<Frame>>,
    /// How long each page may take, and the connection to give up on then.
    pub(crate) deadline: Duration,
    pub(crate) conn: std::sync::Weak<Inner>,
    /// The entries of the pages come so far.
    pub(crate) got: Vec<DirEntry>,
    /// Set once the last page (or an error) came.
    pub(crate) ended: Option<Result<()>>,
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

impl Client {
    pub(crate) fn register(&self, waiter: Waiter) -> Result<u32> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let closed = self.inner.closed.lock();
        if *closed {
            return Err(ClientError::Closed);
        }
        self.inner.waiters.lock().insert(id, waiter);
        Ok(id)
    }

    pub(crate) async fn send(&self, op: u16, id: u32, more: bool, meta: &[u8], data: &[u8]) -> Result<()> {
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
    pub(crate) async fn reply_within(
        &self,
        limit: Option<Duration>,
        rx: oneshot::Receiver<Result<Frame>>,
    ) -> Result<Frame> {
        let Some(limit) = limit else { return rx.await.map_err(|_| ClientError::Closed)? };
        match tokio::time::timeout(limit, rx).await {
            Ok(frame) => frame.map_err(|_| ClientError::Closed)?,
            Err(_) => Err(abandon(&self.inner)),
        }
    }

    /// The deadline of operation `op`'s reply: none for operations that carry out long
    /// work the server bounds itself.
    pub(crate) fn deadline_of(&self, op: u16) -> Option<Duration> {
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

    /// Runs an operation whose reply may take up to `limit` (longer than the request
    /// deadline: a node reading back or copying a whole large version).
    pub async fn call_within<O: Operation>(&self, req: O, limit: Duration) -> Result<O::Reply> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Waiter::One(tx))?;
        self.send(O::INFO.code, id, false, &codec::encode(&req), &[]).await?;
        Ok(codec::decode(&self.reply_within(Some(limit), rx).await?.meta)?)
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
    pub(crate) async fn start_as<O: Operation>(
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
}
