//! Making a connection with [`crate::ConnectOptions`] (see `options.rs`): TCP
//! keepalive, TLS, the preamble and the login handshake.

use crate::error::Result;
use crate::nodes;
use crate::options::ConnectOptions;
use crate::receive::read_loop;
use crate::BoxRead;
use crate::BoxWrite;
use crate::Client;
use crate::ClientError;
use crate::Inner;
use crate::LocusUrl;
use locus_proto::auth;
use locus_proto::frame::{self};
use locus_proto::ops::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;

/// How often a connection with [`Client::keep_alive`] pings the server.
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a heartbeat's ping may go unanswered before the server is taken for gone.
pub const HEARTBEAT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// Turns TCP keepalive on for a connection's socket: probes after 10 s idle, every 2 s,
/// 3 times (the server does the same on its end).
pub(crate) fn keepalive(socket: RawFd) {
    let set = |level, name, v: libc::c_int| {
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `socket` is the connection's open socket; `v` is an int of the size given.
        unsafe { libc::setsockopt(socket, level, name, (&v as *const libc::c_int).cast(), size) };
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
}

pub(crate) async fn tls_connect(
    tcp: TcpStream,
    ca: &std::path::Path,
    opts: &ConnectOptions,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let pem = std::fs::read(ca).map_err(|e| ClientError::Config(format!("TLS CA file {}: {e}", ca.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| ClientError::Config(format!("TLS CA file: {e}")))?;
        roots.add(cert).map_err(|e| ClientError::Config(format!("TLS CA file: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = opts.tls_name.clone().unwrap_or_else(|| {
        opts.addr.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']']).to_string()).unwrap_or_default()
    });
    let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| ClientError::Config(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    Ok(connector.connect(name, tcp).await?)
}

impl Client {
    /// Connects and authenticates, within the options' connect deadline.
    ///
    /// `opts.addr` may name several servers of one namespace (`h1:9610,h2:9610`: the
    /// heads of a cluster): they are tried in order, the next when one cannot be
    /// reached or does not answer in time (not when it refuses the login).
    pub async fn connect(opts: &ConnectOptions) -> Result<Client> {
        let mut last = None;
        for addr in opts.addr.split(',') {
            let one = opts.for_one(addr);
            let outcome = match tokio::time::timeout(one.deadlines.connect, Self::connect_now(&one)).await {
                Ok(client) => client,
                Err(_) => Err(ClientError::TimedOut(format!(
                    "{} did not answer the connection within {:?}",
                    one.addr, one.deadlines.connect
                ))),
            };
            match outcome {
                Err(e) if e.is_transient() => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Config("no server address".into())))
    }

    /// Connects and authenticates, however long it takes.
    pub(crate) async fn connect_now(opts: &ConnectOptions) -> Result<Client> {
        let tcp = TcpStream::connect(&opts.addr).await?;
        tcp.set_nodelay(true)?;
        keepalive(std::os::fd::AsRawFd::as_raw_fd(&tcp));
        let socket = opts.tls_ca.is_none().then(|| std::os::fd::AsRawFd::as_raw_fd(&tcp));
        // The login proof covers this TLS session's exporter secret (none on plain TCP).
        let mut exporter = Vec::new();
        let (r, w): (BoxRead, BoxWrite) = match &opts.tls_ca {
            None => {
                let (r, w) = tcp.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(ca) => {
                let tls = tls_connect(tcp, ca, opts).await?;
                exporter = tls
                    .get_ref()
                    .1
                    .export_keying_material(vec![0; auth::TLS_EXPORTER_LEN], auth::TLS_EXPORTER_LABEL, None)
                    .map_err(|e| ClientError::Protocol(format!("TLS exporter: {e}")))?;
                let (r, w) = tokio::io::split(tls);
                (Box::new(r), Box::new(w))
            }
        };
        let mut reader = BufReader::with_capacity(256 * 1024, r);
        let mut writer = BufWriter::with_capacity(128 * 1024, w);
        writer.write_all(&frame::preamble(frame::VERSION)).await?;
        writer.flush().await?;
        let mut pre = [0u8; 8];
        reader.read_exact(&mut pre).await?;
        // Something other than a Locus server answered at this address: a wrong address
        // (see `NotLocus`), or, for a caller that reached a Locus server there before, a
        // middlebox while the route to it is gone.
        frame::parse_preamble(&pre).map_err(|e| ClientError::NotLocus(format!("{}: {e}", opts.addr)))?;

        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(writer),
            waiters: Mutex::new(HashMap::new()),
            closed: Mutex::new(false),
            next_id: AtomicU32::new(1),
            pushes: Mutex::new(None),
            unpromised: Mutex::new(Vec::new()),
            dead: Arc::new(tokio::sync::Notify::new()),
        });
        tokio::spawn(read_loop(reader, socket, Arc::downgrade(&inner), inner.dead.clone()));
        let nodes = Arc::new(nodes::NodeReads::with_deadlines(opts.deadlines));
        let mut client =
            Client { inner, client_id: 0, subject: String::new(), nodes, deadlines: opts.deadlines, heads: Vec::new() };

        let challenge = client
            .call(Hello { version: frame::VERSION, client: format!("locus-client {}", env!("CARGO_PKG_VERSION")) })
            .await?;
        // An older server would take a proof that is not bound to it: never send one.
        if challenge.version < frame::MIN_VERSION {
            return Err(ClientError::Protocol(format!(
                "the server at {} speaks Locus protocol {}, older than this client's {}: upgrade the server",
                opts.addr,
                challenge.version,
                frame::VERSION
            )));
        }
        let mut nonce = vec![0u8; auth::NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the OS provides randomness");
        let c = &opts.credentials;
        let bind = auth::Binding { server: &opts.addr, tls: &exporter };
        let proof = auth::client_proof(c.token.as_bytes(), &challenge.nonce, &nonce, &c.subject, &bind);
        let auth = Auth { subject: c.subject.clone(), nonce: nonce.clone(), proof, server: opts.addr.clone() };
        let welcome = match client.call(auth).await {
            Ok(w) => w,
            Err(ClientError::Remote(e)) => return Err(ClientError::Auth(e.message)),
            Err(e) => return Err(e),
        };
        let expected = auth::server_proof(c.token.as_bytes(), &challenge.nonce, &nonce, &c.subject, &bind);
        if !auth::proofs_equal(&expected, &welcome.proof) {
            return Err(ClientError::Auth("the server could not prove it knows the token".into()));
        }
        client.client_id = welcome.client_id;
        client.subject = welcome.subject;
        client.nodes.set_head(welcome.head, opts.tls_ca.as_deref());
        client.heads = welcome.heads;
        Ok(client)
    }

    /// Connects to the server of a URL with credentials found for it.
    pub async fn connect_url(url: &LocusUrl) -> Result<Client> {
        Client::connect(&ConnectOptions::for_url(url)?).await
    }

    /// Sends a heartbeat on this connection, every [`HEARTBEAT_EVERY`], while it is
    /// open: the server then keeps it only while they come (it is where callback
    /// breaks go), and a ping unanswered for [`HEARTBEAT_TIMEOUT`] ends the connection
    /// here (a frozen server or a cut link), so pushes' subscribers see the end and
    /// calls fail as transient. Needs a runtime that runs while the client is idle.
    pub fn keep_alive(&self) {
        let (weak, template) = (Arc::downgrade(&self.inner), self.clone());
        // The task must not keep the connection open: it holds it only to ping.
        let (client_id, subject, nodes) = (template.client_id, template.subject.clone(), template.nodes.clone());
        let deadlines = template.deadlines;
        drop(template);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(HEARTBEAT_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                if *inner.closed.lock() {
                    return;
                }
                let dead = inner.dead.clone();
                let (subject, nodes) = (subject.clone(), nodes.clone());
                let client = Client { inner, client_id, subject, nodes, deadlines, heads: Vec::new() };
                match tokio::time::timeout(HEARTBEAT_TIMEOUT, client.ping()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(ClientError::Remote(_))) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        dead.notify_one();
                        return;
                    }
                }
            }
        });
    }
}
