//! Scripts and storelets from the client: registering and calling scripts, starting a
//! storelet and following its run as it streams output and progress.

use crate::error::Result;
use crate::Client;
use crate::ClientError;
use crate::Frame;
use bytes::Bytes;
use locus_proto::codec;
use locus_proto::ops;
use locus_proto::ops::*;
use locus_proto::types::*;

use tokio::sync::mpsc;

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
            StoreletEvent::Wrote { .. } | StoreletEvent::Removed { .. } => {
                self.done = true;
                return Err(ClientError::Protocol("a data node's report reached a client".into()));
            }
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

impl Client {
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
}
