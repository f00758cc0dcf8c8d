//! `locus run` warm across runs: the FUSE path's namespace, its file system and its
//! caches outlive the program, so that the next `locus run` of the same user with the
//! same mounts and options finds them as the last one left them.
//!
//! The first run starts a per-user *agent* (a process of its own, in its own session):
//! it makes the private namespace as [`crate::fuse_path`] does, with a child that only
//! holds it, serves the FUSE file system there, and listens on a Unix socket in a
//! directory only this user may enter (`$XDG_RUNTIME_DIR/locus` or
//! `$TMPDIR/locus-run-UID`). Each `locus run`, the first included, connects, is handed the
//! namespace (its descriptors, checked to come to this user only), and forks the program
//! into it; it stays the program's parent, waits for it and for every process it left,
//! and then hangs up. The kernel's names, attributes, listings and pages, and the
//! mount's cache and callback promises, live in the agent: a second `find` under a new
//! `locus run` costs what a second `find` on `locus mount` costs.
//!
//! The socket's name is a hash of everything that shapes what the programs would see:
//! the user, its groups, its namespaces and control group, the mounts, the caching
//! options, the `LOCUS_*` environment and `HOME` (where credentials come from) and the
//! credentials file and CA they name, and the `locus` binary itself. Runs that differ in
//! any of them get agents of their own.
//!
//! When its program tree has ended, a run waits for the agent to store what the programs
//! wrote and to hear the server's answers to what was sent without waiting, as a run on
//! its own does before it ends. The agent ends once no run has been connected for
//! `--keep-warm` seconds. A stopping error (a server unreachable past the retry window,
//! a request no driver can satisfy) stops every program in the namespace (each run ends
//! with its status, as on its own) and ends the agent; an agent that dies stops the
//! programs in its namespace with 75, and the next run starts a new one.
//!
//! The namespace's copy of `/` is made when the agent starts: entries made in `/`
//! later, and mounts made on this machine later, show in the next agent only (a run
//! whose directory is not there goes on its own). A run under another
//! (`LOCUS_RUN_INSIDE` set) goes on its own too: the outer run waits for every process
//! beneath it, an agent included.

mod agent;

use crate::fuse_path::{self, NotRun};
use crate::tracer::Abort;
use crate::{RunOptions, EXIT_SETUP, EXIT_TRANSIENT};
use locus_mount::MountOptions;
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

/// Set in the environment of every program `locus run` starts: a run inside another
/// goes on its own (the outer run waits for every process beneath it).
pub const INSIDE: &str = "LOCUS_RUN_INSIDE";

/// A run's requests to its agent: hand me the namespace; my programs have ended.
const JOIN: u8 = b'J';
const DONE: u8 = b'D';
/// The agent's answers to a run: the namespace's descriptors (mount, then user if
/// any); what the programs left is stored (answers `DONE`); the run is stopped (then
/// its status and message).
const NAMESPACE: u8 = b'N';
const SETTLED: u8 = b'D';
const STOPPED: u8 = b'S';
/// What a starting agent tells the run that started it: it listens; no namespace can
/// be made here (the run traces instead, or fails with `--interpose fuse`); a mount
/// is bad (exit 70); it cannot be kept warm (the run goes on its own).
const LISTENING: u8 = b'L';
const NO_NAMESPACE: u8 = b'U';
const BAD_MOUNT: u8 = b'B';
const NOT_WARM: u8 = b'W';

/// The longest message: a tag, maybe a status, and text.
const MESSAGE_MAX: usize = 4096;

/// `tag` then `text`, cut to [`MESSAGE_MAX`].
fn message(tag: &[u8], text: &str) -> Vec<u8> {
    let mut m = tag.to_vec();
    m.extend_from_slice(text.as_bytes());
    m.truncate(MESSAGE_MAX);
    m
}

/// Sends one message on a seqpacket socket (ignoring a peer gone).
fn send(fd: &OwnedFd, bytes: &[u8]) -> nix::Result<()> {
    nix::sys::socket::send(fd.as_raw_fd(), bytes, nix::sys::socket::MsgFlags::MSG_NOSIGNAL).map(drop)
}

/// One message from a seqpacket socket; empty at its end (or on an error).
fn receive(fd: &OwnedFd) -> Vec<u8> {
    let mut buf = vec![0u8; MESSAGE_MAX];
    loop {
        // SAFETY: a read into our own buffer.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            buf.truncate(n as usize);
            return buf;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Vec::new();
        }
    }
}

/// Runs `argv` in the warm namespace for `options`, starting its agent if there is
/// none; None where the run should go on its own (no private
/// directory for the socket, a process that can no longer fork safely, an agent that
/// cannot be reached or joined, a working directory the namespace does not have).
pub(crate) fn run(argv: &[CString], options: &RunOptions, mount: &MountOptions) -> Option<Result<i32, NotRun>> {
    let not_warm = |why: &dyn std::fmt::Display| tracing::debug!("locus run not kept warm: {why}");
    let dir = private_dir().map_err(|why| not_warm(&why)).ok()?;
    let key = key(options, mount);
    let socket = dir.join(format!("{key}.sock"));
    for _ in 0..3 {
        let joined = match connect(&socket) {
            Ok(conn) => join(conn),
            Err(_) => {
                let _lock = Lock::take(&dir.join(format!("{key}.lock"))).map_err(|e| not_warm(&e)).ok()?;
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
            Ok(joined) => return run_joined(argv, joined),
            // The agent was ending as this run came: ask again (a new one starts).
            Err(why) => not_warm(&why),
        }
    }
    None
}

/// The pid of the program a run forked, for its signal handler.
static PROGRAM: AtomicI32 = AtomicI32::new(0);

/// Passes SIGTERM and SIGHUP sent to the run on to its program, as a shell would.
extern "C" fn pass_on(signal: libc::c_int) {
    let program = PROGRAM.load(Ordering::SeqCst);
    if program > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(program, signal) };
    }
}

/// What a run's connection to its agent said while the run waited.
enum Heard {
    /// The runs must stop (the programs were stopped).
    Stopped(Abort),
    /// What the programs left is stored.
    Settled,
    /// The agent went: while the programs ran (they were stopped), or after.
    Ended { while_running: bool },
}

/// The program forked into the joined namespace, waited for with every process it left,
/// then the agent's stores; a message from the agent (or its end) stops them. None if
/// the program could not be started there.
fn run_joined(argv: &[CString], (conn, mnt, user): Joined) -> Option<Result<i32, NotRun>> {
    let cwd = std::env::current_dir().ok().and_then(|d| CString::new(d.as_os_str().as_bytes()).ok())?;
    // SAFETY: orphans of the program become this process's children, to be waited for.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let child = fuse_path::enter(user.as_ref(), &mnt, argv, &cwd)
        .map_err(|why| tracing::debug!("locus run not kept warm: {why}"))
        .ok()?;
    PROGRAM.store(child, Ordering::SeqCst);
    fuse_path::ignore_interrupts();
    // SAFETY: installing a handler that only calls kill.
    unsafe {
        libc::signal(libc::SIGTERM, pass_on as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, pass_on as *const () as libc::sighandler_t);
    }
    let finished = Arc::new(AtomicBool::new(false));
    let watcher = {
        let Ok(conn) = conn.try_clone() else {
            let status = fuse_path::reap_all(child);
            return Some(Ok(status));
        };
        let finished = finished.clone();
        std::thread::spawn(move || {
            let said = receive(&conn);
            let heard = match said.as_slice() {
                [SETTLED] => Heard::Settled,
                [STOPPED, status, text @ ..] => {
                    Heard::Stopped(Abort { status: i32::from(*status), message: String::from_utf8_lossy(text).into() })
                }
                _ => Heard::Ended { while_running: !finished.load(Ordering::SeqCst) },
            };
            if matches!(heard, Heard::Stopped(_) | Heard::Ended { while_running: true }) {
                fuse_path::kill_descendants(std::process::id() as i32);
            }
            heard
        })
    };
    let status = fuse_path::reap_all(child);
    finished.store(true, Ordering::SeqCst);
    // What the programs wrote is stored, and changes sent behind answered, before the
    // run ends (the agent answers `SETTLED`).
    let _ = send(&conn, &[DONE]);
    Some(match watcher.join().unwrap_or(Heard::Ended { while_running: false }) {
        Heard::Stopped(abort) => Err(NotRun::Stopped(abort)),
        Heard::Settled => Ok(status),
        Heard::Ended { while_running: true } => Err(NotRun::Stopped(Abort {
            status: EXIT_TRANSIENT,
            message: "the agent serving the namespace ended; the program was stopped and may be run again".into(),
        })),
        Heard::Ended { while_running: false } => {
            eprintln!("locus run: the agent ended before it said that what the program wrote was stored");
            Ok(status)
        }
    })
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
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!("{}: not a directory of this user's alone", dir.display()));
    }
    // A socket's path has room for 107 bytes; the longest here is the temporary name.
    if dir.as_os_str().len() + 48 > 107 {
        return Err(format!("{}: too long a path for a socket", dir.display()));
    }
    Ok(dir)
}

/// The agent's name for these options: a hash of all that shapes the namespace and the
/// rights its programs act with.
fn key(options: &RunOptions, mount: &MountOptions) -> String {
    let mut h = Sha256::new();
    // SAFETY: these cannot fail; getgroups is given room for every group.
    let groups = unsafe {
        let mut groups = vec![0 as libc::gid_t; 256];
        let n = libc::getgroups(groups.len() as i32, groups.as_mut_ptr());
        groups.truncate(n.max(0) as usize);
        (libc::geteuid(), libc::getegid(), groups)
    };
    h.update(format!("{groups:?}\n"));
    // The namespaces and control group it starts in: an agent started in a sandbox (or
    // a batch job's control group) serves runs from there only.
    for ns in ["mnt", "net", "user", "pid", "ipc", "uts", "cgroup"] {
        let id = std::fs::metadata(format!("/proc/self/ns/{ns}")).map(|m| m.ino()).unwrap_or(0);
        h.update(format!("{ns} {id}\n"));
    }
    h.update(std::fs::read("/proc/self/cgroup").unwrap_or_default());
    for (logical, url) in &options.mounts {
        h.update(format!("mount {logical} {url}\n"));
    }
    h.update(format!(
        "{:?} {:?} {:?} {:?} {} {} {:?} {:?}\n",
        options.retry,
        mount.attr_timeout,
        mount.consistency,
        mount.cache_dir,
        mount.cache_limit,
        mount.max_promises,
        mount.transport,
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
    // The credentials and CA the drivers would read, as they are now.
    let locus_home = std::env::var_os("LOCUS_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".locus")));
    if let Some(home) = locus_home {
        h.update(std::fs::read(home.join("credentials")).unwrap_or_default());
    }
    if let Some(ca) = std::env::var_os("LOCUS_TLS_CA") {
        h.update(std::fs::read(ca).unwrap_or_default());
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

/// Opens a file of the agent's directory for writing, never through a link.
fn open_private(path: &Path, truncate: bool) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(truncate)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// An exclusive lock on a file, so that one run at a time starts an agent.
struct Lock {
    _held: std::fs::File,
}

impl Lock {
    /// Waits for the lock on `path`.
    fn take(path: &Path) -> std::io::Result<Lock> {
        let file = open_private(path, false)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(Lock { _held: file })
    }
}

/// A new seqpacket Unix socket.
fn seqpacket() -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).map_err(std::io::Error::from)
}

/// Connects to the agent listening at `path`, if it is this user's.
fn connect(path: &Path) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let fd = seqpacket()?;
    let addr = nix::sys::socket::UnixAddr::new(path).map_err(std::io::Error::from)?;
    nix::sys::socket::connect(fd.as_raw_fd(), &addr).map_err(std::io::Error::from)?;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if !getsockopt(&fd, PeerCredentials).is_ok_and(|c| c.uid() == uid) {
        return Err(std::io::Error::other("the agent is not this user's"));
    }
    // An agent that does not answer (stopped, frozen) is given up on.
    let wait = nix::sys::time::TimeVal::new(30, 0);
    let _ = nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &wait);
    Ok(fd)
}

/// A run's connection to its agent, and the namespace's descriptors: mount, and user
/// where the namespace is in one.
type Joined = (OwnedFd, OwnedFd, Option<OwnedFd>);

/// Asks the agent on `conn` for the namespace.
fn join(conn: OwnedFd) -> Result<Joined, String> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    send(&conn, &[JOIN]).map_err(|e| format!("ask the agent: {e}"))?;
    let mut buf = [0u8; MESSAGE_MAX];
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
    // A timeout for the answer only: the run then waits for its agent as long as needed.
    let _ = nix::sys::socket::setsockopt(
        &conn,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(0, 0),
    );
    let len = msg.bytes;
    match (&buf[..len], fds.len()) {
        ([NAMESPACE], 1 | 2) => {
            let mut fds = fds.into_iter();
            let mnt = fds.next().expect("one");
            Ok((conn, mnt, fds.next()))
        }
        ([STOPPED, _, text @ ..], _) => Err(String::from_utf8_lossy(text).into_owned()),
        _ => Err("the agent ended".into()),
    }
}

/// Starts the agent for `key` (this process must have one thread: it forks and goes on
/// in the child); answers once it listens, or what stops the run. None where the run
/// should go on its own.
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
            agent::agent(dir, key, options, mount, write_end);
        }
        intermediate => {
            drop(write_end);
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(intermediate, std::ptr::null_mut(), 0) };
        }
    }
    let said = receive(&read_end);
    let text = String::from_utf8_lossy(said.get(1..).unwrap_or_default()).into_owned();
    match said.first() {
        Some(&LISTENING) => Some(Ok(())),
        Some(&BAD_MOUNT) => Some(Err(NotRun::Stopped(Abort { status: EXIT_SETUP, message: text }))),
        Some(&NO_NAMESPACE) => Some(Err(NotRun::Unavailable(text))),
        _ => {
            tracing::debug!("locus run not kept warm: the agent did not start: {text}");
            None
        }
    }
}
