//! The login proof is bound to the server the client dialled: a server the client merely
//! lists cannot relay another server's challenge and log in there as the client.

use locus_client::{Client, ClientError};
use locus_proto::frame::{self, Header, Kind, Limits, HEADER_LEN};
use locus_proto::ops::{Auth, Hello};
use locus_proto::types::{Challenge, Welcome};
use locus_proto::{auth, codec, Code, Error, Operation};
use locus_testkit::TestServer;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// A transparent relay: each connection to `listener` is joined byte for byte to `to`,
/// as a server the client lists could do with the real server's challenge and the
/// client's answer.
fn relay(listener: TcpListener, to: SocketAddr) {
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(to) else { return };
            for (mut from, mut into) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut into);
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
}

fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

#[tokio::test]
async fn a_server_the_client_lists_cannot_relay_its_login_to_another() {
    let s = TestServer::start();
    let l = listener();
    let other = l.local_addr().unwrap();
    relay(l, s.addr);
    let mut o = s.options("admin");
    o.addr = other.to_string();
    match Client::connect(&o).await {
        Err(ClientError::Auth(msg)) => assert!(msg.contains("does not name this server"), "{msg}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("the relay logged in to the real server as admin"),
    }
    // Straight to the server, by its address or by localhost, the same login works.
    for addr in [s.addr.to_string(), format!("localhost:{}", s.addr.port())] {
        let mut o = s.options("admin");
        o.addr = addr;
        assert_eq!(Client::connect(&o).await.unwrap().subject(), "admin");
    }
}

#[tokio::test]
async fn a_proxy_the_operator_names_carries_logins() {
    let l = listener();
    let proxy = l.local_addr().unwrap();
    let s = TestServer::start_with(|c| c.names.push(proxy.to_string().parse().unwrap()));
    relay(l, s.addr);
    let mut o = s.options("alice");
    o.addr = proxy.to_string();
    assert_eq!(Client::connect(&o).await.unwrap().subject(), "alice");
}

/// A connection speaking the handshake by hand.
struct Raw(TcpStream);

impl Raw {
    fn connect(addr: SocketAddr, version: u16) -> Raw {
        let t = TcpStream::connect(addr).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut r = Raw(t);
        r.0.write_all(&frame::preamble(version)).unwrap();
        let mut p = [0u8; 8];
        r.0.read_exact(&mut p).unwrap();
        r
    }

    /// Sends a request and answers the reply's kind and metadata.
    fn call(&mut self, op: u16, meta: &[u8]) -> (Kind, Vec<u8>) {
        let h = Header { kind: Kind::Request, flags: 0, op, id: 1, meta_len: meta.len() as u32, data_len: 0 };
        self.0.write_all(&h.encode()).unwrap();
        self.0.write_all(meta).unwrap();
        let mut head = [0u8; HEADER_LEN];
        self.0.read_exact(&mut head).unwrap();
        let h = Header::decode(&head, Limits::CLIENT).unwrap();
        let mut rest = vec![0; (h.meta_len + h.data_len) as usize];
        self.0.read_exact(&mut rest).unwrap();
        rest.truncate(h.meta_len as usize);
        (h.kind, rest)
    }

    fn challenge(&mut self) -> Challenge {
        let hello = Hello { version: frame::VERSION, client: "raw".into() };
        let (kind, meta) = self.call(Hello::INFO.code, &codec::encode(&hello));
        assert_eq!(kind, Kind::Reply);
        codec::decode(&meta).unwrap()
    }

    /// Logs in as admin with a proof made for `made_for`, claiming `claimed`.
    fn login(&mut self, made_for: &str, claimed: &str) -> Result<Welcome, Error> {
        let ch = self.challenge();
        let nonce = vec![7u8; auth::NONCE_LEN];
        let bind = auth::Binding { server: made_for, tls: b"" };
        let proof = auth::client_proof(b"admin-token", &ch.nonce, &nonce, "admin", &bind);
        let a = Auth { subject: "admin".into(), nonce, proof, server: claimed.into() };
        match self.call(Auth::INFO.code, &codec::encode(&a)) {
            (Kind::Reply, meta) => Ok(codec::decode(&meta).unwrap()),
            (_, meta) => Err(codec::decode(&meta).unwrap()),
        }
    }
}

#[test]
fn a_proof_made_for_one_address_is_refused_under_another() {
    let s = TestServer::start();
    let (this, also_this) = (s.addr.to_string(), format!("localhost:{}", s.addr.port()));
    assert!(Raw::connect(s.addr, frame::VERSION).login(&this, &this).is_ok());
    assert!(Raw::connect(s.addr, frame::VERSION).login(&also_this, &also_this).is_ok());
    // Made for one of this server's names, presented as another: the proof does not hold.
    let e = Raw::connect(s.addr, frame::VERSION).login(&this, &also_this).unwrap_err();
    assert_eq!(e.code, Code::AUTH_FAILED);
    // Made for, and presented as, another server's address: refused for that.
    let elsewhere = format!("192.0.2.7:{}", s.addr.port());
    let e = Raw::connect(s.addr, frame::VERSION).login(&elsewhere, &elsewhere).unwrap_err();
    assert_eq!(e.code, Code::AUTH_FAILED);
    assert!(e.message.contains("does not name this server"), "{}", e.message);
    let another_port = format!("127.0.0.1:{}", s.addr.port() ^ 1);
    assert!(Raw::connect(s.addr, frame::VERSION).login(&another_port, &another_port).is_err());
}

#[test]
fn a_client_of_the_old_protocol_is_told_to_upgrade() {
    let s = TestServer::start();
    let mut r = Raw::connect(s.addr, 1);
    let hello = Hello { version: 1, client: "old".into() };
    let (kind, meta) = r.call(Hello::INFO.code, &codec::encode(&hello));
    assert_eq!(kind, Kind::Error, "an unbound login must not be offered a challenge");
    let e: Error = codec::decode(&meta).unwrap();
    assert_eq!(e.code, Code::PROTO);
    assert!(e.message.contains("must be upgraded"), "{}", e.message);
}

/// A relay that terminates TLS itself (with the server's own certificate and key, the
/// most it could have) and opens its own TLS session to the server.
fn tls_relay(listener: TcpListener, to: SocketAddr, state: std::path::PathBuf) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let acceptor = locus_server::config::tls_acceptor(&state).unwrap();
            let pem = std::fs::read(state.join("cert.pem")).unwrap();
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile::certs(&mut &pem[..]) {
                roots.add(cert.unwrap()).unwrap();
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((client, _)) = listener.accept().await {
                let (acceptor, connector) = (acceptor.clone(), connector.clone());
                tokio::spawn(async move {
                    let mut client = acceptor.accept(client).await.unwrap();
                    let server = tokio::net::TcpStream::connect(to).await.unwrap();
                    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                    let mut server = connector.connect(name, server).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        })
    });
}

#[tokio::test]
async fn under_tls_the_proof_is_bound_to_the_session() {
    let l = listener();
    let relay_addr = l.local_addr().unwrap();
    // Even a relay whose address the server takes for its own is refused: under TLS the
    // proof covers the session, which the relay cannot share.
    let s = TestServer::start_with(|c| {
        c.tls = true;
        c.names.push(relay_addr.to_string().parse().unwrap());
    });
    let mut o = s.options("admin");
    o.tls_ca = Some(s.state_dir().join("cert.pem"));
    o.tls_name = Some("localhost".into());
    assert_eq!(Client::connect(&o).await.unwrap().subject(), "admin", "TLS login works");
    tls_relay(l, s.addr, s.state_dir());
    o.addr = relay_addr.to_string();
    match Client::connect(&o).await {
        Err(ClientError::Auth(msg)) => assert!(msg.contains("authentication failed"), "{msg}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a TLS-terminating relay logged in as admin"),
    }
}
