//! Uploads whose bytes are handed over as the caller makes them ([`PutStream`]): a writer
//! that produces a file piece by piece (a Python file object, a generator) streams it
//! with at most one frame's worth held on the client, never the whole file.

use crate::error::Result;
use crate::{Client, ClientError, Frame, Waiter, PUT_CHUNK};
use locus_proto::ops::Put;
use locus_proto::{codec, Operation};
use std::marker::PhantomData;
use tokio::sync::oneshot;

/// A `StreamIn` request (`put`) in progress: what [`PutStream::write`] is given goes to
/// the server in frames flagged MORE; [`PutStream::finish`] sends the last frame, and
/// only then does the server replace the target (until then nothing shows). Up to
/// [`PUT_CHUNK`] bytes are held back, since the last frame must go without the flag.
///
/// An upload dropped unfinished stays at the server until its connection ends, which
/// then removes it: a caller that may abandon uploads gives each a connection of its own.
pub struct PutStream<O: Operation = Put> {
    client: Client,
    id: u32,
    /// The request, until its first frame has gone.
    meta: Option<Vec<u8>>,
    held: Vec<u8>,
    sent: u64,
    reply: Option<oneshot::Receiver<Result<Frame>>>,
    op: PhantomData<O>,
}

impl Client {
    /// Starts a `put` of `path` (mode `mode`) whose bytes are given to the returned
    /// stream's [`PutStream::write`] as they come.
    pub fn put_stream(&self, path: &str, mode: u32) -> Result<PutStream<Put>> {
        self.upload_stream(Put { path: path.into(), mode })
    }

    /// Starts any `StreamIn` request whose data is given as it comes (see [`PutStream`]).
    pub fn upload_stream<O: Operation>(&self, req: O) -> Result<PutStream<O>> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Waiter::One(tx))?;
        Ok(PutStream {
            client: self.clone(),
            id,
            meta: Some(codec::encode(&req)),
            held: Vec::new(),
            sent: 0,
            reply: Some(rx),
            op: PhantomData,
        })
    }
}

impl<O: Operation> PutStream<O> {
    /// Bytes given so far.
    pub fn len(&self) -> u64 {
        self.sent + self.held.len() as u64
    }

    /// True when nothing has been given yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `data` to the upload; full frames go to the server as they fill. Fails at
    /// once if the server has already refused the upload (its error).
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        self.refused()?;
        while !data.is_empty() {
            if self.held.len() == PUT_CHUNK {
                // More follows this frame, so it goes with the flag.
                let held = std::mem::take(&mut self.held);
                self.send(&held, true).await?;
                self.held = held;
                self.held.clear();
            }
            if self.held.is_empty() && data.len() > PUT_CHUNK {
                // Whole frames of a large write go from the caller's bytes, uncopied.
                let (frame, rest) = data.split_at(PUT_CHUNK);
                self.send(frame, true).await?;
                data = rest;
                continue;
            }
            let n = (PUT_CHUNK - self.held.len()).min(data.len());
            self.held.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        Ok(())
    }

    /// Sends the last frame and waits for the server to store the upload under its name;
    /// answers the reply (a `put`'s: the file's attributes).
    pub async fn finish(mut self) -> Result<O::Reply> {
        let held = std::mem::take(&mut self.held);
        self.send(&held, false).await?;
        let reply = self.reply.take().expect("finished once");
        let f = self.client.reply_within(self.client.commit_deadline(self.sent), reply).await?;
        Ok(codec::decode(&f.meta)?)
    }

    /// The server's error if it has answered already: a reply before the last frame is
    /// a refusal (no room, no right, no such directory).
    fn refused(&mut self) -> Result<()> {
        let Some(reply) = self.reply.as_mut() else { return Err(ClientError::Closed) };
        match reply.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => Ok(()),
            Err(oneshot::error::TryRecvError::Closed) => {
                self.reply = None;
                Err(ClientError::Closed)
            }
            Ok(answer) => {
                self.reply = None;
                answer?;
                Err(ClientError::Protocol("the server answered an upload before its last frame".into()))
            }
        }
    }

    async fn send(&mut self, data: &[u8], more: bool) -> Result<()> {
        let meta = self.meta.take().unwrap_or_default();
        self.client.send(O::INFO.code, self.id, more, &meta, data).await?;
        self.sent += data.len() as u64;
        Ok(())
    }
}

impl<O: Operation> Drop for PutStream<O> {
    /// An unfinished upload's reply is waited for no more.
    fn drop(&mut self) {
        if self.reply.is_some() {
            self.client.inner.waiters.lock().remove(&self.id);
        }
    }
}
