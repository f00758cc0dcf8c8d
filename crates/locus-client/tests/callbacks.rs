//! Callback promises are made only for what the subject may see, never name what it
//! could not list, and are bounded: past a bound, the reply says "no promise".

use locus_client::types::Rights;
use locus_client::{Client, PushMessage};
use locus_proto::ops::Stats;
use locus_testkit::TestServer;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Every break pushed within `wait`, in order.
async fn breaks_within(pushes: &mut UnboundedReceiver<PushMessage>, wait: Duration) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(push)) = tokio::time::timeout_at(deadline, pushes.recv()).await {
        if push.topic == locus_proto::frame::PUSH_BREAK {
            out.push(locus_proto::codec::decode(&push.meta).unwrap());
        }
    }
    out
}

#[tokio::test]
async fn a_subject_without_the_list_right_holds_no_promise_and_learns_no_names() {
    let srv = TestServer::start();
    srv.put_local("d/old", b"x");
    let admin = srv.client("admin").await;
    // Alice may look names up at the root (so stat /d), but not list /d.
    admin.acl_set("/", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/d", "alice", Rights(0)).await.unwrap();
    let (holder, listener) = (srv.client("alice").await, srv.client("alice").await);
    let mut pushes = listener.subscribe();
    holder.callbacks(100, listener.client_id()).await.unwrap();

    // A listing refused: no promise on it.
    assert!(holder.readdir("/d").await.is_err());
    assert_eq!(srv.shared().callbacks.held(), 0, "a refused listing holds no promise");
    assert!(holder.stat("/d/old").await.is_err());
    assert_eq!(srv.shared().callbacks.held(), 0, "a refused lookup holds no promise");
    admin.write_file("/d/secret", 0o644, b"made by admin").await.unwrap();
    assert_eq!(breaks_within(&mut pushes, Duration::from_millis(500)).await, Vec::<Vec<String>>::new());

    // A lookup of the directory itself is allowed: its promise's break says only that
    // the directory changed, not which name.
    holder.stat("/d").await.unwrap();
    assert_eq!(srv.shared().callbacks.held(), 1);
    admin.write_file("/d/secret2", 0o644, b"made by admin").await.unwrap();
    let told = breaks_within(&mut pushes, Duration::from_millis(500)).await;
    assert_eq!(told, vec![vec!["/d".to_string()]]);

    // With `l` on /d, the listing is promised and its break names the new file.
    admin.acl_set("/d", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    breaks_within(&mut pushes, Duration::from_millis(200)).await;
    assert_eq!(holder.readdir("/d").await.unwrap().len(), 3);
    admin.write_file("/d/secret3", 0o644, b"made by admin").await.unwrap();
    let told = breaks_within(&mut pushes, Duration::from_millis(500)).await;
    assert_eq!(told, vec![vec!["/d/secret3".to_string()]]);

    // Taking `l` away breaks the listing's promise, and it is not made again.
    holder.readdir("/d").await.unwrap();
    admin.acl_set("/d", "alice", Rights(0)).await.unwrap();
    breaks_within(&mut pushes, Duration::from_millis(200)).await;
    assert!(holder.readdir("/d").await.is_err());
    admin.write_file("/d/secret4", 0o644, b"made by admin").await.unwrap();
    let told = breaks_within(&mut pushes, Duration::from_millis(500)).await;
    assert!(told.iter().flatten().all(|p| !p.contains("secret")), "{told:?}");
}

async fn refused(c: &Client) -> u64 {
    c.call(Stats { top: 0 }).await.unwrap().promises_refused
}

#[tokio::test]
async fn past_a_subjects_bound_the_reply_says_no_promise_and_stats_count_it() {
    let srv = TestServer::start_with(|c| c.promises.per_subject = 2);
    for f in ["a", "b", "c"] {
        srv.put_local(&format!("d/{f}"), b"x");
    }
    let (holder, listener) = (srv.client("alice").await, srv.client("alice").await);
    let admin = srv.client("admin").await;
    admin.acl_set("/", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    let mut pushes = listener.subscribe();
    holder.callbacks(100, listener.client_id()).await.unwrap();
    holder.stat("/d/a").await.unwrap();
    holder.stat("/d/b").await.unwrap();
    assert_eq!(holder.take_unpromised(), Vec::<String>::new());
    // The third is answered, with word that it holds no promise (before the reply).
    holder.stat("/d/c").await.unwrap();
    assert_eq!(holder.take_unpromised(), vec!["/d/c".to_string()]);
    assert_eq!(srv.shared().callbacks.held(), 2);
    assert_eq!(refused(&admin).await, 1);
    // Another subject has its own bound.
    admin.callbacks(100, 0).await.unwrap();
    admin.stat("/d/c").await.unwrap();
    assert_eq!(admin.take_unpromised(), Vec::<String>::new());
    // A change to the unpromised file tells alice nothing: she must not have trusted it.
    admin.write_file("/d/c", 0o644, b"changed").await.unwrap();
    assert_eq!(breaks_within(&mut pushes, Duration::from_millis(300)).await, Vec::<Vec<String>>::new());
    // A break frees room: promised again.
    admin.write_file("/d/a", 0o644, b"changed").await.unwrap();
    assert_eq!(breaks_within(&mut pushes, Duration::from_millis(500)).await, vec![vec!["/d/a".to_string()]]);
    holder.stat("/d/c").await.unwrap();
    assert_eq!(holder.take_unpromised(), Vec::<String>::new());
    assert_eq!(refused(&admin).await, 1);
}

#[tokio::test]
async fn past_the_servers_bound_on_watches_promises_are_refused() {
    let srv = TestServer::start_with(|c| c.promises.watches = Some(1));
    srv.put_local("d/e/f", b"x");
    let holder = srv.client("admin").await;
    holder.callbacks(100, 0).await.unwrap();
    // Needs the root's watch: the one there is.
    holder.stat("/d").await.unwrap();
    assert_eq!(holder.take_unpromised(), Vec::<String>::new());
    // Needs /d's: refused.
    holder.stat("/d/e").await.unwrap();
    assert_eq!(holder.take_unpromised(), vec!["/d/e".to_string()]);
    assert_eq!(srv.shared().callbacks.watches(), 1);
    let report = holder.call(Stats { top: 0 }).await.unwrap();
    assert_eq!((report.promises_refused, report.promises_held, report.watches), (1, 1, 1));
    // A broken promise gives its watch back: room for another.
    srv.client("admin").await.write_file("/d/new", 0o644, b"another client's").await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while srv.shared().callbacks.held() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "no break for /d");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(srv.shared().callbacks.watches(), 0);
    holder.stat("/d/e").await.unwrap();
    assert_eq!(holder.take_unpromised(), Vec::<String>::new());
}
