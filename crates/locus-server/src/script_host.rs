//! How a script reaches the file service: a session of its own, authenticated as the
//! calling subject, so a script has exactly its caller's rights. Its handles close when
//! the call ends, with the session.
//!
//! A session's handler (`session/handler.rs`) runs a script through this host, and this
//! host makes a session (`session/mod.rs`): mutual in idea, one way between files. On a
//! cluster head the script's session is a head's ([`crate::cluster::HeadSession`]), whose
//! answers may come later (bytes read from data nodes): the host waits for them.

use crate::dispatch::{self, Handler, Later};
use crate::session::Session;
use crate::transport::{Body, EventStream};
use crate::{Connection, Push, Shared};
use bytes::Bytes;
use locus_proto::frame::Kind;
use locus_proto::{codec, Code, Error as WireError};
use std::sync::Arc;

/// Largest file a script may read whole with `fs.get`.
const MAX_SCRIPT_GET: u64 = 64 << 20;

/// A session a script acts through: a server's own, or a cluster head's.
pub trait ScriptSession: Handler + Connection + Send + 'static {
    /// The subject the script acts as.
    fn acting_as(&self) -> &str;

    /// Waits for an answer that comes later (none on a single server, whose file
    /// operations answer at once).
    fn wait(&self, later: Later) -> Result<crate::dispatch::Encoded, WireError> {
        drop(later);
        Err(WireError::new(Code::NOTSUP, "scripts cannot run storelets"))
    }

    /// Gathers a reply streamed as events: its metadata pages and its bytes.
    fn gather(&self, events: EventStream) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError> {
        drop(events);
        Err(WireError::new(Code::NOTSUP, "scripts cannot run storelets"))
    }
}

impl ScriptSession for Session {
    fn acting_as(&self) -> &str {
        self.subject().expect("a script's session acts as its caller")
    }
}

/// Gathers the frames of a streamed reply (on the runtime that feeds them), at most
/// [`MAX_SCRIPT_GET`] bytes.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) async fn gather_events(mut events: EventStream) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError> {
    let (mut metas, mut data) = (Vec::new(), Vec::new());
    while let Some(frame) = events.frames.recv().await {
        events.queued.fetch_sub(frame.data.len(), std::sync::atomic::Ordering::Relaxed);
        match frame.kind {
            Kind::Error => return Err(codec::decode(&frame.meta).unwrap_or_else(|e| e)),
            _ => {
                if !frame.meta.is_empty() {
                    metas.push(frame.meta);
                }
                if data.len() as u64 + frame.data.len() as u64 > MAX_SCRIPT_GET {
                    return Err(WireError::new(
                        Code::TOO_LARGE,
                        "file too large to read whole in a script; use fs.pread",
                    ));
                }
                data.extend_from_slice(&frame.data);
            }
        }
        if !frame.more {
            break;
        }
    }
    Ok((metas, data))
}

/// The [`locus_script::Host`] of one script call.
pub struct ScriptHost<S: ScriptSession = Session> {
    session: S,
    shared: Arc<Shared>,
    caller: u64,
}

impl ScriptHost<Session> {
    /// A host acting as `subject` for the client `caller`.
    pub fn new(shared: Arc<Shared>, subject: &str, caller: u64) -> Self {
        ScriptHost::over(Session::acting_as(shared.clone(), subject), shared, caller)
    }
}

impl<S: ScriptSession> ScriptHost<S> {
    /// A host acting through `session` (already acting as the caller's subject) for the
    /// client `caller`.
    pub fn over(session: S, shared: Arc<Shared>, caller: u64) -> Self {
        ScriptHost { session, shared, caller }
    }
}

/// Runs operation `op` on `session` and answers it whole: its metadata pages and its
/// bytes (an answer that comes later is waited for, a streamed one gathered, a file's
/// bytes read; a whole file at most [`MAX_SCRIPT_GET`] bytes).
pub(crate) fn call_whole<S: ScriptSession + ?Sized>(
    session: &mut S,
    op: u16,
    meta: &[u8],
    data: Bytes,
) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError> {
    session.set_current(0, false);
    let mut enc = dispatch::dispatch(session, op, meta, data)?;
    if let Some(later) = enc.later.take() {
        enc = session.wait(later)?;
    }
    let data = match enc.body {
        Body::Events(events) => return session.gather(events),
        Body::None => Vec::new(),
        Body::Bytes(b) => b.to_vec(),
        // A file's bytes are read here rather than sent by the transport, which would
        // count them in the file's accounts: they are counted here.
        Body::File { file, offset, len } => read_counted(&file, offset, len)?,
        Body::Stream(file) => {
            let size = file.stat().map_err(WireError::from)?.size;
            if size > MAX_SCRIPT_GET {
                return Err(WireError::new(Code::TOO_LARGE, "file too large to read whole in a script; use fs.pread"));
            }
            read_counted(&file, 0, size)?
        }
    };
    Ok((enc.metas, data))
}

/// Reads `len` bytes of `file` at `offset`, counted in its accounts as a client's read.
fn read_counted(file: &locus_store::OpenFile, offset: u64, len: u64) -> Result<Vec<u8>, WireError> {
    let started = std::time::Instant::now();
    let data = file.read_at(offset, len as usize).map_err(WireError::from)?;
    file.io.read(data.len() as u64, started.elapsed());
    Ok(data)
}

impl<S: ScriptSession> locus_script::Host for ScriptHost<S> {
    fn call(&mut self, op: u16, meta: &[u8], data: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError> {
        call_whole(&mut self.session, op, meta, Bytes::copy_from_slice(data))
    }

    fn push(&self, client: u64, data: &[u8]) -> bool {
        // A client of another head of the cluster: through the namespace's engine.
        #[cfg(feature = "cluster")]
        if let Some(head) = self.shared.head.as_ref().filter(|h| !h.is_own_client(client)) {
            return head.send_across(client, self.caller, data);
        }
        let msg = Push {
            topic: locus_proto::frame::PUSH_MESSAGE,
            meta: codec::encode(&self.caller),
            data: Bytes::copy_from_slice(data),
        };
        self.shared.registry.push(client, msg)
    }

    fn caller(&self) -> u64 {
        self.caller
    }

    fn subject(&self) -> &str {
        self.session.acting_as()
    }
}
