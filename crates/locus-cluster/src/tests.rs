//! The namespace's rules on SQLite, each on its own.

use super::*;

#[test]
fn link_targets_resolve_inside_the_namespace_only() {
    assert_eq!(link_target("/a/l", "b/c").unwrap(), "/a/b/c");
    assert_eq!(link_target("/a/l", "../x").unwrap(), "/x");
    assert_eq!(link_target("/a/l", "/abs/./y").unwrap(), "/abs/y");
    assert_eq!(link_target("/l", ".").unwrap(), "/");
    assert!(link_target("/a/l", "../../etc/passwd").is_err());
    assert!(link_target("/l", "..").is_err());
}

fn file(path: &str, version: u64, content: Content) -> Entry {
    Entry {
        path: path.into(),
        kind: Kind::File,
        mode: 0o644,
        size: 3,
        mtime_ns: 1,
        object: path.bytes().map(u64::from).sum::<u64>() + 100,
        version,
        content,
        links: 1,
    }
}

fn dir(path: &str) -> Entry {
    Entry {
        kind: Kind::Dir,
        mode: 0o755,
        size: 0,
        content: Content::Nodes(Vec::new()),
        ..file(path, 0, Content::Inline(Vec::new()))
    }
}

fn names(meta: &Meta, d: &str) -> Vec<String> {
    meta.list(d).unwrap().into_iter().map(|e| e.path).collect()
}

/// The namespace operations on a SQLite file; the PostgreSQL engine runs the same SQL
/// and is exercised by the server's cluster tests.
#[test]
fn namespace_operations_keep_the_tree_consistent() {
    let dirpath = tempfile::tempdir().unwrap();
    let meta = Meta::open(dirpath.path().join("meta.db").to_str().unwrap(), "admin").unwrap();
    assert_eq!(meta.rights("admin", "/").unwrap(), Rights::ALL);
    meta.create(&dir("/a")).unwrap();
    meta.create(&dir("/a/b")).unwrap();
    assert!(matches!(meta.create(&dir("/a")), Err(MetaError::Exists(_))));
    assert!(matches!(meta.create(&dir("/x/y")), Err(MetaError::NotFound(_))));
    assert_eq!(meta.commit(&file("/a/b/f", 5, Content::Inline(b"abc".to_vec()))).unwrap(), None);
    let old = meta.commit(&file("/a/b/f", 6, Content::Nodes(vec![3, 4]))).unwrap().unwrap();
    assert_eq!(old.version, 5);
    assert_eq!(meta.get("/a/b/f").unwrap().unwrap().content, Content::Nodes(vec![3, 4]));
    assert!(matches!(meta.commit(&file("/a/b/f/g", 7, Content::Inline(vec![]))), Err(MetaError::NotDir(_))));
    // A name that sorts between a directory's children and its siblings stays put.
    meta.create(&dir("/a.z")).unwrap();
    meta.acl_set("/a/b", "bob", Rights::READ).unwrap();
    assert!(matches!(meta.remove("/a", true), Err(MetaError::NotEmpty(_))));
    meta.rename("/a", "/c").unwrap();
    assert_eq!(names(&meta, "/"), ["/a.z", "/c"]);
    assert_eq!(names(&meta, "/c/b"), ["/c/b/f"]);
    let under: Vec<String> = meta.files_under("/c").unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(under, ["/c/b/f"]);
    assert_eq!(meta.rights("bob", "/c/b").unwrap(), Rights::READ);
    assert_eq!(meta.rights("bob", "/c").unwrap(), Rights(0));
    assert!(matches!(meta.rename("/c", "/c/b/z"), Err(MetaError::Invalid(_))));
    assert!(matches!(meta.rename("/c/b/f", "/a.z"), Err(MetaError::IsDir(_))));
    meta.commit(&file("/g", 9, Content::Inline(b"x".to_vec()))).unwrap();
    let replaced = meta.rename("/g", "/c/b/f").unwrap().unwrap();
    assert_eq!(replaced.version, 6);
    assert_eq!(meta.remove("/c/b/f", false).unwrap().version, 9);
    meta.remove("/c/b", true).unwrap();
    assert_ne!(meta.next_id().unwrap(), meta.next_id().unwrap());
    assert_eq!(meta.setting("k").unwrap(), None);
    assert_eq!(meta.update_setting("k", |old| Ok(old.unwrap_or("first").to_string())).unwrap(), "first");
    assert_eq!(meta.update_setting("k", |old| Ok(old.unwrap_or("second").to_string())).unwrap(), "first");
    assert_eq!(meta.update_setting("k", |_| Ok("third".into())).unwrap(), "third");
    assert_eq!(meta.setting("k").unwrap().as_deref(), Some("third"));
    meta.remove_setting("k").unwrap();
    assert_eq!(meta.setting("k").unwrap(), None);
    let n = meta.join_node("10.0.0.2:9610", None, 5).unwrap();
    assert_eq!(meta.join_node("10.0.0.2:9610", Some("10.0.0.2:9611"), 6).unwrap(), n);
    assert_eq!(meta.nodes().unwrap()[0].http.as_deref(), Some("10.0.0.2:9611"));
    meta.add_garbage(&old, 50).unwrap(); // inline: nothing on nodes
    assert!(meta.due_garbage(50).unwrap().is_empty());
    meta.add_garbage(&replaced, 50).unwrap();
    assert!(meta.due_garbage(49).unwrap().is_empty());
    let due = meta.due_garbage(50).unwrap();
    assert_eq!(due, [Garbage { object: replaced.object, version: 6, nodes: vec![3, 4] }]);
    meta.forget_garbage(&due[0]).unwrap();
    assert!(meta.due_garbage(60).unwrap().is_empty());
}

#[test]
fn paths_are_normalised_and_never_climb() {
    assert_eq!(normalise("a//b/./c/").unwrap(), "/a/b/c");
    assert_eq!(normalise("").unwrap(), "/");
    assert!(normalise("/a/../b").is_err());
    assert_eq!(split("/a/b"), Some(("/a", "b")));
    assert_eq!(split("/a"), Some(("/", "a")));
    assert_eq!(split("/"), None);
}
