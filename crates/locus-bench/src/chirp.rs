//! A minimal client for the Chirp protocol (CCTools): text commands, one per line,
//! answered by a line holding a result code, with bulk data after it.
//!
//! It speaks the `address` authentication method and the operations the benchmarks use.
//! A Chirp server closes the connection when it cannot map an errno; every call here
//! reports that as an error instead of hanging.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A connection to a chirp_server.
pub struct ChirpClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// Result of a Chirp call: errors carry the negative code's errno when there is one.
pub type ChirpResult<T> = Result<T, String>;

impl ChirpClient {
    /// Connects and authenticates by network address.
    pub fn connect(addr: SocketAddr) -> ChirpResult<ChirpClient> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("chirp connect: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        let writer = s.try_clone().map_err(|e| e.to_string())?;
        let mut c = ChirpClient { reader: BufReader::with_capacity(1 << 20, s), writer };
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

    fn line(&mut self) -> ChirpResult<String> {
        let mut s = String::new();
        match self.reader.read_line(&mut s) {
            Ok(0) => Err("chirp server closed the connection".into()),
            Ok(_) => Ok(s.trim_end_matches('\n').to_string()),
            Err(e) => Err(format!("chirp: {e}")),
        }
    }

    fn result(&mut self) -> ChirpResult<i64> {
        let line = self.line()?;
        let n: i64 = line.trim().parse().map_err(|_| format!("chirp: bad result line {line:?}"))?;
        if n < 0 {
            return Err(format!("chirp error {n}"));
        }
        Ok(n)
    }

    fn command(&mut self, cmd: &str) -> ChirpResult<i64> {
        self.writer.write_all(cmd.as_bytes()).map_err(|e| format!("chirp: {e}"))?;
        self.result()
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
        let n = self.command(&format!("pread {fd} {} {offset}\n", buf.len()))? as usize;
        self.reader.read_exact(&mut buf[..n]).map_err(|e| format!("chirp: {e}"))?;
        Ok(n)
    }

    /// `pwrite`; returns the count written.
    pub fn pwrite(&mut self, fd: i64, data: &[u8], offset: u64) -> ChirpResult<usize> {
        self.writer
            .write_all(format!("pwrite {fd} {} {offset}\n", data.len()).as_bytes())
            .map_err(|e| e.to_string())?;
        self.writer.write_all(data).map_err(|e| e.to_string())?;
        Ok(self.result()? as usize)
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
        self.result().map(|_| ())
    }
}
