//! Where a storelet's stdout and stderr go: a capped pipe that hands each write to a
//! sink as it happens (so output streams to the client while the program runs) or
//! collects it when there is no sink. Writing past the cap traps at once.

use bytes::Bytes;
use parking_lot::Mutex;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Which of the two output streams a chunk was written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Receives output chunks in the order the program wrote them.
pub type OutputSink = Arc<dyn Fn(Stream, &[u8]) + Send + Sync>;

/// State shared by a run's stdout and stderr pipes.
pub(crate) struct Output {
    limit: usize,
    used: AtomicUsize,
    overflowed: AtomicBool,
    sink: Option<OutputSink>,
    collected: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl Output {
    pub(crate) fn new(limit: usize, sink: Option<OutputSink>) -> Arc<Output> {
        Arc::new(Output {
            limit,
            used: AtomicUsize::new(0),
            overflowed: AtomicBool::new(false),
            sink,
            collected: Mutex::new((Vec::new(), Vec::new())),
        })
    }

    /// Bytes written to both streams.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether the program tried to write past the limit.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// What was collected (empty when a sink took the output).
    pub(crate) fn take(&self) -> (Vec<u8>, Vec<u8>) {
        std::mem::take(&mut *self.collected.lock())
    }

    pub(crate) fn pipe(self: &Arc<Self>, stream: Stream) -> Pipe {
        Pipe { stream, output: self.clone() }
    }

    fn write(&self, stream: Stream, bytes: &[u8]) -> Result<(), StreamError> {
        if self.used() + bytes.len() > self.limit {
            self.overflowed.store(true, Ordering::Relaxed);
            return Err(StreamError::Trap(anyhow::anyhow!("output limit of {} bytes", self.limit)));
        }
        self.used.fetch_add(bytes.len(), Ordering::Relaxed);
        match &self.sink {
            Some(sink) => sink(stream, bytes),
            None => {
                let mut c = self.collected.lock();
                match stream {
                    Stream::Stdout => c.0.extend_from_slice(bytes),
                    Stream::Stderr => c.1.extend_from_slice(bytes),
                }
            }
        }
        Ok(())
    }
}

/// One of a run's two output pipes, as WASI sees it.
#[derive(Clone)]
pub(crate) struct Pipe {
    stream: Stream,
    output: Arc<Output>,
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Pipe {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.output.write(self.stream, &bytes)
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        // Report room for any write: one past the limit must reach `write` and trap.
        Ok(1 << 20)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Pipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Pipe {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(self.output.write(self.stream, buf).map(|()| buf.len()).map_err(io::Error::other))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for Pipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Pipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}
