//! Feeds arbitrary bytes to Locus's two HTTP doors as one whole connection: the web
//! console and its JSON API (`locus serve --http-port` on a plain server) when the first
//! byte is even, and a cluster head's file door (bearer tokens, signed URLs, ranges,
//! redirects) when it is odd; the rest is the request stream. Nothing may panic; both
//! doors must keep answering; nothing may appear beside the export roots, and the canary
//! outside them must never be read back.
//! Run: `cargo +nightly fuzz run http_door -- -max_total_time=1800`
#![no_main]

#[path = "endpoint.rs"]
mod endpoint;

use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;
use std::sync::OnceLock;

struct Door {
    server: locus_testkit::TestServer,
    addr: SocketAddr,
    beside: Vec<std::path::PathBuf>,
}

struct Target {
    console: Door,
    head: Door,
}

fn target() -> &'static Target {
    static TARGET: OnceLock<Target> = OnceLock::new();
    TARGET.get_or_init(|| {
        endpoint::ignore_sigpipe();
        let plain = locus_testkit::TestServer::start();
        endpoint::furnish(&plain.root());
        let addr = plain.console(locus_console::ConsoleConfig::default());
        let console = Door { beside: endpoint::beside_root(&plain.root()), server: plain, addr };

        let head = locus_testkit::TestServer::head(None, |_| {});
        endpoint::furnish(&head.root());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let admin = head.client("admin").await;
            admin.mkdir("/d", 0o755).await.unwrap();
            admin.put("/d/a.txt", 0o644, &mut &b"alpha\n"[..], |_| {}).await.unwrap();
        });
        let addr = head.http();
        let head = Door { beside: endpoint::beside_root(&head.root()), server: head, addr };
        Target { console, head }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, request)) = data.split_first() else { return };
    let t = target();
    let door = if which % 2 == 0 { &t.console } else { &t.head };
    let answer = endpoint::exchange(door.addr, request, true, endpoint::QUICK);
    assert!(!answer.windows(18).any(|w| w == b"outside the export"), "the canary was read");
    assert_eq!(endpoint::beside_root(&door.server.root()), door.beside, "something appeared beside the export");
    let again = endpoint::exchange(
        door.addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        false,
        endpoint::PATIENT,
    );
    assert!(again.starts_with(b"HTTP/1.1 "), "{:?}", String::from_utf8_lossy(&again));
});
