//! Third-party writes: a client sends a large file's bytes straight to the data nodes
//! under a write capability, and the head commits the version once every node has
//! checked it. Real head and data nodes on ephemeral ports; the refusals an attacker
//! would meet at each step.

use locus_client::Client;
use locus_cluster::Content;
use locus_proto::ops::{ObjectWrite, WriteBegin, WriteCommit};
use locus_proto::types::{open_flags, Location, Rights, WriteTarget};
use locus_proto::Code;
use locus_server::cluster::objects::OBJECTS_DIR;
use locus_server::cluster::HeadConfig;
use locus_testkit::TestServer;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(seed as u32) as u8 ^ seed).collect()
}

/// A head that takes logins through any loopback port (so a counting proxy may stand
/// in front of it), with `adjust`'s policy.
fn head_with(adjust: impl FnOnce(&mut HeadConfig)) -> TestServer {
    TestServer::start_with(|c| {
        c.names.push("127.0.0.1:*".parse().unwrap());
        let mut head = HeadConfig::new(c.state_dir.join("meta.db").display().to_string());
        adjust(&mut head);
        c.head = Some(head);
    })
}

fn holders(head: &TestServer, path: &str) -> Vec<u64> {
    let head = head.shared().head.as_deref().unwrap();
    match head.meta.get(path).unwrap().expect("the file exists").content {
        Content::Nodes(ids) => ids,
        Content::Inline(_) => Vec::new(),
    }
}

fn has_version(node: &TestServer, object: u64, version: u64) -> bool {
    node.root().join(OBJECTS_DIR).join(format!("{object}.{version}")).exists()
}

/// The upload of `target`'s version to one of its nodes.
fn write_of(target: &WriteTarget) -> ObjectWrite {
    ObjectWrite { capability: target.capability.clone(), nodes: target.node_ids.clone() }
}

/// A node's connection as the subject the target's capability names.
async fn at_node(target: &WriteTarget, i: usize) -> Client {
    let reads = locus_client::nodes::NodeReads::default();
    reads.connect(&target.nodes[i], &target.capability.subject, &target.node_token).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_goes_straight_to_the_nodes_and_the_head_commits_it() {
    let head = head_with(|h| h.replication = 2);
    let (n1, n2) = (TestServer::data_node(&head), TestServer::data_node(&head));
    // The client reaches the head only through a proxy that counts what crosses.
    let proxy = locus_testkit::proxy::DelayProxy::start(head.addr, Duration::ZERO).unwrap();
    let mut options = head.options("admin");
    options.addr = proxy.addr.to_string();
    let admin = Client::connect(&options).await.unwrap();
    let data = pattern(8 * MIB + 3, 1);
    let before = proxy.total_bytes();
    admin.write_file("/big", 0o640, &data).await.unwrap();
    let through_head = proxy.total_bytes() - before;
    assert!(through_head < 64 << 10, "{through_head} bytes of an 8 MiB write crossed the head's link");

    let entry = head.shared().head.as_deref().unwrap().meta.get("/big").unwrap().unwrap();
    assert_eq!((entry.size, entry.mode), (data.len() as u64, 0o640));
    assert_eq!(holders(&head, "/big").len(), 2);
    for n in [&n1, &n2] {
        assert!(has_version(n, entry.object, entry.version));
        let crc = n.root().join(OBJECTS_DIR).join(format!("{}.{}.crc", entry.object, entry.version));
        assert!(crc.exists(), "the node keeps checksums of a version written to it");
    }
    assert_eq!(admin.read_file("/big").await.unwrap(), data);

    // An overwrite is a new version; small files still go through the head.
    let newer = pattern(2 * MIB, 2);
    admin.write_file("/big", 0o644, &newer).await.unwrap();
    assert_eq!(admin.read_file("/big").await.unwrap(), newer);
    assert_ne!(head.shared().head.as_deref().unwrap().meta.get("/big").unwrap().unwrap().version, entry.version);
    let before = proxy.total_bytes();
    admin.write_file("/small", 0o644, &pattern(200 << 10, 3)).await.unwrap();
    assert!(proxy.total_bytes() - before > 200 << 10);

    // locus put of a local file takes the same path.
    let local = head.scratch().join("upload");
    std::fs::write(&local, &data).unwrap();
    let mut file = tokio::fs::File::open(&local).await.unwrap();
    let before = proxy.total_bytes();
    admin.put_sized("/put", 0o644, &mut file, data.len() as u64, |_| {}).await.unwrap();
    assert!(proxy.total_bytes() - before < 64 << 10);
    assert_eq!(admin.read_file("/put").await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_of_a_third_party_write_refuses_what_it_was_not_granted() {
    let head = TestServer::head(None, |h| {
        h.replication = 1;
        h.capability_ttl = Duration::from_secs(1);
    });
    let node = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    admin.acl_set("/d", "alice", Rights::parse("rlw").unwrap()).await.unwrap();
    admin.acl_set("/d", "bob", Rights::parse("rl").unwrap()).await.unwrap();
    let old = pattern(2 * MIB, 4);
    admin.write_file("/d/f", 0o644, &old).await.unwrap();
    let alice = head.client("alice").await;
    let bob = head.client("bob").await;
    let size = 3 * MIB as u64;
    let data = pattern(size as usize, 5);

    // No write right, no capability.
    let begin = |path: &str| WriteBegin { path: path.into(), mode: 0o644, size };
    assert_eq!(bob.call(begin("/d/f")).await.unwrap_err().code(), Code::ACCES);
    // Too small for the nodes: the head says to send it through itself.
    let small = WriteBegin { path: "/d/s".into(), mode: 0o644, size: 1000 };
    assert!(alice.call(small).await.unwrap().is_none());

    let target = alice.call(begin("/d/f")).await.unwrap().expect("a large file goes to the nodes");
    let at = at_node(&target, 0).await;
    let write = write_of(&target);
    // More than granted, or fewer: refused, and nothing is left on the node.
    let mut more = data.clone();
    more.push(0);
    assert_eq!(at.upload_bytes(write.clone(), &more).await.unwrap_err().code(), Code::FBIG);
    assert_eq!(at.upload_bytes(write.clone(), &data[..MIB]).await.unwrap_err().code(), Code::IO);
    assert!(!has_version(&node, target.object, target.version));
    // A read capability does not write, and a write capability does not read.
    let read_target = alice.open("/d/f", open_flags::READ, 0).await.unwrap().location.expect("on a node");
    let forged = ObjectWrite { capability: read_target.capability.clone(), nodes: target.node_ids.clone() };
    assert_eq!(at.upload_bytes(forged, &data).await.unwrap_err().code(), Code::ACCES);
    let as_read = Location { capability: target.capability.clone(), ..read_target.clone() };
    let reads = locus_client::nodes::NodeReads::default();
    assert_eq!(reads.read(&as_read, 0, 10).await.unwrap_err().code(), Code::ACCES);
    // Another subject cannot present alice's capability.
    let bob_read = bob.open("/d/f", open_flags::READ, 0).await.unwrap().location.unwrap();
    let bob_at =
        locus_client::nodes::NodeReads::default().connect(&target.nodes[0], "bob", &bob_read.node_token).await.unwrap();
    assert_eq!(bob_at.upload_bytes(write.clone(), &data).await.unwrap_err().code(), Code::ACCES);
    assert!(!has_version(&node, target.object, target.version));

    // The bytes as granted; then the same capability cannot write over them.
    at.upload_bytes(write.clone(), &data).await.unwrap();
    assert!(has_version(&node, target.object, target.version));
    assert_eq!(at.upload_bytes(write.clone(), &data).await.unwrap_err().code(), Code::EXIST);
    // Until committed, readers see the old version.
    assert_eq!(alice.read_file("/d/f").await.unwrap(), old);

    // A commit altered in any part is refused, and so is a wrong checksum.
    let crc = crc32fast::hash(&data);
    let commit =
        |target: WriteTarget, path: &str, crc: u32| WriteCommit { path: path.into(), mode: 0o644, target, crc };
    assert_eq!(alice.call(commit(target.clone(), "/d/other", crc)).await.unwrap_err().code(), Code::ACCES);
    let mut bigger = target.clone();
    bigger.capability.size += 1;
    assert_eq!(alice.call(commit(bigger, "/d/f", crc)).await.unwrap_err().code(), Code::ACCES);
    let mut elsewhere = target.clone();
    elsewhere.node_ids = vec![elsewhere.node_ids[0] + 1];
    assert_eq!(alice.call(commit(elsewhere, "/d/f", crc)).await.unwrap_err().code(), Code::ACCES);
    assert_eq!(bob.call(commit(target.clone(), "/d/f", crc)).await.unwrap_err().code(), Code::ACCES);
    let admin_commit = admin.call(commit(target.clone(), "/d/f", crc)).await.unwrap_err();
    assert_eq!(admin_commit.code(), Code::ACCES, "the write was granted to alice");
    let err = alice.call(commit(target.clone(), "/d/f", crc ^ 1)).await.unwrap_err();
    assert_eq!(err.code(), Code::IO, "{err}");
    assert_eq!(alice.read_file("/d/f").await.unwrap(), old);

    // Another write, committed as sent: the file is new, and a second commit is refused.
    let target = alice.call(begin("/d/f")).await.unwrap().unwrap();
    at_node(&target, 0).await.upload_bytes(write_of(&target), &data).await.unwrap();
    alice.call(commit(target.clone(), "/d/f", crc)).await.unwrap();
    assert_eq!(alice.read_file("/d/f").await.unwrap(), data);
    assert_eq!(alice.call(commit(target.clone(), "/d/f", crc)).await.unwrap_err().code(), Code::NOENT);
    // Replaying the commit with a wrong checksum, or the upload, changes nothing: the
    // committed version is neither removed nor written over.
    assert_eq!(alice.call(commit(target.clone(), "/d/f", crc ^ 1)).await.unwrap_err().code(), Code::NOENT);
    let again = write_of(&target);
    let other = pattern(size as usize, 9);
    assert_eq!(at_node(&target, 0).await.upload_bytes(again, &other).await.unwrap_err().code(), Code::EXIST);
    assert!(has_version(&node, target.object, target.version));
    assert_eq!(alice.read_file("/d/f").await.unwrap(), data);

    // A write never committed is dropped from its node once no commit could name it.
    let orphan = alice.call(begin("/d/orphan")).await.unwrap().unwrap();
    at_node(&orphan, 0).await.upload_bytes(write_of(&orphan), &data).await.unwrap();
    assert!(has_version(&node, orphan.object, orphan.version));
    let start = Instant::now();
    while has_version(&node, orphan.object, orphan.version) {
        assert!(start.elapsed() < Duration::from_secs(30), "the uncommitted version stayed on its node");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(alice.call(commit(orphan, "/d/orphan", crc)).await.unwrap_err().code(), Code::NOENT);
    assert_eq!(alice.stat("/d/orphan").await.unwrap_err().code(), Code::NOENT);

    // A node the head did not choose refuses the capability, and so does a chosen one
    // when it is presented for other nodes.
    let other = TestServer::data_node(&head);
    let target = alice.call(begin("/d/two")).await.unwrap().unwrap();
    let spare = [&node, &other].into_iter().find(|n| n.addr.to_string() != target.nodes[0]).unwrap();
    let elsewhere = locus_client::nodes::NodeReads::default()
        .connect(&spare.addr.to_string(), "alice", &target.node_token)
        .await
        .unwrap();
    let err = elsewhere.upload_bytes(write_of(&target), &data).await.unwrap_err();
    assert_eq!(err.code(), Code::ACCES, "{err}");
    assert!(err.to_string().contains("other data nodes"), "{err}");
    let moved = ObjectWrite { nodes: vec![target.node_ids[0] + 1000], ..write_of(&target) };
    assert_eq!(at_node(&target, 0).await.upload_bytes(moved, &data).await.unwrap_err().code(), Code::ACCES);
    at_node(&target, 0).await.upload_bytes(write_of(&target), &data).await.unwrap();
    alice.call(commit(target, "/d/two", crc)).await.unwrap();
    assert_eq!(alice.read_file("/d/two").await.unwrap(), data);
}
