//! The faster path for `locus run`: no system call is intercepted at all. The program
//! runs in a private mount namespace (inside a new user namespace when the agent is not
//! root, which any user may create where the kernel allows it) whose root is a copy of
//! this machine's: every entry of `/` bound to itself, plus the remote trees, bound from
//! one FUSE file system that the agent serves ([`LocusFs`] over a [`NamespaceDriver`], the
//! same code as `locus mount`). Local files are the kernel's business alone, so `getpid`,
//! a local `stat` or a local read cost what they cost without the agent.
//!
//! It needs `/dev/fuse`, a kernel that lets this user make namespaces, and a directory to
//! mount each logical name on: a name whose first component is new to `/` (as
//! `/locus`, or `/data/x` where there is no `/data`) gets one in the copied root; a name
//! that is an existing directory (no symbolic links on the way) is mounted over. Where
//! one of these is missing, [`plan`] says why and the agent traces the program instead.
//!
//! What differs from the traced path: the copied `/` is read-only (entries made in `/`
//! during the run would not be seen by the rest of the machine, so none can be made),
//! and the remote files are a FUSE file system (their `st_dev` is the mount's).

use crate::names::{beneath, normalize, Namespace};
use crate::ns_driver::NamespaceDriver;
use crate::tracer::Abort;
use crate::{EXIT_SETUP, EXIT_TRANSIENT};
use locus_mount::{LocusFs, MountOptions};
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Everything the child needs, prepared before the fork (the child may not allocate).
pub struct Plan {
    as_root: bool,
    /// The descriptor number the child gives `/dev/fuse` (held open on `/dev/null` till
    /// then): it must open the device itself, inside its namespace, for the kernel to
    /// accept it there, and the mount options must name the number beforehand.
    fuse_slot: OwnedFd,
    /// The directory holding the new root's mount point and the FUSE mount point,
    /// removed when the plan is dropped.
    _scratch: tempfile::TempDir,
    root: CString,
    fuse_dir: CString,
    fuse_data: CString,
    uid_map: CString,
    gid_map: CString,
    /// Entries of `/` copied into the new root.
    entries: Vec<Entry>,
    /// (path in the FUSE file system, mount point in the new root, whether to make it).
    binds: Vec<(CString, CString, bool)>,
    cwd: CString,
}

enum Entry {
    /// A directory or file bound to itself (`dir`: make a directory, else a file).
    Bind {
        source: CString,
        target: CString,
        dir: bool,
    },
    Symlink {
        target: CString,
        link: CString,
    },
}

fn cstring(s: impl AsRef<OsStr>) -> Result<CString, String> {
    CString::new(s.as_ref().as_bytes()).map_err(|_| "a path holds a NUL byte".to_string())
}

impl Plan {
    /// Whether the agent runs as root (then it makes no user namespace).
    pub(crate) fn as_root(&self) -> bool {
        self.as_root
    }
}

/// Whether the FUSE path can show `mounts` (logical, URL) here; if not, why.
pub fn plan(mounts: &[(String, String)]) -> Result<Plan, String> {
    // SAFETY: these cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let as_root = uid == 0;
    if !as_root {
        let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
        if max.trim() == "0" {
            return Err("user namespaces are turned off".into());
        }
    }
    rustix::fs::access("/dev/fuse", rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK)
        .map_err(|e| format!("/dev/fuse: {e}"))?;
    let fuse_slot: OwnedFd = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?.into();

    let mut logicals: Vec<String> = mounts.iter().map(|(l, _)| normalize(l)).collect();
    logicals.push("/locus".into());
    logicals.sort_by_key(|l| l.len());
    let mut new_tops: Vec<String> = Vec::new();
    let mut covered: Vec<String> = Vec::new();
    for logical in &logicals {
        if covered.iter().any(|c| beneath(logical, c)) {
            continue;
        }
        let first = logical.split('/').nth(1).unwrap_or_default();
        let top = format!("/{first}");
        if std::fs::symlink_metadata(&top).is_err() {
            new_tops.push(top.clone());
            covered.push(top);
            continue;
        }
        let is_plain_dir = std::fs::metadata(logical).is_ok_and(|m| m.is_dir())
            && std::fs::canonicalize(logical).is_ok_and(|c| c == Path::new(logical));
        if !is_plain_dir {
            return Err(format!("{logical}: no directory to mount it on"));
        }
        covered.push(logical.clone());
    }

    let scratch =
        tempfile::Builder::new().prefix("locus-run.").tempdir().map_err(|e| format!("scratch directory: {e}"))?;
    let root_dir = scratch.path().join("root");
    let fuse_dir = scratch.path().join("fuse");
    for d in [&root_dir, &fuse_dir] {
        std::fs::create_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let in_root = |p: &str| cstring(format!("{}{p}", root_dir.display()));
    let mut entries = Vec::new();
    for entry in std::fs::read_dir("/").map_err(|e| format!("/: {e}"))? {
        let entry = entry.map_err(|e| format!("/: {e}"))?;
        let path = format!("/{}", entry.file_name().to_string_lossy());
        if new_tops.contains(&path) {
            continue;
        }
        let kind = entry.file_type().map_err(|e| format!("{path}: {e}"))?;
        entries.push(if kind.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| format!("{path}: {e}"))?;
            Entry::Symlink { target: cstring(target)?, link: in_root(&path)? }
        } else {
            Entry::Bind { source: cstring(&path)?, target: in_root(&path)?, dir: kind.is_dir() }
        });
    }
    let mut binds = Vec::new();
    for top in &covered {
        let make = new_tops.contains(top);
        binds.push((cstring(format!("{}{top}", fuse_dir.display()))?, in_root(top)?, make));
    }
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    Ok(Plan {
        as_root,
        fuse_data: cstring(format!("fd={},rootmode=40000,user_id={uid},group_id={gid}", fuse_slot.as_raw_fd()))?,
        fuse_slot,
        root: cstring(&root_dir)?,
        fuse_dir: cstring(&fuse_dir)?,
        uid_map: cstring(format!("{uid} {uid} 1"))?,
        gid_map: cstring(format!("{gid} {gid} 1"))?,
        _scratch: scratch,
        entries,
        binds,
        cwd: cstring(cwd)?,
    })
}

/// The steps of the child's setup, named in messages by their index.
const STEPS: [&str; 10] = [
    "unshare",
    "write the user namespace's maps",
    "open /dev/fuse",
    "make mounts private",
    "mount the new root",
    "mount FUSE",
    "copy / into the new root",
    "mount the remote trees",
    "make the new root read-only",
    "switch to the new root",
];

/// What the child reports on its socket: mounted (with the FUSE descriptor), or a step
/// that failed and its errno; a holder then says when the namespace is whole.
const MOUNTED: u8 = 0;
const FAILED: u8 = 1;
pub(crate) const READY: u8 = 2;

/// Why [`run`] did not give the program's exit status.
pub enum NotRun {
    /// The namespace could not be made (the caller may trace the program instead).
    Unavailable(String),
    /// The run was stopped (a server unreachable, a request no driver can satisfy).
    Stopped(Abort),
}

/// A private namespace made by a child of this process, with the FUSE device that
/// serves it: the child runs the program, or (with no program) holds the namespace.
pub(crate) struct Made {
    pub child: i32,
    /// The child's end: more comes only if its setup fails, or [`READY`] from a holder.
    pub socket: OwnedFd,
    pub fuse: OwnedFd,
}

/// Forks the child that makes `plan`'s namespace and runs `argv` in it (or, with none,
/// stays there as its holder); answers once the FUSE file system is mounted, which
/// must then be served for the rest of the setup to go on.
pub(crate) fn make(plan: &Plan, argv: Option<&[CString]>) -> Result<Made, String> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (parent_end, child_end) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| format!("socketpair: {e}"))?;
    let agent = std::process::id() as i32;
    let mut pointers: Vec<*const libc::c_char> = argv.unwrap_or_default().iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    // SAFETY: the child only makes system calls on memory prepared before the fork.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        unsafe {
            let (step, errno) = child_setup(plan, &pointers, agent, child_end.as_raw_fd());
            let report = [FAILED, step as u8, errno as u8, (errno >> 8) as u8];
            libc::send(child_end.as_raw_fd(), report.as_ptr().cast(), report.len(), 0);
            libc::_exit(EXIT_SETUP);
        }
    }
    drop(child_end);
    let (report, fuse) = receive(&parent_end);
    match fuse.filter(|_| report.first() == Some(&MOUNTED)) {
        Some(fuse) => Ok(Made { child, socket: parent_end, fuse }),
        None => {
            reap_all(child);
            Err(failure(&report))
        }
    }
}

/// What a child's report of a failed step says.
pub(crate) fn failure(report: &[u8]) -> String {
    if report.len() != 4 || report[0] != FAILED {
        return "the child ended".into();
    }
    let step = STEPS.get(report[1] as usize).copied().unwrap_or("setup");
    format!("{step}: {}", reported_error(report))
}

/// The errno in a child's report of a failed step (its third and fourth bytes).
fn reported_error(report: &[u8]) -> std::io::Error {
    let byte = |i: usize| i32::from(report.get(i).copied().unwrap_or(0));
    std::io::Error::from_raw_os_error(byte(2) | (byte(3) << 8))
}

/// Serves the mount's file system over `driver` on `fuse` in a thread of its own; the
/// receiver hears when the session ends (the namespace, and with it the mount, gone).
/// With `freshen`, the directory where the namespace's `/` is seen from here (a holder's
/// `/proc/PID/root`), listed directories' attributes are read again once walks pause
/// (see [`LocusFs::freshen_through`]). Also answers what asks the file system to store
/// everything (at its next `statfs`).
pub(crate) fn serve(
    fuse: OwnedFd,
    driver: NamespaceDriver,
    mount: MountOptions,
    freshen: Option<std::path::PathBuf>,
) -> (std::sync::mpsc::Receiver<()>, Arc<locus_mount::Control>) {
    let transport = mount.transport;
    let mut fs = LocusFs::new(Box::new(driver), "/", mount);
    if let Some(root) = freshen {
        fs.freshen_through(root);
    }
    let control = fs.control();
    let notifier = fs.notifier_slot();
    let session = locus_fuse::Session::new(fs, fuse, transport);
    let _ = notifier.set(session.notifier());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Err(e) = session.run() {
            tracing::warn!("FUSE: {e}");
        }
        let _ = done_tx.send(());
    });
    (done_rx, control)
}

/// Runs `argv` with `ns` shown through FUSE with `mount`'s caching, served by this
/// process alone; answers the program's exit status.
pub fn run(argv: &[CString], ns: Namespace, plan: Plan, mount: MountOptions) -> Result<i32, NotRun> {
    // SAFETY: orphans of the program become the agent's children, to be waited for.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let agent = std::process::id() as i32;
    let made = make(&plan, Some(argv)).map_err(NotRun::Unavailable)?;
    let abort: Arc<Mutex<Option<Abort>>> = Arc::new(Mutex::new(None));
    let on_abort = Box::new(move || kill_descendants(agent));
    let (done, _) = serve(made.fuse, NamespaceDriver::new(ns, abort.clone(), on_abort), mount, None);
    ignore_interrupts();
    // Nothing more comes (the socket closes at the program's exec) unless the setup failed.
    let (report, _) = receive(&made.socket);
    let status = reap_all(made.child);
    // The namespace is gone with its last process, and with it the mount: the session ends.
    let _ = done.recv_timeout(Duration::from_secs(5));
    drop(plan);
    if report.first() == Some(&FAILED) {
        return Err(NotRun::Unavailable(failure(&report)));
    }
    let abort = abort.lock().unwrap_or_else(|e| e.into_inner()).take();
    match abort {
        Some(abort) => Err(NotRun::Stopped(abort)),
        None => Ok(status),
    }
}

/// Ctrl-C goes to the program; the agent stays to serve it until it ends.
pub(crate) fn ignore_interrupts() {
    // SAFETY: setting the dispositions of two signals to "ignore".
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
}

/// Forks the program `argv` into the namespace of `mnt` (a mount namespace's descriptor,
/// after `user`'s, a user namespace's, if the namespace is in one), in `cwd`; answers
/// its process id once it runs (the exec closed the socket), or why it could not
/// (`cwd` not there among them).
pub(crate) fn enter(user: Option<&OwnedFd>, mnt: &OwnedFd, argv: &[CString], cwd: &CStr) -> Result<i32, String> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (parent_end, child_end) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| format!("socketpair: {e}"))?;
    let agent = std::process::id() as i32;
    let mut pointers: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    let user = user.map_or(-1, |fd| fd.as_raw_fd());
    // SAFETY: the child only makes system calls on memory prepared before the fork.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        unsafe {
            let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            let (step, e) = if libc::getppid() != agent {
                (0, libc::ESRCH)
            } else if (user >= 0 && libc::setns(user, libc::CLONE_NEWUSER) < 0)
                || libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) < 0
            {
                (0, errno())
            } else if libc::chdir(cwd.as_ptr()) < 0 {
                (1, errno())
            } else {
                libc::execvp(pointers[0], pointers.as_ptr());
                libc::_exit(127);
            };
            let report = [FAILED, step, e as u8, (e >> 8) as u8];
            libc::send(child_end.as_raw_fd(), report.as_ptr().cast(), report.len(), 0);
            libc::_exit(EXIT_SETUP);
        }
    }
    drop(child_end);
    let (report, _) = receive(&parent_end);
    if report.is_empty() {
        return Ok(child);
    }
    reap_all(child);
    let step = if report.get(1) == Some(&1) { "the working directory in the namespace" } else { "join the namespace" };
    Err(format!("{step}: {}", reported_error(&report)))
}

/// One message from the child, and the descriptor it carried if any (empty at its end).
pub(crate) fn receive(socket: &OwnedFd) -> (Vec<u8>, Option<OwnedFd>) {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::FromRawFd;
    let mut buf = [0u8; 8];
    let mut space = nix::cmsg_space!(std::os::fd::RawFd);
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return (Vec::new(), None),
            Ok(msg) => msg,
        };
        let mut fd = None;
        for c in msg.cmsgs().into_iter().flatten() {
            if let ControlMessageOwned::ScmRights(fds) = c {
                // SAFETY: a descriptor just received, owned by nobody else.
                fd = fds.first().map(|&f| unsafe { OwnedFd::from_raw_fd(f) });
            }
        }
        let len = msg.bytes;
        return (buf[..len].to_vec(), fd);
    }
}

/// Waits for `main` and every orphan left to the agent; answers `main`'s exit status
/// (128 + the signal that ended it).
pub(crate) fn reap_all(main: i32) -> i32 {
    let mut status_of_main = EXIT_TRANSIENT;
    loop {
        let mut status = 0;
        // SAFETY: waiting for any child.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return status_of_main;
        }
        if pid == main {
            status_of_main =
                if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) };
        }
    }
}

/// Sends `tag` with the descriptor `fd` on `socket`, allocating nothing.
///
/// # Safety
/// Async-signal-safe: for the forked child.
unsafe fn send_fd(socket: i32, tag: u8, fd: i32) {
    let mut byte = tag;
    let mut iov = libc::iovec { iov_base: (&mut byte as *mut u8).cast(), iov_len: 1 };
    // Room for one cmsghdr and one descriptor, aligned for cmsghdr.
    let mut space = [0u64; 4];
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as _;
    let cmsg = libc::CMSG_FIRSTHDR(&msg);
    (*cmsg).cmsg_level = libc::SOL_SOCKET;
    (*cmsg).cmsg_type = libc::SCM_RIGHTS;
    (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd);
    libc::sendmsg(socket, &msg, 0);
}

/// Kills every process beneath `agent` (they all are its descendants: it is their
/// subreaper), by their parents in /proc.
pub(crate) fn kill_descendants(agent: i32) {
    if agent <= 0 {
        return;
    }
    for _ in 0..10 {
        let mut parents: Vec<(i32, i32)> = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // The parent is the second field after the parenthesised command name.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
        let mut tree = vec![agent];
        let mut grew = true;
        while grew {
            grew = false;
            for &(pid, ppid) in &parents {
                if tree.contains(&ppid) && !tree.contains(&pid) {
                    tree.push(pid);
                    grew = true;
                }
            }
        }
        if tree.len() == 1 {
            return;
        }
        for &pid in &tree[1..] {
            // SAFETY: a signal to a process of the program's tree.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `mount(2)` with optional strings, without allocating (it runs in the forked child).
unsafe fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> libc::c_int {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    libc::mount(ptr(source), target.as_ptr(), ptr(fstype), flags, ptr(data).cast())
}

/// The child's side: namespaces, the new root, then the program (`argv`, null-ended).
/// Answers the step that failed and its errno (it returns only on failure).
///
/// # Safety
/// Call only in a freshly forked child: it makes system calls on `plan`'s memory and
/// allocates nothing.
unsafe fn child_setup(plan: &Plan, argv: &[*const libc::c_char], agent: i32, ready: i32) -> (usize, i32) {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    macro_rules! check {
        ($step:expr, $call:expr) => {
            if $call < 0 {
                return ($step, errno());
            }
        };
    }
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    if libc::getppid() != agent {
        libc::_exit(EXIT_SETUP);
    }
    if plan.as_root {
        check!(0, libc::unshare(libc::CLONE_NEWNS));
    } else {
        check!(0, libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS));
        for (file, text) in [
            (c"/proc/self/setgroups", c"deny"),
            (c"/proc/self/uid_map", plan.uid_map.as_c_str()),
            (c"/proc/self/gid_map", plan.gid_map.as_c_str()),
        ] {
            let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            check!(1, fd);
            let len = text.to_bytes().len();
            let written = libc::write(fd, text.as_ptr().cast(), len);
            libc::close(fd);
            if written != len as isize {
                return (1, errno());
            }
        }
    }
    let fuse = libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
    check!(2, fuse);
    check!(2, libc::dup3(fuse, plan.fuse_slot.as_raw_fd(), libc::O_CLOEXEC));
    libc::close(fuse);
    let (private, nosuid) = (libc::MS_REC | libc::MS_PRIVATE, libc::MS_NOSUID | libc::MS_NODEV);
    check!(3, mount(None, c"/", None, private, None));
    check!(4, mount(Some(c"tmpfs"), &plan.root, Some(c"tmpfs"), nosuid, Some(c"mode=0755")));
    check!(5, mount(Some(c"locus"), &plan.fuse_dir, Some(c"fuse.locus"), nosuid, Some(&plan.fuse_data)));
    // The agent serves the file system from now on.
    send_fd(ready, MOUNTED, plan.fuse_slot.as_raw_fd());
    for entry in &plan.entries {
        match entry {
            Entry::Symlink { target, link } => check!(6, libc::symlink(target.as_ptr(), link.as_ptr())),
            Entry::Bind { source, target, dir } => {
                if *dir {
                    check!(6, libc::mkdir(target.as_ptr(), 0o755));
                } else {
                    let fd = libc::open(target.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
                    check!(6, fd);
                    libc::close(fd);
                }
                check!(6, mount(Some(source), target, None, libc::MS_BIND | libc::MS_REC, None));
            }
        }
    }
    for (source, target, make) in &plan.binds {
        if *make {
            check!(7, libc::mkdir(target.as_ptr(), 0o755));
        }
        check!(7, mount(Some(source), target, None, libc::MS_BIND, None));
    }
    let read_only = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    check!(8, mount(None, &plan.root, None, read_only, None));
    // pivot_root(".", "."): the old root ends up on top of the new one, and is detached.
    check!(9, libc::chdir(plan.root.as_ptr()));
    check!(9, libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as i32);
    check!(9, libc::umount2(c".".as_ptr(), libc::MNT_DETACH));
    // The copies of the scratch mounts that came along with /tmp are of no use in here.
    libc::umount2(plan.root.as_ptr(), libc::MNT_DETACH);
    libc::umount2(plan.fuse_dir.as_ptr(), libc::MNT_DETACH);
    if libc::chdir(plan.cwd.as_ptr()) < 0 {
        libc::chdir(c"/".as_ptr());
    }
    if argv[0].is_null() {
        // A holder: the namespace lives while it does (it dies with the agent). It keeps
        // none of the agent's descriptors (its connections to servers among them) but
        // its socket.
        libc::syscall(libc::SYS_close_range, 3, ready.max(3) - 1, 0);
        libc::syscall(libc::SYS_close_range, ready + 1, u32::MAX, 0);
        let whole = [READY];
        libc::send(ready, whole.as_ptr().cast(), 1, 0);
        loop {
            libc::pause();
        }
    }
    libc::execvp(argv[0], argv.as_ptr());
    libc::_exit(127);
}
