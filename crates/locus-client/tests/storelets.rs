//! Storelets through the client API against a real server: the caller's rights decide
//! what a storelet sees, and the server's limits stop a hostile one.

use locus_client::types::Rights;
use locus_proto::Code;
use locus_testkit::{build_storelet, TestServer};
use std::time::Duration;

#[tokio::test]
async fn find_runs_at_the_server_within_the_callers_rights() {
    let srv = TestServer::start();
    for p in ["src/a.go", "src/b/c.go", "src/b/d.txt", "private/e.go"] {
        srv.put_local(p, b"x");
    }
    let find = build_storelet("find");
    let admin = srv.client("admin").await;
    let args = |g: &str| vec!["/".to_string(), "-name".to_string(), g.to_string()];
    let (r, out) = admin.storelet_run(&find, "/src", args("*.go"), false).await.unwrap();
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    let mut lines: Vec<&str> = std::str::from_utf8(&out).unwrap().lines().collect();
    lines.sort();
    assert_eq!(lines, ["/a.go", "/b/c.go"]);
    assert!(r.fuel > 0 && r.module.len() == 64);

    let alice = srv.client("alice").await;
    let e = alice.storelet_run(&find, "/src", args("*"), false).await.unwrap_err();
    assert_eq!(e.code(), Code::ACCES, "needs x at the root");
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    admin.acl_set("/src", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/private", "alice", Rights(0)).await.unwrap();
    assert_eq!(alice.storelet_run(&find, "/src", args("*.go"), false).await.unwrap().0.exit_code, 0);
    assert_eq!(alice.storelet_run(&find, "/private", args("*"), false).await.unwrap_err().code(), Code::ACCES);
    assert_eq!(alice.storelet_run(&find, "/src", args("*"), true).await.unwrap_err().code(), Code::ACCES, "no w right");
    let (_, out) =
        alice.storelet_run(&find, "/src", vec!["/..".into(), "-name".into(), "*".into()], false).await.unwrap();
    assert!(!String::from_utf8_lossy(&out).contains("private"));
}

#[tokio::test]
async fn hostile_storelets_stop_at_the_servers_limits() {
    let srv = TestServer::start_with(|c| {
        c.storelet_limits.fuel = 100_000_000;
        c.storelet_limits.wall = Duration::from_secs(5);
    });
    let admin = srv.client("admin").await;
    let spin = br#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;
    let e = admin.storelet_run(spin, "/", vec![], false).await.unwrap_err();
    assert_eq!(e.code(), Code::LIMIT);
    assert!(e.to_string().contains("fuel"), "{e}");
    let e = admin.storelet_run(b"garbage", "/", vec![], false).await.unwrap_err();
    assert_eq!(e.code(), Code::INVAL);
    admin.ping().await.unwrap();
}
