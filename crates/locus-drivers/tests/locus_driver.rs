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
