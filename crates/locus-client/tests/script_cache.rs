//! Two clients, one file, each consistency mode: what each guarantees, and NFS's
//! staleness within its attribute timeout.

use locus_client::script_cache::{Scheme, ScriptCache};
use locus_client::types::Rights;
use locus_testkit::TestServer;
use std::time::{Duration, Instant};

/// Two caching clients of different subjects, each allowed to read, write and run code.
async fn pair(s: &TestServer, mode: Scheme) -> (ScriptCache, ScriptCache) {
    let admin = s.client("admin").await;
    for who in ["alice", "bob"] {
        admin.acl_set("/", who, Rights::parse("rwldx").unwrap()).await.unwrap();
    }
    (ScriptCache::new(s.client("alice").await, mode), ScriptCache::new(s.client("bob").await, mode))
}

async fn wait_for(what: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(3);
    while !what() {
        assert!(Instant::now() < until, "timed out waiting for a callback");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn nfs_serves_stale_data_within_its_timeout_then_revalidates() {
    let s = TestServer::start();
    s.put_local("f", b"v1");
    let (a, b) = pair(&s, Scheme::TimedAttributes { attr_timeout: Duration::from_millis(400) }).await;
    assert_eq!(a.read("/f").await.unwrap(), b"v1");
    b.write("/f", b"v2 longer").await.unwrap();
    assert_eq!(a.read("/f").await.unwrap(), b"v1", "within the timeout the cache is trusted");
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(a.read("/f").await.unwrap(), b"v2 longer", "after it, a stat revalidates");
}

#[tokio::test]
async fn afs_shows_writes_at_close_and_breaks_callbacks() {
    let s = TestServer::start();
    s.put_local("f", b"v1");
    let (a, b) = pair(&s, Scheme::CallbackOnOpen).await;
    assert_eq!(a.read("/f").await.unwrap(), b"v1");
    assert_eq!(b.read("/f").await.unwrap(), b"v1");
    b.write("/f", b"v2").await.unwrap();
    assert_eq!(std::fs::read(s.local("f")).unwrap(), b"v1", "write-back happens at close");
    assert_eq!(a.read("/f").await.unwrap(), b"v1");
    // while its callback holds, a's reads never reach the server: the file can even vanish
    std::fs::write(s.local("f"), b"changed behind everyone's back").unwrap();
    assert_eq!(a.read("/f").await.unwrap(), b"v1");
    b.close("/f").await.unwrap();
    assert_eq!(std::fs::read(s.local("f")).unwrap(), b"v2");
    wait_for(|| a.notified("/f")).await;
    assert_eq!(a.read("/f").await.unwrap(), b"v2", "a callback break invalidates the cache");
    assert_eq!(b.read("/f").await.unwrap(), b"v2", "the writer keeps its own copy");
}

#[tokio::test]
async fn sprite_stops_caching_while_a_file_is_write_shared() {
    let s = TestServer::start();
    s.put_local("f", b"v1");
    let (a, b) = pair(&s, Scheme::UncacheWhenShared).await;
    assert_eq!(a.read("/f").await.unwrap(), b"v1");
    // not shared yet: a caches
    std::fs::write(s.local("f"), b"behind").unwrap();
    assert_eq!(a.read("/f").await.unwrap(), b"v1");
    std::fs::write(s.local("f"), b"v1").unwrap();
    // b opens for writing: the file is write-shared, a is told to stop caching
    b.write("/f", b"v2").await.unwrap();
    wait_for(|| a.notified("/f")).await;
    assert_eq!(std::fs::read(s.local("f")).unwrap(), b"v2", "write-shared writes go through");
    assert_eq!(a.read("/f").await.unwrap(), b"v2", "readers see the last write at once");
    b.write("/f", b"v3").await.unwrap();
    assert_eq!(a.read("/f").await.unwrap(), b"v3");
    b.close("/f").await.unwrap();
    a.close("/f").await.unwrap();
}
