//! Writable storelet runs on a cluster head: a run's changes are committed only when
//! every node's share ended well, and only if the subject may make every one of them.

use locus_client::types::Rights;
use locus_proto::Code;
use locus_testkit::{build_storelet, TestServer};

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// The files under `dir` holding `word`, sorted, as the shipped `grep -l` storelet run by
/// `client` on the cluster finds them.
async fn files_holding(client: &locus_client::Client, grep: &[u8], dir: &str, word: &str) -> Vec<String> {
    let out = client.storelet_run(grep, dir, args(&["-l", word, "/"]), false).await.unwrap();
    assert!(out.result.exit_code <= 1, "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect();
    lines.sort();
    lines
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

    // A change that cannot be made (a file written where a directory is) fails the run
    // after the rights were checked: still nothing of it is committed.
    admin.mkdir("/d/a.txt.bak", 0o755).await.unwrap();
    let e = admin.storelet_run(&edit, "/d", args(&["upper", ".txt", "copy", ".txt", ".bak"]), true).await.unwrap_err();
    assert_eq!(e.code(), Code::ISDIR, "{e}");
    admin.rmdir("/d/a.txt.bak").await.unwrap();
    unchanged().await;
    // Removing needs `d`: alice has w but not d in /d.
    admin.write_file("/d/x.tmp", 0o644, b"junk").await.unwrap();
    let e = alice.storelet_run(&edit, "/d", args(&["rm", ".tmp"]), true).await.unwrap_err();
    assert_eq!(e.code(), Code::ACCES, "{e}");
    assert_eq!(admin.read_file("/d/x.tmp").await.unwrap(), b"junk");

    // A run that succeeds commits everything, on both nodes' shares.
    let out = admin.storelet_run(&edit, "/d", args(&["upper", ".txt"]), true).await.unwrap();
    assert_eq!(out.result.exit_code, 0);
    assert_eq!(admin.read_file("/d/a.txt").await.unwrap(), b"ALPHA\n");
    assert_eq!(admin.read_file("/d/big.txt").await.unwrap(), vec![b'X'; 200 << 10]);
    assert_eq!(admin.read_file("/d/locked/b.txt").await.unwrap(), b"BETA\n");
}

/// `storelet ps`, `cancel` and `stats` on a head ask the nodes: a subject sees and
/// cancels its own runs' shares, not another's; an admin sees every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_across_nodes_are_listed_cancelled_and_counted_through_the_head() {
    let head = TestServer::head(None, |_| {});
    let _nodes = [TestServer::data_node(&head), TestServer::data_node(&head)];
    let admin = head.client("admin").await;
    admin.mkdir("/s", 0o755).await.unwrap();
    for i in 0..4 {
        admin.write_file(&format!("/s/f{i}"), 0o644, &vec![i as u8; 100 << 10]).await.unwrap();
    }
    admin.acl_set("/", "alice", Rights::parse("rlx").unwrap()).await.unwrap();
    admin.acl_set("/", "bob", Rights::parse("rlx").unwrap()).await.unwrap();
    let (alice, bob) = (head.client("alice").await, head.client("bob").await);
    let spin = build_storelet("hostile");
    let running = {
        let alice = head.client("alice").await;
        tokio::spawn(async move { alice.storelet_run(&spin, "/s", args(&["spin"]), false).await })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let listed = loop {
        let runs = alice.storelet_ps().await.unwrap();
        if runs.len() == 2 && runs.iter().all(|r| r.running) {
            break runs;
        }
        assert!(std::time::Instant::now() < deadline, "the run's two shares never showed: {runs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(listed.iter().all(|r| r.subject == "alice"));
    assert_ne!(listed[0].run >> 32, listed[1].run >> 32, "one share on each node");
    assert!(bob.storelet_ps().await.unwrap().is_empty(), "bob sees none of alice's runs");
    assert_eq!(admin.storelet_ps().await.unwrap().len(), 2, "the admin sees every run");
    assert_eq!(bob.storelet_cancel(listed[0].run).await.unwrap_err().code(), Code::PERM);
    assert_eq!(alice.storelet_cancel(12345).await.unwrap_err().code(), Code::NOENT);
    for r in &listed {
        alice.storelet_cancel(r.run).await.unwrap();
    }
    let ended = tokio::time::timeout(std::time::Duration::from_secs(20), running).await.unwrap().unwrap();
    assert!(ended.is_err(), "a cancelled run ends in an error");
    // Each node counts its share once it has stopped.
    let stats = loop {
        let stats = alice.storelet_stats().await.unwrap();
        let mine = stats.subjects.iter().find(|s| s.subject == "alice").expect("alice's totals");
        if mine.runs == 2 && mine.stopped == 2 && mine.active == 0 {
            break stats;
        }
        assert!(std::time::Instant::now() < deadline, "{mine:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(stats.subjects.iter().all(|s| s.subject == "alice"));
    assert!(bob.storelet_stats().await.unwrap().subjects.iter().all(|s| s.subject == "bob"));
}

/// An active-file name in a directory that is not there is ENOENT on a head, as on one
/// server, and nothing runs or is kept; under a file it is ENOTDIR; a write is refused
/// before anything runs; a kept result no live node holds any more is made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_files_on_a_head_run_only_where_a_directory_is() {
    let head = TestServer::head(None, |h| h.node_timeout = std::time::Duration::from_secs(2));
    let node = TestServer::data_node(&head);
    head.add_handler("csv", &build_storelet("csv"), &[]);
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    let mut rows = String::from("region,price\n");
    for i in 0..20_000 {
        rows.push_str(&format!("r{},{}\n", i % 3, i % 10));
    }
    admin.write_file("/d/many.csv", 0o644, rows.as_bytes()).await.unwrap();
    for missing in ["/nowhere/csv@many.csv,-count", "/d/sub/csv@many.csv,-count"] {
        assert_eq!(admin.stat(missing).await.unwrap_err().code(), Code::NOENT, "{missing}");
        assert_eq!(admin.read_file(&format!("{missing}.err")).await.unwrap_err().code(), Code::NOENT);
    }
    let under_file = "/d/many.csv/csv@many.csv,-count";
    assert_eq!(admin.stat(under_file).await.unwrap_err().code(), Code::NOTDIR);
    let write = admin.call(locus_proto::ops::Access { path: "/d/csv@many.csv,-count".into(), mode: 2 }).await;
    assert_eq!(write.unwrap_err().code(), Code::ACCES);
    // A large output (over the inline size: kept on the node), then the node dies.
    let name = "/d/csv@many.csv,-by,region";
    let want = admin.read_file(name).await.unwrap();
    assert!(want.len() > 1000);
    let first = admin.stat(name).await.unwrap().ino;
    assert_eq!(admin.stat(name).await.unwrap().ino, first, "reused while its node lives");
    let _other = TestServer::data_node(&head);
    drop(node);
    // Once the node is marked down, the result it held is not trusted: the handler runs
    // again (here it fails, its input gone with the node), never answering the lost one.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    match admin.stat(name).await {
        Ok(a) => assert_ne!(a.ino, first, "the result on the dead node was trusted"),
        Err(e) => assert_eq!(e.code(), Code::IO, "{e}"),
    }
}

/// A module goes to each data node once: later runs name it by hash, and a node that
/// lost it (restarted with its compile cache gone) is sent it again, so the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_goes_to_a_node_again_when_it_no_longer_has_it() {
    let head = TestServer::head(None, |c| c.inline_max = 0);
    let node = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    admin.mkdir("/t", 0o755).await.unwrap();
    for i in 0..5 {
        admin.write_file(&format!("/t/f{i}.go"), 0o644, b"package f\n").await.unwrap();
    }
    let find = build_storelet("find");
    let found = |out: locus_client::StoreletOutput| {
        assert_eq!(out.result.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().lines().count()
    };
    for _ in 0..2 {
        assert_eq!(found(admin.storelet_run(&find, "/t", args(&["/", "-name", "*.go"]), false).await.unwrap()), 5);
    }
    let report = admin.storelet_stats().await.unwrap();
    assert_eq!(report.compiles, 1, "compiled once on the node");
    let node = node.restart_node(&head, |dir| {
        let cache = dir.join("state").join("storelets");
        let removed =
            std::fs::read_dir(&cache).unwrap().filter_map(Result::ok).map(|e| std::fs::remove_file(e.path())).count();
        assert!(removed > 0, "the node kept its compiled module in {}", cache.display());
    });
    assert_eq!(found(admin.storelet_run(&find, "/t", args(&["/", "-name", "*.go"]), false).await.unwrap()), 5);
    assert!(node.state_dir().join("storelets").read_dir().unwrap().count() > 0, "compiled again at the node");
    // The run was over the plan kept from the first: the restarted node had lost its
    // tree too, so the head listed its share's files again and sent them.
    assert_eq!(head.shared().head.as_ref().unwrap().run_plans(), (1, 2));
    assert_eq!(found(admin.storelet_run(&find, "/t", args(&["/", "-name", "*.go"]), false).await.unwrap()), 5);
    assert_eq!(head.shared().head.as_ref().unwrap().run_plans(), (2, 2), "planned afresh after that");
}

/// A read-only run over a directory again uses the plan kept from the last one (the
/// head lists nothing, the nodes make no tree), and sees every change made since: a
/// file written again, one added, one removed, a directory renamed, a right taken
/// away. A change elsewhere leaves the plan kept; another subject has a plan of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_again_uses_the_kept_plan_and_sees_every_change_since() {
    let head = TestServer::head(None, |c| c.inline_max = 0);
    let _nodes = [TestServer::data_node(&head), TestServer::data_node(&head)];
    let admin = head.client("admin").await;
    for d in ["/t", "/t/a", "/t/b", "/other"] {
        admin.mkdir(d, 0o755).await.unwrap();
    }
    for i in 0..3 {
        admin.write_file(&format!("/t/a/f{i}.txt"), 0o644, b"one\n").await.unwrap();
        admin.write_file(&format!("/t/b/g{i}.txt"), 0o644, b"one\n").await.unwrap();
    }
    let grep = build_storelet("grep");
    let plans = || head.shared().head.as_ref().unwrap().run_plans();
    let matching = |client: &locus_client::Client, word: &'static str| {
        let (client, grep) = (client.clone(), grep.clone());
        async move { files_holding(&client, &grep, "/t", word).await }
    };
    let all = ["/a/f0.txt", "/a/f1.txt", "/a/f2.txt", "/b/g0.txt", "/b/g1.txt", "/b/g2.txt"];
    assert_eq!(matching(&admin, "one").await, all);
    assert_eq!(plans(), (1, 0));
    assert_eq!(matching(&admin, "one").await, all);
    assert_eq!(plans(), (1, 1), "the second run is over the kept plan");
    admin.write_file("/other/x.txt", 0o644, b"one\n").await.unwrap();
    assert_eq!(matching(&admin, "one").await, all);
    assert_eq!(plans(), (1, 2), "a change elsewhere keeps the plan");

    admin.write_file("/t/a/f0.txt", 0o644, b"two\n").await.unwrap();
    assert_eq!(matching(&admin, "two").await, ["/a/f0.txt"], "a file written again");
    assert_eq!(plans(), (2, 2));
    admin.write_file("/t/b/new.txt", 0o644, b"two\n").await.unwrap();
    assert_eq!(matching(&admin, "two").await, ["/a/f0.txt", "/b/new.txt"], "a file added");
    admin.unlink("/t/a/f0.txt").await.unwrap();
    assert_eq!(matching(&admin, "two").await, ["/b/new.txt"], "a file removed");
    admin.rename("/t/b", "/t/c").await.unwrap();
    assert_eq!(matching(&admin, "two").await, ["/c/new.txt"], "a directory renamed");
    assert_eq!(matching(&admin, "two").await, ["/c/new.txt"]);
    assert_eq!(plans(), (5, 3), "each change made the next run plan again, once");

    // Alice's plan is her own, and forgets what she may no longer read.
    admin.acl_set("/", "alice", Rights::parse("rlx").unwrap()).await.unwrap();
    let alice = head.client("alice").await;
    let theirs = ["/a/f1.txt", "/a/f2.txt", "/c/g0.txt", "/c/g1.txt", "/c/g2.txt"];
    assert_eq!(matching(&alice, "one").await, theirs);
    assert_eq!(matching(&alice, "one").await, theirs);
    assert_eq!(plans(), (6, 4));
    // Alice's rights at the root forgot every plan; the admin's is its own again.
    assert_eq!(matching(&admin, "one").await, theirs);
    assert_eq!(matching(&admin, "one").await, theirs);
    assert_eq!(plans(), (7, 5), "the admin's plan is its own, kept beside alice's");
    admin.acl_set("/t/c", "alice", Rights::parse("x").unwrap()).await.unwrap();
    assert_eq!(matching(&alice, "one").await, ["/a/f1.txt", "/a/f2.txt"], "a right taken away");
    assert_eq!(matching(&admin, "one").await, theirs);
    let (planned, reused) = head.shared().head.as_ref().unwrap().run_plans();
    let metrics = head.shared().metrics.render(head.shared());
    assert!(metrics.contains(&format!("locus_cluster_runs_planned_total {planned}\n")), "{metrics}");
    assert!(metrics.contains(&format!("locus_cluster_runs_over_kept_plans_total {reused}\n")), "{metrics}");
}

/// Small files kept in the namespace go to the nodes' kept trees with their bytes, and a
/// new version of one is seen; a plan naming a file with another name is not kept (a
/// write through the other name would not be heard as a change here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_plans_hold_small_files_and_leave_hard_links_out() {
    let head = TestServer::head(None, |_| {});
    let _node = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    for d in ["/t", "/u"] {
        admin.mkdir(d, 0o755).await.unwrap();
    }
    admin.write_file("/t/small.txt", 0o644, b"one\n").await.unwrap();
    let grep = build_storelet("grep");
    let plans = || head.shared().head.as_ref().unwrap().run_plans();
    let matching = |dir: &'static str, word: &'static str| {
        let (admin, grep) = (admin.clone(), grep.clone());
        async move { files_holding(&admin, &grep, dir, word).await }
    };
    assert_eq!(matching("/t", "one").await, ["/small.txt"]);
    assert_eq!(matching("/t", "one").await, ["/small.txt"]);
    assert_eq!(plans(), (1, 1), "the small file's bytes are in the kept tree");
    admin.write_file("/t/small.txt", 0o644, b"two\n").await.unwrap();
    assert_eq!(matching("/t", "two").await, ["/small.txt"], "its new version is seen");
    assert_eq!(plans(), (2, 1));

    admin.write_file("/u/f.txt", 0o644, b"one\n").await.unwrap();
    admin.link("/u/f.txt", "/t/g.txt").await.unwrap();
    assert_eq!(matching("/t", "one").await, ["/g.txt"]);
    // Written in place through its other name.
    let h = admin.open("/u/f.txt", locus_proto::types::open_flags::WRITE, 0).await.unwrap().handle;
    admin.pwrite(h, 0, b"six\n").await.unwrap();
    admin.close(h).await.unwrap();
    assert_eq!(matching("/t", "six").await, ["/g.txt"], "written through its other name");
    assert_eq!(plans(), (4, 1), "no plan kept while /t holds a hard link");
}

/// A node that fails during a run over a kept plan, after the directory changed, fails
/// the run (`EAGAIN`) rather than mix what the other share saw with what is there now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_lost_after_a_change_fails_a_run_over_a_kept_plan() {
    let head = TestServer::head(None, |c| {
        c.inline_max = 0;
        c.replication = 2;
    });
    let (_kept, mut lost) = (TestServer::data_node(&head), Some(TestServer::data_node(&head)));
    let admin = head.client("admin").await;
    admin.mkdir("/s", 0o755).await.unwrap();
    for i in 0..4 {
        admin.write_file(&format!("/s/f{i}"), 0o644, b"data").await.unwrap();
    }
    let find = build_storelet("find");
    let out = admin.storelet_run(&find, "/s", args(&["/"]), false).await.unwrap();
    assert_eq!(out.result.exit_code, 0);
    let spin = build_storelet("hostile");
    let running = {
        let admin = admin.clone();
        tokio::spawn(async move { admin.storelet_run(&spin, "/s", args(&["spin"]), false).await })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let runs = admin.storelet_ps().await.unwrap();
        if runs.len() == 2 && runs.iter().all(|r| r.running) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the run's two shares never showed: {runs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(head.shared().head.as_ref().unwrap().run_plans(), (1, 1), "the spinning run is over the kept plan");
    admin.write_file("/s/new", 0o644, b"data").await.unwrap();
    // A node goes away; its share cannot be found again as it was.
    drop(lost.take());
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), running).await.unwrap().unwrap();
    let e = ended.unwrap_err();
    assert_eq!(e.code(), Code::AGAIN, "{e}");
    for r in admin.storelet_ps().await.unwrap() {
        let _ = admin.storelet_cancel(r.run).await;
    }
}
