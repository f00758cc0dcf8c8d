//! Raw-bytes tests: hand-made frames against a live server, to pin down how it treats
//! malformed, oversized, unauthenticated and pipelined input.

use locus_proto::frame::{self, Header, Kind, FLAG_MORE, HEADER_LEN};
use locus_proto::ops::{Auth, Hello, Ping, Stat};
use locus_proto::types::{Challenge, Welcome};
use locus_proto::{auth, codec, Code, Error, Limits, Operation};
use locus_testkit::TestServer;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

struct Raw(TcpStream);

impl Raw {
    fn connect(s: &TestServer) -> Raw {
        let t = TcpStream::connect(s.addr).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = Raw(t);
        r.0.write_all(&frame::preamble(frame::VERSION)).unwrap();
        let mut p = [0u8; 8];
        r.0.read_exact(&mut p).unwrap();
        assert_eq!(frame::parse_preamble(&p).unwrap(), frame::VERSION);
        r
    }

    fn send(&mut self, op: u16, id: u32, flags: u8, meta: &[u8], data: &[u8]) {
        self.announce(op, id, flags, meta.len() as u32, data.len() as u32);
        self.0.write_all(meta).unwrap();
        self.0.write_all(data).unwrap();
    }

    /// Writes a request header announcing these lengths, and nothing after it.
    fn announce(&mut self, op: u16, id: u32, flags: u8, meta_len: u32, data_len: u32) {
        self.0.write_all(&Header { kind: Kind::Request, flags, op, id, meta_len, data_len }.encode()).unwrap();
    }

    fn recv(&mut self) -> (Header, Vec<u8>, Vec<u8>) {
        let mut head = [0u8; HEADER_LEN];
        self.0.read_exact(&mut head).unwrap();
        let h = Header::decode(&head, Limits::CLIENT).unwrap();
        let mut meta = vec![0; h.meta_len as usize];
        self.0.read_exact(&mut meta).unwrap();
        let mut data = vec![0; h.data_len as usize];
        self.0.read_exact(&mut data).unwrap();
        (h, meta, data)
    }

    fn recv_error(&mut self) -> (u32, Error) {
        let (h, meta, _) = self.recv();
        assert_eq!(h.kind, Kind::Error);
        (h.id, codec::decode(&meta).unwrap())
    }

    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.0.read(&mut b), Ok(0) | Err(_))
    }

    fn login(&mut self, subject: &str) {
        let hello = Hello { version: frame::VERSION, client: "raw".into() };
        self.send(Hello::INFO.code, 1, 0, &codec::encode(&hello), &[]);
        let ch: Challenge = codec::decode(&self.recv().1).unwrap();
        let nonce = vec![3u8; auth::NONCE_LEN];
        let token = format!("{subject}-token");
        let server = self.0.peer_addr().unwrap().to_string();
        let bind = auth::Binding { server: &server, tls: b"" };
        let proof = auth::client_proof(token.as_bytes(), &ch.nonce, &nonce, subject, &bind);
        let a = Auth { subject: subject.into(), nonce: nonce.clone(), proof, server: server.clone() };
        self.send(Auth::INFO.code, 2, 0, &codec::encode(&a), &[]);
        let w: Welcome = codec::decode(&self.recv().1).unwrap();
        assert_eq!(w.proof, auth::server_proof(token.as_bytes(), &ch.nonce, &nonce, subject, &bind));
    }
}

#[test]
fn a_bad_preamble_closes_the_connection() {
    let s = TestServer::start();
    let mut t = TcpStream::connect(s.addr).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    t.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut b = [0u8; 16];
    assert!(matches!(t.read(&mut b), Ok(0) | Err(_)));
}

#[test]
fn operations_before_authentication_are_refused_but_the_connection_stays() {
    let s = TestServer::start();
    let mut r = Raw::connect(&s);
    r.send(Stat::INFO.code, 9, 0, &codec::encode(&Stat { path: "/".into() }), &[]);
    let (id, e) = r.recv_error();
    assert_eq!((id, e.code), (9, Code::NOT_AUTHENTICATED));
    // an auth without a hello first, and one with a wrong proof
    let bad = Auth { subject: "admin".into(), nonce: vec![0; 32], proof: vec![0; 32], server: s.addr.to_string() };
    r.send(Auth::INFO.code, 10, 0, &codec::encode(&bad), &[]);
    assert_eq!(r.recv_error().1.code, Code::AUTH_FAILED);
    r.send(Hello::INFO.code, 11, 0, &codec::encode(&Hello { version: frame::VERSION, client: "x".into() }), &[]);
    r.recv();
    r.send(Auth::INFO.code, 12, 0, &codec::encode(&bad), &[]);
    assert_eq!(r.recv_error().1.code, Code::AUTH_FAILED);
    r.login("admin");
    r.send(Stat::INFO.code, 13, 0, &codec::encode(&Stat { path: "/".into() }), &[]);
    assert_eq!(r.recv().0.kind, Kind::Reply);
}

#[test]
fn bad_requests_get_an_error_and_the_connection_goes_on() {
    let s = TestServer::start();
    let mut r = Raw::connect(&s);
    r.login("admin");
    r.send(Stat::INFO.code, 20, 0, b"\xff\xff\xff\xff\xff\xff", &[]);
    let (id, e) = r.recv_error();
    assert_eq!((id, e.code), (20, Code::BAD_REQUEST));
    r.send(0x7fff, 21, 0, &[], &[]);
    assert_eq!(r.recv_error().1.code, Code::UNKNOWN_OP);
    r.send(Ping::INFO.code, 22, 0, &[], &[]);
    assert_eq!(r.recv().0.id, 22);
}

#[test]
fn oversized_and_broken_frames_get_an_error_then_close() {
    let s = TestServer::start();
    let mut r = Raw::connect(&s);
    r.login("admin");
    r.announce(0x10, 30, 0, 0, u32::MAX);
    let (id, e) = r.recv_error();
    assert_eq!((id, e.code), (30, Code::BAD_REQUEST));
    assert!(e.message.contains("exceeds"), "{}", e.message);
    assert!(r.closed());

    let mut r = Raw::connect(&s);
    let mut head = Header { kind: Kind::Request, flags: 0, op: 3, id: 31, meta_len: 0, data_len: 0 }.encode();
    head[0] = 2; // a client may not send replies
    r.0.write_all(&head).unwrap();
    assert_eq!(r.recv_error().1.code, Code::BAD_REQUEST);
    assert!(r.closed());

    // the server is still serving others
    let mut r = Raw::connect(&s);
    r.login("admin");
}

#[test]
fn pipelined_requests_are_answered_by_id() {
    let s = TestServer::start();
    let mut r = Raw::connect(&s);
    r.login("admin");
    let ids = [700, 5, 1 << 31, 42];
    for id in ids {
        r.send(Ping::INFO.code, id, 0, &[], &[]);
    }
    let mut got: Vec<u32> = (0..ids.len()).map(|_| r.recv().0.id).collect();
    got.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn a_streamed_upload_can_interleave_with_other_requests() {
    let s = TestServer::start();
    let mut r = Raw::connect(&s);
    r.login("admin");
    let put = locus_proto::ops::Put { path: "/up".into(), mode: 0o644 };
    let code = locus_proto::ops::Put::INFO.code;
    r.send(code, 50, FLAG_MORE, &codec::encode(&put), b"abc");
    r.send(Ping::INFO.code, 51, 0, &[], &[]);
    assert_eq!(r.recv().0.id, 51);
    assert!(!s.local("up").exists(), "visible before its last frame");
    r.send(code, 50, FLAG_MORE, &[], b"def");
    r.send(code, 50, 0, &[], b"g");
    let (h, _, _) = r.recv();
    assert_eq!((h.id, h.kind), (50, Kind::Reply));
    assert_eq!(std::fs::read(s.local("up")).unwrap(), b"abcdefg");
}

#[test]
fn a_peer_that_does_not_authenticate_in_time_is_closed() {
    let s = TestServer::start_with(|c| c.auth_timeout = Duration::from_millis(300));
    // One that says nothing after the preamble.
    let mut idle = Raw::connect(&s);
    let started = std::time::Instant::now();
    assert!(idle.closed());
    assert!(started.elapsed() < Duration::from_secs(3), "closed at the deadline, not by the test's timeout");
    // One that starts a frame and sends it slowly.
    let mut slow = Raw::connect(&s);
    slow.announce(Hello::INFO.code, 1, 0, 100, 0);
    slow.0.write_all(b"x").unwrap();
    assert!(slow.closed());
    // One that authenticates in time stays, past the deadline.
    let mut quick = Raw::connect(&s);
    quick.login("admin");
    std::thread::sleep(Duration::from_millis(500));
    quick.send(Ping::INFO.code, 5, 0, &[], &[]);
    assert_eq!(quick.recv().0.id, 5);
}

#[test]
fn frames_before_authentication_are_small() {
    let s = TestServer::start();
    let mut r = Raw::connect(&s);
    // Well under the limits after authentication (1 MiB of metadata), over those before.
    r.announce(Hello::INFO.code, 40, 0, 100_000, 0);
    let (id, e) = r.recv_error();
    assert_eq!((id, e.code), (40, Code::BAD_REQUEST));
    assert!(e.message.contains("exceeds"), "{}", e.message);
    assert!(r.closed());
    // The same frame after authentication is only a bad request.
    let mut r = Raw::connect(&s);
    r.login("admin");
    r.send(Stat::INFO.code, 41, 0, &vec![0xffu8; 100_000], &[]);
    assert_eq!(r.recv_error().1.code, Code::BAD_REQUEST);
    r.send(Ping::INFO.code, 42, 0, &[], &[]);
    assert_eq!(r.recv().0.id, 42);
}
