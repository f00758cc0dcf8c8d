//! The console's JSON API against a real server: logging in, what each subject may see
//! and do, transfers, the load samples and the runs. (The page itself is tested in a real
//! browser by `crates/locus-cli/tests/console.rs`.)

use locus_proto::types::Rights;
use locus_testkit::TestServer;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// An HTTP answer: status, headers (lower-case names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request on a fresh connection (`Connection: close`, so the body ends at EOF).
fn http(at: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(at).unwrap();
    let mut head =
        format!("{method} {target} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let text = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = text.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect::<Vec<_>>();
    assert!(
        !headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked")) || method == "HEAD",
        "the test client reads whole bodies only"
    );
    Answer { status, headers, body: raw[split + 4..].to_vec() }
}

const CHANGE: (&str, &str) = ("X-Locus-Console", "1");

/// The names in a `/api/list` answer, in its order.
fn entry_names(list: &serde_json::Value) -> Vec<&str> {
    list["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect()
}

/// Logs in; returns the `Cookie` header value.
fn login(at: SocketAddr, token: &str) -> String {
    let a = http(at, "POST", "/api/login", &[CHANGE], format!("{{\"token\":\"{token}\"}}").as_bytes());
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let cookie = a.header("set-cookie").unwrap().to_string();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    cookie.split(';').next().unwrap().to_string()
}

fn start() -> (TestServer, SocketAddr) {
    let s = TestServer::start();
    let config = locus_console::ConsoleConfig { sample_every: Duration::from_millis(100), ..Default::default() };
    let at = s.console(config);
    (s, at)
}

#[test]
fn a_token_logs_in_and_a_wrong_one_is_refused() {
    let (_s, at) = start();
    assert_eq!(http(at, "GET", "/api/whoami", &[], b"").status, 401, "no session, no answer");
    let wrong = http(at, "POST", "/api/login", &[CHANGE], br#"{"token":"admin:not-it"}"#);
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert_eq!(http(at, "POST", "/api/login", &[CHANGE], br#"{"token":"nobody:admin-token"}"#).status, 401);
    // A login from another site's form lacks the console's header.
    assert_eq!(http(at, "POST", "/api/login", &[], br#"{"token":"admin:admin-token"}"#).status, 403);

    let cookie = login(at, "admin:admin-token");
    let me = http(at, "GET", "/api/whoami", &[("Cookie", &cookie)], b"").json();
    assert_eq!((me["subject"].as_str(), me["admin"].as_bool()), (Some("admin"), Some(true)));
    // The bare token works too, and names its subject.
    let bob = login(at, "bob-token");
    let me = http(at, "GET", "/api/whoami", &[("Cookie", &bob)], b"").json();
    assert_eq!((me["subject"].as_str(), me["admin"].as_bool()), (Some("bob"), Some(false)));
    assert_eq!(http(at, "GET", "/api/whoami", &[("Cookie", "locus_console=00ff")], b"").status, 401);

    assert_eq!(http(at, "POST", "/api/logout", &[CHANGE, ("Cookie", &cookie)], b"").status, 200);
    assert_eq!(http(at, "GET", "/api/whoami", &[("Cookie", &cookie)], b"").status, 401, "logged out");

    let page = http(at, "GET", "/", &[], b"");
    assert_eq!(page.status, 200);
    assert!(page.header("content-security-policy").is_some_and(|v| v.contains("default-src 'self'")));
    assert!(String::from_utf8_lossy(&page.body).contains("console.js"));
    assert_eq!(http(at, "GET", "/console.js", &[], b"").status, 200);
}

#[test]
fn a_plain_http_console_off_loopback_takes_no_token() {
    // Listening on every interface over plain HTTP: a token sent at login would cross the
    // network readable. (The test reaches that port through loopback, sending nothing off
    // this host; what counts is where the console listens.)
    let s = TestServer::start();
    let exposed = s.console_on("0.0.0.0", Default::default());
    let refused = http(exposed, "POST", "/api/login", &[CHANGE], br#"{"token":"admin:admin-token"}"#);
    assert_eq!(refused.status, 403, "{}", String::from_utf8_lossy(&refused.body));
    assert!(refused.header("set-cookie").is_none(), "no session was started");
    let why = refused.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("TLS") && why.contains("loopback"), "{why}");
    // The same server's console on loopback takes the same token.
    let local = s.console(Default::default());
    let cookie = login(local, "admin:admin-token");
    assert_eq!(http(local, "GET", "/api/whoami", &[("Cookie", &cookie)], b"").status, 200);
    // A session made there is no way in at the exposed door either: sessions are per console.
    assert_eq!(http(exposed, "GET", "/api/whoami", &[("Cookie", &cookie)], b"").status, 401);
}

#[test]
fn the_tree_lists_previews_downloads_and_uploads_within_the_acls() {
    let (s, at) = start();
    s.put_local("docs/readme.txt", b"hello, console\n");
    s.put_local("docs/blob.bin", &[0u8, 1, 2, 3, 0, 255]);
    s.put_local("private/secret.txt", b"no\n");
    let store = &s.shared().store;
    store.acl_set("admin", "/docs", "bob", Rights::READ.union(Rights::LIST)).unwrap();
    let admin = login(at, "admin:admin-token");
    let bob = login(at, "bob:bob-token");
    let get = |cookie: &str, target: &str| http(at, "GET", target, &[("Cookie", cookie)], b"");

    let list = get(&bob, "/api/list?path=/docs").json();
    let names = entry_names(&list);
    assert_eq!(names, ["blob.bin", "readme.txt"]);
    assert_eq!(list["entries"][1]["size"], 15);
    assert_eq!(list["rights"], "rl");
    assert_eq!(get(&bob, "/api/list?path=/private").status, 403, "bob may not list it");
    assert_eq!(get(&bob, "/api/preview?path=/private/secret.txt").status, 403);
    assert_eq!(get(&admin, "/api/list?path=/nowhere").status, 404);
    assert_eq!(get(&admin, "/api/list?path=/../..").status, 403, "nothing above the root");
    assert_eq!(get(&admin, "/api/list?path=docs").status, 400, "paths are absolute");

    let p = get(&bob, "/api/preview?path=/docs/readme.txt").json();
    assert_eq!((p["text"].as_str(), p["truncated"].as_bool()), (Some("hello, console\n"), Some(false)));
    assert!(get(&bob, "/api/preview?path=/docs/blob.bin").json()["text"].is_null(), "binary is not shown");

    let whole = get(&bob, "/api/download?path=/docs/readme.txt");
    assert_eq!((whole.status, whole.body.as_slice()), (200, &b"hello, console\n"[..]));
    assert!(whole.header("content-disposition").is_some_and(|v| v.contains("readme.txt")));
    let part =
        http(at, "GET", "/api/download?path=/docs/readme.txt", &[("Cookie", &bob), ("Range", "bytes=7-13")], b"");
    assert_eq!((part.status, part.body.as_slice()), (206, &b"console"[..]));
    assert_eq!(part.header("content-range"), Some("bytes 7-13/15"));

    // Uploads need `w` and the console's header; a refused one leaves nothing behind.
    let upload = |cookie: &str, path: &str, body: &[u8]| {
        http(at, "PUT", &format!("/api/upload?path={path}"), &[CHANGE, ("Cookie", cookie)], body)
    };
    assert_eq!(upload(&bob, "/docs/new.txt", b"x").status, 403);
    assert!(!s.local("docs/new.txt").exists());
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let up = upload(&admin, "/docs/big%20file.bin", &big);
    assert_eq!(up.status, 200, "{}", String::from_utf8_lossy(&up.body));
    assert_eq!(up.json()["size"], big.len());
    assert_eq!(std::fs::read(s.local("docs/big file.bin")).unwrap(), big);
    let no_header = http(at, "PUT", "/api/upload?path=/docs/x", &[("Cookie", &admin)], b"x");
    assert_eq!(no_header.status, 403);
    assert!(!s.local("docs/x").exists());
}

#[test]
fn the_load_is_sampled_and_names_only_files_the_subject_may_list() {
    let (s, at) = start();
    s.put_local("open/hot.dat", &vec![7u8; 1 << 20]);
    s.put_local("closed/hidden.dat", &vec![7u8; 1 << 20]);
    s.shared().store.acl_set("admin", "/open", "bob", Rights::READ.union(Rights::LIST)).unwrap();
    let admin = login(at, "admin:admin-token");
    let bob = login(at, "bob:bob-token");
    // Let the sampler take its baseline, then read both files through the console.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        for path in ["/open/hot.dat", "/closed/hidden.dat"] {
            let a = http(at, "GET", &format!("/api/download?path={path}"), &[("Cookie", &admin)], b"");
            assert_eq!(a.body.len(), 1 << 20);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let r = http(at, "GET", "/api/load", &[("Cookie", &admin)], b"").json();
        let read: u64 =
            r["samples"].as_array().unwrap().iter().map(|s| s["export"]["read_bytes"].as_u64().unwrap()).sum();
        if read >= 6 << 20 {
            break r;
        }
        assert!(Instant::now() < deadline, "the samples never showed the reads: {r}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(report["interval_ms"], 100);
    let busiest: Vec<&str> =
        report["busiest"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert!(busiest.contains(&"/open/hot.dat") && busiest.contains(&"/closed/hidden.dat"), "{busiest:?}");
    assert_eq!(report["busiest"][0]["io"]["read_bytes"], 3 << 20);
    assert!(!report["heat"]["cells"].as_array().unwrap().is_empty());
    assert!(report["devices"][0].as_str().unwrap().contains("export"), "an admin sees device paths");

    let one = http(at, "GET", "/api/load?file=/open/hot.dat", &[("Cookie", &admin)], b"").json();
    let read: u64 =
        one["file"]["samples"].as_array().unwrap().iter().map(|s| s["io"]["read_bytes"].as_u64().unwrap()).sum();
    assert_eq!((one["file"]["path"].as_str(), read), (Some("/open/hot.dat"), 3 << 20));
    let hidden = http(at, "GET", "/api/load?file=/closed/hidden.dat", &[("Cookie", &bob)], b"").json();
    assert!(hidden["file"].is_null(), "bob may not see that file's series");

    let seen_by_bob = http(at, "GET", "/api/load", &[("Cookie", &bob)], b"").json();
    let files: Vec<&str> =
        seen_by_bob["heat"]["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert_eq!(files, ["/open/hot.dat"], "bob may not list /closed");
    assert_eq!(seen_by_bob["devices"][0], "device 0");
}

#[test]
fn scripts_on_the_pool_are_listed_and_can_be_cancelled_by_their_owner_or_an_admin() {
    let (s, at) = start();
    s.shared().store.acl_set("admin", "/", "bob", Rights::READ.union(Rights::LIST).union(Rights::EXECUTE)).unwrap();
    s.shared().store.acl_set("admin", "/", "alice", Rights::READ.union(Rights::LIST).union(Rights::EXECUTE)).unwrap();
    let admin = login(at, "admin:admin-token");
    let bob = login(at, "bob:bob-token");
    let alice = login(at, "alice:alice-token");
    // Bob's script spins until its time limit (5 s) unless cancelled.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let client = rt.block_on(locus_client::Client::connect(&s.options("bob"))).unwrap();
    let call = rt.spawn(async move { client.script_call("while true do end", vec![], b"").await });
    let runs = |cookie: &str| http(at, "GET", "/api/runs", &[("Cookie", cookie)], b"").json();
    let deadline = Instant::now() + Duration::from_secs(5);
    let id = loop {
        if let Some(r) = runs(&bob)["scripts"]["running"].as_array().unwrap().first() {
            assert_eq!(r["subject"], "bob");
            break r["call"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "the call never showed up");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(runs(&alice)["scripts"]["running"].as_array().unwrap().is_empty(), "alice sees only her own");
    assert_eq!(runs(&admin)["scripts"]["running"][0]["call"], id, "an admin sees everyone's");
    let cancel = |cookie: &str| {
        http(at, "POST", &format!("/api/cancel?kind=script&id={id}"), &[CHANGE, ("Cookie", cookie)], b"")
    };
    assert_eq!(cancel(&alice).status, 403, "not hers");
    let started = Instant::now();
    assert_eq!(cancel(&admin).status, 200);
    let outcome = rt.block_on(call).unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "cancelled, not timed out");
    let err = outcome.unwrap_err().to_string();
    assert!(err.contains("cancel"), "{err}");
    let recent = &runs(&bob)["scripts"]["recent"][0];
    assert_eq!((recent["call"].as_u64(), recent["running"].as_bool()), (Some(id), Some(false)));
    assert!(recent["outcome"].as_str().unwrap().contains("cancelled"), "{recent}");
    assert!(recent["instructions"].as_u64().unwrap() > 1000);
    assert!(runs(&alice)["scripts"]["recent"].as_array().unwrap().is_empty());
    assert_eq!(cancel(&admin).status, 404, "no longer running");
}

#[test]
fn active_file_runs_are_listed_with_the_file_they_made() {
    let (s, at) = start();
    s.add_handler("csv", &locus_testkit::build_storelet("csv"), &[]);
    s.put_local("d/sales.csv", b"region,price\nnorth,10\nsouth,5\n");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let made = rt.block_on(async {
        let client = locus_client::Client::connect(&s.options("admin")).await.unwrap();
        client.read_file("/d/csv@sales.csv,-sum,price").await.unwrap()
    });
    assert_eq!(made, b"15\n");
    let admin = login(at, "admin:admin-token");
    let runs = http(at, "GET", "/api/runs", &[("Cookie", &admin)], b"").json();
    let run = &runs["active_files"]["recent"][0];
    assert_eq!(run["active_file"], "/d/csv@sales.csv,-sum,price", "{runs}");
    assert_eq!((run["state"].as_str(), run["subject"].as_str()), (Some("exit 0"), Some("admin")));
    assert!(run["read_bytes"].as_u64().unwrap() > 0 && run["fuel"].as_u64().unwrap() > 0);
    assert!(runs["storelets"]["recent"].as_array().unwrap().is_empty(), "a handler's run is not a storelet's");
}

#[test]
fn with_the_servers_tls_identity_the_console_speaks_https_and_its_cookie_is_secure() {
    let s = TestServer::start();
    let tls = locus_server::config::tls_acceptor(&s.state_dir()).unwrap();
    let at = s.console(locus_console::ConsoleConfig { tls: Some(tls), ..Default::default() });
    let out = std::process::Command::new("curl")
        .args(["-sk", "-D", "-", "-o", "/dev/null", "-X", "POST", "-H", "X-Locus-Console: 1"])
        .args(["--data", r#"{"token":"admin:admin-token"}"#])
        .arg(format!("https://{at}/api/login"))
        .output()
        .expect("curl runs");
    let head = String::from_utf8_lossy(&out.stdout);
    assert!(head.starts_with("HTTP/1.1 200"), "{head} {}", String::from_utf8_lossy(&out.stderr));
    assert!(head.lines().any(|l| l.starts_with("set-cookie:") && l.contains("; Secure")), "{head}");
    // Plain HTTP on that port gets no answer.
    let mut plain = TcpStream::connect(at).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
}

/// A cluster head serves the console over its namespace and data nodes: listings and
/// rights from the namespace, previews and ranged downloads of versions on a node,
/// uploads committed as versions, the load per data node from the accounts their
/// heartbeats carry, the storelets running on the nodes; and, on the same port, its
/// files by path.
#[test]
fn a_head_serves_the_console_over_its_namespace_and_its_data_nodes() {
    let head = TestServer::head(None, |h| h.node_timeout = Duration::from_secs(1));
    let _node = TestServer::data_node(&head);
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let client = rt.block_on(locus_client::Client::connect(&head.options("admin"))).unwrap();
    rt.block_on(async {
        client.mkdir("/docs", 0o755).await.unwrap();
        client.mkdir("/private", 0o755).await.unwrap();
        client.write_file("/docs/readme.txt", 0o644, b"hello, head\n").await.unwrap();
        client.write_file("/docs/big.bin", 0o644, &big).await.unwrap();
        client.write_file("/private/secret.txt", 0o644, b"no\n").await.unwrap();
        client.acl_set("/docs", "bob", Rights::READ.union(Rights::LIST)).await.unwrap();
    });
    let config = locus_console::ConsoleConfig { sample_every: Duration::from_millis(100), ..Default::default() };
    let at = head.console(config);
    let admin = login(at, "admin:admin-token");
    let bob = login(at, "bob:bob-token");
    let get = |cookie: &str, target: &str| http(at, "GET", target, &[("Cookie", cookie)], b"");

    let list = get(&bob, "/api/list?path=/docs").json();
    let names = entry_names(&list);
    assert_eq!(names, ["big.bin", "readme.txt"]);
    assert_eq!(list["rights"], "rl");
    assert_eq!(get(&bob, "/api/list?path=/private").status, 403);
    assert_eq!(get(&bob, "/api/preview?path=/private/secret.txt").status, 403);
    assert_eq!(get(&bob, "/api/preview?path=/docs/readme.txt").json()["text"], "hello, head\n");
    let part = http(
        at,
        "GET",
        "/api/download?path=/docs/big.bin",
        &[("Cookie", &bob), ("Range", "bytes=1000000-1999999")],
        b"",
    );
    assert_eq!(part.status, 206);
    assert!(part.body == big[1_000_000..2_000_000], "the bytes kept on the data node");
    let whole = get(&admin, "/api/download?path=/docs/big.bin");
    assert!(whole.status == 200 && whole.body == big);

    let up = http(at, "PUT", "/api/upload?path=/docs/up.bin", &[CHANGE, ("Cookie", &admin)], &big);
    assert_eq!(up.status, 200, "{}", String::from_utf8_lossy(&up.body));
    assert_eq!(rt.block_on(client.read_file("/docs/up.bin")).unwrap(), big);
    let refused = http(at, "PUT", "/api/upload?path=/docs/no.bin", &[CHANGE, ("Cookie", &bob)], b"x");
    assert_eq!(refused.status, 403);
    assert!(rt.block_on(client.stat("/docs/no.bin")).is_err(), "a refused upload leaves nothing");

    // The reads above went to the data node; its heartbeats carry its accounts.
    let deadline = Instant::now() + Duration::from_secs(15);
    let report = loop {
        for _ in 0..2 {
            assert_eq!(rt.block_on(client.read_file("/docs/big.bin")).unwrap().len(), big.len());
        }
        let r = get(&admin, "/api/load").json();
        let read: u64 =
            r["samples"].as_array().unwrap().iter().map(|s| s["export"]["read_bytes"].as_u64().unwrap()).sum();
        if read >= 3_000_000 {
            break r;
        }
        assert!(Instant::now() < deadline, "the samples never showed the node's reads: {r}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let devices: Vec<&str> = report["devices"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert!(devices.len() == 1 && devices[0].contains("node"), "{devices:?}");

    let runs = get(&admin, "/api/runs");
    assert_eq!(runs.status, 200);
    assert!(runs.json()["storelets"]["running"].is_array());

    // The head's files by path, on the console's port (Bearer on loopback).
    let by_path = http(at, "GET", "/docs/readme.txt", &[("Authorization", "Bearer admin:admin-token")], b"");
    assert_eq!((by_path.status, by_path.body.as_slice()), (200, &b"hello, head\n"[..]));
    assert_eq!(http(at, "GET", "/docs/readme.txt", &[], b"").status, 401);
    // Plain HTTP on every interface: the file door behind the console takes no token
    // either (it would cross the network readable).
    let exposed = head.console_on("0.0.0.0", Default::default());
    let refused = http(exposed, "GET", "/docs/readme.txt", &[("Authorization", "Bearer admin:admin-token")], b"");
    assert_eq!(refused.status, 403, "{}", String::from_utf8_lossy(&refused.body));
}
