//! The hostile-input corpus: one list of path tricks (`..`, absolute and outward
//! symbolic links, encoded slashes, NULs, over-long names) thrown at every door a client
//! can reach on a real server: the native protocol, active-file names, the Chirp
//! endpoint, the console's HTTP API and a cluster head's HTTP door, plus forged, expired
//! and replayed signed URLs. Beside each export root sits a canary file; no door may
//! answer with its bytes, and nothing may be created beside the root.

use locus_proto::ops::Share;
use locus_proto::types::Rights;
use locus_testkit::TestServer;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the canary beside every export root holds.
const CANARY: &[u8] = b"canary: outside the export";

/// Lays out a few files, the canary beside the root, and links pointing out of it.
fn furnish(root: &Path) {
    std::fs::create_dir_all(root.join("d/sub")).unwrap();
    std::fs::write(root.join("d/a.txt"), b"alpha\n").unwrap();
    std::fs::write(root.parent().unwrap().join("canary"), CANARY).unwrap();
    std::os::unix::fs::symlink("../canary", root.join("out")).unwrap();
    std::os::unix::fs::symlink("../../canary", root.join("d/out")).unwrap();
    std::os::unix::fs::symlink(root.parent().unwrap().join("canary"), root.join("abs")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
}

/// The names beside the export root, to check that nothing was made there.
fn beside(root: &Path) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> =
        std::fs::read_dir(root.parent().unwrap()).unwrap().flatten().map(|e| e.path()).collect();
    names.sort();
    names
}

/// Every path trick, as a client would spell it.
fn tricks() -> Vec<String> {
    let mut t: Vec<String> = [
        "/../canary",
        "../canary",
        "/d/../../canary",
        "/./../canary",
        "//../canary",
        "/d/sub/../../../canary",
        "/out",
        "/d/out",
        "/abs",
        "/etc/passwd",
        "/etc/shadow",
        "/out/x",
        "/d%2F..%2F..%2Fcanary",
        "/%2e%2e/canary",
        "/d/a.txt\0/../../canary",
        "/\0",
        "/d\\..\\..\\canary",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    t.push(format!("/{}", "x".repeat(300)));
    t.push(format!("/{}canary", "../".repeat(200)));
    t.push("/d/".repeat(3000));
    t
}

fn shows_canary(bytes: &[u8]) -> bool {
    bytes.windows(CANARY.len()).any(|w| w == CANARY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_protocol_refuses_every_path_trick() {
    let s = TestServer::start();
    furnish(&s.root());
    let before = beside(&s.root());
    let admin = s.client("admin").await;
    for path in tricks() {
        if let Ok(bytes) = admin.read_file(&path).await {
            assert!(!shows_canary(&bytes), "{path:?} read the canary");
        }
        assert!(admin.stat(&path).await.is_err(), "{path:?}: stat answered");
        assert!(admin.open(&path, libc::O_RDONLY as u32, 0).await.is_err(), "{path:?}: open answered");
        for target in [format!("{path}-new"), format!("{path}/new")] {
            let _ = admin.write_file(&target, 0o644, b"planted").await;
            let _ = admin.mkdir(&target, 0o755).await;
            let _ = admin.rename("/d/a.txt", &target).await;
            if !s.root().join("d/a.txt").exists() {
                std::fs::write(s.root().join("d/a.txt"), b"alpha\n").unwrap();
            }
        }
        // Reads through a link the client plants itself.
        let _ = admin.symlink(&path, "/planted").await;
        if let Ok(bytes) = admin.read_file("/planted").await {
            assert!(!shows_canary(&bytes), "a link to {path:?} read the canary");
        }
        let _ = admin.unlink("/planted").await;
    }
    // Active-file names that try to name files outside.
    for name in
        ["x@..%2F..%2Fcanary", "cat@%2Fetc%2Fshadow", "lines@..%2F..%2Fetc%2Fpasswd", "%2Fbin%2Fcat+..%2Fcanary"]
    {
        if let Ok(bytes) = admin.read_file(&format!("/d/{name}")).await {
            assert!(!shows_canary(&bytes), "{name} read the canary");
            assert!(!String::from_utf8_lossy(&bytes).contains("root:"), "{name} read the host's /etc");
        }
    }
    assert_eq!(beside(&s.root()), before, "something was made beside the export root");
    assert!(std::fs::read(s.root().parent().unwrap().join("canary")).unwrap() == CANARY, "the canary was changed");
    // The state directory (tokens, keys, results of code runs) is the server's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.state_dir()).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "state directory mode {mode:o}");
}

/// One Chirp session on a fresh connection: writes `lines` after authenticating by
/// address and returns what came back.
fn chirp_session(addr: SocketAddr, lines: &str) -> Vec<u8> {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sock.write_all(format!("address\n{lines}").as_bytes()).unwrap();
    sock.shutdown(Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = sock.read_to_end(&mut answer);
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chirp_endpoint_refuses_every_path_trick() {
    let s = TestServer::start();
    furnish(&s.root());
    let before = beside(&s.root());
    s.client("admin").await.acl_set("/", "address:127.0.0.1", Rights::parse("rwldax").unwrap()).await.unwrap();
    let chirp = s.chirp(locus_testkit::server::chirp::ChirpConfig {
        methods: vec![locus_testkit::server::chirp::AuthMethod::Address],
        ..Default::default()
    });
    // The endpoint works at all: the known file reads back.
    assert!(chirp_session(chirp, "getfile /d/a.txt\n").windows(6).any(|w| w == b"alpha\n"));
    for path in tricks() {
        // Chirp URL-encodes nothing: spaces and newlines end words and lines, so tricks
        // carrying them are sent as the bytes a hostile client would send.
        let p = path.replace('\0', "%00");
        let lines = format!(
            "getfile {p}\nstat {p}\nlstat {p}\ngetdir {p}\nopen {p} r 0\npread 0 64 0\nreadlink {p} 100\n\
             putfile {p}-new 0644 7\nplanted\nmkdir {p}-dir 0755\nrename /d/a.txt {p}-moved\nsymlink {p} /planted\ngetfile /planted\nunlink /planted\n"
        );
        let answer = chirp_session(chirp, &lines);
        assert!(!shows_canary(&answer), "{path:?} read the canary through Chirp");
        if !s.root().join("d/a.txt").exists() {
            std::fs::write(s.root().join("d/a.txt"), b"alpha\n").unwrap();
        }
    }
    assert_eq!(beside(&s.root()), before, "something was made beside the export root");
}

/// One HTTP request on a fresh connection; returns the status and the body.
fn http_get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    sock.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = sock.read_to_end(&mut raw);
    let status = String::from_utf8_lossy(&raw).split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, raw)
}

/// A request target for `path`: the bytes percent-encoded where HTTP needs it, with
/// slashes and dots left as the trick spells them.
fn target_of(path: &str) -> String {
    let mut t = String::new();
    for b in path.bytes() {
        match b {
            b'/' | b'.' | b'%' | b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => t.push(b as char),
            _ => t.push_str(&format!("%{b:02X}")),
        }
    }
    if !t.starts_with('/') {
        t.insert(0, '/');
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_api_refuses_every_path_trick() {
    let s = TestServer::start();
    furnish(&s.root());
    let console = s.console(locus_testkit::console::ConsoleConfig::default());
    // Log in as admin.
    let mut sock = TcpStream::connect(console).unwrap();
    let body = br#"{"token":"admin:admin-token"}"#;
    write!(
        sock,
        "POST /api/login HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Locus-Console: 1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    sock.write_all(body).unwrap();
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw);
    let cookie = raw
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: ").or_else(|| l.strip_prefix("Set-Cookie: ")))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie in {raw}"))
        .to_string();
    let (status, page) = http_get(console, "/api/download?path=/d/a.txt", &[("Cookie", &cookie)]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&page));
    for path in tricks() {
        let q = target_of(&path).replacen('/', "%2F", 1);
        for api in ["list", "preview", "download", "load"] {
            let key = if api == "load" { "file" } else { "path" };
            let (_, answer) = http_get(console, &format!("/api/{api}?{key}={q}"), &[("Cookie", &cookie)]);
            assert!(!shows_canary(&answer), "/api/{api} of {path:?} read the canary");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_http_door_refuses_path_tricks_and_bad_signed_urls() {
    let head = TestServer::head(None, |_| {});
    furnish(&head.root());
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    admin.write_file("/d/a.txt", 0o644, b"alpha\n").await.unwrap();
    admin.write_file("/d/b.txt", 0o644, b"bravo\n").await.unwrap();
    let http = head.http();
    let bearer = ("Authorization", "Bearer admin:admin-token");
    let (status, ok) = http_get(http, "/d/a.txt", &[bearer]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&ok));
    for path in tricks() {
        let (status, answer) = http_get(http, &target_of(&path), &[bearer]);
        assert!(!shows_canary(&answer), "{path:?} read the canary through the head's HTTP door");
        assert_ne!(status, 200, "{path:?} answered 200");
    }

    // Signed URLs: a good one works; forged, expired, replayed for another file or
    // another subject do not.
    let url = admin.call(Share { path: "/d/a.txt".into(), ttl_s: 60 }).await.unwrap();
    let rel = url.find("/d/").map(|i| &url[i..]).unwrap();
    let (status, body) = http_get(http, rel, &[]);
    assert_eq!(status, 200, "{rel}: {}", String::from_utf8_lossy(&body));
    assert!(body.ends_with(b"alpha\n"));
    assert!(rel.starts_with("/d/a%2Etxt?"), "{rel}");
    let sig = rel.split("sig=").nth(1).unwrap();
    let mut forged = sig.to_string();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    let expires: u64 = rel.split("e=").nth(1).unwrap().split('&').next().unwrap().parse().unwrap();
    for bad in [
        rel.replace(sig, &forged),
        rel.replace("/d/a%2Etxt", "/d/b%2Etxt"),
        rel.replace("s=admin", "s=alice"),
        rel.replace(&format!("e={expires}"), &format!("e={}", expires + 3600)),
        rel.replace(&format!("e={expires}"), "e=1"),
        rel.split('?').next().unwrap().to_string(),
        rel.replace("/d/a%2Etxt", "/d/../d/b%2Etxt"),
    ] {
        let (status, body) = http_get(http, &bad, &[]);
        assert!(status == 401 || status == 403 || status == 400, "{bad} answered {status}");
        assert!(!body.ends_with(b"alpha\n") && !body.ends_with(b"bravo\n"), "{bad} read a file");
    }
    // An expired one: signed for a second, read after it passed.
    let short = admin.call(Share { path: "/d/a.txt".into(), ttl_s: 1 }).await.unwrap();
    let short = short.find("/d/").map(|i| short[i..].to_string()).unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, _) = http_get(http, &short, &[]);
    assert!(status == 401 || status == 403, "an expired signed URL answered {status}");
}
