//! Symbolic links on a head, as one server has them: a link is a namespace entry whose
//! inline content is its target; `stat`, `open`, `get`, `readdir`, `locate` and `share`
//! follow a link at the end of a path (up to [`MAX_LINKS`] in a row), `lstat`,
//! `readlink`, `unlink` and `rename` act on the link itself. A target leads only within
//! the namespace (`..` above the root is refused when followed). Links in the middle
//! of a path are not followed. Hard links (`link`) are rows naming one object
//! (`locus_cluster::Meta::link`).

use crate::cluster::governing;
use crate::cluster::meta_err;
use crate::cluster::session::HeadSession;
use locus_cluster::{link_target, normalise, Content, Entry, Kind as EntryKind, MetaError};
use locus_proto::types::Rights;
use locus_proto::{Code, Error as WireError};

/// Links followed in a row before `ELOOP`, as Linux's `MAXSYMLINKS`.
pub(crate) const MAX_LINKS: usize = 40;

/// The longest target a link may have.
const TARGET_MAX: usize = 4096;

impl HeadSession {
    /// `path` with a link at its end followed until it names no link.
    pub(crate) fn follow(&self, path: String) -> Result<String, WireError> {
        let mut path = path;
        for _ in 0..MAX_LINKS {
            match self.head.meta.get(&path).map_err(meta_err)? {
                Some(e) if e.kind == EntryKind::Symlink => path = target_of(&e)?,
                _ => return Ok(path),
            }
        }
        Err(WireError::new(Code::LOOP, format!("{path}: too many symbolic links")))
    }

    /// `symlink`: makes a link at `path` to `target` (needs `w` in its directory).
    pub(crate) fn make_link(&self, target: &str, path: &str) -> Result<(), WireError> {
        let path = normalise(path).map_err(meta_err)?;
        if target.is_empty() || target.len() > TARGET_MAX || target.contains('\0') {
            return Err(WireError::new(
                Code::INVAL,
                format!("{path}: a link's target is 1 to {TARGET_MAX} bytes, no NUL"),
            ));
        }
        self.need(governing(&path, false), Rights::WRITE)?;
        let id = self.head.meta.next_id().map_err(meta_err)?;
        let mut e = Entry::empty(path, EntryKind::Symlink, 0o777, id);
        e.size = target.len() as u64;
        e.content = Content::Inline(target.as_bytes().to_vec());
        self.head.meta.create(&e).map_err(meta_err)
    }

    /// `readlink`: a link's target (needs `l` in its directory).
    pub(crate) fn read_link(&self, path: &str) -> Result<String, WireError> {
        let path = normalise(path).map_err(meta_err)?;
        let (_, e) = self.need_entry_here(&path, Rights::LIST)?;
        match e.kind {
            EntryKind::Symlink => Ok(String::from_utf8_lossy(link_bytes(&e)).into_owned()),
            _ => Err(WireError::new(Code::INVAL, format!("{path}: not a symbolic link"))),
        }
    }
}

fn link_bytes(e: &Entry) -> &[u8] {
    match &e.content {
        Content::Inline(bytes) => bytes,
        Content::Nodes(_) => &[],
    }
}

/// Where the link `e` leads.
fn target_of(e: &Entry) -> Result<String, WireError> {
    let target = String::from_utf8_lossy(link_bytes(e));
    link_target(&e.path, &target).map_err(|err| match err {
        MetaError::Invalid(why) => WireError::new(Code::ACCES, why),
        other => other.into(),
    })
}
