//! What code that runs for a subject (a storelet, an active-file handler) sees of a
//! directory: its subtree as the namespace shows it, less everything the subject may
//! not read.
//!
//! - **Refused subdirectories** (where the subject lacks `r` or `l`) are absent, and so
//!   is everything beneath them, whatever rights it holds deeper down.
//! - **Locus' own files** (names starting with [`RESERVED_PREFIX`]: ACLs, uploads in
//!   progress, moves) never appear.
//! - **Several devices** show as one tree (device 0 on top).
//!
//! When nothing is to be hidden on an export of one device, the view is the directory
//! itself. Otherwise it is a read-only overlay of a layer of whiteouts (one for each
//! hidden name, made in the state directory for this view and removed with it) over the
//! directory's copies on every device. The subtree is walked once when the view is made,
//! and while the view lives no name in its directory may be renamed or linked
//! (`EBUSY`, [`LiveViews`]): the whiteouts hide names, so a refused directory renamed or
//! moved in during the run would otherwise appear under its new name. A grant or a
//! refusal made during the run takes effect at the next run.
//!
//! A writable run cannot be given an overlay: it is refused (`EACCES`) where something
//! would have to be hidden, and (`EROFS`) on an export of several devices.

use crate::error::OsContext;
use crate::{Result, Store, StoreError, ACL_FILE, RESERVED_PREFIX};
use locus_proto::types::Rights;
use parking_lot::Mutex;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Names hidden in one view at most (a tree with more refused corners is refused).
const MAX_HIDDEN: usize = 100_000;

/// The directories live code views show (relative to the root, `.` for the root), each
/// with how many views hold it. A view is made once, from the tree as it is: a rename
/// could otherwise bring a refused directory in under a name the view does not hide.
#[derive(Default)]
pub(crate) struct LiveViews(Arc<Mutex<HashMap<String, usize>>>);

impl LiveViews {
    fn hold(&self, rel: &str) -> ViewHold {
        *self.0.lock().entry(rel.to_string()).or_default() += 1;
        ViewHold { views: self.0.clone(), rel: rel.to_string() }
    }

    /// Refuses (`EBUSY`) a change of the name `rel` (`path` for messages) when it lies in
    /// a directory code is running over now.
    pub(crate) fn not_within(&self, rel: &str, path: &str) -> Result<()> {
        let views = self.0.lock();
        let inside =
            |v: &String| v == "." || rel == v || rel.strip_prefix(v.as_str()).is_some_and(|r| r.starts_with('/'));
        if views.keys().any(inside) {
            return Err(StoreError::Os {
                op: "change names where code is running over",
                path: path.to_string(),
                errno: Errno::BUSY,
            });
        }
        Ok(())
    }
}

/// One view's hold on its directory, let go with the view.
struct ViewHold {
    views: Arc<Mutex<HashMap<String, usize>>>,
    rel: String,
}

impl Drop for ViewHold {
    fn drop(&mut self) {
        let mut views = self.views.lock();
        if let Some(n) = views.get_mut(&self.rel) {
            *n -= 1;
            if *n == 0 {
                views.remove(&self.rel);
            }
        }
    }
}

/// A directory as code run for one subject sees it (see the module documentation).
pub struct CodeView {
    /// The view as one open directory: what a WebAssembly run preopens.
    pub dir: OwnedFd,
    /// What the view is made of, top first, for a process that mounts it itself in a
    /// namespace of its own (a native run): one directory, shown as it is, or several,
    /// overlaid read-only (the whiteout layer first, then device 0, then the others).
    pub layers: Vec<OwnedFd>,
    /// Names hidden from the view (relative to it), for logs and tests.
    pub hidden: Vec<PathBuf>,
    /// The whiteout layer's directory, removed with the view.
    scratch: Option<PathBuf>,
    /// Keeps names in the directory from changing while the view lives.
    _hold: ViewHold,
}

impl Drop for CodeView {
    fn drop(&mut self) {
        if let Some(dir) = self.scratch.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS provides randomness");
    hex::encode(b)
}

/// Mounts a read-only overlay of `layers` (top first) at a fresh point under `base`,
/// opens it and detaches it at once: the descriptor alone keeps it.
pub(crate) fn overlay(layers: &[&OwnedFd], base: &Path) -> std::result::Result<OwnedFd, Errno> {
    use std::os::fd::AsRawFd;
    let lower: Vec<String> = layers.iter().map(|fd| format!("/proc/self/fd/{}", fd.as_raw_fd())).collect();
    let data = std::ffi::CString::new(format!("lowerdir={}", lower.join(":"))).map_err(|_| Errno::INVAL)?;
    let point = base.join(format!("view-{}", random_hex()));
    std::fs::create_dir_all(&point).map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    let flags =
        rustix::mount::MountFlags::RDONLY | rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV;
    let view = rustix::mount::mount("locus-view", &point, "overlay", flags, data.as_c_str()).and_then(|()| {
        let opened = rustix::fs::open(&point, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
        let _ = rustix::mount::unmount(&point, rustix::mount::UnmountFlags::DETACH);
        opened
    });
    let _ = std::fs::remove_dir(&point);
    view
}

impl Store {
    /// Where views and unions are mounted and whiteout layers made: the state directory
    /// (or the system's temporary directory for a store without one).
    pub(crate) fn scratch_base(&self) -> PathBuf {
        self.intents.as_deref().and_then(Path::parent).map_or_else(std::env::temp_dir, Path::to_path_buf)
    }

    /// The view code run for `who` gets of the directory `path`: needs `r` and `l`
    /// there (and `w` when `write`); see the module documentation for what it shows.
    pub fn code_view(&self, who: &str, path: &str, write: bool) -> Result<CodeView> {
        let t = self.locate(path, true)?;
        let dir0 = self.open_located_dir(&t, path)?;
        let mut need = Rights::READ.union(Rights::LIST);
        if write {
            need = need.union(Rights::WRITE);
        }
        let rights = self.rights_in(dir0.as_fd(), who)?;
        if !rights.contains(need) {
            return Err(StoreError::Denied { path: path.to_string(), need });
        }
        if self.multi() && write {
            // A union of several devices is read-only.
            return Err(StoreError::Os { op: "run writable code in", path: path.to_string(), errno: Errno::ROFS });
        }
        let rel = if t.rel.is_empty() { ".".to_string() } else { t.rel.clone() };
        // Held before the tree is read: a rename racing the walk is refused, not missed.
        let hold = self.views.hold(&rel);
        let others: Vec<OwnedFd> = if self.multi() {
            (1..self.devices.len()).filter_map(|d| self.dir_on(d, &rel).ok().flatten()).collect()
        } else {
            Vec::new()
        };
        let hidden = self.hidden_from(who, &rel, &dir0)?;
        if hidden.is_empty() && others.is_empty() {
            let layer = rustix::io::fcntl_dupfd_cloexec(&dir0, 0).ctx("dup", path)?;
            return Ok(CodeView { dir: dir0, layers: vec![layer], hidden, scratch: None, _hold: hold });
        }
        if write {
            return Err(StoreError::Os {
                op: "run writable code (it holds what cannot be shown) in",
                path: path.to_string(),
                errno: Errno::ACCESS,
            });
        }
        let base = self.scratch_base();
        let mut layers = Vec::new();
        let mut scratch = None;
        if !hidden.is_empty() {
            let layer = base.join(format!("hide-{}", random_hex()));
            scratch = Some(layer.clone());
            let made = whiteouts(&layer, &hidden).and_then(|()| {
                rustix::fs::open(&layer, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                    .map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))
            });
            match made {
                Ok(fd) => layers.push(fd),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&layer);
                    return Err(StoreError::Invalid(format!("{}: {e}", layer.display())));
                }
            }
        }
        layers.push(dir0);
        layers.extend(others);
        let refs: Vec<&OwnedFd> = layers.iter().collect();
        let dir = match overlay(&refs, &base) {
            Ok(dir) => dir,
            Err(e) if hidden.is_empty() => {
                // Only a union: the code then sees device 0's files only (as before views).
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| tracing::warn!("cannot mount overlays ({e}): code sees device 0's files only"));
                let dir0 = layers.swap_remove(0);
                let layer = rustix::io::fcntl_dupfd_cloexec(&dir0, 0).ctx("dup", path)?;
                return Ok(CodeView { dir: dir0, layers: vec![layer], hidden, scratch, _hold: hold });
            }
            Err(e) => {
                if let Some(s) = &scratch {
                    let _ = std::fs::remove_dir_all(s);
                }
                // Never a view that shows what it should hide.
                return Err(StoreError::Os {
                    op: "confine code to what the subject may read in",
                    path: path.to_string(),
                    errno: e,
                });
            }
        };
        Ok(CodeView { dir, layers, hidden, scratch, _hold: hold })
    }

    /// The names beneath `rel` (device 0's `dir0`) that `who` may not see, relative to
    /// it: Locus' own files on any device, and subdirectories without `r` and `l`.
    fn hidden_from(&self, who: &str, rel: &str, dir0: &OwnedFd) -> Result<Vec<PathBuf>> {
        let mut hidden = Vec::new();
        let need = Rights::READ.union(Rights::LIST);
        let rights = self.rights_in(dir0.as_fd(), who)?;
        let mut stack: Vec<(String, OwnedFd, Rights)> =
            vec![(String::new(), rustix::io::fcntl_dupfd_cloexec(dir0, 0).ctx("dup", rel)?, rights)];
        let join = |a: &str, b: &str| if a.is_empty() { b.to_string() } else { format!("{a}/{b}") };
        let hide = |a: &str, b: &[u8]| {
            let name: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(b);
            Path::new(a).join(name)
        };
        while let Some((at, fd, rights)) = stack.pop() {
            let logical = if rel == "." { at.clone() } else { join(rel, &at) };
            let listing = rustix::fs::Dir::read_from(&fd).ctx("readdir", &logical)?;
            for entry in listing {
                let entry = entry.ctx("readdir", &logical)?;
                let Ok(name) = entry.file_name().to_str() else {
                    // Not a name any client can ask for: not shown either.
                    hidden.push(hide(&at, entry.file_name().to_bytes()));
                    continue;
                };
                if name == "." || name == ".." {
                    continue;
                }
                if name.starts_with(RESERVED_PREFIX) {
                    hidden.push(hide(&at, name.as_bytes()));
                    continue;
                }
                let is_dir = match entry.file_type() {
                    FileType::Directory => true,
                    FileType::Unknown => rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode).is_dir()),
                    _ => false,
                };
                if !is_dir {
                    continue;
                }
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let Ok(sub) = rustix::fs::openat2(&fd, name, flags, Mode::empty(), ResolveFlags::BENEATH) else {
                    hidden.push(hide(&at, name.as_bytes()));
                    continue;
                };
                // A directory without an ACL of its own inherits its parent's.
                let own = rustix::fs::statat(&sub, ACL_FILE, AtFlags::SYMLINK_NOFOLLOW).is_ok();
                let sub_rights = if own { self.rights_in(sub.as_fd(), who)? } else { rights };
                if sub_rights.contains(need) {
                    stack.push((join(&at, name), sub, sub_rights));
                } else {
                    hidden.push(hide(&at, name.as_bytes()));
                }
            }
            // Locus' own files on the other devices (moves in progress).
            for d in 1..self.devices.len() {
                let on = if logical.is_empty() { "." } else { logical.as_str() };
                let Some(other) = self.listable_on(d, on)? else { continue };
                for entry in rustix::fs::Dir::read_from(&other).ctx("readdir", on)? {
                    let entry = entry.ctx("readdir", on)?;
                    let raw = entry.file_name().to_bytes();
                    if raw.starts_with(RESERVED_PREFIX.as_bytes()) {
                        let name = hide(&at, raw);
                        if !hidden.contains(&name) {
                            hidden.push(name);
                        }
                    }
                }
            }
            if hidden.len() > MAX_HIDDEN {
                return Err(StoreError::Invalid(format!(
                    "{rel}: more than {MAX_HIDDEN} names to hide from code run there; run it deeper down"
                )));
            }
        }
        Ok(hidden)
    }
}

/// Makes `layer` a directory holding a whiteout (a character device 0:0, which an
/// overlay shows as nothing) at each of `names`.
fn whiteouts(layer: &Path, names: &[PathBuf]) -> std::io::Result<()> {
    std::fs::create_dir_all(layer)?;
    for name in names {
        let at = layer.join(name);
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent)?;
        }
        rustix::fs::mknodat(rustix::fs::CWD, &at, FileType::CharacterDevice, Mode::empty(), 0)
            .map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))?;
    }
    Ok(())
}
