//! A cluster of real servers on ephemeral ports: a head (SQLite, or PostgreSQL when it
//! is installed) with data nodes, and clients reading third-party.

use locus_client::nodes::NodeReads;
use locus_client::Client;
use locus_proto::capability;
use locus_proto::types::{open_flags, Location, Rights};
use locus_proto::Code;
use locus_server::cluster::HeadConfig;
use locus_testkit::TestServer;

const MIB: usize = 1 << 20;

/// Bytes that differ at every offset and from one `seed` to another.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(seed as u32) as u8 ^ seed).collect()
}

/// Versions a node keeps (not their checksum files).
fn objects_on(node: &TestServer) -> usize {
    let dir = std::fs::read_dir(node.root().join(locus_server::cluster::objects::OBJECTS_DIR));
    dir.map_or(0, |d| {
        d.flatten()
            .filter(|e| !e.file_name().to_string_lossy().ends_with(locus_server::cluster::checksums::SUFFIX))
            .count()
    })
}

fn code(e: locus_client::ClientError) -> Code {
    e.code()
}

async fn located(c: &Client, path: &str) -> (u64, Location) {
    let opened = c.open(path, open_flags::READ, 0).await.unwrap();
    (opened.handle, opened.location.expect("a large file on a data node is located"))
}

/// The whole suite, against a head whose namespace is at `meta`.
async fn third_party_suite(meta: Option<&str>) {
    let head = TestServer::head(meta, |h| h.replication = 1);
    let (n1, n2) = (TestServer::data_node(&head), TestServer::data_node(&head));
    let admin = head.client("admin").await;

    // Small files stay in the namespace; large ones go to a node and are read from it.
    admin.mkdir("/data", 0o755).await.unwrap();
    let big = pattern(3 * MIB + 123, 1);
    admin.write_file("/data/big", 0o644, &big).await.unwrap();
    admin.write_file("/data/small", 0o644, b"small").await.unwrap();
    assert_eq!(objects_on(&n1) + objects_on(&n2), 1);
    assert_eq!(admin.read_file("/data/big").await.unwrap(), big);
    assert_eq!(admin.read_file("/data/small").await.unwrap(), b"small");
    let names: Vec<String> = admin.readdir("/data").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["big", "small"]);

    // pread through the handle goes to the node; the bytes are the file's.
    let (h, loc) = located(&admin, "/data/big").await;
    assert_eq!(admin.pread(h, MIB as u64, 1000).await.unwrap(), big[MIB..MIB + 1000]);
    let reads = NodeReads::default();
    assert_eq!(reads.read(&loc, 5, 10).await.unwrap(), big[5..15]);

    // Capabilities: forged, for another object or version, expired, or presented by
    // another subject are refused by the node.
    let key = head.shared().head.as_ref().unwrap().key().to_vec();
    let mut forged = loc.clone();
    forged.capability.version += 1;
    assert_eq!(code(reads.read(&forged, 0, 10).await.unwrap_err()), Code::ACCES);
    let mut other = loc.clone();
    other.capability.object += 1;
    assert_eq!(code(reads.read(&other, 0, 10).await.unwrap_err()), Code::ACCES);
    let mut expired = loc.clone();
    let c = &loc.capability;
    expired.capability = capability::sign(&key, &c.subject, c.object, c.version, c.size, 1);
    assert_eq!(code(reads.read(&expired, 0, 10).await.unwrap_err()), Code::ACCES);
    // alice holds a token for the nodes of her own, but not admin's capability.
    admin.acl_set("/data", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    let alice = head.client("alice").await;
    let (_, alice_loc) = located(&alice, "/data/big").await;
    let mut stolen = loc.clone();
    stolen.node_token = alice_loc.node_token.clone();
    stolen.capability.subject = "alice".into();
    assert_eq!(code(NodeReads::default().read(&stolen, 0, 10).await.unwrap_err()), Code::ACCES);
    assert_eq!(NodeReads::default().read(&alice_loc, 0, 10).await.unwrap(), big[..10]);
    assert_eq!(code(alice.write_file("/data/x", 0o644, b"no").await.unwrap_err()), Code::ACCES);

    // An overwrite during a read: the reader keeps reading the version it opened.
    let newer = pattern(2 * MIB, 2);
    admin.write_file("/data/big", 0o644, &newer).await.unwrap();
    let mut old = Vec::new();
    for at in (0..big.len()).step_by(MIB) {
        old.extend_from_slice(&admin.pread(h, at as u64, MIB as u32).await.unwrap());
    }
    assert_eq!(old, big);
    admin.close(h).await.unwrap();
    assert_eq!(admin.read_file("/data/big").await.unwrap(), newer);

    // Renames move names, not bytes; removal leaves the bytes until no read needs them.
    admin.rename("/data/big", "/data/renamed").await.unwrap();
    assert_eq!(admin.read_file("/data/renamed").await.unwrap(), newer);
    assert_eq!(code(admin.stat("/data/big").await.unwrap_err()), Code::NOENT);
    admin.unlink("/data/renamed").await.unwrap();
    assert_eq!(code(admin.rmdir("/").await.unwrap_err()), Code::INVAL);
    assert_eq!(code(admin.rmdir("/data").await.unwrap_err()), Code::NOTEMPTY);

    // Writes through a handle become the new version on close.
    let h = admin.open("/data/small", open_flags::WRITE, 0).await.unwrap().handle;
    admin.pwrite(h, 5, b" and more").await.unwrap();
    admin.close(h).await.unwrap();
    assert_eq!(admin.read_file("/data/small").await.unwrap(), b"small and more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_reads_with_the_embedded_namespace() {
    third_party_suite(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_node_killed_mid_read_fails_over_or_fails_cleanly() {
    // Two replicas: the reader goes on at the other node.
    let head = TestServer::head(None, |h| h.replication = 2);
    let n1 = TestServer::data_node(&head);
    let n2 = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    let data = pattern(4 * MIB, 3);
    admin.write_file("/f", 0o644, &data).await.unwrap();
    assert_eq!((objects_on(&n1), objects_on(&n2)), (1, 1));
    let (h, loc) = located(&admin, "/f").await;
    assert_eq!(loc.nodes.len(), 2);
    let first = admin.pread(h, 0, MIB as u32).await.unwrap();
    let (dead, alive) = if loc.nodes[0] == n1.addr.to_string() { (n1, n2) } else { (n2, n1) };
    drop(dead);
    let mut got = first.to_vec();
    for at in (MIB..data.len()).step_by(MIB) {
        got.extend_from_slice(&admin.pread(h, at as u64, MIB as u32).await.unwrap());
    }
    assert_eq!(got, data);
    assert_eq!(admin.read_file("/f").await.unwrap(), data);

    // One replica, and its node gone: reads fail, and never with wrong bytes.
    drop(alive);
    let err = admin.read_file("/f").await.unwrap_err();
    assert_eq!(code(err), Code::IO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_without_data_nodes_keeps_contents_itself() {
    let meta = tempfile::tempdir().unwrap();
    let meta = meta.path().join("meta.db");
    let head = TestServer::head(Some(meta.to_str().unwrap()), |_| {});
    let admin = head.client("admin").await;
    let data = pattern(2 * MIB, 4);
    admin.write_file("/f", 0o644, &data).await.unwrap();
    let opened = admin.open("/f", open_flags::READ, 0).await.unwrap();
    assert!(opened.location.is_none());
    assert_eq!(admin.read_file("/f").await.unwrap(), data);
    // The namespace survives a restart of the head.
    drop(admin);
    drop(head);
    let again = TestServer::head(Some(meta.to_str().unwrap()), |_| {});
    let admin = again.client("admin").await;
    assert_eq!(admin.stat("/f").await.unwrap().size, data.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_open_for_reading_outlives_its_replacement_until_closed() {
    use std::time::{Duration, Instant};
    // Capabilities of a second: a replaced version is due for collection 6 s later.
    let head = TestServer::head(None, |h| h.capability_ttl = Duration::from_secs(1));
    let admin = head.client("admin").await;
    // Larger than the namespace keeps, smaller than third-party reads: the head serves it.
    let v1 = pattern(200 << 10, 7);
    admin.write_file("/f", 0o644, &v1).await.unwrap();
    let opened = admin.open("/f", open_flags::READ, 0).await.unwrap();
    assert!(opened.location.is_none(), "the head serves this read itself");
    let v2 = pattern(200 << 10, 8);
    admin.write_file("/f", 0o644, &v2).await.unwrap();
    let objects = head.state_dir().join("objects");
    let versions = || std::fs::read_dir(&objects).map_or(0, |d| d.count());
    assert_eq!(versions(), 2);
    // Well past the time the old version was due, and several collector rounds.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(versions(), 2, "a version open for reading is not collected");
    assert_eq!(
        admin.pread(opened.handle, 1000, 100).await.unwrap(),
        v1[1000..1100],
        "the open handle reads its version"
    );
    admin.close(opened.handle).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while versions() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(versions(), 1, "once closed, the old version is collected");
    assert_eq!(admin.read_file("/f").await.unwrap(), v2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_heads_share_the_namespace_and_survive_a_head_dying() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = locus_testkit::TestPostgres::start();
    // The same suite as the embedded namespace.
    third_party_suite(Some(&format!("{}?application_name=suite", pg.url()))).await;

    // Two heads on one database, one data node; writes through the first until it dies.
    let url = pg.url();
    let a = TestServer::head(Some(&url), |_| {});
    let b = TestServer::head(Some(&url), |_| {});
    let _node = TestServer::data_node(&a);
    // Both heads hold the same keys (they share the wrap key); the database only sealed.
    let keys = a.shared().head.as_ref().unwrap().keys();
    assert_eq!(b.shared().head.as_ref().unwrap().keys(), keys);
    for (name, value) in locus_cluster::Meta::open(&url, "admin").unwrap().settings().unwrap() {
        assert!(!holds_key(value.as_bytes(), &keys.current), "setting {name} holds the cluster key");
    }
    let writer = a.client("admin").await;
    writer.mkdir("/acked", 0o755).await.unwrap();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let writes = tokio::spawn(async move {
        let mut acked = Vec::new();
        for i in 0u32.. {
            if stop_rx.try_recv().is_ok() {
                break;
            }
            let data = pattern(if i % 3 == 0 { 200_000 } else { 100 }, i as u8);
            match writer.write_file(&format!("/acked/{i}"), 0o644, &data).await {
                Ok(_) => acked.push((i, data)),
                Err(e) => {
                    eprintln!("write {i} failed: {e}");
                    break;
                }
            }
        }
        acked
    });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    drop(a);
    let _ = stop_tx.send(());
    let acked = writes.await.unwrap();
    assert!(acked.len() > 3, "only {} writes before the head died", acked.len());
    let reader = b.client("admin").await;
    for (i, data) in &acked {
        assert_eq!(&reader.read_file(&format!("/acked/{i}")).await.unwrap(), data, "acknowledged write {i}");
    }
    // The surviving head goes on serving writes.
    reader.write_file("/acked/after", 0o644, b"still here").await.unwrap();
    assert_eq!(reader.read_file("/acked/after").await.unwrap(), b"still here");
}

#[test]
fn head_defaults_match_the_design() {
    let c = HeadConfig::new("x");
    assert_eq!((c.tp_threshold, c.inline_max, c.replication), (1 << 20, 64 << 10, 1));
}

/// Serves HTTP for `server` on an ephemeral port of this runtime; answers its address.
async fn http_for(server: &TestServer) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(locus_server::http::serve(listener, server.shared().clone()));
    addr
}

/// Serves HTTP for `server` on an ephemeral port of `ip` (`0.0.0.0`: every interface, as
/// an operator exposing it would); answers that port's address on loopback, which
/// reaches it too, so the test sends nothing off this host.
async fn http_on(server: &TestServer, ip: &str) -> String {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(locus_server::http::serve(listener, server.shared().clone()));
    format!("127.0.0.1:{port}")
}

fn curl(args: &[&str]) -> (String, Vec<u8>) {
    let out =
        std::process::Command::new("curl").args(["-s", "-w", "\n%{http_code}"]).args(args).output().expect("curl");
    let mut body = out.stdout;
    let split = body.iter().rposition(|&b| b == b'\n').unwrap();
    let status = String::from_utf8(body.split_off(split)).unwrap().trim().to_string();
    (status, body)
}

/// What curl's `--write-out FORMAT` says of a request.
fn curl_write_out(args: &[&str], format: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", format])
        .args(args)
        .output()
        .expect("curl");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_follows_the_heads_redirect_to_a_data_node() {
    let head = TestServer::head(None, |_| {});
    // A node that joins only when the test says (with its HTTP address), not on its own.
    let node = TestServer::start();
    std::fs::create_dir_all(node.root().join(locus_server::cluster::objects::OBJECTS_DIR)).unwrap();
    let head_http = http_for(&head).await;
    let node_http = http_for(&node).await;
    locus_server::cluster::node::join(
        node.shared(),
        &head.options("locus-node"),
        &node.addr.to_string(),
        Some(&node_http),
    )
    .await
    .unwrap();
    let admin = head.client("admin").await;
    let big = pattern(3 * MIB, 5);
    admin.write_file("/big", 0o644, &big).await.unwrap();
    admin.write_file("/small", 0o644, b"tiny").await.unwrap();
    let bearer = "Authorization: Bearer admin:admin-token";
    let url = format!("http://{head_http}/big");

    // The head redirects; curl follows to the node and gets the right bytes, ranges too.
    let (status, _) = curl(&["-H", bearer, &url]);
    assert_eq!(status, "307");
    assert_eq!(curl(&["-L", "-H", bearer, &url]), ("200".into(), big.clone()));
    assert_eq!(curl(&["-L", "-H", bearer, "-r", "1000-1999", &url]), ("206".into(), big[1000..2000].to_vec()));
    assert_eq!(curl(&["-L", "-H", bearer, "-r", "-10", &url]), ("206".into(), big[big.len() - 10..].to_vec()));
    let effective = curl_write_out(&["-L", "-H", bearer, &url], "%{url_effective}");
    assert!(effective.starts_with(&format!("http://{node_http}/o/")), "the node served the bytes");
    // Small files and listings come from the head; no credentials, no bytes.
    assert_eq!(curl(&["-H", bearer, &format!("http://{head_http}/small")]), ("200".into(), b"tiny".to_vec()));
    assert_eq!(curl(&["-H", bearer, &format!("http://{head_http}/")]).1, b"big\nsmall\n");
    assert_eq!(curl(&[&url]).0, "401");
    assert_eq!(curl(&["-H", "Authorization: Bearer admin:wrong", &url]).0, "401");
    assert_eq!(curl(&["-H", "Authorization: Bearer alice:alice-token", &url]).0, "403");

    // A shared URL works without credentials until it expires; altered, it does not.
    let shared = admin.call(locus_proto::ops::Share { path: "/big".into(), ttl_s: 60 }).await.unwrap();
    let shared = format!("http://{head_http}{shared}");
    assert_eq!(curl(&["-L", &shared]), ("200".into(), big.clone()));
    assert_eq!(curl(&["-L", &shared.replace("/big?", "/small?")]).0, "401");

    // The node's URL is bound to its object and version: another one is refused.
    let redirect = curl_write_out(&["-H", bearer, &url], "%{redirect_url}");
    let other = redirect.replacen("/o/", "/o/9", 1);
    assert_eq!(curl(&[&other]).0, "403");
    admin.write_file("/big", 0o644, &pattern(3 * MIB, 6)).await.unwrap();
    // The old version's URL still serves the old bytes while its capability is valid.
    assert_eq!(curl(&[&redirect]), ("200".into(), big));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_is_taken_over_plain_http_only_on_loopback() {
    let head = TestServer::head(None, |_| {});
    let admin = head.client("admin").await;
    admin.write_file("/small", 0o644, b"tiny").await.unwrap();
    let bearer = "Authorization: Bearer admin:admin-token";
    // On loopback the token never leaves the host: it is taken.
    let local = http_for(&head).await;
    assert_eq!(curl(&["-H", bearer, &format!("http://{local}/small")]), ("200".into(), b"tiny".to_vec()));
    // Listening on every interface over plain HTTP, the same request is refused, saying why.
    let exposed = http_on(&head, "0.0.0.0").await;
    let (status, body) = curl(&["-H", bearer, &format!("http://{exposed}/small")]);
    let why = String::from_utf8_lossy(&body);
    assert_eq!(status, "403", "{why}");
    assert!(why.contains("plain HTTP") && why.contains("loopback") && why.contains("TLS"), "{why}");
    assert!(!why.contains("tiny"));
    assert_eq!(curl(&["-H", "Authorization: Bearer admin:wrong", &format!("http://{exposed}/small")]).0, "403");
    // Signed URLs are the way in there, and keep working.
    let shared = admin.call(locus_proto::ops::Share { path: "/small".into(), ttl_s: 60 }).await.unwrap();
    assert_eq!(curl(&[&format!("http://{exposed}{shared}")]), ("200".into(), b"tiny".to_vec()));
    assert_eq!(curl(&[&format!("http://{exposed}/small")]).0, "401");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_url_lives_no_longer_than_the_heads_maximum() {
    assert_eq!(HeadConfig::new("x").share_max_ttl, std::time::Duration::from_secs(7 * 24 * 3600), "a week");
    let head = TestServer::head(None, |c| c.share_max_ttl = std::time::Duration::from_secs(600));
    let admin = head.client("admin").await;
    admin.write_file("/small", 0o644, b"tiny").await.unwrap();
    let http = http_for(&head).await;
    // A longer ask is refused, not shortened behind the asker's back.
    let e = admin.call(locus_proto::ops::Share { path: "/small".into(), ttl_s: 601 }).await.unwrap_err();
    assert_eq!(e.code(), Code::INVAL);
    assert!(e.to_string().contains("at most 600 s"), "{e}");
    let e = admin.call(locus_proto::ops::Share { path: "/small".into(), ttl_s: u64::MAX }).await.unwrap_err();
    assert_eq!(e.code(), Code::INVAL);
    let url = admin.call(locus_proto::ops::Share { path: "/small".into(), ttl_s: 600 }).await.unwrap();
    assert_eq!(curl(&[&format!("http://{http}{url}")]), ("200".into(), b"tiny".to_vec()));
    // A URL signed to live longer (as before the bound was lowered) is not honoured; one
    // signed the same way within the bound is.
    let key = head.shared().head.as_ref().unwrap().key().to_vec();
    let signed = |ttl: u64| {
        let expires = capability::now() + ttl;
        let sig = capability::url_signature(&key, "admin", "/small", expires);
        format!("http://{http}/small?s=admin&e={expires}&sig={sig}")
    };
    assert_eq!(curl(&[&signed(300)]).0, "200");
    assert_eq!(curl(&[&signed(30 * 24 * 3600)]).0, "401");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storelet_runs_on_every_node_over_the_files_it_holds() {
    let head = TestServer::head(None, |_| {});
    let nodes = [TestServer::data_node(&head), TestServer::data_node(&head)];
    let admin = head.client("admin").await;
    for d in ["/src", "/src/a", "/src/b", "/other"] {
        admin.mkdir(d, 0o755).await.unwrap();
    }
    // Large files spread over both nodes; small ones live at the head.
    let mut expected = Vec::new();
    for i in 0..6 {
        let path = format!("/src/{}/f{i}.go", if i % 2 == 0 { "a" } else { "b" });
        admin.write_file(&path, 0o644, &pattern(100_000 + i, i as u8)).await.unwrap();
        expected.push(path.trim_start_matches("/src").to_string());
    }
    admin.write_file("/src/small.go", 0o644, b"package small").await.unwrap();
    expected.push("/small.go".into());
    admin.write_file("/src/readme.txt", 0o644, b"not go").await.unwrap();
    admin.write_file("/other/x.go", 0o644, b"outside").await.unwrap();
    assert!(nodes.iter().all(|n| objects_on(n) > 0), "the large files are spread over both nodes");

    let find = locus_testkit::build_storelet("find");
    let args = ["/", "-name", "*.go"].map(String::from).to_vec();
    let out = admin.storelet_run(&find, "/src", args, false).await.unwrap();
    assert_eq!(out.result.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect();
    lines.sort();
    expected.sort();
    assert_eq!(lines, expected);
    assert!(out.result.fuel > 0);
    // Each node ran its share, and the views it made for them are gone.
    for n in &nodes {
        assert!(n.shared().storelets.stats("admin", true).recent.iter().any(|r| r.subject == "admin"));
        let views = n.root().join(locus_server::cluster::objects::VIEWS_DIR);
        assert_eq!(std::fs::read_dir(views).map_or(0, |d| d.count()), 0);
    }
    // The x right at the root is needed, as on a single server.
    let alice = head.client("alice").await;
    let e = alice.storelet_run(&find, "/src", vec!["/".into()], false).await.unwrap_err();
    assert_eq!(e.code(), Code::ACCES);
}

/// True when `key` appears in `bytes` raw or in hex (either case).
fn holds_key(bytes: &[u8], key: &[u8]) -> bool {
    let lower = hex::encode(key);
    let upper = lower.to_uppercase();
    [key, lower.as_bytes(), upper.as_bytes()].iter().any(|k| bytes.windows(k.len()).any(|w| w == *k))
}

/// Relays one connection at a time from a local port to `to`, recording every byte
/// that passes either way.
fn recording_relay(to: std::net::SocketAddr) -> (String, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let server = std::net::TcpStream::connect(to).unwrap();
            for (mut from, mut into) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                let record = record.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64 << 10];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || into.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_key_never_crosses_the_node_link_in_clear() {
    // The node dials the relay: the head is told that address names it.
    let head = TestServer::start_with(|c| {
        c.names.push("127.0.0.1:*".parse().unwrap());
        c.head = Some(locus_server::cluster::HeadConfig::new(c.state_dir.join("meta.db").display().to_string()));
    });
    let node = TestServer::start();
    let (relay, seen) = recording_relay(head.addr);
    let mut options = head.options(locus_proto::capability::NODE_SUBJECT);
    options.addr = relay;
    locus_server::cluster::node::join(node.shared(), &options, &node.addr.to_string(), None).await.unwrap();
    let keys = head.shared().head.as_ref().unwrap().keys();
    // The node has the keys, and they did not cross the link.
    assert_eq!(*node.shared().node_key().expect("the node joined"), keys);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() > 100, "the relay saw the join ({} bytes)", seen.len());
    assert!(!holds_key(&seen, &keys.current), "the cluster key crossed the node's link in clear");
    // A join whose token is not the nodes' cannot open what the head sealed.
    let mut wrong = head.options(locus_proto::capability::NODE_SUBJECT);
    wrong.credentials.token = "admin-token".into();
    assert!(locus_server::cluster::node::join(node.shared(), &wrong, &node.addr.to_string(), None).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_key_rests_sealed_and_only_heads_with_the_wrap_key_open_it() {
    let head = TestServer::head(None, |_| {});
    let keys = head.shared().head.as_ref().unwrap().keys();
    let admin = head.client("admin").await;
    admin.write_file("/f", 0o644, b"some data").await.unwrap();
    // Neither the database file nor its log holds the key.
    let db = head.state_dir().join("meta.db");
    for file in [db.clone(), head.state_dir().join("meta.db-wal")] {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(!holds_key(&bytes, &keys.current), "{} holds the cluster key", file.display());
    }
    let meta = locus_cluster::Meta::open(db.to_str().unwrap(), "admin").unwrap();
    for (name, value) in meta.settings().unwrap() {
        assert!(!holds_key(value.as_bytes(), &keys.current), "setting {name} holds the cluster key");
    }
    // The wrap key is the head's own, readable by it alone.
    let wrap = head.state_dir().join(locus_server::cluster::keys::WRAP_FILE);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&wrap).unwrap().permissions().mode() & 0o777, 0o600);
    // Another head on the same namespace without the wrap key fails, naming the file;
    // with a copy it has the same keys.
    let other = tempfile::tempdir().unwrap();
    let config = HeadConfig::new(db.to_str().unwrap());
    let err =
        locus_server::cluster::Head::open(config.clone(), other.path()).err().expect("refused without the wrap key");
    assert!(err.to_string().contains(locus_server::cluster::keys::WRAP_FILE), "{err}");
    std::fs::copy(&wrap, other.path().join(locus_server::cluster::keys::WRAP_FILE)).unwrap();
    let second = locus_server::cluster::Head::open(config, other.path()).unwrap();
    assert_eq!(second.keys(), keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_credential_joins_and_does_nothing_else() {
    let head = TestServer::head(None, |_| {});
    let _node = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    admin.acl_set("/", "*", Rights::parse("rl").unwrap()).await.unwrap();
    let node = head.client(locus_proto::capability::NODE_SUBJECT).await;
    assert_eq!(code(node.readdir("/").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(node.stat("/d").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(node.acl_set("/", "locus-node", Rights::parse("rwlda").unwrap()).await.unwrap_err()), Code::ACCES);
    assert_eq!(code(node.write_file("/x", 0o644, b"x").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(node.call(locus_proto::ops::KeyRotate {}).await.unwrap_err()), Code::ACCES);
    // An admin's credentials do not make a data node.
    let other = TestServer::start();
    let err = locus_server::cluster::node::join(other.shared(), &head.options("admin"), &other.addr.to_string(), None)
        .await
        .unwrap_err();
    assert!(err.contains("locus-node"), "{err}");
    let join = locus_proto::ops::NodeJoin {
        addr: "127.0.0.1:1".into(),
        http: None,
        free: 1,
        nonce: vec![7; 32],
        damaged: Vec::new(),
        io: Default::default(),
        busiest: Vec::new(),
    };
    assert_eq!(code(admin.call(join).await.unwrap_err()), Code::ACCES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_signs_nothing_after_its_capabilities_expire() {
    let head = TestServer::head(None, |h| {
        h.capability_ttl = std::time::Duration::from_secs(2);
        h.key_grace = std::time::Duration::from_secs(1);
    });
    let node = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    let data = pattern(2 * MIB, 9);
    admin.write_file("/big", 0o644, &data).await.unwrap();
    let (_, loc) = located(&admin, "/big").await;
    let old = head.shared().head.as_ref().unwrap().key();
    // A capability the old key signs for far in the future: what a thief would make.
    let c = &loc.capability;
    let mut stolen = loc.clone();
    stolen.capability = capability::sign(&old, &c.subject, c.object, c.version, c.size, capability::now() + 3600);
    assert_eq!(NodeReads::default().read(&stolen, 0, 10).await.unwrap(), data[..10]);

    // Only an admin rotates.
    admin.acl_set("/", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    let alice = head.client("alice").await;
    assert_eq!(code(alice.call(locus_proto::ops::KeyRotate {}).await.unwrap_err()), Code::ACCES);
    admin.call(locus_proto::ops::KeyRotate {}).await.unwrap();
    let rotated_at = std::time::Instant::now();
    node.join(&head);
    // Reads work right after the rotation, from the node.
    let served = |n: &TestServer| {
        n.shared().store.counters().ops().iter().find(|o| o.op == "object_read").map_or(0, |o| o.count)
    };
    let before = served(&node);
    assert_eq!(admin.read_file("/big").await.unwrap(), data);
    assert!(served(&node) > before, "the read went to the node");

    // Once the old key's capabilities have run out (grace 1 s + lifetime 2 s + 2 s),
    // nothing it signs is accepted, and new reads still work.
    tokio::time::sleep(std::time::Duration::from_secs(6).saturating_sub(rotated_at.elapsed())).await;
    assert_ne!(head.shared().head.as_ref().unwrap().key(), old);
    // Tokens the old key derives no longer log in; its capabilities are refused even
    // over a connection that logged in with the new key's token.
    assert_eq!(code(NodeReads::default().read(&stolen, 0, 10).await.unwrap_err()), Code::AUTH_FAILED);
    let (_, fresh) = located(&admin, "/big").await;
    stolen.node_token = fresh.node_token.clone();
    assert_eq!(code(NodeReads::default().read(&stolen, 0, 10).await.unwrap_err()), Code::ACCES);
    assert_eq!(NodeReads::default().read(&fresh, 0, 10).await.unwrap(), data[..10]);
    assert_eq!(admin.read_file("/big").await.unwrap(), data);
}

/// A head serving TLS issues each data node a certificate of the cluster's authority
/// when it joins; clients then read from the nodes over TLS, checking them against the
/// head's certificate file (third-party reads and writes stay on). A node then refuses
/// plain TCP, a client trusting another authority refuses the node, and a node that
/// joins a head serving plain TCP goes back to plain TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_tls_nodes_serve_certificates_of_the_cluster_and_third_party_stays_on() {
    let head = TestServer::start_with(|config| {
        config.tls = true;
        let meta = config.state_dir.join("meta.db").display().to_string();
        config.head = Some(locus_server::cluster::HeadConfig::new(meta));
    });
    let (n1, n2) = (TestServer::data_node(&head), TestServer::data_node(&head));
    let admin = head.client("admin").await;
    let big = pattern(3 * MIB + 7, 4);
    admin.write_file("/big", 0o644, &big).await.unwrap();
    assert!(objects_on(&n1) + objects_on(&n2) >= 1, "the version is on the nodes");
    assert_eq!(admin.read_file("/big").await.unwrap(), big);
    let (h, loc) = located(&admin, "/big").await;

    let ca = head.state_dir().join(locus_server::config::CERT_FILE);
    let over_tls = NodeReads::default();
    over_tls.use_tls(ca);
    assert_eq!(over_tls.read(&loc, 0, 10).await.unwrap(), big[..10], "the node proves a name of the cluster's");
    assert!(NodeReads::default().read(&loc, 0, 10).await.is_err(), "a node under TLS refuses plain TCP");
    let stranger = TestServer::start_with(|c| c.tls = true);
    let trusting_another = NodeReads::default();
    trusting_another.use_tls(stranger.state_dir().join(locus_server::config::CERT_FILE));
    assert!(trusting_another.read(&loc, 0, 10).await.is_err(), "another authority's client refuses the node");
    // What the node was issued is kept for a restart; its key is for it alone.
    for node in [&n1, &n2] {
        let (_, key) = locus_server::cluster::node::issued_identity(&node.state_dir()).expect("kept");
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(key).unwrap().permissions());
        assert_eq!(mode & 0o077, 0, "the node's key is private");
    }

    // A holder of the nodes' token gets no certificate for an address it does not join
    // from (a head's, another node's).
    let impostor = locus_client::Client::connect(&head.options(capability::NODE_SUBJECT)).await.unwrap();
    let join = locus_client::ops::NodeJoin {
        addr: "10.9.9.9:9610".into(),
        http: None,
        free: 1 << 30,
        nonce: vec![7; 32],
        damaged: vec![],
        io: Default::default(),
        busiest: vec![],
    };
    assert_eq!(code(impostor.call(join).await.unwrap_err()), Code::ACCES);

    // The client's reads of the open file go to its node, over TLS: they go on with the
    // head gone.
    drop(head);
    assert_eq!(admin.pread(h, MIB as u64, 100).await.unwrap(), big[MIB..MIB + 100], "read from the node");

    // Joining a head that serves plain TCP, a node serves plain TCP again.
    let plain_head = TestServer::head(None, |_| {});
    n1.join(&plain_head);
    assert!(locus_server::cluster::node::issued_identity(&n1.state_dir()).is_none(), "forgotten");
    let plain = n1.client("admin").await;
    assert!(plain.stat("/").await.is_ok(), "plain TCP again");
}
