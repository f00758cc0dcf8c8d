//! Acting as a subject for a door other than the native protocol (the web console): the
//! operations, rights checks and callback breaks of a client's connection, on one server
//! and on a cluster head alike, each answered whole (a head's answers that come later,
//! and streamed ones, are waited for, as a script's are).

use crate::script_host::{call_whole, ScriptSession};
use crate::session::Session;
use crate::Shared;
use bytes::Bytes;
use locus_proto::ops::{Operation, Put};
use locus_proto::types::{Attr, Rights};
use locus_proto::{codec, Code, Error as WireError};
use std::sync::Arc;

/// The request id an upload goes under (an acting session runs one at a time).
const UPLOAD: u32 = 1;

/// A session acting as one subject.
pub struct Acting {
    session: Box<dyn ScriptSession>,
    shared: Arc<Shared>,
    subject: String,
}

impl Acting {
    /// A session acting as `subject`: a head's on a cluster head, a plain one elsewhere.
    pub fn new(shared: &Arc<Shared>, subject: &str) -> Acting {
        let plain = Session::acting_as(shared.clone(), subject);
        #[cfg(feature = "cluster")]
        let session: Box<dyn ScriptSession> = match &shared.head {
            Some(head) => Box::new(crate::cluster::HeadSession::new(plain, head.clone())),
            None => Box::new(plain),
        };
        #[cfg(not(feature = "cluster"))]
        let session: Box<dyn ScriptSession> = Box::new(plain);
        Acting { session, shared: shared.clone(), subject: subject.to_string() }
    }

    /// Runs `req` (with `data` as its bytes): its reply pages and the reply's bytes.
    pub fn call<O: Operation>(&mut self, req: &O, data: Bytes) -> Result<(Vec<O::Reply>, Vec<u8>), WireError> {
        let _serving = self.shared.callbacks.serving();
        let (metas, bytes) = call_whole(&mut *self.session, O::INFO.code, &codec::encode(req), data)?;
        let pages = metas.iter().map(|m| codec::decode(m)).collect::<Result<Vec<_>, _>>()?;
        Ok((pages, bytes))
    }

    /// What the subject may do in directory `dir` (nothing, if it cannot be told).
    pub fn rights(&self, dir: &str) -> Rights {
        #[cfg(feature = "cluster")]
        if let Some(head) = &self.shared.head {
            return head.meta.rights(&self.subject, dir).unwrap_or_default();
        }
        self.shared.store.rights(&self.subject, dir).unwrap_or_default()
    }

    /// Starts a whole-file upload to `path`, as `put` does: nothing shows until
    /// [`Acting::put_more`] is given the last bytes, and an upload left unfinished
    /// changes nothing.
    pub fn put_start(&mut self, path: &str, mode: u32) -> Result<(), WireError> {
        self.session.set_current(UPLOAD, true);
        let put = codec::encode(&Put { path: path.to_string(), mode });
        crate::dispatch::dispatch(&mut *self.session, Put::INFO.code, &put, Bytes::new()).map(drop)
    }

    /// Appends `len` bytes of `from` (a file of the server's own, outside the export)
    /// from offset `at` to the upload, in the kernel where the session can; answers how
    /// many came.
    pub fn put_file(&mut self, from: &std::fs::File, at: u64, len: u64) -> Result<u64, WireError> {
        if !self.session.is_uploading(UPLOAD) {
            return Err(WireError::new(Code::INVAL, "no upload is under way"));
        }
        self.session.put_file(UPLOAD, from, at, len)
    }

    /// Makes the file at `from` (the server's own, outside the export, given up to the
    /// upload) its whole content without a copy, before anything else was sent; answers
    /// its size, or `None` where the session cannot (another file system, a cluster
    /// head), and then the file is where it was.
    pub fn put_adopt(&mut self, from: &std::path::Path) -> Result<Option<u64>, WireError> {
        if !self.session.is_uploading(UPLOAD) {
            return Err(WireError::new(Code::INVAL, "no upload is under way"));
        }
        self.session.put_adopt(UPLOAD, from)
    }

    /// Appends `data` to the upload; with `last`, the file becomes what was sent, and
    /// its attributes are answered.
    pub fn put_more(&mut self, data: &[u8], last: bool) -> Result<Option<Attr>, WireError> {
        if !self.session.is_uploading(UPLOAD) {
            return Err(WireError::new(Code::INVAL, "no upload is under way"));
        }
        let mut enc = self.session.put_more(UPLOAD, data, !last)?;
        if !last {
            return Ok(None);
        }
        if let Some(later) = enc.later.take() {
            enc = self.session.wait(later)?;
        }
        let meta = enc.metas.first().ok_or_else(|| WireError::new(Code::IO, "the upload ended without attributes"))?;
        Ok(Some(codec::decode(meta)?))
    }
}
