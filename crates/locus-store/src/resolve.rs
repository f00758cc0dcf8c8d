//! Resolution and confinement, in one short file to audit: every path a client
//! names becomes a directory descriptor beneath the export's root (`openat2` with
//! `RESOLVE_BENEATH`, symbolic links followed by hand, each hop resolved beneath the root
//! again) and a final name, and the subject's rights in that directory are checked from
//! its ACL before anything is done there.

use crate::error::OsContext;
use crate::error::Result;
use crate::Acl;
use crate::Store;
use crate::StoreError;
use crate::RESERVED_PREFIX;
use locus_proto::types::Rights;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// Longest path accepted from a client, as PATH_MAX.
pub const MAX_PATH: usize = 4096;

/// Symlink hops followed before giving ELOOP, as Linux does.
pub(crate) const MAX_HOPS: usize = 40;

/// A name located beneath the root: the directory holding it, opened, and the final
/// component (`.` when the path names a directory itself).
pub(crate) struct Target {
    pub(crate) dir: Option<OwnedFd>,
    pub(crate) name: String,
    /// The normalized path relative to the root, for counters and messages.
    pub(crate) rel: String,
    /// What `locate` learned of the final name while checking it for a symlink (not a
    /// symlink, so this is also what following it gives); saves stating it again.
    pub(crate) stat: Option<rustix::fs::Stat>,
}

impl Target {
    pub(crate) fn dir<'a>(&'a self, store: &'a Store) -> BorrowedFd<'a> {
        self.dir.as_ref().map(|d| d.as_fd()).unwrap_or(store.root.as_fd())
    }
}

pub(crate) fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// Splits a client path into (parent, final name, normalized relative path).
pub(crate) fn split(path: &str) -> Result<(String, String, String)> {
    if path.len() > MAX_PATH {
        return Err(StoreError::Os { op: "resolve", path: path.chars().take(64).collect(), errno: Errno::NAMETOOLONG });
    }
    if path.contains('\0') {
        return Err(StoreError::Invalid("path contains a NUL byte".into()));
    }
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if comps.iter().any(|c| c.starts_with(RESERVED_PREFIX)) {
        return Err(StoreError::Reserved { path: path.to_string() });
    }
    let rel = comps.join("/");
    Ok(match comps.split_last() {
        None => (".".into(), ".".into(), rel),
        Some((&"..", _)) => (rel.clone(), ".".into(), rel),
        Some((last, [])) => (".".into(), last.to_string(), rel),
        Some((last, parents)) => (parents.join("/"), last.to_string(), rel),
    })
}

impl Store {
    /// The directory that holds `t`'s name on the device where it lives.
    pub(crate) fn home_dir<'a>(&'a self, t: &'a Target, alt: &'a Option<OwnedFd>) -> BorrowedFd<'a> {
        alt.as_ref().map_or(t.dir(self), |d| d.as_fd())
    }

    pub(crate) fn open_dir(&self, parent: &str, shown: &str) -> Result<Option<OwnedFd>> {
        if parent == "." {
            return Ok(None);
        }
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        rustix::fs::openat2(&self.root, parent, flags, Mode::empty(), resolve_flags()).ctx("resolve", shown).map(Some)
    }

    /// Finds the directory holding `path` and its final name, following a final symlink
    /// when `follow` is set.
    pub(crate) fn locate(&self, path: &str, follow: bool) -> Result<Target> {
        let (mut parent, mut name, mut rel) = split(path)?;
        let mut dir = self.open_dir(&parent, path)?;
        if !follow || name == "." {
            return Ok(Target { dir, name, rel, stat: None });
        }
        for _ in 0..MAX_HOPS {
            let d = dir.as_ref().map(|d| d.as_fd()).unwrap_or(self.root.as_fd());
            let st = match rustix::fs::statat(d, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => return Ok(Target { dir, name, rel, stat: None }),
                Err(e) => return Err(e).ctx("stat", path),
            };
            if st.st_mode as u32 & locus_proto::types::S_IFMT != locus_proto::types::S_IFLNK {
                return Ok(Target { dir, name, rel, stat: Some(st) });
            }
            let link = rustix::fs::readlinkat(d, name.as_str(), Vec::new()).ctx("readlink", path)?;
            let link =
                link.to_str().map_err(|_| StoreError::Invalid(format!("{path}: symlink target is not UTF-8")))?;
            if link.starts_with('/') {
                return Err(StoreError::Escape { path: path.to_string() });
            }
            let joined = if parent == "." { link.to_string() } else { format!("{parent}/{link}") };
            (parent, name, rel) = split(&joined)?;
            dir = self.open_dir(&parent, path)?;
            if name == "." {
                return Ok(Target { dir, name, rel, stat: None });
            }
        }
        Err(StoreError::Os { op: "resolve", path: path.to_string(), errno: Errno::LOOP })
    }

    pub(crate) fn rights_in(&self, dir: BorrowedFd<'_>, who: &str) -> Result<Rights> {
        Ok(self.acl_of(dir)?.rights_of(who))
    }

    /// The ACL in force in `dir`.
    pub(crate) fn acl_of(&self, dir: BorrowedFd<'_>) -> Result<Arc<Acl>> {
        // Names directly beneath the root are the common case; the root's identity is known.
        let known = (dir.as_raw_fd() == self.root.as_raw_fd()).then_some(self.root_key);
        self.acls.effective(dir, known, self.root_key)
    }

    pub(crate) fn check(&self, dir: BorrowedFd<'_>, who: &str, need: Rights, path: &str) -> Result<()> {
        if self.rights_in(dir, who)?.contains(need) {
            Ok(())
        } else {
            Err(StoreError::Denied { path: path.to_string(), need })
        }
    }

    /// Locates `path` and checks `need` on the directory that holds it.
    pub(crate) fn locate_checked(&self, who: &str, path: &str, follow: bool, need: Rights) -> Result<Target> {
        let t = self.locate(path, follow)?;
        self.check(t.dir(self), who, need, path)?;
        Ok(t)
    }

    /// Opens the directory that `path` names (following symlinks) for reading.
    pub(crate) fn open_target_dir(&self, path: &str) -> Result<OwnedFd> {
        let t = self.locate(path, true)?;
        self.open_located_dir(&t, path)
    }

    pub(crate) fn open_located_dir(&self, t: &Target, path: &str) -> Result<OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat2(t.dir(self), t.name.as_str(), flags, Mode::empty(), resolve_flags()).ctx("opendir", path)
    }
}
