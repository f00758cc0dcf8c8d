//! How a client reaches a server: its address, credentials, TLS trust, and the
//! deadlines after which a server (or data node) that does not answer is given up on.

use crate::credentials::{self, Credentials};
use crate::error::Result;
use crate::LocusUrl;
use std::path::PathBuf;
use std::time::Duration;

/// How to reach and authenticate to a server.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// `HOST:PORT`, as the user wrote it: the login proof covers it, so the server checks
    /// that it names the server.
    pub addr: String,
    pub credentials: Credentials,
    /// Connect with TLS, trusting the certificate(s) in this PEM file.
    pub tls_ca: Option<PathBuf>,
    /// Host name the server's certificate must carry (defaults to the host of `addr`).
    pub tls_name: Option<String>,
    /// How long to wait for the server before giving up on it.
    pub deadlines: Deadlines,
}

/// How long a client waits before it gives up on a server (or data node) that does not
/// answer: one that hangs, rather than dies, then costs a bounded wait, and reads fail
/// over to the next replica or the head. Streams are bounded by progress: each frame
/// must come (or go) within `request`, however long the whole transfer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Connecting, TLS and the handshake.
    pub connect: Duration,
    /// A request's reply; each frame of a streamed reply; each frame sent. Operations
    /// that carry out long work (`rebalance_apply`, storelet runs) are bounded by the
    /// server's own limits instead.
    pub request: Duration,
    /// One read at a data node, before the client tries the next replica or the head.
    pub node_read: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: Duration::from_secs(10),
            request: Duration::from_secs(60),
            node_read: Duration::from_secs(10),
        }
    }
}

/// The host part of `addr` (`HOST:PORT` or `[V6]:PORT`): the name a server's TLS
/// certificate must carry.
pub fn host_of(addr: &str) -> String {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']').to_string()
}

impl ConnectOptions {
    /// These options for `addr` alone, one of the servers they name (`h1:9610,h2:9610`
    /// names several heads of a cluster): over TLS, a server other than the one the
    /// options name proves its own name.
    pub fn for_one(&self, addr: &str) -> ConnectOptions {
        let mut one = self.clone();
        if addr != self.addr {
            one.addr = addr.to_string();
            if one.tls_name.is_some() {
                one.tls_name = Some(host_of(addr));
            }
        }
        one
    }

    /// Adds the heads a cluster head named ([`crate::Client::heads`]) after the servers
    /// these options name, so that a reconnection goes on through another head when the
    /// named ones are gone; those already named are not repeated.
    pub fn learn_heads(&mut self, heads: &[String]) {
        for head in heads {
            if !head.is_empty() && !self.addr.split(',').any(|a| a == head) {
                self.addr.push(',');
                self.addr.push_str(head);
            }
        }
    }

    /// Options for `url`, with credentials found as [`Credentials::find`] does and, for a
    /// `locus+tls://` URL, the CA file in `LOCUS_TLS_CA` or the local server's certificate.
    pub fn for_url(url: &LocusUrl) -> Result<ConnectOptions> {
        let authority = url.authority();
        let credentials = Credentials::find(&authority)?;
        let tls_ca = url.tls.then(|| {
            std::env::var_os("LOCUS_TLS_CA")
                .map(PathBuf::from)
                .unwrap_or_else(|| credentials::locus_home().join("server").join("cert.pem"))
        });
        Ok(ConnectOptions {
            addr: url.authorities(),
            credentials,
            tls_ca,
            tls_name: Some(url.host.clone()),
            deadlines: Deadlines::default(),
        })
    }
}
