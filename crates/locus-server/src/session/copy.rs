//! `copy` on one server: a file's bytes copied to another name as a `put` of them would
//! store them (a hidden file beside the target, renamed over it once durable), moved in
//! the kernel (`copy_file_range`) rather than through the client.

use super::{store, Session};
use crate::dispatch::{Answer, Reply};
use locus_proto::ops::CopyFile;
use locus_proto::types::{open_flags, Attr};
use locus_proto::{Code, Error as WireError};

/// Files up to this size are copied on the connection's thread; larger ones on a thread
/// of their own, so the other connections that thread serves are not held up.
const ON_THE_CONNECTION_MAX: u64 = 1 << 20;

impl Session {
    /// Copies `req.from` over `req.to`: the read right where `from` is, the write right
    /// where `to` is, as `get` and `put` need them.
    pub(crate) fn copy_file(&mut self, req: CopyFile) -> Reply<Attr> {
        let who = self.who()?.to_string();
        let from = store(self.shared.store.open(&who, &req.from, open_flags::READ, 0))?;
        let attr = store(from.stat())?;
        if attr.is_dir() {
            return Err(WireError::new(Code::ISDIR, format!("{}: is a directory", req.from)));
        }
        if !attr.is_file() {
            return Err(WireError::new(Code::INVAL, format!("{}: not a regular file", req.from)));
        }
        let mut put = store(self.shared.store.begin_put(&who, &req.to, attr.mode & 0o7777))?;
        let (shared, by) = (self.shared.clone(), self.client_id);
        let copy = move || -> Result<Attr, WireError> {
            // Under way until the change is recorded, wherever the copy runs (see
            // `Callbacks::serving`).
            let _serving = shared.callbacks.serving();
            store(put.copy_from(&from))?;
            let attr = store(put.finish())?;
            shared.callbacks.changed(&shared.registry, by, &[&req.to], true);
            Ok(attr)
        };
        // A script's session (no connection) waits where it is: its thread is its own.
        if attr.size <= ON_THE_CONNECTION_MAX || !self.can_push() {
            return Ok(copy()?.into());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("locus-copy".into())
            .spawn(move || drop(tx.send(copy())))
            .map_err(|e| WireError::new(Code::IO, format!("cannot start the copy: {e}")))?;
        Ok(Answer::later(Box::pin(async move {
            let attr = rx.await.map_err(|_| WireError::new(Code::IO, "the copy stopped"))??;
            Ok(Answer::from(attr).encode())
        })))
    }
}
