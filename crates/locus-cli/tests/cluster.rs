//! Unmodified programs on a cluster head: `locus mount`, `locus run` and `locus get`
//! read a large file's bytes straight from its data node, not through the head.

use locus_client::Client;
use locus_mount::is_mounted;
use locus_testkit::TestServer;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How many times a server has answered operation `op`.
fn answered(server: &TestServer, op: &str) -> u64 {
    server.shared().store.counters().ops().iter().find(|o| o.op == op).map_or(0, |o| o.count)
}

fn locus(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_locus"));
    c.env("LOCUS_HOME", home).env("LOCUS_TOKEN", "admin:admin-token").env_remove("RUST_BACKTRACE");
    c
}

#[test]
fn mount_run_and_get_read_from_the_data_node() {
    let head = TestServer::head(None, |_| {});
    let node = TestServer::data_node(&head);
    let scratch = head.scratch();
    let home = scratch.join("home");
    let data: Vec<u8> = (0..5u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let local = scratch.join("big");
    std::fs::write(&local, &data).unwrap();
    let put = locus(&home).args(["put"]).arg(&local).arg(head.url("/big")).status().unwrap();
    assert!(put.success());

    // locus get
    let got = scratch.join("got");
    assert!(locus(&home).arg("get").arg(head.url("/big")).arg(&got).status().unwrap().success());
    assert_eq!(std::fs::read(&got).unwrap(), data);
    let from_node = answered(&node, "object_read");
    assert!(from_node >= 5, "the node served {from_node} reads");

    // locus run (traced): cat reads it through the client library's handles.
    let out = locus(&home)
        .args(["run", "--interpose", "trace", "--", "cat"])
        .arg(format!("/locus/{}/big", head.addr))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, data);
    assert!(answered(&node, "object_read") > from_node);

    // locus mount
    if locus_testkit::require_fuse() {
        let mnt = scratch.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let mut child = locus(&home).arg("mount").arg(head.url("/")).arg(&mnt).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_mounted(&mnt) {
            assert!(Instant::now() < deadline, "not mounted after 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = answered(&node, "object_read");
        let read = std::fs::read(mnt.join("big"));
        let _ = locus(&home).arg("umount").arg(&mnt).status();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(read.unwrap(), data);
        assert!(answered(&node, "object_read") > before);
    }
    // None of those bytes went through the head.
    assert_eq!(answered(&head, "pread"), 0);
    assert_eq!(answered(&head, "get"), 0);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `locus serve FLAGS` on `port` with its own directories and the test's admin and
/// data-node tokens; a data node joins with the latter.
fn serve(dir: &Path, name: &str, port: u16, flags: &[&str]) -> std::process::Child {
    let (root, state) = (dir.join(name).join("export"), dir.join(name).join("state"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("tokens"), "admin admin-token\nlocus-node node-token\n").unwrap();
    let mut command = locus(&dir.join("home"));
    if flags.contains(&"--data-node") {
        command.env("LOCUS_TOKEN", "locus-node:node-token");
    }
    let child = command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--root")
        .arg(&root)
        .arg("--state")
        .arg(&state)
        .args(flags)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(port);
    child
}

/// Two `locus serve --head` processes on one PostgreSQL database: the first is killed
/// (SIGKILL) while a client writes through it; every write it acknowledged is read back
/// through the second, which goes on serving.
#[test]
fn killing_a_head_loses_no_acknowledged_write() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = locus_testkit::TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb, pn) = (free_port(), free_port(), free_port());
    let url = pg.url();
    let mut a = serve(dir.path(), "a", pa, &["--head", "--meta", &url]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let connect = |port: u16| {
        let opts = locus_client::ConnectOptions {
            addr: format!("127.0.0.1:{port}"),
            credentials: locus_client::Credentials { subject: "admin".into(), token: "admin-token".into() },
            tls_ca: None,
            tls_name: None,
            deadlines: Default::default(),
        };
        rt.block_on(Client::connect(&opts)).unwrap()
    };
    // Once the first head answers, it has made the namespace's keys.
    let writer = connect(pa);
    // A second head without the first's wrap key refuses to start, naming the file;
    // with a copy (what the operator does) it serves.
    let wrap = dir.path().join("a/state/cluster-wrap.key");
    let lacking = dir.path().join("lacking");
    std::fs::create_dir_all(lacking.join("state")).unwrap();
    std::fs::create_dir_all(lacking.join("export")).unwrap();
    let mut refused = locus(&dir.path().join("home"))
        .args(["serve", "--head", "--listen", "127.0.0.1:0", "--meta", &url, "--state"])
        .arg(lacking.join("state"))
        .arg("--root")
        .arg(lacking.join("export"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while refused.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = refused.kill();
            panic!("a head without the wrap key started");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = refused.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("cluster-wrap.key"), "{said}");
    std::fs::create_dir_all(dir.path().join("b/state")).unwrap();
    std::fs::copy(&wrap, dir.path().join("b/state/cluster-wrap.key")).unwrap();
    let mut b = serve(dir.path(), "b", pb, &["--head", "--meta", &url]);
    let mut node = serve(dir.path(), "n", pn, &["--data-node", &format!("locus://127.0.0.1:{pa}/")]);
    // Wait until the node has joined: a large file then lands on it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(writer.write_file("/probe", 0o644, &vec![1u8; 100_000])).is_err() {
        assert!(Instant::now() < deadline, "the data node did not join");
        std::thread::sleep(Duration::from_millis(100));
    }
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writes = {
        let acked = acked.clone();
        rt.spawn(async move {
            for i in 0u32.. {
                let data: Vec<u8> = (0..if i % 2 == 0 { 150_000 } else { 300 }).map(|b: u32| (b ^ i) as u8).collect();
                match writer.write_file(&format!("/w{i}"), 0o644, &data).await {
                    Ok(_) => acked.lock().unwrap().push((i, data)),
                    Err(_) => return,
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    let _ = a.kill();
    let _ = a.wait();
    rt.block_on(writes).unwrap();
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(acked.len() >= 5, "only {} writes before the kill", acked.len());
    let reader = connect(pb);
    for (i, data) in &acked {
        assert_eq!(&rt.block_on(reader.read_file(&format!("/w{i}"))).unwrap(), data, "acknowledged write {i}");
    }
    rt.block_on(reader.write_file("/after", 0o644, b"still serving")).unwrap();
    assert_eq!(rt.block_on(reader.read_file("/after")).unwrap(), b"still serving");
    for c in [&mut b, &mut node] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Stops a process (SIGSTOP) so it hangs rather than dies; continues it when dropped.
struct Stopped(u32);

impl Stopped {
    fn new(child: &std::process::Child) -> Stopped {
        assert!(Command::new("kill").args(["-STOP", &child.id().to_string()]).status().unwrap().success());
        Stopped(child.id())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

/// Ends the processes of a test however it ends.
struct Reap(Vec<std::process::Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A data node that hangs (SIGSTOP, not killed): reads of a file on two replicas fail
/// over to the other within the client's deadlines, and the head goes on answering
/// other requests, its own reads from the nodes included.
#[test]
fn a_hung_data_node_stalls_neither_reads_nor_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let (ph, p1, p2) = (free_port(), free_port(), free_port());
    let head_url = format!("locus://127.0.0.1:{ph}/");
    let head = serve(dir.path(), "h", ph, &["--head", "--replication", "2"]);
    let n1 = serve(dir.path(), "n1", p1, &["--data-node", &head_url]);
    let n2 = serve(dir.path(), "n2", p2, &["--data-node", &head_url]);
    let procs = Reap(vec![head, n1, n2]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let deadlines = locus_client::Deadlines {
        connect: Duration::from_secs(5),
        request: Duration::from_secs(30),
        node_read: Duration::from_secs(2),
    };
    let connect = || {
        let opts = locus_client::ConnectOptions {
            addr: format!("127.0.0.1:{ph}"),
            credentials: locus_client::Credentials { subject: "admin".into(), token: "admin-token".into() },
            tls_ca: None,
            tls_name: None,
            deadlines,
        };
        rt.block_on(Client::connect(&opts)).unwrap()
    };
    let admin = connect();
    // Both nodes have joined once a file goes to two of them.
    let deadline = Instant::now() + Duration::from_secs(20);
    while rt.block_on(admin.write_file("/probe", 0o644, &vec![1u8; 200_000])).is_err() {
        assert!(Instant::now() < deadline, "the data nodes did not join");
        std::thread::sleep(Duration::from_millis(100));
    }
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    rt.block_on(admin.write_file("/big", 0o644, &data)).unwrap();
    let located = rt.block_on(admin.call(locus_client::ops::Locate { path: "/big".into() })).unwrap();
    let nodes = located.location.expect("a large file is on the nodes").nodes;
    assert_eq!(nodes.len(), 2);
    // Hang the node reads go to first.
    let first = if nodes[0].ends_with(&format!(":{p1}")) { &procs.0[1] } else { &procs.0[2] };
    let stopped = Stopped::new(first);

    // A third-party read fails over to the other replica.
    let t = Instant::now();
    let got = rt.block_on(async { tokio::time::timeout(Duration::from_secs(40), admin.read_file("/big")).await });
    assert_eq!(got.expect("the read did not fail over in 40 s").unwrap(), data);
    eprintln!("read with a hung replica: {:?}", t.elapsed());

    // A read through the head (its own calls to the nodes) while other clients are
    // answered promptly.
    let through_head = {
        let c = connect();
        rt.spawn(async move {
            let h = c
                .call(locus_client::ops::Open {
                    path: "/big".into(),
                    flags: locus_client::types::open_flags::READ,
                    mode: 0,
                })
                .await
                .unwrap()
                .handle;
            let read = c.call_with(locus_client::ops::Pread { handle: h, offset: 0, len: 1 << 20 }, &[]);
            tokio::time::timeout(Duration::from_secs(40), read).await
        })
    };
    let other = connect();
    for i in 0..5 {
        let t = Instant::now();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), async {
                assert_eq!(other.stat("/big").await.unwrap().size, data.len() as u64);
                other.write_file(&format!("/small{i}"), 0o644, b"small").await.unwrap();
                assert_eq!(other.read_file(&format!("/small{i}")).await.unwrap(), b"small");
            })
            .await
            .expect("the head answered within 5 s while a node hangs")
        });
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, bytes) = rt.block_on(through_head).unwrap().expect("the head's read did not fail over in 40 s").unwrap();
    assert_eq!(bytes, data[..1 << 20]);
    drop(stopped);
    drop(procs);
}
