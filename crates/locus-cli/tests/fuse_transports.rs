//! The kernel's FUSE requests reach `locus mount` and `locus run` by /dev/fuse reads or
//! over io_uring (`--fuse-transport`): the same programs see the same files either way,
//! and each says which it uses. Needs FUSE over io_uring turned on
//! (/sys/module/fuse/parameters/enable_uring, which `.ci/run` sets).

mod common;

use locus_testkit::TestServer;
use std::path::Path;
use std::process::{Command, Stdio};

fn uring_offered() -> bool {
    let on = std::fs::read_to_string(locus_fuse::URING_SETTING).is_ok_and(|v| v.trim() == "Y");
    locus_testkit::require_fuse()
        && locus_testkit::require(
            "FUSE over io_uring",
            on,
            "Linux 6.14 or later; as root: echo Y > /sys/module/fuse/parameters/enable_uring (.ci/run does)",
        )
}

/// Copies, compares, moves, links, appends, truncates, changes modes, lists and
/// removes, in `dir`, with a tree of this repository and a 3 MB file; says what it saw.
fn workload(dir: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../locus-fuse");
    let script = format!(
        "set -e; mkdir -p w/a/b; cp -r {src} w/src; diff -r {src} w/src; \
         head -c 3000000 /dev/urandom > w/big; cp w/big w/big2; cmp w/big w/big2; \
         mv w/big2 w/a/b/moved; ln -s a/b/moved w/link; cmp w/link w/big; \
         echo more >> w/a/b/moved; truncate -s 10 w/a/b/moved; chmod 600 w/a/b/moved; \
         stat -c '%s %a' w/a/b/moved; ls -R w/src | wc -l; rm -r w/src; ls w",
        src = src.display()
    );
    let out = Command::new("sh").arg("-c").arg(&script).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_mount_answers_the_same_over_io_uring_and_over_dev_fuse() {
    if !uring_offered() {
        return;
    }
    let s = TestServer::start();
    let mut seen = Vec::new();
    for (transport, says) in [("uring", "(FUSE over io_uring)"), ("classic", "(/dev/fuse)")] {
        s.put_local(&format!("{transport}/keep"), b"x");
        let mnt = s.scratch().join(format!("mnt-{transport}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let log = s.scratch().join(format!("mount-{transport}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["mount", &s.url(&format!("/{transport}")), "--fuse-transport", transport])
            .arg(&mnt)
            .env("LOCUS_HOME", s.scratch().join("home"))
            .env("LOCUS_TOKEN", "admin:admin-token")
            // A line per request, saying whether it came by a ring or a read.
            .env("LOCUS_LOG", "info,locus_fuse::request=debug")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let m = common::Mount { child, mnt: mnt.canonicalize().unwrap() };
        assert!(common::within(std::time::Duration::from_secs(20), || locus_mount::is_mounted(&m.mnt)));
        seen.push(workload(&m.mnt));
        let said = std::fs::read_to_string(&log).unwrap();
        assert!(said.contains(says), "the mount says how it is served: {said}");
        // And it is: over io_uring, the rings carry the requests (only FORGET and
        // INTERRUPT come by reads); over /dev/fuse, none do.
        let (by_ring, by_read) = (said.matches("(ring ").count(), said.matches("(read)").count());
        match transport {
            "uring" => assert!(by_ring > 100 && by_read < by_ring / 10, "{by_ring} by rings, {by_read} by reads"),
            _ => assert!(by_ring == 0 && by_read > 100, "{by_ring} by rings, {by_read} by reads"),
        }
        // What the programs did is at the server.
        assert_eq!(std::fs::read(s.root().join(transport).join("w/a/b/moved")).unwrap().len(), 10);
        assert!(!s.root().join(transport).join("w/src").exists());
    }
    assert_eq!(seen[0], seen[1]);
    assert!(seen[0].starts_with("10 600\n"), "{}", seen[0]);
}

#[test]
fn locus_run_serves_its_namespace_over_io_uring() {
    if !uring_offered() {
        return;
    }
    let s = TestServer::start();
    s.put_local("r/keep", b"x");
    let home = s.scratch().join("home");
    let remote = format!("/locus/{}/r", s.url("/").trim_start_matches("locus://").trim_end_matches('/'));
    let out = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["run", "--interpose", "fuse", "--keep-warm", "0", "--fuse-transport", "uring", "--"])
        .args(["sh", "-c", &format!("cd {remote} && echo hello > made && cat made keep && ls")])
        .env("LOCUS_HOME", &home)
        .env("LOCUS_TOKEN", "admin:admin-token")
        .env("LOCUS_LOG", "locus_fuse=info,locus_fuse::request=debug")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\nxkeep\nmade\n");
    assert!(stderr.contains("serving by FUSE over io_uring"), "{stderr}");
    assert!(stderr.matches("(ring ").count() > 5, "the rings carry the requests: {stderr}");
    assert_eq!(std::fs::read(s.root().join("r/made")).unwrap(), b"hello\n");
}
