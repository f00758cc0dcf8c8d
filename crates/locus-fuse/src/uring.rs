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
//! until all queues have entries (or if the kernel refuses them). The file system
//! (`&mut`) is locked around each request.
//!
//! Once INIT has said io_uring, the kernel holds every request until each queue has an
//! entry, and a request made on a CPU waits for that CPU's queue: so the rings are made
//! before INIT is answered ([`Queues::prepare`]; if that fails, INIT does not ask for
//! io_uring), and a queue that fails after that ends the process (its mount then
//! answers `ENOTCONN`) rather than leave that CPU's callers waiting for ever.

use crate::abi::{self, op, uring as ring_abi, Args, InHeader};
use crate::classic::{classic, Ended};
use crate::dispatch::{dispatch, wants_reply, Via};
use crate::reply::Outgoing;
use crate::Filesystem;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::sync::Mutex;

/// Entries registered per queue of an online CPU: how many requests of one CPU may
/// wait for its thread. A CPU that is not online gets one (the kernel wants one per
/// queue before it uses any).
const QUEUE_DEPTH: usize = 8;

/// One ring entry: the header buffer (`fuse_uring_req_header`) and the payload buffer,
/// which the kernel writes requests into and reads replies from while registered.
struct Entry {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
    /// The command last given to the kernel for this entry.
    last: u32,
}

/// A queue's ring and entries. The ring is declared first, so it is dropped (and the
/// kernel lets go of the entries) before the buffers it names are freed.
struct Queue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<Entry>,
    qid: u16,
}

// SAFETY: the iovecs point into the entry's own boxed buffers, which move with it.
unsafe impl Send for Queue {}

/// The rings of every queue, made before INIT is answered.
pub(crate) struct Queues(Vec<Queue>);

/// The CPUs listed in a `/sys/devices/system/cpu` range file (`0-3,8`).
fn cpus(file: &str) -> Vec<usize> {
    let text = std::fs::read_to_string(format!("/sys/devices/system/cpu/{file}")).unwrap_or_default();
    let mut all = Vec::new();
    for range in text.trim().split(',').filter(|r| !r.is_empty()) {
        let mut ends = range.split('-').map(|n| n.trim().parse::<usize>().ok());
        if let Some(Some(first)) = ends.next() {
            let last = ends.next().flatten().unwrap_or(first);
            all.extend(first..=last.min(first + 65_536));
        }
    }
    all
}

/// The kernel's page size: a payload buffer holds at least `max_pages` of them.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as usize
    } else {
        4096
    }
}

impl Queues {
    /// A ring per possible CPU with its entries' buffers, each payload `payload` bytes.
    pub(crate) fn prepare(fd: i32, payload: usize) -> io::Result<Queues> {
        let possible = cpus("possible");
        let online = cpus("online");
        let count = possible.iter().max().map_or(0, |&c| c + 1);
        if count == 0 {
            return Err(io::Error::other("no CPUs in /sys/devices/system/cpu/possible"));
        }
        let mut queues = Vec::with_capacity(count);
        for qid in 0..count {
            let depth = if online.contains(&qid) { QUEUE_DEPTH } else { 1 };
            let ring = IoUring::builder().setup_cqsize((depth * 2) as u32).build(depth as u32)?;
            ring.submitter().register_files(&[fd])?;
            let entries = (0..depth)
                .map(|_| {
                    let mut header = vec![0u8; ring_abi::HEADER_SIZE].into_boxed_slice();
                    let mut payload = vec![0u8; payload].into_boxed_slice();
                    let iov = Box::new([
                        libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: header.len() },
                        libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
                    ]);
                    Entry { header, payload, iov, last: 0 }
                })
                .collect();
            queues.push(Queue { ring, entries, qid: qid as u16 });
        }
        Ok(Queues(queues))
    }
}

/// `IORING_OP_URING_CMD` for entry `index` of queue `q`: REGISTER hands the kernel its
/// buffers; COMMIT_AND_FETCH its reply (request `commit_id`).
fn command(q: &mut Queue, index: usize, cmd: u32, commit_id: u64) -> squeue::Entry128 {
    let qid = q.qid;
    let e = &mut q.entries[index];
    e.last = cmd;
    // struct fuse_uring_cmd_req: flags u64, commit_id u64, qid u16.
    let mut req = [0u8; 80];
    req[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    req[16..18].copy_from_slice(&qid.to_ne_bytes());
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

/// Queues `sqe` on `q`'s ring, submitting first if the submission queue is full.
fn push(q: &mut Queue, sqe: &squeue::Entry128) -> io::Result<()> {
    loop {
        // SAFETY: every buffer the entry names (entry buffers, iovecs) lives as long as
        // the ring.
        if unsafe { q.ring.submission().push(sqe) }.is_ok() {
            return Ok(());
        }
        q.ring.submit()?;
    }
}

/// Serves `fs` over the prepared `queues` until the mount goes: a thread per queue, on
/// the queue's CPU, so a request is answered on the CPU that made it (no wake-up of
/// another CPU), and a thread reading /dev/fuse.
pub(crate) fn serve<F: Filesystem + Send>(fs: &mut F, queues: Queues, fd: i32, max_write: u32, owner: u32) -> Ended {
    let fs = Mutex::new(fs);
    tracing::info!("FUSE over io_uring: {} queues, a thread each", queues.0.len());
    let ended: Vec<Ended> = std::thread::scope(|scope| {
        let reader = scope.spawn(|| classic(&fs, fd, max_write, owner));
        let queues: Vec<_> = queues
            .0
            .into_iter()
            .map(|mut q| {
                let fs = &fs;
                scope.spawn(move || {
                    let qid = q.qid;
                    match serve_queue(fs, &mut q, owner) {
                        Ok(ended) => ended,
                        Err(e) => {
                            // Its CPU's callers would wait for ever: end the process, and
                            // with it the connection (they get ENOTCONN).
                            tracing::error!("FUSE over io_uring: queue {qid} failed ({e}); ending the connection");
                            std::process::abort();
                        }
                    }
                })
            })
            .collect();
        std::iter::once(reader).chain(queues).map(|t| t.join().unwrap_or_else(|_| std::process::abort())).collect()
    });
    if ended.contains(&Ended::Destroyed) {
        Ended::Destroyed
    } else {
        Ended::Gone
    }
}

/// Serves queue `q` on its CPU: registers its entries, then answers each request the
/// kernel puts in one and hands it back with the fetch of the next. An entry the kernel
/// refuses ends the queue quietly: the kernel then uses /dev/fuse for every request.
fn serve_queue<F: Filesystem>(fs: &Mutex<&mut F>, q: &mut Queue, owner: u32) -> io::Result<Ended> {
    pin_to_cpu(q.qid as usize);
    for i in 0..q.entries.len() {
        let sqe = command(q, i, ring_abi::CMD_REGISTER, 0);
        push(q, &sqe)?;
    }
    let mut out = Outgoing::default();
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(q.entries.len() * 2);
    loop {
        match q.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)) => {}
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(q.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(tag, result) in &done {
            let index = tag as usize;
            match result {
                0 => {
                    let destroyed = {
                        let mut fs = fs.lock().unwrap_or_else(|e| e.into_inner());
                        serve_entry(&mut **fs, &mut q.entries[index], &mut out, q.qid, owner)
                    };
                    let header = &q.entries[index].header;
                    let mut id = [0u8; 8];
                    id.copy_from_slice(&header[ring_abi::COMMIT_ID..ring_abi::COMMIT_ID + 8]);
                    let sqe = command(q, index, ring_abi::CMD_COMMIT_AND_FETCH, u64::from_ne_bytes(id));
                    push(q, &sqe)?;
                    if destroyed {
                        q.ring.submit()?;
                        return Ok(Ended::Destroyed);
                    }
                }
                // Unmounted or aborted: the kernel ends every entry so.
                e if [-libc::ENOTCONN, -libc::ECONNABORTED, -libc::ENODEV].contains(&e) => return Ok(Ended::Gone),
                e if q.entries[index].last == ring_abi::CMD_REGISTER => {
                    tracing::warn!(
                        "FUSE over io_uring: the kernel refused an entry of queue {} ({}); requests come by /dev/fuse",
                        q.qid,
                        io::Error::from_raw_os_error(-e)
                    );
                    return Ok(Ended::Gone);
                }
                e => return Err(io::Error::from_raw_os_error(-e)),
            }
        }
    }
}

/// Runs this thread on `cpu` (requests made there come to its queue); where it cannot,
/// the queue is served from wherever the scheduler puts it.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it (checked).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Serves the request the kernel put in entry `e` and writes the reply into it; true
/// for DESTROY (the file system's `destroy` has run).
fn serve_entry<F: Filesystem>(fs: &mut F, e: &mut Entry, out: &mut Outgoing, qid: u16, owner: u32) -> bool {
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
        dispatch(fs, &h, &args, out, Via::Ring(qid), owner);
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
    header[ring_abi::IN_OUT..ring_abi::IN_OUT + abi::OUT_HEADER].copy_from_slice(&abi::out_header(
        abi::OUT_HEADER + body_len,
        error,
        h.unique,
    ));
    header[ring_abi::PAYLOAD_SZ..ring_abi::PAYLOAD_SZ + 4].copy_from_slice(&(body_len as u32).to_ne_bytes());
    h.opcode == op::DESTROY
}
