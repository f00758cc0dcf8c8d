//! `locus://HOST:PORT/path` URLs (and `locus+tls://` for TLS). A cluster's URL may name
//! several heads, `locus://h1:9610,h2:9610/path`: a client connects to the first that
//! answers, and to the next when it must connect again.

use crate::error::{ClientError, Result};
use std::fmt;

/// Port a server listens on when none is given.
pub const DEFAULT_PORT: u16 = 9610;

/// A parsed Locus URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocusUrl {
    pub host: String,
    pub port: u16,
    /// Path within the export, always starting with `/`.
    pub path: String,
    pub tls: bool,
    /// Further servers serving the same namespace (`HOST:PORT` each), tried in order
    /// when the first does not answer: the other heads of a cluster.
    pub others: Vec<String>,
}

impl LocusUrl {
    /// Parses `locus://HOST[:PORT][/PATH]` or `locus+tls://...`.
    pub fn parse(s: &str) -> Result<LocusUrl> {
        let (tls, rest) = if let Some(r) = s.strip_prefix("locus://") {
            (false, r)
        } else if let Some(r) = s.strip_prefix("locus+tls://") {
            (true, r)
        } else {
            return Err(ClientError::Config(format!("{s}: not a locus:// URL")));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let mut servers = authority.split(',').map(|a| host_port(s, a));
        let (host, port) = servers.next().expect("split yields one part at least")?;
        let others = servers
            .map(|hp| {
                hp.map(|(h, p)| LocusUrl { host: h, port: p, path: String::new(), tls, others: Vec::new() }.authority())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LocusUrl { host, port, path: path.to_string(), tls, others })
    }

    /// Every server's `HOST:PORT`, comma-separated, the first first: what
    /// [`crate::ConnectOptions::addr`] takes.
    pub fn authorities(&self) -> String {
        std::iter::once(self.authority()).chain(self.others.iter().cloned()).collect::<Vec<_>>().join(",")
    }

    /// `HOST:PORT`, as a socket address string.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The same server with another path.
    pub fn with_path(&self, path: &str) -> LocusUrl {
        LocusUrl { path: path.to_string(), ..self.clone() }
    }
}

/// One `HOST[:PORT]` of URL `s`.
fn host_port(s: &str, authority: &str) -> Result<(String, u16)> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6.find(']').ok_or_else(|| ClientError::Config(format!("{s}: unclosed [")))?;
        let port = v6[end + 1..].strip_prefix(':');
        (v6[..end].to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(ClientError::Config(format!("{s}: no host")));
    }
    let port = match port {
        Some(p) => p.parse().map_err(|_| ClientError::Config(format!("{s}: bad port {p:?}")))?,
        None => DEFAULT_PORT,
    };
    Ok((host, port))
}

impl fmt::Display for LocusUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "locus+tls" } else { "locus" };
        write!(f, "{scheme}://{}{}", self.authorities(), self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = LocusUrl::parse("locus://host:123/a/b").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str(), u.tls), ("host", 123, "/a/b", false));
        let u = LocusUrl::parse("locus+tls://h").unwrap();
        assert_eq!((u.port, u.path.as_str(), u.tls), (DEFAULT_PORT, "/", true));
        let u = LocusUrl::parse("locus://[::1]:9/x").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.authority()), ("::1", 9, "[::1]:9".to_string()));
        assert_eq!(u.to_string(), "locus://[::1]:9/x");
        assert!(LocusUrl::parse("http://h/").is_err());
        assert!(LocusUrl::parse("locus://h:x/").is_err());
        assert!(LocusUrl::parse("locus:///p").is_err());
        // Several heads of one cluster.
        let u = LocusUrl::parse("locus://h1:1,h2,[::1]:3/p").unwrap();
        assert_eq!((u.authority(), u.others.clone()), ("h1:1".into(), vec!["h2:9610".into(), "[::1]:3".into()]));
        assert_eq!(u.authorities(), "h1:1,h2:9610,[::1]:3");
        assert_eq!(u.to_string(), "locus://h1:1,h2:9610,[::1]:3/p");
        assert!(LocusUrl::parse("locus://h1,/p").is_err());
        assert!(LocusUrl::parse("locus://h1,h2:x/p").is_err());
    }
}
