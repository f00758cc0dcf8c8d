//! The program's namespace: which paths are remote, and on which mount.
//!
//! `/locus/HOST:PORT/path` always names a Locus server (connected on first use);
//! `--mount` and mount-list entries add logical names for any driver's URL. Paths are
//! compared after lexical normalization (`.` and `..` folded, repeated `/` removed).

use crate::Fail;
use locus_drivers::{retry_transient, Driver};
use std::time::Duration;

/// One remote tree spliced into the namespace.
pub struct Mount {
    /// Where the program sees it (`/locus/host:9000`, `/data`).
    pub logical: String,
    /// The URL it came from, for messages.
    pub url: String,
    /// The path within the driver that `logical` stands for.
    pub base: String,
    pub driver: Box<dyn Driver>,
}

/// Where a path the program named lies.
#[derive(Debug, PartialEq, Eq)]
pub enum Place {
    /// On this machine; the kernel handles it.
    Local,
    /// On mount `mount`, at the logical path `logical`.
    Remote { mount: usize, logical: String },
    /// A directory that only exists to lead to mounts (`/locus`, parents of logical names).
    Virtual(String),
}

/// The mount table.
pub struct Namespace {
    pub mounts: Vec<Mount>,
    /// How long to keep trying to reach an unreachable server.
    pub retry: Duration,
}

/// `path` (absolute) with `.`, `..` and repeated slashes folded away.
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let mut out = String::with_capacity(path.len());
    for p in parts {
        out.push('/');
        out.push_str(p);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// True if `path` is `prefix` or lies beneath it.
pub fn beneath(path: &str, prefix: &str) -> bool {
    prefix == "/" || path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The parent of a normalized path.
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl Namespace {
    /// A namespace with the given `(logical, url)` mounts, connected now so that a bad
    /// URL is reported before the program starts.
    pub fn new(mounts: &[(String, String)], retry: Duration) -> Result<Namespace, String> {
        let mut ns = Namespace { mounts: Vec::new(), retry };
        for (logical, url) in mounts {
            let logical = normalize(logical);
            if logical == "/" || beneath(&logical, "/locus") {
                return Err(format!("{logical}: a logical name cannot be / or lie beneath /locus"));
            }
            ns.add(logical, url).map_err(|e| format!("{url}: {e}"))?;
        }
        Ok(ns)
    }

    fn add(&mut self, logical: String, url: &str) -> Result<usize, String> {
        let (mut driver, base) = connect_with_retry(url, self.retry)?;
        driver.set_retry(Duration::ZERO);
        self.mounts.push(Mount { logical, url: url.to_string(), base, driver });
        Ok(self.mounts.len() - 1)
    }

    /// Where the normalized absolute `path` lies; connects `/locus/HOST:PORT` on first use.
    pub fn place(&mut self, path: &str) -> Result<Place, Fail> {
        if let Some(mount) = self.mount_of(path) {
            return Ok(Place::Remote { mount, logical: path.to_string() });
        }
        if path == "/locus" {
            return Ok(Place::Virtual(path.to_string()));
        }
        if let Some(rest) = path.strip_prefix("/locus/") {
            let host = rest.split('/').next().unwrap_or_default();
            let valid = host.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !valid {
                return Err(Fail::Errno(libc::ENOENT));
            }
            let logical = format!("/locus/{host}");
            let mount = self.add(logical, &format!("locus://{host}/")).map_err(Fail::transient)?;
            return Ok(Place::Remote { mount, logical: path.to_string() });
        }
        if path != "/" && self.mounts.iter().any(|m| beneath(&m.logical, path)) {
            return Ok(Place::Virtual(path.to_string()));
        }
        Ok(Place::Local)
    }

    /// The mount already made that `path` lies on (the innermost), if any.
    pub fn mount_of(&self, path: &str) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, m) in self.mounts.iter().enumerate() {
            if beneath(path, &m.logical) && best.is_none_or(|b| self.mounts[b].logical.len() < m.logical.len()) {
                best = Some(i);
            }
        }
        best
    }

    /// The program's path for the driver's path `remote` on `mount`; none if `remote`
    /// lies outside what the mount shows.
    pub fn logical(&self, mount: usize, remote: &str) -> Option<String> {
        let m = &self.mounts[mount];
        logical_of(&m.logical, &m.base, remote)
    }

    /// The driver's path for `logical` on `mount`.
    pub fn remote(&self, mount: usize, logical: &str) -> String {
        let m = &self.mounts[mount];
        let rest = &logical[m.logical.len()..];
        match (m.base.trim_end_matches('/'), rest) {
            ("", "") => "/".to_string(),
            (base, "") => base.to_string(),
            (base, rest) => format!("{base}{rest}"),
        }
    }
}

/// The program's path for `remote`, on a mount of `logical` showing the driver's `base`.
pub(crate) fn logical_of(logical: &str, base: &str, remote: &str) -> Option<String> {
    let base = base.trim_end_matches('/');
    if !(base.is_empty() || beneath(remote, base)) {
        return None;
    }
    Some(format!("{logical}{}", &remote[base.len()..]).trim_end_matches('/').to_string())
}

/// Connects to `url`, retrying an unreachable server for `window`.
fn connect_with_retry(url: &str, window: Duration) -> Result<(Box<dyn Driver>, String), String> {
    retry_transient(window, || locus_drivers::connect(url)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_lexically() {
        assert_eq!(normalize("/a//b/./c/../d/"), "/a/b/d");
        assert_eq!(normalize("/../.."), "/");
        assert_eq!(normalize("/locus/h:1/x/.."), "/locus/h:1");
        assert!(beneath("/data/x", "/data") && beneath("/data", "/data") && !beneath("/database", "/data"));
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
    }

    #[test]
    fn names_that_are_not_hosts_are_missing() {
        let mut ns = Namespace { mounts: Vec::new(), retry: Duration::ZERO };
        assert!(matches!(ns.place("/locus/nohost/x"), Err(Fail::Errno(libc::ENOENT))));
        assert_eq!(ns.place("/locus").ok(), Some(Place::Virtual("/locus".into())));
        assert_eq!(ns.place("/etc/passwd").ok(), Some(Place::Local));
    }
}
