//! Several storage devices under one namespace (Lerna's rebalancing), as mergerfs does
//! it: each device is a directory tree; a file's content lives on exactly one device at
//! its logical path; names never say which.
//!
//! - **Device 0** (the export root) holds the whole namespace's directories, their ACLs,
//!   symbolic links, and the files placed on it. The other devices hold regular files
//!   and the directories needed to hold them.
//! - **Placement**: a new file goes to the device with the most free space (the lowest
//!   index on a tie). A file keeps its device when rewritten or renamed.
//! - **Lookups** try device 0 first, then the others. With one device none of this runs.
//! - **Changes to the namespace** (create, rename, remove) take one lock when there are
//!   several devices, so that no name is ever created on two.
//! - **Moves** ([`Store::rebalance`]) copy a file to its new device, then, with its
//!   writers held off, check it did not change, rename the copy into place, put the new
//!   copy under every open handle's descriptor (`dup3`) and remove the old one. An intent
//!   record in the state directory lets a start after a crash finish or undo each move.

use crate::error::OsContext;
use crate::{Result, Store, StoreError, Target, RESERVED_PREFIX};
use locus_proto::types::{FileStats, Move, Rebalance};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Prefix of a copy being made by a move (hidden: it starts with the reserved prefix).
const MOVE_PREFIX: &str = ".__locus_move_";
/// Times a move copies a file that keeps changing while it is being copied, pausing a
/// little longer after each lost race (a file written steadily leaves gaps between its
/// writes; a move runs on a thread of its own).
const MOVE_TRIES: u64 = 10;

/// One storage directory of the export.
pub struct Device {
    pub(crate) root: OwnedFd,
    pub(crate) path: PathBuf,
}

impl Device {
    /// Opens a device directory.
    pub(crate) fn open(path: &Path) -> Result<Device> {
        let shown = path.display().to_string();
        let root = rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .ctx("open device", &shown)?;
        Ok(Device { root, path: path.to_path_buf() })
    }

    /// Bytes free and in all on the device's file system.
    pub(crate) fn space(&self) -> (u64, u64) {
        rustix::fs::fstatvfs(&self.root).map(|s| (s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize)).unwrap_or((0, 0))
    }
}

/// What a crash may interrupt, recorded before it starts and removed when done.
#[derive(Debug, Serialize, Deserialize)]
enum Intent {
    /// Moving `path`'s content from one device to another.
    Move { path: String, from: u32, to: u32 },
    /// Renaming a directory on every device that has it.
    RenameDir { from: String, to: String },
}

/// The parent part of a relative path ("." for a top-level name).
pub(crate) fn parent_of(rel: &str) -> &str {
    rel.rsplit_once('/').map_or(".", |(p, _)| p)
}

fn name_of(rel: &str) -> &str {
    rel.rsplit_once('/').map_or(rel, |(_, n)| n)
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS provides randomness");
    hex::encode(b)
}

impl Store {
    /// True when the export has more than one device.
    pub(crate) fn multi(&self) -> bool {
        self.devices.len() > 1
    }

    /// The directory `parent` (relative) on device `d`, if it exists there.
    pub(crate) fn dir_on(&self, d: usize, parent: &str) -> Result<Option<OwnedFd>> {
        self.open_dir_on(d, parent, OFlags::PATH)
    }

    /// The directory `rel` on device `d` opened for listing, if it exists there.
    pub(crate) fn listable_on(&self, d: usize, rel: &str) -> Result<Option<OwnedFd>> {
        self.open_dir_on(d, if rel.is_empty() { "." } else { rel }, OFlags::RDONLY)
    }

    fn open_dir_on(&self, d: usize, parent: &str, how: OFlags) -> Result<Option<OwnedFd>> {
        let flags = how | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match rustix::fs::openat2(&self.devices[d].root, parent, flags, Mode::empty(), ResolveFlags::BENEATH) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) => Ok(None),
            Err(e) => Err(e).ctx("resolve", parent),
        }
    }

    /// Where the name of `t` lives: the directory holding it on another device (and that
    /// device), or `None` for device 0, which is also the answer for a name that exists
    /// nowhere. With one device, always `None` without a system call.
    pub(crate) fn home(&self, t: &Target) -> Result<(Option<OwnedFd>, u32)> {
        Ok(self.find_home(t)?.unwrap_or((None, 0)))
    }

    /// As [`Store::home`], but `None` when the name exists on no device (with one
    /// device, the name is taken to exist: only callers with several ask).
    pub(crate) fn find_home(&self, t: &Target) -> Result<Option<(Option<OwnedFd>, u32)>> {
        if !self.multi() || t.name == "." || t.stat.is_some() {
            return Ok(Some((None, 0)));
        }
        match rustix::fs::statat(t.dir(self), t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => return Ok(Some((None, 0))),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(e).ctx("stat", &t.rel),
        }
        let parent = parent_of(&t.rel);
        for d in 1..self.devices.len() {
            if let Some(dir) = self.dir_on(d, parent)? {
                if rustix::fs::statat(&dir, t.name.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                    return Ok(Some((Some(dir), d as u32)));
                }
            }
        }
        Ok(None)
    }

    /// The device a new file goes to: the most free space, the lowest index on a tie.
    pub(crate) fn place(&self) -> u32 {
        let mut best = (0u32, 0u64);
        for (i, d) in self.devices.iter().enumerate() {
            let free = d.space().0;
            if free > best.1 {
                best = (i as u32, free);
            }
        }
        best.0
    }

    /// Opens the directory `parent` on device `d`, creating it and its ancestors as
    /// needed (with the modes they have on device 0).
    pub(crate) fn mkdirs_on(&self, d: usize, parent: &str) -> Result<OwnedFd> {
        if let Some(fd) = self.dir_on(d, parent)? {
            return Ok(fd);
        }
        let mut at = String::new();
        for comp in parent.split('/').filter(|c| !c.is_empty() && *c != ".") {
            at = if at.is_empty() { comp.to_string() } else { format!("{at}/{comp}") };
            let mode = rustix::fs::statat(&self.root, at.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| Mode::from_raw_mode(st.st_mode & 0o7777))
                .unwrap_or(Mode::from_raw_mode(0o755));
            match rustix::fs::mkdirat(&self.devices[d].root, at.as_str(), mode) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e).ctx("mkdir", &at),
            }
        }
        self.dir_on(d, parent)?.ok_or_else(|| StoreError::Os { op: "mkdir", path: parent.into(), errno: Errno::NOENT })
    }

    /// Fails with `EEXIST` if `t`'s name is a file on another device (before something
    /// is created under that name on device 0).
    pub(crate) fn not_elsewhere(&self, t: &Target) -> Result<()> {
        match self.home(t)? {
            (Some(_), _) => Err(StoreError::Os { op: "create", path: t.rel.clone(), errno: Errno::EXIST }),
            _ => Ok(()),
        }
    }

    /// Lists the names of regular files in the directory `rel` on devices other than 0,
    /// with their attributes.
    pub(crate) fn list_elsewhere(&self, rel: &str, out: &mut Vec<locus_proto::types::DirEntry>) -> Result<()> {
        let mut seen: std::collections::HashSet<String> = out.iter().map(|e| e.name.clone()).collect();
        for d in 1..self.devices.len() {
            let Some(dir) = self.listable_on(d, rel)? else { continue };
            for entry in rustix::fs::Dir::read_from(&dir).ctx("readdir", rel)? {
                let entry = entry.ctx("readdir", rel)?;
                let Ok(name) = entry.file_name().to_str() else { continue };
                if name.starts_with(RESERVED_PREFIX) || name == "." || name == ".." || seen.contains(name) {
                    continue;
                }
                match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if !FileType::from_raw_mode(st.st_mode).is_dir() => {
                        seen.insert(name.to_string());
                        out.push(locus_proto::types::DirEntry { name: name.to_string(), attr: crate::attr_of(&st) });
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// True when the directory `rel` holds anything on a device other than 0, a file or a
    /// subdirectory (which holds files, or is a leftover that goes with it): it is not
    /// empty in the namespace.
    pub(crate) fn has_content_elsewhere(&self, rel: &str) -> Result<bool> {
        for d in 1..self.devices.len() {
            let Some(dir) = self.listable_on(d, rel)? else { continue };
            for entry in rustix::fs::Dir::read_from(&dir).ctx("readdir", rel)? {
                let entry = entry.ctx("readdir", rel)?;
                let n = entry.file_name().to_bytes();
                if n != b"." && n != b".." && !n.starts_with(RESERVED_PREFIX.as_bytes()) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Removes the (empty) directory `rel` from every device but 0.
    pub(crate) fn rmdir_elsewhere(&self, rel: &str) {
        for d in 1..self.devices.len() {
            let _ = rustix::fs::unlinkat(&self.devices[d].root, rel, AtFlags::REMOVEDIR);
        }
    }

    /// Removes `rel` from every device but `keep` (after a rename or an upload made it
    /// there, a name on another device is the one it replaced).
    pub(crate) fn drop_duplicates(&self, rel: &str, keep: u32) {
        for d in 0..self.devices.len() {
            if d as u32 == keep {
                continue;
            }
            if let Ok(Some(dir)) = self.dir_on(d, parent_of(rel)) {
                if let Ok(st) = rustix::fs::statat(&dir, name_of(rel), AtFlags::SYMLINK_NOFOLLOW) {
                    if !FileType::from_raw_mode(st.st_mode).is_dir() {
                        let _ = rustix::fs::unlinkat(&dir, name_of(rel), AtFlags::empty());
                    }
                }
            }
        }
    }

    /// Renames the directory `from` to `to` on every device but 0 that has it.
    pub(crate) fn rename_dir_elsewhere(&self, from: &str, to: &str) -> Result<()> {
        for d in 1..self.devices.len() {
            if self.dir_on(d, from)?.is_none() {
                continue;
            }
            let target_parent = self.mkdirs_on(d, parent_of(to))?;
            let from_parent = self.dir_on(d, parent_of(from))?.expect("it holds the directory");
            rustix::fs::renameat(&from_parent, name_of(from), &target_parent, name_of(to)).ctx("rename", from)?;
        }
        Ok(())
    }

    /// A read-only view of the directory `rel` as the namespace shows it, for code that
    /// runs over it: an overlay mount of its copies on every device (device 0 on top),
    /// opened and detached at once, so the descriptor alone keeps it and it goes with
    /// it. `None` when only device 0 has the directory, or when this process may not
    /// mount (the code then sees device 0's files only, and a warning is logged).
    pub(crate) fn union_view(&self, rel: &str, dir0: &OwnedFd) -> Option<OwnedFd> {
        let rel = if rel.is_empty() { "." } else { rel };
        let others: Vec<OwnedFd> = (1..self.devices.len()).filter_map(|d| self.dir_on(d, rel).ok().flatten()).collect();
        if others.is_empty() {
            return None;
        }
        let layers: Vec<&OwnedFd> = std::iter::once(dir0).chain(&others).collect();
        crate::view::overlay(&layers, &self.scratch_base())
            .map_err(|e| {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| tracing::warn!("cannot mount overlays ({e}): code sees device 0's files only"));
            })
            .ok()
    }

    fn intents_dir(&self) -> Option<&Path> {
        self.intents.as_deref()
    }

    /// Records an intent; returns the file to remove when it is carried out.
    fn intend(&self, intent: &Intent) -> Result<Option<PathBuf>> {
        let Some(dir) = self.intents_dir() else { return Ok(None) };
        let path = dir.join(format!("{}.json", random_hex()));
        let io = |e: std::io::Error| StoreError::Invalid(format!("{}: {e}", path.display()));
        let f = std::fs::File::create(&path).map_err(io)?;
        serde_json::to_writer(&f, intent).map_err(|e| StoreError::Invalid(e.to_string()))?;
        f.sync_all().map_err(io)?;
        Ok(Some(path))
    }

    /// Records that a directory rename is under way on every device.
    pub(crate) fn intend_rename_dir(&self, from: &str, to: &str) -> Result<Option<PathBuf>> {
        self.intend(&Intent::RenameDir { from: from.into(), to: to.into() })
    }

    /// Finishes or undoes what a crash interrupted (called at start).
    pub(crate) fn repair(&self) {
        let Some(dir) = self.intents_dir() else { return };
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let intent = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Intent>(&b).ok());
            match intent {
                Some(Intent::Move { path: rel, from, to }) => self.repair_move(&rel, from, to),
                Some(Intent::RenameDir { from, to }) => {
                    if let Err(e) = self.rename_dir_elsewhere(&from, &to) {
                        tracing::warn!("repairing the rename of {from} to {to}: {e}");
                    }
                }
                None => {}
            }
            tracing::info!("repaired an interrupted operation ({})", path.display());
            let _ = std::fs::remove_file(&path);
        }
    }

    /// A move cut short: if the copy was renamed into place the old one goes (no write
    /// happened in between: writers were held off); otherwise the copy goes.
    fn repair_move(&self, rel: &str, from: u32, to: u32) {
        let parent = parent_of(rel);
        let (Ok(Some(src)), Ok(dst)) = (self.dir_on(from as usize, parent), self.dir_on(to as usize, parent)) else {
            return;
        };
        if let Some(dst) = dst {
            let placed = rustix::fs::statat(&dst, name_of(rel), AtFlags::SYMLINK_NOFOLLOW).is_ok();
            if placed {
                let _ = rustix::fs::unlinkat(&src, name_of(rel), AtFlags::empty());
                if let Some(e) = self.counters.entry(rel) {
                    e.set_device(to);
                }
            }
            remove_move_copies(&dst);
        }
    }

    /// The moves that even out the devices' measured load, at most `max_moves`: the
    /// busiest file of the busiest device goes to the least busy one while that lowers
    /// the busier of the two.
    pub fn rebalance_plan(&self, who: &str, max_moves: u32) -> Result<Rebalance> {
        self.check(self.root.as_fd(), who, locus_proto::Rights::ADMIN, "/")?;
        let n = self.devices.len();
        let mut files: Vec<FileStats> = self.counters.all();
        files.retain(|f| (f.device as usize) < n && f.io.load() > 0);
        let mut load = vec![0u64; n];
        for f in &files {
            load[f.device as usize] += f.io.load();
        }
        let before = load.clone();
        files.sort_by(|a, b| b.io.load().cmp(&a.io.load()).then_with(|| a.path.cmp(&b.path)));
        let mut moves = Vec::new();
        let mut moved = std::collections::HashSet::new();
        while moves.len() < max_moves as usize && n > 1 {
            let hot = (0..n).max_by_key(|&d| (load[d], std::cmp::Reverse(d))).expect("devices");
            let cold = (0..n).min_by_key(|&d| (load[d], d)).expect("devices");
            // The busiest file of the hot device that, moved, leaves both below the hot
            // device's load now (else moving it only shifts the peak).
            let pick = files.iter().find(|f| {
                let l = f.io.load();
                f.device as usize == hot && !moved.contains(&f.path) && load[cold] + l < load[hot]
            });
            let Some(f) = pick else { break };
            let Some(size) = self.movable(&f.path, hot) else {
                moved.insert(f.path.clone());
                continue;
            };
            let l = f.io.load();
            load[hot] -= l;
            load[cold] += l;
            moved.insert(f.path.clone());
            moves.push(Move { path: f.path.clone(), from: hot as u32, to: cold as u32, load: l, size });
        }
        Ok(Rebalance { moves, before, after: load, skipped: Vec::new() })
    }

    /// The size of the file at `rel` if it can be moved from device `d`: a regular file
    /// with one link, there now.
    fn movable(&self, rel: &str, d: usize) -> Option<u64> {
        let dir = self.dir_on(d, parent_of(rel)).ok()??;
        let st = rustix::fs::statat(&dir, name_of(rel), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        (FileType::from_raw_mode(st.st_mode).is_file() && st.st_nlink == 1).then_some(st.st_size as u64)
    }

    /// Plans as [`Store::rebalance_plan`] does and carries the moves out, online.
    pub fn rebalance(&self, who: &str, max_moves: u32) -> Result<Rebalance> {
        let mut plan = self.rebalance_plan(who, max_moves)?;
        let mut done = Vec::new();
        for m in std::mem::take(&mut plan.moves) {
            match self.move_file(&m.path, m.from, m.to) {
                Ok(()) => done.push(m),
                Err(e) => {
                    tracing::warn!(path = %m.path, "not moved: {e}");
                    plan.skipped.push((m.path.clone(), e.to_string()));
                }
            }
        }
        plan.moves = done;
        Ok(plan)
    }

    /// Moves the content of the file at `rel` from device `from` to device `to`.
    pub fn move_file(&self, rel: &str, from: u32, to: u32) -> Result<()> {
        let (parent, name) = (parent_of(rel), name_of(rel));
        let busy = || StoreError::Os { op: "move", path: rel.to_string(), errno: Errno::BUSY };
        let gone = || StoreError::Os { op: "move", path: rel.to_string(), errno: Errno::NOENT };
        for attempt in 0..MOVE_TRIES {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(attempt));
            }
            // The source as it is now, and a copy of it on the target device.
            let src_dir = self.dir_on(from as usize, parent)?.ok_or_else(gone)?;
            let before = rustix::fs::statat(&src_dir, name, AtFlags::SYMLINK_NOFOLLOW).ctx("move", rel)?;
            if !FileType::from_raw_mode(before.st_mode).is_file() || before.st_nlink != 1 {
                return Err(StoreError::Invalid(format!("{rel}: only a regular file with one link moves")));
            }
            let intent = self.intend(&Intent::Move { path: rel.to_string(), from, to })?;
            let dst_dir = self.mkdirs_on(to as usize, parent)?;
            let tmp = format!("{MOVE_PREFIX}{}", random_hex());
            let copied = copy_into(&src_dir, name, &dst_dir, &tmp, &before);
            if let Err(e) = copied {
                let _ = rustix::fs::unlinkat(&dst_dir, tmp.as_str(), AtFlags::empty());
                drop_intent(intent);
                return Err(e);
            }
            // The switch: no namespace change and no write through a handle meanwhile.
            let _names = self.namespace.lock();
            let entry = self.counters.file(rel).entry().clone();
            let _writers = entry.exclusive();
            let now = rustix::fs::statat(&src_dir, name, AtFlags::SYMLINK_NOFOLLOW);
            let unchanged = now.as_ref().is_ok_and(|st| same_version(st, &before));
            if !unchanged {
                let _ = rustix::fs::unlinkat(&dst_dir, tmp.as_str(), AtFlags::empty());
                drop_intent(intent);
                if now.is_err() {
                    return Err(gone());
                }
                continue; // written while it was copied: copy again
            }
            rustix::fs::renameat(&dst_dir, tmp.as_str(), &dst_dir, name).ctx("move", rel)?;
            for fd in entry.handles() {
                swap_handle(fd, &dst_dir, name);
            }
            rustix::fs::unlinkat(&src_dir, name, AtFlags::empty()).ctx("move", rel)?;
            entry.set_device(to);
            drop_intent(intent);
            return Ok(());
        }
        Err(busy())
    }
}

fn drop_intent(intent: Option<PathBuf>) {
    if let Some(p) = intent {
        let _ = std::fs::remove_file(p);
    }
}

/// True when `now` is the same version of the file as `then`: same inode, size,
/// modification and change times.
fn same_version(now: &rustix::fs::Stat, then: &rustix::fs::Stat) -> bool {
    (now.st_ino, now.st_size, now.st_mtime, now.st_mtime_nsec, now.st_ctime, now.st_ctime_nsec)
        == (then.st_ino, then.st_size, then.st_mtime, then.st_mtime_nsec, then.st_ctime, then.st_ctime_nsec)
}

/// Copies `src_dir/name` to a new `dst_dir/tmp` with its mode, owner and times, durably.
fn copy_into(src_dir: &OwnedFd, name: &str, dst_dir: &OwnedFd, tmp: &str, st: &rustix::fs::Stat) -> Result<()> {
    let src = rustix::fs::openat(src_dir, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .ctx("move", name)?;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
    let dst = rustix::fs::openat(dst_dir, tmp, flags, Mode::from_raw_mode(0o600)).ctx("move", name)?;
    let (mut src, mut dst) = (std::fs::File::from(src), std::fs::File::from(dst));
    std::io::copy(&mut src, &mut dst).map_err(|e| StoreError::Os {
        op: "move",
        path: name.into(),
        errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
    })?;
    rustix::fs::fchmod(&dst, Mode::from_raw_mode(st.st_mode & 0o7777)).ctx("move", name)?;
    let _ = rustix::fs::fchown(
        &dst,
        Some(rustix::fs::Uid::from_raw(st.st_uid)),
        Some(rustix::fs::Gid::from_raw(st.st_gid)),
    );
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec { tv_sec: st.st_atime as _, tv_nsec: st.st_atime_nsec as _ },
        last_modification: rustix::fs::Timespec { tv_sec: st.st_mtime as _, tv_nsec: st.st_mtime_nsec as _ },
    };
    rustix::fs::futimens(&dst, &times).ctx("move", name)?;
    rustix::fs::fsync(&dst).ctx("move", name)
}

/// Puts the file `dir/name` under the descriptor number `fd` of an open handle, with
/// the handle's access mode and flags, so the handle reads and writes the new copy.
fn swap_handle(fd: std::os::fd::RawFd, dir: &OwnedFd, name: &str) {
    use std::os::fd::FromRawFd;
    // SAFETY: a handle's number is registered from its open until its close, and the
    // close waits for the gate that the caller holds: the number is the handle's now.
    let old = unsafe { BorrowedFd::borrow_raw(fd) };
    let Ok(flags) = rustix::fs::fcntl_getfl(old) else { return };
    let keep = flags & (OFlags::RWMODE | OFlags::APPEND);
    let Ok(new) = rustix::fs::openat(dir, name, keep | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) else {
        tracing::warn!("{name}: a handle keeps the old copy (cannot open the new one)");
        return;
    };
    // SAFETY: as above; never dropped here, so the handle keeps owning the number.
    let mut target = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(fd) });
    // dup3 replaces what the number refers to in one step.
    let _ = rustix::io::dup3(&new, &mut target, rustix::io::DupFlags::CLOEXEC);
}

/// Removes copies that moves left in `dir`.
fn remove_move_copies(dir: &OwnedFd) {
    let Ok(d) = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
    else {
        return;
    };
    let Ok(list) = rustix::fs::Dir::read_from(&d) else { return };
    for entry in list.flatten() {
        if let Ok(name) = entry.file_name().to_str() {
            if name.starts_with(MOVE_PREFIX) {
                let _ = rustix::fs::unlinkat(&d, name, AtFlags::empty());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Acl;
    use locus_proto::Rights;

    /// An export with two devices and a state directory, and what `f` left in them.
    fn crashed(f: impl FnOnce(&Path, &Path, &Path)) -> (tempfile::TempDir, Store) {
        let tmp = tempfile::tempdir().unwrap();
        let (d0, d1, state) = (tmp.path().join("d0"), tmp.path().join("d1"), tmp.path().join("state"));
        for d in [&d0, &d1, &state.join("intents")] {
            std::fs::create_dir_all(d).unwrap();
        }
        f(&d0, &d1, &state.join("intents"));
        let mut acl = Acl::default();
        acl.set("admin", Rights::ALL);
        let store = Store::with_devices(&d0, &[d1], &acl, Some(&state)).unwrap();
        (tmp, store)
    }

    fn intent(dir: &Path, json: &str) {
        std::fs::write(dir.join("cut.json"), json).unwrap();
    }

    #[test]
    fn a_move_cut_after_its_copy_was_placed_drops_the_old_copy() {
        let (tmp, store) = crashed(|d0, d1, intents| {
            std::fs::write(d0.join("f"), b"data").unwrap();
            std::fs::write(d1.join("f"), b"data").unwrap();
            intent(intents, r#"{"Move":{"path":"f","from":0,"to":1}}"#);
        });
        assert!(!tmp.path().join("d0/f").exists());
        assert_eq!(std::fs::read(tmp.path().join("d1/f")).unwrap(), b"data");
        assert_eq!(store.stat("admin", "f").unwrap().size, 4);
        assert_eq!(std::fs::read_dir(tmp.path().join("state/intents")).unwrap().count(), 0);
    }

    #[test]
    fn a_move_cut_while_copying_keeps_the_original() {
        let (tmp, store) = crashed(|d0, d1, intents| {
            std::fs::create_dir_all(d0.join("s")).unwrap();
            std::fs::create_dir_all(d1.join("s")).unwrap();
            std::fs::write(d0.join("s/f"), b"whole").unwrap();
            std::fs::write(d1.join(format!("s/{MOVE_PREFIX}0123")), b"wh").unwrap();
            intent(intents, r#"{"Move":{"path":"s/f","from":0,"to":1}}"#);
        });
        assert_eq!(std::fs::read(tmp.path().join("d0/s/f")).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(tmp.path().join("d1/s")).unwrap().count(), 0, "the partial copy is gone");
        assert_eq!(store.readdir("admin", "s").unwrap().len(), 1);
    }

    #[test]
    fn a_directory_rename_cut_halfway_is_finished() {
        let (tmp, store) = crashed(|d0, d1, intents| {
            std::fs::create_dir_all(d0.join("new")).unwrap();
            std::fs::create_dir_all(d1.join("old")).unwrap();
            std::fs::write(d1.join("old/x"), b"x").unwrap();
            intent(intents, r#"{"RenameDir":{"from":"old","to":"new"}}"#);
        });
        assert!(tmp.path().join("d1/new/x").exists() && !tmp.path().join("d1/old").exists());
        assert_eq!(store.readdir("admin", "new").unwrap()[0].name, "x");
    }
}
