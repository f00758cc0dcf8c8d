//! What the network endpoint fuzz targets share: a real Locus server (a fresh export
//! on loopback, run by `locus_testkit::TestServer` on its own runtime) started once per
//! fuzzing process, and a way to send one input as a whole connection and read the
//! answer. A panic anywhere in the server aborts the process (libFuzzer's panic hook),
//! so a crash is found wherever it happens; each target also checks that the server
//! still answers and that nothing appeared outside the export root.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long an answer to a fuzzed input may pause before the exchange ends.
pub const QUICK: Duration = Duration::from_millis(500);
/// How long the liveness probe waits: long enough that a loaded machine is not taken for
/// a dead endpoint.
pub const PATIENT: Duration = Duration::from_secs(20);

/// Ignores SIGPIPE, as the `locus` program does (Rust's runtime sets it before `main`,
/// which libFuzzer's `main` replaces): a write into a connection the peer closed (the
/// server's `splice` of a file into a socket, say) then fails with `EPIPE` instead of
/// killing the process.
pub fn ignore_sigpipe() {
    // SAFETY: setting a signal's disposition to "ignore" has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Sends `input` on a new connection to `addr`, closes the sending half (if
/// `half_close`: an HTTP server may then drop the connection unanswered, so requests that
/// must be answered say `Connection: close` instead) and reads the answer until the
/// server closes or stays quiet for `quiet`; returns what came back.
pub fn exchange(addr: SocketAddr, input: &[u8], half_close: bool, quiet: Duration) -> Vec<u8> {
    let mut sock = TcpStream::connect(addr).expect("the endpoint accepts connections");
    sock.set_read_timeout(Some(quiet)).unwrap();
    sock.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = sock.write_all(input);
    if half_close {
        let _ = sock.shutdown(Shutdown::Write);
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while answer.len() < 1 << 20 {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    answer
}

/// The names beside the export root (its parent holds `export`, `state` and this
/// target's canary): anything new there escaped the export.
pub fn beside_root(root: &Path) -> Vec<PathBuf> {
    let parent = root.parent().expect("the export has a parent");
    let mut names: Vec<PathBuf> = std::fs::read_dir(parent).unwrap().flatten().map(|e| e.path()).collect();
    names.sort();
    names
}

/// A few files and directories for inputs to find: a file, a directory with a file, and
/// a symbolic link pointing out of the export (which every door must refuse to follow).
pub fn furnish(root: &Path) {
    std::fs::create_dir_all(root.join("d/sub")).unwrap();
    std::fs::write(root.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(root.join("d/sub/b.txt"), b"beta\n").unwrap();
    std::fs::write(root.parent().unwrap().join("canary"), b"outside the export\n").unwrap();
    let _ = std::os::unix::fs::symlink("../canary", root.join("out"));
    let _ = std::os::unix::fs::symlink("/etc/passwd", root.join("abs"));
}
