//! A data node's objects: the versions of files a head stored here (one file per
//! version under [`OBJECTS_DIR`] in the export), served to holders of a capability the
//! head signed, stored and dropped only for the head; and the views (hard links under
//! [`VIEWS_DIR`]) that a node's share of a cluster-wide storelet run sees. The plain
//! server's [`Session`] answers these operations through the methods here.

use crate::dispatch::Answer;
use crate::dispatch::Reply;
use crate::session::{store, Session};
use crate::transport::Body;
use bytes::Bytes;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError};
use locus_store::StoreError;
use std::sync::Arc;

/// Where a data node keeps objects, under its export.
pub const OBJECTS_DIR: &str = "objects";

/// The path of one version of an object on a data node.
pub fn object_path(object: u64, version: u64) -> String {
    format!("/{OBJECTS_DIR}/{object}.{version}")
}

/// Where a data node lays out the files of a cluster-wide run, under its export.
pub const VIEWS_DIR: &str = "views";

/// A directory of hard links to object versions (and copies of inline files) under
/// their names in a cluster-wide run: what the node's share of the run sees. Removed
/// when dropped.
struct View {
    /// The directory, relative to the export.
    rel: String,
    abs: std::path::PathBuf,
}

impl View {
    fn make(root: &std::path::Path, files: &[ViewFile]) -> Result<View, WireError> {
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).expect("the OS provides randomness");
        let name = hex::encode(id);
        let abs = root.join(VIEWS_DIR).join(&name);
        let io = WireError::io;
        std::fs::create_dir_all(&abs).map_err(|e| io("view", e))?;
        let view = View { rel: format!("/{VIEWS_DIR}/{name}"), abs };
        for f in files {
            let parts: Vec<&str> = f.path.split('/').filter(|p| !p.is_empty()).collect();
            if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == ".." || p.contains('\0')) {
                return Err(WireError::new(Code::INVAL, format!("{:?}: not a relative path", f.path)));
            }
            let to = parts.iter().fold(view.abs.clone(), |p, part| p.join(part));
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(&f.path, e))?;
            }
            match &f.inline {
                Some(bytes) => std::fs::write(&to, bytes).map_err(|e| io(&f.path, e))?,
                None => {
                    let from = root.join(OBJECTS_DIR).join(format!("{}.{}", f.object, f.version));
                    std::fs::hard_link(from, &to).map_err(|e| io(&f.path, e))?
                }
            }
        }
        Ok(view)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.abs);
    }
}

impl Session {
    /// The cluster's keys, on a data node that has joined its head.
    pub(crate) fn node_key(&self) -> Result<Arc<locus_proto::capability::KeyRing>, WireError> {
        self.shared
            .node_key()
            .ok_or_else(|| WireError::new(Code::NOTSUP, "this server is not a data node that has joined a head"))
    }

    /// Checks that the caller is the cluster's head.
    pub(crate) fn check_from_head(&self) -> Result<(), WireError> {
        match self.who()? {
            locus_proto::capability::HEAD_SUBJECT => Ok(()),
            _ => Err(WireError::new(Code::ACCES, "only the cluster's head stores and drops objects")),
        }
    }

    /// `object_read`: a version of an object, to a holder of the head's capability for it.
    pub(crate) fn serve_object_read(&mut self, req: ObjectRead, _: Bytes) -> Reply<()> {
        let key = self.node_key()?;
        let cap = &req.capability;
        if let Err(why) = key.verify(cap, self.who()?, locus_proto::capability::now()) {
            tracing::warn!(
                subject = self.who()?,
                object = cap.object,
                version = cap.version,
                ?why,
                "capability refused"
            );
            return Err(WireError::new(Code::ACCES, format!("capability refused: {why:?}")));
        }
        let file = store(self.shared.store.open(
            crate::config::ADMIN_SUBJECT,
            &object_path(cap.object, cap.version),
            open_flags::READ,
            0,
        ))
        .map_err(|e| {
            if e.code == Code::NOENT {
                WireError::new(Code::NOENT, "that version is gone from this node")
            } else {
                e
            }
        })?;
        let len = (req.len.min(self.shared.config.limits.max_data) as u64).min(cap.size.saturating_sub(req.offset));
        Ok(Answer::with_body((), Body::File { file: Arc::new(file), offset: req.offset, len }))
    }

    /// `object_put`: the head stores a version of an object here (durably).
    pub(crate) fn store_object(&mut self, req: ObjectPut, data: Bytes) -> Reply<Attr> {
        self.node_key()?;
        self.check_from_head()?;
        let put = Put { path: object_path(req.object, req.version), mode: 0o600 };
        self.start_put(crate::config::ADMIN_SUBJECT, put, data, true)
    }

    /// `object_drop`: the head drops a version of an object it no longer needs.
    pub(crate) fn drop_object(&mut self, req: ObjectDrop, _: Bytes) -> Reply<()> {
        self.node_key()?;
        self.check_from_head()?;
        match self.shared.store.unlink(crate::config::ADMIN_SUBJECT, &object_path(req.object, req.version)) {
            Err(StoreError::Os { errno, .. }) if errno == rustix::io::Errno::NOENT => Ok(().into()),
            other => Ok(store(other)?.into()),
        }
    }

    /// `node_run`: this node's share of a cluster-wide storelet run, over a view of the
    /// files the head named.
    pub(crate) fn run_share(&mut self, req: NodeRun, data: Bytes) -> Reply<StoreletEvent> {
        self.node_key()?;
        self.check_from_head()?;
        let view = View::make(&self.shared.config.root, &req.files)?;
        let dir = store(self.shared.store.code_view(crate::config::ADMIN_SUBJECT, &view.rel, false))?;
        let submission = crate::storelet_host::Submission {
            subject: req.subject,
            wasm: data,
            args: req.args,
            env: req.env,
            view: dir,
            write: false,
            record_inputs: false,
            native: None,
            active_file: None,
        };
        let (control, mut events) = self.shared.storelets.submit(submission)?;
        self.storelet_runs.retain(|c| Arc::strong_count(c) > 1);
        self.storelet_runs.push(control);
        // The view goes once the run's last event has been handed on.
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        let queued = events.queued.clone();
        tokio::spawn(async move {
            let mut view = Some(view);
            while let Some(frame) = events.frames.recv().await {
                if !frame.more {
                    view.take();
                }
                if tx.send(frame).is_err() {
                    break;
                }
            }
        });
        let stream = crate::transport::EventStream { frames, queued };
        Ok(Answer::events(stream))
    }
}
