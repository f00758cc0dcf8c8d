//! CCTools' own `chirp` client (Debian's `coop-computing-tools`) against Locus' Chirp
//! endpoint: the commands a Chirp user types, with Locus' ACLs deciding who may do what.

use locus_testkit::TestServer;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};

/// Runs `chirp -a METHOD ADDR ARGS...` in `dir`.
fn chirp(dir: &Path, method: &str, addr: SocketAddr, args: &[&str]) -> Output {
    Command::new("chirp")
        .args(["-t", "10", "-a", method, &addr.to_string()])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("chirp (coop-computing-tools) runs")
}

/// [`chirp`], which must succeed; answers its standard output.
fn ok(dir: &Path, method: &str, addr: SocketAddr, args: &[&str]) -> String {
    let out = chirp(dir, method, addr, args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "chirp {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// The user name this test runs as: `unix` authentication proves it.
fn user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn the_chirp_client_works_on_locus_as_its_acls_allow() {
    let server = TestServer::start();
    let me = format!("unix:{}", user());
    let all = locus_proto::Rights::parse("rwlda").unwrap();
    server.shared().store.acl_set("admin", "/", &me, all).unwrap();
    let addr = server.chirp(Default::default());
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 253) as u8).collect();
    std::fs::write(dir.join("big.bin"), &big).unwrap();
    std::fs::write(dir.join("small.txt"), "hello over chirp\n").unwrap();

    assert_eq!(ok(dir, "unix", addr, &["whoami"]).trim(), me);
    ok(dir, "unix", addr, &["put", "big.bin", "/big.bin"]);
    ok(dir, "unix", addr, &["put", "small.txt", "/small.txt"]);
    assert_eq!(std::fs::read(server.local("big.bin")).unwrap(), big, "put stored the exact bytes");
    ok(dir, "unix", addr, &["get", "/big.bin", "back.bin"]);
    assert_eq!(std::fs::read(dir.join("back.bin")).unwrap(), big, "get returned the exact bytes");
    let listing = ok(dir, "unix", addr, &["ls", "/"]);
    assert!(listing.contains("big.bin") && listing.contains("small.txt"), "{listing}");
    let long = ok(dir, "unix", addr, &["ls", "-la", "/"]);
    assert!(long.contains("3000000"), "{long}");
    let stat = ok(dir, "unix", addr, &["stat", "/small.txt"]);
    assert!(stat.contains("size:    17"), "{stat}");
    ok(dir, "unix", addr, &["mkdir", "-p", "/a/b/c"]);
    assert!(server.local("a/b/c").is_dir());
    ok(dir, "unix", addr, &["mv", "/small.txt", "/a/b/moved.txt"]);
    assert_eq!(ok(dir, "unix", addr, &["cat", "/a/b/moved.txt"]), "hello over chirp\n");
    let md5 = ok(dir, "unix", addr, &["md5", "/a/b/moved.txt"]);
    assert!(md5.to_lowercase().starts_with("01034a0b669bc86eb36421c805644257"), "{md5}"); // md5sum's
    ok(dir, "unix", addr, &["setacl", "/a", "address:127.0.0.1", "rl"]);
    let acl = ok(dir, "unix", addr, &["getacl", "/a"]);
    assert!(acl.contains("address:127.0.0.1 rl") && acl.contains(&format!("{me} rwlda")), "{acl}");
    // Locus sees the same ACL: one list for both protocols.
    let native = server.shared().store.acl_get("admin", "/a").unwrap();
    assert!(native.entries.iter().any(|e| e.subject == "address:127.0.0.1"));

    // The address subject may read and list under /a, and nothing else.
    assert_eq!(ok(dir, "address", addr, &["cat", "/a/b/moved.txt"]), "hello over chirp\n");
    let refused = chirp(dir, "address", addr, &["put", "small.txt", "/a/new.txt"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Permission denied"), "{refused:?}");
    let refused = chirp(dir, "address", addr, &["ls", "/"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Permission denied"), "{refused:?}");
    let refused = chirp(dir, "address", addr, &["rm", "/big.bin"]);
    assert!(!refused.status.success());
    assert!(server.local("big.bin").exists(), "a subject without 'd' removed nothing");
    let refused = chirp(dir, "address", addr, &["setacl", "/a", "address:127.0.0.1", "rwlda"]);
    assert!(!refused.status.success(), "a subject without 'a' cannot raise its own rights");

    ok(dir, "unix", addr, &["rm", "/a"]);
    assert!(!server.local("a").exists(), "rm removed the whole tree");
    ok(dir, "unix", addr, &["rm", "/big.bin"]);
    assert_eq!(ok(dir, "unix", addr, &["ls", "/"]).trim(), "");
}

#[test]
fn locus_serve_offers_only_the_methods_it_is_told() {
    // The binary, as an operator starts it: `--chirp-port 0` reports its port in the port file.
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let flags = ["--chirp-auth".to_string(), "unix".to_string()];
    let exe = Path::new(env!("CARGO_BIN_EXE_locus"));
    let (_server, _token, addr) = locus_testkit::peers::start_locus_chirp(exe, work.path(), &root, &flags).unwrap();
    let out = Command::new("chirp")
        .args(["-t", "3", "-a", "address", &addr.to_string(), "whoami"])
        .current_dir(work.path())
        .output()
        .expect("chirp runs");
    assert!(!out.status.success(), "address authentication was not offered");
    assert_eq!(ok(work.path(), "unix", addr, &["whoami"]).trim(), format!("unix:{}", user()));
    // Authenticated, but no ACL names this subject: nothing is granted by default.
    let refused = chirp(work.path(), "unix", addr, &["ls", "/"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Permission denied"), "{refused:?}");
}

/// `locus serve --chirp-port 0` (every Chirp method offered, as by default) exporting
/// `work/root`, with its own LOCUS_HOME; killed when dropped.
struct Served {
    child: std::process::Child,
    /// The native URL, `locus://127.0.0.1:PORT`.
    url: String,
    chirp: SocketAddr,
    home: std::path::PathBuf,
    token: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_chirp(work: &Path) -> Served {
    let home = work.join("home");
    let state = work.join("state");
    let port_file = work.join("ports");
    std::fs::create_dir_all(&home).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--listen", "127.0.0.1:0", "--chirp-port", "0"])
        .arg("--root")
        .arg(work.join("root"))
        .arg("--state")
        .arg(&state)
        .arg("--port-file")
        .arg(&port_file)
        .env("LOCUS_HOME", &home)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("locus serve");
    let mut served =
        Served { child, url: String::new(), chirp: ([127, 0, 0, 1], 0).into(), home, token: String::new() };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let ports = std::fs::read_to_string(&port_file).unwrap_or_default();
        let chirp = ports.lines().find_map(|l| l.strip_prefix("chirp ")?.trim().parse::<u16>().ok());
        if let (Some(native), Some(chirp)) = (ports.lines().next().and_then(|l| l.trim().parse::<u16>().ok()), chirp) {
            served.url = format!("locus://127.0.0.1:{native}");
            served.chirp = ([127, 0, 0, 1], chirp).into();
            break;
        }
        assert!(served.child.try_wait().unwrap().is_none(), "locus serve exited at start");
        assert!(std::time::Instant::now() < deadline, "locus serve did not report its ports");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let tokens = std::fs::read_to_string(state.join("tokens")).unwrap();
    served.token = tokens.lines().find_map(|l| l.strip_prefix("admin ")).unwrap().trim().to_string();
    served
}

impl Served {
    /// `locus acl set URL/dir SUBJECT RIGHTS` as the admin, as an operator types it.
    fn acl_set(&self, dir: &str, subject: &str, rights: &str) {
        let out = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["acl", "set", &format!("{}{dir}", self.url), subject, rights])
            .env("LOCUS_HOME", &self.home)
            .env("LOCUS_TOKEN", format!("admin:{}", self.token))
            .output()
            .unwrap();
        assert!(out.status.success(), "acl set {subject} {rights}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// CCTools' `chirp` client must be here (coop-computing-tools).
fn require_chirp() -> bool {
    let present = Command::new("sh").args(["-c", "command -v chirp"]).output().is_ok_and(|o| o.status.success());
    locus_testkit::require("chirp", present, "apt-get install coop-computing-tools")
}

#[test]
fn a_star_in_an_acl_admits_no_chirp_host_subject() {
    if !require_chirp() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("root/pub")).unwrap();
    std::fs::write(work.path().join("root/pub/a.txt"), "public to token holders\n").unwrap();
    let server = serve_chirp(work.path());
    let (dir, addr) = (work.path(), server.chirp);
    let cat = |method: &str| chirp(dir, method, addr, &["cat", "/pub/a.txt"]);
    // `chirp cat` exits 0 even when refused: what counts is what it printed.
    let denied = |out: &Output| {
        !String::from_utf8_lossy(&out.stdout).contains("public")
            && String::from_utf8_lossy(&out.stderr).contains("Permission denied")
    };

    // The steps: `*` is "anyone holding a Locus token", not "anyone reaching the port".
    server.acl_set("/pub", "*", "rl");
    assert_eq!(ok(dir, "address", addr, &["whoami"]).trim(), "address:127.0.0.1");
    let refused = cat("address");
    assert!(denied(&refused), "`*` let an anonymous address subject read: {refused:?}");
    // The hostname method, where the reverse name resolves back (localhost here), is no better.
    let host = chirp(dir, "hostname", addr, &["whoami"]);
    let host = String::from_utf8_lossy(&host.stdout).trim().to_string();
    assert!(host.starts_with("hostname:"), "{host}");
    assert!(denied(&cat("hostname")), "`*` let {host} read");

    // An entry that names the address grants it.
    server.acl_set("/pub", "address:127.0.0.1", "rl");
    assert_eq!(ok(dir, "address", addr, &["cat", "/pub/a.txt"]), "public to token holders\n");
    server.acl_set("/pub", "address:127.0.0.1", "-");
    assert!(denied(&cat("address")), "the removed entry still granted");
    // So does a Chirp pattern that matches it, and not one that does not.
    server.acl_set("/pub", "address:10.0.*", "rl");
    assert!(denied(&cat("address")), "address:10.0.* matched 127.0.0.1");
    server.acl_set("/pub", "address:127.0.*", "rl");
    assert_eq!(ok(dir, "address", addr, &["cat", "/pub/a.txt"]), "public to token holders\n");
    // Patterns are per method: the address pattern gives the hostname subject nothing.
    assert!(denied(&cat("hostname")), "address:127.0.* admitted {host}");
    server.acl_set("/pub", &host, "rl");
    assert_eq!(ok(dir, "hostname", addr, &["cat", "/pub/a.txt"]), "public to token holders\n");
}
