//! Third-party reads: a cluster head answers an `open` or `locate` of a large file with
//! where its bytes are and a capability; the client reads them straight from the data
//! nodes over pooled connections, and falls back to the head when no node answers.
//!
//! Bytes never mix versions: a capability names one immutable version, nodes serve only
//! that one, and a fallback through the head checks that the head still has it.
//!
//! Every read at a node has a deadline ([`crate::Deadlines::node_read`]): a node that
//! hangs rather than dies is marked slow for [`SLOW_FOR`], during which reads go to the
//! other replicas first and connections to it are not tried again.

use crate::{credentials::Credentials, Client, ClientError, ConnectOptions, Deadlines, Pending, Result};
use bytes::Bytes;
use locus_proto::ops::{Close, ObjectRead, Open, Pread};
use locus_proto::types::{open_flags, Attr, Location};
use locus_proto::Code;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Bytes per third-party read request.
pub const CHUNK: u32 = 1 << 20;
/// Requests a whole-file read keeps in flight.
const WINDOW: usize = 8;

/// How long a node that did not answer in time is passed over.
pub const SLOW_FOR: Duration = Duration::from_secs(15);

/// The locations of a connection's open handles and its connections to data nodes.
#[derive(Default)]
pub struct NodeReads {
    head: AtomicBool,
    locations: Mutex<HashMap<u64, Location>>,
    conns: Mutex<HashMap<String, Client>>,
    /// Nodes that did not answer in time, and when.
    slow: Mutex<HashMap<String, Instant>>,
    deadlines: Deadlines,
    /// The cluster's authority (a PEM file) when nodes are reached over TLS.
    tls_ca: Mutex<Option<std::path::PathBuf>>,
}

impl NodeReads {
    /// Node reads with these deadlines (connections to nodes use them too).
    pub fn with_deadlines(deadlines: Deadlines) -> Self {
        NodeReads { deadlines, ..Default::default() }
    }

    /// True while `addr` is passed over for not answering in time lately.
    pub fn is_slow(&self, addr: &str) -> bool {
        let mut slow = self.slow.lock();
        match slow.get(addr) {
            Some(at) if at.elapsed() < SLOW_FOR => true,
            Some(_) => {
                slow.remove(addr);
                false
            }
            None => false,
        }
    }

    /// Notes how a call to `addr` failed: one that did not answer in time has its
    /// connection dropped and is passed over for [`SLOW_FOR`].
    pub fn note(&self, addr: &str, e: &ClientError) {
        if matches!(e, ClientError::TimedOut(_)) {
            self.slow.lock().insert(addr.to_string(), Instant::now());
            self.conns.lock().remove(addr);
        }
    }

    /// A location's nodes, those that answered lately first.
    fn in_order<'a>(&self, location: &'a Location) -> Vec<&'a String> {
        let (mut good, slow): (Vec<_>, Vec<_>) = location.nodes.iter().partition(|a| !self.is_slow(a));
        good.extend(slow);
        good
    }
    /// Records whether the server is a cluster head, and the file of authorities its
    /// connection trusts (`tls_ca`: over TLS, its data nodes are reached over TLS too,
    /// their certificates checked against the same file, which for a cluster head holds
    /// the cluster's authority). Third-party reads are off when `LOCUS_THIRD_PARTY=0`
    /// (everything then goes through the head).
    pub(crate) fn set_head(&self, head: bool, tls_ca: Option<&std::path::Path>) {
        let allowed = std::env::var("LOCUS_THIRD_PARTY").map_or(true, |v| v != "0");
        self.head.store(head && allowed, Ordering::Relaxed);
        *self.tls_ca.lock() = tls_ca.map(std::path::Path::to_path_buf);
    }

    /// Reaches data nodes over TLS, checking their certificates against the
    /// authorities in `ca` (a PEM file).
    pub fn use_tls(&self, ca: std::path::PathBuf) {
        *self.tls_ca.lock() = Some(ca);
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
    /// made if there is none open. A node passed over for not answering lately is not
    /// tried (the error says so) until [`SLOW_FOR`] has passed.
    pub async fn connect(&self, addr: &str, subject: &str, token: &str) -> Result<Client> {
        if let Some(c) = self.conns.lock().get(addr).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        if self.is_slow(addr) {
            return Err(ClientError::TimedOut(format!("data node {addr} did not answer in time lately")));
        }
        let tls_ca = self.tls_ca.lock().clone();
        let opts = ConnectOptions {
            addr: addr.to_string(),
            credentials: Credentials { subject: subject.to_string(), token: token.to_string() },
            tls_name: tls_ca.is_some().then(|| crate::options::host_of(addr)),
            tls_ca,
            deadlines: self.deadlines,
        };
        // Connect without holding the pool: one hung node must not hold up the others.
        let c = match Client::connect(&opts).await {
            Ok(c) => c,
            Err(e) => {
                self.note(addr, &e);
                return Err(e);
            }
        };
        let mut conns = self.conns.lock();
        match conns.get(addr).filter(|c| !c.is_closed()) {
            Some(other) => Ok(other.clone()),
            None => {
                conns.insert(addr.to_string(), c.clone());
                Ok(c)
            }
        }
    }

    /// A connection to `addr` as the subject a location's capability names.
    async fn conn(&self, addr: &str, location: &Location) -> Result<Client> {
        self.connect(addr, &location.capability.subject, &location.node_token).await
    }

    /// Reads from the first node that answers in time (those that answered lately
    /// first); the last node's error if none does.
    pub async fn read(&self, location: &Location, offset: u64, len: u32) -> Result<Bytes> {
        let mut last = ClientError::Protocol("a location with no nodes".into());
        for addr in self.in_order(location) {
            let req = ObjectRead { capability: location.capability.clone(), offset, len };
            let read = async {
                let pending = self.conn(addr, location).await?.start_with(req, &[]).await?;
                pending.within(self.deadlines.node_read).wait_with_data().await
            };
            match read.await {
                Ok((_, data)) => return Ok(data),
                Err(e) => {
                    self.note(addr, &e);
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Sends a read to the first node (that answered lately) without waiting for it;
    /// its reply is due within [`Deadlines::node_read`].
    pub async fn read_ahead(&self, location: &Location, offset: u64, len: u32) -> Result<Pending<()>> {
        Ok(self.read_ahead_from(location, offset, len).await?.1)
    }

    /// [`NodeReads::read_ahead`], answering also the node it went to.
    pub async fn read_ahead_from(&self, location: &Location, offset: u64, len: u32) -> Result<(String, Pending<()>)> {
        let addr =
            *self.in_order(location).first().ok_or_else(|| ClientError::Protocol("a location with no nodes".into()))?;
        let req = ObjectRead { capability: location.capability.clone(), offset, len };
        let sent = async { self.conn(addr, location).await?.start_with(req, &[]).await }.await;
        match sent {
            Ok(p) => Ok((addr.clone(), p.within(self.deadlines.node_read))),
            Err(e) => {
                self.note(addr, &e);
                Err(e)
            }
        }
    }
}

/// A chunk asked of a node: its offset, and the node and reply while it is in flight.
type SentPiece = (u64, Option<(String, Pending<()>)>);

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
    let mut sent: VecDeque<SentPiece> = VecDeque::new();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut fallback: Option<u64> = None;
    while done < size {
        while sent.len() < WINDOW && next < size {
            let len = (size - next).min(CHUNK as u64) as u32;
            let pending = match fallback {
                None => nodes.read_ahead_from(location, next, len).await.ok(),
                Some(_) => None,
            };
            sent.push_back((next, pending));
            next += len as u64;
        }
        let (at, pending) = sent.pop_front().expect("a request is in flight while bytes remain");
        let len = (size - at).min(CHUNK as u64) as u32;
        let data = match pending {
            Some((addr, p)) => match p.wait_with_data().await {
                Ok((_, d)) => Some(d),
                Err(e) => {
                    nodes.note(&addr, &e);
                    nodes.read(location, at, len).await.ok()
                }
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
