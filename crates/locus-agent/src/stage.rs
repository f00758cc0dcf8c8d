//! The staging area: a local shadow of every remote tree the program touches, so that
//! the kernel itself serves the program's opens, reads, writes, `getdents`, `mmap` and
//! `exec` on real local files, with POSIX behaviour for free.
//!
//! A remote path `/data/x` is shadowed at `ROOT/data/x`. Listing a directory creates
//! placeholders (sparse files of the right size, mode and modification time, so `ls -l`
//! and `stat` are honest without fetching anything); opening a file fetches its content
//! once and keeps it while a remote `lstat` (at most one per attribute timeout) says it
//! is unchanged. A file opened for writing is *dirty*: the local copy is the truth, and it
//! is written back whole when a descriptor on it is closed or synced, when a process
//! exits or execs, and at the end of the run. Metadata changes (mkdir, unlink, rename,
//! chmod, ...) go to the server first and are mirrored locally only if it agrees.

use crate::names::{beneath, parent, Namespace};
use crate::Fail;
use locus_drivers::{Attr, Driver, SetTime, Time};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What a shadow node mirrors: the remote attributes it was made from (type and mode,
/// size, modification time), and whether the content is there or only a placeholder.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Copy {
    stamp: (u32, u64, i64, u32),
    fetched: bool,
}

fn stamp(a: &Attr) -> (u32, u64, i64, u32) {
    (a.mode, a.size, a.mtime.sec, a.mtime.nsec)
}

/// A local file's state as last written back: size, modification and change times, inode.
type LocalStamp = (u64, i64, i64, u64);

fn local_stamp(m: &fs::Metadata) -> LocalStamp {
    (m.size(), m.mtime() * 1_000_000_000 + m.mtime_nsec(), m.ctime() * 1_000_000_000 + m.ctime_nsec(), m.ino())
}

fn io(e: std::io::Error) -> Fail {
    Fail::Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Removes whatever is at `path` (file, link or tree); a missing path is fine.
fn remove_any(path: &str) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => drop(fs::remove_dir_all(path)),
        Ok(_) => drop(fs::remove_file(path)),
        Err(_) => {}
    }
}

/// Sets a local node's times (not following a final symbolic link).
pub fn set_times(path: &str, atime: Time, mtime: Time) {
    use rustix::fs::{utimensat, AtFlags, Timestamps, CWD};
    let ts = |t: Time| rustix::fs::Timespec { tv_sec: t.sec, tv_nsec: t.nsec as _ };
    let _ = utimensat(
        CWD,
        path,
        &Timestamps { last_access: ts(atime), last_modification: ts(mtime) },
        AtFlags::SYMLINK_NOFOLLOW,
    );
}

/// Re-keys the entries of `map` at or beneath `from` to lie beneath `to`.
fn move_beneath<V>(map: &mut HashMap<String, V>, from: &str, to: &str) {
    let keys: Vec<String> = map.keys().filter(|k| beneath(k, from)).cloned().collect();
    for k in keys {
        let v = map.remove(&k).expect("listed key");
        map.insert(format!("{to}{}", &k[from.len()..]), v);
    }
}

/// A directory listed at the server, kept up to date with the program's own changes.
struct Listing {
    at: Instant,
    /// The names in it (some may have changed since, but no other name exists).
    names: HashSet<String>,
}

/// Directories with more entries than this are not listed again to answer for one name.
const RELIST_MAX: usize = 4096;

/// The last component of a logical path.
fn name_of(logical: &str) -> &str {
    logical.rsplit('/').next().unwrap_or(logical)
}

/// The shadow trees and what is known about them.
pub struct Stage {
    pub ns: Namespace,
    /// Kept alive for the run; removed at the end unless data could not be written back.
    dir: Option<tempfile::TempDir>,
    /// Where logical paths are shadowed (no trailing slash).
    root: String,
    /// Where fetched content is written before it is renamed into place.
    staging: PathBuf,
    staged: u64,
    attr_timeout: Duration,
    /// Remote attributes by logical path (`None`: it does not exist), and when learned.
    attrs: HashMap<String, (Option<Attr>, Instant)>,
    /// Directories whose shadow was made to match a remote listing.
    listed: HashMap<String, Listing>,
    copies: HashMap<String, Copy>,
    /// Files opened for writing: their mount and their local state when last written back.
    dirty: HashMap<String, (usize, Option<LocalStamp>)>,
}

impl Stage {
    /// A staging area in a new temporary directory.
    pub fn new(ns: Namespace, attr_timeout: Duration) -> Result<Stage, String> {
        let dir = tempfile::Builder::new().prefix("locus-run-").tempdir().map_err(|e| format!("cache: {e}"))?;
        let root = dir.path().join("ns");
        let staging = dir.path().join("staging");
        fs::create_dir(&root).and_then(|()| fs::create_dir(&staging)).map_err(|e| format!("cache: {e}"))?;
        let root = root.into_os_string().into_string().map_err(|_| "cache: the temporary directory is not UTF-8")?;
        Ok(Stage {
            ns,
            dir: Some(dir),
            root,
            staging,
            staged: 0,
            attr_timeout,
            attrs: HashMap::new(),
            listed: HashMap::new(),
            copies: HashMap::new(),
            dirty: HashMap::new(),
        })
    }

    /// Where `logical` is shadowed.
    pub fn shadow(&self, logical: &str) -> String {
        format!("{}{}", self.root, logical)
    }

    /// The logical path of a (normalized) shadow path.
    pub fn logical_of<'a>(&self, path: &'a str) -> Option<&'a str> {
        let rest = path.strip_prefix(self.root.as_str())?;
        match rest {
            "" => Some("/"),
            r if r.starts_with('/') => Some(r),
            _ => None,
        }
    }

    /// Keeps the staging directory after the run (it holds data not written back).
    pub fn keep(&mut self) -> Option<PathBuf> {
        self.dir.take().map(|d| d.keep())
    }

    /// Runs a driver call on `mount` for `logical`'s remote path, retrying while the
    /// server is unreachable, up to the retry window.
    fn call<T>(
        &mut self,
        mount: usize,
        logical: &str,
        mut f: impl FnMut(&mut dyn Driver, &str) -> locus_drivers::Result<T>,
    ) -> Result<T, Fail> {
        let remote = self.ns.remote(mount, logical);
        let m = &mut self.ns.mounts[mount];
        locus_drivers::retry_transient(self.ns.retry, || f(m.driver.as_mut(), &remote))
            .map_err(|e| Fail::driver(e, &m.url))
    }

    fn fresh(&self, t: Instant) -> bool {
        t.elapsed() < self.attr_timeout
    }

    /// Attributes of `logical`, or `None` if it does not exist. A dirty file answers
    /// with its local copy's; otherwise the cache answers within the attribute timeout.
    pub fn attr(&mut self, mount: usize, logical: &str) -> Result<Option<Attr>, Fail> {
        if self.dirty.contains_key(logical) {
            if let Ok(m) = fs::symlink_metadata(self.shadow(logical)) {
                return Ok(Some(locus_drivers::local::attr_of(&m)));
            }
        }
        if let Some((a, t)) = self.attrs.get(logical) {
            if self.fresh(*t) {
                return Ok(a.clone());
            }
        }
        if logical != self.ns.mounts[mount].logical {
            let dir = parent(logical);
            let stale = |l: &Listing| !self.fresh(l.at) && l.names.len() <= RELIST_MAX;
            if self.listed.get(dir).is_some_and(stale) && self.list(mount, dir).is_ok() {
                // Listed before: listing again costs the same round trip as one lstat
                // and answers for every sibling too.
                if let Some((a, _)) = self.attrs.get(logical) {
                    return Ok(a.clone());
                }
            }
            let name = name_of(logical);
            let absent = |l: &Listing| self.fresh(l.at) && !l.names.contains(name);
            if self.listed.get(dir).is_some_and(absent) && !locus_proto::active::may_invoke(name) {
                // Its directory was listed recently and it is not there (names that invoke
                // active-file handlers never are: they are asked for).
                return Ok(None);
            }
        }
        let found = match self.call(mount, logical, |d, r| d.lstat(r)) {
            Ok(a) => Some(a),
            Err(Fail::Errno(libc::ENOENT | libc::ENOTDIR)) => None,
            Err(e) => return Err(e),
        };
        self.attrs.insert(logical.to_string(), (found.clone(), Instant::now()));
        Ok(found)
    }

    /// A remote symbolic link's target.
    pub fn readlink(&mut self, mount: usize, logical: &str) -> Result<String, Fail> {
        if self.copies.contains_key(logical) {
            if let Ok(t) = fs::read_link(self.shadow(logical)) {
                return Ok(t.to_string_lossy().into_owned());
            }
        }
        self.call(mount, logical, |d, r| d.readlink(r))
    }

    fn staging_file(&mut self) -> PathBuf {
        self.staged += 1;
        self.staging.join(self.staged.to_string())
    }

    /// Makes the shadow node of `logical` match `attr` (without fetching content).
    pub fn place(&mut self, mount: usize, logical: &str, attr: &Attr) -> Result<(), Fail> {
        if self.dirty.contains_key(logical) {
            return Ok(());
        }
        let st = stamp(attr);
        let path = self.shadow(logical);
        if self.copies.get(logical).is_some_and(|c| c.stamp == st) && fs::symlink_metadata(&path).is_ok() {
            return Ok(());
        }
        let _ = fs::create_dir_all(parent(&path));
        let mut fetched = true;
        if attr.is_dir() {
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                remove_any(&path);
                fs::create_dir(&path).map_err(io)?;
            }
            // The owner keeps write permission so that entries can be placed inside.
            let _ = fs::set_permissions(&path, fs::Permissions::from_mode(attr.mode & 0o7777 | 0o700));
        } else if attr.is_symlink() {
            let target = self.call(mount, logical, |d, r| d.readlink(r))?;
            remove_any(&path);
            std::os::unix::fs::symlink(target, &path).map_err(io)?;
        } else {
            let tmp = self.staging_file();
            let f = fs::File::create(&tmp).map_err(io)?;
            f.set_len(attr.size).map_err(io)?;
            f.set_permissions(fs::Permissions::from_mode(attr.mode & 0o7777)).map_err(io)?;
            drop(f);
            if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                remove_any(&path);
            }
            fs::rename(&tmp, &path).map_err(io)?;
            fetched = attr.size == 0;
        }
        set_times(&path, attr.atime, attr.mtime);
        self.copies.insert(logical.to_string(), Copy { stamp: st, fetched });
        Ok(())
    }

    /// Makes sure the shadow of the file `logical` holds its current content.
    pub fn fetch(&mut self, mount: usize, logical: &str, attr: &Attr) -> Result<(), Fail> {
        if self.dirty.contains_key(logical) || !attr.is_file() {
            return self.place(mount, logical, attr);
        }
        if self.copies.get(logical).is_some_and(|c| c.fetched && c.stamp == stamp(attr)) {
            return Ok(());
        }
        let (data, fresh) = self.call(mount, logical, |d, r| d.read_file(r))?;
        let path = self.shadow(logical);
        if self.copies.get(logical).is_some_and(|c| !c.fetched && c.stamp == stamp(&fresh)) {
            // A placeholder nobody could have read yet: fill it in place, which leaves
            // its directory unchanged (tar notices a directory changing as it reads).
            let mut f = fs::OpenOptions::new().write(true).open(&path).map_err(io)?;
            std::io::Write::write_all(&mut f, &data).map_err(io)?;
            drop(f);
            set_times(&path, fresh.atime, fresh.mtime);
            self.copies.insert(logical.to_string(), Copy { stamp: stamp(&fresh), fetched: true });
            return Ok(());
        }
        let tmp = self.staging_file();
        let _ = fs::create_dir_all(parent(&path));
        fs::write(&tmp, &data).map_err(io)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(fresh.mode & 0o7777)).map_err(io)?;
        let tmp = tmp.into_os_string().into_string().expect("UTF-8 staging path");
        set_times(&tmp, fresh.atime, fresh.mtime);
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            remove_any(&path);
        }
        // A rename, so that processes with the old copy open keep reading it.
        fs::rename(&tmp, &path).map_err(io)?;
        self.copies.insert(logical.to_string(), Copy { stamp: stamp(&fresh), fetched: true });
        self.attrs.insert(logical.to_string(), (Some(fresh), Instant::now()));
        Ok(())
    }

    /// Makes the shadow directory `logical` list what the server lists.
    pub fn list(&mut self, mount: usize, logical: &str) -> Result<(), Fail> {
        if self.listed.get(logical).is_some_and(|l| self.fresh(l.at)) {
            return Ok(());
        }
        let entries = self.call(mount, logical, |d, r| d.readdir(r))?;
        let now = Instant::now();
        let mut names = HashSet::new();
        for e in entries {
            let child = format!("{logical}/{}", e.name);
            self.place(mount, &child, &e.attr)?;
            self.attrs.insert(child, (Some(e.attr), now));
            names.insert(e.name);
        }
        if let Ok(dir) = fs::read_dir(self.shadow(logical)) {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = format!("{logical}/{name}");
                if !names.contains(&name) && !self.dirty.contains_key(&child) {
                    remove_any(&self.shadow(&child));
                    self.forget(&child);
                }
            }
        }
        // Placing entries touched the directory: give it back the server's times (only
        // if they differ, as setting them changes its ctime, which tar watches).
        if let Some((Some(attr), _)) = self.attrs.get(logical) {
            let path = self.shadow(logical);
            let local = fs::symlink_metadata(&path).map(|m| (m.mtime(), m.mtime_nsec() as u32));
            if local.is_ok_and(|t| t != (attr.mtime.sec, attr.mtime.nsec)) {
                set_times(&path, attr.atime, attr.mtime);
            }
        }
        self.listed.insert(logical.to_string(), Listing { at: now, names });
        Ok(())
    }

    /// True if some file is open for writing somewhere in the tree.
    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Whether a dirty file has changed since it was last written back.
    pub fn has_unsent(&self) -> bool {
        self.dirty.iter().any(|(logical, &(_, last))| match fs::symlink_metadata(self.shadow(logical)) {
            Ok(m) if m.is_file() => last != Some(local_stamp(&m)),
            _ => false,
        })
    }

    /// Creates the file `logical` at the server (exclusively if `exclusive`) and clears
    /// the way for the program's own open to create the local copy, which is dirty from
    /// now on.
    pub fn create(&mut self, mount: usize, logical: &str, mode: u32, exclusive: bool) -> Result<(), Fail> {
        use locus_drivers::open_flags::{CREATE, EXCLUSIVE, WRITE};
        let flags = WRITE | CREATE | if exclusive { EXCLUSIVE } else { 0 };
        let opened = self.call(mount, logical, |d, r| d.open(r, flags, mode))?;
        let _ = self.ns.mounts[mount].driver.close(opened.handle);
        // The program's own open makes the local copy: the listing stays true.
        self.added(logical);
        let path = self.shadow(logical);
        let _ = fs::create_dir_all(parent(&path));
        remove_any(&path);
        self.copies.insert(logical.to_string(), Copy { stamp: stamp(&opened.attr), fetched: true });
        self.dirty.insert(logical.to_string(), (mount, None));
        Ok(())
    }

    /// Marks the file `logical`, whose shadow holds its content, as open for writing.
    pub fn opened_for_writing(&mut self, mount: usize, logical: &str) {
        let local = fs::symlink_metadata(self.shadow(logical)).map(|m| local_stamp(&m)).ok();
        self.dirty.entry(logical.to_string()).or_insert((mount, local));
    }

    /// Writes the dirty file `logical` back if its local copy changed since last time.
    pub fn sync(&mut self, logical: &str) -> Result<(), Fail> {
        let Some(&(mount, last)) = self.dirty.get(logical) else { return Ok(()) };
        let path = self.shadow(logical);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() => m,
            _ => {
                self.dirty.remove(logical);
                return Ok(());
            }
        };
        let now = local_stamp(&meta);
        if last == Some(now) {
            return Ok(());
        }
        let data = fs::read(&path).map_err(io)?;
        let attr = self.call(mount, logical, |d, r| d.write_file(r, meta.mode() & 0o7777, &data))?;
        // A modification time the program set on purpose (tar, cp -p, touch -d) is kept;
        // one from the writes themselves is close to the server's own.
        let local_mtime = Time { sec: meta.mtime(), nsec: meta.mtime_nsec() as u32 };
        if (local_mtime.sec - attr.mtime.sec).abs() > 1 {
            let at = Time { sec: meta.atime(), nsec: meta.atime_nsec() as u32 };
            self.call(mount, logical, |d, r| d.utimes(r, SetTime::At(at), SetTime::At(local_mtime)))?;
        }
        self.attrs.remove(logical);
        self.dirty.insert(logical.to_string(), (mount, Some(now)));
        Ok(())
    }

    /// Writes back every dirty file that changed. Files the server refuses are reported
    /// and left dirty; an unreachable server ends the run.
    pub fn sync_all(&mut self) -> Result<(), Fail> {
        let names: Vec<String> = self.dirty.keys().cloned().collect();
        for name in names {
            match self.sync(&name) {
                Err(Fail::Errno(e)) => {
                    eprintln!("locus run: {name}: not written back: {}", std::io::Error::from_raw_os_error(e))
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// Forgets what is known of `logical` after a change. Its directory's listing stays
    /// if the shadow mirrors the change; otherwise the next use lists it again.
    pub fn changed(&mut self, logical: &str) {
        self.added(logical);
        if fs::symlink_metadata(self.shadow(logical)).is_err() {
            self.listed.remove(parent(logical));
        }
    }

    /// `logical` exists now, or changed: its attributes and its directory's must be
    /// asked for again.
    fn added(&mut self, logical: &str) {
        self.attrs.remove(logical);
        self.attrs.remove(parent(logical));
        if let Some(l) = self.listed.get_mut(parent(logical)) {
            l.names.insert(name_of(logical).to_string());
        }
    }

    /// `logical` no longer exists (its shadow is gone too).
    fn removed(&mut self, logical: &str) {
        self.forget(logical);
        self.attrs.remove(parent(logical));
        if let Some(l) = self.listed.get_mut(parent(logical)) {
            l.names.remove(name_of(logical));
        }
    }

    /// Forgets everything about `logical` and what lies beneath it.
    fn forget(&mut self, logical: &str) {
        self.attrs.retain(|k, _| !beneath(k, logical));
        self.listed.retain(|k, _| !beneath(k, logical));
        self.copies.retain(|k, _| !beneath(k, logical));
        self.dirty.retain(|k, _| !beneath(k, logical));
    }

    /// Removes `logical` at the server, then locally.
    pub fn remove(&mut self, mount: usize, logical: &str, dir: bool) -> Result<(), Fail> {
        if dir {
            self.call(mount, logical, |d, r| d.rmdir(r))?;
        } else {
            self.call(mount, logical, |d, r| d.unlink(r))?;
        }
        remove_any(&self.shadow(logical));
        self.removed(logical);
        Ok(())
    }

    /// Renames `from` to `to` (on one mount) at the server, then locally; dirty files
    /// keep their state under the new name.
    pub fn rename(&mut self, mount: usize, from: &str, to: &str) -> Result<(), Fail> {
        let remote_to = self.ns.remote(mount, to);
        self.call(mount, from, |d, r| d.rename(r, &remote_to))?;
        let (src, dst) = (self.shadow(from), self.shadow(to));
        let _ = fs::create_dir_all(parent(&dst));
        if fs::symlink_metadata(&dst).is_ok_and(|m| m.is_dir()) {
            let _ = fs::remove_dir(&dst);
        }
        if fs::rename(&src, &dst).is_err() {
            remove_any(&dst);
        }
        self.forget(to);
        move_beneath(&mut self.copies, from, to);
        move_beneath(&mut self.dirty, from, to);
        self.removed(from);
        self.changed(to);
        Ok(())
    }

    /// Runs a metadata change at the server, then forgets what it invalidates: the
    /// shadow node is remade from fresh attributes on next use. A dirty file's local copy
    /// gets the change too (`local`), since it is what will be written back.
    pub fn change(
        &mut self,
        mount: usize,
        logical: &str,
        remote: impl FnMut(&mut dyn Driver, &str) -> locus_drivers::Result<()>,
        local: impl FnOnce(&str),
    ) -> Result<(), Fail> {
        self.call(mount, logical, remote)?;
        self.changed(logical);
        if self.dirty.contains_key(logical) {
            local(&self.shadow(logical));
        } else {
            self.copies.remove(logical);
        }
        Ok(())
    }

    /// Makes the shadow of a directory that only leads to mounts.
    pub fn virtual_dir(&self, logical: &str) -> String {
        let path = self.shadow(logical);
        let _ = fs::create_dir_all(&path);
        path
    }
}
