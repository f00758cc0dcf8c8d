//! `locus mount` against a real server: unmodified programs (ls, cp, grep, find, tar,
//! make and cc, Python, a shell that forks and execs) work on the mounted directory and
//! their effects land in the export; errors keep their errno; `locus umount` ends it.
//!
//! Longer than 700 lines because each test file is a binary of its own to build and
//! link in release: the mount's end-to-end tests share one (helpers in `common`).

mod common;

use common::{admin_token, serve, start_chirp, start_locus_chirp, wait_for_port, within, Mount};
use locus_mount::is_mounted as mounted;
use locus_testkit::TestServer;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn sh(dir: &Path, script: &str) -> Output {
    let out = Command::new("sh").arg("-c").arg(script).current_dir(dir).output().expect("sh");
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn mount(s: &TestServer, path: &str) -> Mount {
    mount_url(&s.url(path), s.scratch())
}

fn mount_url(url: &str, scratch: &Path) -> Mount {
    mount_with(url, scratch, "admin-token", &[])
}

/// `locus mount URL SCRATCH/mnt FLAGS...` as admin, once the mount is there.
fn mount_with(url: &str, scratch: &Path, token: &str, flags: &[&str]) -> Mount {
    common::spawn_mount(url, &scratch.join("mnt"), &scratch.join("home"), token, flags)
}

#[test]
fn unmodified_programs_work_on_the_mount() {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("data/notes.txt", b"alpha\nbeta\n");
    let mut m = mount(&s, "/data");
    let mnt = m.mnt.clone();
    let out = sh(&mnt, "ls -la");
    assert!(String::from_utf8_lossy(&out.stdout).contains("notes.txt"));

    // A small C project: copied in, searched, built with make, run, archived both ways.
    let src = s.scratch().join("proj");
    std::fs::create_dir_all(src.join("lib")).unwrap();
    std::fs::write(src.join("lib/greet.c"), "#include <stdio.h>\nvoid greet(void) { puts(\"hello from locus\"); }\n")
        .unwrap();
    std::fs::write(src.join("main.c"), "void greet(void);\nint main(void) { greet(); return 0; }\n").unwrap();
    std::fs::write(src.join("Makefile"), "hello: main.o lib/greet.o\n\tcc -o $@ $^\n%.o: %.c\n\tcc -c -o $@ $<\n")
        .unwrap();
    sh(&mnt, &format!("cp -r {} proj", src.display()));
    let out = sh(&mnt, "grep -rn greet proj | sort");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 4, "two C files and the Makefile");
    let out = sh(&mnt, "find . -name '*.c' | sort");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "./proj/lib/greet.c\n./proj/main.c\n");
    sh(&mnt, "cd proj && make -s");
    let out = sh(&mnt, "./proj/hello");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from locus\n");
    assert!(s.local("data/proj/hello").exists(), "the build landed in the export");
    let tarball = s.scratch().join("proj.tar");
    sh(&mnt, &format!("tar cf {} proj", tarball.display()));
    sh(&mnt, &format!("mkdir back && tar xf {} -C back && diff -r proj back/proj", tarball.display()));

    // Python reads and writes; a shell forks and execs children that share the files.
    sh(&mnt, "python3 -c \"open('py.txt','w').write('x'*100000); assert len(open('py.txt').read()) == 100000\"");
    assert_eq!(std::fs::metadata(s.local("data/py.txt")).unwrap().len(), 100000);
    // Times set on an open file (cp -p: futimens, sent behind the writes) and by path
    // (touch -d) reach the server; extended attributes are not supported, as the kernel
    // says to programs.
    let stamped = s.scratch().join("stamped.txt");
    std::fs::write(&stamped, b"old news").unwrap();
    sh(&mnt, &format!("touch -d @1234567890 {} && cp -p {} copy.txt", stamped.display(), stamped.display()));
    sh(&mnt, "touch -d @1000000000 py.txt");
    let mtime = |p: &str| std::fs::metadata(s.local(p)).unwrap().modified().unwrap();
    assert_eq!(mtime("data/copy.txt"), std::time::UNIX_EPOCH + Duration::from_secs(1234567890));
    assert_eq!(mtime("data/py.txt"), std::time::UNIX_EPOCH + Duration::from_secs(1000000000));
    assert_eq!(std::fs::read(s.local("data/copy.txt")).unwrap(), b"old news");
    sh(&mnt, "python3 -c \"import os, errno\ntry: os.getxattr('copy.txt', 'user.x')\nexcept OSError as e: assert e.errno == errno.EOPNOTSUPP, e\"");
    let out = sh(&mnt, "(echo one > kids.txt; sh -c 'echo two >> kids.txt'; cat kids.txt) | wc -l");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");

    // Renames, links, removal while open, errors with their errno.
    sh(
        &mnt,
        "mv notes.txt renamed.txt && ln -s renamed.txt link && test \"$(cat link)\" = \"$(printf 'alpha\\nbeta')\"",
    );
    sh(&mnt, "exec 3<renamed.txt; rm renamed.txt; test \"$(cat <&3)\" = \"$(printf 'alpha\\nbeta')\"");
    let out = Command::new("cat").arg(mnt.join("missing")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));
    let out = Command::new("rmdir").arg(mnt.join("proj")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Directory not empty"));
    sh(&mnt, "rm -r proj back && ls");
    assert!(!s.local("data/proj").exists());

    // `locus umount` ends the mount and its process.
    let status = Command::new(env!("CARGO_BIN_EXE_locus")).arg("umount").arg(&mnt).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "locus mount did not exit after the unmount");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!mounted(&mnt));
}

/// True when FUSE is here; fails the test when it is not (see `locus_testkit::require`).
fn fuse_available() -> bool {
    locus_testkit::require_fuse()
}

#[test]
fn the_chirp_driver_mounts_a_chirp_server() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (root, chirp) = start_chirp(work.path());
    mount_chirp_and_work(chirp.addr, &root, work.path());
}

#[test]
fn the_chirp_driver_mounts_locus_own_chirp_endpoint() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (server, addr) = start_locus_chirp();
    mount_chirp_and_work(addr, &server.root(), work.path());
}

/// Mounts the Chirp server at `addr` (exporting `root`, which holds docs/readme.txt) and
/// works on it as a user would: lists, reads after an idle drop, copies a source tree in
/// and out, renames, links and removes.
fn mount_chirp_and_work(addr: std::net::SocketAddr, root: &Path, work: &Path) {
    let m = mount_url(&format!("chirp://{addr}/"), work);
    let mnt = m.mnt.clone();
    let out = sh(&mnt, "ls -la docs && cat docs/readme.txt");
    assert!(String::from_utf8_lossy(&out.stdout).contains("chirp says hi"));
    std::thread::sleep(Duration::from_millis(2500));
    let out = sh(&mnt, "cat docs/readme.txt && mkdir after-idle");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("chirp says hi"),
        "after chirp_server dropped the idle client"
    );
    // A real source tree: this repository's protocol crate.
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../locus-proto");
    sh(&mnt, &format!("mkdir src && cp -r {} src/proto && grep -rl operation_table src | head -1", proto.display()));
    let here = sh(&proto, "find . -name '*.rs' | sort");
    let there = sh(&mnt.join("src/proto"), "find . -name '*.rs' | sort");
    assert_eq!(here.stdout, there.stdout, "find sees what cp wrote");
    assert!(root.join("src/proto/src/lib.rs").is_file(), "the copy is on the chirp server");
    let tarball = work.join("src.tar");
    sh(
        &mnt,
        &format!(
            "tar cf {} src && mkdir back && tar xf {} -C back && diff -r src back/src",
            tarball.display(),
            tarball.display()
        ),
    );
    sh(
        &mnt,
        "mv docs/readme.txt docs/moved.txt && ln -s moved.txt docs/link && test \"$(cat docs/link)\" = 'chirp says hi'",
    );
    let out = Command::new("cat").arg(mnt.join("docs/missing")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));
    sh(&mnt, "rm -r src back && df . >/dev/null");
    assert!(!root.join("src").exists());
}

#[test]
fn the_http_driver_reads_through_a_real_http_server() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let www = work.path().join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(www.join("big.bin"), &big).unwrap();
    std::fs::write(www.join("sub/a.txt"), "over http\n").unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = Command::new("python3")
        .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1"])
        .current_dir(&www)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    wait_for_port(port, "http.server");
    let m = mount_url(&format!("http://127.0.0.1:{port}/"), work.path());
    let mnt = m.mnt.clone();
    assert_eq!(std::fs::read_to_string(mnt.join("sub/a.txt")).unwrap(), "over http\n");
    assert_eq!(std::fs::read(mnt.join("big.bin")).unwrap(), big, "ranged reads put the file together");
    assert_eq!(std::fs::metadata(mnt.join("big.bin")).unwrap().len(), 300_000);
    assert!(std::fs::metadata(mnt.join("sub")).unwrap().is_dir());
    let e = std::fs::write(mnt.join("new"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_erofs()), "read-only: {e}");
    let e = std::fs::read_dir(&mnt).and_then(|mut d| d.next().transpose()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(95), "no listings over HTTP: {e}");
    assert_eq!(std::fs::read(mnt.join("nothing")).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    drop(m);
    let _ = server.kill();
    let _ = server.wait();
}

/// EROFS on Linux.
fn libc_erofs() -> i32 {
    30
}

#[test]
fn a_server_restarted_within_the_retry_window_is_invisible_and_one_that_stays_down_is_eio() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (root, state) = (work.path().join("root"), work.path().join("state"));
    std::fs::create_dir_all(&root).unwrap();
    for name in ["f.txt", "g.txt", "h.txt"] {
        std::fs::write(root.join(name), "still here\n").unwrap();
    }
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = serve(&root, &state, port);
    let token = admin_token(&state);
    let m = mount_with(&format!("locus://127.0.0.1:{port}/"), work.path(), &token, &["--retry-secs", "3"]);
    let mnt = m.mnt.clone();
    assert_eq!(std::fs::read_to_string(mnt.join("f.txt")).unwrap(), "still here\n");

    // Killed mid-run and back within the window: the program does not notice. (Each
    // step reads a file not read before: the kernel's cache would answer for f.txt.)
    server.kill().unwrap();
    server.wait().unwrap();
    // What the lost connection's callbacks covered is dropped: a change made while the
    // server was down shows once it is back.
    std::fs::write(root.join("f.txt"), "changed while down\n").unwrap();
    let restarter = {
        let (root, state) = (root.clone(), state.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(800));
            serve(&root, &state, port)
        })
    };
    let started = Instant::now();
    assert_eq!(std::fs::read_to_string(mnt.join("g.txt")).unwrap(), "still here\n");
    assert!(started.elapsed() >= Duration::from_millis(500), "the read waited for the server");
    let mut server = restarter.join().unwrap();
    assert_eq!(std::fs::read_to_string(mnt.join("f.txt")).unwrap(), "changed while down\n");

    // Down for longer than the window: the call fails with EIO, after about the window.
    server.kill().unwrap();
    server.wait().unwrap();
    let started = Instant::now();
    let e = std::fs::read_to_string(mnt.join("h.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5), "EIO: {e}");
    assert!(started.elapsed() >= Duration::from_secs(2), "gave up after {:?}", started.elapsed());
}

/// How many of `path`'s pages the kernel holds in its page cache (opening the file as
/// any program would, so the mount decides at this open whether they stay).
fn cached_pages(path: &Path) -> usize {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096;
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below; mincore
    // writes one byte per page into a vector of that many.
    unsafe {
        let at = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(at, libc::MAP_FAILED, "mmap {}", path.display());
        let mut resident = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(at, len, resident.as_mut_ptr()), 0, "mincore");
        libc::munmap(at, len);
        resident.iter().filter(|&&b| b & 1 == 1).count()
    }
}

#[test]
fn a_reconnect_revalidates_the_cache_keeping_what_did_not_change() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (root, state) = (work.path().join("root"), work.path().join("state"));
    std::fs::create_dir_all(root.join("d")).unwrap();
    let same: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("same.bin"), &same).unwrap();
    std::fs::write(root.join("changed.txt"), "before\n").unwrap();
    std::fs::write(root.join("d/x"), "x").unwrap();
    std::fs::write(root.join("gone.txt"), "gone").unwrap();
    std::fs::write(root.join("d/deep.bin"), &same).unwrap();
    std::fs::write(root.join("d/restored.txt"), "aaaa").unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = serve(&root, &state, port);
    let token = admin_token(&state);
    // A long attribute timeout: only callbacks (and their loss) make changes show.
    let flags = ["--attr-timeout-ms", "600000", "--retry-secs", "10"];
    let m = mount_with(&format!("locus://127.0.0.1:{port}/"), work.path(), &token, &flags);
    let mnt = m.mnt.clone();
    assert_eq!(std::fs::read(mnt.join("same.bin")).unwrap(), same);
    assert_eq!(std::fs::read_to_string(mnt.join("changed.txt")).unwrap(), "before\n");
    assert_eq!(listed(&mnt.join("d")), ["deep.bin", "restored.txt", "x"]);
    assert_eq!(std::fs::read_to_string(mnt.join("gone.txt")).unwrap(), "gone");
    assert_eq!(std::fs::read(mnt.join("d/deep.bin")).unwrap(), same);
    assert_eq!(std::fs::read_to_string(mnt.join("d/restored.txt")).unwrap(), "aaaa");
    assert!(!mnt.join("d/later.txt").exists(), "absent, and the kernel is told so until a break");
    let pages = same.len() / 4096;
    assert_eq!(cached_pages(&mnt.join("same.bin")), pages, "read once: every page cached");
    assert_eq!(cached_pages(&mnt.join("d/deep.bin")), pages, "read once: every page cached");

    // The server goes (its promises with it) and comes back; meanwhile a file and a
    // directory change beside it.
    server.kill().unwrap();
    server.wait().unwrap();
    std::fs::write(root.join("changed.txt"), "after, and longer\n").unwrap();
    std::fs::write(root.join("d/y"), "y").unwrap();
    std::fs::remove_file(root.join("gone.txt")).unwrap();
    std::fs::write(root.join("d/later.txt"), "made while away").unwrap();
    // Rewritten with the same size, its modification time set back (as `cp -p` or a
    // restore would): only its change time tells.
    let restored = root.join("d/restored.txt");
    let mtime = std::fs::metadata(&restored).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&restored, "bbbb").unwrap();
    std::fs::File::options().write(true).open(&restored).unwrap().set_modified(mtime).unwrap();
    let _server = common::KillOnDrop(serve(&root, &state, port));
    // The lost promises make the kernel look again: the new size shows.
    assert!(
        within(Duration::from_secs(15), || std::fs::metadata(mnt.join("changed.txt")).is_ok_and(|m| m.len() == 18)),
        "the change made while the server was away does not show"
    );
    // The callback listener connects again too (every 0.5 s), and the next call takes
    // the promises up again, which again says that everything may have changed.
    std::thread::sleep(Duration::from_secs(3));
    let _ = std::fs::metadata(mnt.join("changed.txt"));
    std::thread::sleep(Duration::from_millis(300));
    // Revalidated, not dropped: the unchanged files keep their pages, at the top and
    // below, and what changed reads as the server has it now.
    // (Kept, not dropped: a dropped cache holds none; the kernel may have let a page go
    // on its own meanwhile.)
    let kept = |p: &str| cached_pages(&mnt.join(p)) >= pages * 9 / 10;
    assert!(kept("same.bin"), "the unchanged file's pages were dropped: {}", cached_pages(&mnt.join("same.bin")));
    assert!(
        kept("d/deep.bin"),
        "the unchanged file's pages were dropped (in d): {}",
        cached_pages(&mnt.join("d/deep.bin"))
    );
    assert_eq!(std::fs::read_to_string(mnt.join("d/restored.txt")).unwrap(), "bbbb", "same size and mtime, new bytes");
    assert_eq!(std::fs::read_to_string(mnt.join("d/later.txt")).unwrap(), "made while away", "an absent name shows");
    assert_eq!(std::fs::read(mnt.join("same.bin")).unwrap(), same);
    assert_eq!(std::fs::read_to_string(mnt.join("changed.txt")).unwrap(), "after, and longer\n");
    assert_eq!(listed(&mnt.join("d")), ["deep.bin", "later.txt", "restored.txt", "x", "y"]);
    // A file removed meanwhile, whose pages were cached too, is gone at its next look.
    let e = std::fs::read_to_string(mnt.join("gone.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    assert!(within(Duration::from_secs(2), || !listed(&mnt).contains(&"gone.txt".to_string())));
    assert!(within(Duration::from_secs(2), || !mnt.join("gone.txt").exists()));
}

#[test]
fn nfs_mode_shows_changes_by_others_within_the_attribute_timeout_and_our_own_at_once() {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/old.txt", b"old");
    let m = mount_with(&s.url("/d"), s.scratch(), "admin-token", &["--attr-timeout-ms", "300", "--consistency", "nfs"]);
    let mnt = m.mnt.clone();
    // The mount's own changes show at once, through its listings and attribute cache.
    sh(&mnt, "ls >/dev/null && echo hello > mine.txt && test \"$(cat mine.txt)\" = hello && rm old.txt");
    sh(&mnt, "test ! -e old.txt && mkdir sub && test -z \"$(ls sub)\" && mv mine.txt sub/ && ls sub | grep -q mine");
    let size = |p: &str| sh(&mnt, &format!("stat -c %s {p}")).stdout;
    sh(&mnt, "printf 'more and more' >> sub/mine.txt");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(size("sub/mine.txt"), b"19\n", "a written file's size after its entry expired");
    // Another client's changes show once the listing is older than the timeout.
    s.put_local("d/theirs.txt", b"from elsewhere");
    std::fs::remove_file(s.local("d/sub/mine.txt")).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    sh(&mnt, "test \"$(cat theirs.txt)\" = 'from elsewhere' && test ! -e sub/mine.txt");
    // Reopened within the timeout, a file is not asked for again; after it, its new
    // content shows.
    sh(&mnt, "test \"$(cat theirs.txt)\" = 'from elsewhere'");
    s.put_local("d/theirs.txt", b"rewritten elsewhere");
    std::thread::sleep(Duration::from_millis(400));
    sh(&mnt, "test \"$(cat theirs.txt)\" = 'rewritten elsewhere' && exec 3<theirs.txt && rm theirs.txt && cat <&3 >/dev/null");
}

#[test]
fn what_a_program_writes_it_reads_back_exactly_and_without_asking_the_server() {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/keep.txt", b"x");
    let m = mount_with(&s.url("/d"), s.scratch(), "admin-token", &["--attr-timeout-ms", "300", "--consistency", "nfs"]);
    let preads = || {
        let report = s.shared().store.stats("admin", 0).unwrap();
        report.ops.iter().find(|o| o.op == "pread").map_or(0, |o| o.count)
    };
    // Writes in pieces that cover pages only in part, seeks back, reads, a truncation:
    // the descriptor reads back exactly what it wrote, as a local file would.
    let script = r#"
expected = bytearray()
def put(f, at, data):
    global expected
    f.seek(at); f.write(data)
    if len(expected) < at + len(data):
        expected.extend(bytes(at + len(data) - len(expected)))
    expected[at:at + len(data)] = data
with open("out.bin", "w+b", buffering=0) as f:
    put(f, 0, b"a" * 5000)
    put(f, 10000, b"b" * 100)
    put(f, 3, b"XYZ")
    f.seek(0); assert f.read() == bytes(expected), "read back"
    f.truncate(7000); del expected[7000:]
    f.seek(4090); assert f.read(20) == bytes(expected[4090:4110]), "read after truncate"
    put(f, 6998, b"tail")
    f.seek(0); assert f.read() == bytes(expected), "read after extending"
open("expected.bin", "wb").write(bytes(expected))
"#;
    let before = preads();
    sh(&m.mnt, &format!("python3 -c '{script}'"));
    assert_eq!(preads(), before, "what the mount wrote whole came back from the mount");
    // Another process reads both files back, from the kernel's cache, exactly.
    sh(&m.mnt, "cmp out.bin expected.bin");
    assert_eq!(preads(), before, "a file the mount wrote whole is cached whole");
    assert_eq!(std::fs::read(s.local("d/out.bin")).unwrap(), std::fs::read(s.local("d/expected.bin")).unwrap());
    assert_eq!(std::fs::metadata(s.local("d/out.bin")).unwrap().len(), 7002);
    // Rewritten by another client with the same size: shown once the timeout has passed.
    let mut other = std::fs::read(s.local("d/out.bin")).unwrap();
    other[0] = b'Z';
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(s.local("d/out.bin"), &other).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(sh(&m.mnt, "head -c 1 out.bin").stdout, b"Z");
}

#[test]
fn opening_an_invocation_on_the_mount_runs_the_handler() {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.add_handler("csv", &locus_testkit::build_storelet("csv"), &[]);
    s.put_local("data/sales.csv", b"region,price\nnorth,10\nsouth,5\nnorth,7\n");
    let m = mount(&s, "/data");
    // Listed first: the mount must still ask for names that invoke handlers.
    let out = sh(&m.mnt, "ls && cat csv@sales.csv,-sum,price && cat %2Fopt%2Fcsv+sales.csv+-count");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sales.csv\n22\n3\n");
    // make sees an active file as a prerequisite that exists, and reads it.
    std::fs::write(s.local("data/Makefile"), "total.txt: csv@sales.csv,-sum,price\n\tcp $< $@\n").unwrap();
    // Written beside the server: it shows in the directory's listing (which make reads)
    // once the server's watcher has broken the mount's callback on the directory. (A
    // lookup by name may find it a moment before, as the server is asked.)
    let shown = within(Duration::from_secs(2), || listed(&m.mnt).iter().any(|n| n == "Makefile"));
    assert!(shown, "the Makefile written beside the server never showed");
    sh(&m.mnt, "make -s");
    assert_eq!(std::fs::read_to_string(s.local("data/total.txt")).unwrap(), "22\n");
    let missing = Command::new("cat").arg(m.mnt.join("nothing@sales.csv")).output().unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("No such file"));

    // An unmodified reader streams the output while the handler is still writing it.
    s.add_handler("gated", locus_testkit::GATED_HANDLER.as_bytes(), &[]);
    let mut cat = Command::new("cat").arg(m.mnt.join("gated@")).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut out = cat.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut first = [0u8; 6];
        out.read_exact(&mut first).unwrap();
        tx.send(first.to_vec()).unwrap();
        let mut rest = Vec::new();
        out.read_to_end(&mut rest).unwrap();
        tx.send(rest).unwrap();
    });
    let first = rx.recv_timeout(Duration::from_secs(10));
    if first.is_err() {
        let _ = cat.kill();
    }
    assert_eq!(first.expect("the first bytes before the handler ends"), b"first\n");
    s.put_local("data/gate", b"");
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), b"second\n");
    assert!(cat.wait().unwrap().success());
}

/// `mount_with` on `SCRATCH/NAME` rather than `SCRATCH/mnt`, for a second mount.
fn mount_at(url: &str, scratch: &Path, name: &str, flags: &[&str]) -> Mount {
    client_at(Via::Mount, url, scratch, name, flags)
}

/// How a test's client reaches the server: `locus mount`, or the namespace of a
/// `locus run` (the same file system, served by the run's agent).
#[derive(Clone, Copy)]
enum Via {
    Mount,
    Run,
}

/// A client of `url` as `via` says, named `name` in `scratch` (its mount point, or its
/// run's `LOCUS_HOME`: runs with different homes have agents of their own).
fn client_at(via: Via, url: &str, scratch: &Path, name: &str, flags: &[&str]) -> Mount {
    let dir = scratch.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    match via {
        Via::Mount => mount_with(url, &dir, "admin-token", flags),
        Via::Run => common::spawn_run(url, &dir.join("home"), "admin-token", flags),
    }
}

/// `s`'s `/d` through `via` with `--consistency afs`, named `name` in its scratch
/// directory, with the copies in the scratch's `cache`.
fn afs_client_at(via: Via, s: &TestServer, name: &str) -> Mount {
    let cache = s.scratch().join("cache");
    client_at(via, &s.url("/d"), s.scratch(), name, &["--consistency", "afs", "--cache-dir", cache.to_str().unwrap()])
}

/// Each test named, as two tests: through `locus mount` (`via_mount::NAME`) and through
/// `locus run` (`via_run::NAME`).
macro_rules! through_mount_and_run {
    ($($name:ident),* $(,)?) => {
        mod via_mount {
            $(#[test] fn $name() { super::$name(super::Via::Mount) })*
        }
        mod via_run {
            $(#[test] fn $name() { super::$name(super::Via::Run) })*
        }
    };
}

through_mount_and_run!(
    callbacks_let_a_mount_cache_until_another_client_changes_the_file,
    a_small_file_opens_and_reads_in_one_request_and_shows_another_clients_change,
    a_walk_has_listings_read_ahead_and_never_an_out_of_date_one,
    a_walk_on_an_afs_mount_lists_a_file_made_there_and_not_stored_yet,
    afs_mode_stores_a_written_file_at_close_and_reports_a_failed_store_there,
    afs_mode_removes_without_waiting_and_in_order,
    a_removal_sent_without_waiting_that_the_server_refuses_shows_the_name_again,
    afs_mode_renames_without_waiting_and_in_order,
    a_rename_sent_without_waiting_that_the_server_refuses_leaves_the_names_as_they_were,
);

fn callbacks_let_a_mount_cache_until_another_client_changes_the_file(via: Via) {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/f.txt", b"one");
    s.put_local("d/sub/g.txt", b"gee");
    // A long attribute timeout: only callbacks can make changes show.
    let flags = ["--attr-timeout-ms", "600000"];
    let a = client_at(via, &s.url("/d"), s.scratch(), "a", &flags);
    let b = client_at(via, &s.url("/d"), s.scratch(), "b", &flags);
    let read = |m: &Mount, p: &str| std::fs::read_to_string(m.mnt.join(p)).unwrap_or_else(|e| format!("error: {e}"));
    let names = |m: &Mount, p: &str| {
        let mut v: Vec<String> =
            std::fs::read_dir(m.mnt.join(p)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v.join(" ")
    };
    // Both cache the file, its attributes and the listings.
    assert_eq!(read(&a, "f.txt"), "one");
    assert_eq!(read(&b, "f.txt"), "one");
    assert_eq!(names(&b, "."), "f.txt sub");
    assert_eq!(names(&b, "sub"), "g.txt");
    let held = s.shared().callbacks.held();
    assert!(held >= 4, "the server holds the mounts' promises ({held})");

    // A writes through its mount: B's kernel cache is invalidated and B reads the new
    // bytes, with the new size.
    std::fs::write(a.mnt.join("f.txt"), "two, longer").unwrap();
    assert!(
        within(Duration::from_secs(2), || read(&b, "f.txt") == "two, longer"),
        "B still reads {:?}",
        read(&b, "f.txt")
    );
    assert_eq!(std::fs::metadata(b.mnt.join("f.txt")).unwrap().len(), 11);
    // Names made, renamed and removed by A show in B's listings and lookups.
    std::fs::write(a.mnt.join("sub/new.txt"), "new").unwrap();
    assert!(within(Duration::from_secs(2), || names(&b, "sub") == "g.txt new.txt"), "B lists {}", names(&b, "sub"));
    std::fs::rename(a.mnt.join("sub/g.txt"), a.mnt.join("g2.txt")).unwrap();
    assert!(within(Duration::from_secs(2), || names(&b, "sub") == "new.txt" && names(&b, ".") == "f.txt g2.txt sub"));
    assert_eq!(read(&b, "g2.txt"), "gee");
    assert!(!b.mnt.join("sub/g.txt").exists());
    std::fs::remove_file(a.mnt.join("f.txt")).unwrap();
    assert!(within(Duration::from_secs(2), || !b.mnt.join("f.txt").exists()));
    // A name B looked up and did not find appears once A makes it.
    assert!(!b.mnt.join("later.txt").exists());
    std::fs::write(a.mnt.join("later.txt"), "late").unwrap();
    assert!(within(Duration::from_secs(2), || read(&b, "later.txt") == "late"));
    // A client through the protocol (the CLI) breaks the mounts' callbacks too.
    let local = s.scratch().join("from-cli.txt");
    std::fs::write(&local, "from the cli").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_locus"))
        .arg("put")
        .arg(&local)
        .arg(s.url("/d/later.txt"))
        .env("LOCUS_HOME", s.scratch().join("home"))
        .env("LOCUS_TOKEN", "admin:admin-token")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(within(Duration::from_secs(2), || read(&a, "later.txt") == "from the cli"
        && read(&b, "later.txt") == "from the cli"));

    // So does a change made beside the server, in the export itself.
    std::fs::write(s.local("d/later.txt"), "edited on the server").unwrap();
    std::fs::write(s.local("d/sub/local.txt"), "made on the server").unwrap();
    let seen = |m: &Mount| read(m, "later.txt") == "edited on the server" && names(m, "sub") == "local.txt new.txt";
    assert!(
        within(Duration::from_secs(2), || seen(&a) && seen(&b)),
        "{} / {}",
        read(&a, "later.txt"),
        names(&b, "sub")
    );

    // A mount's promises go with its connection.
    drop(b);
    let before = s.shared().callbacks.held();
    drop(a);
    assert!(within(Duration::from_secs(5), || s.shared().callbacks.held() == 0), "{before} promises left");
}

/// The same on a cluster: two heads on one PostgreSQL namespace, a mount on each; a
/// change made through one mount shows in the other, whose kernel was told to cache for
/// ten minutes, because the first head's change reaches the second head's promises.
#[test]
fn callbacks_reach_a_mount_on_another_head() {
    if !fuse_available() || !locus_testkit::require_postgres() {
        return;
    }
    let pg = locus_testkit::TestPostgres::start();
    let first = TestServer::head(Some(&pg.url()), |_| {});
    let second = TestServer::head(Some(&pg.url()), |_| {});
    let _node = TestServer::data_node(&first);
    let big: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 241) as u8).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let admin = first.client("admin").await;
        admin.mkdir("/d", 0o755).await.unwrap();
        admin.write_file("/d/f.txt", 0o644, b"one").await.unwrap();
        admin.write_file("/d/big", 0o644, &big).await.unwrap();
    });
    let flags = ["--attr-timeout-ms", "600000", "--consistency", "afs"];
    let a = mount_at(&first.url("/d"), first.scratch(), "a", &flags);
    let b = mount_at(&second.url("/d"), second.scratch(), "b", &flags);
    let read = |m: &Mount, p: &str| std::fs::read_to_string(m.mnt.join(p)).unwrap_or_else(|e| format!("error: {e}"));
    let names = |m: &Mount| {
        let mut v: Vec<String> =
            std::fs::read_dir(&m.mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v.join(" ")
    };
    assert_eq!(read(&a, "f.txt"), "one");
    assert_eq!(read(&b, "f.txt"), "one");
    assert_eq!(std::fs::read(b.mnt.join("big")).unwrap(), big);
    assert_eq!(names(&b), "big f.txt");
    assert!(second.shared().callbacks.held() >= 3, "the second head holds B's promises");

    std::fs::write(a.mnt.join("f.txt"), "two, longer").unwrap();
    assert!(within(Duration::from_secs(3), || read(&b, "f.txt") == "two, longer"), "B reads {:?}", read(&b, "f.txt"));
    let mut bigger = big.clone();
    bigger.extend_from_slice(b"more");
    std::fs::write(a.mnt.join("big"), &bigger).unwrap();
    assert!(within(Duration::from_secs(3), || std::fs::read(b.mnt.join("big")).unwrap() == bigger));
    std::fs::write(a.mnt.join("new.txt"), "new").unwrap();
    assert!(within(Duration::from_secs(3), || names(&b) == "big f.txt new.txt"), "B lists {}", names(&b));
    std::fs::remove_file(a.mnt.join("f.txt")).unwrap();
    assert!(within(Duration::from_secs(3), || !b.mnt.join("f.txt").exists()));
    // And the other way round, on a file A has cached.
    assert_eq!(read(&a, "new.txt"), "new");
    std::fs::write(b.mnt.join("new.txt"), "changed by b").unwrap();
    assert!(
        within(Duration::from_secs(3), || read(&a, "new.txt") == "changed by b"),
        "A reads {:?}",
        read(&a, "new.txt")
    );
}

/// How many requests of operation `op` the server has answered.
fn served(s: &TestServer, op: &str) -> u64 {
    let stats = s.shared().store.stats("admin", 0).unwrap();
    stats.ops.iter().filter(|o| o.op.eq_ignore_ascii_case(op)).map(|o| o.count).sum()
}

fn a_small_file_opens_and_reads_in_one_request_and_shows_another_clients_change(via: Via) {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/small.txt", b"one");
    let m = client_at(via, &s.url("/d"), s.scratch(), "a", &["--attr-timeout-ms", "600000"]);
    let file = m.mnt.join("small.txt");
    assert_eq!(listed(&m.mnt), ["small.txt"]);
    let (gets, opens) = (served(&s, "get"), served(&s, "open"));
    let kept = std::fs::File::open(&file).unwrap();
    let read_at = |f: &std::fs::File| {
        let mut buf = [0u8; 64];
        let n = std::os::unix::fs::FileExt::read_at(f, &mut buf, 0).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(read_at(&kept), "one");
    assert_eq!((served(&s, "get") - gets, served(&s, "open") - opens), (1, 0), "one get, no open");
    // The handle reads what it fetched until another client changes the file: then it
    // reads the new bytes, as a handle open at the server would.
    std::fs::write(s.local("d/small.txt"), "two, longer").unwrap();
    assert!(within(Duration::from_secs(2), || read_at(&kept) == "two, longer"), "kept: {}", read_at(&kept));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "two, longer");
    // A file that is not there is refused at open, as before.
    let e = std::fs::File::open(m.mnt.join("absent.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(2), "ENOENT: {e}");
}

fn a_walk_has_listings_read_ahead_and_never_an_out_of_date_one(via: Via) {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    for dir in ["a/x", "a/y", "b/x", "b/y/deep", "c"] {
        s.put_local(&format!("d/t/{dir}/f.txt"), dir.as_bytes());
    }
    let m = client_at(via, &s.url("/d"), s.scratch(), "a", &["--attr-timeout-ms", "600000"]);
    let names = |p: &str| {
        let mut v: Vec<String> =
            std::fs::read_dir(m.mnt.join(p)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v.join(" ")
    };
    // Listing t, then one of its subdirectories, is a walk: the others, and what they
    // hold, are asked for before the program gets to them.
    assert_eq!(names("t"), "a b c");
    let before = served(&s, "readdir");
    assert_eq!(names("t/a"), "x y");
    assert!(
        within(Duration::from_secs(2), || served(&s, "readdir") >= before + 5),
        "{} listings after reading t/a",
        served(&s, "readdir") - before
    );
    // A name made through the mount after its directory's listing was asked for shows.
    std::fs::write(m.mnt.join("t/b/new.txt"), "new").unwrap();
    assert_eq!(names("t/b"), "new.txt x y");
    // So does one made by another client, once its break has come.
    std::fs::write(s.local("d/t/c/other.txt"), "other").unwrap();
    assert!(within(Duration::from_secs(2), || names("t/c") == "f.txt other.txt"), "t/c: {}", names("t/c"));
    // And a whole walk reads what the export holds.
    let walk = |root: &Path| {
        let out = Command::new("find").arg(".").current_dir(root).output().unwrap();
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    assert_eq!(walk(&m.mnt), walk(&s.local("d")));
}

fn a_walk_on_an_afs_mount_lists_a_file_made_there_and_not_stored_yet(via: Via) {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    for dir in ["a", "b"] {
        s.put_local(&format!("d/t/{dir}/f.txt"), dir.as_bytes());
    }
    let m = afs_client_at(via, &s, "a");
    // t/b listed and written in: a new file there is made in a local copy only, and
    // stays so while it is open.
    assert_eq!(listed(&m.mnt.join("t/b")), ["f.txt"]);
    std::fs::write(m.mnt.join("t/b/first.txt"), "first").unwrap();
    let mut open = std::fs::File::create(m.mnt.join("t/b/new.txt")).unwrap();
    std::io::Write::write_all(&mut open, b"not stored yet").unwrap();
    assert!(!s.local("d/t/b/new.txt").exists(), "made locally");
    // A walk from t asks for t/b's listing ahead, before the new file is at the server;
    // reading t/b stores it first and must show it.
    assert_eq!(listed(&m.mnt.join("t")), ["a", "b"]);
    assert_eq!(listed(&m.mnt.join("t/a")), ["f.txt"]);
    assert_eq!(listed(&m.mnt.join("t/b")), ["f.txt", "first.txt", "new.txt"]);
    drop(open);
}

#[test]
fn a_directory_made_beside_the_server_is_watched_once_the_mount_lists_it() {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/f.txt", b"f");
    let m = mount_at(&s.url("/d"), s.scratch(), "a", &["--attr-timeout-ms", "600000"]);
    let shows = |p: &str| within(Duration::from_secs(2), || m.mnt.join(p).exists());
    // Looked up while missing, then made beside the server, listed, then filled there.
    assert!(!m.mnt.join("new/inside.txt").exists());
    std::fs::create_dir(s.local("d/new")).unwrap();
    assert!(shows("new"), "the new directory never showed");
    assert_eq!(std::fs::read_dir(m.mnt.join("new")).unwrap().count(), 0);
    std::fs::write(s.local("d/new/inside.txt"), b"x").unwrap();
    assert!(shows("new/inside.txt"), "a file made in it beside the server never showed");
}

/// Runs Python's `code` in `dir`; answers whether it succeeded, and its stderr.
fn python(dir: &Path, code: &str) -> (bool, String) {
    let out = Command::new("python3").arg("-c").arg(code).current_dir(dir).output().expect("python3");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn afs_mode_stores_a_written_file_at_close_and_reports_a_failed_store_there(via: Via) {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/old.txt", b"old");
    let cache = s.scratch().join("cache");
    let afs = ["--consistency", "afs", "--cache-dir", cache.to_str().unwrap()];
    let a = client_at(via, &s.url("/d"), s.scratch(), "a", &afs);
    let b = client_at(via, &s.url("/d"), s.scratch(), "b", &[]);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| format!("error: {e}"));
    // The first file made goes to the server: it says the mount may write there.
    std::fs::write(a.mnt.join("first.txt"), "first").unwrap();
    assert_eq!(read(&s.local("d/first.txt")), "first");

    // An existing file opened for writing is written locally and stored at close.
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(a.mnt.join("old.txt")).unwrap();
    std::io::Write::write_all(&mut f, b"new content").unwrap();
    assert_eq!(read(&s.local("d/old.txt")), "old", "stored before close");
    assert_eq!(read(&a.mnt.join("old.txt")), "new content", "the writer's mount reads its own writes");
    assert_eq!(read(&b.mnt.join("old.txt")), "old");
    drop(f);
    assert_eq!(read(&s.local("d/old.txt")), "new content");
    assert!(
        within(Duration::from_secs(2), || read(&b.mnt.join("old.txt")) == "new content"),
        "B is never stale after close"
    );

    // A new file is made at the server by its first store; fsync stores.
    let _ = std::fs::read_dir(&a.mnt).unwrap().count();
    let mut f = std::fs::File::create(a.mnt.join("made.txt")).unwrap();
    std::io::Write::write_all(&mut f, b"made here").unwrap();
    assert!(!s.local("d/made.txt").exists());
    assert_eq!(std::fs::metadata(a.mnt.join("made.txt")).unwrap().len(), 9);
    let listed: Vec<_> = std::fs::read_dir(&a.mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(listed.iter().any(|n| n == "made.txt"), "{listed:?}");
    f.sync_all().unwrap();
    assert_eq!(read(&s.local("d/made.txt")), "made here", "fsync stored it");
    std::io::Write::write_all(&mut f, b", then more").unwrap();
    drop(f);
    assert_eq!(read(&s.local("d/made.txt")), "made here, then more");
    // Renamed and removed, as any file.
    std::fs::rename(a.mnt.join("made.txt"), a.mnt.join("moved.txt")).unwrap();
    assert_eq!(read(&s.local("d/moved.txt")), "made here, then more");
    let (ok, err) =
        python(&a.mnt, "f = open('gone.txt', 'w'); f.write('x'); import os; os.remove('gone.txt'); f.close()");
    assert!(ok, "{err}");
    assert!(!s.local("d/gone.txt").exists() && !a.mnt.join("gone.txt").exists());

    // A store that fails shows as an error of close, and the name does not stay.
    std::fs::create_dir(a.mnt.join("sub")).unwrap();
    std::fs::write(a.mnt.join("sub/x.txt"), "x").unwrap();
    let code = "import sys\nf = open('sub/doomed.txt', 'w')\nf.write('doomed')\nf.flush()\nsys.stdin.read()\n\
        try:\n    f.close()\nexcept OSError as e:\n    print(e.errno)\n    sys.exit(3)\n";
    let mut writer = Command::new("python3")
        .arg("-c")
        .arg(code)
        .current_dir(&a.mnt)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(within(Duration::from_secs(5), || a.mnt.join("sub/doomed.txt").exists()));
    assert!(!s.local("d/sub/doomed.txt").exists());
    std::fs::remove_dir_all(s.local("d/sub")).unwrap();
    drop(writer.stdin.take());
    let out = writer.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "close reported no error");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2", "ENOENT from close");
    assert!(within(Duration::from_secs(2), || !a.mnt.join("sub").exists()));
}

/// The names in `dir` but the store's own.
fn listed(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".__locus"))
        .collect();
    n.sort();
    n
}

fn afs_mode_removes_without_waiting_and_in_order(via: Via) {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    for i in 0..30 {
        s.put_local(&format!("d/f{i}"), b"x");
    }
    let a = afs_client_at(via, &s, "a");
    let b = client_at(via, &s.url("/d"), s.scratch(), "b", &[]);
    assert_eq!(listed(&a.mnt).len(), 30);
    // The first removal waits for the server; the rest go behind it, and a file made
    // again under a removed name right after is made after the removal.
    for i in 0..30 {
        std::fs::remove_file(a.mnt.join(format!("f{i}"))).unwrap();
    }
    std::fs::write(a.mnt.join("f5"), "again").unwrap();
    assert_eq!(listed(&a.mnt), ["f5"]);
    std::fs::File::open(&a.mnt).unwrap().sync_all().expect("fsync of the directory: every removal succeeded");
    assert_eq!(listed(&s.local("d")), ["f5"]);
    assert_eq!(std::fs::read_to_string(s.local("d/f5")).unwrap(), "again");
    assert!(within(Duration::from_secs(2), || listed(&b.mnt) == ["f5"]), "{:?}", listed(&b.mnt));
}

fn a_removal_sent_without_waiting_that_the_server_refuses_shows_the_name_again(via: Via) {
    if !fuse_available() {
        return;
    }
    use locus_client::types::Rights;
    let s = TestServer::start();
    for name in ["a", "b"] {
        s.put_local(&format!("d/{name}"), b"x");
    }
    let a = afs_client_at(via, &s, "a");
    assert_eq!(listed(&a.mnt), ["a", "b"]);
    // The first removal waits: the server may remove here. Then the right to remove is
    // taken away behind the protocol's back (no callback breaks), so the mount still
    // believes the next removal will succeed.
    std::fs::remove_file(a.mnt.join("a")).unwrap();
    let keep = Rights(Rights::READ.0 | Rights::WRITE.0 | Rights::LIST.0);
    s.shared().store.acl_set("admin", "/d", "admin", keep).unwrap();
    std::fs::remove_file(a.mnt.join("b")).expect("answered without waiting");
    let synced = std::fs::File::open(&a.mnt).unwrap().sync_all();
    assert_eq!(synced.expect_err("fsync of the directory reports it").raw_os_error(), Some(5), "EIO");
    assert!(s.local("d/b").exists());
    assert!(within(Duration::from_secs(2), || listed(&a.mnt) == ["b"]), "{:?}", listed(&a.mnt));
    assert_eq!(std::fs::read(a.mnt.join("b")).unwrap(), b"x");
}

fn afs_mode_renames_without_waiting_and_in_order(via: Via) {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/doc", b"v0");
    let a = afs_client_at(via, &s, "a");
    let b = client_at(via, &s.url("/d"), s.scratch(), "b", &[]);
    assert_eq!(listed(&a.mnt), ["doc"]);
    // An editor's saves: a new file written beside the document, renamed over it. The
    // first rename waits; the later ones go behind, each after the store before it.
    for i in 1..=20 {
        std::fs::write(a.mnt.join("doc.tmp"), format!("v{i}")).unwrap();
        std::fs::rename(a.mnt.join("doc.tmp"), a.mnt.join("doc")).unwrap();
        assert_eq!(std::fs::read_to_string(a.mnt.join("doc")).unwrap(), format!("v{i}"));
    }
    std::fs::rename(a.mnt.join("doc"), a.mnt.join("final")).unwrap();
    assert_eq!(listed(&a.mnt), ["final"]);
    std::fs::File::open(&a.mnt).unwrap().sync_all().expect("fsync of the directory: every rename succeeded");
    assert_eq!(listed(&s.local("d")), ["final"]);
    assert_eq!(std::fs::read_to_string(s.local("d/final")).unwrap(), "v20");
    assert!(within(Duration::from_secs(2), || listed(&b.mnt) == ["final"]), "{:?}", listed(&b.mnt));
    assert_eq!(std::fs::read_to_string(b.mnt.join("final")).unwrap(), "v20");
}

fn a_rename_sent_without_waiting_that_the_server_refuses_leaves_the_names_as_they_were(via: Via) {
    if !fuse_available() {
        return;
    }
    use locus_client::types::Rights;
    let s = TestServer::start();
    for name in ["a", "b", "c"] {
        s.put_local(&format!("d/{name}"), name.as_bytes());
    }
    let a = afs_client_at(via, &s, "a");
    assert_eq!(listed(&a.mnt), ["a", "b", "c"]);
    // Stored at close: the server lets the mount write here. Then a rename that waits
    // shows that it lets the mount remove here too.
    std::fs::write(a.mnt.join("new"), "n").unwrap();
    std::fs::rename(a.mnt.join("a"), a.mnt.join("a2")).unwrap();
    // The right to remove (which a rename's source needs) is taken away behind the
    // protocol's back: the mount still believes the next rename will succeed.
    let keep = Rights(Rights::READ.0 | Rights::WRITE.0 | Rights::LIST.0);
    s.shared().store.acl_set("admin", "/d", "admin", keep).unwrap();
    std::fs::rename(a.mnt.join("b"), a.mnt.join("c")).expect("answered without waiting");
    let synced = std::fs::File::open(&a.mnt).unwrap().sync_all();
    assert_eq!(synced.expect_err("fsync of the directory reports it").raw_os_error(), Some(5), "EIO");
    assert_eq!(std::fs::read(s.local("d/b")).unwrap(), b"b");
    assert_eq!(std::fs::read(s.local("d/c")).unwrap(), b"c");
    let want = ["a2", "b", "c", "new"];
    assert!(within(Duration::from_secs(2), || listed(&a.mnt) == want), "{:?}", listed(&a.mnt));
    assert_eq!(std::fs::read(a.mnt.join("b")).unwrap(), b"b");
    assert_eq!(std::fs::read(a.mnt.join("c")).unwrap(), b"c");
}

#[test]
fn afs_write_back_survives_a_server_restart() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (root, state) = (work.path().join("root"), work.path().join("state"));
    std::fs::create_dir_all(&root).unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = serve(&root, &state, port);
    let token = admin_token(&state);
    let cache = work.path().join("cache");
    let flags = ["--retry-secs", "5", "--consistency", "afs", "--cache-dir", cache.to_str().unwrap()];
    let m = mount_with(&format!("locus://127.0.0.1:{port}/"), work.path(), &token, &flags);
    // The server's second run is started (waiting for a stamp) before the file is open:
    // a process forked while a store waits would wait too, as its exec closes the file.
    let stamp = work.path().join("restart");
    let mut restarted = Command::new("sh")
        .arg("-c")
        .arg(r#"while [ ! -e "$0" ]; do sleep 0.05; done; sleep 0.8; exec "$@" 2>/dev/null"#)
        .arg(&stamp)
        .arg(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(&root)
        .arg("--state")
        .arg(&state)
        .spawn()
        .unwrap();
    std::fs::write(m.mnt.join("a.txt"), "a").unwrap();
    let _ = std::fs::read_dir(&m.mnt).unwrap().count();
    let mut f = std::fs::File::create(m.mnt.join("b.txt")).unwrap();
    std::io::Write::write_all(&mut f, b"written while the server restarts").unwrap();
    assert!(!root.join("b.txt").exists(), "written back, not through");
    server.kill().unwrap();
    server.wait().unwrap();
    std::fs::write(&stamp, "").unwrap();
    // The fsync waits for the server and stores.
    let stored = f.sync_all();
    drop(f);
    let content = std::fs::read_to_string(root.join("b.txt"));
    let _ = restarted.kill();
    let _ = restarted.wait();
    stored.unwrap();
    assert_eq!(content.unwrap(), "written while the server restarts");
}

#[test]
fn reads_through_the_mount_return_exact_bytes_sequentially_and_at_random() {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    // 9 MiB and a bit of bytes that differ at every offset.
    let data: Vec<u8> = (0..9 * 1024 * 1024 + 4321u64).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    s.put_local("big.bin", &data);
    let m = mount(&s, "/");
    assert!(std::fs::read(m.mnt.join("big.bin")).unwrap() == data, "sequential read differs");
    let f = std::fs::File::open(m.mnt.join("big.bin")).unwrap();
    let mut seed = 12345u64;
    for _ in 0..300 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let offset = (seed >> 20) % (data.len() as u64 + 100);
        let len = ((seed >> 8) % 300_000) as usize;
        let mut buf = vec![0; len];
        let mut got = 0;
        while got < len {
            let n = std::os::unix::fs::FileExt::read_at(&f, &mut buf[got..], offset + got as u64).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        let start = (offset as usize).min(data.len());
        let end = (start + len).min(data.len());
        assert!(buf[..got] == data[start..end], "bytes at {offset}+{len}");
    }
}

#[test]
fn a_mount_refused_promises_caches_for_the_attribute_timeout_and_stats_count_the_refusals() {
    if !fuse_available() {
        return;
    }
    // One watch: the mounted directory's. Every promise that needs another (the names
    // in a subdirectory) is refused, as at the kernel's limit.
    let s = TestServer::start_with(|c| c.promises.watches = Some(1));
    s.put_local("d/sub/f.txt", b"one");
    let m = mount_at(&s.url("/d"), s.scratch(), "a", &["--attr-timeout-ms", "500"]);
    let file = m.mnt.join("sub/f.txt");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "one");
    assert!(s.shared().callbacks.refused() > 0, "the promises needing a second watch were refused");
    // A change made beside the server, which no watch sees: the mount trusted what it
    // had only for the attribute timeout, not for a day.
    std::fs::write(s.local("d/sub/f.txt"), "two, longer").unwrap();
    assert!(
        within(Duration::from_secs(5), || std::fs::read_to_string(&file).unwrap() == "two, longer"),
        "the mount still shows {:?}",
        std::fs::read_to_string(&file).unwrap()
    );
    // `locus stats` counts the refusals, in text and in JSON.
    let stats = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(args)
            .env("LOCUS_HOME", s.scratch().join("home"))
            .env("LOCUS_TOKEN", "admin:admin-token")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = stats(&["stats", &s.url("/")]);
    let refused = s.shared().callbacks.refused();
    assert!(text.contains(" refused (bounds reached)"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&stats(&["--json", "stats", &s.url("/")])).unwrap();
    assert!(json["promises_refused"].as_u64().unwrap() >= refused, "{json}");
}

#[test]
fn a_second_walk_asks_the_mount_nothing_once_the_first_has_paused() {
    if !fuse_available() {
        return;
    }
    let s = TestServer::start();
    for i in 0..20 {
        s.put_local(&format!("d/t/{i}/sub/f.txt"), b"x");
    }
    // The mount's requests, one log line each.
    let log = s.scratch().join("requests.log");
    let mnt = s.scratch().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["mount", &s.url("/d"), "--attr-timeout-ms", "600000"])
        .arg(&mnt)
        .env("LOCUS_HOME", s.scratch().join("home"))
        .env("LOCUS_TOKEN", "admin:admin-token")
        .env("LOCUS_LOG", "locus_fuse::request=debug")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let m = Mount { child, mnt: mnt.canonicalize().unwrap() };
    assert!(within(Duration::from_secs(20), || mounted(&m.mnt)), "not mounted");
    let requests = || {
        let text = std::fs::read_to_string(&log).unwrap();
        ["LOOKUP", "GETATTR", "READDIR", "OPENDIR"].iter().map(|op| text.matches(op).count()).sum::<usize>()
    };
    let walk = || sh(&m.mnt, "find t | wc -l").stdout;
    assert_eq!(walk(), b"61\n");
    // The kernel marked every directory listed stale; the mount reads them again once
    // the walk has paused, so the next walk finds everything in the kernel.
    std::thread::sleep(Duration::from_millis(800));
    let before = requests();
    assert_eq!(walk(), b"61\n");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(requests() - before, 0, "the second walk asked the mount {} times", requests() - before);
}
