//! A session: FUSE_INIT on a mounted /dev/fuse, then the requests until the mount goes,
//! over the transport chosen at INIT.

use crate::abi::{self, init, op, Args, InHeader};
use crate::classic::{classic, send, Ended};
use crate::{uring, Filesystem, KernelConfig, Notifier, Request};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

/// The transport a session is asked to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// FUSE over io_uring where the kernel offers it, else /dev/fuse reads.
    #[default]
    Auto,
    /// /dev/fuse reads and writes only.
    Classic,
    /// FUSE over io_uring, or no session at all.
    Uring,
}

impl std::str::FromStr for TransportChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(TransportChoice::Auto),
            "classic" => Ok(TransportChoice::Classic),
            "uring" | "io_uring" => Ok(TransportChoice::Uring),
            _ => Err(format!("unknown FUSE transport {s:?}: auto, classic or uring")),
        }
    }
}

/// The transport a session uses, decided at FUSE_INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One `read(2)` of /dev/fuse per request, one `writev(2)` per reply.
    Classic,
    /// Requests in buffers registered on an io_uring, one queue per CPU.
    Uring,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Classic => "/dev/fuse",
            Transport::Uring => "FUSE over io_uring",
        })
    }
}

/// Where the kernel says whether it offers FUSE over io_uring.
pub const URING_SETTING: &str = "/sys/module/fuse/parameters/enable_uring";

/// A file system on a mounted /dev/fuse, ready to serve.
pub struct Session<F: Filesystem> {
    fs: F,
    fuse: Arc<OwnedFd>,
    choice: TransportChoice,
    transport: Arc<OnceLock<Transport>>,
    /// The user whose requests are served (the one running the session); see
    /// `dispatch::allowed`.
    owner: u32,
}

impl<F: Filesystem + Send> Session<F> {
    /// A session serving `fs` on `fuse`, a /dev/fuse descriptor already mounted.
    pub fn new(fs: F, fuse: OwnedFd, choice: TransportChoice) -> Session<F> {
        let owner = rustix::process::geteuid().as_raw();
        Session { fs, fuse: Arc::new(fuse), choice, transport: Arc::new(OnceLock::new()), owner }
    }

    /// Sends notifications (invalidations, stores) to the kernel from any thread.
    pub fn notifier(&self) -> Notifier {
        Notifier { fuse: self.fuse.clone() }
    }

    /// Where the transport chosen at FUSE_INIT appears.
    pub fn transport(&self) -> Arc<OnceLock<Transport>> {
        self.transport.clone()
    }

    /// Serves requests until the file system is unmounted (or the connection aborted),
    /// then calls its `destroy`. Fails only at start-up: a kernel speaking another
    /// protocol, the file system refusing INIT, or io_uring asked for and not offered.
    pub fn run(mut self) -> io::Result<()> {
        let (max_write, queues) = self.init()?;
        let (fd, owner) = (self.fuse.as_raw_fd(), self.owner);
        let ended = match queues {
            Some(queues) => uring::serve(&mut self.fs, queues, fd, max_write, owner),
            None => classic(&Mutex::new(&mut self.fs), fd, max_write, owner),
        };
        if ended != Ended::Destroyed {
            self.fs.destroy();
        }
        Ok(())
    }

    /// Answers FUSE_INIT; gives the largest write the kernel will send and, for FUSE
    /// over io_uring, the rings, made before INIT says so (see `uring`).
    fn init(&mut self) -> io::Result<(u32, Option<uring::Queues>)> {
        let fd = self.fuse.as_raw_fd();
        let mut buf = vec![0u8; 8192 + abi::IN_HEADER];
        let n = loop {
            match rustix::io::read(&*self.fuse, &mut buf) {
                Ok(n) => break n,
                Err(e) if e == rustix::io::Errno::INTR => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let h = InHeader::parse(&buf[..n]).map_err(|_| bad("a short first request from /dev/fuse".into()))?;
        if h.opcode != op::INIT {
            return Err(bad(format!("the kernel's first request is {}, not INIT", abi::op_name(h.opcode))));
        }
        let a = Args { arg: &buf[abi::IN_HEADER..n], rest: &[] };
        let (major, minor) = (a.u32(0).unwrap_or(0), a.u32(4).unwrap_or(0));
        let kernel_readahead = a.u32(8).unwrap_or(0);
        let low = u64::from(a.u32(12).unwrap_or(0));
        let offered = low | if low & init::INIT_EXT != 0 { u64::from(a.u32(16).unwrap_or(0)) << 32 } else { 0 };
        if major != abi::MAJOR || minor < abi::MINOR_MIN {
            let _ = send(fd, h.unique, -libc::EPROTO, &[]);
            return Err(bad(format!(
                "the kernel speaks FUSE {major}.{minor}; this needs 7.{} or later",
                abi::MINOR_MIN
            )));
        }
        let mut config = KernelConfig {
            max_write: 128 * 1024,
            max_readahead: kernel_readahead,
            kernel_max_readahead: kernel_readahead,
        };
        if let Err(e) = self.fs.init(&Request { header: &h }, &mut config) {
            let errno = if (1..512).contains(&e) { e } else { libc::EIO };
            let _ = send(fd, h.unique, -errno, &[]);
            return Err(io::Error::from_raw_os_error(errno));
        }
        let uring_offered = offered & init::OVER_IO_URING != 0;
        let mut transport = match self.choice {
            TransportChoice::Classic => Transport::Classic,
            TransportChoice::Auto if uring_offered => Transport::Uring,
            TransportChoice::Auto => Transport::Classic,
            TransportChoice::Uring if uring_offered => Transport::Uring,
            TransportChoice::Uring => {
                let _ = send(fd, h.unique, -libc::EPROTO, &[]);
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "FUSE over io_uring is not offered by this kernel (Linux 6.14 or later built with \
                         CONFIG_FUSE_IO_URING, and {URING_SETTING} set to Y)"
                    ),
                ));
            }
        };
        // Requests of at most 32 pages (the kernel's default without FUSE_MAX_PAGES, and
        // what the mount was built and measured with).
        let page = uring::page_size();
        let max_write = config.max_write.min(32 * page as u32);
        let queues = if transport == Transport::Uring {
            // A payload holds the largest request or reply, as the kernel checks.
            match uring::Queues::prepare(fd, (max_write as usize).max(8192).max(32 * page)) {
                Ok(queues) => Some(queues),
                Err(e) if self.choice == TransportChoice::Uring => {
                    let _ = send(fd, h.unique, -libc::EPROTO, &[]);
                    return Err(io::Error::new(e.kind(), format!("FUSE over io_uring: making its rings: {e}")));
                }
                Err(e) => {
                    tracing::warn!("FUSE over io_uring: making its rings: {e}; serving /dev/fuse reads instead");
                    transport = Transport::Classic;
                    None
                }
            }
        } else {
            None
        };
        let mut want = init::ASYNC_READ | init::BIG_WRITES;
        if transport == Transport::Uring {
            want |= init::INIT_EXT | init::OVER_IO_URING;
        }
        let flags = want & offered;
        let mut out: Vec<u8> = Vec::with_capacity(64);
        use abi::Put;
        out.u32(abi::MAJOR);
        out.u32(minor.min(abi::MINOR));
        out.u32(config.max_readahead);
        out.u32(flags as u32);
        out.u16(16); // max_background
        out.u16(12); // congestion_threshold
        out.u32(max_write);
        out.u32(1); // time_gran: nanoseconds
        out.u16(0); // max_pages: read only with FUSE_MAX_PAGES
        out.u16(0); // map_alignment
        out.u32((flags >> 32) as u32);
        out.resize(64, 0);
        send(fd, h.unique, 0, &out)?;
        tracing::info!("FUSE {major}.{minor}: serving by {transport}, writes of up to {max_write} bytes");
        let _ = self.transport.set(transport);
        Ok((max_write, queues))
    }
}
