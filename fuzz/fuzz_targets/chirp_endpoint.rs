//! Feeds arbitrary bytes to Locus's Chirp endpoint (`locus serve --chirp-port`) as one
//! whole connection: authentication lines, commands, counts and payloads. The client may
//! authenticate as `address:127.0.0.1`, which holds every right at the export's root, so
//! inputs reach every command. Nothing may panic; the endpoint must keep answering;
//! nothing may appear beside the export root, and the canary outside it must never be
//! read back.
//! Run: `cargo +nightly fuzz run chirp_endpoint -- -max_total_time=1800`
#![no_main]

#[path = "endpoint.rs"]
mod endpoint;

use libfuzzer_sys::fuzz_target;
use locus_server::chirp::{AuthMethod, ChirpConfig};
use std::net::SocketAddr;
use std::sync::OnceLock;

struct Target {
    server: locus_testkit::TestServer,
    chirp: SocketAddr,
    beside: Vec<std::path::PathBuf>,
}

fn target() -> &'static Target {
    static TARGET: OnceLock<Target> = OnceLock::new();
    TARGET.get_or_init(|| {
        endpoint::ignore_sigpipe();
        let server = locus_testkit::TestServer::start();
        endpoint::furnish(&server.root());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let admin = server.client("admin").await;
            admin
                .acl_set("/", "address:127.0.0.1", locus_proto::types::Rights::parse("rwldax").unwrap())
                .await
                .unwrap();
        });
        let config = ChirpConfig { methods: vec![AuthMethod::Address], ..Default::default() };
        let chirp = server.chirp(config);
        let beside = endpoint::beside_root(&server.root());
        Target { server, chirp, beside }
    })
}

fuzz_target!(|data: &[u8]| {
    let t = target();
    // Most inputs should get past authentication: prefix the handshake unless the input
    // starts with its own.
    let mut input = Vec::with_capacity(data.len() + 16);
    if !data.starts_with(b"address") && !data.first().is_some_and(|b| *b == b'#') {
        input.extend_from_slice(b"address\n");
    }
    input.extend_from_slice(data);
    let answer = endpoint::exchange(t.chirp, &input, true, endpoint::QUICK);
    assert!(!answer.windows(18).any(|w| w == b"outside the export"), "the canary was read");
    assert_eq!(endpoint::beside_root(&t.server.root()), t.beside, "something appeared beside the export");
    // Still serving: a fresh client authenticates (three tries of 20 s, so that work the
    // fuzzed connection left running, such as a hash of a large sparse file, is not taken
    // for a dead endpoint).
    let alive = (0..3).any(|_| {
        let again = endpoint::exchange(t.chirp, b"address\nwhoami\n", true, endpoint::PATIENT);
        again.windows(9).any(|w| w == b"127.0.0.1")
    });
    assert!(alive, "the Chirp endpoint stopped answering");
});
