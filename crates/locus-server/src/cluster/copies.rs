//! `copy` on a cluster head: the source's version read where it lives (inline in the
//! namespace, the head's own directory or the data nodes), staged as a `put` stages its
//! bytes, and committed as the target's new version (a new object, as `put` makes).

use crate::cluster::attr_of;
use crate::cluster::governing;
use crate::cluster::meta_err;
use crate::cluster::placement::later;
use crate::cluster::session::{changed, HeadSession};
use crate::dispatch::Reply;
use locus_cluster::{normalise, Kind as EntryKind, MetaError};
use locus_proto::ops::CopyFile;
use locus_proto::types::{Attr, Rights};
use locus_proto::Error as WireError;
use std::os::unix::fs::FileExt;

/// Bytes read from the source at a time.
const STEP: u64 = 4 << 20;

impl HeadSession {
    /// Copies `req.from` over `req.to` (the read right where `from` is, the write right
    /// where `to` is); answered once the new version is committed.
    pub(crate) fn copy_file(&mut self, req: CopyFile) -> Reply<Attr> {
        let from = normalise(&req.from).map_err(meta_err)?;
        let to = normalise(&req.to).map_err(meta_err)?;
        let (_, source) = self.need_entry(&from, Rights::READ)?;
        if source.kind == EntryKind::Dir {
            return Err(MetaError::IsDir(from).into());
        }
        self.need(governing(&to, false), Rights::WRITE)?;
        let base = self.head.meta.get(&to).map_err(meta_err)?;
        if base.as_ref().is_some_and(|b| b.kind == EntryKind::Dir) {
            return Err(MetaError::IsDir(to).into());
        }
        let mut staged = self.stage(&to, source.mode & 0o7777, base, false)?;
        staged.fresh = true;
        let (head, shared, by) = (self.head.clone(), self.inner.shared.clone(), self.inner.client_id);
        later(&self.head, async move {
            let mut at = 0u64;
            while at < source.size {
                let len = (source.size - at).min(STEP) as u32;
                let data = head.clone().read(source.clone(), at, len).await?;
                if data.is_empty() {
                    break;
                }
                staged.file.write_all_at(&data, at).map_err(|e| WireError::io(&staged.path, e))?;
                at += data.len() as u64;
            }
            let committed = head.clone().commit(&staged).await?;
            changed(&shared, &head, by, &[&committed.path], true);
            Ok(attr_of(&committed).into())
        })
    }
}
