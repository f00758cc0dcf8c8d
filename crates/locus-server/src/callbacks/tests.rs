//! The callbacks' rules, each on its own.

use super::*;

#[test]
fn canonical_paths() {
    assert_eq!(canonical("a//b/").as_deref(), Some("/a/b"));
    assert_eq!(canonical("/").as_deref(), Some("/"));
    assert_eq!(canonical("").as_deref(), Some("/"));
    assert_eq!(canonical("/./x").as_deref(), Some("/x"));
    assert_eq!(canonical("/a/../../etc"), None);
    assert_eq!(parent("/a/b"), "/a");
    assert_eq!(parent("/a"), "/");
}

#[test]
fn a_change_breaks_other_holders_once_and_keeps_the_changers() {
    let (registry, cb) = (Registry::default(), Callbacks::default());
    cb.enable(1, "a", 10, 1);
    cb.enable(2, "b", 10, 2);
    cb.promise(&registry, 1, "/d/f", false);
    cb.promise(&registry, 2, "/d/f", false);
    cb.promise(&registry, 2, "/d", true);
    assert_eq!(cb.held(), 3);
    cb.changed(&registry, 1, &["/d/f"], false);
    // Client 2 lost both (the file and its directory); client 1 keeps its own.
    assert_eq!(cb.held(), 1);
    cb.changed(&registry, 2, &["/d/f"], false);
    assert_eq!(cb.held(), 0);
}

#[test]
fn a_report_waits_for_the_requests_under_way_before_it_breaks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    let (registry, cb) = (Registry::default(), Callbacks::default());
    let _ = cb.roots.set(vec![dir.path().to_path_buf()]);
    let _ = cb.watcher.set(Some(Arc::new(Watcher::new(vec![dir.path().to_path_buf()], 100).unwrap())));
    cb.enable(1, "a", 10, 1);
    cb.enable(2, "b", 10, 2);
    let keeps = |cb: &Callbacks, path: &str| cb.state.lock().holders.get(path).is_some_and(|h| h.contains(&1));
    let report = |path: &str| Some(LocalChange { path: path.into(), names: false });

    // Client 1's request writes /d/f; the watcher reports it before the session
    // records the change, and the session is slow to (a busy machine).
    cb.promise(&registry, 1, "/d/f", false);
    let serving = cb.serving();
    std::fs::write(dir.path().join("d/f"), b"one").unwrap();
    assert!(cb.changed_beside(&registry, report("/d/f")));
    std::thread::sleep(GRACE * 4);
    assert!(cb.changed_beside(&registry, None), "the report waits while the request is under way");
    assert!(keeps(&cb, "/d/f"));
    cb.changed(&registry, 1, &["/d/f"], false);
    drop(serving);
    assert!(!cb.changed_beside(&registry, None));
    assert!(keeps(&cb, "/d/f"), "its own change's echo broke nothing");

    // A change beside the server, no request under way: it breaks after GRACE.
    std::fs::write(dir.path().join("d/f"), b"two, beside").unwrap();
    assert!(cb.changed_beside(&registry, report("/d/f")));
    std::thread::sleep(GRACE * 2);
    assert!(!cb.changed_beside(&registry, None));
    assert!(!keeps(&cb, "/d/f"));

    // And under a request that never records it, after ECHO at most.
    cb.promise(&registry, 1, "/d/f", false);
    let stuck = cb.serving();
    std::fs::write(dir.path().join("d/f"), b"three").unwrap();
    assert!(cb.changed_beside(&registry, report("/d/f")));
    std::thread::sleep(ECHO + GRACE);
    assert!(!cb.changed_beside(&registry, None));
    assert!(!keeps(&cb, "/d/f"));
    drop(stuck);
    assert_eq!(cb.in_flight.load(Ordering::SeqCst), 0);
}

#[test]
fn names_changed_at_the_root_break_every_promise() {
    let (registry, cb) = (Registry::default(), Callbacks::default());
    cb.enable(1, "a", 10, 1);
    for p in ["/", "/a", "/a/b/c", "/z"] {
        cb.promise(&registry, 1, p, p == "/");
    }
    assert_eq!(cb.held(), 4);
    cb.changed(&registry, 0, &["/"], true);
    assert_eq!(cb.held(), 0);
}

#[test]
fn promises_are_bounded_and_go_with_the_client() {
    let (registry, cb) = (Registry::default(), Callbacks::default());
    assert_eq!(cb.enable(7, "a", 3, 7), 3);
    for i in 0..10 {
        cb.promise(&registry, 7, &format!("/f{i}"), false);
    }
    assert_eq!(cb.held(), 3);
    // Without callbacks on, nothing is promised.
    cb.promise(&registry, 8, "/x", false);
    assert_eq!(cb.held(), 3);
    cb.drop_client(7);
    assert_eq!(cb.held(), 0);
    assert!(cb.state.lock().holders.is_empty());
    assert!(cb.state.lock().by_subject.is_empty());
}

#[test]
fn a_subjects_promises_are_bounded_and_refused_beyond() {
    let registry = Registry::default();
    let cb = Callbacks::new(PromiseLimits { per_subject: 3, ..Default::default() });
    cb.enable(1, "alice", 100, 1);
    cb.enable(2, "alice", 100, 2);
    cb.enable(3, "bob", 100, 3);
    assert!(cb.promise(&registry, 1, "/a", false));
    assert!(cb.promise(&registry, 2, "/b", false));
    assert!(cb.promise(&registry, 1, "/c", false));
    // Alice's fourth, on either connection, is refused; Bob has his own bound.
    assert!(!cb.promise(&registry, 2, "/d", false));
    assert!(cb.promise(&registry, 3, "/d", false));
    assert_eq!(cb.refused(), 1);
    // A promise already held is still held.
    assert!(cb.promise(&registry, 1, "/a", false));
    // A break frees room.
    cb.changed(&registry, 3, &["/a"], false);
    assert!(cb.promise(&registry, 2, "/d", false));
    // Bytes too.
    let cb = Callbacks::new(PromiseLimits { bytes_per_subject: 2 * PROMISE_OVERHEAD + 8, ..Default::default() });
    cb.enable(1, "alice", 100, 1);
    assert!(cb.promise(&registry, 1, "/a", false));
    assert!(cb.promise(&registry, 1, "/b", false));
    assert!(!cb.promise(&registry, 1, "/c", false));
}

#[test]
fn a_directorys_holder_without_its_listing_is_not_told_names() {
    let registry = Registry::default();
    let cb = Callbacks::default();
    let (tx_a, mut rx_a) = tokio::sync::mpsc::unbounded_channel();
    let (tx_b, mut rx_b) = tokio::sync::mpsc::unbounded_channel();
    let a = registry.add(crate::PushQueue { tx: tx_a, waiting: Default::default() });
    let b = registry.add(crate::PushQueue { tx: tx_b, waiting: Default::default() });
    cb.enable(a, "alice", 10, a);
    cb.enable(b, "bob", 10, b);
    cb.promise(&registry, a, "/d", false);
    cb.promise(&registry, b, "/d", true);
    cb.changed(&registry, 0, &["/d/secret"], true);
    let told = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<Push>| {
        locus_proto::codec::decode::<Vec<String>>(&rx.try_recv().expect("a break").meta).unwrap()
    };
    assert_eq!(told(&mut rx_a), vec!["/d".to_string()]);
    assert_eq!(told(&mut rx_b), vec!["/d/secret".to_string()]);
}

#[test]
fn promises_whose_breaks_went_to_a_lost_connection_go_with_it() {
    let registry = Registry::default();
    let cb = Callbacks::default();
    cb.enable(1, "alice", 10, 2);
    cb.promise(&registry, 1, "/a", false);
    assert!(cb.is_target(2) && !cb.is_target(1));
    cb.drop_client(2);
    assert_eq!(cb.held(), 0);
    assert!(!cb.promise(&registry, 1, "/a", false));
}
