//! The Chirp endpoint (`locus serve --chirp-port P`): CCTools' `chirp` tool, `parrot_run`
//! and other Chirp clients reach the export as they reach a `chirp_server`.
//!
//! **Subjects.** A client authenticates by one of the methods in [`ChirpConfig::methods`]
//! and becomes the subject `METHOD:NAME`, spelled as Chirp spells it: `unix:alice` (the
//! owner of a file the client made where the server asked, so both must share that
//! directory, as on one host), `hostname:node7.example.org` (the reverse lookup of the
//! client's address, accepted only when that name resolves back to the address),
//! `address:10.0.0.7`. These host subjects hold exactly what ACL entries naming them or
//! matching them as Chirp patterns grant (`locus acl set / unix:alice rwl`,
//! `address:10.0.* rl`), and nothing by default: `*` never matches them, it stays "any
//! subject holding a Locus token" ([`locus_proto::types::acl_subject_matches`]). Chirp's
//! `ticket` and `globus` methods are not offered.
//!
//! **Commands.** Each command runs as a request of a [`Session`] acting as the subject,
//! so ACL checks, callback breaks, I/O accounting and metrics (under the native
//! operation's name) are those of the native protocol. Chirp's `open` returns the
//! session's handle as its descriptor. Active files are not run for Chirp clients.
//!
//! **Untrusted input.** Lines are bounded by [`chirp::MAX_LINE`] as the Chirp driver
//! bounds a server's; a longer one ends the connection. Counts never size an allocation
//! beyond the server's data limit: reads are clamped to it, writes beyond it are
//! consumed and reported short (as `chirp_server` does), files stream through a fixed
//! buffer. Each connection has its own thread (as `chirp_server` has a process each);
//! at most `max_connections` at once, and one idle for [`ChirpConfig::idle`] is closed.

use crate::dispatch::{Answer, Handler};
use crate::session::Session;
use crate::transport::Body;
use crate::Shared;
use bytes::Bytes;
use locus_proto::chirp::{self, code, Command, ParseError};
use locus_proto::ops::*;
use locus_proto::types::{SetTime, Time};
use locus_proto::{Code, Error as WireError, Operation};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A way for a Chirp client to prove who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// The client creates a file the server names; its owner's user name is the subject.
    Unix,
    /// The reverse DNS name of the client's address.
    Hostname,
    /// The client's IP address.
    Address,
}

impl AuthMethod {
    /// Every method, in the order a listing shows them.
    pub const ALL: [AuthMethod; 3] = [AuthMethod::Unix, AuthMethod::Hostname, AuthMethod::Address];

    /// The method's name on the wire, and the prefix of its subjects.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::Unix => "unix",
            AuthMethod::Hostname => "hostname",
            AuthMethod::Address => "address",
        }
    }

    /// The method called `name`, if Locus offers it.
    pub fn parse(name: &str) -> Option<AuthMethod> {
        AuthMethod::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// How the endpoint authenticates and how long it keeps idle clients.
#[derive(Clone, Debug)]
pub struct ChirpConfig {
    /// The methods clients may use.
    pub methods: Vec<AuthMethod>,
    /// Where `unix` clients are asked to create their challenge file.
    pub challenge_dir: PathBuf,
    /// A connection that sends nothing for this long is closed (Chirp clients reconnect).
    pub idle: Duration,
}

impl Default for ChirpConfig {
    fn default() -> Self {
        ChirpConfig { methods: AuthMethod::ALL.to_vec(), challenge_dir: "/tmp".into(), idle: Duration::from_secs(60) }
    }
}

/// Serves Chirp clients from `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, config: ChirpConfig) {
    let config = Arc::new(config);
    let live = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Handle::current();
    loop {
        let Ok((sock, peer)) = listener.accept().await else { continue };
        if live.load(Ordering::SeqCst) >= shared.config.max_connections {
            tracing::warn!(%peer, "chirp: refused, {} connections already", shared.config.max_connections);
            continue;
        }
        let Ok(sock) = sock.into_std() else { continue };
        let (shared, config, live2, runtime) = (shared.clone(), config.clone(), live.clone(), runtime.clone());
        live.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new().name("locus-chirp".into()).spawn(move || {
            // Sessions may reach tokio (callback pushes); the thread runs inside the runtime.
            let _entered = runtime.enter();
            if let Err(e) = serve_connection(sock, peer, shared, &config) {
                tracing::debug!(%peer, "chirp connection ended: {e}");
            }
            live2.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Authenticates one client and runs its commands until it leaves.
fn serve_connection(sock: TcpStream, peer: SocketAddr, shared: Arc<Shared>, config: &ChirpConfig) -> io::Result<()> {
    sock.set_nonblocking(false)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(config.idle))?;
    let mut conn = Conn {
        reader: BufReader::with_capacity(1 << 16, sock.try_clone()?),
        writer: BufWriter::with_capacity(1 << 16, sock),
    };
    let Some(subject) = conn.authenticate(peer, config)? else { return Ok(()) };
    tracing::debug!(%peer, %subject, "chirp client authenticated");
    let max_data = shared.config.limits.max_data.min(locus_proto::Limits::CLIENT.max_data) as usize;
    let mut client = Client { session: Session::acting_as(shared.clone(), &subject), subject, shared, conn, max_data };
    client.run()
}

/// A connection's byte streams.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

/// How a command failed: with an error the client is told, or with the connection.
enum Failed {
    Call(WireError),
    Io(io::Error),
}

impl From<WireError> for Failed {
    fn from(e: WireError) -> Self {
        Failed::Call(e)
    }
}

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Self {
        Failed::Io(e)
    }
}

type Done = Result<(), Failed>;

impl Conn {
    /// One line without its newline; `None` at end of input. A line longer than
    /// [`chirp::MAX_LINE`] or not UTF-8 is an error (the stream cannot be trusted after).
    fn line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        let n = (&mut self.reader).take(chirp::MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        if buf.last() != Some(&b'\n') {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a line longer than the Chirp limit, or cut short"));
        }
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        String::from_utf8(buf).map(Some).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a line not in UTF-8"))
    }

    fn send(&mut self, text: &str) -> io::Result<()> {
        self.writer.write_all(text.as_bytes())
    }

    /// Chirp's handshake: the client names methods until one succeeds. Answers the
    /// subject, or `None` if the client gave up or left.
    fn authenticate(&mut self, peer: SocketAddr, config: &ChirpConfig) -> io::Result<Option<String>> {
        // A client names each method once; more lines than that are not a real client.
        for _ in 0..16 {
            let Some(name) = self.line()? else { return Ok(None) };
            let method = AuthMethod::parse(&name).filter(|m| config.methods.contains(m));
            let Some(method) = method else {
                self.send("no\n")?;
                self.writer.flush()?;
                continue;
            };
            self.send("yes\n")?;
            // An IPv4 client of a dual-stack listener is named by its IPv4 address.
            let ip = peer.ip().to_canonical();
            let name = match method {
                AuthMethod::Address => Some(ip.to_string()),
                AuthMethod::Hostname => confirmed_hostname(
                    ip,
                    |ip| dns_lookup::lookup_addr(ip).ok(),
                    |name| dns_lookup::lookup_host(name).unwrap_or_default(),
                ),
                AuthMethod::Unix => match self.unix_challenge(config)? {
                    // The client gave up on the challenge: Chirp answers nothing to that.
                    Challenge::Declined => continue,
                    Challenge::Owner(name) => name,
                },
            };
            let name = name.map(|n| sanitize(&n));
            match name.filter(|n| locus_store::Acl::valid_subject(&format!("{}:{n}", method.name()))) {
                Some(name) => {
                    // The method's own "yes", then the handshake's verdict: method and name.
                    self.send(&format!("yes\nyes\n{}\n{name}\n", method.name()))?;
                    self.writer.flush()?;
                    return Ok(Some(format!("{}:{name}", method.name())));
                }
                None => {
                    self.send("no\n")?;
                    self.writer.flush()?;
                }
            }
        }
        Ok(None)
    }

    /// The `unix` method: names a file the client must create, and answers the user name
    /// of its owner. The name is random and must not exist before; the file must be a
    /// regular file (not a link someone planted), and is removed either way.
    fn unix_challenge(&mut self, config: &ChirpConfig) -> io::Result<Challenge> {
        let mut id = [0u8; 12];
        getrandom::fill(&mut id).expect("the OS provides randomness");
        let path = config.challenge_dir.join(format!("locus-chirp-challenge.{}", hex::encode(id)));
        if path.symlink_metadata().is_ok() {
            return Ok(Challenge::Owner(None));
        }
        self.send(&format!("{}\n", path.display()))?;
        self.writer.flush()?;
        if self.line()?.as_deref() != Some("yes") {
            let _ = std::fs::remove_file(&path);
            return Ok(Challenge::Declined);
        }
        let owner = match path.symlink_metadata() {
            Ok(meta) if meta.file_type().is_file() => {
                use std::os::unix::fs::MetadataExt;
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid())).ok().flatten().map(|u| u.name)
            }
            _ => None,
        };
        let _ = std::fs::remove_file(&path);
        Ok(Challenge::Owner(owner))
    }
}

/// How a `unix` challenge ended.
enum Challenge {
    /// The client did not create the file (it says so and tries another method).
    Declined,
    /// The owner's user name, or none if the file is not there, not a regular file, or
    /// owned by a uid with no name.
    Owner(Option<String>),
}

/// The `hostname` method's name for a peer at `ip`: the reverse lookup of `ip`
/// (`reverse`), accepted only when looking that name up (`forward`) gives `ip` back
/// (forward-confirmed reverse DNS), so whoever controls a PTR record cannot claim
/// another domain's names. The name must look like a host name (letters, digits, `-`,
/// `.`, `_`; not an address); it is lower-cased. `None` fails the method, and the client
/// may try another.
fn confirmed_hostname(
    ip: IpAddr,
    reverse: impl Fn(&IpAddr) -> Option<String>,
    forward: impl Fn(&str) -> Vec<IpAddr>,
) -> Option<String> {
    let name = reverse(&ip)?.trim_end_matches('.').to_ascii_lowercase();
    let shaped = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if !shaped || name.parse::<IpAddr>().is_ok() {
        return None;
    }
    forward(&name).into_iter().any(|a| a.to_canonical() == ip).then_some(name)
}

/// Chirp's rule for subject names: spaces and unprintable characters become `_`.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_whitespace() || c.is_control() { '_' } else { c }).collect()
}

/// An authenticated client: its session and connection.
struct Client {
    session: Session,
    subject: String,
    shared: Arc<Shared>,
    conn: Conn,
    /// The most bytes one read or write moves.
    max_data: usize,
}

/// The only answer of a handler for a request that is never deferred (Chirp sessions
/// run no active files and hold no callbacks, so nothing answers later).
fn only<T>(answer: Answer<T>) -> Result<T, WireError> {
    let mut pages = answer.pages.into_iter();
    match (answer.later, pages.next()) {
        (None, Some(meta)) => Ok(meta),
        _ => Err(WireError::new(Code::NOTSUP, "this request cannot be answered over Chirp")),
    }
}

/// Every page of a paged answer, as one list.
fn all<T>(answer: Answer<Vec<T>>) -> Vec<T> {
    answer.pages.into_iter().flatten().collect()
}

/// The native operation a command counts as in the metrics.
fn op_of(cmd: &Command) -> u16 {
    match cmd {
        Command::Whoami { .. } => Whoami::INFO.code,
        Command::Stat { .. } => Stat::INFO.code,
        Command::Lstat { .. } => Lstat::INFO.code,
        Command::Fstat { .. } => Fstat::INFO.code,
        Command::Open { .. } => Open::INFO.code,
        Command::Close { .. } => Close::INFO.code,
        Command::Pread { .. } => Pread::INFO.code,
        Command::Pwrite { .. } => Pwrite::INFO.code,
        Command::Fsync { .. } => Fsync::INFO.code,
        Command::Ftruncate { .. } => Ftruncate::INFO.code,
        Command::Fstatfs { .. } | Command::Statfs { .. } => Statfs::INFO.code,
        Command::Getfile { .. } | Command::Hash { .. } => Get::INFO.code,
        Command::Putfile { .. } => PutCached::INFO.code,
        Command::Getdir { .. } | Command::Getlongdir { .. } => Readdir::INFO.code,
        Command::Mkdir { .. } => Mkdir::INFO.code,
        Command::Rmdir { .. } => Rmdir::INFO.code,
        Command::Unlink { .. } | Command::Rmall { .. } => Unlink::INFO.code,
        Command::Rename { .. } => Rename::INFO.code,
        Command::Link { .. } => Link::INFO.code,
        Command::Symlink { .. } => Symlink::INFO.code,
        Command::Readlink { .. } => Readlink::INFO.code,
        Command::Truncate { .. } => Truncate::INFO.code,
        Command::Chmod { .. } => Chmod::INFO.code,
        Command::Chown { .. } | Command::Access { .. } => Access::INFO.code,
        Command::Utime { .. } => Utimes::INFO.code,
        Command::Getacl { .. } => AclGet::INFO.code,
        Command::Setacl { .. } => AclSet::INFO.code,
    }
}

/// Bytes a file moves through per step of `putfile` and `hash`.
const CHUNK: usize = 1 << 20;

/// Bytes per step of `getfile`: small enough to stay in the CPU's caches between the
/// file's read and the socket's write (64 KiB measured faster than 256 KiB, 1 MiB and
/// sendfile with the `chirp` tool as client).
const COPY_CHUNK: usize = 64 << 10;

impl Client {
    /// Reads and answers commands until the client leaves or breaks the protocol.
    fn run(&mut self) -> io::Result<()> {
        loop {
            let Some(line) = self.conn.line()? else { return Ok(()) };
            if line.is_empty() {
                continue;
            }
            if line.starts_with('\x04') {
                return Ok(()); // end of transmission
            }
            match chirp::parse_command(&line) {
                Ok(cmd) => {
                    let op = op_of(&cmd);
                    let start = Instant::now();
                    let outcome = match self.command(cmd) {
                        Ok(()) => Ok(()),
                        Err(Failed::Call(e)) => {
                            self.conn.send(&format!("{}\n", chirp::code_of_errno(e.code.errno())))?;
                            Err(e.code)
                        }
                        Err(Failed::Io(e)) => return Err(e),
                    };
                    self.shared.metrics.answered(op, outcome, start.elapsed());
                }
                Err(ParseError::Unknown(_) | ParseError::Malformed(_)) => {
                    self.conn.send(&format!("{}\n", code::INVALID_REQUEST))?
                }
            }
            // Replies to pipelined commands leave together.
            if self.conn.reader.buffer().is_empty() {
                self.conn.writer.flush()?;
            }
        }
    }

    fn ok(&mut self) -> Done {
        Ok(self.conn.send("0\n")?)
    }

    /// A result count followed by that many bytes.
    fn counted(&mut self, bytes: &[u8]) -> Done {
        self.conn.send(&format!("{}\n", bytes.len()))?;
        Ok(self.conn.writer.write_all(bytes)?)
    }

    fn stat_reply(&mut self, result: u64, attr: &locus_proto::types::Attr) -> Done {
        Ok(self.conn.send(&format!("{result}\n{}\n", chirp::stat_line(attr)))?)
    }

    /// Runs one command and writes its successful answer; an error is written by the caller.
    fn command(&mut self, cmd: Command) -> Done {
        let s = &mut self.session;
        let none = Bytes::new;
        match cmd {
            Command::Whoami { max } => {
                let subject = self.subject.clone();
                self.counted(&subject.as_bytes()[..subject.len().min(max as usize)])
            }
            Command::Stat { path } => {
                let attr = only(s.stat(Stat { path }, none())?)?;
                self.stat_reply(0, &attr)
            }
            Command::Lstat { path } => {
                let attr = only(s.lstat(Lstat { path }, none())?)?;
                self.stat_reply(0, &attr)
            }
            Command::Fstat { fd } => {
                let attr = only(s.fstat(Fstat { handle: fd }, none())?)?;
                self.stat_reply(0, &attr)
            }
            Command::Open { path, flags, mode } => {
                let opened = only(s.open(Open { path, flags, mode }, none())?)?;
                self.stat_reply(opened.handle, &opened.attr)
            }
            Command::Close { fd } => {
                s.close(Close { handle: fd }, none())?;
                self.ok()
            }
            Command::Pread { fd, len, offset } => {
                let len = len.min(self.max_data as u64) as u32;
                let answer = s.pread(Pread { handle: fd, offset, len }, none())?;
                let bytes = match answer.body {
                    Body::Bytes(b) => b.to_vec(),
                    Body::File { file, offset, len } => file.pread(offset, len as usize).map_err(WireError::from)?,
                    _ => Vec::new(),
                };
                self.counted(&bytes)
            }
            Command::Pwrite { fd, len, offset } => {
                // The data follows the line whatever becomes of the call: take it first.
                let data = self.take_data(len)?;
                let n = only(self.session.pwrite(Pwrite { handle: fd, offset }, data.into())?)?;
                Ok(self.conn.send(&format!("{n}\n"))?)
            }
            Command::Fsync { fd } => {
                s.fsync(Fsync { handle: fd }, none())?;
                self.ok()
            }
            Command::Ftruncate { fd, size } => {
                s.ftruncate(Ftruncate { handle: fd, size }, none())?;
                self.ok()
            }
            Command::Fstatfs { fd } => {
                s.fstat(Fstat { handle: fd }, none())?;
                self.statfs("/".into())
            }
            Command::Statfs { path } => self.statfs(path),
            Command::Getfile { path } => self.getfile(path),
            Command::Putfile { path, mode, len } => self.putfile(path, mode, len),
            Command::Getdir { path } => self.listing(path, false),
            Command::Getlongdir { path } => self.listing(path, true),
            Command::Mkdir { path, mode } => {
                s.mkdir(Mkdir { path, mode }, none())?;
                self.ok()
            }
            Command::Rmdir { path } => {
                s.rmdir(Rmdir { path }, none())?;
                self.ok()
            }
            Command::Unlink { path } => {
                s.unlink(Unlink { path }, none())?;
                self.ok()
            }
            Command::Rmall { path } => {
                self.remove_tree(path)?;
                self.ok()
            }
            Command::Rename { from, to } => {
                s.rename(Rename { from, to }, none())?;
                self.ok()
            }
            Command::Link { from, to } => {
                s.link(Link { from, to }, none())?;
                self.ok()
            }
            Command::Symlink { target, path } => {
                s.symlink(Symlink { target, path }, none())?;
                self.ok()
            }
            Command::Readlink { path, max } => {
                let target = only(s.readlink(Readlink { path }, none())?)?;
                self.counted(&target.as_bytes()[..target.len().min(max as usize)])
            }
            Command::Truncate { path, size } => {
                s.truncate(Truncate { path, size }, none())?;
                self.ok()
            }
            Command::Chmod { path, mode } => {
                s.chmod(Chmod { path, mode }, none())?;
                self.ok()
            }
            Command::Chown { path } => {
                // Owners are the server's; like chirp_server, accept where writing is allowed.
                s.access(Access { path, mode: 2 }, none())?;
                self.ok()
            }
            Command::Utime { path, atime, mtime } => {
                let at = |sec| SetTime::At(Time { sec, nsec: 0 });
                s.utimes(Utimes { path, atime: at(atime), mtime: at(mtime) }, none())?;
                self.ok()
            }
            Command::Access { path, mode } => {
                s.access(Access { path, mode }, none())?;
                self.ok()
            }
            Command::Getacl { path } => {
                let entries = only(s.acl_get(AclGet { path }, none())?)?;
                self.conn.send("0\n")?;
                for e in entries {
                    self.conn.send(&format!("{} {}\n", e.subject, e.rights))?;
                }
                Ok(self.conn.send("\n")?)
            }
            Command::Setacl { path, subject, rights } => {
                let rights = chirp::rights_of_text(&rights).map_err(|e| WireError::new(Code::INVAL, e))?;
                s.acl_set(AclSet { path, subject, rights }, none())?;
                self.ok()
            }
            Command::Hash { algorithm, path } => {
                if algorithm != "md5" {
                    return Err(WireError::new(Code::NOTSUP, format!("hash {algorithm}: only md5 is offered")).into());
                }
                use md5::Digest;
                let mut md5 = md5::Md5::new();
                let answer = s.get(Get { path }, none())?;
                if let Body::Stream(file) = answer.body {
                    let mut offset = 0;
                    loop {
                        let bytes = file.pread(offset, CHUNK).map_err(WireError::from)?;
                        if bytes.is_empty() {
                            break;
                        }
                        md5.update(&bytes);
                        offset += bytes.len() as u64;
                    }
                }
                self.counted(&md5.finalize())
            }
        }
    }

    /// `getdir` (names) or `getlongdir` (`long`: names and stat lines): 0, the lines, and
    /// an empty line. A name holding a newline would break the listing: it is left out.
    fn listing(&mut self, path: String, long: bool) -> Done {
        let entries = all(self.session.readdir(Readdir { path }, Bytes::new())?);
        self.conn.send("0\n")?;
        for e in entries.iter().filter(|e| !e.name.contains('\n')) {
            match long {
                true => self.conn.send(&format!("{}\n{}\n", e.name, chirp::stat_line(&e.attr)))?,
                false => self.conn.send(&format!("{}\n", e.name))?,
            }
        }
        Ok(self.conn.send("\n")?)
    }

    fn statfs(&mut self, path: String) -> Done {
        let fs = only(self.session.statfs(Statfs { path }, Bytes::new())?)?;
        Ok(self.conn.send(&format!("0\n{}\n", chirp::statfs_line(&fs)))?)
    }

    /// Reads the `len` bytes that follow a `pwrite` line: keeps at most the data limit,
    /// and consumes (and drops) the rest, so the write is reported short.
    fn take_data(&mut self, len: u64) -> io::Result<Vec<u8>> {
        let keep = len.min(self.max_data as u64) as usize;
        let mut data = vec![0u8; keep];
        self.conn.reader.read_exact(&mut data)?;
        self.soak(len - keep as u64)?;
        Ok(data)
    }

    /// Reads and drops `n` bytes of the client's data.
    fn soak(&mut self, n: u64) -> io::Result<()> {
        let got = io::copy(&mut (&mut self.conn.reader).take(n), &mut io::sink())?;
        if got < n {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the client's data ended early"));
        }
        Ok(())
    }

    /// `getfile`: the size, then exactly that many bytes. A file that shrinks meanwhile
    /// cannot keep that promise, so the connection ends.
    fn getfile(&mut self, path: String) -> Done {
        let answer = self.session.get(Get { path }, Bytes::new())?;
        let size = answer.pages.first().map_or(0, |a| a.size);
        let Body::Stream(file) = answer.body else {
            return Err(WireError::new(Code::NOTSUP, "this file cannot be sent over Chirp").into());
        };
        self.conn.send(&format!("{size}\n"))?;
        let start = Instant::now();
        let mut buf = vec![0u8; (size as usize).min(COPY_CHUNK)];
        let mut offset = 0u64;
        while offset < size {
            let want = (size - offset).min(buf.len() as u64) as usize;
            let got = file.read_into(offset, &mut buf[..want]).map_err(|e| io::Error::other(e.to_string()))?;
            if got == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank while being sent").into());
            }
            self.conn.writer.write_all(&buf[..got])?;
            offset += got as u64;
        }
        file.io.read(size, start.elapsed());
        Ok(())
    }

    /// `putfile`: once the upload has begun (the name may be written), answers 0, takes
    /// the `len` bytes that follow and answers their count. An error before the 0 is
    /// answered instead of it (the client then sends nothing); one after it consumes the
    /// rest of the data first.
    fn putfile(&mut self, path: String, mode: u32, len: u64) -> Done {
        const UPLOAD: u32 = 1;
        self.session.set_current(UPLOAD, len > 0);
        let started = self.session.put_cached(PutCached { path, mode }, Bytes::new())?;
        self.conn.send("0\n")?;
        self.conn.writer.flush()?;
        if !started.deferred {
            return Ok(self.conn.send("0\n")?);
        }
        let mut left = len;
        let mut buf = vec![0u8; CHUNK.min(len as usize)];
        while left > 0 {
            let n = (left as usize).min(buf.len());
            self.conn.reader.read_exact(&mut buf[..n])?;
            left -= n as u64;
            if let Err(e) = self.session.put_more(UPLOAD, &buf[..n], left > 0) {
                self.soak(left)?;
                return Err(e.into());
            }
        }
        Ok(self.conn.send(&format!("{len}\n"))?)
    }

    /// `rmall`: removes a file, or a directory and everything under it (depth first,
    /// with a stack rather than recursion, so a deep tree cannot exhaust the thread's).
    fn remove_tree(&mut self, path: String) -> Result<(), WireError> {
        let s = &mut self.session;
        let attr = only(s.lstat(Lstat { path: path.clone() }, Bytes::new())?)?;
        if !attr.is_dir() {
            s.unlink(Unlink { path }, Bytes::new())?;
            return Ok(());
        }
        let mut stack = vec![(path, false)];
        while let Some((dir, emptied)) = stack.pop() {
            if emptied {
                s.rmdir(Rmdir { path: dir }, Bytes::new())?;
                continue;
            }
            let entries = all(s.readdir(Readdir { path: dir.clone() }, Bytes::new())?);
            stack.push((dir.clone(), true));
            for e in entries {
                let child = format!("{}/{}", dir.trim_end_matches('/'), e.name);
                if e.attr.is_dir() {
                    stack.push((child, false));
                } else {
                    s.unlink(Unlink { path: child }, Bytes::new())?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::confirmed_hostname;
    use std::net::IpAddr;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_hostname_counts_only_when_it_resolves_back_to_the_peer() {
        let peer = ip("192.0.2.7");
        let reverse = |name: &'static str| move |_: &IpAddr| Some(name.to_string());
        let forward = |addrs: &'static [&'static str]| move |_: &str| addrs.iter().map(|a| ip(a)).collect::<Vec<_>>();
        // Confirmed: the name's addresses include the peer's (case and a final dot do not matter).
        let name = confirmed_hostname(peer, reverse("Node7.Example.org."), forward(&["192.0.2.9", "192.0.2.7"]));
        assert_eq!(name.as_deref(), Some("node7.example.org"));
        // A PTR record naming someone else's host, whose addresses are not the peer's.
        assert_eq!(confirmed_hostname(peer, reverse("trusted.example.org"), forward(&["198.51.100.1"])), None);
        assert_eq!(confirmed_hostname(peer, reverse("trusted.example.org"), forward(&[])), None);
        // No reverse name at all.
        assert_eq!(confirmed_hostname(peer, |_| None, forward(&["192.0.2.7"])), None);
        // Names that are addresses, patterns or not host names are refused outright.
        for bad in ["192.0.2.7", "*.example.org", "a b", ""] {
            assert_eq!(confirmed_hostname(peer, reverse(bad), forward(&["192.0.2.7"])), None, "{bad:?}");
        }
        // An IPv4 peer seen through a dual-stack socket is still confirmed by its IPv4 address.
        assert!(confirmed_hostname(peer, reverse("n.example.org"), forward(&["::ffff:192.0.2.7"])).is_some());
    }
}
