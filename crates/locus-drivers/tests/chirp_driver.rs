//! The Chirp driver against CCTools' chirp_server (Debian's `coop-computing-tools`), which
//! here drops clients idle for a second: open files outlive the connection they were
//! opened on.

use locus_drivers::chirp::ChirpDriver;
use locus_drivers::{open_flags as of, Driver};
use std::time::Duration;

/// Longer than the server's idle limit (`-t 1`), so the connection is gone afterwards.
const IDLE: Duration = Duration::from_millis(1600);

#[test]
fn open_files_survive_the_server_dropping_an_idle_connection() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let chirp = locus_bench::peers::start_chirp_with(work.path(), &root, &["-t", "1"])
        .expect("chirp_server (coop-computing-tools) runs");
    let (mut d, _) = ChirpDriver::connect(&format!("chirp://{}/", chirp.addr)).unwrap();

    let flags = of::READ | of::WRITE | of::CREATE | of::TRUNCATE;
    let h = d.open("/f", flags, 0o666).unwrap().handle;
    assert_eq!(d.pwrite(h, 0, b"before").unwrap(), 6);
    let gone = d.open("/gone", flags, 0o666).unwrap().handle;
    let never_used = d.open("/f", of::READ, 0).unwrap().handle;

    std::thread::sleep(IDLE);
    // Opened again on a new connection, without truncating: the first write is still there.
    assert_eq!(d.pwrite(h, 6, b" after").unwrap(), 6);
    assert_eq!(d.pread(h, 0, 100).unwrap(), b"before after");
    assert_eq!(d.fstat(h).unwrap().size, 12);
    // A file removed behind the driver's back cannot be opened again: its handle is stale.
    std::fs::remove_file(root.join("gone")).unwrap();
    assert_eq!(d.pread(gone, 0, 1).unwrap_err().errno, libc::ESTALE);
    // Closing a handle never opened on this connection needs nothing from the server.
    d.close(never_used).unwrap();
    d.close(gone).unwrap();

    std::thread::sleep(IDLE);
    // Path calls after a pause go on a fresh connection too.
    assert_eq!(d.lstat("/f").unwrap().size, 12);
    d.close(h).unwrap();
    assert_eq!(d.close(h).unwrap_err().errno, libc::EBADF);
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"before after");
}
