//! Unmodified programs on a cluster head: `locus mount`, `locus run` and `locus get`
//! read a large file's bytes straight from its data node, not through the head.

use locus_mount::is_mounted;
use locus_testkit::TestServer;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How many times a server has answered operation `op`.
fn answered(server: &TestServer, op: &str) -> u64 {
    server.shared().store.counters().ops().iter().find(|o| o.op == op).map_or(0, |o| o.count)
}

fn locus(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_locus"));
    c.env("LOCUS_HOME", home).env("LOCUS_TOKEN", "admin:admin-token").env_remove("RUST_BACKTRACE");
    c
}

#[test]
fn mount_run_and_get_read_from_the_data_node() {
    let head = TestServer::head(None, |_| {});
    let node = TestServer::data_node(&head);
    let scratch = head.scratch();
    let home = scratch.join("home");
    let data: Vec<u8> = (0..5u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let local = scratch.join("big");
    std::fs::write(&local, &data).unwrap();
    let put = locus(&home).args(["put"]).arg(&local).arg(head.url("/big")).status().unwrap();
    assert!(put.success());

    // locus get
    let got = scratch.join("got");
    assert!(locus(&home).arg("get").arg(head.url("/big")).arg(&got).status().unwrap().success());
    assert_eq!(std::fs::read(&got).unwrap(), data);
    let from_node = answered(&node, "object_read");
    assert!(from_node >= 5, "the node served {from_node} reads");

    // locus run (traced): cat reads it through the client library's handles.
    let out = locus(&home)
        .args(["run", "--interpose", "trace", "--", "cat"])
        .arg(format!("/locus/{}/big", head.addr))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, data);
    assert!(answered(&node, "object_read") > from_node);

    // locus mount
    if Path::new("/dev/fuse").exists() {
        let mnt = scratch.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let mut child = locus(&home).arg("mount").arg(head.url("/")).arg(&mnt).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_mounted(&mnt) {
            assert!(Instant::now() < deadline, "not mounted after 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = answered(&node, "object_read");
        let read = std::fs::read(mnt.join("big"));
        let _ = locus(&home).arg("umount").arg(&mnt).status();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(read.unwrap(), data);
        assert!(answered(&node, "object_read") > before);
    }
    // None of those bytes went through the head.
    assert_eq!(answered(&head, "pread"), 0);
    assert_eq!(answered(&head, "get"), 0);
}
