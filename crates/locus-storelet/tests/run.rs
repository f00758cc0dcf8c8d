//! Storelets under exact limits: the shipped `find` against a local walk, every limit
//! tripped by a hostile module, cancellation, budgets, confinement to the preopened
//! directory, and the compile cache.

use locus_storelet::{CpuBudget, Limits, RunControl, RunSpec, Runner, StoreletError};
use locus_testkit::build_storelet as build;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn limit_of(r: Result<locus_storelet::RunOutcome, StoreletError>) -> &'static str {
    match r {
        Err(StoreletError::Limit { limit, .. }) => limit,
        other => panic!("expected a limit, got {other:?}"),
    }
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
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
    let args = argv(&["find", "/", "-name", "*.go"]);
    let out = runner.run(&m, RunSpec::new(&args, Limits::default()).dir(&root, false)).unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let mut got: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    got.sort();
    assert_eq!(got, ["/a/b/y.go", "/a/x.go", "/c.go"]);
    let a = out.account;
    assert!(a.fuel > 0 && a.peak_memory > 0 && a.cpu > Duration::ZERO, "{a:?}");
    assert!(a.files_opened >= 3, "directories opened: {a:?}");
}

const SPIN: &str = r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;

#[test]
fn each_limit_trips_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let grow = r#"(module (memory (export "memory") 1)
        (func (export "_start") (loop (if (i32.eq (memory.grow (i32.const 16)) (i32.const -1)) (then unreachable)) (br 0))))"#;
    let flood = r#"(module
        (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 100) "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        (func (export "_start")
          (i32.store (i32.const 0) (i32.const 100)) (i32.store (i32.const 4) (i32.const 64))
          (loop (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))) (br 0))))"#;
    let args = argv(&["x"]);
    let run = |wat: &str, limits: Limits| {
        let (_, m) = runner.module(wat.as_bytes()).unwrap();
        runner.run(&m, RunSpec::new(&args, limits))
    };
    let base = Limits { fuel: 50_000_000, memory: 4 << 20, output: 1 << 16, ..Limits::default() };
    let endless = Limits { fuel: 1 << 50, ..base };
    assert_eq!(limit_of(run(SPIN, base)), "fuel");
    assert_eq!(limit_of(run(SPIN, Limits { wall: Duration::from_millis(200), ..endless })), "time");
    assert_eq!(limit_of(run(SPIN, Limits { cpu: Duration::from_millis(200), ..endless })), "cpu time");
    assert_eq!(limit_of(run(grow, base)), "memory");
    match run(flood, base) {
        Err(StoreletError::Limit { limit: "output", account, .. }) => {
            assert!(account.output <= 1 << 16, "capped exactly: {account:?}")
        }
        other => panic!("expected the output limit, got {other:?}"),
    }
    assert!(matches!(runner.module(b"not wasm"), Err(StoreletError::Invalid(_))));
}

#[test]
fn file_system_limits_trip_with_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    tree(&root);
    std::fs::write(root.join("big"), vec![7u8; 1 << 20]).unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, hostile) = runner.module(&build("hostile")).unwrap();
    let limits = Limits { read_bytes: 10 << 20, write_bytes: 4 << 20, files: 500, ..Limits::default() };
    let run = |args: &[&str], writable: bool| {
        let args = argv(args);
        runner.run(&hostile, RunSpec::new(&args, limits).dir(&root, writable))
    };
    match run(&["hostile", "read", "/big"], false) {
        Err(StoreletError::Limit { limit: "bytes read", account, .. }) => {
            assert!(account.read_bytes >= 10 << 20 && account.read_bytes < 11 << 20, "{account:?}")
        }
        other => panic!("expected the read limit, got {other:?}"),
    }
    match run(&["hostile", "write", "/out"], true) {
        Err(StoreletError::Limit { limit: "bytes written", account, .. }) => {
            assert!(account.write_bytes >= 4 << 20 && account.write_bytes < 5 << 20, "{account:?}")
        }
        other => panic!("expected the write limit, got {other:?}"),
    }
    match run(&["hostile", "open", "/c.go"], false) {
        Err(StoreletError::Limit { limit: "files opened", account, .. }) => assert_eq!(account.files_opened, 500),
        other => panic!("expected the files limit, got {other:?}"),
    }
    // Without write permission on the preopened directory, writing fails inside the
    // program (EPERM/EBADF from WASI), and nothing is created.
    let out = run(&["hostile", "write", "/denied"], false).unwrap();
    assert_ne!(out.exit_code, 0);
    assert!(!root.join("denied").exists());
}

#[test]
fn a_run_is_cancelled_from_outside() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, m) = runner.module(SPIN.as_bytes()).unwrap();
    let control = RunControl::new(None);
    let remote = control.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        assert!(remote.cpu() > Duration::ZERO, "progress is visible while running");
        remote.cancel();
    });
    let args = argv(&["x"]);
    let started = std::time::Instant::now();
    let limits = Limits { fuel: 1 << 50, ..Limits::default() };
    let r = runner.run(&m, RunSpec { control, ..RunSpec::new(&args, limits) });
    canceller.join().unwrap();
    assert!(matches!(r, Err(StoreletError::Cancelled { .. })), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_cpu_budget_is_shared_by_a_principals_runs() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, m) = runner.module(SPIN.as_bytes()).unwrap();
    let budget = Arc::new(CpuBudget::new(Duration::from_millis(300), Duration::from_secs(3600)));
    let limits = Limits { fuel: 1 << 50, ..Limits::default() };
    let args = argv(&["x"]);
    // Two runs at once draw on one budget: together they stop near 300 ms of CPU.
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let control = RunControl::new(Some(budget.clone()));
                let (runner, m, args) = (&runner, &m, &args);
                s.spawn(move || runner.run(m, RunSpec { control, ..RunSpec::new(args, limits) }))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut total = Duration::ZERO;
    for r in results {
        match r {
            Err(StoreletError::Limit { limit: "cpu budget", account, .. }) => total += account.cpu,
            other => panic!("expected the budget, got {other:?}"),
        }
    }
    assert!(total < Duration::from_millis(300 + 4 * 10 + 60), "overspent: {total:?}");
    // Spent: the next run stops at its first tick. Another principal's budget is untouched.
    let again =
        runner.run(&m, RunSpec { control: RunControl::new(Some(budget.clone())), ..RunSpec::new(&args, limits) });
    assert!(matches!(again, Err(StoreletError::Limit { limit: "cpu budget", .. })));
    let other = Arc::new(CpuBudget::new(Duration::from_millis(300), Duration::from_secs(3600)));
    let limited = Limits { wall: Duration::from_millis(100), ..limits };
    let r = runner.run(&m, RunSpec { control: RunControl::new(Some(other.clone())), ..RunSpec::new(&args, limited) });
    assert!(matches!(r, Err(StoreletError::Limit { limit: "time", .. })), "{r:?}");
    assert!(other.spent() > Duration::ZERO);
}

#[test]
fn a_storelet_sees_only_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    tree(&root);
    std::fs::write(dir.path().join("outside.go"), "secret").unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("escape")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).unwrap();
    let runner = Runner::new(&dir.path().join("cache")).unwrap();
    let (_, find) = runner.module(&build("find")).unwrap();
    for start in ["/", "/..", "/escape", "/../.."] {
        let args = argv(&["find", start, "-name", "*.go"]);
        let out = runner.run(&find, RunSpec::new(&args, Limits::default()).dir(&root, false)).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("outside"), "{start}: {text}");
    }
    let (_, grep) = runner.module(&build("grep")).unwrap();
    for path in ["/passwd", "/../outside.go", "/escape/outside.go"] {
        let args = argv(&["grep", "-F", "", path]);
        let out = runner.run(&grep, RunSpec::new(&args, Limits::default()).dir(&root, false)).unwrap();
        assert!(out.stdout.is_empty(), "{path}: {}", String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn compiled_modules_are_reused_and_a_corrupted_cache_entry_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let wat = br#"(module (memory (export "memory") 1) (func (export "_start")))"#;
    let args = argv(&["x"]);
    let runner = Runner::new(&cache).unwrap();
    let (hash, _) = runner.module(wat).unwrap();
    runner.module(wat).unwrap();
    assert_eq!(runner.compiles.load(std::sync::atomic::Ordering::Relaxed), 1);
    // a new runner (a restart) finds it on disk
    let again = Runner::new(&cache).unwrap();
    let (_, m) = again.module(wat).unwrap();
    assert_eq!(again.compiles.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(again.run(&m, RunSpec::new(&args, Limits::default())).unwrap().exit_code, 0);
    // a corrupted entry is detected and rebuilt
    let file = cache.join(format!("{hash}.cwasm"));
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    // Named by hash alone (as a head names a module its node has), a damaged entry is
    // refused and removed, so the module is asked for again rather than refused forever.
    let probe = Runner::new(&cache).unwrap();
    assert!(probe.has(&hash));
    assert!(probe.module_hashed(hash.clone(), &[]).is_err());
    assert!(!probe.has(&hash), "the damaged entry is gone");
    assert!(!probe.has("../../etc/passwd") && !probe.has(&hash.to_uppercase()));
    let third = Runner::new(&cache).unwrap();
    let (_, m) = third.module(wat).unwrap();
    assert_eq!(third.compiles.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(third.run(&m, RunSpec::new(&args, Limits::default())).unwrap().exit_code, 0);
}
