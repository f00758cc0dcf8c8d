//! Several devices under one namespace, against a real server: files on any device read,
//! list, change and move as one tree; accounting follows each file to its device; a
//! rebalance moves hot files online, under concurrent readers and writers, without
//! losing a byte or a name, and open handles follow their file to its new device.

use locus_client::ops::{RebalanceApply, RebalancePlan};
use locus_client::types::open_flags;
use locus_proto::Code;
use locus_testkit::TestServer;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A server whose export has `n` devices: the root and `dev1`..`dev{n-1}` beside it.
fn server(n: usize) -> (TestServer, Vec<PathBuf>) {
    let srv = TestServer::start_with(|c| {
        let base = c.root.parent().unwrap().to_path_buf();
        c.devices = (1..n).map(|i| base.join(format!("dev{i}"))).collect();
    });
    let mut devices = vec![srv.root()];
    devices.extend((1..n).map(|i| srv.scratch().join(format!("dev{i}"))));
    (srv, devices)
}

fn put_on(device: &std::path::Path, rel: &str, data: &[u8]) {
    let p = device.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[tokio::test]
async fn files_on_every_device_form_one_namespace() {
    let (srv, dev) = server(3);
    std::fs::create_dir_all(dev[0].join("a")).unwrap();
    put_on(&dev[1], "a/x.txt", b"on one");
    put_on(&dev[0], "a/y.txt", b"on zero");
    put_on(&dev[2], "b.txt", b"on two");
    let c = srv.client("admin").await;

    let mut names: Vec<String> = c.readdir("/a").await.unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, ["x.txt", "y.txt"]);
    let mut top: Vec<String> = c.readdir("/").await.unwrap().into_iter().map(|e| e.name).collect();
    top.sort();
    assert_eq!(top, ["a", "b.txt"]);
    assert_eq!(c.read_file("/a/x.txt").await.unwrap(), b"on one");
    assert_eq!(c.stat("/b.txt").await.unwrap().size, 6);

    // Writes, renames and removals act on the device that holds the file.
    let h = c.open("/a/x.txt", open_flags::READ | open_flags::WRITE, 0).await.unwrap();
    c.pwrite(h.handle, 0, b"ON").await.unwrap();
    c.close(h.handle).await.unwrap();
    assert_eq!(std::fs::read(dev[1].join("a/x.txt")).unwrap(), b"ON one");
    c.rename("/a/x.txt", "/a/z.txt").await.unwrap();
    assert!(dev[1].join("a/z.txt").exists() && !dev[1].join("a/x.txt").exists());
    c.rename("/a/y.txt", "/a/z.txt").await.unwrap(); // replaces the name on device 1
    assert_eq!(c.read_file("/a/z.txt").await.unwrap(), b"on zero");
    assert!(!dev[1].join("a/z.txt").exists(), "the replaced file is gone from its device");
    c.rename("/a", "/c").await.unwrap();
    assert_eq!(c.read_file("/c/z.txt").await.unwrap(), b"on zero");

    // A directory is empty only when it is empty on every device.
    put_on(&dev[2], "c/w.txt", b"w");
    c.unlink("/c/z.txt").await.unwrap();
    assert_eq!(c.rmdir("/c").await.unwrap_err().code(), Code::NOTEMPTY);
    c.unlink("/c/w.txt").await.unwrap();
    c.rmdir("/c").await.unwrap();
    assert!(!dev[2].join("c").exists());
    // A name is one file: nothing else can be made under a file's name on another device.
    assert_eq!(c.mkdir("/b.txt", 0o755).await.unwrap_err().code(), Code::EXIST);
    let e = c.open("/b.txt", open_flags::WRITE | open_flags::CREATE | open_flags::EXCLUSIVE, 0o644).await;
    assert_eq!(e.unwrap_err().code(), Code::EXIST);
    c.write_file("/b.txt", 0o644, b"replaced").await.unwrap();
    assert_eq!(std::fs::read(dev[2].join("b.txt")).unwrap(), b"replaced", "an upload goes where the file is");

    // Code over a directory sees its files on every device (read-only).
    srv.add_handler("csv", &locus_testkit::build_storelet("csv"), &[]);
    put_on(&dev[2], "t.csv", b"a\n1\n2\n");
    assert_eq!(c.read_file("/csv@t.csv,-count").await.unwrap(), b"2\n");
    let runs = || async { c.storelet_stats().await.unwrap().subjects[0].runs };
    let before = runs().await;
    assert_eq!(c.read_file("/csv@t.csv,-count").await.unwrap(), b"2\n");
    assert_eq!(runs().await, before, "reused through the union too");
    let find = locus_testkit::build_storelet("find");
    let out = c.storelet_run(&find, "/", vec!["/".into(), "-name".into(), "*.csv".into()], false).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/t.csv\n");
    let e = c.storelet_run(&find, "/", vec!["/".into()], true).await.unwrap_err();
    assert_eq!(e.code(), Code::ROFS, "a union of devices is read-only to code");

    let stats = c.stats(10).await.unwrap();
    assert_eq!(stats.devices.len(), 3);
    assert!(stats.devices[2].io.read_bytes + stats.devices[2].io.write_bytes > 0);
    let b = stats.busiest.iter().find(|f| f.path == "b.txt").unwrap();
    assert_eq!(b.device, 2);
    assert!(b.io.write_p99_ns > 0);
}

#[tokio::test]
async fn rebalancing_moves_hot_files_online_and_handles_follow() {
    let (srv, dev) = server(2);
    let c = srv.client("admin").await;
    for i in 0..8 {
        c.write_file(&format!("/f{i}"), 0o644, &vec![i as u8; 64 << 10]).await.unwrap();
    }
    assert!((0..8).all(|i| dev[0].join(format!("f{i}")).exists()), "equal free space: the first device");
    for _ in 0..20 {
        for i in 0..4 {
            c.read_file(&format!("/f{i}")).await.unwrap();
        }
    }
    let plan = c.call(RebalancePlan { max_moves: 100 }).await.unwrap();
    assert!(!plan.moves.is_empty() && plan.moves.iter().all(|m| (m.from, m.to) == (0, 1)), "{plan:?}");
    let (hi, lo) = (plan.after.iter().max().unwrap(), plan.after.iter().min().unwrap());
    assert!(*hi as f64 <= 1.2 * (*hi + *lo) as f64 / 2.0, "the plan evens the load: {plan:?}");

    // A handle open for writing on a file that moves keeps working on the new copy.
    let hot = plan.moves[0].path.clone();
    let h = c.open(&format!("/{hot}"), open_flags::READ | open_flags::WRITE, 0).await.unwrap();

    // Every file gets its two 64-byte tails that the writers stamp.
    for i in 0..8 {
        let h = c.open(&format!("/f{i}"), open_flags::WRITE, 0).await.unwrap();
        c.pwrite(h.handle, 64 << 10, &[b' '; 128]).await.unwrap();
        c.close(h.handle).await.unwrap();
    }
    // Readers and writers run throughout the moves.
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..2 {
        let (stop, c) = (stop.clone(), srv.client("admin").await);
        workers.push(tokio::spawn(async move {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) || rounds < 3 {
                for i in 0..8 {
                    let path = format!("/f{i}");
                    let data = c.read_file(&path).await.expect("readable throughout");
                    assert_eq!(data.len() as u64, (64 << 10) + 64 * 2, "{path}: length");
                    if i % 2 == w {
                        let h = c.open(&path, open_flags::WRITE, 0).await.unwrap();
                        let stamp = format!("{:>63}\n", rounds * 10 + w as u64);
                        c.pwrite(h.handle, (64 << 10) + 64 * w as u64, stamp.as_bytes()).await.unwrap();
                        c.close(h.handle).await.unwrap();
                    }
                }
                rounds += 1;
            }
            rounds
        }));
    }
    let done = c.call(RebalanceApply { max_moves: 100 }).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut last = Vec::new();
    for w in workers {
        last.push(w.await.unwrap());
    }
    assert!(!done.moves.is_empty(), "{done:?}");
    for m in &done.moves {
        assert!(dev[1].join(&m.path).exists() && !dev[0].join(&m.path).exists(), "{} moved", m.path);
    }
    c.pwrite(h.handle, 0, b"after the move").await.unwrap();
    c.close(h.handle).await.unwrap();
    let data = c.read_file(&format!("/{hot}")).await.unwrap();
    assert_eq!(&data[..14], b"after the move", "the handle wrote to the new copy");

    // No byte lost: each file has its content and each writer's last stamp.
    for i in 0..8 {
        let data = c.read_file(&format!("/f{i}")).await.unwrap();
        let w = i % 2;
        let tail = std::str::from_utf8(&data[(64 << 10) + 64 * w..(64 << 10) + 64 * (w + 1)]).unwrap();
        let expect = (last[w] - 1) * 10 + w as u64;
        assert_eq!(tail.trim(), expect.to_string(), "f{i}: the last write of writer {w}");
        if format!("f{i}") != hot {
            assert!(data[..64 << 10].iter().all(|&b| b == i as u8), "f{i}: content intact");
        }
    }
    let mut names: Vec<String> = c.readdir("/").await.unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, (0..8).map(|i| format!("f{i}")).collect::<Vec<_>>(), "every name kept, once");
    let stats = c.stats(0).await.unwrap();
    assert!(stats.devices[1].io.reads > 0, "reads of moved files count on their new device");
}
