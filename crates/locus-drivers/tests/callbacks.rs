//! The Locus driver's callbacks through a TCP relay that a test can freeze: a link that
//! stops forwarding without closing (a hung peer, a cut cable) is noticed within seconds
//! at both ends, and nothing cached before it is trusted after.

use locus_drivers::{Break, Driver};
use locus_testkit::TestServer;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Forwards every connection made to it to `to`; while frozen, holds what it reads
/// instead of passing it on, and closes nothing. Once [`Relay::become_other`], it closes
/// what it forwards and answers every new connection as something other than Locus.
struct Relay {
    addr: SocketAddr,
    frozen: Arc<AtomicBool>,
    other: Arc<AtomicBool>,
}

impl Relay {
    fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (frozen, other) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (f, o) = (frozen.clone(), other.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                // A frozen relay does not even take new connections on.
                while f.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if o.load(Ordering::SeqCst) {
                    let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
                    continue;
                }
                let Ok(server) = TcpStream::connect(to) else { continue };
                for (mut from, mut into) in
                    [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    let (f, o) = (f.clone(), o.clone());
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 << 10];
                        // Reads time out now and then, so that becoming another is seen
                        // on an idle link.
                        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
                        while !o.load(Ordering::SeqCst) {
                            let n = match from.read(&mut buf) {
                                Ok(n) => n,
                                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
                                Err(_) => 0,
                            };
                            // Frozen: nothing passes, not even the end of the stream.
                            while f.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            // Become another while a read was under way: what it read
                            // is not passed on either.
                            if n == 0 || o.load(Ordering::SeqCst) || into.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = into.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { addr, frozen, other }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }

    fn become_other(&self) {
        self.other.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_frozen_link_is_noticed_within_seconds_and_nothing_cached_before_is_trusted() {
    // The client dials the relay: the server is told that address names it.
    let srv = TestServer::start_with(|c| c.names.push("127.0.0.1:*".parse().unwrap()));
    srv.put_local("d/f", b"one");
    srv.put_local("e/g", b"unchanged");
    let relay = Relay::start(srv.addr);
    let mut options = srv.options("admin");
    options.addr = relay.addr.to_string();
    let mut d = locus_drivers::locus::LocusDriver::with_options(options).expect("connects through the relay");
    let breaks = d.callbacks(1000).expect("the server promises callbacks");
    assert_eq!(d.lstat("/d/f").unwrap().size, 3);
    // A promise nothing will break: only the end of the connection its breaks go to
    // takes it away.
    d.lstat("/e/g").unwrap();
    assert!(d.callbacks_held());
    assert_eq!(srv.shared().callbacks.held(), 2);
    // Heartbeats have started on the connection breaks go to.
    std::thread::sleep(locus_client::HEARTBEAT_EVERY + Duration::from_millis(500));
    while breaks.try_recv().is_ok() {}

    relay.freeze();
    let frozen = Instant::now();
    // Another client changes the file meanwhile: its break cannot get through.
    std::fs::write(srv.local("d/f"), b"two, longer").unwrap();
    // The driver says every promise is gone, within the heartbeat's bound (2 s between
    // pings, 4 s for an answer; slack for a loaded machine)...
    loop {
        match breaks.recv_timeout(Duration::from_secs(20)) {
            Ok(Break::All) => break,
            Ok(Break::Paths(_)) => continue,
            Err(e) => panic!("no Break::All within 20 s of the freeze: {e}"),
        }
    }
    let noticed = frozen.elapsed();
    assert!(noticed < Duration::from_secs(12), "noticed after {noticed:?}");
    assert!(!d.callbacks_held(), "no promise is trusted while the listener is down");
    // ...and the server drops the promises of the connection that stopped answering.
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.shared().callbacks.held() > 0 {
        assert!(Instant::now() < deadline, "the server still holds promises 20 s after the freeze");
        std::thread::sleep(Duration::from_millis(100));
    }
    let dropped = frozen.elapsed();
    assert!(dropped < Duration::from_secs(16), "the server dropped them after {dropped:?}");
    eprintln!("frozen link noticed by the driver after {noticed:?}, by the server after {dropped:?}");

    // Once the link works again, the driver asks the server, and sees the change.
    relay.thaw();
    assert_eq!(d.lstat("/d/f").unwrap().size, 11);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Promised again once the listener is back.
        d.lstat("/d/f").unwrap();
        if d.callbacks_held() {
            break;
        }
        assert!(Instant::now() < deadline, "callbacks not held again 20 s after the thaw");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(srv.local("d/f"), b"three").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match breaks.recv_timeout(Duration::from_millis(200)) {
            Ok(Break::Paths(p)) if p.contains(&"/d/f".to_string()) => break,
            _ => assert!(Instant::now() < deadline, "no break for /d/f after the reconnection"),
        }
    }
}

#[test]
fn a_call_over_a_frozen_link_fails_after_the_heartbeat_and_the_retry_window() {
    let srv = TestServer::start_with(|c| c.names.push("127.0.0.1:*".parse().unwrap()));
    srv.put_local("d/f", b"one");
    let relay = Relay::start(srv.addr);
    let mut options = srv.options("admin");
    options.addr = relay.addr.to_string();
    let mut d = locus_drivers::locus::LocusDriver::with_options(options).expect("connects through the relay");
    d.set_retry(Duration::from_secs(1));
    let _breaks = d.callbacks(1000).expect("the server promises callbacks");
    assert_eq!(d.lstat("/d/f").unwrap().size, 3);

    // A store sent into a link that says nothing: the callback listener's heartbeat
    // finds the link silent (2 s between pings, 4 s for an answer) and ends the
    // driver's connection too, reconnecting fails for the retry window (one attempt of
    // at most 5 s), and the call fails as the server being away, long before the 60 s
    // request deadline.
    relay.freeze();
    let frozen = Instant::now();
    let e = d.store_file("/d/g", 0o644, b"kept by the caller").unwrap_err();
    let failed = frozen.elapsed();
    assert!(e.is_transient(), "{e}");
    assert!(failed < Duration::from_secs(20), "failed after {failed:?}");
    assert!(failed >= locus_client::HEARTBEAT_TIMEOUT, "failed after {failed:?}: before any ping could go unanswered");
    relay.thaw();
    d.store_file("/d/g", 0o644, b"kept by the caller").unwrap();
    assert_eq!(std::fs::read(srv.local("d/g")).unwrap(), b"kept by the caller");
}

#[test]
fn something_other_than_locus_at_the_address_is_a_mistake_at_first_and_the_server_away_later() {
    let srv = TestServer::start_with(|c| c.names.push("127.0.0.1:*".parse().unwrap()));
    srv.put_local("d/f", b"one");
    // A relay to the server that can become something else: it then cuts what it
    // forwarded and answers every new connection as another service would (or a
    // middlebox while the route to the server is gone).
    let relay = Relay::start(srv.addr);
    let mut options = srv.options("admin");
    options.addr = relay.addr.to_string();
    let mut d = locus_drivers::locus::LocusDriver::with_options(options.clone()).expect("connects through the relay");
    d.set_retry(Duration::from_secs(1));
    assert_eq!(d.lstat("/d/f").unwrap().size, 3);

    relay.become_other();
    // A first connection answered by something else is a mistake (a wrong port), said
    // at once, not retried as if the server were away.
    let e = locus_drivers::locus::LocusDriver::with_options(options).err().expect("not a Locus server");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("not a Locus peer"), "{e}");

    // Where a Locus server answered before, something else answering is the server being
    // away: retried for the window, then a transient failure (which a mount's write-back
    // keeps its copy through), not an answer for good.
    let started = Instant::now();
    let e = d.lstat("/d/f").unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("not a Locus peer"), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(900), "retried for the window: {:?}", started.elapsed());
}
