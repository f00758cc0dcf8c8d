//! `locus run` warm across runs: the FUSE path's namespace, its file system and its
//! caches outlive the program, so that the next `locus run` of the same user with the
//! same mounts and options finds them as the last one left them.
//!
//! The first run starts a per-user *agent* (a process of its own, in its own session):
//! it makes the private namespace as [`crate::fuse_path`] does, with a child that only
//! holds it, serves the FUSE file system there, and listens on a Unix socket in a
//! directory only this user may enter (`$XDG_RUNTIME_DIR/locus` or
//! `/tmp/locus-run-UID`). Each `locus run`, the first included, connects, is handed the
//! namespace (its descriptors, checked to come to this user only), and forks the program
//! into it; it stays the program's parent, waits for it and for every process it left,
//! and then hangs up. The kernel's names, attributes, listings and pages, and the
//! mount's cache and callback promises, live in the agent: a second `find` under a new
//! `locus run` costs what a second `find` on `locus mount` costs.
//!
//! The socket's name is a hash of everything that shapes what the programs would see:
//! the user, the mounts, the caching options, the `LOCUS_*` environment and `HOME`
//! (where credentials come from), and the `locus` binary itself. Runs that differ in any
//! of them get agents of their own.
//!
//! The agent ends once no run has been connected for `--keep-warm` seconds. A server
//! that stays unreachable past the retry window stops every program connected (each
//! run ends with 75, as on its own) and ends the agent; an agent that dies stops the
//! programs in its namespace the same way (their files are gone with it), and the next
//! run starts a new one. The namespace's copy of `/` is made when the agent starts:
//! entries made in `/` later, and mounts made on this machine later, show in the next
//! agent only.

use crate::fuse_path::{self, NotRun, Plan, READY};
use crate::names::Namespace;
use crate::ns_driver::NamespaceDriver;
use crate::tracer::Abort;
use crate::{RunOptions, EXIT_SETUP, EXIT_TRANSIENT};
use locus_mount::MountOptions;
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A run's request to its agent: hand me the namespace.
const JOIN: u8 = b'J';
/// The agent's answers: the namespace's descriptors (mount, then user if any); the run
/// is stopped (status, message).
const NAMESPACE: u8 = b'N';
const STOPPED: u8 = b'S';

/// Runs `argv` in the warm namespace for `options`, starting its agent if there is
/// none; None where this cannot be (no private directory for the socket, or a
/// process that can no longer fork safely), and the run should go on its own.
pub(crate) fn run(argv: &[CString], options: &RunOptions, mount: &MountOptions) -> Option<Result<i32, NotRun>> {
    let dir = private_dir().map_err(|why| tracing::debug!("locus run not kept warm: {why}")).ok()?;
    let key = key(options, mount);
    let socket = dir.join(format!("{key}.sock"));
    let mut last = String::new();
    for _ in 0..3 {
        let joined = match connect(&socket) {
            Ok(conn) => join(conn),
            Err(_) => {
                let _lock = Lock::take(&dir.join(format!("{key}.lock")))?;
                match connect(&socket) {
                    Ok(conn) => join(conn),
                    Err(_) => match start_agent(&dir, &key, options, mount)? {
                        Ok(()) => connect(&socket).map_err(|e| format!("connect to the agent: {e}")).and_then(join),
                        Err(stop) => return Some(Err(stop)),
                    },
                }
            }
        };
        match joined {
            Ok((conn, mnt, user)) => return Some(run_joined(argv, conn, &mnt, user.as_ref())),
            // The agent was ending as this run came: ask again (a new one starts).
            Err(why) => last = why,
        }
    }
    Some(Err(NotRun::Unavailable(last)))
}

/// The program forked into the joined namespace, waited for with every process it left;
/// a message from the agent (or its end) stops them.
fn run_joined(argv: &[CString], conn: OwnedFd, mnt: &OwnedFd, user: Option<&OwnedFd>) -> Result<i32, NotRun> {
    let cwd = std::env::current_dir().ok().and_then(|d| CString::new(d.as_os_str().as_bytes()).ok());
    let cwd = cwd.unwrap_or_else(|| c"/".to_owned());
    // SAFETY: orphans of the program become this process's children, to be waited for.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let child = fuse_path::enter(user, mnt, argv, &cwd).map_err(NotRun::Unavailable)?;
    fuse_path::ignore_interrupts();
    let finished = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (conn, finished) = (conn.try_clone().map_err(|e| NotRun::Unavailable(e.to_string()))?, finished.clone());
        std::thread::spawn(move || {
            let me = std::process::id() as i32;
            let mut buf = vec![0u8; 4096];
            let n = loop {
                // SAFETY: a read into our own buffer.
                let n = unsafe { libc::recv(conn.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break n.max(0) as usize;
                }
            };
            if finished.load(Ordering::SeqCst) {
                return None;
            }
            let abort = match &buf[..n] {
                [STOPPED, status, message @ ..] => {
                    Abort { status: i32::from(*status), message: String::from_utf8_lossy(message).into_owned() }
                }
                _ => Abort {
                    status: EXIT_TRANSIENT,
                    message: "the agent serving the namespace ended; the program was stopped and may be run again"
                        .into(),
                },
            };
            fuse_path::kill_descendants(me);
            Some(abort)
        })
    };
    let status = fuse_path::reap_all(child);
    finished.store(true, Ordering::SeqCst);
    // SAFETY: shutting down our own socket wakes the watcher.
    unsafe { libc::shutdown(conn.as_raw_fd(), libc::SHUT_RDWR) };
    match watcher.join().ok().flatten() {
        Some(abort) => Err(NotRun::Stopped(abort)),
        None => Ok(status),
    }
}

/// The directory for agents' sockets, made if missing: this user's alone (owned, mode
/// 0700, not a link), or why not.
fn private_dir() -> Result<PathBuf, String> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && std::fs::metadata(d).is_ok_and(|m| m.uid() == uid));
    let dir = match runtime {
        Some(d) => d.join("locus"),
        None => std::env::temp_dir().join(format!("locus-run-{uid}")),
    };
    match std::fs::create_dir(&dir) {
        Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", dir.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!("{}: not a directory of this user's alone", dir.display()));
    }
    Ok(dir)
}

/// The agent's name for these options: a hash of all that shapes the namespace.
fn key(options: &RunOptions, mount: &MountOptions) -> String {
    let mut h = Sha256::new();
    // SAFETY: geteuid cannot fail.
    h.update(unsafe { libc::geteuid() }.to_le_bytes());
    for (logical, url) in &options.mounts {
        h.update(format!("mount {logical} {url}\n"));
    }
    h.update(format!(
        "{:?} {:?} {:?} {:?} {} {} {:?}\n",
        options.retry,
        mount.attr_timeout,
        mount.consistency,
        mount.cache_dir,
        mount.cache_limit,
        mount.max_promises,
        options.keep_warm
    ));
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.as_bytes();
            (k.starts_with(b"LOCUS_") && !k.starts_with(b"LOCUS_LOG")) || k == b"HOME"
        })
        .collect();
    env.sort();
    for (k, v) in env {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    // Another build of `locus` starts an agent of its own.
    if let Ok(exe) = std::env::current_exe() {
        h.update(exe.as_os_str().as_bytes());
        if let Ok(m) = std::fs::metadata(&exe) {
            h.update(format!(" {} {} {}", m.len(), m.mtime(), m.mtime_nsec()));
        }
    }
    h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// An exclusive lock on a file, so that one run at a time starts an agent.
struct Lock {
    _held: std::fs::File,
}

impl Lock {
    fn take(path: &Path) -> Option<Lock> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).ok()?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).ok()?;
        Some(Lock { _held: file })
    }
}

fn seqpacket() -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).map_err(std::io::Error::from)
}

fn connect(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let addr = nix::sys::socket::UnixAddr::new(path).map_err(std::io::Error::from)?;
    nix::sys::socket::connect(fd.as_raw_fd(), &addr).map_err(std::io::Error::from)?;
    Ok(fd)
}

/// Asks the agent on `conn` for the namespace: its mount and user namespaces.
fn join(conn: OwnedFd) -> Result<(OwnedFd, OwnedFd, Option<OwnedFd>), String> {
    use nix::sys::socket::{recvmsg, send, ControlMessageOwned, MsgFlags};
    send(conn.as_raw_fd(), &[JOIN], MsgFlags::MSG_NOSIGNAL).map_err(|e| format!("ask the agent: {e}"))?;
    let mut buf = [0u8; 4096];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(conn.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| format!("hear the agent: {e}"))?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: descriptors just received, owned by nobody else.
            fds.extend(received.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
        }
    }
    let len = msg.bytes;
    match (&buf[..len], fds.len()) {
        ([NAMESPACE], 1 | 2) => {
            let mut fds = fds.into_iter();
            let mnt = fds.next().expect("one");
            Ok((conn, mnt, fds.next()))
        }
        ([STOPPED, _, message @ ..], _) => Err(String::from_utf8_lossy(message).into_owned()),
        _ => Err("the agent ended".into()),
    }
}

/// Starts the agent for `key` (this process must have one thread: it forks and goes on
/// in the child); answers once it listens, or what stops the run. None where this
/// process cannot fork safely.
fn start_agent(dir: &Path, key: &str, options: &RunOptions, mount: &MountOptions) -> Option<Result<(), NotRun>> {
    if std::fs::read_dir("/proc/self/task").map_or(0, |t| t.count()) != 1 {
        tracing::debug!("locus run not kept warm: more than one thread");
        return None;
    }
    // A socket, not a pipe: the namespace's holder, forked by the agent, keeps a copy
    // of the agent's end open, so the answer is one message rather than all until EOF.
    let (read_end, write_end) = {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).ok()?
    };
    // SAFETY: one thread (checked above): the child may go on as this process would.
    match unsafe { libc::fork() } {
        -1 => return None,
        0 => {
            drop(read_end);
            // SAFETY: as above; the agent is the grandchild, so nobody waits for it here.
            unsafe {
                libc::setsid();
                if libc::fork() != 0 {
                    libc::_exit(0);
                }
            }
            agent(dir, key, options, mount, write_end);
        }
        intermediate => {
            drop(write_end);
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(intermediate, &mut status, 0) };
        }
    }
    let mut said = vec![0u8; 4096];
    let n = loop {
        // SAFETY: a read into our own buffer.
        let n = unsafe { libc::recv(read_end.as_raw_fd(), said.as_mut_ptr().cast(), said.len(), 0) };
        if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break n.max(0) as usize;
        }
    };
    said.truncate(n);
    let text = String::from_utf8_lossy(said.get(1..).unwrap_or_default()).into_owned();
    Some(match said.first() {
        Some(b'O') => Ok(()),
        Some(b'S') => Err(NotRun::Stopped(Abort { status: EXIT_SETUP, message: text })),
        Some(_) => Err(NotRun::Unavailable(text)),
        None => Err(NotRun::Unavailable("the agent ended as it started".into())),
    })
}

/// The agent's life: makes the namespace, says so on `ready` ('O'; 'U' and why where no
/// namespace can be made here, 'S' and why for a bad mount), then serves runs until none
/// has come for `keep_warm`. Never returns.
fn agent(dir: &Path, key: &str, options: &RunOptions, mount: &MountOptions, ready: OwnedFd) -> ! {
    let log = dir.join(format!("{key}.log"));
    quiet_descriptors(ready.as_raw_fd(), &log);
    let say = |tag: u8, text: &str| {
        let mut message = vec![tag];
        message.extend_from_slice(text.as_bytes());
        message.truncate(4096);
        let _ = nix::sys::socket::send(ready.as_raw_fd(), &message, nix::sys::socket::MsgFlags::MSG_NOSIGNAL);
    };
    let plan = match fuse_path::plan(&options.mounts) {
        Ok(plan) => plan,
        Err(why) => {
            say(b'U', &why);
            std::process::exit(0)
        }
    };
    let ns = match Namespace::new(&options.mounts, options.retry) {
        Ok(ns) => ns,
        Err(why) => {
            say(b'S', &why);
            drop(plan);
            std::process::exit(0)
        }
    };
    let (wake_read, wake_write) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(pipe) => pipe,
        Err(e) => {
            say(b'U', &format!("pipe: {e}"));
            drop(plan);
            std::process::exit(0)
        }
    };
    let made = match fuse_path::make(&plan, None) {
        Ok(made) => made,
        Err(why) => {
            say(b'U', &why);
            drop(plan);
            std::process::exit(0)
        }
    };
    let abort: Arc<Mutex<Option<Abort>>> = Arc::new(Mutex::new(None));
    // The programs of every run connected are stopped before the kernel hears the
    // error, so that none goes on past it (as on a run's own); then the runs are told.
    let connected: Arc<Mutex<Vec<i32>>> = Arc::default();
    let on_abort = {
        let connected = connected.clone();
        Box::new(move || {
            for &run in connected.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                fuse_path::kill_descendants(run);
            }
            let _ = rustix::io::write(&wake_write, b"!");
        })
    };
    let driver = NamespaceDriver::new(ns, abort.clone(), on_abort);
    let root = PathBuf::from(format!("/proc/{}/root", made.child));
    let done = fuse_path::serve(made.fuse, driver, mount.clone(), Some(root));
    let (whole, _) = fuse_path::receive(&made.socket);
    let holder = made.child;
    let namespaces = (|| -> std::io::Result<Vec<OwnedFd>> {
        if whole.first() != Some(&READY) {
            return Err(std::io::Error::other(fuse_path::failure(&whole)));
        }
        let mut fds = vec![std::fs::File::open(format!("/proc/{holder}/ns/mnt"))?.into()];
        if !plan.as_root() {
            fds.push(std::fs::File::open(format!("/proc/{holder}/ns/user"))?.into());
        }
        Ok(fds)
    })();
    let namespaces = match namespaces {
        Ok(fds) => fds,
        Err(e) => {
            say(b'U', &e.to_string());
            end(holder, plan, &done)
        }
    };
    let socket = dir.join(format!("{key}.sock"));
    let listener = match listen(&socket, dir) {
        Ok(l) => l,
        Err(e) => {
            say(b'U', &format!("{}: {e}", socket.display()));
            end(holder, plan, &done)
        }
    };
    say(b'O', "");
    drop(ready);
    let runs = Runs { connected, abort, done };
    serve_runs(&listener, &socket, &namespaces, wake_read, &runs, options.keep_warm);
    drop(namespaces);
    end(holder, plan, &runs.done)
}

/// Ends the agent: the holder goes, the namespace with it, and the session ends once
/// the kernel lets go of the mount (stores left to do are done then).
fn end(holder: i32, plan: Plan, done: &std::sync::mpsc::Receiver<()>) -> ! {
    // SAFETY: our own child.
    unsafe {
        libc::kill(holder, libc::SIGKILL);
        libc::waitpid(holder, std::ptr::null_mut(), 0);
    }
    let _ = done.recv_timeout(Duration::from_secs(5));
    // Its scratch directory goes (exit runs no destructors).
    drop(plan);
    std::process::exit(0)
}

/// The agent lets go of its parent's terminal and descriptors: stdin from /dev/null,
/// stdout and stderr to its log, every other descriptor but `keep` closed.
fn quiet_descriptors(keep: RawFd, log: &Path) {
    let open = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(log);
    let null = std::fs::File::open("/dev/null");
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    // SAFETY: descriptors of this process, the agent's own now.
    unsafe {
        if let Ok(null) = &null {
            libc::dup2(null.as_raw_fd(), 0);
        }
        if let Ok(log) = &open {
            libc::dup2(log.as_raw_fd(), 1);
            libc::dup2(log.as_raw_fd(), 2);
        }
        for fd in fds {
            let ours = [keep, open.as_ref().map_or(-1, |f| f.as_raw_fd()), null.as_ref().map_or(-1, |f| f.as_raw_fd())];
            if fd > 2 && !ours.contains(&fd) {
                libc::close(fd);
            }
        }
    }
}

/// Listens at `path`: bound under a name of its own, then renamed into place, so that
/// no run ever connects to a half-made socket.
fn listen(path: &Path, dir: &Path) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{bind, listen, Backlog, UnixAddr};
    let fd = seqpacket()?;
    let temporary =
        dir.join(format!(".{}.{}", std::process::id(), path.file_name().unwrap_or_default().to_string_lossy()));
    let _ = std::fs::remove_file(&temporary);
    bind(fd.as_raw_fd(), &UnixAddr::new(&temporary).map_err(std::io::Error::from)?).map_err(std::io::Error::from)?;
    listen(&fd, Backlog::new(64).map_err(std::io::Error::from)?).map_err(std::io::Error::from)?;
    std::fs::rename(&temporary, path)?;
    Ok(fd)
}

/// Hands the namespace to runs of this user as they connect, until none has been
/// connected for `keep_warm`, or the run must stop (a server gone past the retry
/// window, the mount gone): then every run still connected is told, and the agent
/// goes once they have hung up.
fn serve_runs(
    listener: &OwnedFd,
    socket: &Path,
    namespaces: &[OwnedFd],
    wake: OwnedFd,
    shared: &Runs,
    keep_warm: Duration,
) {
    let Runs { connected, abort, done } = shared;
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let socket_id = std::fs::metadata(socket).map(|m| (m.dev(), m.ino())).ok();
    let mut runs: Vec<OwnedFd> = Vec::new();
    let mut idle_since = Instant::now();
    let mut stopping: Option<Vec<u8>> = None;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    loop {
        if stopping.is_none() {
            let ended = !matches!(done.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty));
            let aborted = abort.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if ended || aborted.is_some() {
                let (status, message) = match aborted {
                    Some(a) => (a.status, a.message),
                    None => (EXIT_TRANSIENT, "the namespace's file system ended; the program was stopped".into()),
                };
                let mut said = vec![STOPPED, status as u8];
                said.extend_from_slice(message.as_bytes());
                said.truncate(4096);
                forget_socket(socket, socket_id);
                for run in &runs {
                    let _ = nix::sys::socket::send(run.as_raw_fd(), &said, nix::sys::socket::MsgFlags::MSG_NOSIGNAL);
                }
                stopping = Some(said);
            }
        }
        if runs.is_empty() && (stopping.is_some() || idle_since.elapsed() >= keep_warm) {
            forget_socket(socket, socket_id);
            return;
        }
        let mut polled: Vec<libc::pollfd> = [listener.as_raw_fd(), wake.as_raw_fd()]
            .into_iter()
            .chain(runs.iter().map(|r| r.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let timeout = if runs.is_empty() { keep_warm.saturating_sub(idle_since.elapsed()).as_millis() } else { 1000 };
        // SAFETY: a poll over our own descriptors; a second at most, to look at the session.
        unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as _, timeout.min(1000) as i32) };
        if polled[1].revents != 0 {
            let mut sink = [0u8; 64];
            let _ = rustix::io::read(&wake, &mut sink);
        }
        // Runs that spoke or hung up, last first so the indices stay right.
        for i in (0..runs.len()).rev() {
            let revents = polled[i + 2].revents;
            if revents == 0 {
                continue;
            }
            let mut byte = [0u8; 1];
            // SAFETY: a read into our own buffer.
            let n = unsafe { libc::recv(runs[i].as_raw_fd(), byte.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT) };
            if n == 1 && byte[0] == JOIN {
                let handed = match &stopping {
                    Some(said) => {
                        nix::sys::socket::send(runs[i].as_raw_fd(), said, nix::sys::socket::MsgFlags::MSG_NOSIGNAL)
                            .map(drop)
                    }
                    None => send_namespace(&runs[i], namespaces),
                };
                if handed.is_ok() {
                    continue;
                }
            } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
                continue;
            }
            runs.remove(i);
            connected.lock().unwrap_or_else(|e| e.into_inner()).remove(i);
            if runs.is_empty() {
                idle_since = Instant::now();
            }
        }
        if polled[0].revents != 0 {
            if let Ok(run) = nix::sys::socket::accept4(listener.as_raw_fd(), nix::sys::socket::SockFlag::SOCK_CLOEXEC) {
                // SAFETY: a descriptor just accepted, owned by nobody else.
                let run = unsafe { OwnedFd::from_raw_fd(run) };
                // Only this user's runs, though the directory already keeps others out.
                match getsockopt(&run, PeerCredentials) {
                    Ok(c) if c.uid() == uid => {
                        connected.lock().unwrap_or_else(|e| e.into_inner()).push(c.pid());
                        runs.push(run);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// What the agent's loop shares with the file system it serves.
struct Runs {
    /// The process of each run connected (each the parent of its program's processes),
    /// in the order of the loop's connections.
    connected: Arc<Mutex<Vec<i32>>>,
    /// Why the runs must stop, once that is so.
    abort: Arc<Mutex<Option<Abort>>>,
    /// Hears when the file-system session ends.
    done: std::sync::mpsc::Receiver<()>,
}

/// Sends the namespace's descriptors to a run.
fn send_namespace(run: &OwnedFd, namespaces: &[OwnedFd]) -> nix::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds: Vec<RawFd> = namespaces.iter().map(|f| f.as_fd().as_raw_fd()).collect();
    let iov = [std::io::IoSlice::new(&[NAMESPACE])];
    sendmsg::<()>(run.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::MSG_NOSIGNAL, None).map(drop)
}

/// Removes the agent's socket if it is still this agent's (no new run may come).
fn forget_socket(path: &Path, id: Option<(u64, u64)>) {
    if id.is_some() && std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok() == id {
        let _ = std::fs::remove_file(path);
    }
}
