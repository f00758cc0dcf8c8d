//! The Locus driver against a real server on an ephemeral port.

use locus_drivers::{open_flags, Driver, SetTime, Time};
use locus_testkit::TestServer;

fn driver(server: &TestServer) -> locus_drivers::locus::LocusDriver {
    locus_drivers::locus::LocusDriver::with_options(server.options("admin")).expect("connects")
}

#[test]
fn writes_behind_land_in_order_and_their_errors_show_at_settle_and_close() {
    let server = TestServer::start();
    server.put_local("f", b"");
    let mut d = driver(&server);
    let h = d.open("/f", open_flags::READ | open_flags::WRITE, 0).expect("open").handle;
    for i in 0..200u64 {
        d.pwrite_behind(h, i * 4, &(i as u32).to_le_bytes()).expect("queued");
    }
    // Later requests on the connection see the writes: the server runs them in order.
    assert_eq!(d.fstat(h).expect("fstat").size, 800);
    d.settle(h).expect("every write landed");
    let bytes = std::fs::read(server.local("f")).expect("read back");
    assert_eq!(&bytes[796..], &199u32.to_le_bytes());
    d.close(h).expect("close");

    // A write the server refuses (the handle is read-only) is accepted at once and
    // reported when the handle settles, and again not lost at close.
    let r = d.open("/f", open_flags::READ, 0).expect("open").handle;
    d.pwrite_behind(r, 0, b"nope").expect("queued without waiting");
    assert_eq!(d.settle(r).expect_err("refused").errno, libc::EBADF);
    d.pwrite_behind(r, 0, b"nope").expect("queued without waiting");
    assert!(d.close(r).is_err(), "close reports the refused write");
    assert_eq!(&std::fs::read(server.local("f")).unwrap()[..4], &0u32.to_le_bytes());
}

#[test]
fn utimes_stat_answers_the_attributes_after_the_change() {
    let server = TestServer::start();
    server.put_local("g", b"abc");
    let mut d = driver(&server);
    let at = Time { sec: 1_000_000_000, nsec: 0 };
    let attr = d.utimes_stat("/g", SetTime::At(at), SetTime::At(at), None).expect("by path");
    assert_eq!(attr.mtime.sec, 1_000_000_000);
    let h = d.open("/g", open_flags::READ, 0).expect("open").handle;
    let later = Time { sec: 1_500_000_000, nsec: 0 };
    let attr = d.utimes_stat("/g", SetTime::Omit, SetTime::At(later), Some(h)).expect("by handle");
    assert_eq!((attr.mtime.sec, attr.atime.sec, attr.size), (1_500_000_000, 1_000_000_000, 3));
    let missing = d.utimes_stat("/nope", SetTime::Now, SetTime::Now, None).expect_err("no such file");
    assert_eq!(missing.errno, libc::ENOENT);
}

#[test]
fn times_set_behind_land_before_the_settle_and_their_errors_show_there() {
    let server = TestServer::start();
    server.put_local("t", b"abc");
    let mut d = driver(&server);
    let h = d.open("/t", open_flags::READ | open_flags::WRITE, 0).expect("open").handle;
    d.pwrite_behind(h, 3, b"def").expect("queued");
    let at = Time { sec: 1_200_000_000, nsec: 5 };
    d.utimes_behind("/t", SetTime::Omit, SetTime::At(at), h).expect("queued");
    d.settle(h).expect("both landed");
    let attr = d.lstat("/t").expect("lstat");
    assert_eq!((attr.size, attr.mtime.sec, attr.mtime.nsec), (6, 1_200_000_000, 5));
    // Times on a path that is gone: accepted at once, reported at the settle.
    d.utimes_behind("/gone", SetTime::Now, SetTime::Now, h).expect("queued without waiting");
    assert_eq!(d.settle(h).expect_err("no such file").errno, libc::ENOENT);
    d.close(h).expect("close");
}

#[test]
fn sequential_reads_are_sent_ahead_and_never_serve_stale_or_wrong_bytes() {
    // The client logs in through a proxy, at the proxy's address: the server takes it.
    let server = TestServer::start_with(|c| c.names.push("127.0.0.1:*".parse().unwrap()));
    let content: Vec<u8> = (0..(4u32 << 20) / 4).flat_map(|i| i.to_le_bytes()).collect();
    server.put_local("big", &content);
    // 10 ms of round trip: one read per round trip would take 64 x 10 ms for 4 MiB.
    let proxy = locus_testkit::proxy::DelayProxy::start(server.addr, std::time::Duration::from_millis(5)).unwrap();
    let mut opts = server.options("admin");
    opts.addr = proxy.addr.to_string();
    let mut d = locus_drivers::locus::LocusDriver::with_options(opts).expect("connects");
    let h = d.open("/big", open_flags::READ | open_flags::WRITE, 0).expect("open").handle;
    let chunk = 64u32 << 10;
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    loop {
        let data = d.pread(h, got.len() as u64, chunk).expect("read");
        if data.is_empty() {
            break;
        }
        got.extend_from_slice(&data);
    }
    let took = started.elapsed();
    assert!(got == content, "every byte in order");
    assert!(took < std::time::Duration::from_millis(64 * 10 / 2), "reads overlapped: {took:?} for 64 round trips");

    // A write drops what was read ahead: the next reads see it.
    assert_eq!(d.pread(h, 0, chunk).unwrap(), &content[..chunk as usize]);
    assert_eq!(d.pread(h, chunk as u64, chunk).unwrap(), &content[chunk as usize..2 * chunk as usize]);
    d.pwrite(h, 2 * chunk as u64, b"CHANGED").expect("write");
    assert_eq!(&d.pread(h, 2 * chunk as u64, chunk).unwrap()[..7], b"CHANGED");
    // Out of order, the reads are plain ones, still right.
    for at in [3u64 << 20, 1 << 20, 5 << 10] {
        assert_eq!(d.pread(h, at, 100).unwrap(), &content[at as usize..at as usize + 100]);
    }
    d.close(h).expect("close");
}

#[test]
fn removals_and_renames_behind_land_in_order_and_their_failures_are_reported() {
    use locus_client::types::Rights;
    let server = TestServer::start();
    for i in 0..100 {
        server.put_local(&format!("d/f{i}"), b"x");
    }
    server.put_local("keep/k", b"k");
    let rights = Rights(Rights::READ.0 | Rights::WRITE.0 | Rights::LIST.0 | Rights::DELETE.0);
    server.shared().store.acl_set("admin", "/d", "alice", rights).unwrap();
    server.shared().store.acl_set("admin", "/keep", "alice", Rights(Rights::READ.0 | Rights::LIST.0)).unwrap();
    let mut d = locus_drivers::locus::LocusDriver::with_options(server.options("alice")).expect("connects");
    // More than the driver keeps unanswered: the oldest are waited for on the way.
    for i in 0..100 {
        d.unlink_behind(&format!("/d/f{i}")).expect("sent");
    }
    // A request sent later is answered after them: the name made again stays.
    d.write_file("/d/f7", 0o644, b"again").expect("made again");
    assert!(d.failed_behind(true).is_empty(), "every removal succeeded");
    let left: Vec<_> = d.readdir("/d").expect("lists").into_iter().map(|e| e.name).collect();
    assert_eq!(left, ["f7"]);
    assert_eq!(std::fs::read(server.local("d/f7")).unwrap(), b"again");

    // A removal refused (no delete right) is answered at once and reported later; one of
    // a name already gone is not a failure.
    d.unlink_behind("/keep/k").expect("sent without waiting");
    d.unlink_behind("/d/never-was").expect("sent without waiting");
    let failed = d.failed_behind(true);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!((failed[0].0.as_str(), failed[0].1.errno), ("/keep/k", libc::EACCES));
    assert!(server.local("keep/k").exists());
    assert!(d.failed_behind(true).is_empty(), "reported once");

    // Renames behind land in order with the rest; a refused one is reported under both
    // names, and one whose source is missing is a failure (unlike a removal's).
    d.rename_behind("/d/f7", "/d/g7").expect("sent");
    d.write_file("/d/f7", 0o644, b"third").expect("made again");
    d.rename_behind("/keep/k", "/d/k").expect("sent without waiting");
    d.rename_behind("/d/never-was", "/d/still-not").expect("sent without waiting");
    let failed: Vec<_> = d.failed_behind(true).into_iter().map(|(p, e)| (p, e.errno)).collect();
    let want = [
        ("/keep/k", libc::EACCES),
        ("/d/k", libc::EACCES),
        ("/d/never-was", libc::ENOENT),
        ("/d/still-not", libc::ENOENT),
    ];
    assert_eq!(failed, want.map(|(p, e)| (p.to_string(), e)));
    assert_eq!(std::fs::read(server.local("d/g7")).unwrap(), b"again");
    assert_eq!(std::fs::read(server.local("d/f7")).unwrap(), b"third");
    assert!(server.local("keep/k").exists());
}
