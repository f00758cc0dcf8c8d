//! The agent's side of [`super`]: it makes the namespace, serves its file system, and
//! hands the namespace to runs until none has come for `--keep-warm`.

use super::{message, send, BAD_MOUNT, DONE, JOIN, LISTENING, NAMESPACE, NOT_WARM, NO_NAMESPACE, SETTLED, STOPPED};
use crate::fuse_path::{self, Plan, READY};
use crate::names::Namespace;
use crate::ns_driver::NamespaceDriver;
use crate::tracer::Abort;
use crate::{RunOptions, EXIT_TRANSIENT};
use locus_mount::{Control, MountOptions};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The agent's life: makes the namespace, says how that went on `ready`, then serves
/// runs until none has come for `keep_warm`. Never returns.
pub(super) fn agent(dir: &Path, key: &str, options: &RunOptions, mount: &MountOptions, ready: OwnedFd) -> ! {
    // Nothing of the first run's directory is kept busy.
    let _ = std::env::set_current_dir("/");
    let log = dir.join(format!("{key}.log"));
    quiet_descriptors(ready.as_raw_fd(), &log);
    let say = |tag: u8, text: &str| {
        let _ = send(&ready, &message(&[tag], text));
    };
    let plan = match fuse_path::plan(&options.mounts) {
        Ok(plan) => plan,
        Err(why) => {
            say(NO_NAMESPACE, &why);
            std::process::exit(0)
        }
    };
    let ns = match Namespace::new(&options.mounts, options.retry) {
        Ok(ns) => ns,
        Err(why) => {
            say(BAD_MOUNT, &why);
            drop(plan);
            std::process::exit(0)
        }
    };
    let (wake_read, wake_write) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(pipe) => pipe,
        Err(e) => {
            say(NOT_WARM, &format!("pipe: {e}"));
            drop(plan);
            std::process::exit(0)
        }
    };
    let made = match fuse_path::make(&plan, None) {
        Ok(made) => made,
        Err(why) => {
            say(NO_NAMESPACE, &why);
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
    let holder = made.child;
    let root = PathBuf::from(format!("/proc/{holder}/root"));
    let (done, control) = fuse_path::serve(made.fuse, driver, mount.clone(), Some(root.clone()));
    let whole = fuse_path::receive(&made.socket).0;
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
            say(NO_NAMESPACE, &e.to_string());
            end(holder, plan, &done, None)
        }
    };
    let socket = dir.join(format!("{key}.sock"));
    let listener = match listen(&socket, dir) {
        Ok(l) => l,
        Err(e) => {
            say(NOT_WARM, &format!("{}: {e}", socket.display()));
            end(holder, plan, &done, None)
        }
    };
    say(LISTENING, "");
    drop(ready);
    let shared = Shared { connected, abort, done, control, mounts: root.join("locus") };
    serve_runs(&listener, &socket, &namespaces, wake_read, &shared, options.keep_warm);
    drop(namespaces);
    end(holder, plan, &shared.done, Some(&log))
}

/// Ends the agent: the holder goes, the namespace with it, and the session ends once
/// the kernel lets go of the mount (stores left to do are done then); the log goes too
/// after a clean end.
fn end(holder: i32, plan: Plan, done: &std::sync::mpsc::Receiver<()>, log: Option<&Path>) -> ! {
    // SAFETY: our own child.
    unsafe {
        libc::kill(holder, libc::SIGKILL);
        libc::waitpid(holder, std::ptr::null_mut(), 0);
    }
    let _ = done.recv_timeout(Duration::from_secs(5));
    // Its scratch directory goes (exit runs no destructors).
    drop(plan);
    if let Some(log) = log {
        let _ = std::fs::remove_file(log);
    }
    std::process::exit(0)
}

/// The agent lets go of its parent's terminal and descriptors: stdin from /dev/null,
/// stdout and stderr to its log (or /dev/null), every other descriptor but `keep`
/// closed.
fn quiet_descriptors(keep: RawFd, log: &Path) {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null");
    let out = super::open_private(log, true).or_else(|_| std::fs::OpenOptions::new().write(true).open("/dev/null"));
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let ours = [keep, out.as_ref().map_or(-1, |f| f.as_raw_fd()), null.as_ref().map_or(-1, |f| f.as_raw_fd())];
    // SAFETY: descriptors of this process, the agent's own now.
    unsafe {
        if let Ok(null) = &null {
            libc::dup2(null.as_raw_fd(), 0);
        }
        if let Ok(out) = &out {
            libc::dup2(out.as_raw_fd(), 1);
            libc::dup2(out.as_raw_fd(), 2);
        }
        for fd in fds {
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
    let fd = super::seqpacket()?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temporary = dir.join(format!(".{}.{name}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    bind(fd.as_raw_fd(), &UnixAddr::new(&temporary).map_err(std::io::Error::from)?).map_err(std::io::Error::from)?;
    listen(&fd, Backlog::new(64).map_err(std::io::Error::from)?).map_err(std::io::Error::from)?;
    std::fs::rename(&temporary, path)?;
    Ok(fd)
}

/// What the agent's loop shares with the file system it serves.
struct Shared {
    /// The process of each run connected (each the parent of its program's processes),
    /// in the order of the loop's connections.
    connected: Arc<Mutex<Vec<i32>>>,
    /// Why the runs must stop, once that is so.
    abort: Arc<Mutex<Option<Abort>>>,
    /// Hears when the file-system session ends.
    done: std::sync::mpsc::Receiver<()>,
    /// Asks the file system to store everything at its next `statfs`.
    control: Arc<Control>,
    /// Where the namespace's `/locus` is seen from here, for that `statfs`.
    mounts: PathBuf,
}

/// Hands the namespace to runs of this user as they connect, until none has been
/// connected for `keep_warm`, or the runs must stop (a server gone past the retry
/// window, the mount gone): then every run still connected is told, and the agent
/// goes once they have hung up.
fn serve_runs(
    listener: &OwnedFd,
    socket: &Path,
    namespaces: &[OwnedFd],
    wake: OwnedFd,
    shared: &Shared,
    keep_warm: Duration,
) {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let socket_id = std::fs::metadata(socket).map(|m| (m.dev(), m.ino())).ok();
    let mut conns: Vec<OwnedFd> = Vec::new();
    let mut idle_since = Instant::now();
    let mut stopping: Option<Vec<u8>> = None;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    loop {
        if stopping.is_none() {
            let ended = !matches!(shared.done.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty));
            let aborted = shared.abort.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if ended || aborted.is_some() {
                let (status, text) = match aborted {
                    Some(a) => (a.status, a.message),
                    None => (EXIT_TRANSIENT, "the namespace's file system ended; the program was stopped".into()),
                };
                let said = message(&[STOPPED, status as u8], &text);
                forget_socket(socket, socket_id);
                for conn in &conns {
                    let _ = send(conn, &said);
                }
                stopping = Some(said);
            }
        }
        if conns.is_empty() && (stopping.is_some() || idle_since.elapsed() >= keep_warm) {
            forget_socket(socket, socket_id);
            return;
        }
        let mut polled: Vec<libc::pollfd> = [listener.as_raw_fd(), wake.as_raw_fd()]
            .into_iter()
            .chain(conns.iter().map(|c| c.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let timeout = if conns.is_empty() { keep_warm.saturating_sub(idle_since.elapsed()).as_millis() } else { 1000 };
        // SAFETY: a poll over our own descriptors; a second at most, to look at the session.
        unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as _, timeout.min(1000) as i32) };
        if polled[1].revents != 0 {
            let mut sink = [0u8; 64];
            let _ = rustix::io::read(&wake, &mut sink);
        }
        // Runs that spoke or hung up, last first so the indices stay right.
        for i in (0..conns.len()).rev() {
            if polled[i + 2].revents == 0 {
                continue;
            }
            let mut byte = [0u8; 1];
            // SAFETY: a read into our own buffer.
            let n = unsafe { libc::recv(conns[i].as_raw_fd(), byte.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
                continue;
            }
            let answered = match (n, byte[0], &stopping) {
                (1, _, Some(said)) => send(&conns[i], said),
                (1, JOIN, None) => send_namespace(&conns[i], namespaces),
                (1, DONE, None) => {
                    // The file system stores what is left and waits for the answers
                    // to what went behind, when asked at this `statfs`.
                    shared.control.request_store();
                    let _ = rustix::fs::statfs(&shared.mounts);
                    send(&conns[i], &[SETTLED])
                }
                _ => Err(nix::errno::Errno::EPIPE),
            };
            if answered.is_ok() {
                continue;
            }
            conns.remove(i);
            shared.connected.lock().unwrap_or_else(|e| e.into_inner()).remove(i);
            if conns.is_empty() {
                idle_since = Instant::now();
            }
        }
        if polled[0].revents != 0 {
            if let Ok(conn) = nix::sys::socket::accept4(listener.as_raw_fd(), nix::sys::socket::SockFlag::SOCK_CLOEXEC)
            {
                // SAFETY: a descriptor just accepted, owned by nobody else.
                let conn = unsafe { OwnedFd::from_raw_fd(conn) };
                // Only this user's runs, though the directory already keeps others out;
                // and only runs this agent can see (their trees are killed by pid).
                match getsockopt(&conn, PeerCredentials) {
                    Ok(c) if c.uid() == uid && c.pid() > 0 => {
                        shared.connected.lock().unwrap_or_else(|e| e.into_inner()).push(c.pid());
                        conns.push(conn);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Sends the namespace's descriptors to a run.
fn send_namespace(conn: &OwnedFd, namespaces: &[OwnedFd]) -> nix::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds: Vec<RawFd> = namespaces.iter().map(|f| f.as_fd().as_raw_fd()).collect();
    let iov = [std::io::IoSlice::new(&[NAMESPACE])];
    sendmsg::<()>(conn.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::MSG_NOSIGNAL, None).map(drop)
}

/// Removes the agent's socket if it is still this agent's (no new run may come).
fn forget_socket(path: &Path, id: Option<(u64, u64)>) {
    if id.is_some() && std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok() == id {
        let _ = std::fs::remove_file(path);
    }
}
