//! Storelets through the client API against a real server: the caller's rights decide
//! what a storelet sees, output streams while it runs, runs are listed and cancelled,
//! per-subject limits keep principals apart, accounts are kept, and the shipped
//! storelets agree with the same tools run locally.

use locus_client::types::Rights;
use locus_client::{Client, StoreletUpdate};
use locus_proto::Code;
use locus_testkit::{build_storelet, TestServer};
use std::path::Path;
use std::time::Duration;

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Writes "hello" to stdout, then spins until stopped.
const HELLO_THEN_SPIN: &str = r#"(module
    (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
    (memory (export "memory") 1)
    (data (i32.const 100) "hello\n")
    (func (export "_start")
      (i32.store (i32.const 0) (i32.const 100)) (i32.store (i32.const 4) (i32.const 6))
      (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (loop (br 0))))"#;

#[tokio::test]
async fn find_runs_at_the_server_within_the_callers_rights() {
    let srv = TestServer::start();
    for p in ["src/a.go", "src/b/c.go", "src/b/d.txt", "private/e.go"] {
        srv.put_local(p, b"x");
    }
    let find = build_storelet("find");
    let admin = srv.client("admin").await;
    let args = |g: &str| strings(&["/", "-name", g]);
    let out = admin.storelet_run(&find, "/src", args("*.go"), false).await.unwrap();
    assert_eq!(out.result.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    lines.sort();
    assert_eq!(lines, ["/a.go", "/b/c.go"]);
    assert!(out.result.fuel > 0 && out.result.module.len() == 64 && out.result.files_opened >= 2);

    let alice = srv.client("alice").await;
    let e = alice.storelet_run(&find, "/src", args("*"), false).await.unwrap_err();
    assert_eq!(e.code(), Code::ACCES, "needs x at the root");
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    admin.acl_set("/src", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/private", "alice", Rights(0)).await.unwrap();
    assert_eq!(alice.storelet_run(&find, "/src", args("*.go"), false).await.unwrap().result.exit_code, 0);
    assert_eq!(alice.storelet_run(&find, "/private", args("*"), false).await.unwrap_err().code(), Code::ACCES);
    assert_eq!(alice.storelet_run(&find, "/src", args("*"), true).await.unwrap_err().code(), Code::ACCES, "no w right");
    let out = alice.storelet_run(&find, "/src", strings(&["/..", "-name", "*"]), false).await.unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("private"));

    // Read-only: a write inside the program fails and leaves nothing behind.
    let hostile = build_storelet("hostile");
    let out = alice.storelet_run(&hostile, "/src", strings(&["write", "/new"]), false).await.unwrap();
    assert_ne!(out.result.exit_code, 0);
    assert!(!srv.local("src/new").exists());
}

#[tokio::test]
async fn hostile_storelets_stop_at_the_servers_limits() {
    let srv = TestServer::start_with(|c| {
        c.storelets.limits.fuel = 100_000_000;
        c.storelets.limits.wall = Duration::from_secs(5);
    });
    let admin = srv.client("admin").await;
    let spin = br#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;
    let e = admin.storelet_run(spin, "/", vec![], false).await.unwrap_err();
    assert_eq!(e.code(), Code::LIMIT);
    assert!(
        e.to_string().contains("fuel limit") && e.to_string().contains("CPU"),
        "names the limit and the account: {e}"
    );
    let e = admin.storelet_run(b"garbage", "/", vec![], false).await.unwrap_err();
    assert_eq!(e.code(), Code::INVAL);
    admin.ping().await.unwrap();
    // The stopped run is accounted for, in the server's report and its log file.
    let report = admin.storelet_stats().await.unwrap();
    let me = report.subjects.iter().find(|s| s.subject == "admin").unwrap();
    assert_eq!((me.runs, me.stopped), (2, 2));
    assert!(report.recent[1].outcome.contains("fuel limit"), "{:?}", report.recent);
    let log = std::fs::read_to_string(srv.state_dir().join("storelet-accounts.log")).unwrap();
    assert_eq!(log.lines().count(), 2);
    assert!(log.contains("subject=admin") && log.contains("fuel="));
}

#[tokio::test]
async fn output_streams_while_running_and_runs_can_be_listed_and_cancelled() {
    let srv = TestServer::start();
    let admin = srv.client("admin").await;
    let (alice, bob) = (srv.client("alice").await, srv.client("bob").await);
    for who in ["alice", "bob"] {
        admin.acl_set("/", who, Rights::parse("rlx").unwrap()).await.unwrap();
    }
    let mut run = alice.storelet_start(HELLO_THEN_SPIN.as_bytes(), "/", vec![], false).await.unwrap();
    let Some(StoreletUpdate::Started { run: id, module }) = run.next().await.unwrap() else { panic!("no start") };
    assert_eq!(module.len(), 64);
    // The output arrives while the program is still running.
    assert_eq!(run.next().await.unwrap(), Some(StoreletUpdate::Stdout("hello\n".into())));
    let listed = alice.storelet_ps().await.unwrap();
    assert_eq!((listed.len(), listed[0].run, listed[0].running), (1, id, true));
    assert!(bob.storelet_ps().await.unwrap().is_empty(), "bob sees only his own runs");
    assert_eq!(admin.storelet_ps().await.unwrap().len(), 1, "an admin sees every run");
    assert_eq!(bob.storelet_cancel(id).await.unwrap_err().code(), Code::PERM, "not bob's run");
    alice.storelet_cancel(id).await.unwrap();
    let e = run.next().await.unwrap_err();
    assert_eq!(e.code(), Code::CANCELED, "{e}");
    assert_eq!(alice.storelet_cancel(id).await.unwrap_err().code(), Code::NOENT);
    assert!(alice.storelet_ps().await.unwrap().is_empty());

    // An admin may cancel anyone's run.
    let mut run = bob.storelet_start(HELLO_THEN_SPIN.as_bytes(), "/", vec![], false).await.unwrap();
    let Some(StoreletUpdate::Started { run: id, .. }) = run.next().await.unwrap() else { panic!("no start") };
    admin.storelet_cancel(id).await.unwrap();
    loop {
        match run.next().await {
            Ok(Some(StoreletUpdate::Stdout(_))) => continue,
            Err(e) => break assert_eq!(e.code(), Code::CANCELED),
            other => panic!("{other:?}"),
        }
    }

    // A client that goes away takes its run with it.
    let carol = srv.client("alice").await;
    let mut run = carol.storelet_start(HELLO_THEN_SPIN.as_bytes(), "/", vec![], false).await.unwrap();
    run.next().await.unwrap();
    run.next().await.unwrap();
    drop((run, carol));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !admin.storelet_ps().await.unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the orphaned run keeps running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn each_principal_has_its_own_concurrency_and_cpu_budget() {
    let srv = TestServer::start_with(|c| {
        c.storelets.runs_per_subject = 1;
        c.storelets.cpu_budget = Duration::from_millis(300);
        c.storelets.budget_window = Duration::from_secs(3600);
    });
    let admin = srv.client("admin").await;
    let (alice, bob) = (srv.client("alice").await, srv.client("bob").await);
    for who in ["alice", "bob"] {
        admin.acl_set("/", who, Rights::parse("rlx").unwrap()).await.unwrap();
    }
    let spin = HELLO_THEN_SPIN.as_bytes();
    // Alice's one run uses up her budget while Bob's run proceeds beside it.
    let mut first = alice.storelet_start(spin, "/", vec![], false).await.unwrap();
    first.next().await.unwrap();
    let e = alice.storelet_run(spin, "/", vec![], false).await.unwrap_err();
    assert!(e.code() == Code::LIMIT && e.to_string().contains("concurrent runs"), "{e}");
    let mut beside = bob.storelet_start(spin, "/", vec![], false).await.unwrap();
    assert!(matches!(beside.next().await.unwrap(), Some(StoreletUpdate::Started { .. })), "bob is not held back");
    let e = loop {
        match first.next().await {
            Ok(Some(_)) => continue,
            Err(e) => break e,
            Ok(None) => panic!("a spinning run cannot finish"),
        }
    };
    assert!(e.code() == Code::LIMIT && e.to_string().contains("cpu budget"), "{e}");
    // Spent: her next run is refused at once; Bob's budget is his own.
    let e = alice.storelet_run(spin, "/", vec![], false).await.unwrap_err();
    assert!(e.to_string().contains("cpu budget"), "{e}");
    let e = loop {
        match beside.next().await {
            Ok(Some(_)) => continue,
            Err(e) => break e,
            Ok(None) => panic!("a spinning run cannot finish"),
        }
    };
    assert!(e.to_string().contains("cpu budget"), "bob's run stops at his own budget: {e}");
    let report = admin.storelet_stats().await.unwrap();
    for s in &report.subjects {
        let used = Duration::from_micros(s.budget_spent_us);
        assert!(used >= Duration::from_millis(300) && used < Duration::from_millis(400), "{s:?}");
    }
    let mine = alice.storelet_stats().await.unwrap();
    assert_eq!(mine.subjects.len(), 1, "alice sees only her own account");
}

/// Runs a local command in `dir` and returns its stdout.
fn local(dir: &Path, cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd).args(args).current_dir(dir).output().expect(cmd);
    String::from_utf8(out.stdout).unwrap()
}

fn sorted(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(str::to_string).collect();
    v.sort();
    v
}

async fn stdout_of(c: &Client, module: &[u8], args: &[&str]) -> String {
    let out = c.storelet_run(module, "/tree", strings(args), false).await.unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn shipped_storelets_agree_with_local_tools() {
    let srv = TestServer::start();
    // A small tree with text of several sizes, a symlink and a CSV file.
    for i in 0..30 {
        let body: String = (0..i * 7).map(|n| format!("line {n} of file {i}: alpha beta\tgamma {}\n", n % 5)).collect();
        srv.put_local(&format!("tree/d{}/f{i}.txt", i % 4), body.as_bytes());
    }
    srv.put_local("tree/d1/deep/x.go", b"package x\n\nfunc Alpha() {}\n");
    srv.put_local("tree/empty.go", b"");
    std::os::unix::fs::symlink("d1/f1.txt", srv.local("tree/link.txt")).unwrap();
    let csv: String = std::iter::once("city,kind,amount\n".to_string())
        .chain((0..200).map(|i| format!("c{},{},{}\n", i % 7, ["a", "b", "c"][i % 3], i * 3)))
        .collect();
    srv.put_local("tree/sales.csv", csv.as_bytes());
    let tree = srv.local("tree");
    let admin = srv.client("admin").await;
    // The storelet sees /tree as `/`; the local tools run in it and print `./`.
    let local_paths = |text: String| {
        let mut v: Vec<String> =
            text.lines().map(|l| if l == "." { "/".to_string() } else { l.replacen("./", "/", 1) }).collect();
        v.sort();
        v
    };

    let find = build_storelet("find");
    for test in [
        &["-name", "*.go"][..],
        &["-type", "f", "-size", "+2k"],
        &["-size", "-1"],
        &["-type", "d"],
        &["-type", "l"],
        &["-name", "f1*", "-size", "+1k", "-type", "f"],
    ] {
        let mut args = vec!["."];
        args.extend_from_slice(test);
        let want = local_paths(local(&tree, "find", &args));
        let mut remote = vec!["/"];
        remote.extend_from_slice(test);
        let got = sorted(&stdout_of(&admin, &find, &remote).await.replace("//", "/"));
        assert_eq!(got, want, "find {test:?}");
        assert!(!got.is_empty(), "find {test:?} matched nothing: a weak test");
    }

    let grep = build_storelet("grep");
    let cases =
        [("-rnE", "alpha beta"), ("-rnF", "of file 2:"), ("-rnE", "line [0-9]+ of file 1[0-3]"), ("-rniE", "ALPHA\\(")];
    for (opts, pattern) in cases {
        let want = local_paths(local(&tree, "grep", &[opts, pattern, "."]));
        let fixed = if opts.contains('F') { vec!["-F"] } else { vec![] };
        let fold = if opts.contains('i') { vec!["-i"] } else { vec![] };
        let mut args = [fixed, fold].concat();
        args.extend([pattern, "/"]);
        let got = sorted(&stdout_of(&admin, &grep, &args).await);
        assert_eq!(got, want, "grep {opts} {pattern}");
        assert!(!got.is_empty());
    }

    let wc = build_storelet("wc");
    let got = sorted(&stdout_of(&admin, &wc, &["/d2"]).await);
    let files = sorted(&local(&tree, "find", &["d2", "-type", "f"]));
    let mut want: Vec<String> = files
        .iter()
        .map(|f| {
            let counts: Vec<String> = local(&tree, "wc", &[f]).split_whitespace().take(3).map(str::to_string).collect();
            format!("{} /{f}", counts.join(" "))
        })
        .collect();
    let total = local(&tree, "sh", &["-c", "cat d2/* | wc"]);
    want.push(format!("{} total", total.split_whitespace().collect::<Vec<_>>().join(" ")));
    want.sort();
    assert_eq!(got, want, "wc");
    let got = sorted(&stdout_of(&admin, &wc, &["-sha256", "/d3"]).await);
    let want = sorted(&local(&tree, "sh", &["-c", "find d3 -type f | xargs sha256sum"]).replace("  d3/", "  /d3/"));
    assert_eq!(got, want, "sha256");

    let csvlet = build_storelet("csv");
    let awk = |prog: &str| local(&tree, "awk", &["-F,", prog, "sales.csv"]);
    let got =
        stdout_of(&admin, &csvlet, &["/sales.csv", "-where", "amount", ">", "300", "-sum", "amount", "-by", "city"])
            .await;
    let want = local(
        &tree,
        "sh",
        &["-c", "awk -F, 'NR>1 && $3>300 {s[$1]+=$3} END {for (k in s) print k\",\"s[k]}' sales.csv | sort"],
    );
    assert_eq!(got, want, "csv sum by");
    let got = stdout_of(&admin, &csvlet, &["/sales.csv", "-where", "kind", "=", "b", "-count"]).await;
    assert_eq!(got, awk("NR>1 && $2==\"b\" {n++} END {print n}"), "csv count");
    let got = stdout_of(
        &admin,
        &csvlet,
        &["/sales.csv", "-where", "city", "=", "c3", "-where", "amount", "<", "100", "-select", "kind,amount"],
    )
    .await;
    assert_eq!(got, awk("NR==1 {print $2\",\"$3} NR>1 && $1==\"c3\" && $3<100 {print $2\",\"$3}"), "csv select");
}
