//! A session driven as the kernel drives it, over a socket pair in place of /dev/fuse
//! (one message per request, as /dev/fuse reads give): INIT, requests and their
//! answers, malformed requests, and the end. The kernel's own FUSE is tested through
//! `locus mount` (crates/locus-cli/tests).

use locus_fuse::{FileAttr, FileType, Filesystem, ReplyEntry, Request, Session, TransportChoice};
use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

const INIT: u32 = 26;
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const READ: u32 = 15;
const WRITE: u32 = 16;
const DESTROY: u32 = 38;
const INIT_EXT: u32 = 1 << 30;
const OVER_IO_URING_HIGH: u32 = 1 << (41 - 32);

/// Knows one name, `hello` (node 2), under the root; counts forgets; notes `destroy`.
#[derive(Default)]
struct OneName {
    forgotten: Arc<AtomicU64>,
    destroyed: Arc<AtomicBool>,
}

impl Filesystem for OneName {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry<'_>) {
        if parent != 1 || name != "hello" {
            return reply.error(libc::ENOENT);
        }
        let attr = FileAttr {
            ino: 2,
            size: 5,
            blocks: 1,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        reply.entry(&Duration::from_secs(1), &attr, 0);
    }

    fn forget(&mut self, _req: &Request<'_>, _ino: u64, nlookup: u64) {
        self.forgotten.fetch_add(nlookup, Ordering::SeqCst);
    }

    fn destroy(&mut self) {
        self.destroyed.store(true, Ordering::SeqCst);
    }
}

/// The kernel's side: requests out, answers in.
struct Kernel {
    socket: UnixDatagram,
    unique: u64,
}

impl Kernel {
    fn request(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> u64 {
        self.unique += 2;
        let mut m = Vec::new();
        m.extend_from_slice(&((40 + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&opcode.to_ne_bytes());
        m.extend_from_slice(&self.unique.to_ne_bytes());
        m.extend_from_slice(&nodeid.to_ne_bytes());
        m.extend_from_slice(&[0u8; 16]); // uid, gid, pid, extlen and padding
        m.extend_from_slice(body);
        self.socket.send(&m).unwrap();
        self.unique
    }

    /// The next answer: (unique, error, body).
    fn answer(&self) -> (u64, i32, Vec<u8>) {
        let mut buf = vec![0u8; 1 << 16];
        let n = self.socket.recv(&mut buf).unwrap();
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, n, "the header's length is the message's");
        let error = i32::from_ne_bytes(buf[4..8].try_into().unwrap());
        let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
        (unique, error, buf[16..n].to_vec())
    }

    fn init(&mut self, minor: u32, flags: u32, flags2: u32) -> (i32, Vec<u8>) {
        let mut body = Vec::new();
        for v in [7u32, minor, 1 << 20, flags, flags2] {
            body.extend_from_slice(&v.to_ne_bytes());
        }
        body.resize(64, 0);
        let unique = self.request(INIT, 0, &body);
        let (u, error, out) = self.answer();
        assert_eq!(u, unique);
        (error, out)
    }
}

fn start(choice: TransportChoice) -> (Kernel, std::thread::JoinHandle<std::io::Result<()>>, OneName) {
    // A sequenced-packet pair: one message per read, and a read of 0 once the peer
    // closes, as /dev/fuse gives ENODEV once unmounted.
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
    let ours = UnixDatagram::from(ours);
    ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let fs = OneName::default();
    let probe = OneName { forgotten: fs.forgotten.clone(), destroyed: fs.destroyed.clone() };
    let session = Session::new(fs, theirs, choice);
    let served = std::thread::spawn(move || session.run());
    (Kernel { socket: ours, unique: 0 }, served, probe)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn init_is_answered_with_the_smaller_version_and_what_the_kernel_offered() {
    let (mut k, served, probe) = start(TransportChoice::Classic);
    let (error, out) = k.init(45, (1 << 0) | (1 << 22) | INIT_EXT, OVER_IO_URING_HIGH);
    assert_eq!(error, 0);
    assert_eq!(out.len(), 64);
    assert_eq!((u32_at(&out, 0), u32_at(&out, 4)), (7, 42), "7.42 at most");
    let flags = u32_at(&out, 12);
    assert_ne!(flags & 1, 0, "ASYNC_READ");
    assert_eq!(flags & (1 << 22), 0, "no MAX_PAGES: requests of 32 pages at most");
    assert_eq!(u32_at(&out, 32) & OVER_IO_URING_HIGH, 0, "io_uring not asked for by a classic session");
    assert_eq!(u32_at(&out, 20), 128 * 1024, "max_write: 32 pages");
    // Requests then answers; FORGET has none; DESTROY ends the session after `destroy`.
    let unique = k.request(LOOKUP, 1, b"hello\0");
    let (u, error, body) = k.answer();
    assert_eq!((u, error, body.len()), (unique, 0, 128), "an entry");
    assert_eq!(u64::from_ne_bytes(body[0..8].try_into().unwrap()), 2);
    k.request(LOOKUP, 1, b"absent\0");
    assert_eq!(k.answer().1, -libc::ENOENT);
    k.request(FORGET, 2, &3u64.to_ne_bytes());
    k.request(GETATTR, 2, &[0u8; 16]);
    assert_eq!(k.answer().1, -libc::ENOSYS, "not implemented; and FORGET was not answered");
    assert_eq!(probe.forgotten.load(Ordering::SeqCst), 3);
    k.request(DESTROY, 0, &[]);
    assert_eq!(k.answer().1, 0);
    served.join().unwrap().unwrap();
    assert!(probe.destroyed.load(Ordering::SeqCst));
}

#[test]
fn io_uring_asked_for_and_not_offered_refuses_the_mount() {
    let (mut k, served, probe) = start(TransportChoice::Uring);
    let (error, _) = k.init(45, 1, 0);
    assert_eq!(error, -libc::EPROTO);
    let e = served.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("enable_uring"), "{e}");
    assert!(!probe.destroyed.load(Ordering::SeqCst), "never started");
}

#[test]
fn an_older_kernel_is_refused() {
    let (mut k, served, _) = start(TransportChoice::Auto);
    let (error, _) = k.init(11, 1, 0);
    assert_eq!(error, -libc::EPROTO);
    assert!(served.join().unwrap().unwrap_err().to_string().contains("7.11"));
}

#[test]
fn malformed_and_unknown_requests_are_refused_and_serving_goes_on() {
    let (mut k, served, probe) = start(TransportChoice::Classic);
    assert_eq!(k.init(45, 1, 0).0, 0);
    // A name without its NUL, a READ shorter than its structure, a WRITE claiming more
    // bytes than it carries, an opcode nobody knows.
    k.request(LOOKUP, 1, b"hello");
    assert_eq!(k.answer().1, -libc::EINVAL);
    k.request(READ, 2, &[0u8; 12]);
    assert_eq!(k.answer().1, -libc::EINVAL);
    let mut write = vec![0u8; 40];
    write[16..20].copy_from_slice(&4096u32.to_ne_bytes());
    write.extend_from_slice(b"short");
    k.request(WRITE, 2, &write);
    assert_eq!(k.answer().1, -libc::EINVAL);
    k.request(9999, 1, &[1, 2, 3]);
    assert_eq!(k.answer().1, -libc::ENOSYS);
    // Random requests of every opcode: each is answered or, for FORGETs, not; never a
    // panic. (A cheap generator: the point is lengths and contents nobody chose.)
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..2000 {
        let opcode = (next() % 60) as u32;
        if [INIT, DESTROY, FORGET, 42 /* BATCH_FORGET */].contains(&opcode) {
            continue;
        }
        let body: Vec<u8> = (0..next() % 200).map(|_| next() as u8).collect();
        let unique = k.request(opcode, next() % 4, &body);
        assert_eq!(k.answer().0, unique, "opcode {opcode} answered");
    }
    k.request(LOOKUP, 1, b"hello\0");
    assert_eq!(k.answer().1, 0, "still serving");
    drop(k);
    served.join().unwrap().unwrap();
    assert!(probe.destroyed.load(Ordering::SeqCst), "destroy runs when the connection goes");
}

#[test]
fn an_io_uring_the_device_refuses_leaves_requests_to_reads_of_it() {
    // The kernel offers io_uring at INIT, but this "device" (a socket) takes no FUSE
    // ring commands: every entry is refused, and the thread reading the device still
    // serves every request.
    let (mut k, served, probe) = start(TransportChoice::Auto);
    let (error, out) = k.init(45, 1 | INIT_EXT, OVER_IO_URING_HIGH);
    assert_eq!(error, 0);
    assert_ne!(u32_at(&out, 32) & OVER_IO_URING_HIGH, 0, "io_uring asked for where offered");
    for _ in 0..50 {
        let unique = k.request(LOOKUP, 1, b"hello\0");
        let (u, error, body) = k.answer();
        assert_eq!((u, error, body.len()), (unique, 0, 128));
    }
    k.request(FORGET, 2, &5u64.to_ne_bytes());
    k.request(DESTROY, 0, &[]);
    assert_eq!(k.answer().1, 0);
    served.join().unwrap().unwrap();
    assert_eq!(probe.forgotten.load(Ordering::SeqCst), 5);
    assert!(probe.destroyed.load(Ordering::SeqCst));
}

#[test]
fn random_requests_never_panic_and_every_answer_is_an_errno_the_kernel_takes() {
    // The fuzz target's body (fuzz/fuzz_targets/fuse_requests.rs) on pseudo-random
    // requests: whole random buffers, and valid headers of every opcode before random
    // arguments of random lengths.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut fs = OneName::default();
    for i in 0..20_000 {
        let len = (next() % 400) as usize;
        let mut request: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if i % 2 == 0 && request.len() >= 40 {
            let opcode = (next() % 60) as u32;
            request[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
            request[4..8].copy_from_slice(&opcode.to_ne_bytes());
            request[24..28].copy_from_slice(&0u32.to_ne_bytes()); // the owner's uid
        }
        if let Some((error, _)) = locus_fuse::serve_one_request(&mut fs, &request) {
            assert!(error == 0 || (-511..=-1).contains(&error), "{error}");
        }
    }
}
