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

/// A free port no other test of this binary was given: the tests here run at once and
/// bind their ports only later, so two of them handed the same port would each find
/// the other's server listening there (and one test would go on with a stranger).
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
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
    let mut child = command
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
    // What listens is this server, not one that took the port first.
    assert!(child.try_wait().unwrap().is_none(), "{name}: `locus serve` on {port} exited (the port was taken?)");
    child
}

/// Two `locus serve --head` processes on one PostgreSQL database and two data nodes
/// (replication 2): eight clients, whose URL names both heads, write files large enough
/// to go straight to the nodes; the first head is killed (SIGKILL) mid-stream. The
/// writers go on through the second head, and every write any head acknowledged reads
/// back exactly through it and from each node alone. A data node that knew only the
/// dead head, restarted, serves again with the keys it kept; one that knew both joins
/// the second.
#[test]
fn killing_a_head_under_eight_writers_loses_no_acknowledged_write() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = locus_testkit::TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb, pn1, pn2) = (free_port(), free_port(), free_port(), free_port());
    let url = pg.url();
    let head_flags = ["--head", "--meta", &url, "--replication", "2", "--node-timeout-s", "3"];
    let a = serve(dir.path(), "a", pa, &head_flags);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let both = format!("127.0.0.1:{pa},127.0.0.1:{pb}");
    let options = |addr: &str| locus_client::ConnectOptions {
        addr: addr.to_string(),
        credentials: locus_client::Credentials { subject: "admin".into(), token: "admin-token".into() },
        tls_ca: None,
        tls_name: None,
        deadlines: Default::default(),
    };
    let connect = |addr: &str| rt.block_on(Client::connect(&options(addr))).unwrap();
    // Once the first head answers, it has made the namespace's keys.
    let probe = connect(&format!("127.0.0.1:{pa}"));
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
    let b = serve(dir.path(), "b", pb, &head_flags);
    // One node knows only the first head; the other knows both.
    let n1 = serve(dir.path(), "n1", pn1, &["--data-node", &format!("locus://127.0.0.1:{pa}/")]);
    let n2 = serve(dir.path(), "n2", pn2, &["--data-node", &format!("locus://{both}/")]);
    let mut reap = Reap(vec![a, b, n1, n2]);
    // Wait until both nodes have joined: a large file then lands on two of them.
    let deadline = Instant::now() + Duration::from_secs(20);
    while rt.block_on(probe.write_file("/probe", 0o644, &vec![1u8; 2 << 20])).is_err() {
        assert!(Instant::now() < deadline, "the data nodes did not join");
        std::thread::sleep(Duration::from_millis(100));
    }

    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8u32)
        .map(|w| {
            let (acked, killed, opts) = (acked.clone(), killed.clone(), options(&both));
            rt.spawn(async move {
                let mut client = Client::connect(&opts).await.unwrap();
                let (mut i, mut after_kill) = (0u32, 0);
                while after_kill < 3 {
                    let data: Vec<u8> = (0..(2 << 20) + i * 1000).map(|b: u32| (b ^ (w << 8) ^ i) as u8).collect();
                    let name = format!("/w{w}.{i}");
                    match client.write_file(&name, 0o644, &data).await {
                        Ok(_) => acked.lock().unwrap().push((name, data)),
                        // The head died: connect again (the URL's next head answers).
                        Err(e) if e.is_transient() => client = Client::connect(&opts).await.unwrap(),
                        Err(e) => panic!("{name}: {e}"),
                    }
                    after_kill += killed.load(std::sync::atomic::Ordering::Relaxed) as usize;
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = reap.0[0].kill();
    let _ = reap.0[0].wait();
    let at_kill = acked.lock().unwrap().len();
    killed.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        rt.block_on(w).unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(at_kill >= 8, "only {at_kill} writes before the kill");
    assert!(acked.len() >= at_kill + 8 * 3 - 8, "the writers did not go on through the second head");

    // Every acknowledged write, through the surviving head and from each node alone.
    let reader = connect(&format!("127.0.0.1:{pb}"));
    let node_reads = locus_client::nodes::NodeReads::default();
    for (name, data) in &acked {
        assert_eq!(&rt.block_on(reader.read_file(name)).unwrap(), data, "acknowledged write {name}");
        let opened = rt.block_on(reader.open(name, locus_client::types::open_flags::READ, 0)).unwrap();
        let location = opened.location.expect("a large file is on the nodes");
        assert_eq!(location.nodes.len(), 2, "{name}");
        for node in &location.nodes {
            let alone = locus_client::types::Location { nodes: vec![node.clone()], ..location.clone() };
            let got = rt.block_on(node_reads.read(&alone, 0, data.len() as u32)).unwrap();
            assert!(got[..] == data[..], "{name} from {node}");
        }
        rt.block_on(reader.close(opened.handle)).unwrap();
    }

    // The node that knew only the dead head, restarted, serves reads with its kept keys.
    let _ = reap.0[2].kill();
    let _ = reap.0[2].wait();
    reap.0[2] = serve(dir.path(), "n1", pn1, &["--data-node", &format!("locus://127.0.0.1:{pa}/")]);
    let (name, data) = &acked[acked.len() - 1];
    let location = rt.block_on(reader.open(name, locus_client::types::open_flags::READ, 0)).unwrap().location.unwrap();
    let alone = locus_client::types::Location { nodes: vec![format!("127.0.0.1:{pn1}")], ..location.clone() };
    let fresh = locus_client::nodes::NodeReads::default();
    assert!(rt.block_on(fresh.read(&alone, 0, 4096)).unwrap()[..] == data[..4096]);
    // The node that knew both heads joined the second: it is up there.
    std::thread::sleep(Duration::from_secs(4));
    let list = rt.block_on(reader.call(locus_client::ops::NodeList {})).unwrap();
    let n2 = list.iter().find(|n| n.addr == format!("127.0.0.1:{pn2}")).expect("listed");
    assert_eq!(n2.state, "up", "{list:?}");
    rt.block_on(reader.write_file("/after", 0o644, b"still serving")).unwrap();
    assert_eq!(rt.block_on(reader.read_file("/after")).unwrap(), b"still serving");
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

    // No replica left: both nodes hang. The read fails in bounded time, never with
    // wrong bytes.
    let second = if nodes[0].ends_with(&format!(":{p1}")) { &procs.0[2] } else { &procs.0[1] };
    let also = Stopped::new(second);
    let got = rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), admin.read_file("/big")).await });
    let err = got.expect("a read with every replica hung did not end within 60 s").unwrap_err();
    assert!(matches!(err.code(), locus_proto::Code::IO | locus_proto::Code::TIMEDOUT), "{err}");
    drop(also);
    drop(stopped);

    // The head hangs: a request fails with ETIMEDOUT after the request deadline.
    let quick = {
        let opts = locus_client::ConnectOptions {
            addr: format!("127.0.0.1:{ph}"),
            credentials: locus_client::Credentials { subject: "admin".into(), token: "admin-token".into() },
            tls_ca: None,
            tls_name: None,
            deadlines: locus_client::Deadlines { request: Duration::from_secs(2), ..deadlines },
        };
        rt.block_on(Client::connect(&opts)).unwrap()
    };
    let head_stopped = Stopped::new(&procs.0[0]);
    let t = Instant::now();
    let err = rt.block_on(quick.stat("/big")).unwrap_err();
    assert!(matches!(err, locus_client::ClientError::TimedOut(_)), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    drop(head_stopped);
    drop(procs);
}
