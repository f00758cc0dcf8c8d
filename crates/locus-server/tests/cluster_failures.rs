//! The failure table's remaining rows (docs/cluster.md): a data node killed in the middle
//! of a write, with one replica and with two, and PostgreSQL restarted under a head.
//! Real head and data nodes on ephemeral ports.

use locus_cluster::Content;
use locus_testkit::TestServer;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(seed as u32) as u8 ^ seed).collect()
}

fn holders(head: &TestServer, path: &str) -> Vec<u64> {
    let head = head.shared().head.as_deref().unwrap();
    match head.meta.get(path).unwrap().expect("the file exists").content {
        Content::Nodes(ids) => ids,
        Content::Inline(_) => Vec::new(),
    }
}

/// A source that hands out `data` a MiB at a time, pausing between, so that a test can
/// act while an upload is under way.
struct Slow {
    data: Vec<u8>,
    at: usize,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl tokio::io::AsyncRead for Slow {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(sleep) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        let n = buf.remaining().min(MIB).min(self.data.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        self.sleep = Some(Box::pin(tokio::time::sleep(Duration::from_millis(20))));
        Poll::Ready(Ok(()))
    }
}

/// Writes `data` to `path` as a third-party write while the first of `nodes` still
/// running is killed once 8 MiB have gone; answers whether the write succeeded.
async fn write_while_killing(head: &TestServer, nodes: &mut [Option<TestServer>], path: &str, data: &[u8]) -> bool {
    let admin = head.client("admin").await;
    let mut source = Slow { data: data.to_vec(), at: 0, sleep: None };
    let mut killed = false;
    let outcome = admin
        .put_sized(path, 0o644, &mut source, data.len() as u64, |sent| {
            if sent >= 8 * MIB as u64 && !killed {
                killed = true;
                // The first node still running goes (the head chose among them all).
                if let Some(n) = nodes.iter_mut().find(|n| n.is_some()) {
                    drop(n.take());
                }
            }
        })
        .await;
    assert!(killed, "the write ended before a node could be killed");
    outcome.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_write_loses_nothing_acknowledged() {
    for replication in [1, 2] {
        let head = TestServer::head(None, |h| {
            h.replication = replication;
            h.node_timeout = Duration::from_secs(2);
        });
        // Exactly the nodes a write needs: the one killed is among those written to.
        let mut nodes: Vec<Option<TestServer>> = (0..replication).map(|_| Some(TestServer::data_node(&head))).collect();
        let admin = head.client("admin").await;
        let old = pattern(3 * MIB, 1);
        admin.write_file("/f", 0o644, &old).await.unwrap();
        let new = pattern(32 * MIB, 2);
        let ok = write_while_killing(&head, &mut nodes, "/f", &new).await;
        // The write fails (a node it needed is gone) and the old version stays whole,
        // or it was acknowledged and is whole.
        let got = admin.read_file("/f").await;
        match ok {
            false if replication == 1 => assert!(got.is_err(), "the old version's only node is gone"),
            false => assert_eq!(got.unwrap(), old, "replication {replication}: the old version stays"),
            true => assert_eq!(got.unwrap(), new, "replication {replication}: an acknowledged write is whole"),
        }
        assert!(!ok, "replication {replication}: a write whose node died mid-stream was acknowledged");
        // A node joins in the dead one's place: writes succeed again once it is down.
        nodes.push(Some(TestServer::data_node(&head)));
        nodes.push(Some(TestServer::data_node(&head)));
        let start = Instant::now();
        while admin.write_file("/g", 0o644, &new).await.is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "writes did not come back");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(admin.read_file("/g").await.unwrap(), new);
        assert_eq!(holders(&head, "/g").len(), replication);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_rides_out_a_postgres_restart() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = locus_testkit::TestPostgres::start();
    let head = TestServer::head(Some(&pg.url()), |_| {});
    let _node = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    let big = pattern(3 * MIB, 3);
    admin.write_file("/before", 0o644, &big).await.unwrap();
    // A client holding a promise: changes announced by other heads while the link was
    // down are lost, so the head breaks every promise once it listens again.
    let holder = head.client("admin").await;
    let mut pushes = holder.subscribe();
    holder.callbacks(10, 0).await.unwrap();
    holder.stat("/before").await.unwrap();
    assert!(pg.restart(), "PostgreSQL restarts");
    // Metadata calls may fail (EAGAIN) until the next transaction reconnects; then all
    // is there, and writes go on.
    let start = Instant::now();
    let got = loop {
        match admin.read_file("/before").await {
            Ok(got) => break got,
            Err(e) => {
                assert_eq!(e.code(), locus_proto::Code::AGAIN, "{e}");
                assert!(start.elapsed() < Duration::from_secs(20), "the head did not reconnect");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(got, big);
    let broken = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let push = pushes.recv().await.expect("the connection stays");
            if push.topic == locus_proto::frame::PUSH_BREAK {
                return locus_proto::codec::decode::<Vec<String>>(&push.meta).unwrap();
            }
        }
    });
    assert_eq!(broken.await.expect("a break after the link came back"), ["/before"]);
    admin.write_file("/after", 0o644, &big).await.unwrap();
    assert_eq!(admin.read_file("/after").await.unwrap(), big);
}

/// A data node told of one head learns the others from it (and keeps them in its state
/// directory), so when that head dies it goes on joining through another: it stays up,
/// and new versions still go to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_told_of_one_head_rejoins_through_another_when_it_dies() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = locus_testkit::TestPostgres::start();
    let quick = |h: &mut locus_server::cluster::HeadConfig| h.node_timeout = Duration::from_secs(2);
    let first = TestServer::head(Some(&pg.url()), quick);
    let second = TestServer::head(Some(&pg.url()), quick);
    let node = TestServer::data_node(&first);
    let kept = node.state_dir().join(locus_server::cluster::node::HEADS_FILE);
    let (first_addr, second_addr) = (first.addr.to_string(), second.addr.to_string());
    let started = Instant::now();
    loop {
        let heads = std::fs::read_to_string(&kept).unwrap_or_default();
        if heads.lines().any(|h| h == second_addr) && heads.lines().any(|h| h == first_addr) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "the node never learned both heads: {heads:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(first);
    // Past the head's timeout twice over: a node that stopped joining would be down.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let admin = second.client("admin").await;
    let list = admin.call(locus_client::ops::NodeList {}).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].state, "up", "{:?}", list[0]);
    assert!(list[0].seen_s <= 2, "{:?}", list[0]);
    let big = pattern(3 * MIB, 9);
    admin.write_file("/after", 0o644, &big).await.unwrap();
    assert_eq!(holders(&second, "/after").len(), 1, "the new version is on the node");
    assert_eq!(admin.read_file("/after").await.unwrap(), big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_named_one_head_goes_on_through_another_it_learned() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = locus_testkit::TestPostgres::start();
    let first = TestServer::head(Some(&pg.url()), |_| {});
    let second = TestServer::head(Some(&pg.url()), |_| {});
    let second_addr = second.addr.to_string();
    // A head names the heads heard from lately (each says so every 2 s).
    let started = Instant::now();
    let client = loop {
        let client = first.client("admin").await;
        if client.heads().contains(&second_addr) {
            break client;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "never told of the other head: {:?}", client.heads());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(client.heads().contains(&first.addr.to_string()), "{:?}", client.heads());
    let mut options = first.options("admin");
    options.learn_heads(client.heads());
    assert_eq!(options.addr.split(',').filter(|a| *a == first.addr.to_string()).count(), 1, "named once");
    // Small: kept in the namespace (heads without data nodes keep larger files to
    // themselves).
    let data = pattern(1000, 3);
    client.write_file("/kept", 0o644, &data).await.unwrap();
    drop(client);
    drop(first);
    // The options named the first head alone; what it said of the others is enough.
    let again = locus_client::Client::connect(&options).await.expect("through the other head");
    assert_eq!(again.read_file("/kept").await.unwrap(), data);
    assert!(again.heads().contains(&second_addr));
}
