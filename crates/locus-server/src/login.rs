//! Whether the address a client dialled names this server.
//!
//! A login proof covers the server address the client dialled, as written in its URL
//! (see [`locus_proto::auth`]). On plain TCP this server accepts a proof only for an
//! address that reaches it, so a server the client merely listed cannot pass this
//! server's challenge to the client and the client's answer back here. The names it
//! takes for its own, at the port it listens on:
//!
//! - the address the connection arrived at, and its listen address;
//! - listening on a wildcard (`0.0.0.0`, `[::]`): any address of its host's interfaces
//!   (of the listener's family);
//! - listening on loopback or a wildcard: `localhost` (and `localhost.localdomain`,
//!   `ip6-localhost`, `ip6-loopback`);
//! - its host name (`/proc/sys/kernel/hostname`);
//!
//! and the names its operator lists (`locus serve --name HOST[:PORT]`, for DNS names,
//! NAT and proxies; `HOST:*` takes any port on HOST, for local proxies such as the
//! benchmarks' delay proxies). Under TLS the proof covers the session's exporter
//! secret, which a relay cannot share, so the address is not checked there.

use locus_proto::auth;
use std::net::{IpAddr, SocketAddr};

/// What the login proof of a connection is checked against: the connection's own ends.
#[derive(Clone, Debug)]
pub struct Link {
    /// The local address the connection arrived at.
    pub local: SocketAddr,
    /// The address the connection came from.
    pub peer: SocketAddr,
    /// The TLS exporter secret ([`auth::TLS_EXPORTER_LABEL`]); empty on plain TCP.
    pub exporter: Vec<u8>,
}

/// Which port an operator's name (`--name`) stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamePort {
    /// The port the server listens on (`--name HOST`).
    Listen,
    /// This port (`--name HOST:PORT`): NAT, or a proxy forwarding there.
    Is(u16),
    /// Any port (`--name HOST:*`): proxies on HOST whose ports are not known beforehand.
    Any,
}

/// An address an operator says reaches this server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerName {
    /// Lower-case host name or address (IPv6 without brackets).
    pub host: String,
    pub port: NamePort,
}

impl std::str::FromStr for ServerName {
    type Err = String;
    /// Parses `HOST`, `HOST:PORT` or `HOST:*` (`[V6]`, `[V6]:PORT`, `[V6]:*`).
    fn from_str(s: &str) -> Result<ServerName, String> {
        let bad = || format!("{s:?}: expected HOST, HOST:PORT or HOST:*");
        let (host, port) = match s.strip_prefix('[') {
            Some(v6) => {
                let (h, rest) = v6.split_once(']').ok_or_else(bad)?;
                (h, if rest.is_empty() { None } else { Some(rest.strip_prefix(':').ok_or_else(bad)?) })
            }
            None if s.matches(':').count() > 1 => (s, None),
            None => match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            },
        };
        let port = match port {
            None => NamePort::Listen,
            Some("*") => NamePort::Any,
            Some(p) => NamePort::Is(p.parse().map_err(|_| bad())?),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if host.is_empty() || host.contains(['/', '[', ']', ' ']) {
            return Err(bad());
        }
        Ok(ServerName { host, port })
    }
}

/// Names of the loopback interface that resolvers commonly know.
const LOOPBACK_NAMES: [&str; 4] = ["localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"];

/// This host's name, lower-case.
fn hostname() -> Option<&'static str> {
    static NAME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
        let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
        (!name.is_empty()).then_some(name)
    })
    .as_deref()
}

/// True when `ip` is an address of one of this host's interfaces (it can be bound).
fn is_local_address(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Whether `dialled` (`HOST:PORT` as the client wrote it) names this server, which
/// listens on `listen`, was reached at `link.local`, and was given `names`.
pub fn names_this_server(names: &[ServerName], listen: SocketAddr, local: SocketAddr, dialled: &str) -> bool {
    let Some((host, port)) = auth::split_server(dialled) else { return false };
    let listed = names.iter().any(|n| {
        n.host == host
            && match n.port {
                NamePort::Listen => port == listen.port(),
                NamePort::Is(p) => p == port,
                NamePort::Any => true,
            }
    });
    if listed {
        return true;
    }
    if port != listen.port() {
        return false;
    }
    let listen_ip = listen.ip().to_canonical();
    let wildcard = listen_ip.is_unspecified();
    // A loopback name or address names this server only for a connection that arrived on
    // loopback: otherwise a relay on the client's own machine could use it.
    let came_by_loopback = local.ip().to_canonical().is_loopback();
    if let Ok(ip) = host.parse::<IpAddr>() {
        let ip = ip.to_canonical();
        if ip.is_loopback() && !came_by_loopback {
            return false;
        }
        // `0.0.0.0` takes IPv4 only; `[::]` both (Linux's default dual stack).
        let family = listen.is_ipv6() || ip.is_ipv4();
        return ip == listen_ip || ip == local.ip().to_canonical() || (wildcard && family && is_local_address(ip));
    }
    if LOOPBACK_NAMES.contains(&host.as_str()) {
        return (listen_ip.is_loopback() || wildcard) && came_by_loopback;
    }
    hostname() == Some(host.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<ServerName> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn parses_names() {
        let n: ServerName = "Proxy.Example:*".parse().unwrap();
        assert_eq!(n, ServerName { host: "proxy.example".into(), port: NamePort::Any });
        assert_eq!("h:7".parse::<ServerName>().unwrap().port, NamePort::Is(7));
        assert_eq!("h".parse::<ServerName>().unwrap().port, NamePort::Listen);
        assert_eq!("[::1]:8".parse::<ServerName>().unwrap(), ServerName { host: "::1".into(), port: NamePort::Is(8) });
        assert_eq!("fe80::1".parse::<ServerName>().unwrap().host, "fe80::1");
        for bad in ["", ":1", "h:x", "[::1", "[::1]x"] {
            assert!(bad.parse::<ServerName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_loopback_server_knows_its_own_names_only() {
        let listen: SocketAddr = "127.0.0.1:9610".parse().unwrap();
        let ok = |d: &str| names_this_server(&[], listen, listen, d);
        assert!(ok("127.0.0.1:9610") && ok("localhost:9610") && ok("LOCALHOST.:9610"));
        assert!(!ok("127.0.0.1:9611"), "another port is another server");
        assert!(!ok("127.0.0.2:9610"), "another loopback address can be another server");
        assert!(!ok("[::1]:9610") && !ok("example.org:9610") && !ok("garbage"));
        if let Some(h) = hostname() {
            assert!(ok(&format!("{h}:9610")));
        }
        let listed = names(&["proxy.example", "10.1.1.1:80", "127.0.0.1:*"]);
        let ok = |d: &str| names_this_server(&listed, listen, listen, d);
        assert!(ok("proxy.example:9610") && !ok("proxy.example:80"));
        assert!(ok("10.1.1.1:80") && !ok("10.1.1.1:9610"));
        assert!(ok("127.0.0.1:4444"));
    }

    #[test]
    fn a_wildcard_server_takes_its_interfaces() {
        let listen: SocketAddr = "0.0.0.0:9610".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:9610".parse().unwrap();
        let ok = |d: &str| names_this_server(&[], listen, local, d);
        assert!(ok("127.0.0.1:9610") && ok("127.0.0.2:9610") && ok("localhost:9610"));
        assert!(!ok("192.0.2.1:9610"), "a documentation address is no interface of ours");
        assert!(!ok("[::1]:9610"), "0.0.0.0 does not listen on IPv6");
    }

    #[test]
    fn loopback_names_count_only_for_a_connection_that_came_by_loopback() {
        // A client elsewhere whose `localhost:9610` is a relay to this server's
        // 192.0.2.2:9610 made its proof for its own loopback: refused.
        let listen: SocketAddr = "0.0.0.0:9610".parse().unwrap();
        let local: SocketAddr = "192.0.2.2:9610".parse().unwrap();
        let ok = |d: &str| names_this_server(&[], listen, local, d);
        assert!(ok("192.0.2.2:9610"), "the address it arrived at");
        for relayed in ["127.0.0.1:9610", "127.0.0.5:9610", "localhost:9610", "[::1]:9610"] {
            assert!(!ok(relayed), "{relayed}");
        }
    }
}
