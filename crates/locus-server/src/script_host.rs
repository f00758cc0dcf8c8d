//! How a script reaches the file service: a session of its own, authenticated as the
//! calling subject, so a script has exactly its caller's rights. Its handles close when
//! the call ends, with the session.
//!
//! A session's handler (`session/handler.rs`) runs a script through this host, and this
//! host makes a session (`session/mod.rs`): mutual in idea, one way between files.

use crate::dispatch;
use crate::session::Session;
use crate::transport::Body;
use crate::{Push, Shared};
use bytes::Bytes;
use locus_proto::{codec, Code, Error as WireError};
use std::sync::Arc;

/// Largest file a script may read whole with `fs.get`.
const MAX_SCRIPT_GET: u64 = 64 << 20;

/// The [`locus_script::Host`] of one script call.
pub struct ScriptHost {
    session: Session,
    shared: Arc<Shared>,
    caller: u64,
}

impl ScriptHost {
    /// A host acting as `subject` for the client `caller`.
    pub fn new(shared: Arc<Shared>, subject: &str, caller: u64) -> Self {
        ScriptHost { session: Session::acting_as(shared.clone(), subject), shared, caller }
    }
}

impl locus_script::Host for ScriptHost {
    fn call(&mut self, op: u16, meta: &[u8], data: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError> {
        self.session.set_current(0, false);
        let enc = dispatch::dispatch(&mut self.session, op, meta, Bytes::copy_from_slice(data))?;
        // Only a storelet run answers later (script calls refuse a script's session).
        if enc.later.is_some() {
            return Err(WireError::new(Code::NOTSUP, "scripts cannot run storelets"));
        }
        let data = match enc.body {
            Body::Events(_) => return Err(WireError::new(Code::NOTSUP, "scripts cannot run storelets")),
            Body::None => Vec::new(),
            Body::Bytes(b) => b.to_vec(),
            Body::File { file, offset, len } => file.read_at(offset, len as usize).map_err(WireError::from)?,
            Body::Stream(file) => {
                let size = file.stat().map_err(WireError::from)?.size;
                if size > MAX_SCRIPT_GET {
                    return Err(WireError::new(
                        Code::TOO_LARGE,
                        "file too large to read whole in a script; use fs.pread",
                    ));
                }
                file.read_at(0, size as usize).map_err(WireError::from)?
            }
        };
        Ok((enc.metas, data))
    }

    fn push(&self, client: u64, data: &[u8]) -> bool {
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
        self.session.subject().expect("a script's session acts as its caller")
    }
}
