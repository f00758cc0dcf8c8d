//! A cluster that heals: data nodes send heartbeats, a node that stops is marked down
//! and the versions it held are copied from their replicas; a damaged copy (found by
//! a read or the scrub) is copied again from a replica; a drained node gives up its
//! versions and can then be removed. Real head and data nodes on ephemeral ports.

use locus_client::nodes::NodeReads;
use locus_cluster::Content;
use locus_proto::ops::{NodeDrain, NodeList, NodeRemove};
use locus_proto::types::{open_flags, Location, NodeInfo};
use locus_proto::Code;
use locus_server::cluster::objects::OBJECTS_DIR;
use locus_server::cluster::{checksums, Head};
use locus_testkit::TestServer;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(seed as u32) as u8 ^ seed).collect()
}

fn head_of(server: &TestServer) -> &Head {
    server.shared().head.as_deref().expect("a head")
}

/// The data nodes holding `path`'s current version, as the namespace says.
fn holders(head: &TestServer, path: &str) -> Vec<u64> {
    match head_of(head).meta.get(path).unwrap().expect("the file exists").content {
        Content::Nodes(ids) => ids,
        Content::Inline(_) => Vec::new(),
    }
}

/// The id the head gave the node at `node`.
fn id_of(head: &TestServer, node: &TestServer) -> u64 {
    let nodes = head_of(head).meta.nodes().unwrap();
    nodes.iter().find(|n| n.addr == node.addr.to_string()).expect("the node joined").id
}

/// Version files (not checksums or copies in progress) in a node's objects directory.
fn versions_on(node: &TestServer) -> Vec<String> {
    let dir = node.root().join(OBJECTS_DIR);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.retain(|n| n.split_once('.').is_some_and(|(o, v)| o.parse::<u64>().is_ok() && v.parse::<u64>().is_ok()));
    names.sort();
    names
}

/// Waits up to `limit` for `done`, checking every 100 ms.
async fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn state(list: &[NodeInfo], id: u64) -> Option<(String, u64)> {
    list.iter().find(|n| n.id == id).map(|n| (n.state.clone(), n.versions))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_versions_are_copied_until_each_has_its_replicas_and_no_read_fails() {
    dead_node_heals(None).await;
}

/// The same on PostgreSQL, with a second head on the namespace: one of them heals (the
/// lease holder), and the copies are made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_heads_heal_a_dead_node_together() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = locus_testkit::TestPostgres::start();
    dead_node_heals(Some(&pg.url())).await;
}

/// Kills the data node holding the most versions of six files (replication 2, three
/// nodes) under a read load, and checks every version is back at two live replicas.
async fn dead_node_heals(meta: Option<&str>) {
    let policy = |h: &mut locus_server::cluster::HeadConfig| {
        h.replication = 2;
        h.node_timeout = Duration::from_secs(2);
        h.repair_rate = 0;
    };
    let head = TestServer::head(meta, policy);
    let _other_head = meta.map(|url| TestServer::head(Some(url), policy));
    let nodes = [TestServer::data_node(&head), TestServer::data_node(&head), TestServer::data_node(&head)];
    let admin = head.client("admin").await;
    let files: Vec<(String, Vec<u8>)> =
        (0..6).map(|i| (format!("/f{i}"), pattern(2 * MIB + i * 1000, i as u8))).collect();
    for (path, data) in &files {
        admin.write_file(path, 0o644, data).await.unwrap();
        assert_eq!(holders(&head, path).len(), 2);
    }
    // The node holding the most versions dies; readers go on meanwhile.
    let ids: Vec<u64> = nodes.iter().map(|n| id_of(&head, n)).collect();
    let load = |id: u64| files.iter().filter(|(p, _)| holders(&head, p).contains(&id)).count();
    let victim = (0..3).max_by_key(|&i| load(ids[i])).unwrap();
    let dead = ids[victim];
    assert!(load(dead) > 0);
    let mut nodes: Vec<Option<TestServer>> = nodes.into_iter().map(Some).collect();
    drop(nodes[victim].take());

    let reader = {
        let client = head.client("admin").await;
        let files = files.clone();
        tokio::spawn(async move {
            let (mut reads, mut failed) = (0, 0);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(6) {
                for (path, data) in &files {
                    match client.read_file(path).await {
                        Ok(got) => assert_eq!(&got, data, "{path}: wrong bytes"),
                        Err(_) => failed += 1,
                    }
                    reads += 1;
                }
            }
            (reads, failed)
        })
    };
    eventually(Duration::from_secs(30), "every version back at two live replicas", || {
        files.iter().all(|(p, _)| {
            let h = holders(&head, p);
            h.len() == 2 && !h.contains(&dead)
        })
    })
    .await;
    let (reads, failed) = reader.await.unwrap();
    assert!(reads > 0);
    assert_eq!(failed, 0, "{failed} of {reads} reads failed while a node was dead");
    for (path, data) in &files {
        assert_eq!(&admin.read_file(path).await.unwrap(), data);
    }
    // Every replica holds the right bytes (each node is read alone).
    for (path, data) in &files {
        let opened = admin.open(path, open_flags::READ, 0).await.unwrap();
        let location: Location = opened.location.expect("on nodes");
        assert_eq!(location.nodes.len(), 2);
        for addr in &location.nodes {
            let alone = Location { nodes: vec![addr.clone()], ..location.clone() };
            assert_eq!(NodeReads::default().read(&alone, 0, (3 * MIB) as u32).await.unwrap(), data[..]);
        }
        admin.close(opened.handle).await.unwrap();
    }

    // The dead node shows as down and holds nothing now; it can be forgotten.
    let list = admin.call(NodeList {}).await.unwrap();
    assert_eq!(state(&list, dead), Some(("down".into(), 0)));
    admin.call(NodeRemove { node: dead }).await.unwrap();
    let list = admin.call(NodeList {}).await.unwrap();
    assert!(state(&list, dead).is_none());
    assert!(list.iter().all(|n| n.state == "up"), "{list:?}");
    // Each version was copied once: no node holds a version the namespace does not name.
    let named: usize = files.iter().map(|(p, _)| holders(&head, p).len()).sum();
    let kept: usize = nodes.iter().flatten().map(|n| versions_on(n).len()).sum();
    assert_eq!(kept, named);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_copy_is_found_by_a_read_or_the_scrub_and_copied_again_from_a_replica() {
    let head = TestServer::head(None, |h| {
        h.replication = 2;
        h.node_timeout = Duration::from_secs(3);
        h.repair_rate = 0;
    });
    let nodes = [TestServer::data_node(&head), TestServer::data_node(&head), TestServer::data_node(&head)];
    let admin = head.client("admin").await;
    let a = pattern(3 * MIB + 17, 7);
    let b = pattern(2 * MIB, 8);
    admin.write_file("/a", 0o644, &a).await.unwrap();
    admin.write_file("/b", 0o644, &b).await.unwrap();
    let ids: Vec<u64> = nodes.iter().map(|n| id_of(&head, n)).collect();
    let node_of = |id: u64| &nodes[ids.iter().position(|i| *i == id).unwrap()];
    // Every stored version has its checksums beside it.
    for n in &nodes {
        for v in versions_on(n) {
            assert!(n.root().join(OBJECTS_DIR).join(format!("{v}{}", checksums::SUFFIX)).exists(), "{v}");
        }
    }

    // A bit flips on a disk under /a: the scrub finds it and moves the copy aside.
    let entry = head_of(&head).meta.get("/a").unwrap().unwrap();
    let name = format!("{}.{}", entry.object, entry.version);
    let bad_node = holders(&head, "/a")[0];
    let file = node_of(bad_node).root().join(OBJECTS_DIR).join(&name);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[MIB + 5] ^= 0x04;
    std::fs::write(&file, &bytes).unwrap();
    assert_eq!(locus_server::cluster::node::scrub(node_of(bad_node).shared(), 0), 1);
    assert!(!file.exists());
    assert!(node_of(bad_node).root().join(OBJECTS_DIR).join(checksums::DAMAGED_DIR).join(&name).exists());
    // The next heartbeat tells the head, which copies /a again from the good replica.
    eventually(Duration::from_secs(20), "/a back at two good replicas", || {
        let h = holders(&head, "/a");
        h.len() == 2 && !h.contains(&bad_node)
    })
    .await;
    assert_eq!(admin.read_file("/a").await.unwrap(), a);

    // A bit flips under /b, and a read at that node finds it: the read fails there
    // (never wrong bytes), the client's read goes on at the replica, and it is healed.
    let entry = head_of(&head).meta.get("/b").unwrap().unwrap();
    let name = format!("{}.{}", entry.object, entry.version);
    let bad_node = holders(&head, "/b")[1];
    let file = node_of(bad_node).root().join(OBJECTS_DIR).join(&name);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[10] ^= 0x80;
    std::fs::write(&file, &bytes).unwrap();
    let opened = admin.open("/b", open_flags::READ, 0).await.unwrap();
    let location = opened.location.clone().expect("on nodes");
    let addr = node_of(bad_node).addr.to_string();
    let alone = Location { nodes: vec![addr], ..location.clone() };
    let err = NodeReads::default().read(&alone, 0, 100).await.unwrap_err();
    assert_eq!(err.code(), Code::IO, "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");
    assert_eq!(NodeReads::default().read(&location, 0, (2 * MIB) as u32).await.unwrap(), b[..]);
    admin.close(opened.handle).await.unwrap();
    eventually(Duration::from_secs(20), "/b back at two good replicas", || {
        let h = holders(&head, "/b");
        h.len() == 2 && !h.contains(&bad_node)
    })
    .await;
    assert_eq!(admin.read_file("/b").await.unwrap(), b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_after_being_marked_down_serves_again_and_drops_what_moved() {
    let head = TestServer::head(None, |h| {
        h.replication = 2;
        h.node_timeout = Duration::from_secs(1);
        h.capability_ttl = Duration::from_secs(1);
        h.repair_rate = 0;
    });
    // The first node sends no heartbeats of its own: the test says when it joins.
    let quiet = TestServer::start();
    std::fs::create_dir_all(quiet.root().join(OBJECTS_DIR)).unwrap();
    quiet.join(&head);
    let (_n2, _n3) = (TestServer::data_node(&head), TestServer::data_node(&head));
    let quiet_id = id_of(&head, &quiet);
    let admin = head.client("admin").await;
    // Written while it is up, until one version lands on it.
    let mut on_quiet = None;
    for i in 0..6u8 {
        let path = format!("/g{i}");
        let data = pattern(2 * MIB, i);
        quiet.join(&head);
        admin.write_file(&path, 0o644, &data).await.unwrap();
        if holders(&head, &path).contains(&quiet_id) {
            on_quiet = Some((path, data));
            break;
        }
    }
    let (path, data) = on_quiet.expect("placement takes turns, so a version lands on every node");
    assert_eq!(versions_on(&quiet).len(), 1);

    // Silent past the timeout: marked down, and its version copied to the third node.
    eventually(Duration::from_secs(20), "the version moved off the silent node", || {
        let h = holders(&head, &path);
        h.len() == 2 && !h.contains(&quiet_id)
    })
    .await;
    let list = admin.call(NodeList {}).await.unwrap();
    assert_eq!(state(&list, quiet_id), Some(("down".into(), 0)));

    // It comes back: up again, and its stale copy is dropped once no capability
    // could name it.
    quiet.join(&head);
    let list = admin.call(NodeList {}).await.unwrap();
    assert_eq!(state(&list, quiet_id), Some(("up".into(), 0)));
    let (quiet_ref, head_ref) = (&quiet, &head);
    let beat = async move {
        loop {
            quiet_ref.join(head_ref);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    tokio::select! {
        _ = beat => unreachable!(),
        _ = eventually(Duration::from_secs(20), "the stale copy dropped", || versions_on(&quiet).is_empty()) => {}
    }
    assert_eq!(admin.read_file(&path).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_gives_up_its_versions_and_only_then_may_be_removed() {
    let head = TestServer::head(None, |h| {
        h.replication = 1;
        h.repair_rate = 0;
    });
    let nodes = [TestServer::data_node(&head), TestServer::data_node(&head)];
    let admin = head.client("admin").await;
    let files: Vec<(String, Vec<u8>)> = (0..4).map(|i| (format!("/d{i}"), pattern(MIB + 100, 20 + i as u8))).collect();
    for (path, data) in &files {
        admin.write_file(path, 0o644, data).await.unwrap();
    }
    let ids: Vec<u64> = nodes.iter().map(|n| id_of(&head, n)).collect();
    let held = |id: u64| files.iter().filter(|(p, _)| holders(&head, p).contains(&id)).count();
    let leaving = if held(ids[0]) > 0 { 0 } else { 1 };
    let (leaving_id, staying_id) = (ids[leaving], ids[1 - leaving]);

    // Refused while it holds versions; refused to anyone but an admin.
    let err = admin.call(NodeRemove { node: leaving_id }).await.unwrap_err();
    assert_eq!(err.code(), Code::BUSY, "{err}");
    let alice = head.client("alice").await;
    assert_eq!(alice.call(NodeList {}).await.unwrap_err().code(), Code::ACCES);
    assert_eq!(alice.call(NodeDrain { node: leaving_id }).await.unwrap_err().code(), Code::ACCES);
    assert_eq!(admin.call(NodeDrain { node: 999_999 }).await.unwrap_err().code(), Code::NOENT);

    admin.call(NodeDrain { node: leaving_id }).await.unwrap();
    eventually(Duration::from_secs(30), "the node drained", || {
        files.iter().all(|(p, _)| holders(&head, p) == [staying_id])
    })
    .await;
    let list = admin.call(NodeList {}).await.unwrap();
    assert_eq!(state(&list, leaving_id), Some(("drained".into(), 0)));
    // New versions no longer go to it.
    admin.write_file("/new", 0o644, &pattern(2 * MIB, 30)).await.unwrap();
    assert_eq!(holders(&head, "/new"), [staying_id]);
    admin.call(NodeRemove { node: leaving_id }).await.unwrap();
    for (path, data) in &files {
        assert_eq!(&admin.read_file(path).await.unwrap(), data);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_run_covers_files_kept_at_the_head_and_moves_off_a_dead_node() {
    let head = TestServer::head(None, |h| {
        h.replication = 2;
        h.repair_rate = 0;
    });
    let admin = head.client("admin").await;
    admin.mkdir("/src", 0o755).await.unwrap();
    // Stored by the head itself, before any data node joined.
    let mut expected = Vec::new();
    for i in 0..2 {
        admin.write_file(&format!("/src/early{i}.go"), 0o644, &pattern(300_000, i)).await.unwrap();
        expected.push(format!("/early{i}.go"));
    }
    assert_eq!(holders(&head, "/src/early0.go"), [0]);
    let nodes = [TestServer::data_node(&head), TestServer::data_node(&head), TestServer::data_node(&head)];
    // They move to the nodes (two replicas each), and the head's copies go.
    eventually(Duration::from_secs(20), "the head's versions moved to the nodes", || {
        (0..2).all(|i| {
            let h = holders(&head, &format!("/src/early{i}.go"));
            h.len() == 2 && !h.contains(&0)
        })
    })
    .await;
    for i in 0..6u8 {
        admin.write_file(&format!("/src/late{i}.go"), 0o644, &pattern(200_000, 10 + i)).await.unwrap();
        expected.push(format!("/late{i}.go"));
    }
    admin.write_file("/src/small.go", 0o644, b"package small").await.unwrap();
    expected.push("/small.go".into());
    expected.sort();

    let find = locus_testkit::build_storelet("find");
    let args = ["/", "-name", "*.go"].map(String::from).to_vec();
    let lines = |out: &locus_client::StoreletOutput| {
        let mut lines: Vec<String> = String::from_utf8(out.stdout.clone()).unwrap().lines().map(String::from).collect();
        lines.sort();
        lines
    };
    let out = admin.storelet_run(&find, "/src", args.clone(), false).await.unwrap();
    assert_eq!(lines(&out), expected, "every file exactly once");

    // A node dies; the head still counts it live (no timeout yet) and gives it a share,
    // which moves to the nodes holding the other replicas.
    let mut nodes: Vec<Option<TestServer>> = nodes.into_iter().map(Some).collect();
    drop(nodes[0].take());
    let out = admin.storelet_run(&find, "/src", args, false).await.unwrap();
    assert_eq!(out.result.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(lines(&out), expected, "every file exactly once, with a node dead");
    // That run was over the plan kept from the first: the dead node's share was found
    // again in the namespace by its files' hashes.
    assert_eq!(head_of(&head).run_plans(), (1, 1));
}

/// A kept run plan naming a node marked down is not used: the run is planned again
/// over the live nodes holding the files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_run_plan_is_not_used_once_a_node_of_it_is_down() {
    let head = TestServer::head(None, |h| {
        h.replication = 2;
        h.inline_max = 0;
        h.node_timeout = Duration::from_secs(2);
        h.repair_rate = 0;
    });
    let mut nodes: Vec<Option<TestServer>> = (0..3).map(|_| Some(TestServer::data_node(&head))).collect();
    let admin = head.client("admin").await;
    admin.mkdir("/src", 0o755).await.unwrap();
    let mut expected: Vec<String> = (0..9).map(|i| format!("/f{i}.go")).collect();
    for path in &expected {
        admin.write_file(&format!("/src{path}"), 0o644, b"package f").await.unwrap();
    }
    expected.sort();
    let find = locus_testkit::build_storelet("find");
    let run = || async {
        let out = admin.storelet_run(&find, "/src", ["/", "-name", "*.go"].map(String::from).to_vec(), false).await;
        let out = out.unwrap();
        assert_eq!(out.result.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
        let mut lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect();
        lines.sort();
        lines
    };
    assert_eq!(run().await, expected);
    assert_eq!(run().await, expected);
    assert_eq!(head_of(&head).run_plans(), (1, 1));
    let dead = id_of(&head, nodes[0].as_ref().unwrap());
    drop(nodes[0].take());
    let deadline = Instant::now() + Duration::from_secs(20);
    while state(&admin.call(NodeList {}).await.unwrap(), dead).is_none_or(|(s, _)| s != "down") {
        assert!(Instant::now() < deadline, "node {dead} never marked down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(run().await, expected, "every file exactly once, on the live nodes");
    assert_eq!(head_of(&head).run_plans(), (2, 1), "planned again, the kept plan left unused");
}

/// Rebalancing between data nodes by measured load: the versions the nodes' heartbeats
/// report busy move from the busiest node to the least busy one; names, bytes and reads
/// stay, the old copies go to the collector, and only an admin may ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_versions_move_to_the_least_busy_node_by_measured_load() {
    use locus_proto::ops::{RebalanceApply, RebalancePlan};
    let head = TestServer::head(None, |h| h.node_timeout = Duration::from_secs(1));
    let first = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    // Written while only the first node exists: every version is on it.
    let files: Vec<Vec<u8>> = (0..3).map(|i| pattern(2 * MIB, i)).collect();
    for (i, data) in files.iter().enumerate() {
        admin.write_file(&format!("/hot{i}"), 0o644, data).await.unwrap();
    }
    let second = TestServer::data_node(&head);
    let (first_id, second_id) = (id_of(&head, &first), id_of(&head, &second));
    assert!(first_id < second_id);
    assert_eq!(holders(&head, "/hot0"), [first_id]);
    let bob = head.client("bob").await;
    assert_eq!(bob.call(RebalancePlan { max_moves: 4 }).await.unwrap_err().code(), Code::ACCES);

    // Reads of two files go straight to the first node, whose heartbeats report them.
    let started = Instant::now();
    let plan = loop {
        for (i, data) in files.iter().enumerate().take(2) {
            assert_eq!(&admin.read_file(&format!("/hot{i}")).await.unwrap(), data);
        }
        let plan = admin.call(RebalancePlan { max_moves: 4 }).await.unwrap();
        if !plan.moves.is_empty() {
            break plan;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "no plan from the reported load: {plan:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(plan.before.len(), 2);
    assert!(plan.before[0] > 0 && plan.before[1] == 0, "{plan:?}");
    assert!(plan.after[0] < plan.before[0] && plan.after[1] > 0, "{plan:?}");
    let m = &plan.moves[0];
    assert_eq!((m.from as u64, m.to as u64), (first_id, second_id));
    assert!(m.path == "/hot0" || m.path == "/hot1", "a file that was read: {m:?}");
    assert_eq!(holders(&head, &m.path), [first_id], "a plan moves nothing");

    let applied = admin.call(RebalanceApply { max_moves: 4 }).await.unwrap();
    assert!(!applied.moves.is_empty() && applied.skipped.is_empty(), "{applied:?}");
    for m in &applied.moves {
        assert_eq!(holders(&head, &m.path), [second_id], "{m:?}");
        let i: usize = m.path.trim_start_matches("/hot").parse().unwrap();
        assert_eq!(admin.read_file(&m.path).await.unwrap(), files[i], "the same bytes, now from the second node");
    }
    assert_eq!(holders(&head, "/hot2"), [first_id], "an unread file stays");
}
