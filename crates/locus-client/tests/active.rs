//! Active files through the protocol against a real server: a missing name that invokes
//! a registered handler runs it and reads as its output, in both name forms; unknown
//! handlers are plain ENOENT; concurrent openers share one run; results are reused until
//! an input changes; output streams while the run goes; failures give a clear errno, an
//! error record and no result; the caller's rights decide.

use locus_client::types::{open_flags, Rights};
use locus_client::Client;
use locus_proto::active::encode_command_line;
use locus_proto::Code;
use locus_testkit::{build_storelet, TestServer, GATED_HANDLER};
use std::time::Duration;

const SALES: &str = "region,price\nnorth,10\nsouth,5\nnorth,7\n";

/// A server with handlers `csv` (the shipped storelet), `gated` and `spin` (the hostile
/// storelet, which spins until its 2 s wall-time limit stops it).
fn server() -> TestServer {
    let srv = TestServer::start_with(|c| c.storelets.limits.wall = Duration::from_secs(2));
    srv.add_handler("csv", &build_storelet("csv"), &[]);
    srv.add_handler("gated", GATED_HANDLER.as_bytes(), &[]);
    srv.add_handler("spin", &build_storelet("hostile"), &["spin"]);
    srv.put_local("d/sales.csv", SALES.as_bytes());
    srv
}

async fn runs_of(c: &Client, subject: &str) -> u64 {
    let report = c.storelet_stats().await.unwrap();
    report.subjects.iter().find(|s| s.subject == subject).map_or(0, |s| s.runs)
}

#[tokio::test]
async fn both_name_forms_run_the_handler_and_unknown_ones_are_enoent() {
    let srv = server();
    let admin = srv.client("admin").await;
    let handlers = admin.handlers().await.unwrap();
    let names: Vec<&str> = handlers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["csv", "gated", "spin"]);
    assert_eq!(handlers[2].args, ["spin"]);

    let short = admin.read_file("/d/csv@sales.csv,-sum,price").await.unwrap();
    assert_eq!(String::from_utf8(short).unwrap(), "22\n");
    let lerna = encode_command_line(&["/usr/local/bin/csv", "sales.csv", "-sum", "price", "-by", "region"]);
    assert!(lerna.starts_with("%2Fusr%2Flocal%2Fbin%2Fcsv+sales.csv"), "{lerna}");
    let by_region = admin.read_file(&format!("/d/{lerna}")).await.unwrap();
    assert_eq!(String::from_utf8(by_region).unwrap(), "north,17\nsouth,5\n");

    let attr = admin.stat("/d/csv@sales.csv,-count").await.unwrap();
    assert_eq!((attr.mode & 0o7777, attr.size), (0o444, 2), "a read-only file of its output's size");
    let listed: Vec<String> = admin.readdir("/d").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(listed, ["sales.csv"], "results are not listed");

    for missing in ["/d/nothing@sales.csv", "/d/%2Fbin%2Fnothing+x", "/d/plain.txt", "/d/csv@x.err"] {
        assert_eq!(admin.stat(missing).await.unwrap_err().code(), Code::NOENT, "{missing}");
    }
    // Opening for writing never runs a handler: it makes an ordinary file.
    let h = admin.open("/d/csv@new", open_flags::WRITE | open_flags::CREATE, 0o644).await.unwrap();
    admin.close(h.handle).await.unwrap();
    assert!(srv.local("d/csv@new").exists());
    assert_eq!(admin.read_file("/d/csv@new").await.unwrap(), b"");
}

#[tokio::test]
async fn results_are_reused_until_an_input_changes() {
    let srv = server();
    let admin = srv.client("admin").await;
    let name = "/d/csv@sales.csv,-sum,price";
    assert_eq!(admin.read_file(name).await.unwrap(), b"22\n");
    assert_eq!(admin.read_file(name).await.unwrap(), b"22\n");
    assert_eq!(admin.stat(name).await.unwrap().size, 3);
    assert_eq!(runs_of(&admin, "admin").await, 1, "reused, not run again");

    srv.put_local("d/sales.csv", format!("{SALES}east,100\n").as_bytes());
    assert_eq!(admin.read_file(name).await.unwrap(), b"122\n");
    assert_eq!(runs_of(&admin, "admin").await, 2, "the input changed");
}

#[tokio::test]
async fn concurrent_openers_share_one_run_and_read_while_it_goes() {
    let srv = server();
    let admin = srv.client("admin").await;
    let name = "/d/gated@";
    // A reader of an unfinished result gets the bytes written so far, not the end.
    let opened = admin.open(name, open_flags::READ, 0).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), admin.pread(opened.handle, 0, 6)).await;
    assert_eq!(first.expect("first bytes before the run ends").unwrap(), &b"first\n"[..]);

    let mut readers = Vec::new();
    for _ in 0..4 {
        let c = srv.client("admin").await;
        readers.push(tokio::spawn(async move { c.read_file(name).await.unwrap() }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    srv.put_local("d/gate", b"");
    for r in readers {
        assert_eq!(r.await.unwrap(), b"first\nsecond\n");
    }
    assert_eq!(admin.pread(opened.handle, 0, 100).await.unwrap(), &b"first\nsecond\n"[..]);
    assert_eq!(admin.fstat(opened.handle).await.unwrap().size, 13);
    assert_eq!(runs_of(&admin, "admin").await, 1, "one run for every opener");

    // The run looked for the gate and did not find it: now that it exists, the result
    // is stale; the new run finds it at once, and its result is reused.
    assert_eq!(admin.read_file(name).await.unwrap(), b"first\nsecond\n");
    assert_eq!(runs_of(&admin, "admin").await, 2, "an input that appeared");
    assert_eq!(admin.read_file(name).await.unwrap(), b"first\nsecond\n");
    assert_eq!(runs_of(&admin, "admin").await, 2, "reused");

    // `get` streams too: the gate is made only once the first bytes have arrived.
    let gate = srv.local("d/gate");
    std::fs::remove_file(&gate).unwrap();
    let mut out = Vec::new();
    let got = admin.get("/d/gated@streamed", &mut out, |done, _| {
        if done > 0 {
            let _ = std::fs::write(&gate, b"");
        }
    });
    tokio::time::timeout(Duration::from_secs(20), got).await.expect("streamed").unwrap();
    assert_eq!(out, b"first\nsecond\n");
}

#[tokio::test]
async fn failures_give_an_errno_and_an_error_record_but_no_result() {
    let srv = server();
    let admin = srv.client("admin").await;
    // The csv storelet exits 2 (not a sysexits code) when its input is missing: EIO.
    let e = admin.read_file("/d/csv@absent.csv,-count").await.unwrap_err();
    assert_eq!(e.code(), Code::IO, "{e}");
    let record = String::from_utf8(admin.read_file("/d/csv@absent.csv,-count.err").await.unwrap()).unwrap();
    assert!(record.contains("exited with status 2") && record.contains("absent.csv"), "{record}");

    let e = admin.stat("/d/spin@").await.unwrap_err();
    assert_eq!(e.code(), Code::LIMIT, "{e}");
    let record = String::from_utf8(admin.read_file("/d/spin@.err").await.unwrap()).unwrap();
    assert!(record.contains("time limit"), "{record}");
    assert_eq!(std::fs::read_dir(srv.state_dir().join("active")).unwrap().count(), 2, "only the two records");
}

#[tokio::test]
async fn the_callers_rights_decide() {
    let srv = server();
    let admin = srv.client("admin").await;
    let alice = srv.client("alice").await;
    let name = "/d/csv@sales.csv,-count";
    admin.acl_set("/d", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    assert_eq!(alice.stat(name).await.unwrap_err().code(), Code::ACCES, "running code needs x at the root");
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    assert_eq!(alice.read_file(name).await.unwrap(), b"3\n");
    admin.acl_set("/d", "alice", Rights::parse("l").unwrap()).await.unwrap();
    assert_eq!(alice.read_file(name).await.unwrap_err().code(), Code::ACCES, "no r on the inputs");
}

#[tokio::test]
async fn native_command_handlers_run_confined_under_the_same_limits() {
    let srv = server();
    let conf = srv.state_dir().join("handlers.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    // A program outside the directories its root shows runs too (opened beforehand).
    let own = srv.scratch().join("tools/lines");
    std::fs::create_dir_all(own.parent().unwrap()).unwrap();
    std::fs::copy("/usr/bin/wc", &own).unwrap();
    text.push_str(&format!(
        "wc command /usr/bin/wc\nls command /bin/ls -1a\nsleep command /bin/sleep\nlines command {} -l\n",
        own.display()
    ));
    std::fs::write(&conf, text).unwrap();
    let admin = srv.client("admin").await;
    let kinds: Vec<(String, String)> = admin.handlers().await.unwrap().into_iter().map(|h| (h.name, h.kind)).collect();
    assert!(kinds.contains(&("wc".into(), "command".into())), "{kinds:?}");

    assert_eq!(admin.read_file("/d/wc@-l,sales.csv").await.unwrap(), b"4 sales.csv\n");
    assert_eq!(admin.read_file("/d/lines@sales.csv").await.unwrap(), b"4 sales.csv\n");
    // Its working directory is the asked one, at /work; arguments naming anything
    // outside it are refused (its root is tried in hostile_code.rs).
    assert_eq!(admin.read_file("/d/ls@").await.unwrap(), b".\n..\nsales.csv\n");
    for outside in ["/d/ls@%2F", "/d/ls@..%2F..%2F..", "/d/wc@-l,%2Fetc%2Fpasswd"] {
        assert_eq!(admin.read_file(outside).await.unwrap_err().code(), Code::INVAL, "{outside}");
    }
    // The wall-time limit (2 s here) stops it, and the opener gets the limit.
    let e = admin.stat("/d/sleep@30").await.unwrap_err();
    assert_eq!(e.code(), Code::LIMIT, "{e}");
}
