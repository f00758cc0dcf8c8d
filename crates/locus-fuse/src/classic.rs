//! The classic transport: a `read(2)` of /dev/fuse per request and a `writev(2)` per
//! reply (and per notification); with io_uring, the thread reading what the rings do
//! not carry.

use crate::abi::{self, op, Args, InHeader};
use crate::dispatch::{dispatch, wants_reply, Via};
use crate::reply::Outgoing;
use crate::Filesystem;
use std::io;
use std::sync::Mutex;

/// How a serving loop ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Unmounted, or the connection aborted.
    Gone,
    /// The kernel sent DESTROY, answered: `destroy` has run.
    Destroyed,
}

/// Writes one reply (or notification) to /dev/fuse: `fuse_out_header`, then `body`.
pub(crate) fn send(fd: i32, unique: u64, error: i32, body: &[u8]) -> io::Result<()> {
    let header = abi::out_header(abi::OUT_HEADER + body.len(), error, unique);
    let iov = [
        libc::iovec { iov_base: header.as_ptr() as *mut libc::c_void, iov_len: header.len() },
        libc::iovec { iov_base: body.as_ptr() as *mut libc::c_void, iov_len: body.len() },
    ];
    // SAFETY: both vectors point at live buffers of the lengths given.
    let n = unsafe { libc::writev(fd, iov.as_ptr(), if body.is_empty() { 1 } else { 2 }) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Serves one request that came whole in `buf` (from a /dev/fuse read) and answers it by
/// a write; DESTROY is answered after the file system's `destroy`.
fn serve_read<F: Filesystem>(fs: &Mutex<&mut F>, fd: i32, buf: &[u8], out: &mut Outgoing, owner: u32) -> Option<Ended> {
    let lock = || fs.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(h) = InHeader::parse(buf) else {
        tracing::warn!("a request of {} bytes from /dev/fuse is shorter than its header", buf.len());
        return None;
    };
    if h.opcode == op::DESTROY {
        lock().destroy();
        let _ = send(fd, h.unique, 0, &[]);
        return Some(Ended::Destroyed);
    }
    let body = &buf[abi::IN_HEADER..];
    let split = abi::first_arg_size(h.opcode).min(body.len());
    let args = Args { arg: &body[..split], rest: &body[split..] };
    dispatch(&mut **lock(), &h, &args, out, Via::Read, owner);
    if wants_reply(h.opcode) {
        reply(fd, h.unique, out);
    }
    None
}

/// Serves one request as read from /dev/fuse (its header, then its arguments) on `fs`
/// and gives the answer (a negative errno or 0, and the body), or `None` for a request
/// the kernel expects no answer to. For fuzzing the request parser
/// (`fuzz/fuzz_targets/fuse_requests.rs`) and for tests.
pub fn serve_one_request<F: Filesystem>(fs: &mut F, request: &[u8]) -> Option<(i32, Vec<u8>)> {
    let h = InHeader::parse(request).ok()?;
    if matches!(h.opcode, op::INIT | op::DESTROY) {
        return None;
    }
    let body = &request[abi::IN_HEADER..];
    let split = abi::first_arg_size(h.opcode).min(body.len());
    let mut out = Outgoing::default();
    dispatch(fs, &h, &Args { arg: &body[..split], rest: &body[split..] }, &mut out, Via::Read, h.uid);
    wants_reply(h.opcode).then(|| if out.replied { (out.error, out.body) } else { (-libc::EIO, Vec::new()) })
}

/// Sends what the file system answered (`EIO` if it answered nothing).
fn reply(fd: i32, unique: u64, out: &Outgoing) {
    let sent = if out.replied {
        send(fd, unique, out.error, if out.error == 0 { &out.body } else { &[] })
    } else {
        tracing::warn!("request #{unique} got no answer: EIO");
        send(fd, unique, -libc::EIO, &[])
    };
    match sent {
        // ENOENT: the request was interrupted and is gone.
        Err(e) if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) => {
            tracing::warn!("answering request #{unique}: {e}")
        }
        _ => {}
    }
}

/// The classic loop: a `read(2)` of /dev/fuse per request (with io_uring, the thread
/// reading what the rings do not carry).
pub(crate) fn classic<F: Filesystem>(fs: &Mutex<&mut F>, fd: i32, max_write: u32, owner: u32) -> Ended {
    let mut buf = vec![0u8; max_write as usize + 4096];
    let mut out = Outgoing::default();
    loop {
        // SAFETY: `buf` is a live buffer of the length given.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                // ENOENT: the request was interrupted before it was read.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                Some(libc::ENODEV) => return Ended::Gone,
                _ => {
                    tracing::warn!("reading /dev/fuse: {}", io::Error::last_os_error());
                    return Ended::Gone;
                }
            }
        }
        if n == 0 {
            return Ended::Gone;
        }
        if let Some(ended) = serve_read(fs, fd, &buf[..n as usize], &mut out, owner) {
            return ended;
        }
    }
}
