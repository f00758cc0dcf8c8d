//! The Chirp protocol (CCTools' `chirp_server`): text commands, one per line, answered
//! by a line holding a result code (negative: an error), with bulk data after it.
//!
//! [`ChirpClient`] speaks the `address` authentication method and the operations the
//! driver and the benchmarks use. [`ChirpDriver`] puts it behind the [`Driver`] trait.
//! A chirp_server closes the connection when it cannot map an errno (ENODATA, or EBUSY
//! from removing a mount point): the call that provoked it fails with `EIO`, and the
//! next call connects again. It also closes connections that stay idle (`-t`), and its
//! per-connection process can go away: a call that loses its connection is sent again
//! once on a fresh one if running it twice is harmless (reads, writes at an offset,
//! setting attributes), or if the connection had been idle, so the server dropped it
//! unread (creating, removing, renaming). Files stay open across connections: a handle is opened
//! again by its path (without create, truncate or exclusive) on the next connection that
//! needs it; if that fails, the handle is stale (`ESTALE`).
//!
//! Nothing a server says is trusted: lines are bounded, a count of bytes to follow may
//! not exceed what was asked for, and listings are bounded; a server that breaks these
//! gets `EPROTO` and its connection is dropped.

use crate::{Attr, DirEntry, Driver, DriverError, Opened, Result, SetTime, StatFs};
use locus_proto::chirp;
use locus_proto::types::open_flags;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest line accepted from a server (a result, a stat line, a name in a listing).
const MAX_LINE: u64 = chirp::MAX_LINE as u64;
/// Most entries accepted in one directory listing.
const MAX_ENTRIES: usize = 1 << 20;

/// A connection to a chirp_server.
pub struct ChirpClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// Set once the connection failed mid-call: it cannot be used again.
    lost: bool,
}

/// Result of a Chirp call: errors carry the negative code's errno when there is one.
pub type ChirpResult<T> = std::result::Result<T, String>;

impl ChirpClient {
    /// Connects and authenticates by network address.
    pub fn connect(addr: SocketAddr) -> ChirpResult<ChirpClient> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("chirp connect: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        let writer = s.try_clone().map_err(|e| e.to_string())?;
        let mut c = ChirpClient { reader: BufReader::with_capacity(1 << 20, s), writer, lost: false };
        c.writer.write_all(b"address\n").map_err(|e| e.to_string())?;
        // The server answers "yes" until it names the method and the subject it accepted.
        loop {
            let line = c.line()?;
            if line == "address" {
                c.line()?; // the subject
                return Ok(c);
            }
            if line != "yes" {
                return Err(format!("chirp auth refused: {line}"));
            }
        }
    }

    /// False once the server has closed the connection (nothing is pending on a healthy
    /// idle one, so a peek that finds end of file means closed).
    fn is_open(&self) -> bool {
        let s = self.reader.get_ref();
        if !self.reader.buffer().is_empty() || s.set_nonblocking(true).is_err() {
            return true;
        }
        let mut b = [0u8; 1];
        let open = match s.peek(&mut b) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        };
        let _ = s.set_nonblocking(false);
        open
    }

    fn line(&mut self) -> ChirpResult<String> {
        let mut s = String::new();
        match (&mut self.reader).take(MAX_LINE).read_line(&mut s) {
            Ok(0) => Err("chirp server closed the connection".into()),
            Ok(_) if !s.ends_with('\n') => Err(format!("chirp: a line of more than {MAX_LINE} bytes, or cut short")),
            Ok(_) => Ok(s.trim_end_matches('\n').to_string()),
            Err(e) => Err(format!("chirp: {e}")),
        }
    }

    /// Checks a count of bytes the server is about to send against the `asked` for; a
    /// larger one is a broken server, whose connection cannot be trusted further.
    fn within(&mut self, n: i64, asked: usize) -> Result<usize> {
        match usize::try_from(n) {
            Ok(n) if n <= asked => Ok(n),
            _ => {
                self.lost = true;
                Err(DriverError::errno(
                    libc::EPROTO,
                    format!("chirp server announced {n} bytes where {asked} were asked"),
                ))
            }
        }
    }

    /// An I/O failure mid-call: the connection is lost (chirp_server closes it after an
    /// error it cannot map to a code).
    fn lost(&mut self, e: impl std::fmt::Display) -> DriverError {
        self.lost = true;
        DriverError::errno(libc::EIO, format!("chirp server dropped the connection: {e}"))
    }

    /// Reads the result line of `what`; negative codes become their errno.
    fn reply(&mut self, what: &str) -> Result<i64> {
        let line = self.line().map_err(|e| self.lost(e))?;
        let n: i64 = line.trim().parse().map_err(|_| DriverError::errno(libc::EPROTO, format!("chirp: {line:?}")))?;
        if n < 0 {
            return Err(chirp_error(n, what));
        }
        Ok(n)
    }

    /// Sends a command line and its bulk data; answers its result.
    fn send(&mut self, cmd: &str, data: &[u8]) -> Result<i64> {
        if let Err(e) = self.writer.write_all(cmd.as_bytes()).and_then(|()| self.writer.write_all(data)) {
            return Err(self.lost(e));
        }
        self.reply(cmd.trim_end())
    }

    /// Sends a command line; answers its result.
    fn call(&mut self, cmd: &str) -> Result<i64> {
        self.send(cmd, &[])
    }

    fn data_line(&mut self) -> Result<String> {
        self.line().map_err(|e| self.lost(e))
    }

    fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        if let Err(e) = self.reader.read_exact(&mut buf) {
            return Err(self.lost(e));
        }
        Ok(buf)
    }

    /// [`ChirpClient::call`] with the error as a message, for the simple client API.
    fn command(&mut self, cmd: &str) -> ChirpResult<i64> {
        self.call(cmd).map_err(|e| e.message)
    }

    /// `stat`: returns the size.
    pub fn stat(&mut self, path: &str) -> ChirpResult<u64> {
        self.command(&format!("stat {path}\n"))?;
        let fields = self.line()?;
        fields.split_whitespace().nth(7).and_then(|s| s.parse().ok()).ok_or_else(|| "chirp: bad stat line".into())
    }

    /// `open` with Chirp flag letters (`r`, `w`, `rw`, `c`, `t`, ...); returns the fd.
    pub fn open(&mut self, path: &str, flags: &str, mode: u32) -> ChirpResult<i64> {
        let fd = self.command(&format!("open {path} {flags} {mode}\n"))?;
        self.line()?; // attributes of the opened file
        Ok(fd)
    }

    /// `close`.
    pub fn close(&mut self, fd: i64) -> ChirpResult<()> {
        self.command(&format!("close {fd}\n")).map(|_| ())
    }

    /// `pread` into `buf`; returns the count read.
    pub fn pread(&mut self, fd: i64, buf: &mut [u8], offset: u64) -> ChirpResult<usize> {
        let n = self.command(&format!("pread {fd} {} {offset}\n", buf.len()))?;
        let n = self.within(n, buf.len()).map_err(|e| e.message)?;
        self.reader.read_exact(&mut buf[..n]).map_err(|e| self.lost(e).message)?;
        Ok(n)
    }

    /// `pwrite`; returns the count written.
    pub fn pwrite(&mut self, fd: i64, data: &[u8], offset: u64) -> ChirpResult<usize> {
        let n = self.send(&format!("pwrite {fd} {} {offset}\n", data.len()), data).map_err(|e| e.message)?;
        Ok(n as usize)
    }

    /// `getfile`: streams a whole file into `sink`; returns its length.
    pub fn getfile(&mut self, path: &str, sink: &mut impl Write) -> ChirpResult<u64> {
        let len = self.command(&format!("getfile {path}\n"))? as u64;
        let copied = std::io::copy(&mut (&mut self.reader).take(len), sink).map_err(|e| e.to_string())?;
        if copied != len {
            return Err("chirp: short getfile".into());
        }
        Ok(len)
    }

    /// `putfile`: sends `len` bytes from `source` as a whole file.
    pub fn putfile(&mut self, path: &str, mode: u32, len: u64, source: &mut impl Read) -> ChirpResult<()> {
        self.command(&format!("putfile {path} {mode} {len}\n"))?;
        let sent = std::io::copy(&mut source.take(len), &mut self.writer).map_err(|e| e.to_string())?;
        if sent != len {
            return Err("chirp: short putfile source".into());
        }
        self.reply("putfile").map(drop).map_err(|e| e.message)
    }
}

/// The error for a negative Chirp result code: its errno, or a transient error when the
/// server says it is offline or disconnected.
fn chirp_error(code: i64, cmd: &str) -> DriverError {
    match chirp::errno_of_code(code) {
        Some(errno) => DriverError::errno(errno, format!("{cmd}: chirp error {code}")),
        None => DriverError::transient(format!("{cmd}: chirp server offline ({code})")),
    }
}

/// A Chirp stat line as attributes.
fn parse_attr(line: &str) -> Result<Attr> {
    chirp::parse_stat_line(line)
        .ok_or_else(|| DriverError::errno(libc::EPROTO, format!("chirp: bad stat line {line:?}")))
}

/// A chirp_server behind the [`Driver`] trait.
pub struct ChirpDriver {
    addr: SocketAddr,
    conn: Option<ChirpClient>,
    /// Open files by the handle this driver gave out.
    files: HashMap<u64, OpenFile>,
    next_handle: u64,
    last_used: Instant,
}

/// An open file: how to open it again, and its descriptor on the current connection.
struct OpenFile {
    path: String,
    /// Chirp's open letters, without those that only make sense once (create, truncate,
    /// exclusive).
    reopen: String,
    mode: u32,
    fd: Option<i64>,
}

/// Idle time after which a connection is checked for having been closed by the server.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// A call that finds the connection closed after at least this long idle is sent again:
/// the server dropped the connection for idling, not because of the call.
const IDLE_RETRY: Duration = Duration::from_millis(250);

/// When a call that lost its connection is sent again on a new one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Redo {
    /// Always: running it twice does what running it once does (reads, writes at an
    /// offset, setting attributes).
    Always,
    /// Only when the connection had been idle, so the server dropped it unread (creating,
    /// removing and renaming, whose second run would fail where the first succeeded).
    AfterPause,
}

impl ChirpDriver {
    /// Connects to `chirp://HOST:PORT/path`; returns the driver and the path.
    pub fn connect(url: &str) -> Result<(ChirpDriver, String)> {
        let rest =
            url.strip_prefix("chirp://").ok_or_else(|| DriverError::errno(libc::EINVAL, "not a chirp:// URL"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let authority = if authority.contains(':') { authority.to_string() } else { format!("{authority}:9094") };
        let addr = authority
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| DriverError::errno(libc::EINVAL, format!("{url}: cannot resolve {authority}")))?;
        let mut d = ChirpDriver { addr, conn: None, files: HashMap::new(), next_handle: 1, last_used: Instant::now() };
        d.conn()?;
        Ok((d, path))
    }

    fn conn(&mut self) -> Result<&mut ChirpClient> {
        // chirp_server closes connections that stay idle (for a second at the least):
        // after a pause, look before sending, so that the call goes on a fresh connection
        // instead of failing. Busy connections skip the look.
        if self.last_used.elapsed() > IDLE_CHECK && self.conn.as_ref().is_some_and(|c| !c.is_open()) {
            self.conn = None;
        }
        self.last_used = Instant::now();
        if self.conn.is_none() {
            let c = ChirpClient::connect(self.addr).map_err(DriverError::transient)?;
            for f in self.files.values_mut() {
                f.fd = None;
            }
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("connected"))
    }

    /// Runs `f` on the connection; a dropped connection is forgotten so the next call
    /// reconnects, and the call runs once more on a new one as `redo` allows.
    fn with<T>(&mut self, redo: Redo, f: impl Fn(&mut ChirpClient) -> Result<T>) -> Result<T> {
        self.with_file(None, redo, |c, _| f(c))
    }

    /// [`ChirpDriver::with`] for a call on an open file: `f` gets the file's descriptor
    /// on the current connection, opening the file again there if needed.
    fn with_file<T>(
        &mut self,
        handle: Option<u64>,
        redo: Redo,
        f: impl Fn(&mut ChirpClient, i64) -> Result<T>,
    ) -> Result<T> {
        let idle = self.last_used.elapsed();
        let r = self.attempt(handle, &f);
        let lost = r.is_err() && self.conn.is_none();
        if lost && (redo == Redo::Always || idle >= IDLE_RETRY) {
            return self.attempt(handle, &f);
        }
        r
    }

    /// One try of a call: connects if needed, finds the file's descriptor, runs `f`, and
    /// forgets the connection if it was lost on the way.
    fn attempt<T>(&mut self, handle: Option<u64>, f: &impl Fn(&mut ChirpClient, i64) -> Result<T>) -> Result<T> {
        self.conn()?;
        let r = match handle {
            Some(h) => self.descriptor(h).and_then(|fd| f(self.conn.as_mut().expect("connected"), fd)),
            None => f(self.conn.as_mut().expect("connected"), -1),
        };
        if self.conn.as_ref().is_some_and(|c| c.lost) {
            self.conn = None;
        }
        r
    }

    /// The descriptor of `handle` on the current connection.
    fn descriptor(&mut self, handle: u64) -> Result<i64> {
        let file =
            self.files.get_mut(&handle).ok_or_else(|| DriverError::errno(libc::EBADF, "no such open chirp file"))?;
        if let Some(fd) = file.fd {
            return Ok(fd);
        }
        let c = self.conn.as_mut().expect("connected");
        let fd = match c.call(&format!("open {} {} {}\n", chirp::encode_path(&file.path), file.reopen, file.mode)) {
            Ok(fd) => fd,
            Err(e) if c.lost => return Err(e),
            Err(e) => {
                let why = format!("{} could not be opened again on a new connection: {}", file.path, e.message);
                return Err(DriverError::errno(libc::ESTALE, why));
            }
        };
        c.data_line()?;
        file.fd = Some(fd);
        Ok(fd)
    }

    fn simple(&mut self, redo: Redo, cmd: String) -> Result<()> {
        self.with(redo, |c| c.call(&cmd).map(drop))
    }

    /// A command on an open file with nothing to answer but its result code.
    fn file_call(&mut self, handle: u64, cmd: impl Fn(i64) -> String) -> Result<()> {
        self.with_file(Some(handle), Redo::Always, |c, fd| c.call(&cmd(fd)).map(drop))
    }
}

fn unix_time(t: SetTime, now: i64) -> i64 {
    match t {
        SetTime::Omit | SetTime::Now => now,
        SetTime::At(t) => t.sec,
    }
}

impl Driver for ChirpDriver {
    fn name(&self) -> &'static str {
        "chirp"
    }

    fn lstat(&mut self, path: &str) -> Result<Attr> {
        self.with(Redo::Always, |c| {
            c.call(&format!("lstat {}\n", chirp::encode_path(path)))?;
            parse_attr(&c.data_line()?)
        })
    }

    fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>> {
        self.with(Redo::Always, |c| {
            c.call(&format!("getlongdir {}\n", chirp::encode_path(path)))?;
            let mut out = Vec::new();
            loop {
                let name = c.data_line()?;
                if name.is_empty() {
                    return Ok(out);
                }
                let attr = parse_attr(&c.data_line()?)?;
                if name != "." && name != ".." {
                    if out.len() == MAX_ENTRIES {
                        c.lost = true;
                        let why = format!("{path}: more than {MAX_ENTRIES} entries from the chirp server");
                        return Err(DriverError::errno(libc::EFBIG, why));
                    }
                    out.push(DirEntry { name, attr });
                }
            }
        })
    }

    fn open(&mut self, path: &str, flags: u32, mode: u32) -> Result<Opened> {
        let mut letters = String::new();
        let mut reopen = String::new();
        for (bit, letter, again) in [
            (open_flags::READ, 'r', true),
            (open_flags::WRITE, 'w', true),
            (open_flags::APPEND, 'a', true),
            (open_flags::TRUNCATE, 't', false),
            (open_flags::CREATE, 'c', false),
            (open_flags::EXCLUSIVE, 'x', false),
        ] {
            if flags & bit != 0 {
                letters.push(letter);
                if again {
                    reopen.push(letter);
                }
            }
        }
        let cmd = format!("open {} {letters} {mode}\n", chirp::encode_path(path));
        // An exclusive create must not run twice: the second would find the file there.
        let redo = if flags & open_flags::EXCLUSIVE != 0 { Redo::AfterPause } else { Redo::Always };
        let (fd, attr) = self.with(redo, |c| {
            let fd = c.call(&cmd)?;
            Ok((fd, parse_attr(&c.data_line()?)?))
        })?;
        let handle = self.next_handle;
        self.next_handle += 1;
        self.files.insert(handle, OpenFile { path: path.to_string(), reopen, mode, fd: Some(fd) });
        Ok(Opened { handle, attr, location: None })
    }

    fn close(&mut self, handle: u64) -> Result<()> {
        // Connect first: a new connection leaves every file unopened on it.
        self.conn()?;
        let file =
            self.files.remove(&handle).ok_or_else(|| DriverError::errno(libc::EBADF, "no such open chirp file"))?;
        let Some(fd) = file.fd else {
            return Ok(()); // not open on this connection: nothing to close at the server
        };
        let c = self.conn.as_mut().expect("connected");
        match c.call(&format!("close {fd}\n")) {
            // The server closes a lost connection's files itself.
            Err(_) if c.lost => {
                self.conn = None;
                Ok(())
            }
            r => r.map(drop),
        }
    }

    fn fstat(&mut self, handle: u64) -> Result<Attr> {
        self.with_file(Some(handle), Redo::Always, |c, fd| {
            c.call(&format!("fstat {fd}\n"))?;
            parse_attr(&c.data_line()?)
        })
    }

    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.with_file(Some(handle), Redo::Always, |c, fd| {
            let n = c.call(&format!("pread {fd} {len} {offset}\n"))?;
            let n = c.within(n, len as usize)?;
            c.bytes(n)
        })
    }

    fn pwrite(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<u64> {
        self.with_file(Some(handle), Redo::Always, |c, fd| {
            c.send(&format!("pwrite {fd} {} {offset}\n", data.len()), data).map(|n| n as u64)
        })
    }

    fn ftruncate(&mut self, handle: u64, size: u64) -> Result<()> {
        self.file_call(handle, |fd| format!("ftruncate {fd} {size}\n"))
    }

    fn fsync(&mut self, handle: u64) -> Result<()> {
        self.file_call(handle, |fd| format!("fsync {fd}\n"))
    }

    fn mkdir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.simple(Redo::AfterPause, format!("mkdir {} {mode}\n", chirp::encode_path(path)))
    }

    fn rmdir(&mut self, path: &str) -> Result<()> {
        self.simple(Redo::AfterPause, format!("rmdir {}\n", chirp::encode_path(path)))
    }

    fn unlink(&mut self, path: &str) -> Result<()> {
        self.simple(Redo::AfterPause, format!("unlink {}\n", chirp::encode_path(path)))
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        self.simple(Redo::AfterPause, format!("rename {} {}\n", chirp::encode_path(from), chirp::encode_path(to)))
    }

    fn symlink(&mut self, target: &str, path: &str) -> Result<()> {
        self.simple(Redo::AfterPause, format!("symlink {} {}\n", chirp::encode_path(target), chirp::encode_path(path)))
    }

    fn readlink(&mut self, path: &str) -> Result<String> {
        self.with(Redo::Always, |c| {
            let n = c.call(&format!("readlink {} 4096\n", chirp::encode_path(path)))?;
            let n = c.within(n, 4096)?;
            String::from_utf8(c.bytes(n)?).map_err(|_| DriverError::errno(libc::EILSEQ, "link target is not UTF-8"))
        })
    }

    fn link(&mut self, from: &str, to: &str) -> Result<()> {
        self.simple(Redo::AfterPause, format!("link {} {}\n", chirp::encode_path(from), chirp::encode_path(to)))
    }

    fn truncate(&mut self, path: &str, size: u64) -> Result<()> {
        self.simple(Redo::Always, format!("truncate {} {size}\n", chirp::encode_path(path)))
    }

    fn chmod(&mut self, path: &str, mode: u32) -> Result<()> {
        self.simple(Redo::Always, format!("chmod {} {mode}\n", chirp::encode_path(path)))
    }

    fn utimes(&mut self, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let (a, m) = (unix_time(atime, now), unix_time(mtime, now));
        self.simple(Redo::Always, format!("utime {} {a} {m}\n", chirp::encode_path(path)))
    }

    fn statfs(&mut self, path: &str) -> Result<StatFs> {
        self.with(Redo::Always, |c| {
            c.call(&format!("statfs {}\n", chirp::encode_path(path)))?;
            let line = c.data_line()?;
            chirp::parse_statfs_line(&line)
                .ok_or_else(|| DriverError::errno(libc::EPROTO, format!("chirp: bad statfs line {line:?}")))
        })
    }

    fn access(&mut self, path: &str, mode: u32) -> Result<()> {
        self.simple(Redo::Always, format!("access {} {mode}\n", chirp::encode_path(path)))
    }
}
