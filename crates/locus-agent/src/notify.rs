//! The notification half of the agent: a supervisor thread that answers the program's
//! frequent file calls (see [`crate::tracer::notified_syscalls`]) through a seccomp
//! user-notification listener, without stopping the program under ptrace.
//!
//! The handler decides each call as it does for a ptrace stop. A call to let through
//! continues in the kernel untouched. A rewritten call is carried out here, on the
//! rewritten path, and its result handed back: an opened file is installed in the
//! program as a new descriptor (`SECCOMP_IOCTL_NOTIF_ADDFD`), a `stat` buffer or a link
//! target is written into the program's memory.

use crate::tracee::{lock, Aborted, Shared, Step, Tracee};
use nix::sys::signal::{kill, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::Pid;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

/// Asks the kernel to wake the supervisor, and the program after the answer, on the CPU
/// that is running (Linux 6.6 and later; older kernels ignore the request).
const SYNC_WAKE_UP: u64 = 1;

/// How much of a `readlink` buffer the agent fills.
const MAX_LINK: u64 = 64 * 1024;

/// The running supervisor thread.
pub(crate) struct Supervisor<'scope> {
    thread: ScopedJoinHandle<'scope, ()>,
    pthread: Arc<AtomicU64>,
    stopping: Arc<AtomicBool>,
}

/// What the program's call returns.
enum Reply {
    /// Run the call in the kernel as made.
    Continue,
    /// A result, or `-errno`.
    Value(i64),
    /// A new descriptor for the program (`cloexec`: with `FD_CLOEXEC`).
    Fd(OwnedFd, bool),
}

extern "C" fn interrupt(_: libc::c_int) {}

impl<'scope> Supervisor<'scope> {
    /// Starts answering the notifications of `listener` on a thread of `scope`.
    pub(crate) fn start<'env, 'h: 'scope>(
        scope: &'scope Scope<'scope, 'env>,
        listener: OwnedFd,
        handler: &'scope Shared<'h>,
        aborted: &'scope Aborted,
    ) -> Supervisor<'scope> {
        // The supervisor is stopped by a signal that interrupts its wait in the kernel.
        let action = SigAction::new(SigHandler::Handler(interrupt), SaFlags::empty(), SigSet::empty());
        // SAFETY: the handler does nothing.
        let _ = unsafe { nix::sys::signal::sigaction(Signal::SIGUSR1, &action) };
        // SAFETY: an ioctl on a descriptor we own, with a plain integer argument.
        let _ = unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS, SYNC_WAKE_UP) };
        let pthread = Arc::new(AtomicU64::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let (thread_id, stop) = (pthread.clone(), stopping.clone());
        let thread = scope.spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            thread_id.store(unsafe { libc::pthread_self() } as u64, Ordering::SeqCst);
            // A private umask, so that files created for the program get the program's.
            // SAFETY: unshare of this thread's file-system attributes only.
            let private_umask = unsafe { libc::unshare(libc::CLONE_FS) } == 0;
            serve(&listener, handler, aborted, &stop, private_umask)
        });
        Supervisor { thread, pthread, stopping }
    }

    /// Ends the supervisor (once the program tree has ended).
    pub(crate) fn stop(self) {
        self.stopping.store(true, Ordering::SeqCst);
        while !self.thread.is_finished() {
            let thread = self.pthread.load(Ordering::SeqCst);
            if thread != 0 {
                // SAFETY: the thread is alive (not finished) and joined only below.
                unsafe { libc::pthread_kill(thread as libc::pthread_t, libc::SIGUSR1) };
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = self.thread.join();
    }
}

fn serve(listener: &OwnedFd, handler: &Shared, aborted: &Aborted, stopping: &AtomicBool, private_umask: bool) {
    let fd = listener.as_raw_fd();
    while !stopping.load(Ordering::SeqCst) {
        // SAFETY: an all-zero seccomp_notif is valid, and RECV requires it zeroed.
        let mut request: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: RECV fills the struct it is given.
        if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut request) } < 0 {
            match nix::errno::Errno::last() {
                nix::errno::Errno::EINTR | nix::errno::Errno::ENOENT => continue,
                _ => return,
            }
        }
        let t = Tracee { tid: Pid::from_raw(request.pid as i32) };
        let nr = request.data.nr as i64;
        let args = request.data.args;
        let step = lock(handler).syscall(&t, nr, args);
        let reply = match step {
            Ok(Step::Continue) => Reply::Continue,
            Ok(Step::Return(value)) => Reply::Value(value),
            Ok(Step::Rewrite(paths)) => carry_out(&t, nr, args, paths, private_umask),
            Err(abort) => {
                // The ptrace loop ends the run when it sees this process end.
                *aborted.lock().unwrap_or_else(|p| p.into_inner()) = Some(abort);
                let _ = kill(t.tid, Signal::SIGKILL);
                continue;
            }
        };
        answer(fd, request.id, reply);
    }
}

fn answer(fd: i32, id: u64, reply: Reply) {
    let mut response = libc::seccomp_notif_resp { id, val: 0, error: 0, flags: 0 };
    match reply {
        Reply::Continue => response.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        Reply::Value(v) if v < 0 => response.error = v as i32,
        Reply::Value(v) => response.val = v,
        Reply::Fd(file, cloexec) => {
            let mut add = libc::seccomp_notif_addfd {
                id,
                flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                srcfd: file.as_raw_fd() as u32,
                newfd: 0,
                newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
            };
            // SAFETY: ADDFD reads the struct it is given. With FLAG_SEND the descriptor
            // is installed and the call answered with its number in one step.
            let r = unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &mut add) };
            if r >= 0 {
                return;
            }
            match nix::errno::Errno::last() {
                nix::errno::Errno::EINVAL => {
                    // A kernel before 5.14: install, then answer with the number.
                    add.flags = 0;
                    // SAFETY: as above.
                    let r = unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &mut add) };
                    if r >= 0 {
                        response.val = r as i64;
                    } else {
                        response.error = -(nix::errno::Errno::last() as i32);
                    }
                }
                nix::errno::Errno::ENOENT => return, // the program is gone
                e => response.error = -(e as i32),
            }
        }
    }
    // SAFETY: SEND reads the struct it is given.
    unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut response) };
}

/// Makes the call `nr` here, with the rewritten `paths` (absolute, so the program's
/// directory descriptor does not matter) and buffers of our own, and passes the result
/// back to the program.
#[allow(non_upper_case_globals)]
fn carry_out(t: &Tracee, nr: i64, a: [u64; 6], paths: Vec<(usize, String)>, private_umask: bool) -> Reply {
    use libc::*;
    let Ok(paths) = paths.into_iter().map(|(i, p)| CString::new(p).map(|c| (i, c))).collect::<Result<Vec<_>, _>>()
    else {
        return Reply::Value(-EINVAL as i64);
    };
    let mut args = a;
    for (index, path) in &paths {
        args[*index] = path.as_ptr() as u64;
        if *index == 1 {
            args[0] = AT_FDCWD as i64 as u64; // the *at calls: the path follows its directory
        }
    }
    // Where the call writes its answer, and how much room it has.
    let out = match nr {
        SYS_stat | SYS_lstat => Some((1, std::mem::size_of::<stat>() as u64)),
        SYS_newfstatat => Some((2, std::mem::size_of::<stat>() as u64)),
        SYS_statx => Some((4, std::mem::size_of::<statx>() as u64)),
        SYS_readlink => Some((1, a[2].min(MAX_LINK))),
        SYS_readlinkat => Some((2, a[3].min(MAX_LINK))),
        _ => None,
    };
    let mut buffer = vec![0u8; out.map(|(_, len)| len as usize).unwrap_or(0)];
    if let Some((index, _)) = out {
        args[index] = buffer.as_mut_ptr() as u64;
    }
    // Opens: our copy of the descriptor must not leak into anything the agent starts;
    // the program's copy gets the program's close-on-exec flag.
    let mut how: Vec<u8>;
    let (nr, flags) = match nr {
        SYS_open => {
            args[1] |= O_CLOEXEC as u64;
            (nr, a[1])
        }
        SYS_openat => {
            args[2] |= O_CLOEXEC as u64;
            (nr, a[2])
        }
        SYS_creat => {
            let flags = (O_CREAT | O_WRONLY | O_TRUNC) as u64;
            args = [AT_FDCWD as i64 as u64, args[0], flags | O_CLOEXEC as u64, a[1], 0, 0];
            (SYS_openat, flags)
        }
        SYS_openat2 => {
            let Some(bytes) = t.read(a[2], a[3].clamp(24, 256) as usize) else { return Reply::Value(-EFAULT as i64) };
            how = bytes;
            let flags = u64::from_ne_bytes(how[..8].try_into().expect("8 bytes"));
            how[..8].copy_from_slice(&(flags | O_CLOEXEC as u64).to_ne_bytes());
            args[2] = how.as_ptr() as u64;
            args[3] = how.len() as u64;
            (nr, flags)
        }
        _ => (nr, 0),
    };
    let opens = nr == SYS_open || nr == SYS_openat || nr == SYS_openat2;
    let umask_before = (opens && private_umask && flags & O_CREAT as u64 != 0)
        // SAFETY: this thread's own umask (see unshare in Supervisor::start).
        .then(|| unsafe { umask(t.umask() as mode_t) });
    // SAFETY: every pointer argument points at memory owned here (paths, buffer, how)
    // or is the program's own value for a call that does not dereference it.
    let r = unsafe { syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    let errno = nix::errno::Errno::last() as i32;
    if let Some(old) = umask_before {
        // SAFETY: as above.
        unsafe { umask(old) };
    }
    if r < 0 {
        return Reply::Value(-(errno as i64));
    }
    if opens {
        // SAFETY: the call returned a new descriptor, owned by no one else.
        let file = unsafe { OwnedFd::from_raw_fd(r as i32) };
        return Reply::Fd(file, flags & O_CLOEXEC as u64 != 0);
    }
    if let Some((index, len)) = out {
        let written = if nr == SYS_readlink || nr == SYS_readlinkat { r as usize } else { len as usize };
        if !t.write(a[index], &buffer[..written]) {
            return Reply::Value(-EFAULT as i64);
        }
    }
    Reply::Value(r)
}
