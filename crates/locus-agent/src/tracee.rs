//! What a [`Handler`] sees of a stopped thread ([`Tracee`]: its memory, working
//! directory, descriptors, umask) and how it answers ([`Step`], [`Abort`]); shared by
//! the two ways calls reach the agent, ptrace stops ([`crate::tracer`]) and seccomp
//! notifications ([`crate::notify`]).

use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;
use std::io::{IoSlice, IoSliceMut};
use std::sync::Mutex;

/// What to do with a stopped system call.
pub enum Step {
    /// Let it run unchanged.
    Continue,
    /// Skip it and return this value (a result, or `-errno`).
    Return(i64),
    /// Replace path arguments (by index) with these strings, then let it run.
    Rewrite(Vec<(usize, String)>),
}

/// Why the run ends early: the program tree is killed and the agent exits.
#[derive(Clone, Debug)]
pub struct Abort {
    pub status: i32,
    pub message: String,
}

/// The agent's view of one stop: which thread, which call, its arguments.
pub trait Handler: Send {
    /// Decides what a stopped system call does.
    fn syscall(&mut self, t: &Tracee, nr: i64, args: [u64; 6]) -> Result<Step, Abort>;
    /// A process exec'd or ended: files it had open may have been closed without `close`.
    fn process_event(&mut self) -> Result<(), Abort>;
}

/// A stopped thread of the traced program.
pub struct Tracee {
    pub tid: Pid,
}

impl Tracee {
    /// A NUL-terminated path from the tracee's memory (`None` if unreadable, too long or
    /// not UTF-8: such calls are left to the kernel).
    pub fn read_path(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        let mut out = Vec::with_capacity(128);
        let mut at = addr;
        while out.len() < libc::PATH_MAX as usize {
            let room = 4096 - (at % 4096) as usize;
            let mut buf = [0u8; 4096];
            let n = process_vm_readv(
                self.tid,
                &mut [IoSliceMut::new(&mut buf[..room])],
                &[RemoteIoVec { base: at as usize, len: room }],
            )
            .ok()?;
            if n == 0 {
                return None;
            }
            if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
                out.extend_from_slice(&buf[..end]);
                return String::from_utf8(out).ok();
            }
            out.extend_from_slice(&buf[..n]);
            at += n as u64;
        }
        None
    }

    /// Reads `len` bytes at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n =
            process_vm_readv(self.tid, &mut [IoSliceMut::new(&mut buf)], &[RemoteIoVec { base: addr as usize, len }])
                .ok()?;
        (n == len).then_some(buf)
    }

    /// Writes `bytes` at `addr`; false if the memory is not writable.
    pub fn write(&self, addr: u64, bytes: &[u8]) -> bool {
        let remote = [RemoteIoVec { base: addr as usize, len: bytes.len() }];
        matches!(process_vm_writev(self.tid, &[IoSlice::new(bytes)], &remote), Ok(n) if n == bytes.len())
    }

    /// The thread's working directory, as the kernel names it.
    pub fn cwd(&self) -> Option<String> {
        std::fs::read_link(format!("/proc/{}/cwd", self.tid)).ok()?.into_os_string().into_string().ok()
    }

    /// What the thread's descriptor `fd` names.
    pub fn fd_path(&self, fd: u64) -> Option<String> {
        std::fs::read_link(format!("/proc/{}/fd/{}", self.tid, fd as i32)).ok()?.into_os_string().into_string().ok()
    }

    /// The process's umask.
    pub fn umask(&self) -> u32 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.tid)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .unwrap_or(0o022)
    }
}

/// The handler, shared by the ptrace loop and the notification supervisor.
pub(crate) type Shared<'h> = Mutex<&'h mut dyn Handler>;

/// An abort raised by the supervisor, for the ptrace loop to act on.
pub(crate) type Aborted = Mutex<Option<Abort>>;

/// The handler, even if a thread panicked while holding it.
pub(crate) fn lock<'a, 'h>(handler: &'a Shared<'h>) -> std::sync::MutexGuard<'a, &'h mut dyn Handler> {
    handler.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
