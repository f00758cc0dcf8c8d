//! The tracing half of the agent: starts the program under ptrace with a seccomp filter
//! that stops it only at file-related system calls, follows its whole process tree, and
//! gives each stop to a [`Handler`], which answers with a [`Step`].
//!
//! The frequent calls (open, stat, close, ...) do not stop under ptrace: they reach the
//! agent as seccomp user notifications (see [`crate::notify`]), which the kernel
//! delivers on the running CPU.
//!
//! Rewritten paths are written into a scratch mapping that the tracer creates in each
//! address space on first need, by making the stopped thread run `mmap` in place of its
//! system call and then run its own call again.

use nix::sys::ptrace::{self, Event, Options};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use crate::tracee::{lock, Aborted, Shared};
pub use crate::tracee::{Abort, Handler, Step, Tracee};

/// Size of the scratch mapping and of each slot in it (two paths fit in a slot).
const SCRATCH_SIZE: u64 = 1 << 20;
const SLOT_SIZE: u64 = 2 * libc::PATH_MAX as u64;

/// The scratch mapping of one address space; slots are used round-robin so threads
/// stopped at the same time do not overwrite each other's paths.
#[derive(Clone, Copy)]
struct Scratch {
    addr: u64,
    next: u64,
}

/// The system calls the agent answers through seccomp user notification: the frequent
/// ones (open, stat, access, readlink, close, ...), which it can carry out for the
/// program without touching its registers. The kernel wakes the agent and, on the way
/// back, the program on the CPU that is already running, which costs a few µs where a
/// ptrace stop costs tens (a stop often wakes the tracer on the other CPU).
/// (`open` and `openat` with `O_PATH` are traced instead: the kernel cannot pass an
/// `O_PATH` descriptor from the agent to the program.)
pub fn notified_syscalls() -> Vec<i64> {
    use libc::*;
    vec![
        SYS_open,
        SYS_openat,
        SYS_creat,
        SYS_stat,
        SYS_lstat,
        SYS_newfstatat,
        SYS_statx,
        SYS_access,
        SYS_faccessat,
        SYS_faccessat2,
        SYS_readlink,
        SYS_readlinkat,
        SYS_getcwd,
        SYS_close,
        SYS_fsync,
        SYS_fdatasync,
    ]
}

/// The other system calls that name a path: these stop the program under ptrace, since
/// the agent may need to change the call itself (`execve`, `chdir`), and they are rare.
pub fn traced_syscalls() -> Vec<i64> {
    use libc::*;
    vec![
        SYS_openat2,
        SYS_chdir,
        SYS_mkdir,
        SYS_mkdirat,
        SYS_rmdir,
        SYS_unlink,
        SYS_unlinkat,
        SYS_rename,
        SYS_renameat,
        SYS_renameat2,
        SYS_link,
        SYS_linkat,
        SYS_symlink,
        SYS_symlinkat,
        SYS_chmod,
        SYS_fchmodat,
        SYS_chown,
        SYS_lchown,
        SYS_fchownat,
        SYS_truncate,
        SYS_utime,
        SYS_utimes,
        SYS_futimesat,
        SYS_utimensat,
        SYS_execve,
        SYS_execveat,
        SYS_statfs,
        SYS_mknod,
        SYS_mknodat,
        SYS_getxattr,
        SYS_lgetxattr,
        SYS_setxattr,
        SYS_lsetxattr,
        SYS_listxattr,
        SYS_llistxattr,
        SYS_removexattr,
        SYS_lremovexattr,
    ]
}

/// The seccomp programs the child installs before it execs the program.
struct Filters {
    /// `traced_syscalls` → ptrace stop.
    trace: seccompiler::BpfProgram,
    /// `notified_syscalls` → user notification.
    notify: seccompiler::BpfProgram,
    /// `notified_syscalls` → ptrace stop, where user notification is not available.
    notify_by_trace: seccompiler::BpfProgram,
}

/// The `SECCOMP_RET_TRACE` data that marks the returns to turn into user notifications
/// (seccompiler has no such action).
const NOTIFY_MARK: u32 = 0x7ff;

/// A seccomp program that matches `calls`; `open` and `openat` among them only if their
/// flags have `O_PATH` set, or only if clear, as `o_path_set` says.
fn filter(calls: Vec<i64>, o_path_set: bool, data: u32) -> Result<seccompiler::BpfProgram, String> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    let flags_arg = |nr: i64| match nr {
        libc::SYS_open => Some(1),
        libc::SYS_openat => Some(2),
        _ => None,
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in calls {
        let rule = match flags_arg(nr) {
            None => vec![],
            Some(arg) => {
                let want = if o_path_set { libc::O_PATH as u64 } else { 0 };
                let op = SeccompCmpOp::MaskedEq(libc::O_PATH as u64);
                let condition = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, want);
                vec![condition.and_then(|c| SeccompRule::new(vec![c])).map_err(|e| format!("seccomp rule: {e}"))?]
            }
        };
        rules.insert(nr, rule);
    }
    let f = seccompiler::SeccompFilter::new(
        rules,
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Trace(data),
        seccompiler::TargetArch::x86_64,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    f.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp filter: {e}"))
}

fn filters() -> Result<Filters, String> {
    let mut notify = filter(notified_syscalls(), false, NOTIFY_MARK)?;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    for insn in notify.iter_mut().filter(|i| i.code == ret && i.k == libc::SECCOMP_RET_TRACE | NOTIFY_MARK) {
        insn.k = libc::SECCOMP_RET_USER_NOTIF;
    }
    // The opens the notification filter leaves out (O_PATH) stop under ptrace.
    let mut traced = traced_syscalls();
    traced.extend([libc::SYS_open, libc::SYS_openat]);
    Ok(Filters { trace: filter(traced, true, 0)?, notify, notify_by_trace: filter(notified_syscalls(), false, 0)? })
}

/// Installs `program` with a user-notification listener; answers the listener's
/// descriptor, or -1 if the kernel cannot. Called in the child between fork and exec.
fn install_listener(program: &seccompiler::BpfProgram) -> i32 {
    // Once the agent has read a notification, a signal to the program waits for the
    // answer (as it would during a real system call) instead of restarting the call.
    const WAIT_KILLABLE_RECV: libc::c_ulong = 1 << 5;
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
    for flags in [libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | WAIT_KILLABLE_RECV, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER] {
        // SAFETY: `fprog` points at a live program; the kernel copies it.
        let fd = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &fprog) };
        if fd >= 0 {
            return fd as i32;
        }
    }
    -1
}

/// Takes the child's listener descriptor `fd` into the agent.
fn take_listener(child: Pid, fd: i32) -> Option<OwnedFd> {
    // SAFETY: plain system calls; a descriptor they return is owned by no one else.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0);
        if pidfd < 0 {
            return None;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as i32))
    }
}

/// The traced program tree and its bookkeeping.
struct Tree {
    main: Pid,
    /// Thread → thread group (process), for the scratch mapping of its address space.
    groups: HashMap<Pid, Pid>,
    scratch: HashMap<Pid, Scratch>,
    /// Threads whose first (attach) stop has been seen.
    started: HashSet<Pid>,
    status: i32,
}

/// Starts `argv` under the tracer and runs it to the end; answers its exit status
/// (128 + signal if killed), or the abort that ended it.
pub fn run(argv: &[CString], handler: &mut dyn Handler) -> Result<i32, Abort> {
    let setup = |message: String| Abort { status: crate::EXIT_SETUP, message };
    let filters = filters().map_err(setup)?;
    let (listener_r, listener_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| setup(format!("pipe: {e}")))?;
    // SAFETY: the child only calls async-signal-safe functions (ptrace, raise, prctl,
    // seccomp, write, execvp, _exit) on memory prepared before the fork.
    let child = match unsafe { fork() }.map_err(|e| setup(format!("fork: {e}")))? {
        ForkResult::Child => {
            let _ = ptrace::traceme();
            let _ = nix::sys::signal::raise(Signal::SIGSTOP);
            if seccompiler::apply_filter(&filters.trace).is_err() {
                unsafe { libc::_exit(crate::EXIT_SETUP) };
            }
            let listener = install_listener(&filters.notify);
            if listener < 0 && seccompiler::apply_filter(&filters.notify_by_trace).is_err() {
                unsafe { libc::_exit(crate::EXIT_SETUP) };
            }
            // The listener is close-on-exec: the agent takes its copy while this child
            // waits at its first `execve`, which stops under ptrace.
            unsafe { libc::write(listener_w.as_raw_fd(), &listener as *const i32 as *const libc::c_void, 4) };
            let _ = nix::unistd::execvp(&argv[0], argv);
            unsafe { libc::_exit(127) };
        }
        ForkResult::Parent { child } => child,
    };
    drop(listener_w);
    match waitpid(child, Some(WaitPidFlag::__WALL)) {
        Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => {}
        other => return Err(setup(format!("the program did not start under the tracer: {other:?}"))),
    }
    let options = Options::PTRACE_O_TRACESECCOMP
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK
        | Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEEXEC
        | Options::PTRACE_O_TRACESYSGOOD
        | Options::PTRACE_O_EXITKILL;
    ptrace::setoptions(child, options).map_err(|e| setup(format!("ptrace: {e}")))?;
    let _ = ptrace::cont(child, None);
    let mut fd = [0u8; 4];
    let listener = match nix::unistd::read(listener_r.as_raw_fd(), &mut fd) {
        Ok(4) if i32::from_ne_bytes(fd) >= 0 => take_listener(child, i32::from_ne_bytes(fd)),
        _ => None,
    };
    let mut tree = Tree {
        main: child,
        groups: HashMap::from([(child, child)]),
        scratch: HashMap::new(),
        started: HashSet::from([child]),
        status: 0,
    };
    let handler = Mutex::new(handler);
    let aborted = Mutex::new(None);
    let outcome = std::thread::scope(|scope| {
        let supervisor = listener.map(|fd| crate::notify::Supervisor::start(scope, fd, &handler, &aborted));
        let outcome = tree.events(&handler, &aborted);
        if let Some(s) = supervisor {
            s.stop();
        }
        outcome
    });
    match outcome {
        Ok(()) => Ok(tree.status),
        Err(abort) => {
            tree.kill_all();
            Err(abort)
        }
    }
}

impl Tree {
    fn events(&mut self, handler: &Shared, aborted: &Aborted) -> Result<(), Abort> {
        loop {
            let status = waitpid(None, Some(WaitPidFlag::__WALL));
            if let Some(abort) = aborted.lock().unwrap_or_else(|p| p.into_inner()).take() {
                return Err(abort);
            }
            let status = match status {
                Ok(s) => s,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return Ok(()), // ECHILD: the whole tree has ended
            };
            match status {
                WaitStatus::PtraceEvent(tid, _, ev) if ev == Event::PTRACE_EVENT_SECCOMP as i32 => {
                    self.syscall_stop(tid, handler)?;
                }
                WaitStatus::PtraceEvent(tid, _, ev)
                    if ev == Event::PTRACE_EVENT_FORK as i32
                        || ev == Event::PTRACE_EVENT_VFORK as i32
                        || ev == Event::PTRACE_EVENT_CLONE as i32 =>
                {
                    if let Ok(new) = ptrace::getevent(tid) {
                        self.adopt(tid, Pid::from_raw(new as i32), ev);
                    }
                    let _ = ptrace::cont(tid, None);
                }
                WaitStatus::PtraceEvent(tid, _, ev) if ev == Event::PTRACE_EVENT_EXEC as i32 => {
                    // A new program image: the old scratch mapping is gone, and close-on-exec
                    // descriptors were closed without a `close`.
                    let group = self.group(tid);
                    self.scratch.remove(&group);
                    lock(handler).process_event()?;
                    let _ = ptrace::cont(tid, None);
                }
                WaitStatus::PtraceEvent(tid, _, _) | WaitStatus::PtraceSyscall(tid) => {
                    let _ = ptrace::cont(tid, None);
                }
                WaitStatus::Stopped(tid, sig) => {
                    if self.started.insert(tid) && sig == Signal::SIGSTOP {
                        // The stop every new thread of a traced process starts with.
                        let _ = ptrace::cont(tid, None);
                    } else if ptrace::getsiginfo(tid).is_err() {
                        // A group stop (job control): resume rather than hang the tree.
                        let _ = ptrace::cont(tid, None);
                    } else {
                        let _ = ptrace::cont(tid, Some(sig));
                    }
                }
                WaitStatus::Exited(tid, code) => self.ended(tid, code, handler)?,
                WaitStatus::Signaled(tid, sig, _) => self.ended(tid, 128 + sig as i32, handler)?,
                _ => {}
            }
        }
    }

    fn ended(&mut self, tid: Pid, status: i32, handler: &Shared) -> Result<(), Abort> {
        if tid == self.main {
            self.status = status;
        }
        let group = self.groups.remove(&tid);
        self.started.remove(&tid);
        if group == Some(tid) {
            self.scratch.remove(&tid);
            lock(handler).process_event()?;
        }
        Ok(())
    }

    /// Records a new thread or process; a new process inherits its parent's scratch
    /// mapping (fork copies it to the same address, vfork shares it).
    fn adopt(&mut self, parent: Pid, child: Pid, event: i32) {
        if self.groups.contains_key(&child) {
            // The child stopped before this event was read and is known already; it may
            // even have exec'd since, so the parent's mapping must not be given to it.
            return;
        }
        let parent_group = self.group(parent);
        let thread =
            event == Event::PTRACE_EVENT_CLONE as i32 && self.clone_flags(parent) & libc::CLONE_THREAD as u64 != 0;
        if thread {
            self.groups.insert(child, parent_group);
        } else {
            self.groups.insert(child, child);
            if let Some(s) = self.scratch.get(&parent_group).copied() {
                self.scratch.insert(child, s);
            }
        }
    }

    /// The flags of the `clone` or `clone3` the stopped `tid` is making.
    fn clone_flags(&self, tid: Pid) -> u64 {
        let Ok(regs) = ptrace::getregs(tid) else { return 0 };
        if regs.orig_rax as i64 == libc::SYS_clone3 {
            let t = Tracee { tid };
            t.read(regs.rdi, 8).map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes"))).unwrap_or(0)
        } else {
            regs.rdi
        }
    }

    /// The thread group of `tid`, from /proc when its creation has not been seen yet.
    fn group(&mut self, tid: Pid) -> Pid {
        if let Some(g) = self.groups.get(&tid) {
            return *g;
        }
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
        let g = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse().ok())
            .map(Pid::from_raw)
            .unwrap_or(tid);
        self.groups.insert(tid, g);
        g
    }

    fn syscall_stop(&mut self, tid: Pid, handler: &Shared) -> Result<(), Abort> {
        let Ok(mut regs) = ptrace::getregs(tid) else { return Ok(()) };
        let nr = regs.orig_rax as i64;
        let args = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9];
        let t = Tracee { tid };
        let step = lock(handler).syscall(&t, nr, args)?;
        match step {
            Step::Continue => {}
            Step::Return(value) => {
                regs.orig_rax = u64::MAX; // skip the call; rax is what it returns
                regs.rax = value as u64;
                let _ = ptrace::setregs(tid, regs);
            }
            Step::Rewrite(paths) => {
                let group = self.group(tid);
                let Some(scratch) = self.scratch.get_mut(&group) else {
                    // First rewrite in this address space: map the scratch area, and let
                    // the call run again (it stops again and is decided afresh). An
                    // address of 0 records that the mapping failed.
                    let addr = inject_mmap(tid, regs).unwrap_or(0);
                    self.scratch.insert(group, Scratch { addr, next: 0 });
                    let _ = ptrace::cont(tid, None);
                    return Ok(());
                };
                let fits = paths.iter().map(|(_, p)| p.len() + 1).sum::<usize>() <= SLOT_SIZE as usize;
                if !fits {
                    regs.orig_rax = u64::MAX;
                    regs.rax = -libc::ENAMETOOLONG as i64 as u64;
                    let _ = ptrace::setregs(tid, regs);
                    let _ = ptrace::cont(tid, None);
                    return Ok(());
                }
                if scratch.addr == 0 {
                    regs.orig_rax = u64::MAX;
                    regs.rax = -libc::ENOMEM as i64 as u64;
                    let _ = ptrace::setregs(tid, regs);
                    let _ = ptrace::cont(tid, None);
                    return Ok(());
                }
                let original = regs;
                let mut at = scratch.addr + (scratch.next % (SCRATCH_SIZE / SLOT_SIZE)) * SLOT_SIZE;
                scratch.next += 1;
                for (index, path) in paths {
                    let mut bytes = path.into_bytes();
                    bytes.push(0);
                    if !t.write(at, &bytes) {
                        // The mapping is not where it was thought to be: make a new one
                        // and let the call run again.
                        let addr = inject_mmap(tid, original).unwrap_or(0);
                        self.scratch.insert(group, Scratch { addr, next: 0 });
                        let _ = ptrace::cont(tid, None);
                        return Ok(());
                    }
                    match index {
                        0 => regs.rdi = at,
                        1 => regs.rsi = at,
                        2 => regs.rdx = at,
                        3 => regs.r10 = at,
                        4 => regs.r8 = at,
                        _ => regs.r9 = at,
                    }
                    at += bytes.len() as u64;
                }
                let _ = ptrace::setregs(tid, regs);
            }
        }
        let _ = ptrace::cont(tid, None);
        Ok(())
    }

    fn kill_all(&mut self) {
        for tid in self.groups.keys() {
            let _ = kill(*tid, Signal::SIGKILL);
        }
        while waitpid(None, Some(WaitPidFlag::__WALL)).is_ok() {}
    }
}

/// Makes the thread stopped at `regs` run `mmap` for a scratch area instead of its call,
/// then rewinds it to make its call again; answers the area's address. The thread is
/// left stopped at the end of the `mmap`, and resumed by the caller.
fn inject_mmap(tid: Pid, regs: libc::user_regs_struct) -> Option<u64> {
    let mut call = regs;
    call.orig_rax = libc::SYS_mmap as u64;
    call.rdi = 0;
    call.rsi = SCRATCH_SIZE;
    call.rdx = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    call.r10 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    call.r8 = u64::MAX;
    call.r9 = 0;
    ptrace::setregs(tid, call).ok()?;
    ptrace::syscall(tid, None).ok()?;
    match waitpid(tid, Some(WaitPidFlag::__WALL)) {
        Ok(WaitStatus::PtraceSyscall(_)) => {}
        _ => return None,
    }
    let addr = ptrace::getregs(tid).ok()?.rax;
    let mut again = regs;
    again.rip -= 2; // the `syscall` instruction
    again.rax = regs.orig_rax;
    ptrace::setregs(tid, again).ok()?;
    ((addr as i64) > 0).then_some(addr)
}
