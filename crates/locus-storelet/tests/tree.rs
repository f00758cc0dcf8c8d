//! Runs over a [`Tree`] (a read-only directory held in memory, as a data node's share of
//! a cluster run sees its files): the shipped `find`, `grep` and `wc` see exactly what
//! a directory of the same files shows, nothing above `/`, nothing they may change, and
//! the run's limits hold.

use locus_storelet::{Limits, RunSpec, Runner, StoreletError, Tree, TreeFile};
use locus_testkit::build_storelet as build;
use std::sync::Arc;

/// The lines of `out`, sorted (shares and walks list in no promised order).
fn sorted_lines(out: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    lines
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Runs `module` over `tree`: exit code, stdout, stderr.
fn run(runner: &Runner, module: &wasmtime::Module, tree: &Arc<Tree>, args: &[&str]) -> (i32, String, String) {
    let args = argv(args);
    let mut spec = RunSpec::new(&args, Limits::default());
    spec.tree = Some(tree.clone());
    let out = runner.run(module, spec).unwrap();
    (out.exit_code, String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// A tree of three objects on the host and one file of bytes, and the objects' directory.
fn sample() -> (tempfile::TempDir, Arc<Tree>) {
    let dir = tempfile::tempdir().unwrap();
    let mut tree = Tree::new();
    for (i, (path, body)) in
        [("a/x.go", "package x\nfunc X() {}\n"), ("a/b/y.go", "package y\n"), ("a/b/z.txt", "zed\n")].iter().enumerate()
    {
        let object = dir.path().join(format!("object{i}"));
        std::fs::write(&object, body).unwrap();
        tree.add(path, TreeFile::Host(object)).unwrap();
    }
    tree.add("c.go", TreeFile::Bytes(Arc::from(&b"package c\n"[..]))).unwrap();
    std::fs::write(dir.path().join("outside.go"), "secret\n").unwrap();
    (dir, Arc::new(tree))
}

#[test]
fn find_grep_and_wc_see_the_tree_as_a_directory() {
    let (dir, tree) = sample();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, find) = runner.module(&build("find")).unwrap();
    let (code, out, err) = run(&runner, &find, &tree, &["find", "/", "-name", "*.go"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(sorted_lines(&out), ["/a/b/y.go", "/a/x.go", "/c.go"]);
    let (_, out, _) = run(&runner, &find, &tree, &["find", "/a", "-type", "d"]);
    assert_eq!(out.lines().collect::<Vec<_>>(), ["/a", "/a/b"]);
    // Sizes are the objects' (and the bytes').
    let (_, out, _) = run(&runner, &find, &tree, &["find", "/", "-size", "-11c", "-type", "f"]);
    assert_eq!(sorted_lines(&out), ["/a/b/y.go", "/a/b/z.txt", "/c.go"]);

    let (_, grep) = runner.module(&build("grep")).unwrap();
    let (code, out, err) = run(&runner, &grep, &tree, &["grep", "-F", "package", "/"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(sorted_lines(&out), ["/a/b/y.go:1:package y", "/a/x.go:1:package x", "/c.go:1:package c"]);

    let (_, wc) = runner.module(&build("wc")).unwrap();
    let (code, out, err) = run(&runner, &wc, &tree, &["wc", "/a/x.go", "/c.go"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2") && out.contains("22") && out.contains("10"), "{out}");
}

#[test]
fn nothing_above_the_root_is_seen_and_nothing_is_changed() {
    let (dir, tree) = sample();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, find) = runner.module(&build("find")).unwrap();
    for start in ["/..", "/../..", "/a/../.."] {
        let (_, out, _) = run(&runner, &find, &tree, &["find", start, "-name", "*.go"]);
        assert!(!out.contains("outside"), "{start}: {out}");
    }
    let (_, grep) = runner.module(&build("grep")).unwrap();
    for path in ["/../outside.go", "/a/../../outside.go", "/nothing"] {
        let (code, out, _) = run(&runner, &grep, &tree, &["grep", "-F", "", path]);
        assert!(out.is_empty() && code != 0, "{path}: {code} {out}");
    }
    let (_, hostile) = runner.module(&build("hostile")).unwrap();
    for path in ["/new", "/a/x.go", "/c.go"] {
        let (code, _, err) = run(&runner, &hostile, &tree, &["hostile", "write", path]);
        assert_ne!(code, 0, "{path}: a write was let through");
        assert!(err.to_lowercase().contains("read-only"), "{path}: {err}");
    }
    // The objects are as they were.
    assert_eq!(std::fs::read_to_string(dir.path().join("object0")).unwrap(), "package x\nfunc X() {}\n");
}

#[test]
fn limits_hold_over_a_tree() {
    let (dir, tree) = sample();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, hostile) = runner.module(&build("hostile")).unwrap();
    let args = argv(&["hostile", "read", "/a/x.go"]);
    let mut spec = RunSpec::new(&args, Limits { read_bytes: 1000, ..Limits::default() });
    spec.tree = Some(tree.clone());
    match runner.run(&hostile, spec) {
        Err(StoreletError::Limit { limit, .. }) => assert_eq!(limit, "bytes read"),
        other => panic!("expected the read limit, got {other:?}"),
    }
    let args = argv(&["hostile", "open", "/c.go"]);
    let mut spec = RunSpec::new(&args, Limits { files: 50, ..Limits::default() });
    spec.tree = Some(tree);
    match runner.run(&hostile, spec) {
        Err(StoreletError::Limit { limit, .. }) => assert_eq!(limit, "files opened"),
        other => panic!("expected the files limit, got {other:?}"),
    }
}

#[test]
fn a_tree_refuses_names_that_are_not_files_relative_paths() {
    let mut tree = Tree::new();
    tree.add("a/b", TreeFile::Bytes(Arc::from(&b""[..]))).unwrap();
    for bad in ["", "/", "a/../x", "./x", "a/b/c", "a/b", "x\0y"] {
        assert!(tree.add(bad, TreeFile::Bytes(Arc::from(&b""[..]))).is_err(), "{bad:?} was taken");
    }
    assert_eq!(tree.len(), 3);
}

/// A read fills one I/O vector, within what the run may still read: a hundred vectors
/// over one buffer in one call cannot carry it past its byte limit.
#[test]
fn one_read_cannot_pass_the_byte_limit() {
    let dir = tempfile::tempdir().unwrap();
    let object = dir.path().join("big");
    std::fs::write(&object, vec![7u8; 1 << 20]).unwrap();
    let mut tree = Tree::new();
    tree.add("big", TreeFile::Host(object)).unwrap();
    let many_iovecs = r#"(module
        (import "wasi_snapshot_preview1" "path_open"
            (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
        (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "big")
        (func (export "_start") (local $i i32)
            (loop $fill
                (i32.store (i32.add (i32.const 1024) (i32.mul (local.get $i) (i32.const 8))) (i32.const 4096))
                (i32.store (i32.add (i32.const 1028) (i32.mul (local.get $i) (i32.const 8))) (i32.const 4096))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br_if $fill (i32.lt_u (local.get $i) (i32.const 100))))
            (if (call $open (i32.const 3) (i32.const 0) (i32.const 0) (i32.const 3) (i32.const 0)
                    (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 16))
                (then unreachable))
            (loop $again
                (drop (call $read (i32.load (i32.const 16)) (i32.const 1024) (i32.const 100) (i32.const 32)))
                (br $again))))"#;
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, module) = runner.module(many_iovecs.as_bytes()).unwrap();
    let args = argv(&["reader"]);
    let mut spec = RunSpec::new(&args, Limits { read_bytes: 10_000, ..Limits::default() });
    spec.tree = Some(Arc::new(tree));
    match runner.run(&module, spec) {
        Err(StoreletError::Limit { limit, account, .. }) => {
            assert_eq!(limit, "bytes read");
            assert_eq!(account.read_bytes, 10_000, "read past the limit: {account:?}");
        }
        other => panic!("expected the read limit, got {other:?}"),
    }
}

/// A file whose object is gone stops the run with an error naming it, rather than
/// letting its output look complete without it.
#[test]
fn a_missing_object_stops_the_run() {
    let (dir, tree) = sample();
    std::fs::remove_file(dir.path().join("object1")).unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, grep) = runner.module(&build("grep")).unwrap();
    let args = argv(&["grep", "-F", "package", "/"]);
    let mut spec = RunSpec::new(&args, Limits::default());
    spec.tree = Some(tree);
    match runner.run(&grep, spec) {
        Err(StoreletError::Trap(why)) => assert!(why.contains("/a/b/y.go"), "{why}"),
        other => panic!("expected the run to stop, got {other:?}"),
    }
}
