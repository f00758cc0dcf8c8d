//! The whole mount table as one [`Driver`], so that a single FUSE file system can show
//! every remote tree of a `locus run` (see [`crate::fuse_path`]).
//!
//! Paths are the program's own (`/locus/HOST:PORT/x`, `/data/y`): each goes to the
//! mount it lies beneath, at that mount's path; the directories that only lead to mounts
//! (`/`, `/locus`, parents of logical names) answer as read-only virtual directories.
//! Handles are numbered here and mapped to each mount's own. Every file shows as owned
//! by the user running the agent, as the traced path's staged copies are: the server's
//! owners mean nothing on this machine (and in a user namespace, a file whose owner has
//! no mapping there cannot be written at all).
//!
//! Callbacks, when the mount asks for them, are turned on for every mount whose driver
//! has them (now, and as `/locus/HOST:PORT` mounts connect), and their breaks come back
//! as the program's paths. They hold only while every mount holds them.
//!
//! An error that no errno describes honestly (a server unreachable beyond the retry
//! window, or a request the driver can never satisfy) is also kept as the run's
//! [`Abort`], the first one only: the agent then stops the program, as the traced path does.

use crate::names::{beneath, logical_of, Namespace, Place};
use crate::tracer::Abort;
use crate::Fail;
use locus_drivers::{Attr, Break, DirEntry, Driver, DriverError, Opened, Result, SetTime, StatFs, Time};
use locus_proto::types::S_IFDIR;
use std::collections::{HashMap, HashSet};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// The mount table behind one driver.
pub struct NamespaceDriver {
    ns: Namespace,
    /// This driver's handles: the mount and that mount's handle.
    handles: HashMap<u64, (usize, u64)>,
    next_handle: u64,
    /// The first error that should stop the program, and what to call when it comes.
    abort: Arc<Mutex<Option<Abort>>>,
    on_abort: Box<dyn Fn() + Send>,
    /// Attributes of the virtual directories.
    virtual_attr: Attr,
    /// Once the mount asked for callbacks: their bound and where breaks go.
    callbacks: Option<(u32, mpsc::Sender<Break>)>,
    /// Mounts whose drivers hold callbacks.
    covered: HashSet<usize>,
}

/// Where a path goes: a mount and the path there, or a virtual directory.
enum Target {
    Mount(usize, String),
    Virtual(String),
}

impl NamespaceDriver {
    /// A driver over `ns`; the first stopping error is put in `abort`, then `on_abort` runs.
    pub fn new(ns: Namespace, abort: Arc<Mutex<Option<Abort>>>, on_abort: Box<dyn Fn() + Send>) -> NamespaceDriver {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let now = Time { sec: now.as_secs() as i64, nsec: now.subsec_nanos() };
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let virtual_attr = Attr {
            mode: S_IFDIR | 0o555,
            nlink: 2,
            uid,
            gid,
            size: 4096,
            blksize: 4096,
            atime: now,
            mtime: now,
            ctime: now,
            ..Default::default()
        };
        let mut driver = NamespaceDriver {
            ns,
            handles: HashMap::new(),
            next_handle: 1,
            abort,
            on_abort,
            virtual_attr,
            callbacks: None,
            covered: HashSet::new(),
        };
        let window = driver.ns.retry;
        for m in &mut driver.ns.mounts {
            m.driver.set_retry(window);
        }
        driver
    }

    fn target(&mut self, path: &str) -> Result<Target> {
        if path == "/" {
            return Ok(Target::Virtual(path.to_string()));
        }
        let known = self.ns.mounts.len();
        match self.ns.place(path) {
            Ok(Place::Remote { mount, logical }) => {
                if mount >= known {
                    // A `/locus/HOST:PORT` connected just now: its calls retry as the others.
                    let window = self.ns.retry;
                    self.ns.mounts[mount].driver.set_retry(window);
                    self.cover(mount);
                }
                Ok(Target::Mount(mount, self.ns.remote(mount, &logical)))
            }
            Ok(Place::Virtual(p)) => Ok(Target::Virtual(p)),
            Ok(Place::Local) => Err(DriverError::errno(libc::ENOENT, format!("{path}: not in the namespace"))),
            Err(Fail::Errno(e)) => Err(DriverError::errno(e, path.to_string())),
            Err(Fail::Stop(abort)) => Err(self.stop(abort)),
        }
    }

    /// [`Self::target`] for a name about to be made: one outside every mount (next to
    /// them in a virtual directory) cannot be, which is `EROFS`, not `ENOENT`.
    fn new_target(&mut self, path: &str) -> Result<Target> {
        match self.target(path) {
            Err(e) if e.errno == libc::ENOENT && !path.starts_with("/locus/") => {
                Err(DriverError::errno(libc::EROFS, format!("{path}: leads to mounts only")))
            }
            other => other,
        }
    }

    /// Turns callbacks on for `mount`, if the mount asked for them and its driver has
    /// them; a thread forwards its breaks with the paths made the program's.
    fn cover(&mut self, mount: usize) {
        let Some((max, tx)) = self.callbacks.clone() else { return };
        let m = &mut self.ns.mounts[mount];
        let Some(breaks) = m.driver.callbacks(max) else { return };
        let (logical, base) = (m.logical.clone(), m.base.clone());
        let forward = move || {
            for b in breaks {
                let b = match b {
                    Break::All => Break::All,
                    Break::Paths(paths) => {
                        Break::Paths(paths.iter().filter_map(|p| logical_of(&logical, &base, p)).collect())
                    }
                };
                if tx.send(b).is_err() {
                    return;
                }
            }
        };
        if std::thread::Builder::new().name("locus-ns-breaks".into()).spawn(forward).is_ok() {
            self.covered.insert(mount);
        }
    }

    /// Keeps the first stopping error and says so; answers what the kernel is told.
    fn stop(&self, abort: Abort) -> DriverError {
        let message = abort.message.clone();
        let first = {
            let mut slot = self.abort.lock().unwrap_or_else(|e| e.into_inner());
            let first = slot.is_none();
            if first {
                *slot = Some(abort);
            }
            first
        };
        if first {
            (self.on_abort)();
        }
        DriverError::errno(libc::EIO, message)
    }

    /// `f` on the mount of `path`, its errors triaged.
    fn on<T>(&mut self, path: &str, f: impl FnOnce(&mut dyn Driver, &str) -> Result<T>) -> Result<T> {
        let target = self.target(path)?;
        self.on_target(target, f)
    }

    fn on_target<T>(&mut self, target: Target, f: impl FnOnce(&mut dyn Driver, &str) -> Result<T>) -> Result<T> {
        match target {
            Target::Mount(mount, remote) => self.triage(mount, |d| f(d, &remote)),
            Target::Virtual(p) => Err(DriverError::errno(libc::EROFS, format!("{p}: leads to mounts only"))),
        }
    }

    fn own(&self, mut attr: Attr) -> Attr {
        attr.uid = self.virtual_attr.uid;
        attr.gid = self.virtual_attr.gid;
        attr
    }

    fn triage<T>(&mut self, mount: usize, f: impl FnOnce(&mut dyn Driver) -> Result<T>) -> Result<T> {
        let m = &mut self.ns.mounts[mount];
        match f(m.driver.as_mut()) {
            Err(e) if e.class != locus_drivers::ErrorClass::Answer => {
                let Fail::Stop(abort) = Fail::driver(e.clone(), &m.url) else { return Err(e) };
                Err(self.stop(abort))
            }
            other => other,
        }
    }

    /// `f` on the mount that gave `handle`, with that mount's handle.
    fn with_handle<T>(&mut self, handle: u64, f: impl FnOnce(&mut dyn Driver, u64) -> Result<T>) -> Result<T> {
        let &(mount, inner) =
            self.handles.get(&handle).ok_or_else(|| DriverError::errno(libc::EBADF, "no such handle"))?;
        self.triage(mount, |d| f(d, inner))
    }

    /// Both paths on one mount, or `EXDEV`.
    fn pair(&mut self, from: &str, to: &str) -> Result<(usize, String, String)> {
        match (self.target(from)?, self.new_target(to)?) {
            (Target::Mount(a, from), Target::Mount(b, to)) if a == b => Ok((a, from, to)),
            (Target::Virtual(p), _) | (_, Target::Virtual(p)) => {
                Err(DriverError::errno(libc::EROFS, format!("{p}: leads to mounts only")))
            }
            _ => Err(DriverError::errno(libc::EXDEV, format!("{from} and {to} are on different mounts"))),
        }
    }

    /// The names in a virtual directory: the next component of every mount beneath it.
    fn virtual_entries(&self, dir: &str) -> Vec<DirEntry> {
        let mut names: Vec<String> = Vec::new();
        for m in &self.ns.mounts {
            if m.logical != dir && beneath(&m.logical, dir) {
                let rest = &m.logical[if dir == "/" { 1 } else { dir.len() + 1 }..];
                let name = rest.split('/').next().unwrap_or_default().to_string();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        if dir == "/" && !names.iter().any(|n| n == "locus") {
            names.push("locus".into());
        }
        names.into_iter().map(|name| DirEntry { name, attr: self.virtual_attr.clone() }).collect()
    }
}

impl Driver for NamespaceDriver {
    fn name(&self) -> &'static str {
        "namespace"
    }
    fn lstat(&mut self, path: &str) -> Result<Attr> {
        match self.target(path)? {
            Target::Mount(mount, remote) => self.triage(mount, |d| d.lstat(&remote)).map(|a| self.own(a)),
            Target::Virtual(_) => Ok(self.virtual_attr.clone()),
        }
    }
    fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>> {
        match self.target(path)? {
            Target::Mount(mount, remote) => {
                let entries = self.triage(mount, |d| d.readdir(&remote))?;
                Ok(entries.into_iter().map(|e| DirEntry { attr: self.own(e.attr), name: e.name }).collect())
            }
            Target::Virtual(dir) => Ok(self.virtual_entries(&dir)),
        }
    }
    fn open(&mut self, path: &str, flags: u32, mode: u32) -> Result<Opened> {
        let target =
            if flags & locus_drivers::open_flags::CREATE != 0 { self.new_target(path)? } else { self.target(path)? };
        let (mount, remote) = match target {
            Target::Mount(mount, remote) => (mount, remote),
            Target::Virtual(p) => return Err(DriverError::errno(libc::EISDIR, p)),
        };
        let opened = self.triage(mount, |d| d.open(&remote, flags, mode))?;
        let handle = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(handle, (mount, opened.handle));
        Ok(Opened { handle, attr: self.own(opened.attr), location: None })
    }
    fn close(&mut self, handle: u64) -> Result<()> {
        let outcome = self.with_handle(handle, |d, h| d.close(h));
        self.handles.remove(&handle);
        outcome
    }
    fn fstat(&mut self, handle: u64) -> Result<Attr> {
        self.with_handle(handle, |d, h| d.fstat(h)).map(|a| self.own(a))
    }
    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.with_handle(handle, |d, h| d.pread(h, offset, len))
    }
    fn pwrite(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<u64> {
        self.with_handle(handle, |d, h| d.pwrite(h, offset, data))
    }
    fn pwrite_behind(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.with_handle(handle, |d, h| d.pwrite_behind(h, offset, data))
    }
    fn settle(&mut self, handle: u64) -> Result<()> {
        self.with_handle(handle, |d, h| d.settle(h))
    }
    fn settle_stat(&mut self, handle: u64) -> Result<Attr> {
        self.with_handle(handle, |d, h| d.settle_stat(h)).map(|a| self.own(a))
    }
    fn ftruncate(&mut self, handle: u64, size: u64) -> Result<()> {
        self.with_handle(handle, |d, h| d.ftruncate(h, size))
    }
    fn fsync(&mut self, handle: u64) -> Result<()> {
        self.with_handle(handle, |d, h| d.fsync(h))
    }
    fn mkdir(&mut self, path: &str, mode: u32) -> Result<()> {
        let target = self.new_target(path)?;
        self.on_target(target, |d, p| d.mkdir(p, mode))
    }
    fn rmdir(&mut self, path: &str) -> Result<()> {
        self.on(path, |d, p| d.rmdir(p))
    }
    fn unlink(&mut self, path: &str) -> Result<()> {
        self.on(path, |d, p| d.unlink(p))
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        let (mount, from, to) = self.pair(from, to)?;
        self.triage(mount, |d| d.rename(&from, &to))
    }
    fn symlink(&mut self, target: &str, path: &str) -> Result<()> {
        let place = self.new_target(path)?;
        self.on_target(place, |d, p| d.symlink(target, p))
    }
    fn readlink(&mut self, path: &str) -> Result<String> {
        self.on(path, |d, p| d.readlink(p))
    }
    fn link(&mut self, from: &str, to: &str) -> Result<()> {
        let (mount, from, to) = self.pair(from, to)?;
        self.triage(mount, |d| d.link(&from, &to))
    }
    fn truncate(&mut self, path: &str, size: u64) -> Result<()> {
        self.on(path, |d, p| d.truncate(p, size))
    }
    fn chmod(&mut self, path: &str, mode: u32) -> Result<()> {
        self.on(path, |d, p| d.chmod(p, mode))
    }
    fn utimes(&mut self, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        self.on(path, |d, p| d.utimes(p, atime, mtime))
    }
    fn utimes_behind(&mut self, path: &str, atime: SetTime, mtime: SetTime, handle: u64) -> Result<()> {
        let Some(&(mount, inner)) = self.handles.get(&handle) else {
            return self.utimes(path, atime, mtime);
        };
        let remote = match self.target(path)? {
            Target::Mount(m, remote) if m == mount => remote,
            _ => return Err(DriverError::errno(libc::EXDEV, format!("{path}: not where its handle is"))),
        };
        self.triage(mount, |d| d.utimes_behind(&remote, atime, mtime, inner))
    }
    fn utimes_stat(&mut self, path: &str, atime: SetTime, mtime: SetTime, handle: Option<u64>) -> Result<Attr> {
        let inner = match handle {
            Some(h) => Some(self.handles.get(&h).ok_or_else(|| DriverError::errno(libc::EBADF, "no such handle"))?.1),
            None => None,
        };
        self.on(path, |d, p| d.utimes_stat(p, atime, mtime, inner)).map(|a| self.own(a))
    }
    fn lists_all(&self, path: &str) -> bool {
        path != "/locus"
    }
    fn callbacks(&mut self, max: u32) -> Option<mpsc::Receiver<Break>> {
        let (tx, rx) = mpsc::channel();
        self.callbacks = Some((max, tx));
        for mount in 0..self.ns.mounts.len() {
            self.cover(mount);
        }
        Some(rx)
    }
    fn callbacks_held(&self) -> bool {
        self.callbacks.is_some()
            && self.ns.mounts.iter().enumerate().all(|(i, m)| self.covered.contains(&i) && m.driver.callbacks_held())
    }
    fn take_unpromised(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for mount in 0..self.ns.mounts.len() {
            for p in self.ns.mounts[mount].driver.take_unpromised() {
                out.extend(self.ns.logical(mount, &p));
            }
        }
        out
    }
    fn callbacks_cover_all(&self) -> bool {
        // The virtual directories never change; `/locus/HOST:PORT` mounts, which come
        // later, are Locus servers, whose callbacks cover everything they serve.
        self.callbacks.is_some()
            && self
                .ns
                .mounts
                .iter()
                .enumerate()
                .all(|(i, m)| self.covered.contains(&i) && m.driver.callbacks_cover_all())
    }
    fn list_ahead(&mut self, dirs: &[String]) {
        let mut by_mount: Vec<Vec<String>> = vec![Vec::new(); self.ns.mounts.len()];
        for dir in dirs {
            if let Some(mount) = self.ns.mount_of(dir) {
                by_mount[mount].push(self.ns.remote(mount, dir));
            }
        }
        for (mount, dirs) in by_mount.into_iter().enumerate().filter(|(_, d)| !d.is_empty()) {
            self.ns.mounts[mount].driver.list_ahead(&dirs);
        }
    }
    fn drop_ahead(&mut self) {
        for m in &mut self.ns.mounts {
            m.driver.drop_ahead();
        }
    }
    fn unlink_behind(&mut self, path: &str) -> Result<()> {
        self.on(path, |d, p| d.unlink_behind(p))
    }
    fn rename_behind(&mut self, from: &str, to: &str) -> Result<()> {
        let (mount, from, to) = self.pair(from, to)?;
        self.triage(mount, |d| d.rename_behind(&from, &to))
    }
    fn failed_behind(&mut self, wait: bool) -> Vec<(String, DriverError)> {
        let mut out = Vec::new();
        for mount in 0..self.ns.mounts.len() {
            for (p, e) in self.ns.mounts[mount].driver.failed_behind(wait) {
                out.extend(self.ns.logical(mount, &p).map(|p| (p, e)));
            }
        }
        out
    }
    fn read_file(&mut self, path: &str) -> Result<(Vec<u8>, Attr)> {
        let (data, attr) = self.on(path, |d, p| d.read_file(p))?;
        Ok((data, self.own(attr)))
    }
    fn store_file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        let target = self.new_target(path)?;
        self.on_target(target, |d, p| d.store_file(p, mode, data)).map(|a| self.own(a))
    }
    fn write_file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        let target = self.new_target(path)?;
        self.on_target(target, |d, p| d.write_file(p, mode, data)).map(|a| self.own(a))
    }
    fn statfs(&mut self, path: &str) -> Result<StatFs> {
        match self.target(path)? {
            Target::Mount(mount, remote) => self.triage(mount, |d| d.statfs(&remote)),
            Target::Virtual(_) => Ok(StatFs { bsize: 4096, frsize: 4096, namemax: 255, ..Default::default() }),
        }
    }
    fn access(&mut self, path: &str, mode: u32) -> Result<()> {
        match self.target(path)? {
            Target::Mount(mount, remote) => self.triage(mount, |d| d.access(&remote, mode)),
            Target::Virtual(_) if mode & 2 != 0 => Err(DriverError::errno(libc::EACCES, path.to_string())),
            Target::Virtual(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn driver(mounts: &[(&str, &str)]) -> NamespaceDriver {
        let mounts: Vec<(String, String)> = mounts.iter().map(|(l, u)| (l.to_string(), u.to_string())).collect();
        let ns = Namespace::new(&mounts, Duration::ZERO).unwrap();
        NamespaceDriver::new(ns, Arc::new(Mutex::new(None)), Box::new(|| {}))
    }

    #[test]
    fn virtual_directories_lead_to_every_mount_and_local_files_show_through_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello").unwrap();
        let url = format!("file://{}", dir.path().display());
        let mut d = driver(&[("/data/a", &url), ("/data/b", &url), ("/x", &url)]);
        let names = |d: &mut NamespaceDriver, p: &str| {
            let mut n: Vec<String> = d.readdir(p).unwrap().into_iter().map(|e| e.name).collect();
            n.sort();
            n
        };
        assert_eq!(names(&mut d, "/"), ["data", "locus", "x"]);
        assert_eq!(names(&mut d, "/data"), ["a", "b"]);
        assert_eq!(d.lstat("/data").unwrap().mode, S_IFDIR | 0o555);
        assert_eq!(d.mkdir("/data/c", 0o755).unwrap_err().errno, libc::EROFS);
        let opened = d.open("/data/b/f", locus_drivers::open_flags::READ, 0).unwrap();
        assert_eq!(d.pread(opened.handle, 0, 100).unwrap(), b"hello");
        d.close(opened.handle).unwrap();
        assert_eq!(d.pread(opened.handle, 0, 1).unwrap_err().errno, libc::EBADF);
        assert_eq!(d.rename("/data/a/f", "/x/f").unwrap_err().errno, libc::EXDEV);
        assert_eq!(d.lstat("/locus/not-a-host").unwrap_err().errno, libc::ENOENT);
    }

    #[test]
    fn an_unreachable_server_is_kept_as_the_runs_abort_once() {
        let calls = Arc::new(Mutex::new(0));
        let abort = Arc::new(Mutex::new(None));
        let counter = calls.clone();
        let ns = Namespace::new(&[], Duration::ZERO).unwrap();
        let mut d = NamespaceDriver::new(ns, abort.clone(), Box::new(move || *counter.lock().unwrap() += 1));
        // Nothing listens on port 1.
        assert_eq!(d.lstat("/locus/127.0.0.1:1/f").unwrap_err().errno, libc::EIO);
        assert_eq!(d.lstat("/locus/127.0.0.1:1/g").unwrap_err().errno, libc::EIO);
        assert_eq!(abort.lock().unwrap().as_ref().unwrap().status, crate::EXIT_TRANSIENT);
        assert_eq!(*calls.lock().unwrap(), 1);
    }
}
