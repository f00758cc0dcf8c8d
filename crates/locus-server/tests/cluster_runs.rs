//! Writable storelet runs on a cluster head: a run's changes are committed only when
//! every node's share ended well, and only if the subject may make every one of them.

use locus_client::types::Rights;
use locus_proto::Code;
use locus_testkit::{build_storelet, TestServer};

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_run_that_fails_or_oversteps_changes_nothing() {
    let head = TestServer::head(None, |_| {});
    let _nodes = [TestServer::data_node(&head), TestServer::data_node(&head)];
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    admin.mkdir("/d/locked", 0o755).await.unwrap();
    admin.write_file("/d/a.txt", 0o644, b"alpha\n").await.unwrap();
    admin.write_file("/d/big.txt", 0o644, &vec![b'x'; 200 << 10]).await.unwrap();
    admin.write_file("/d/locked/b.txt", 0o644, b"beta\n").await.unwrap();
    let edit = build_storelet("edit");
    let unchanged = || async {
        assert_eq!(admin.read_file("/d/a.txt").await.unwrap(), b"alpha\n");
        assert_eq!(admin.read_file("/d/big.txt").await.unwrap(), vec![b'x'; 200 << 10]);
        assert_eq!(admin.read_file("/d/locked/b.txt").await.unwrap(), b"beta\n");
        assert_eq!(admin.stat("/d/a.txt.bak").await.unwrap_err().code(), Code::NOENT);
    };

    // The program fails after its edits: none of them is committed.
    let out =
        admin.storelet_run(&edit, "/d", args(&["upper", ".txt", "copy", ".txt", ".bak", "bogus", "x"]), true).await;
    let failed = out.map(|o| o.result.exit_code).unwrap_or(-1);
    assert_ne!(failed, 0);
    unchanged().await;

    // Alice may write in /d but not in /d/locked: her run, which would change a file
    // there too, changes nothing.
    admin.acl_set("/", "alice", Rights::parse("rlx").unwrap()).await.unwrap();
    admin.acl_set("/d", "alice", Rights::parse("rlw").unwrap()).await.unwrap();
    admin.acl_set("/d/locked", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    let alice = head.client("alice").await;
    let e = alice.storelet_run(&edit, "/d", args(&["upper", ".txt"]), true).await.unwrap_err();
    assert_eq!(e.code(), Code::ACCES, "{e}");
    unchanged().await;

    // A run that succeeds commits everything, on both nodes' shares.
    let out = admin.storelet_run(&edit, "/d", args(&["upper", ".txt"]), true).await.unwrap();
    assert_eq!(out.result.exit_code, 0);
    assert_eq!(admin.read_file("/d/a.txt").await.unwrap(), b"ALPHA\n");
    assert_eq!(admin.read_file("/d/big.txt").await.unwrap(), vec![b'X'; 200 << 10]);
    assert_eq!(admin.read_file("/d/locked/b.txt").await.unwrap(), b"BETA\n");
}
