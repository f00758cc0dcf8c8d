//! Third-party reads: a cluster head answers an `open` or `locate` of a large file with
//! where its bytes are and a capability; the client reads them straight from the data
//! nodes over pooled connections, and falls back to the head when no node answers.
//!
//! Bytes never mix versions: a capability names one immutable version, nodes serve only
//! that one, and a fallback through the head checks that the head still has it.

use crate::{credentials::Credentials, Client, ClientError, ConnectOptions, Pending, Result};
use bytes::Bytes;
use locus_proto::ops::{Close, ObjectRead, Open, Pread};
use locus_proto::types::{open_flags, Attr, Location};
use locus_proto::Code;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Bytes per third-party read request.
pub const CHUNK: u32 = 1 << 20;
/// Requests a whole-file read keeps in flight.
const WINDOW: usize = 8;

/// The locations of a connection's open handles and its connections to data nodes.
#[derive(Default)]
pub struct NodeReads {
    head: AtomicBool,
    locations: Mutex<HashMap<u64, Location>>,
    conns: tokio::sync::Mutex<HashMap<String, Client>>,
}

impl NodeReads {
    /// Records whether the server is a cluster head. Third-party reads are off when
    /// `LOCUS_THIRD_PARTY=0` (everything then goes through the head), and over TLS,
    /// since data nodes speak plain TCP.
    pub(crate) fn set_head(&self, head: bool, plain: bool) {
        let allowed = std::env::var("LOCUS_THIRD_PARTY").map_or(true, |v| v != "0");
        self.head.store(head && plain && allowed, Ordering::Relaxed);
    }

    /// True when connected to a cluster head that lets this client read from its nodes.
    pub fn is_head(&self) -> bool {
        self.head.load(Ordering::Relaxed)
    }

    pub(crate) fn remember(&self, handle: u64, location: Location) {
        if self.is_head() {
            self.locations.lock().insert(handle, location);
        }
    }

    pub(crate) fn forget(&self, handle: u64) {
        self.locations.lock().remove(&handle);
    }

    pub(crate) fn location(&self, handle: u64) -> Option<Location> {
        self.locations.lock().get(&handle).cloned()
    }

    /// A connection to data node `addr` as `subject` (with its token at the nodes),
    /// made if there is none open.
    pub async fn connect(&self, addr: &str, subject: &str, token: &str) -> Result<Client> {
        let mut conns = self.conns.lock().await;
        if let Some(c) = conns.get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let opts = ConnectOptions {
            addr: addr.to_string(),
            credentials: Credentials { subject: subject.to_string(), token: token.to_string() },
            tls_ca: None,
            tls_name: None,
        };
        let c = Client::connect(&opts).await?;
        conns.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// A connection to `addr` as the subject a location's capability names.
    async fn conn(&self, addr: &str, location: &Location) -> Result<Client> {
        self.connect(addr, &location.capability.subject, &location.node_token).await
    }

    /// Reads from the first node that answers; the last node's error if none does.
    pub async fn read(&self, location: &Location, offset: u64, len: u32) -> Result<Bytes> {
        let mut last = ClientError::Protocol("a location with no nodes".into());
        for addr in &location.nodes {
            let req = ObjectRead { capability: location.capability.clone(), offset, len };
            match async { self.conn(addr, location).await?.call_with(req, &[]).await }.await {
                Ok((_, data)) => return Ok(data),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Sends a read to the first node without waiting for it.
    pub async fn read_ahead(&self, location: &Location, offset: u64, len: u32) -> Result<Pending<()>> {
        let addr = location.nodes.first().ok_or_else(|| ClientError::Protocol("a location with no nodes".into()))?;
        let req = ObjectRead { capability: location.capability.clone(), offset, len };
        self.conn(addr, location).await?.start_with(req, &[]).await
    }
}

/// Streams a located file into `sink` from its data nodes, [`WINDOW`] requests in
/// flight. A chunk no node serves is read through the head, provided the head still
/// has the same version; otherwise the read fails with `ESTALE` rather than mixing.
pub(crate) async fn get(
    head: &Client,
    path: &str,
    attr: &Attr,
    location: &Location,
    sink: &mut (impl AsyncWrite + Unpin),
    progress: &mut impl FnMut(u64, &Attr),
) -> Result<Attr> {
    let nodes = &head.nodes;
    let size = location.capability.size;
    let mut sent: VecDeque<(u64, Option<Pending<()>>)> = VecDeque::new();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut fallback: Option<u64> = None;
    while done < size {
        while sent.len() < WINDOW && next < size {
            let len = (size - next).min(CHUNK as u64) as u32;
            let pending = if fallback.is_none() { nodes.read_ahead(location, next, len).await.ok() } else { None };
            sent.push_back((next, pending));
            next += len as u64;
        }
        let (at, pending) = sent.pop_front().expect("a request is in flight while bytes remain");
        let len = (size - at).min(CHUNK as u64) as u32;
        let data = match pending {
            Some(p) => match p.wait_with_data().await {
                Ok((_, d)) => Some(d),
                Err(_) => nodes.read(location, at, len).await.ok(),
            },
            None => None,
        };
        let data = match data {
            Some(d) => d,
            None => {
                let handle = match fallback {
                    Some(h) => h,
                    None => {
                        let h = reopen_same_version(head, path, location).await?;
                        fallback = Some(h);
                        h
                    }
                };
                head.call_with(Pread { handle, offset: at, len }, &[]).await?.1
            }
        };
        if data.len() as u32 != len {
            return Err(ClientError::Remote(locus_proto::Error::new(
                Code::IO,
                format!("{path}: short read from a data node"),
            )));
        }
        sink.write_all(&data).await?;
        done += data.len() as u64;
        progress(done, attr);
    }
    if let Some(h) = fallback {
        let _ = head.call(Close { handle: h }).await;
    }
    sink.flush().await?;
    Ok(attr.clone())
}

/// Opens `path` at the head for reading through it, checking that its current version
/// is the one being read.
async fn reopen_same_version(head: &Client, path: &str, location: &Location) -> Result<u64> {
    let opened = head.call(Open { path: path.into(), flags: open_flags::READ, mode: 0 }).await?;
    let same = opened.location.as_ref().is_some_and(|l| {
        l.capability.object == location.capability.object && l.capability.version == location.capability.version
    });
    if !same {
        let _ = head.call(Close { handle: opened.handle }).await;
        return Err(ClientError::Remote(locus_proto::Error::new(
            Code(116), // ESTALE
            format!("{path}: changed while it was read, and its data node is unreachable"),
        )));
    }
    Ok(opened.handle)
}
