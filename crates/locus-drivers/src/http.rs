//! The HTTP driver: any HTTP or HTTPS server, read-only. `HEAD` gives a file's size and
//! modification time; `GET` with a `Range` reads a piece. HTTP has no directory
//! listings: the base URL and any path ending in `/` (or redirected to one) are
//! directories that cannot be listed (`EOPNOTSUPP`). What HTTP does not say is filled
//! with harmless defaults: mode 0444 (0555 for directories), owner 0, one link.

use crate::{Attr, DirEntry, Driver, DriverError, Opened, Result, Time};
use locus_proto::types::{open_flags, S_IFDIR, S_IFREG};
use std::collections::HashMap;
use std::io::Read;

/// Largest body read when a server ignores `Range` and sends the whole file.
const MAX_WHOLE_BODY: u64 = 256 << 20;

/// A read-only view of an HTTP(S) server beneath a base URL.
pub struct HttpDriver {
    agent: ureq::Agent,
    base: String,
    /// Open handles: the URL and its attributes when opened.
    open: HashMap<u64, (String, Attr)>,
    next: u64,
}

fn dir_attr() -> Attr {
    Attr { mode: S_IFDIR | 0o555, nlink: 2, blksize: 4096, ..Default::default() }
}

fn http_error(url: &str, e: ureq::Error) -> DriverError {
    match e {
        ureq::Error::Status(404 | 410, _) => DriverError::errno(libc::ENOENT, format!("{url}: not found")),
        ureq::Error::Status(401 | 403, _) => DriverError::errno(libc::EACCES, format!("{url}: forbidden")),
        ureq::Error::Status(416, _) => DriverError::errno(libc::EINVAL, format!("{url}: range not satisfiable")),
        ureq::Error::Status(code, _) if code >= 500 => DriverError::transient(format!("{url}: server error {code}")),
        ureq::Error::Status(code, _) => DriverError::errno(libc::EIO, format!("{url}: HTTP {code}")),
        ureq::Error::Transport(t) => DriverError::transient(format!("{url}: {t}")),
    }
}

/// Seconds since the epoch of an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`), if it is one.
fn http_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, month, year, time, _] = parts.as_slice() else { return None };
    let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        .iter()
        .position(|m| m == month)? as i64
        + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').filter_map(|x| x.parse().ok()).collect();
    let [h, m, sec] = hms.as_slice() else { return None };
    // Days from the civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let (y, mo) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days * 86400 + h * 3600 + m * 60 + sec)
}

impl HttpDriver {
    /// A driver for everything beneath `base` (an `http://` or `https://` URL).
    pub fn new(base: &str) -> Result<HttpDriver> {
        let agent = ureq::AgentBuilder::new().timeout_connect(std::time::Duration::from_secs(10)).build();
        Ok(HttpDriver { agent, base: base.trim_end_matches('/').to_string(), open: HashMap::new(), next: 1 })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
}

impl Driver for HttpDriver {
    fn name(&self) -> &'static str {
        "http"
    }

    fn lstat(&mut self, path: &str) -> Result<Attr> {
        if path == "/" || path.is_empty() || path.ends_with('/') {
            return Ok(dir_attr());
        }
        let url = self.url(path);
        let r = self.agent.head(&url).call().map_err(|e| http_error(&url, e))?;
        if r.get_url().ends_with('/') {
            return Ok(dir_attr());
        }
        let size: u64 = r.header("Content-Length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mtime = r.header("Last-Modified").and_then(http_date).unwrap_or(0);
        let t = Time { sec: mtime, nsec: 0 };
        Ok(Attr {
            mode: S_IFREG | 0o444,
            nlink: 1,
            size,
            blksize: 65536,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            ..Default::default()
        })
    }

    fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>> {
        Err(DriverError::permanent(libc::EOPNOTSUPP, format!("{}: HTTP has no directory listings", self.url(path))))
    }

    fn open(&mut self, path: &str, flags: u32, _mode: u32) -> Result<Opened> {
        if flags & (open_flags::WRITE | open_flags::CREATE | open_flags::TRUNCATE | open_flags::APPEND) != 0 {
            return Err(DriverError::unsupported("write", "http"));
        }
        let attr = self.lstat(path)?;
        let handle = self.next;
        self.next += 1;
        self.open.insert(handle, (self.url(path), attr.clone()));
        Ok(Opened { handle, attr, location: None })
    }

    fn close(&mut self, handle: u64) -> Result<()> {
        self.open.remove(&handle).map(drop).ok_or_else(|| DriverError::errno(libc::EBADF, "not open"))
    }

    fn fstat(&mut self, handle: u64) -> Result<Attr> {
        self.open.get(&handle).map(|(_, a)| a.clone()).ok_or_else(|| DriverError::errno(libc::EBADF, "not open"))
    }

    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let (url, attr) = self.open.get(&handle).cloned().ok_or_else(|| DriverError::errno(libc::EBADF, "not open"))?;
        if len == 0 || offset >= attr.size {
            return Ok(Vec::new());
        }
        let last = (offset + len as u64).min(attr.size) - 1;
        let r = self
            .agent
            .get(&url)
            .set("Range", &format!("bytes={offset}-{last}"))
            .call()
            .map_err(|e| http_error(&url, e))?;
        let whole = r.status() == 200;
        let mut body = Vec::new();
        let limit = if whole { MAX_WHOLE_BODY } else { len as u64 };
        if whole && attr.size > MAX_WHOLE_BODY {
            return Err(DriverError::permanent(
                libc::ESPIPE,
                format!("{url}: the server ignores Range and the file is too large to read whole"),
            ));
        }
        r.into_reader()
            .take(limit)
            .read_to_end(&mut body)
            .map_err(|e| DriverError::transient(format!("{url}: {e}")))?;
        if whole {
            // The server ignored the range and sent the whole file: take the piece.
            let start = (offset as usize).min(body.len());
            let end = (start + len as usize).min(body.len());
            return Ok(body[start..end].to_vec());
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn http_dates_parse() {
        assert_eq!(super::http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784111777));
        assert_eq!(super::http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(super::http_date("yesterday"), None);
    }
}
