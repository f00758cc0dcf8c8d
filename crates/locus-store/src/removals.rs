//! Removals: `unlink` and `rmdir`, and the observer told when the last link of an
//! object goes (the server's callbacks and open-file bookkeeping listen).

use crate::error::OsContext;
use crate::error::Result;
use crate::object_id;
use crate::ObjectId;
use crate::Store;
use crate::StoreError;
use crate::ACL_FILE;
use locus_proto::types::Rights;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// Told when an object leaves the export through the store: its last name removed by
/// `unlink`, `rmdir`, or replaced by `rename` or a finished `put`. Other parts of the
/// server attach things to objects (scripts' per-file state) and drop them here.
/// Removals made on the server's disk behind the store's back are not seen.
pub trait RemovalObserver: Send + Sync {
    /// True while anything is attached or could be (a script holds a handle); when
    /// false, removals are not looked up at all.
    fn watching(&self) -> bool;
    /// The object is gone.
    fn removed(&self, object: ObjectId);
}

/// The object `name` in `dir` stands for, when removing that name removes the object (a
/// directory, or a file with one link) and `observer` is watching.
pub(crate) fn last_link(
    observer: Option<&Arc<dyn RemovalObserver>>,
    dir: BorrowedFd<'_>,
    name: &str,
) -> Option<ObjectId> {
    if !observer?.watching() {
        return None;
    }
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir();
    (is_dir || st.st_nlink <= 1).then_some(object_id(&st))
}

/// Tells `observer` that `gone` left the export, if it did.
pub(crate) fn report_removed(observer: Option<&Arc<dyn RemovalObserver>>, gone: Option<ObjectId>) {
    if let (Some(o), Some(id)) = (observer, gone) {
        o.removed(id);
    }
}

impl Store {
    /// Sets who is told of removals (once; later calls are ignored).
    pub fn observe_removals(&self, observer: Arc<dyn RemovalObserver>) {
        let _ = self.removals.set(observer);
    }

    /// Removes an empty directory (its hidden ACL file does not count as content).
    pub fn rmdir(&self, who: &str, path: &str) -> Result<()> {
        let t = self.locate_checked(who, path, false, Rights::DELETE)?;
        let _names = self.names_lock();
        if self.multi() && self.has_content_elsewhere(&t.rel)? {
            return Err(StoreError::Os { op: "rmdir", path: path.to_string(), errno: Errno::NOTEMPTY });
        }
        let d = t.dir(self);
        let gone = last_link(self.removals.get(), d, &t.name);
        match rustix::fs::unlinkat(d, t.name.as_str(), AtFlags::REMOVEDIR) {
            Err(Errno::NOTEMPTY) if self.only_acl_inside(d, &t.name)? => {
                let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let sub = rustix::fs::openat(d, t.name.as_str(), flags, Mode::empty()).ctx("rmdir", path)?;
                rustix::fs::unlinkat(&sub, ACL_FILE, AtFlags::empty()).ctx("rmdir", path)?;
                rustix::fs::unlinkat(d, t.name.as_str(), AtFlags::REMOVEDIR).ctx("rmdir", path)?;
            }
            r => r.ctx("rmdir", path)?,
        }
        report_removed(self.removals.get(), gone);
        if self.multi() {
            self.rmdir_elsewhere(&t.rel);
        }
        self.acls.invalidate();
        Ok(())
    }

    pub(crate) fn only_acl_inside(&self, dir: BorrowedFd<'_>, name: &str) -> Result<bool> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let sub = rustix::fs::openat(dir, name, flags, Mode::empty()).ctx("rmdir", name)?;
        for entry in rustix::fs::Dir::read_from(&sub).ctx("readdir", name)? {
            let entry = entry.ctx("readdir", name)?;
            let n = entry.file_name().to_bytes();
            if n != b"." && n != b".." && n != ACL_FILE.as_bytes() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Removes a name that is not a directory.
    pub fn unlink(&self, who: &str, path: &str) -> Result<()> {
        let t = self.locate_checked(who, path, false, Rights::DELETE)?;
        let _names = self.names_lock();
        let (alt, _) = self.home(&t)?;
        let dir = self.home_dir(&t, &alt);
        let gone = last_link(self.removals.get(), dir, &t.name);
        rustix::fs::unlinkat(dir, t.name.as_str(), AtFlags::empty()).ctx("unlink", path)?;
        report_removed(self.removals.get(), gone);
        self.counters.removed(&t.rel);
        Ok(())
    }
}
