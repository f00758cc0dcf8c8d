//! Native programs under the storelet limits, for the administrator who chooses to
//! register one as an active-file handler.
//!
//! The program runs in a child process that sees a file system of its own: a read-only
//! tmpfs root holding the system's program and library directories (`/usr`, `/bin`,
//! `/lib`, `/lib64`, `/sbin`, read-only), a synthetic `/etc` (only what programs need to
//! start: `ld.so.cache`, `passwd` and `group` naming the run's identity alone,
//! `nsswitch.conf`, `hosts`, `localtime`, `ssl/certs`, `alternatives`; never the host's
//! other files), `/dev/null`, `/dev/zero`, `/dev/urandom`, a small writable `/tmp`, and
//! the run's view (see `locus_store::CodeView`), read-only, at `/work`, its working
//! directory. There is no `/proc` and no `/sys`. It has no network (a network namespace
//! of its own), cannot gain privileges (`no_new_privs`), and runs in a process group of
//! its own, all killed when a limit trips.
//!
//! **Identity.** As root, the program runs as a dedicated unprivileged user and group
//! ([`NativeSpec::uid`], never the server's), with no supplementary groups and no
//! capabilities, so it can neither signal nor trace the server or any other process
//! but its own, and a process count limit stops a fork bomb. The view is shown through an
//! idmapped mount on which the files the server owns (uid 0) belong to that user, so
//! it can read every file of its view and nothing else; after the run, whatever that
//! user still runs is killed. Without root the namespaces are made inside a user
//! namespace mapping only the server's own user, shown inside as that same identity.
//!
//! Limits and accounting match a WebAssembly run's where the kernel can tell: CPU time
//! (read from `/proc` every tick, charged to the subject's budget; `RLIMIT_CPU` as a
//! backstop), wall time, output (stdout and stderr together), memory (`RLIMIT_DATA`;
//! the peak from `ru_maxrss`), bytes written to files (`RLIMIT_FSIZE`), open files
//! (`RLIMIT_NOFILE`), processes (`RLIMIT_NPROC`, as root); bytes read are the kernel's
//! count of `read` calls (`rchar`). There is no fuel.

use crate::{Account, Limits, RunControl, RunOutcome, StoreletError, Stream};
use rustix::fs::{Mode, OFlags};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a native run needs.
pub struct NativeSpec<'a> {
    /// The program (absolute path on the server) and its arguments, `argv[0]` first.
    pub program: &'a Path,
    pub args: &'a [String],
    /// The view shown read-only at `/work`: its layers, top first (one directory shown as
    /// it is, or several overlaid), as `locus_store::CodeView::layers` gives them.
    pub layers: &'a [OwnedFd],
    /// An empty directory the child mounts its root on (in the server's state directory).
    pub scratch: &'a Path,
    pub limits: Limits,
    pub output: crate::OutputSink,
    pub control: Arc<RunControl>,
}

/// The first of the users that native runs get when the server is root: a run takes
/// this plus N (user and group), N the first slot no other run on the machine holds (a
/// lock on `/run/locus/run-users/N`, any server's), so no two runs at once share a
/// user. Far above the ranges systems give people and services.
pub const RUN_USERS: u32 = 2_000_000_000;
/// Slots of [`RUN_USERS`]: runs at once on one machine, as root.
const RUN_SLOTS: u32 = 4096;

/// Claims a user no other native run on this machine has now: its number, and the lock
/// that holds it until dropped.
fn claim_user() -> Result<(u32, std::fs::File), StoreletError> {
    let dir = ["/run/locus/run-users", "/tmp/locus-run-users"]
        .iter()
        .map(Path::new)
        .find(|d| std::fs::create_dir_all(d).is_ok())
        .ok_or_else(|| StoreletError::Setup("no directory for the run users' locks".into()))?;
    for n in 0..RUN_SLOTS {
        let mut open = std::fs::OpenOptions::new();
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut open, libc::O_NOFOLLOW);
        let Ok(file) = open.create(true).truncate(false).write(true).open(dir.join(n.to_string())) else {
            continue;
        };
        if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Ok((RUN_USERS + n, file));
        }
    }
    Err(StoreletError::Setup(format!("all {RUN_SLOTS} run users are taken")))
}

/// `open_tree(2)` and `move_mount(2)` flags (not in every libc yet).
const OPEN_TREE_CLONE: u32 = 1;
const OPEN_TREE_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
const AT_RECURSIVE: u32 = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;

/// How often limits are checked.
const TICK: Duration = Duration::from_millis(10);
/// The system directories shown to the program, read-only.
const SYSTEM_DIRS: [&str; 5] = ["/usr", "/bin", "/sbin", "/lib", "/lib64"];
/// What of the host's `/etc` is shown (read-only): what programs need to start and read
/// certificates; everything else of the synthetic `/etc` is written for the run.
const ETC_SHOWN: [&str; 4] = ["/etc/ld.so.cache", "/etc/localtime", "/etc/ssl/certs", "/etc/alternatives"];
/// Processes (threads included) the run's user may have at once, as root.
const MAX_PROCESSES: u64 = 128;
/// `mount_setattr(2)` and its `MOUNT_ATTR_*` flags (not in every libc yet).
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const DEVICES: [&str; 3] = ["/dev/null", "/dev/zero", "/dev/urandom"];

/// One step of building the child's root: a directory to bind, a file to bind, or a
/// symbolic link to recreate (merged-/usr systems link /bin to usr/bin).
enum Entry {
    MkDir(CString),
    /// A file written with the given contents.
    Write(CString, CString),
    Dir(CString, CString),
    /// A file bound over an empty one; read-only when the flag says so.
    File(CString, CString, bool),
    Link(CString, CString),
}

fn cstr(s: impl Into<Vec<u8>>) -> Result<CString, StoreletError> {
    CString::new(s).map_err(|_| StoreletError::Setup("a path holds a NUL byte".into()))
}

/// Everything the child does between fork and exec, prepared beforehand so the child
/// only makes system calls.
struct Plan {
    root: CString,
    entries: Vec<Entry>,
    /// The view's layers: detached idmapped copies of them as root, the directories
    /// themselves otherwise (descriptors inherited by the child).
    layers: Vec<OwnedFd>,
    /// For one layer, its path through `/proc/self/fd`; for several, the overlay's options.
    layer_path: CString,
    overlay: CString,
    work: CString,
    uid: u32,
    tmp: CString,
    uid_map: CString,
    gid_map: CString,
    as_root: bool,
    limits: Limits,
    /// The program, opened before the child's root replaces the server's (so it need not
    /// be inside that root), and its arguments and environment for `execveat`.
    program: std::os::fd::OwnedFd,
    argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
}

// SAFETY: the raw pointers point into the CStrings the plan owns, which never move.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

/// The environment of a native run.
const ENVIRONMENT: [&str; 4] = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp", "TMPDIR=/tmp"];

impl Plan {
    /// The plan of a run as user `run_uid` (as root; the identity shown inside the user
    /// namespace otherwise).
    fn new(spec: &NativeSpec<'_>, run_uid: u32) -> Result<Plan, StoreletError> {
        let root = spec.scratch.to_str().ok_or_else(|| StoreletError::Setup("scratch path is not UTF-8".into()))?;
        let mut entries = Vec::new();
        for dir in SYSTEM_DIRS {
            let Ok(meta) = std::fs::symlink_metadata(dir) else { continue };
            let inside = cstr(format!("{root}{dir}"))?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(dir).map_err(|e| StoreletError::Setup(e.to_string()))?;
                entries.push(Entry::Link(cstr(target.to_string_lossy().as_bytes())?, inside));
            } else if meta.is_dir() {
                entries.push(Entry::Dir(cstr(dir)?, inside));
            }
        }
        entries.extend(synthetic_etc(root, run_uid)?);
        entries.push(Entry::MkDir(cstr(format!("{root}/dev"))?));
        for dev in DEVICES {
            if Path::new(dev).exists() {
                entries.push(Entry::File(cstr(dev)?, cstr(format!("{root}{dev}"))?, false));
            }
        }
        let (uid, gid) = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());
        let as_root = uid == 0;
        if spec.layers.is_empty() {
            return Err(StoreletError::Setup("a native run needs a view".into()));
        }
        let layers = if as_root {
            let userns = idmap_userns(run_uid)?;
            spec.layers.iter().map(|l| idmapped(l, &userns)).collect::<Result<Vec<_>, _>>()?
        } else {
            spec.layers
                .iter()
                .map(|l| {
                    rustix::io::fcntl_dupfd_cloexec(l, 0).map_err(|e| StoreletError::Setup(format!("the view: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        let paths: Vec<String> = layers.iter().map(|l| format!("/proc/self/fd/{}", l.as_raw_fd())).collect();
        let program = rustix::fs::open(
            spec.program,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| StoreletError::Setup(format!("{}: {e}", spec.program.display())))?;
        let argv = spec.args.iter().map(|a| cstr(a.as_bytes())).collect::<Result<Vec<_>, _>>()?;
        let envp = ENVIRONMENT.iter().map(|e| cstr(*e)).collect::<Result<Vec<_>, _>>()?;
        let ptrs = |v: &Vec<CString>| v.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let (argv_ptrs, envp_ptrs) = (ptrs(&argv), ptrs(&envp));
        Ok(Plan {
            program,
            argv,
            argv_ptrs,
            envp,
            envp_ptrs,
            root: cstr(root)?,
            entries,
            layer_path: cstr(paths[0].as_str())?,
            overlay: cstr(format!("lowerdir={}", paths.join(":")))?,
            layers,
            work: cstr(format!("{root}/work"))?,
            tmp: cstr(format!("{root}/tmp"))?,
            uid_map: cstr(format!("{run_uid} {uid} 1"))?,
            gid_map: cstr(format!("{run_uid} {gid} 1"))?,
            uid: run_uid,
            as_root,
            limits: spec.limits,
        })
    }

    /// In the child: the namespaces, the new root, the limits, then the program (so this
    /// returns only with the error of the step that failed).
    ///
    /// # Safety
    /// Called between fork and exec: only system calls, no allocation.
    unsafe fn enter(&self) -> Result<(), std::io::Error> {
        let fail = || Err(std::io::Error::last_os_error());
        macro_rules! check {
            ($call:expr) => {
                if $call < 0 {
                    return fail();
                }
            };
        }
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            check!(libc::setpgid(0, 0));
            let spaces = libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC;
            if self.as_root {
                check!(libc::unshare(spaces));
            } else {
                check!(libc::unshare(spaces | libc::CLONE_NEWUSER));
                for (file, text) in [
                    (c"/proc/self/setgroups", c"deny"),
                    (c"/proc/self/uid_map", self.uid_map.as_c_str()),
                    (c"/proc/self/gid_map", self.gid_map.as_c_str()),
                ] {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    check!(fd);
                    let len = text.to_bytes().len();
                    let written = libc::write(fd, text.as_ptr().cast(), len);
                    libc::close(fd);
                    if written != len as isize {
                        return fail();
                    }
                }
            }
            let none = std::ptr::null();
            let mount =
                |src: *const libc::c_char, dst: &CString, fs: *const libc::c_char, flags, data: *const libc::c_char| {
                    libc::mount(src, dst.as_ptr(), fs, flags, data.cast())
                };
            check!(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, none.cast()));
            let nosuid = libc::MS_NOSUID | libc::MS_NODEV;
            check!(mount(c"tmpfs".as_ptr(), &self.root, c"tmpfs".as_ptr(), nosuid, c"mode=0755".as_ptr()));
            let ro = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID;
            for entry in &self.entries {
                match entry {
                    Entry::Link(target, link) => check!(libc::symlink(target.as_ptr(), link.as_ptr())),
                    Entry::Dir(source, target) => {
                        check!(libc::mkdir(target.as_ptr(), 0o755));
                        check!(mount(source.as_ptr(), target, none, libc::MS_BIND | libc::MS_REC, none));
                        check!(mount(none, target, none, ro, none));
                    }
                    Entry::MkDir(dir) => check!(libc::mkdir(dir.as_ptr(), 0o755)),
                    Entry::Write(file, text) => {
                        let fd = libc::open(file.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
                        check!(fd);
                        let len = text.to_bytes().len();
                        let written = libc::write(fd, text.as_ptr().cast(), len);
                        libc::close(fd);
                        if written != len as isize {
                            return fail();
                        }
                    }
                    Entry::File(source, target, read_only) => {
                        let fd = libc::open(target.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
                        check!(fd);
                        libc::close(fd);
                        check!(mount(source.as_ptr(), target, none, libc::MS_BIND, none));
                        if *read_only {
                            check!(mount(none, target, none, ro | libc::MS_NODEV, none));
                        }
                    }
                }
            }
            check!(libc::mkdir(self.work.as_ptr(), 0o755));
            if self.layers.len() > 1 {
                let flags = libc::MS_RDONLY | nosuid;
                check!(mount(c"locus-view".as_ptr(), &self.work, c"overlay".as_ptr(), flags, self.overlay.as_ptr()));
            } else if self.as_root {
                // The idmapped copy, detached until now, is attached here.
                check!(libc::syscall(
                    libc::SYS_move_mount,
                    self.layers[0].as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    self.work.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH
                ) as i32);
            } else {
                // Through the descriptor: exactly the directory that was checked.
                check!(mount(self.layer_path.as_ptr(), &self.work, none, libc::MS_BIND | libc::MS_REC, none));
            }
            check!(mount(none, &self.work, none, ro | libc::MS_NODEV, none));
            check!(libc::mkdir(self.tmp.as_ptr(), 0o1777));
            check!(mount(c"tmpfs".as_ptr(), &self.tmp, c"tmpfs".as_ptr(), nosuid, c"size=16m,mode=1777".as_ptr()));
            check!(mount(none, &self.root, none, ro | libc::MS_NODEV, none));
            check!(libc::chdir(self.root.as_ptr()));
            check!(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as i32);
            check!(libc::umount2(c".".as_ptr(), libc::MNT_DETACH));
            check!(libc::chdir(c"/work".as_ptr()));
            let l = &self.limits;
            let cpu = l.cpu.as_secs() + 1;
            for (resource, value) in [
                (libc::RLIMIT_CPU, cpu),
                (libc::RLIMIT_DATA, l.memory as u64),
                (libc::RLIMIT_FSIZE, l.write_bytes),
                (libc::RLIMIT_NOFILE, l.files.min(4096)),
                (libc::RLIMIT_CORE, 0),
            ] {
                let r = libc::rlimit { rlim_cur: value, rlim_max: value };
                check!(libc::setrlimit(resource, &r));
            }
            if self.as_root {
                // The run's own user, with no groups but its own and no capabilities.
                let r = libc::rlimit { rlim_cur: MAX_PROCESSES, rlim_max: MAX_PROCESSES };
                check!(libc::setrlimit(libc::RLIMIT_NPROC, &r));
                check!(libc::setgroups(0, std::ptr::null()));
                check!(libc::setresgid(self.uid, self.uid, self.uid));
                check!(libc::setresuid(self.uid, self.uid, self.uid));
                // A change of identity clears the parent-death signal.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            }
            check!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
            let _ = (&self.argv, &self.envp); // kept alive for the pointers
            libc::syscall(
                libc::SYS_execveat,
                self.program.as_raw_fd(),
                c"".as_ptr(),
                self.argv_ptrs.as_ptr(),
                self.envp_ptrs.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
        }
        // Only reached when execveat failed.
        fail()
    }
}

/// The synthetic `/etc` of a run whose user is `uid`: written files naming only that
/// user, and the few host files programs need to start, shown read-only.
fn synthetic_etc(root: &str, uid: u32) -> Result<Vec<Entry>, StoreletError> {
    let mut entries = vec![Entry::MkDir(cstr(format!("{root}/etc"))?)];
    let written = [
        ("passwd", format!("locus-run:x:{uid}:{uid}:Locus code run:/tmp:/usr/sbin/nologin\n")),
        ("group", format!("locus-run:x:{uid}:\n")),
        ("nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files\n".to_string()),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n".to_string()),
    ];
    for (name, text) in written {
        entries.push(Entry::Write(cstr(format!("{root}/etc/{name}"))?, cstr(text)?));
    }
    let mut made = std::collections::HashSet::new();
    for shown in ETC_SHOWN {
        let Ok(meta) = std::fs::symlink_metadata(shown) else { continue };
        if let Some(parent) = Path::new(shown).parent().filter(|p| *p != Path::new("/etc")) {
            if made.insert(parent.to_path_buf()) {
                entries.push(Entry::MkDir(cstr(format!("{root}{}", parent.display()))?));
            }
        }
        let inside = cstr(format!("{root}{shown}"))?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(shown).map_err(|e| StoreletError::Setup(format!("{shown}: {e}")))?;
            entries.push(Entry::Link(cstr(target.as_os_str().as_encoded_bytes())?, inside));
        } else if meta.is_dir() {
            entries.push(Entry::Dir(cstr(shown)?, inside));
        } else {
            entries.push(Entry::File(cstr(shown)?, inside, true));
        }
    }
    Ok(entries)
}

fn setup_error(what: &str) -> StoreletError {
    StoreletError::Setup(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// A user namespace whose only mapping shows uid and gid 0 as `uid`: an idmapped mount
/// made with it shows the files the server owns as the run's user's. Made once per user.
fn idmap_userns(uid: u32) -> Result<std::sync::Arc<OwnedFd>, StoreletError> {
    static MADE: std::sync::Mutex<Option<std::collections::HashMap<u32, std::sync::Arc<OwnedFd>>>> =
        std::sync::Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ns) = made.get_or_insert_with(Default::default).get(&uid) {
        return Ok(ns.clone());
    }
    let mut pipe = [0i32; 2];
    // SAFETY: plain system calls; the child only makes system calls, then waits to die.
    unsafe {
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(setup_error("pipe"));
        }
        let (ready, told) = (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1]));
        let pid = libc::fork();
        if pid == 0 {
            if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                libc::write(told.as_raw_fd(), c"x".as_ptr().cast(), 1);
            }
            loop {
                libc::pause();
            }
        }
        if pid < 0 {
            return Err(setup_error("fork"));
        }
        drop(told);
        let mut byte = 0u8;
        let ok = libc::read(ready.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) == 1;
        let result = if ok {
            let map = format!("0 {uid} 1\n");
            let written = ["uid_map", "gid_map"]
                .iter()
                .try_for_each(|f| std::fs::write(format!("/proc/{pid}/{f}"), &map))
                .map_err(|e| StoreletError::Setup(format!("the run's user mapping: {e}")));
            written.and_then(|()| {
                rustix::fs::open(format!("/proc/{pid}/ns/user"), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                    .map_err(|e| StoreletError::Setup(format!("the run's user namespace: {e}")))
            })
        } else {
            Err(StoreletError::Setup("the run's user namespace could not be made".into()))
        };
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        let ns = std::sync::Arc::new(result?);
        made.get_or_insert_with(Default::default).insert(uid, ns.clone());
        Ok(ns)
    }
}

/// A detached copy of the mount tree at `layer`, read-only throughout, on which the
/// server's files (uid 0) belong to the run's user (`userns`). Where the file system
/// cannot be idmapped, the copy is left unmapped (the run then reads what its mode
/// bits let anyone read), and that is logged once.
fn idmapped(layer: &OwnedFd, userns: &OwnedFd) -> Result<OwnedFd, StoreletError> {
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE;
    // SAFETY: system calls on descriptors we own, with a valid attribute struct.
    unsafe {
        let tree = libc::syscall(libc::SYS_open_tree, layer.as_raw_fd(), c"".as_ptr(), flags) as i32;
        if tree < 0 {
            return Err(setup_error("the run's view"));
        }
        let tree = OwnedFd::from_raw_fd(tree);
        let setattr = |attr: &MountAttr, recursive: bool| {
            let at = libc::AT_EMPTY_PATH as u32 | if recursive { AT_RECURSIVE } else { 0 };
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                at,
                attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            ) == 0
        };
        let sealed = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        if !setattr(&sealed, true) {
            return Err(setup_error("the run's view (read-only)"));
        }
        let idmap =
            MountAttr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: userns.as_raw_fd() as u64 };
        if !setattr(&idmap, false) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            let e = std::io::Error::last_os_error();
            WARNED.call_once(|| {
                eprintln!("locus: cannot idmap a native run's view ({e}): it reads only what anyone may read there")
            });
        }
        Ok(tree)
    }
}

/// Kills whatever the run's user `uid` still runs (a process that left the run's group).
fn kill_leftovers(uid: u32) {
    // SAFETY: the child only makes system calls, then exits.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            if libc::setresgid(uid, uid, uid) == 0 && libc::setresuid(uid, uid, uid) == 0 {
                // Again while any was found (one may have been forking); ESRCH: none left.
                let pause = libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 };
                for _ in 0..100 {
                    if libc::kill(-1, libc::SIGKILL) != 0 {
                        break;
                    }
                    libc::nanosleep(&pause, std::ptr::null_mut());
                }
            }
            libc::_exit(0);
        }
        if pid > 0 {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
}

/// CPU time of process `pid` (user and system, its threads included) from `/proc`.
fn cpu_of(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Duration::ZERO };
    // Fields after the command name (which may hold spaces) start after its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let hz = rustix::param::clock_ticks_per_second().max(1);
    // utime and stime are fields 14 and 15 of stat(5); here 0-based after ')': 11 and 12.
    Duration::from_nanos((ticks(11) + ticks(12)) * 1_000_000_000 / hz)
}

/// The kernel's count of bytes the process read and wrote through system calls.
fn io_of(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let get = |key: &str| {
        text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    (get("rchar:"), get("wchar:"))
}

/// Runs a native program as the module documentation says.
pub fn run_native(spec: NativeSpec<'_>) -> Result<RunOutcome, StoreletError> {
    // As root, a user of its own (held until the run and all it left are gone).
    let claimed = if rustix::process::getuid().is_root() { Some(claim_user()?) } else { None };
    let run_uid = claimed.as_ref().map_or(RUN_USERS, |(uid, _)| *uid);
    let plan = Plan::new(&spec, run_uid)?;
    std::fs::create_dir_all(spec.scratch)
        .map_err(|e| StoreletError::Setup(format!("{}: {e}", spec.scratch.display())))?;
    // The program is executed by `enter` itself (from its descriptor, once confined);
    // what `Command` would run instead is never reached.
    let mut cmd = Command::new("/nonexistent/locus-native-run");
    cmd.env_clear().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: `enter` only makes system calls on memory prepared before the fork.
    unsafe { cmd.pre_exec(move || plan.enter()) };
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| StoreletError::Setup(format!("{}: {e}", spec.program.display())))?;
    let pid = child.id();
    let limits = spec.limits;
    let used = Arc::new(AtomicUsize::new(0));
    let overflowed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = [
        (Stream::Stdout, child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>)),
        (Stream::Stderr, child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>)),
    ]
    .into_iter()
    .filter_map(|(stream, pipe)| pipe.map(|p| (stream, p)))
    .map(|(stream, mut pipe)| {
        let (sink, used, overflowed) = (spec.output.clone(), used.clone(), overflowed.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if used.fetch_add(n, Ordering::Relaxed) + n > limits.output {
                    overflowed.store(true, Ordering::Relaxed);
                    break;
                }
                sink(stream, &buf[..n]);
            }
        })
    })
    .collect();
    let kill = || {
        // SAFETY: signals the child's own process group.
        unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
    };
    let mut tripped: Option<(&'static str, String)> = None;
    let mut charged = Duration::ZERO;
    loop {
        // Exited? Its counters stay readable until it is reaped (WNOWAIT).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own child without reaping it; `info` is ours to fill.
        let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
        // SAFETY: si_pid is set by waitid when a child changed state.
        if r == 0 && unsafe { info.si_pid() } == pid as i32 {
            break;
        }
        let cpu = cpu_of(pid);
        spec.control.cpu_ns.store(cpu.as_nanos() as u64, Ordering::Relaxed);
        let budget_spent = spec.control.budget.as_ref().is_some_and(|b| {
            let fresh = cpu.saturating_sub(charged);
            charged = cpu;
            !b.charge(fresh)
        });
        let why = if spec.control.is_cancelled() {
            Some(("cancelled", String::new()))
        } else if started.elapsed() >= limits.wall {
            Some(("time", format!("ran longer than {:?}", limits.wall)))
        } else if cpu > limits.cpu {
            Some(("cpu time", format!("used more than {:?}", limits.cpu)))
        } else if budget_spent {
            Some(("cpu budget", "the principal's budget is spent".to_string()))
        } else if overflowed.load(Ordering::Relaxed) {
            Some(("output", format!("wrote more than {} bytes", limits.output)))
        } else {
            None
        };
        if let Some(why) = why {
            tripped.get_or_insert(why);
            kill();
        }
        std::thread::sleep(TICK);
    }
    let (cpu, (read_bytes, write_bytes)) = (cpu_of(pid), io_of(pid));
    kill(); // what it left behind in its group
    if let Some((uid, lock)) = claimed {
        kill_leftovers(uid);
        drop(lock);
    }
    let mut raw = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaps our own child, filling its status and usage.
    unsafe { libc::wait4(pid as i32, &mut raw, 0, &mut usage) };
    let status = <std::process::ExitStatus as std::os::unix::process::ExitStatusExt>::from_raw(raw);
    for r in readers {
        let _ = r.join();
    }
    let account = Account {
        fuel: 0,
        cpu: cpu.max(charged),
        peak_memory: usage.ru_maxrss as usize * 1024,
        wall: started.elapsed(),
        output: used.load(Ordering::Relaxed).min(limits.output),
        read_bytes,
        write_bytes,
        files_opened: 0,
    };
    if let Some(b) = &spec.control.budget {
        b.charge(account.cpu.saturating_sub(charged));
    }
    if overflowed.load(Ordering::Relaxed) && tripped.is_none() {
        tripped = Some(("output", format!("wrote more than {} bytes", limits.output)));
    }
    match tripped {
        Some(("cancelled", _)) => Err(StoreletError::Cancelled { account }),
        Some((limit, detail)) => Err(StoreletError::Limit { limit, detail, account }),
        None => match status.code() {
            Some(code) => {
                Ok(RunOutcome { exit_code: code, stdout: Vec::new(), stderr: Vec::new(), account, inputs: None })
            }
            None => {
                use std::os::unix::process::ExitStatusExt;
                let signal = status.signal().unwrap_or(0);
                if signal == libc::SIGXCPU || signal == libc::SIGKILL && account.cpu >= limits.cpu {
                    Err(StoreletError::Limit {
                        limit: "cpu time",
                        detail: format!("used more than {:?}", limits.cpu),
                        account,
                    })
                } else if signal == libc::SIGXFSZ {
                    Err(StoreletError::Limit {
                        limit: "bytes written",
                        detail: format!("wrote {} bytes", limits.write_bytes),
                        account,
                    })
                } else {
                    Err(StoreletError::Trap(format!("killed by signal {signal}")))
                }
            }
        },
    }
}
