//! The Chirp driver against CCTools' chirp_server (Debian's `coop-computing-tools`) and
//! against Locus' own Chirp endpoint, each dropping clients idle for a second: open files
//! outlive the connection they were opened on.

use locus_drivers::chirp::ChirpDriver;
use locus_drivers::{open_flags as of, Driver};
use std::path::Path;
use std::time::Duration;

/// Longer than the servers' idle limit (1 s), so the connection is gone afterwards.
const IDLE: Duration = Duration::from_millis(1600);

#[test]
fn open_files_survive_chirp_server_dropping_an_idle_connection() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let chirp = locus_testkit::peers::start_chirp_with(work.path(), &root, &["-t", "1"])
        .expect("chirp_server (coop-computing-tools) runs");
    open_files_survive_a_dropped_connection(chirp.addr, &root);
}

/// Locus' endpoint, with the rights chirp_server's test ACL gives the loopback address.
fn locus_chirp(idle: Duration) -> (locus_testkit::TestServer, std::net::SocketAddr) {
    let server = locus_testkit::TestServer::start();
    let rights = locus_proto::Rights::parse("rwld").unwrap();
    server.shared().store.acl_set("admin", "/", "address:127.0.0.1", rights).unwrap();
    let config = locus_testkit::server::chirp::ChirpConfig { idle, ..Default::default() };
    let addr = server.chirp(config);
    (server, addr)
}

#[test]
fn open_files_survive_locus_dropping_an_idle_connection() {
    let (server, addr) = locus_chirp(Duration::from_secs(1));
    open_files_survive_a_dropped_connection(addr, &server.root());
    // Chirp requests count in the metrics under the native operations' names.
    let metrics = server.shared().metrics.render(server.shared());
    assert!(metrics.contains(r#"locus_operations_total{op="pwrite",result="ok"} 2"#), "{metrics}");
}

fn open_files_survive_a_dropped_connection(addr: std::net::SocketAddr, root: &Path) {
    let (mut d, _) = ChirpDriver::connect(&format!("chirp://{addr}/")).unwrap();

    let flags = of::READ | of::WRITE | of::CREATE | of::TRUNCATE;
    let h = d.open("/f", flags, 0o666).unwrap().handle;
    assert_eq!(d.pwrite(h, 0, b"before").unwrap(), 6);
    let gone = d.open("/gone", flags, 0o666).unwrap().handle;
    let never_used = d.open("/f", of::READ, 0).unwrap().handle;

    std::thread::sleep(IDLE);
    // Opened again on a new connection, without truncating: the first write is still there.
    assert_eq!(d.pwrite(h, 6, b" after").unwrap(), 6);
    assert_eq!(d.pread(h, 0, 100).unwrap(), b"before after");
    assert_eq!(d.fstat(h).unwrap().size, 12);
    // A file removed behind the driver's back cannot be opened again: its handle is stale.
    std::fs::remove_file(root.join("gone")).unwrap();
    assert_eq!(d.pread(gone, 0, 1).unwrap_err().errno, libc::ESTALE);
    // Closing a handle never opened on this connection needs nothing from the server.
    d.close(never_used).unwrap();
    d.close(gone).unwrap();

    std::thread::sleep(IDLE);
    // Path calls after a pause go on a fresh connection too.
    assert_eq!(d.lstat("/f").unwrap().size, 12);
    d.close(h).unwrap();
    assert_eq!(d.close(h).unwrap_err().errno, libc::EBADF);
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"before after");
}

/// Kills the processes chirp_server forked for its connections, as a crash would.
fn kill_connections(chirp: &locus_testkit::peers::Peer) {
    let out = std::process::Command::new("pgrep").args(["-P", &chirp.pid().to_string()]).output().unwrap();
    let pids = String::from_utf8(out.stdout).unwrap();
    assert!(!pids.trim().is_empty(), "chirp_server has a process per connection");
    for pid in pids.split_whitespace() {
        std::process::Command::new("kill").args(["-KILL", pid]).status().unwrap();
    }
    // Well under the pause after which every call may be sent again.
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn a_call_that_loses_its_connection_is_sent_again_only_if_that_is_harmless() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let chirp = locus_testkit::peers::start_chirp_with(work.path(), &root, &[]).expect("chirp_server runs");
    let (mut d, _) = ChirpDriver::connect(&format!("chirp://{}/", chirp.addr)).unwrap();
    let h = d.open("/f", of::READ | of::WRITE | of::CREATE, 0o666).unwrap().handle;
    assert_eq!(d.pwrite(h, 0, b"one").unwrap(), 3);

    // Harmless twice: a stat, a write at an offset (the file is opened again first).
    kill_connections(&chirp);
    assert_eq!(d.lstat("/f").unwrap().size, 3);
    kill_connections(&chirp);
    assert_eq!(d.pwrite(h, 3, b"two").unwrap(), 3);
    assert_eq!(d.pread(h, 0, 10).unwrap(), b"onetwo");

    // Not harmless: a mkdir that lost its connection fails with EIO and is not repeated
    // behind the caller's back; the next call connects again.
    kill_connections(&chirp);
    assert_eq!(d.mkdir("/d", 0o755).unwrap_err().errno, libc::EIO);
    d.mkdir("/d", 0o755).unwrap();
    d.close(h).unwrap();
}

/// A server that breaks the protocol on purpose: it announces more bytes than were asked
/// for and sends lines that never end.
fn hostile_chirp_server() -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                for line in BufReader::new(conn).lines() {
                    let Ok(line) = line else { return };
                    let word = line.split_whitespace().next().unwrap_or("");
                    let reply: Vec<u8> = match word {
                        "address" => b"address\nhostile\n".to_vec(),
                        "open" => b"3\n1 2 33188 1 0 0 0 10 4096 1 0 0 0\n".to_vec(),
                        "pread" | "readlink" => b"1000000\n".to_vec(),
                        "lstat" => [&b"0\n"[..], &vec![b'7'; 200_000]].concat(),
                        _ => b"-8\n".to_vec(),
                    };
                    if out.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_server_that_breaks_the_protocol_gets_errors_not_a_crash() {
    let addr = hostile_chirp_server();
    let (mut d, _) = ChirpDriver::connect(&format!("chirp://{addr}/")).unwrap();
    let h = d.open("/f", of::READ, 0).unwrap().handle;
    // A million bytes announced for a read of ten.
    let e = d.pread(h, 0, 10).unwrap_err();
    assert_eq!(e.errno, libc::EPROTO, "{}", e.message);
    assert_eq!(d.readlink("/l").unwrap_err().errno, libc::EPROTO);
    // A line that never ends is cut off, not read into memory whole.
    let e = d.lstat("/f").unwrap_err();
    assert!(e.message.contains("line"), "{}", e.message);
    // The simple client refuses the same.
    let mut c = locus_drivers::chirp::ChirpClient::connect(addr).unwrap();
    let fd = c.open("/f", "r", 0).unwrap();
    let mut buf = [0u8; 10];
    let e = c.pread(fd, &mut buf, 0).unwrap_err();
    assert!(e.contains("announced"), "{e}");
}
