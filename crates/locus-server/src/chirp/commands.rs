//! The Chirp commands carried out for one authenticated client: each becomes the native
//! operation it names on a [`Session`] of the client's subject (so rights are the native
//! protocol's), with Chirp's own replies and errno numbers.

use super::{Conn, Done, Failed};
use crate::dispatch::{Answer, Handler};
use crate::session::Session;
use crate::transport::Body;
use crate::Shared;
use bytes::Bytes;
use locus_proto::chirp::{self, code, Command, ParseError};
use locus_proto::ops::*;
use locus_proto::types::{SetTime, Time};
use locus_proto::{Code, Error as WireError, Operation};
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Instant;

/// An authenticated client: its session and connection.
pub(super) struct Client {
    pub(super) session: Session,
    pub(super) subject: String,
    pub(super) shared: Arc<Shared>,
    pub(super) conn: Conn,
    /// The most bytes one read or write moves.
    pub(super) max_data: usize,
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
    pub(super) fn run(&mut self) -> io::Result<()> {
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
