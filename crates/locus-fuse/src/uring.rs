//! FUSE over io_uring (Linux 6.14 and later, FUSE 7.42): after INIT, the server
//! registers entries (two buffers each) for every queue the kernel keeps, one per
//! possible CPU; the kernel fills an entry with a request and completes its command;
//! the server writes the reply into the same entry and hands it back with
//! `COMMIT_AND_FETCH`, which also waits for the next request. Replies queued while
//! serving go to the kernel in one `io_uring_enter` with the wait for the next request:
//! no read and no write per request, and several requests per system call under load.
//!
//! Each queue has a thread and a ring of its own, on the queue's CPU; another thread
//! reads /dev/fuse: FORGET and INTERRUPT always come that way, and every request does
//! until all queues have entries. The file system (`&mut`) is locked around each
//! request.

use crate::abi::{self, op, uring as ring_abi, Args, InHeader};
use crate::dispatch::{dispatch, wants_reply};
use crate::reply::Outgoing;
use crate::session::{classic, Ended};
use crate::Filesystem;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

/// Entries registered per queue: how many requests of one CPU may wait for this thread.
const QUEUE_DEPTH: usize = 8;

/// One ring entry: the header buffer (`fuse_uring_req_header`) and the payload buffer,
/// which the kernel writes requests into and reads replies from while registered.
struct Entry {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
    qid: u16,
}

/// The number of queues the kernel keeps: one per possible CPU.
fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let count: usize = text
        .trim()
        .split(',')
        .filter_map(|range| {
            let mut ends = range.split('-').map(|n| n.trim().parse::<usize>().ok());
            let first = ends.next().flatten()?;
            let last = ends.next().flatten().unwrap_or(first);
            Some(last.checked_sub(first)? + 1)
        })
        .sum();
    if count > 0 {
        count
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// `IORING_OP_URING_CMD` for entry `index`: REGISTER hands the kernel its buffers;
/// COMMIT_AND_FETCH its reply (request `commit_id`).
fn command(entries: &[Entry], index: usize, cmd: u32, commit_id: u64) -> squeue::Entry128 {
    let e = &entries[index];
    // struct fuse_uring_cmd_req: flags u64, commit_id u64, qid u16.
    let mut req = [0u8; 80];
    req[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    req[16..18].copy_from_slice(&e.qid.to_ne_bytes());
    let mut c = opcode::UringCmd80::new(types::Fixed(0), cmd).cmd(req);
    if cmd == ring_abi::CMD_REGISTER {
        c = c.addr(Some(e.iov.as_ptr() as u64));
    }
    let mut sqe = c.build().user_data(index as u64);
    if cmd == ring_abi::CMD_REGISTER {
        // The kernel wants sqe->len = 2 (the header's and the payload's iovec), which
        // the crate's UringCmd80 does not set: `len` is the u32 at byte 24 of the SQE.
        // SAFETY: Entry128 is #[repr(C)], a 64-byte io_uring_sqe then 64 bytes of command.
        let bytes = unsafe { &mut *(&mut sqe as *mut squeue::Entry128 as *mut [u8; 128]) };
        bytes[24..28].copy_from_slice(&2u32.to_ne_bytes());
    }
    sqe
}

/// Queues `sqe`, submitting first if the submission queue is full.
fn push(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>, sqe: &squeue::Entry128) -> io::Result<()> {
    loop {
        // SAFETY: every buffer the entry names (entry buffers, iovecs) lives as long as
        // the ring.
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

/// Serves `fs` over io_uring until the mount goes: a thread per queue, on the queue's
/// CPU, so a request is answered on the CPU that made it (no wake-up of another CPU),
/// and a thread reading /dev/fuse (FORGET, INTERRUPT, and every request until all
/// queues have entries, or if the kernel refuses them). The file system is locked
/// around each request.
pub(crate) fn serve<F: Filesystem + Send>(fs: &mut F, fuse: &OwnedFd, max_write: u32) -> Ended {
    let queues = possible_cpus();
    let fs = Mutex::new(fs);
    let fd = fuse.as_raw_fd();
    tracing::info!("FUSE over io_uring: {queues} queues of {QUEUE_DEPTH} entries, a thread each");
    let ended: Vec<Ended> = std::thread::scope(|scope| {
        let reader = scope.spawn(|| classic(&fs, fd, max_write));
        let queues: Vec<_> = (0..queues).map(|qid| {
            let fs = &fs;
            scope.spawn(move || match serve_queue(fs, fd, qid, max_write) {
                Ok(ended) => ended,
                Err(e) => {
                    tracing::warn!("FUSE over io_uring: queue {qid}: {e}; its CPU's requests come by /dev/fuse");
                    Ended::Gone
                }
            })
        }).collect();
        std::iter::once(reader).chain(queues).map(|t| t.join().unwrap_or(Ended::Gone)).collect()
    });
    if ended.contains(&Ended::Destroyed) {
        Ended::Destroyed
    } else {
        Ended::Gone
    }
}

/// Serves queue `qid` on its CPU: registers its entries, then answers each request the
/// kernel puts in one and hands it back with the fetch of the next.
fn serve_queue<F: Filesystem>(fs: &Mutex<&mut F>, fd: i32, qid: usize, max_write: u32) -> io::Result<Ended> {
    pin_to_cpu(qid);
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().setup_cqsize((QUEUE_DEPTH * 2) as u32).build(QUEUE_DEPTH as u32)?;
    ring.submitter().register_files(&[fd])?;
    // The kernel wants each payload buffer to hold the largest request or reply.
    let payload_size = (max_write as usize).max(8192);
    let mut entries: Vec<Entry> = (0..QUEUE_DEPTH)
        .map(|_| {
            let mut header = vec![0u8; ring_abi::HEADER_SIZE].into_boxed_slice();
            let mut payload = vec![0u8; payload_size].into_boxed_slice();
            let iov = Box::new([
                libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: header.len() },
                libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
            ]);
            Entry { header, payload, iov, qid: qid as u16 }
        })
        .collect();
    for i in 0..entries.len() {
        push(&mut ring, &command(&entries, i, ring_abi::CMD_REGISTER, 0))?;
    }
    let mut out = Outgoing::default();
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(QUEUE_DEPTH * 2);
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)) => {}
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for &(tag, result) in &done {
            let index = tag as usize;
            match result {
                0 => {
                    let destroyed = {
                        let mut fs = fs.lock().unwrap_or_else(|e| e.into_inner());
                        serve_entry(&mut **fs, &mut entries[index], &mut out)
                    };
                    let commit_id = u64::from_ne_bytes(
                        entries[index].header[ring_abi::COMMIT_ID..ring_abi::COMMIT_ID + 8].try_into().unwrap_or_default(),
                    );
                    push(&mut ring, &command(&entries, index, ring_abi::CMD_COMMIT_AND_FETCH, commit_id))?;
                    if destroyed {
                        ring.submit()?;
                        return Ok(Ended::Destroyed);
                    }
                }
                e if e == -libc::EINTR || e == -libc::EAGAIN => {
                    tracing::debug!("FUSE over io_uring: queue {qid} entry {index} interrupted; registering again");
                    push(&mut ring, &command(&entries, index, ring_abi::CMD_REGISTER, 0))?;
                }
                // Unmounted or aborted: the kernel ends every entry so.
                e if [-libc::ENOTCONN, -libc::ECONNABORTED, -libc::ENODEV].contains(&e) => return Ok(Ended::Gone),
                // A refused entry: the kernel keeps sending by /dev/fuse, read by the
                // reader thread, so requests are still served.
                e => return Err(io::Error::from_raw_os_error(-e)),
            }
        }
    }
}

/// Runs this thread on `cpu` (requests made there come to its queue); where it cannot,
/// the queue is served from wherever the scheduler puts it.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Serves the request the kernel put in entry `e` and writes the reply into it; true
/// for DESTROY (the file system's `destroy` has run).
fn serve_entry<F: Filesystem>(fs: &mut F, e: &mut Entry, out: &mut Outgoing) -> bool {
    let header = &mut e.header;
    let Ok(h) = InHeader::parse(&header[ring_abi::IN_OUT..]) else { return false };
    let mut size = [0u8; 4];
    size.copy_from_slice(&header[ring_abi::PAYLOAD_SZ..ring_abi::PAYLOAD_SZ + 4]);
    let payload_sz = u32::from_ne_bytes(size);
    let first = abi::first_arg_size(h.opcode).min(ring_abi::OP_IN);
    let (error, body_len) = if h.opcode == op::DESTROY {
        fs.destroy();
        (0, 0)
    } else {
        let args = Args {
            arg: &header[ring_abi::OP_IN..ring_abi::OP_IN + first],
            rest: e.payload.get(..payload_sz as usize).unwrap_or_default(),
        };
        dispatch(fs, &h, &args, out);
        if !wants_reply(h.opcode) {
            (0, 0)
        } else if !out.replied {
            tracing::warn!("request #{} got no answer: EIO", h.unique);
            (-libc::EIO, 0)
        } else if out.error != 0 {
            (out.error, 0)
        } else if out.body.len() > e.payload.len() {
            tracing::warn!("a reply of {} bytes does not fit the ring's {}: EIO", out.body.len(), e.payload.len());
            (-libc::EIO, 0)
        } else {
            e.payload[..out.body.len()].copy_from_slice(&out.body);
            (0, out.body.len())
        }
    };
    header[ring_abi::IN_OUT..ring_abi::IN_OUT + abi::OUT_HEADER]
        .copy_from_slice(&abi::out_header(abi::OUT_HEADER + body_len, error, h.unique));
    header[ring_abi::PAYLOAD_SZ..ring_abi::PAYLOAD_SZ + 4].copy_from_slice(&(body_len as u32).to_ne_bytes());
    h.opcode == op::DESTROY
}
