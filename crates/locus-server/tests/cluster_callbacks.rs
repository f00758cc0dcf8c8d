//! Callbacks on a cluster head: a client's promises break when another client changes
//! what it asked about, through the same head or through another head on the same
//! PostgreSQL namespace; promises are made only for what the subject may see.

use locus_client::{Client, PushMessage};
use locus_proto::types::{Rights, SetTime};
use locus_testkit::{wait_for_break, TestPostgres, TestServer};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Every path named by the breaks pushed within `wait`.
async fn told_within(pushes: &mut UnboundedReceiver<PushMessage>, wait: Duration) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(push)) = tokio::time::timeout_at(deadline, pushes.recv()).await {
        if push.topic == locus_proto::frame::PUSH_BREAK {
            out.extend(locus_proto::codec::decode::<Vec<String>>(&push.meta).unwrap());
        }
    }
    out
}

/// `holder` asks about /d, /d/f and /d/big through `head`; `writer` changes them.
async fn changes_break_promises(holder_head: &TestServer, writer: &Client) {
    let (holder, listener) = (holder_head.client("admin").await, holder_head.client("admin").await);
    let mut pushes = listener.subscribe();
    holder.callbacks(1000, listener.client_id()).await.unwrap();
    let big: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 253) as u8).collect();

    let ask = || async {
        holder.stat("/d/f").await.unwrap();
        holder.stat("/d/big").await.unwrap();
        holder.readdir("/d").await.unwrap();
    };
    ask().await;
    assert!(holder_head.shared().callbacks.held() >= 3);
    // A small file rewritten (kept in the namespace).
    writer.write_file("/d/f", 0o644, b"second").await.unwrap();
    wait_for_break(&mut pushes, "/d/f").await;
    // A large one (its bytes go straight to the nodes; the commit breaks).
    ask().await;
    writer.write_file("/d/big", 0o644, &big).await.unwrap();
    wait_for_break(&mut pushes, "/d/big").await;
    // Names made and removed, attributes changed.
    ask().await;
    writer.write_file("/d/new", 0o644, b"new").await.unwrap();
    wait_for_break(&mut pushes, "/d/new").await;
    ask().await;
    writer.unlink("/d/new").await.unwrap();
    wait_for_break(&mut pushes, "/d/new").await;
    ask().await;
    writer.chmod("/d/f", 0o600).await.unwrap();
    wait_for_break(&mut pushes, "/d/f").await;
    ask().await;
    writer.rename("/d/f", "/d/g").await.unwrap();
    wait_for_break(&mut pushes, "/d/f").await;
    // Directories, links, sizes, times and ACLs.
    holder.readdir("/d").await.unwrap();
    writer.mkdir("/d/sub", 0o755).await.unwrap();
    wait_for_break(&mut pushes, "/d/sub").await;
    holder.readdir("/d").await.unwrap();
    writer.symlink("g", "/d/link").await.unwrap();
    wait_for_break(&mut pushes, "/d/link").await;
    holder.stat("/d/g").await.unwrap();
    writer.truncate("/d/g", 2).await.unwrap();
    wait_for_break(&mut pushes, "/d/g").await;
    holder.stat("/d/g").await.unwrap();
    writer
        .call(locus_proto::ops::Utimes { path: "/d/g".into(), atime: SetTime::Now, mtime: SetTime::Now })
        .await
        .unwrap();
    wait_for_break(&mut pushes, "/d/g").await;
    holder.stat("/d/sub").await.unwrap();
    writer.acl_set("/d/sub", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    wait_for_break(&mut pushes, "/d/sub").await;
    holder.readdir("/d").await.unwrap();
    writer.rmdir("/d/sub").await.unwrap();
    wait_for_break(&mut pushes, "/d/sub").await;
    // Nothing changed: nothing is told.
    holder.stat("/d/g").await.unwrap();
    assert_eq!(told_within(&mut pushes, Duration::from_millis(700)).await, BTreeSet::new());
}

async fn setup(head: &TestServer) {
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    admin.write_file("/d/f", 0o644, b"first").await.unwrap();
    admin.write_file("/d/big", 0o644, &vec![7u8; 2 << 20]).await.unwrap();
}

/// Two heads over one PostgreSQL database, a data node joined to each, and `setup`'s
/// files (the database goes last: bind them in this order).
async fn two_heads() -> (TestPostgres, TestServer, TestServer, [TestServer; 2]) {
    let pg = TestPostgres::start();
    let first = TestServer::head(Some(&pg.url()), |_| {});
    let second = TestServer::head(Some(&pg.url()), |_| {});
    let nodes = [TestServer::data_node(&first), TestServer::data_node(&second)];
    setup(&first).await;
    (pg, first, second, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_a_head_breaks_its_other_clients_promises() {
    let head = TestServer::head(None, |_| {});
    let _node = TestServer::data_node(&head);
    setup(&head).await;
    let writer = head.client("admin").await;
    changes_break_promises(&head, &writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_another_head_breaks_promises_on_postgresql() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let (_pg, first, second, _nodes) = two_heads().await;
    let writer = second.client("admin").await;
    changes_break_promises(&first, &writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_promises_nothing_a_subject_may_not_see() {
    let head = TestServer::head(None, |_| {});
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    admin.acl_set("/", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/d", "alice", Rights(0)).await.unwrap();
    let (holder, listener) = (head.client("alice").await, head.client("alice").await);
    let mut pushes = listener.subscribe();
    holder.callbacks(100, listener.client_id()).await.unwrap();
    assert!(holder.readdir("/d").await.is_err());
    assert!(holder.stat("/d/secret").await.is_err());
    assert_eq!(head.shared().callbacks.held(), 0, "a refused lookup or listing holds no promise");
    admin.write_file("/d/secret", 0o644, b"made by admin").await.unwrap();
    assert_eq!(told_within(&mut pushes, Duration::from_millis(500)).await, BTreeSet::new());
    // Breaks go only to connections of the same subject.
    let bob = head.client("bob").await;
    assert!(bob.callbacks(10, listener.client_id()).await.is_err());
}

/// A read-only run's plan a head keeps is forgotten when another head changes the
/// directory: its next run there sees the change once the notice arrives (as a
/// cached mount does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_another_head_forgets_a_kept_run_plan_on_postgresql() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let (_pg, first, second, _nodes) = two_heads().await;
    let find = locus_testkit::build_storelet("find");
    let reader = first.client("admin").await;
    let names = || async {
        let out = reader.storelet_run(&find, "/d", vec!["/".into(), "-type".into(), "f".into()], false).await.unwrap();
        assert_eq!(out.result.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
        let mut lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect();
        lines.sort();
        lines
    };
    assert_eq!(names().await, ["/big", "/f"]);
    assert_eq!(names().await, ["/big", "/f"]);
    let plans = || first.shared().head.as_ref().unwrap().run_plans();
    assert_eq!(plans(), (1, 1), "the second run is over the kept plan");
    second.client("admin").await.write_file("/d/new", 0o644, b"made through the other head").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while names().await != ["/big", "/f", "/new"] {
        assert!(std::time::Instant::now() < deadline, "the first head never heard of /d/new");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(plans().0 >= 2, "planned again once told");
}
