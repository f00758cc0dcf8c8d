//! What each traced system call does when it names a remote path. Calls on local paths
//! continue untouched; calls on remote ones either have their path rewritten to the
//! shadow (after the staging area was brought up to date) or are done at the server and
//! answered without entering the kernel.

use crate::names::{normalize, parent, Place};
use crate::stage::{set_times, Stage};
use crate::tracer::{Abort, Handler, Step, Tracee};
use crate::Fail;
use locus_drivers::{Attr, SetTime, Time};

/// The agent: the staging area and the namespace behind it.
pub struct Agent {
    pub stage: Stage,
}

/// A path after following remote symbolic links.
enum Resolved {
    Remote {
        mount: usize,
        logical: String,
        attr: Attr,
    },
    /// A link led out of the remote trees (or to a directory leading to them).
    Elsewhere(String),
}

const MAX_LINKS: usize = 40;

impl Handler for Agent {
    fn syscall(&mut self, t: &Tracee, nr: i64, a: [u64; 6]) -> Result<Step, Abort> {
        match self.dispatch(t, nr, a) {
            Ok(step) => Ok(step),
            Err(Fail::Errno(e)) => Ok(Step::Return(-(e as i64))),
            Err(Fail::Stop(abort)) => Err(abort),
        }
    }

    fn process_event(&mut self) -> Result<(), Abort> {
        if !self.stage.has_dirty() {
            return Ok(());
        }
        self.stage.sync_all().map_err(|e| match e {
            Fail::Stop(a) => a,
            Fail::Errno(_) => unreachable!("sync_all reports refusals itself"),
        })
    }
}

impl Agent {
    #[allow(non_upper_case_globals)] // libc names system calls SYS_open, not SYS_OPEN
    fn dispatch(&mut self, t: &Tracee, nr: i64, a: [u64; 6]) -> Result<Step, Fail> {
        use libc::*;
        const CWD: u64 = AT_FDCWD as u64;
        let nofollow = |flags: u64| flags & AT_SYMLINK_NOFOLLOW as u64 != 0;
        match nr {
            SYS_open => self.open(t, CWD, a[0], 0, a[1], a[2]),
            SYS_creat => self.open(t, CWD, a[0], 0, (O_CREAT | O_WRONLY | O_TRUNC) as u64, a[1]),
            SYS_openat => self.open(t, a[0], a[1], 1, a[2], a[3]),
            SYS_openat2 => {
                // struct open_how { u64 flags; u64 mode; u64 resolve; }
                let how = t.read(a[2], 16).ok_or(Fail::Errno(EFAULT))?;
                let word = |i: usize| u64::from_ne_bytes(how[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                self.open(t, a[0], a[1], 1, word(0), word(1))
            }
            SYS_stat | SYS_access | SYS_statfs | SYS_getxattr | SYS_setxattr | SYS_listxattr | SYS_removexattr => {
                self.look(t, CWD, a[0], 0, true)
            }
            SYS_lstat | SYS_readlink | SYS_lgetxattr | SYS_lsetxattr | SYS_llistxattr | SYS_lremovexattr => {
                self.look(t, CWD, a[0], 0, false)
            }
            SYS_newfstatat => self.look(t, a[0], a[1], 1, !nofollow(a[3])),
            SYS_statx => self.look(t, a[0], a[1], 1, !nofollow(a[2])),
            SYS_faccessat => self.look(t, a[0], a[1], 1, true),
            SYS_faccessat2 => self.look(t, a[0], a[1], 1, !nofollow(a[3])),
            SYS_readlinkat => self.look(t, a[0], a[1], 1, false),
            SYS_chdir => self.chdir(t, a[0]),
            SYS_execve => self.exec(t, CWD, a[0], 0),
            SYS_execveat => self.exec(t, a[0], a[1], 1),
            SYS_getcwd => self.getcwd(t, a[0], a[1]),
            SYS_mkdir => self.mkdir(t, CWD, a[0], a[1]),
            SYS_mkdirat => self.mkdir(t, a[0], a[1], a[2]),
            SYS_rmdir => self.remove(t, CWD, a[0], true),
            SYS_unlink => self.remove(t, CWD, a[0], false),
            SYS_unlinkat => self.remove(t, a[0], a[1], a[2] & AT_REMOVEDIR as u64 != 0),
            SYS_rename => self.rename(t, CWD, a[0], CWD, a[1], 0),
            SYS_renameat => self.rename(t, a[0], a[1], a[2], a[3], 0),
            SYS_renameat2 => self.rename(t, a[0], a[1], a[2], a[3], a[4]),
            SYS_link => self.link(t, CWD, a[0], CWD, a[1]),
            SYS_linkat => self.link(t, a[0], a[1], a[2], a[3]),
            SYS_symlink => self.symlink(t, a[0], CWD, a[1]),
            SYS_symlinkat => self.symlink(t, a[0], a[1], a[2]),
            SYS_chmod => self.chmod(t, CWD, a[0], a[1]),
            SYS_fchmodat => self.chmod(t, a[0], a[1], a[2]),
            SYS_chown => self.chown(t, CWD, a[0], a[1], a[2], true),
            SYS_lchown => self.chown(t, CWD, a[0], a[1], a[2], false),
            SYS_fchownat => self.chown(t, a[0], a[1], a[2], a[3], !nofollow(a[4])),
            SYS_truncate => self.truncate(t, a[0], a[1]),
            SYS_utime => {
                let times = if a[1] == 0 { None } else { Some(self.words(t, a[1], 2)?) };
                let times = times.map(|w| [Time { sec: w[0] as i64, nsec: 0 }, Time { sec: w[1] as i64, nsec: 0 }]);
                self.utimes(t, CWD, a[0], times.map(|[x, y]| [SetTime::At(x), SetTime::At(y)]), true)
            }
            SYS_utimes => self.utimes_timeval(t, CWD, a[0], a[1]),
            SYS_futimesat => self.utimes_timeval(t, a[0], a[1], a[2]),
            SYS_utimensat => {
                if a[1] == 0 {
                    return Ok(Step::Continue); // futimens(fd): the local copy, written back later
                }
                let times = if a[2] == 0 {
                    None
                } else {
                    let w = self.words(t, a[2], 4)?;
                    let one = |sec: u64, nsec: u64| match nsec as i64 {
                        n if n == UTIME_NOW => SetTime::Now,
                        n if n == UTIME_OMIT => SetTime::Omit,
                        n => SetTime::At(Time { sec: sec as i64, nsec: n as u32 }),
                    };
                    Some([one(w[0], w[1]), one(w[2], w[3])])
                };
                self.utimes(t, a[0], a[1], times, !nofollow(a[3]))
            }
            SYS_mknod => self.refuse(t, CWD, a[0], EPERM),
            SYS_mknodat => self.refuse(t, a[0], a[1], EPERM),
            SYS_close | SYS_fsync | SYS_fdatasync => {
                if self.stage.has_dirty() {
                    if let Some(path) = t.fd_path(a[0]) {
                        if let Some(logical) = self.stage.logical_of(&path).map(str::to_string) {
                            match self.stage.sync(&logical) {
                                Err(Fail::Errno(e)) => eprintln!(
                                    "locus run: {logical}: not written back: {}",
                                    std::io::Error::from_raw_os_error(e)
                                ),
                                other => other?,
                            }
                        }
                    }
                }
                Ok(Step::Continue)
            }
            _ => Ok(Step::Continue),
        }
    }

    /// Where the path argument at `addr` (relative to `dirfd`) lies.
    fn place(&mut self, t: &Tracee, dirfd: u64, addr: u64) -> Result<Place, Fail> {
        let Some(raw) = t.read_path(addr) else { return Ok(Place::Local) };
        if raw.is_empty() {
            return Ok(Place::Local);
        }
        let abs = if raw.starts_with('/') {
            normalize(&raw)
        } else {
            let base = if dirfd as i32 == libc::AT_FDCWD { t.cwd() } else { t.fd_path(dirfd) };
            let Some(base) = base else { return Ok(Place::Local) };
            normalize(&format!("{base}/{raw}"))
        };
        let logical = self.stage.logical_of(&abs).map(str::to_string).unwrap_or(abs);
        self.stage.ns.place(&logical)
    }

    /// Follows remote symbolic links (if `follow`) to what a path finally names.
    fn resolve(&mut self, mount: usize, logical: String, follow: bool) -> Result<Resolved, Fail> {
        let (mut mount, mut logical) = (mount, logical);
        for _ in 0..MAX_LINKS {
            let attr = self.stage.attr(mount, &logical)?.ok_or(Fail::Errno(libc::ENOENT))?;
            if !(follow && attr.is_symlink()) {
                return Ok(Resolved::Remote { mount, logical, attr });
            }
            let target = self.stage.readlink(mount, &logical)?;
            let next = if target.starts_with('/') {
                normalize(&target)
            } else {
                normalize(&format!("{}/{target}", parent(&logical)))
            };
            match self.stage.ns.place(&next)? {
                Place::Remote { mount: m, logical: l } => (mount, logical) = (m, l),
                Place::Local => return Ok(Resolved::Elsewhere(next)),
                Place::Virtual(l) => return Ok(Resolved::Elsewhere(self.stage.virtual_dir(&l))),
            }
        }
        Err(Fail::Errno(libc::ELOOP))
    }

    /// Stat-like calls: bring the node up to date and let the kernel answer from it.
    fn look(&mut self, t: &Tracee, dirfd: u64, addr: u64, arg: usize, follow: bool) -> Result<Step, Fail> {
        match self.place(t, dirfd, addr)? {
            Place::Local => Ok(Step::Continue),
            Place::Virtual(l) => Ok(Step::Rewrite(vec![(arg, self.stage.virtual_dir(&l))])),
            Place::Remote { mount, logical } => match self.resolve(mount, logical, follow)? {
                Resolved::Elsewhere(path) => Ok(Step::Rewrite(vec![(arg, path)])),
                Resolved::Remote { mount, logical, attr } => {
                    self.stage.place(mount, &logical, &attr)?;
                    if attr.is_dir() {
                        // Listed now rather than at open, so that the directory does not
                        // seem to change between the program's stat and its reading. The
                        // stat stands even where listings fail (HTTP has none).
                        let _ = self.stage.list(mount, &logical);
                    }
                    Ok(Step::Rewrite(vec![(arg, self.stage.shadow(&logical))]))
                }
            },
        }
    }

    fn open(&mut self, t: &Tracee, dirfd: u64, addr: u64, arg: usize, flags: u64, mode: u64) -> Result<Step, Fail> {
        let flags = flags as i32;
        let (mount, logical) = match self.place(t, dirfd, addr)? {
            Place::Local => return Ok(Step::Continue),
            Place::Virtual(l) => return Ok(Step::Rewrite(vec![(arg, self.stage.virtual_dir(&l))])),
            Place::Remote { mount, logical } => (mount, logical),
        };
        let writing = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let create = flags & libc::O_CREAT != 0;
        let exclusive = create && flags & libc::O_EXCL != 0;
        let follow = flags & libc::O_NOFOLLOW == 0 && !exclusive;
        let attr = match self.stage.attr(mount, &logical)? {
            None if create => {
                let mode = mode as u32 & 0o7777 & !t.umask();
                self.stage.create(mount, &logical, mode, exclusive)?;
                return Ok(Step::Rewrite(vec![(arg, self.stage.shadow(&logical))]));
            }
            None => return Err(Fail::Errno(libc::ENOENT)),
            Some(_) if exclusive => return Err(Fail::Errno(libc::EEXIST)),
            Some(a) => a,
        };
        let (mount, logical, attr) = match attr.is_symlink() && follow {
            false => (mount, logical, attr),
            true => match self.resolve(mount, logical, true)? {
                Resolved::Elsewhere(path) => return Ok(Step::Rewrite(vec![(arg, path)])),
                Resolved::Remote { mount, logical, attr } => (mount, logical, attr),
            },
        };
        if attr.is_dir() {
            if writing {
                return Err(Fail::Errno(libc::EISDIR));
            }
            self.stage.place(mount, &logical, &attr)?;
            self.stage.list(mount, &logical)?;
        } else if writing && flags & libc::O_TRUNC != 0 {
            self.stage.place(mount, &logical, &attr)?; // about to be emptied: no need to fetch
            self.stage.opened_for_writing(mount, &logical);
        } else {
            self.stage.fetch(mount, &logical, &attr)?;
            if writing {
                self.stage.opened_for_writing(mount, &logical);
            }
        }
        Ok(Step::Rewrite(vec![(arg, self.stage.shadow(&logical))]))
    }

    fn chdir(&mut self, t: &Tracee, addr: u64) -> Result<Step, Fail> {
        match self.place(t, libc::AT_FDCWD as u64, addr)? {
            Place::Local => Ok(Step::Continue),
            Place::Virtual(l) => Ok(Step::Rewrite(vec![(0, self.stage.virtual_dir(&l))])),
            Place::Remote { mount, logical } => match self.resolve(mount, logical, true)? {
                Resolved::Elsewhere(path) => Ok(Step::Rewrite(vec![(0, path)])),
                Resolved::Remote { attr, .. } if !attr.is_dir() => Err(Fail::Errno(libc::ENOTDIR)),
                Resolved::Remote { mount, logical, attr } => {
                    self.stage.place(mount, &logical, &attr)?;
                    Ok(Step::Rewrite(vec![(0, self.stage.shadow(&logical))]))
                }
            },
        }
    }

    fn exec(&mut self, t: &Tracee, dirfd: u64, addr: u64, arg: usize) -> Result<Step, Fail> {
        match self.place(t, dirfd, addr)? {
            Place::Local => Ok(Step::Continue),
            Place::Virtual(_) => Err(Fail::Errno(libc::EACCES)),
            Place::Remote { mount, logical } => match self.resolve(mount, logical, true)? {
                Resolved::Elsewhere(path) => Ok(Step::Rewrite(vec![(arg, path)])),
                Resolved::Remote { attr, .. } if !attr.is_file() => Err(Fail::Errno(libc::EACCES)),
                Resolved::Remote { mount, logical, attr } => {
                    self.stage.fetch(mount, &logical, &attr)?;
                    Ok(Step::Rewrite(vec![(arg, self.stage.shadow(&logical))]))
                }
            },
        }
    }

    /// `getcwd` in a remote directory answers its logical name, not the shadow's.
    fn getcwd(&mut self, t: &Tracee, buf: u64, size: u64) -> Result<Step, Fail> {
        let Some(cwd) = t.cwd() else { return Ok(Step::Continue) };
        let Some(logical) = self.stage.logical_of(&cwd) else { return Ok(Step::Continue) };
        let mut bytes = logical.as_bytes().to_vec();
        bytes.push(0);
        if bytes.len() as u64 > size {
            return Err(Fail::Errno(libc::ERANGE));
        }
        if !t.write(buf, &bytes) {
            return Err(Fail::Errno(libc::EFAULT));
        }
        Ok(Step::Return(bytes.len() as i64))
    }

    /// The remote path of a call that changes the namespace; `None` if it is local.
    fn remote_target(&mut self, t: &Tracee, dirfd: u64, addr: u64) -> Result<Option<(usize, String)>, Fail> {
        match self.place(t, dirfd, addr)? {
            Place::Local => Ok(None),
            Place::Virtual(_) => Err(Fail::Errno(libc::EROFS)),
            Place::Remote { mount, logical } => Ok(Some((mount, logical))),
        }
    }

    fn mkdir(&mut self, t: &Tracee, dirfd: u64, addr: u64, mode: u64) -> Result<Step, Fail> {
        let Some((mount, logical)) = self.remote_target(t, dirfd, addr)? else { return Ok(Step::Continue) };
        let mode = mode as u32 & 0o7777 & !t.umask();
        self.stage.change(mount, &logical, |d, r| d.mkdir(r, mode), |_| {})?;
        Ok(Step::Return(0))
    }

    fn remove(&mut self, t: &Tracee, dirfd: u64, addr: u64, dir: bool) -> Result<Step, Fail> {
        let Some((mount, logical)) = self.remote_target(t, dirfd, addr)? else { return Ok(Step::Continue) };
        self.stage.remove(mount, &logical, dir)?;
        Ok(Step::Return(0))
    }

    /// Both paths of a two-path call, which must lie on one mount (else `EXDEV`).
    fn pair(
        &mut self,
        t: &Tracee,
        fd1: u64,
        p1: u64,
        fd2: u64,
        p2: u64,
    ) -> Result<Option<(usize, String, String)>, Fail> {
        let from = self.remote_target(t, fd1, p1)?;
        let to = self.remote_target(t, fd2, p2)?;
        match (from, to) {
            (None, None) => Ok(None),
            (Some((m1, from)), Some((m2, to))) if m1 == m2 => Ok(Some((m1, from, to))),
            _ => Err(Fail::Errno(libc::EXDEV)),
        }
    }

    fn rename(&mut self, t: &Tracee, fd1: u64, p1: u64, fd2: u64, p2: u64, flags: u64) -> Result<Step, Fail> {
        let Some((mount, from, to)) = self.pair(t, fd1, p1, fd2, p2)? else { return Ok(Step::Continue) };
        if flags & libc::RENAME_EXCHANGE as u64 != 0 || flags & libc::RENAME_WHITEOUT as u64 != 0 {
            return Err(Fail::Errno(libc::EINVAL));
        }
        if flags & libc::RENAME_NOREPLACE as u64 != 0 && self.stage.attr(mount, &to)?.is_some() {
            return Err(Fail::Errno(libc::EEXIST));
        }
        self.stage.rename(mount, &from, &to)?;
        Ok(Step::Return(0))
    }

    fn link(&mut self, t: &Tracee, fd1: u64, p1: u64, fd2: u64, p2: u64) -> Result<Step, Fail> {
        let Some((mount, from, to)) = self.pair(t, fd1, p1, fd2, p2)? else { return Ok(Step::Continue) };
        self.stage.sync(&from)?;
        let remote_to = self.stage.ns.remote(mount, &to);
        self.stage.change(mount, &from, |d, r| d.link(r, &remote_to), |_| {})?;
        self.stage.changed(&to);
        Ok(Step::Return(0))
    }

    fn symlink(&mut self, t: &Tracee, target: u64, dirfd: u64, addr: u64) -> Result<Step, Fail> {
        let Some((mount, logical)) = self.remote_target(t, dirfd, addr)? else { return Ok(Step::Continue) };
        let target = t.read_path(target).ok_or(Fail::Errno(libc::EFAULT))?;
        self.stage.change(mount, &logical, |d, r| d.symlink(&target, r), |_| {})?;
        Ok(Step::Return(0))
    }

    /// The remote file a metadata call acts on, links followed; `None` if local.
    fn existing(&mut self, t: &Tracee, dirfd: u64, addr: u64, follow: bool) -> Result<Option<(usize, String)>, Fail> {
        let Some((mount, logical)) = self.remote_target(t, dirfd, addr)? else { return Ok(None) };
        match self.resolve(mount, logical, follow)? {
            Resolved::Remote { mount, logical, .. } => Ok(Some((mount, logical))),
            Resolved::Elsewhere(_) => Err(Fail::Errno(libc::EXDEV)),
        }
    }

    fn chmod(&mut self, t: &Tracee, dirfd: u64, addr: u64, mode: u64) -> Result<Step, Fail> {
        let Some((mount, logical)) = self.existing(t, dirfd, addr, true)? else { return Ok(Step::Continue) };
        let mode = mode as u32 & 0o7777;
        self.stage.change(
            mount,
            &logical,
            |d, r| d.chmod(r, mode),
            |local| {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(local, std::fs::Permissions::from_mode(mode));
            },
        )?;
        Ok(Step::Return(0))
    }

    /// Remote files have no owner to change: a change to the caller's own ids (or none)
    /// succeeds, any other is `EPERM`.
    fn chown(&mut self, t: &Tracee, dirfd: u64, addr: u64, uid: u64, gid: u64, follow: bool) -> Result<Step, Fail> {
        if self.existing(t, dirfd, addr, follow)?.is_none() {
            return Ok(Step::Continue);
        }
        let same = |id: u64, own: u32| id as u32 == u32::MAX || id as u32 == own;
        if same(uid, rustix::process::geteuid().as_raw()) && same(gid, rustix::process::getegid().as_raw()) {
            Ok(Step::Return(0))
        } else {
            Err(Fail::Errno(libc::EPERM))
        }
    }

    fn truncate(&mut self, t: &Tracee, addr: u64, size: u64) -> Result<Step, Fail> {
        let Some((mount, logical)) = self.existing(t, libc::AT_FDCWD as u64, addr, true)? else {
            return Ok(Step::Continue);
        };
        self.stage.change(
            mount,
            &logical,
            |d, r| d.truncate(r, size),
            |local| {
                let _ = std::fs::OpenOptions::new().write(true).open(local).and_then(|f| f.set_len(size));
            },
        )?;
        Ok(Step::Return(0))
    }

    fn utimes_timeval(&mut self, t: &Tracee, dirfd: u64, addr: u64, tv: u64) -> Result<Step, Fail> {
        let times = if tv == 0 {
            None
        } else {
            let w = self.words(t, tv, 4)?;
            let one =
                |sec: u64, usec: u64| SetTime::At(Time { sec: sec as i64, nsec: (usec as u32).saturating_mul(1000) });
            Some([one(w[0], w[1]), one(w[2], w[3])])
        };
        self.utimes(t, dirfd, addr, times, true)
    }

    fn utimes(
        &mut self,
        t: &Tracee,
        dirfd: u64,
        addr: u64,
        times: Option<[SetTime; 2]>,
        follow: bool,
    ) -> Result<Step, Fail> {
        let Some((mount, logical)) = self.existing(t, dirfd, addr, follow)? else { return Ok(Step::Continue) };
        let [atime, mtime] = times.unwrap_or([SetTime::Now, SetTime::Now]);
        self.stage.change(
            mount,
            &logical,
            |d, r| d.utimes(r, atime, mtime),
            |local| {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let now = Time { sec: now.as_secs() as i64, nsec: now.subsec_nanos() };
                let pick = |s: SetTime, old: Time| match s {
                    SetTime::At(t) => t,
                    SetTime::Now => now,
                    SetTime::Omit => old,
                };
                if let Ok(m) = std::fs::symlink_metadata(local) {
                    let a = locus_drivers::local::attr_of(&m);
                    set_times(local, pick(atime, a.atime), pick(mtime, a.mtime));
                }
            },
        )?;
        Ok(Step::Return(0))
    }

    /// Calls with no remote meaning (device nodes): `errno` on remote paths.
    fn refuse(&mut self, t: &Tracee, dirfd: u64, addr: u64, errno: i32) -> Result<Step, Fail> {
        match self.remote_target(t, dirfd, addr)? {
            None => Ok(Step::Continue),
            Some(_) => Err(Fail::Errno(errno)),
        }
    }

    /// `n` 64-bit words of the tracee's memory.
    fn words(&self, t: &Tracee, addr: u64, n: usize) -> Result<Vec<u64>, Fail> {
        let bytes = t.read(addr, n * 8).ok_or(Fail::Errno(libc::EFAULT))?;
        Ok(bytes.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect())
    }
}
