//! Storelets under exact limits: the shipped `find` against a local walk, every limit
//! tripped by a hostile module, confinement to the preopened directory, and the cache.

use locus_storelet::{Limits, Runner, StoreletError};
use locus_testkit::build_storelet as build;
use std::path::Path;
use std::time::Duration;

fn limit_of(r: Result<locus_storelet::RunOutcome, StoreletError>) -> &'static str {
    match r {
        Err(StoreletError::Limit { limit, .. }) => limit,
        other => panic!("expected a limit, got {other:?}"),
    }
}

fn tree(root: &Path) {
    for (p, body) in [("a/x.go", "1"), ("a/b/y.go", "2"), ("a/b/z.txt", "3"), ("c.go", "4")] {
        let f = root.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, body).unwrap();
    }
}

#[test]
fn find_matches_a_local_walk() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    tree(&root);
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, m) = runner.module(&build("find")).unwrap();
    let args: Vec<String> = ["find", "/", "-name", "*.go"].iter().map(|s| s.to_string()).collect();
    let out = runner.run(&m, &args, Some((&root, false)), Limits::default()).unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let mut got: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    got.sort();
    assert_eq!(got, ["/a/b/y.go", "/a/x.go", "/c.go"]);
    assert!(out.account.fuel > 0 && out.account.peak_memory > 0);
}

#[test]
fn each_limit_trips_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let spin = r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;
    let grow = r#"(module (memory (export "memory") 1)
        (func (export "_start") (loop (if (i32.eq (memory.grow (i32.const 16)) (i32.const -1)) (then unreachable)) (br 0))))"#;
    let flood = r#"(module
        (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 100) "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        (func (export "_start")
          (i32.store (i32.const 0) (i32.const 100)) (i32.store (i32.const 4) (i32.const 64))
          (loop (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))) (br 0))))"#;
    let run = |wat: &str, limits: Limits| {
        let (_, m) = runner.module(wat.as_bytes()).unwrap();
        runner.run(&m, &["x".to_string()], None, limits)
    };
    let base = Limits { fuel: 50_000_000, memory: 4 << 20, wall: Duration::from_secs(5), output: 1 << 16 };
    assert_eq!(limit_of(run(spin, base)), "fuel");
    assert_eq!(limit_of(run(spin, Limits { fuel: u64::MAX / 2, wall: Duration::from_millis(200), ..base })), "time");
    assert_eq!(limit_of(run(grow, base)), "memory");
    assert_eq!(limit_of(run(flood, base)), "output");
    assert!(matches!(runner.module(b"not wasm"), Err(StoreletError::Invalid(_))));
}

#[test]
fn a_storelet_sees_only_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    tree(&root);
    std::fs::write(dir.path().join("outside.go"), "secret").unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("escape")).unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, m) = runner.module(&build("find")).unwrap();
    for start in ["/", "/..", "/escape", "/../.."] {
        let args: Vec<String> = ["find", start, "-name", "*.go"].iter().map(|s| s.to_string()).collect();
        let out = runner.run(&m, &args, Some((&root, false)), Limits::default()).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("outside"), "{start}: {text}");
    }
}

#[test]
fn compiled_modules_are_reused_and_a_corrupted_cache_entry_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let wat = br#"(module (memory (export "memory") 1) (func (export "_start")))"#;
    let runner = Runner::new(&cache).unwrap();
    let (hash, _) = runner.module(wat).unwrap();
    runner.module(wat).unwrap();
    assert_eq!(runner.compiles.load(std::sync::atomic::Ordering::Relaxed), 1);
    // a new runner (a restart) finds it on disk
    let again = Runner::new(&cache).unwrap();
    let (_, m) = again.module(wat).unwrap();
    assert_eq!(again.compiles.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(again.run(&m, &["x".into()], None, Limits::default()).unwrap().exit_code, 0);
    // a corrupted entry is detected and rebuilt
    let file = cache.join(format!("{hash}.cwasm"));
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    let third = Runner::new(&cache).unwrap();
    let (_, m) = third.module(wat).unwrap();
    assert_eq!(third.compiles.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(third.run(&m, &["x".into()], None, Limits::default()).unwrap().exit_code, 0);
}
