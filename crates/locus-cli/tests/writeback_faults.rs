//! `locus mount` under faults: what a program wrote through a mount reaches the server
//! although the mount is killed (`kill -9`), stopped (SIGTERM) with files open, or the
//! server is away when a file is closed; removals answered before the server decides
//! are done or not as a whole after a kill; and `open(O_CREAT | O_RDONLY)` creates
//! files in every consistency mode.

mod common;

use common::{admin_token, serve, spawn_mount, within, Mount};
use locus_testkit::TestServer;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `locus mount URL DIR/NAME FLAGS...` with `token` as admin, once the mount is there.
fn mount(url: &str, dir: &Path, name: &str, token: &str, flags: &[&str]) -> Mount {
    spawn_mount(url, &dir.join(name), &dir.join("home"), token, flags)
}

/// Makes the mount write back in its root: a file stored there tells it the server
/// lets it write, and a listing tells it which names are free (a file is then made as
/// a local copy, at the server by its first store).
fn warm(mnt: &Path) {
    std::fs::write(mnt.join("first.txt"), "first").unwrap();
    let _ = std::fs::read_dir(mnt).unwrap().count();
}

/// `s`'s `/d` mounted `--consistency afs` at `name`, copies in the scratch's `cache`.
fn afs(s: &TestServer, name: &str) -> Mount {
    let cache = s.scratch().join("cache");
    let flags = ["--consistency", "afs", "--cache-dir", cache.to_str().unwrap()];
    mount(&s.url("/d"), s.scratch(), name, "admin-token", &flags)
}

/// A Python process in `dir` that opens `name` for writing, writes `data`, says
/// "written" and waits for a line on stdin before it closes the file (printing the
/// errno of a failed close).
fn writer(dir: &Path, name: &str, data: &str) -> Child {
    let code = format!(
        "import sys\nf = open({name:?}, 'w')\nf.write({data:?})\nf.flush()\nprint('written', flush=True)\n\
         sys.stdin.readline()\ntry:\n    f.close()\nexcept OSError as e:\n    print(e.errno, flush=True)\n    sys.exit(3)\n"
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(code)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "written");
    child
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| format!("error: {e}"))
}

#[test]
fn a_killed_afs_mount_leaves_its_unsaved_writes_to_the_next_mount_which_stores_them() {
    if !locus_testkit::require_fuse() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/theirs.txt", b"base");
    let mut a = afs(&s, "a");
    warm(&a.mnt);
    // A file written and not closed, and a file whose server version someone else
    // changes meanwhile.
    let mut new = writer(&a.mnt, "new.txt", "unsaved bytes");
    let mut theirs = writer(&a.mnt, "theirs.txt", "our version");
    assert!(!s.local("d/new.txt").exists(), "written back, not through");
    std::fs::write(s.local("d/theirs.txt"), "their version").unwrap();
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    for w in [&mut new, &mut theirs] {
        let _ = w.kill();
        let _ = w.wait();
    }
    assert!(!s.local("d/new.txt").exists());

    // A new mount over the same cache directory stores them before it is there.
    let b = afs(&s, "b");
    assert_eq!(read(&s.local("d/new.txt")), "unsaved bytes");
    assert_eq!(read(&b.mnt.join("new.txt")), "unsaved bytes");
    assert_eq!(read(&s.local("d/theirs.txt")), "their version", "the other writer's version stays");
    let conflicts: Vec<String> = std::fs::read_dir(s.local("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("theirs.txt.locus-conflict-"))
        .collect();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(read(&s.local(&format!("d/{}", conflicts[0]))), "our version");
    // Nothing is left to store: a third mount changes nothing.
    drop(b);
    std::fs::write(s.local("d/new.txt"), "changed since").unwrap();
    let _c = afs(&s, "c");
    assert_eq!(read(&s.local("d/new.txt")), "changed since");
}

#[test]
fn sigterm_stores_what_files_still_open_for_writing_hold_before_the_mount_goes() {
    if !locus_testkit::require_fuse() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/old.txt", b"old");
    let mut a = afs(&s, "a");
    warm(&a.mnt);
    let mut w1 = writer(&a.mnt, "open.txt", "written, still open");
    let mut w2 = writer(&a.mnt, "old.txt", "rewritten, still open");
    assert!(!s.local("d/open.txt").exists());
    let pid = a.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "locus mount did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read(&s.local("d/open.txt")), "written, still open");
    assert_eq!(read(&s.local("d/old.txt")), "rewritten, still open");
    for w in [&mut w1, &mut w2] {
        let _ = w.kill();
        let _ = w.wait();
    }
}

#[test]
fn a_store_that_fails_at_close_keeps_the_bytes_and_stores_them_when_the_server_returns() {
    if !locus_testkit::require_fuse() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (root, state) = (work.path().join("root"), work.path().join("state"));
    std::fs::create_dir_all(&root).unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = serve(&root, &state, port);
    let token = admin_token(&state);
    let cache = work.path().join("cache");
    let flags = ["--retry-secs", "1", "--consistency", "afs", "--cache-dir", cache.to_str().unwrap()];
    let m = mount(&format!("locus://127.0.0.1:{port}/"), work.path(), "mnt", &token, &flags);
    warm(&m.mnt);
    let mut w = writer(&m.mnt, "kept.txt", "the user's work");
    server.kill().unwrap();
    server.wait().unwrap();
    // The close reports the failed store (EIO, the server away past the window)...
    writeln!(w.stdin.as_mut().unwrap()).unwrap();
    let out = w.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "close reported no error");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().last(), Some("5"), "EIO");
    // ...and the bytes stay: the mount still shows them, and stores them once the
    // server is back, without anyone touching the file.
    assert_eq!(read(&m.mnt.join("kept.txt")), "the user's work");
    let mut server = serve(&root, &state, port);
    let stored = within(Duration::from_secs(30), || read(&root.join("kept.txt")) == "the user's work");
    drop(m);
    let _ = server.kill();
    let _ = server.wait();
    assert!(stored, "never stored: {}", read(&root.join("kept.txt")));
}

#[test]
fn unsaved_bytes_stay_under_cache_mb_by_storing_before_the_writer_goes_on() {
    if !locus_testkit::require_fuse() {
        return;
    }
    let s = TestServer::start();
    std::fs::create_dir_all(s.local("d")).unwrap();
    let cache = s.scratch().join("cache");
    let flags = ["--consistency", "afs", "--cache-mb", "1", "--cache-dir", cache.to_str().unwrap()];
    let a = mount(&s.url("/d"), s.scratch(), "a", "admin-token", &flags);
    warm(&a.mnt);
    // Twelve files of 100 KB open at once: 1.2 MB, more than the 1 MiB allowed unsaved.
    let block = |i: usize| vec![b'a' + i as u8; 100_000];
    let mut files: Vec<std::fs::File> =
        (0..12).map(|i| std::fs::File::create(a.mnt.join(format!("f{i}"))).unwrap()).collect();
    for (i, f) in files.iter_mut().enumerate() {
        f.write_all(&block(i)).unwrap();
    }
    // Written through past the limit (behind, so it may take a moment to land).
    let at_server = || (0..12).any(|i| std::fs::read(s.local(&format!("d/f{i}"))).ok() == Some(block(i)));
    assert!(
        within(Duration::from_secs(5), at_server),
        "every byte is still only in the cache: the limit held nothing back"
    );
    drop(files);
    for i in 0..12 {
        assert_eq!(std::fs::read(s.local(&format!("d/f{i}"))).unwrap(), block(i), "f{i}");
    }
}

#[test]
fn a_mount_killed_right_after_rm_r_leaves_the_tree_removed() {
    if !locus_testkit::require_fuse() {
        return;
    }
    let s = TestServer::start();
    for i in 0..40 {
        s.put_local(&format!("d/tree/sub/f{i}"), b"x");
        s.put_local(&format!("d/flat/f{i:02}"), b"x");
    }
    let mut a = afs(&s, "a");
    let ls = |dir: &str| Command::new("ls").arg("-R").arg(a.mnt.join(dir)).output().unwrap();
    assert!(ls("tree").status.success() && ls("flat").status.success());
    // Removals after the first go without waiting; the rmdir at the end of `rm -r`
    // waits, and the server answers a connection's requests in order.
    assert!(Command::new("rm").arg("-r").arg(a.mnt.join("tree")).status().unwrap().success());
    // `rm` of files only: the last removals may still be on their way.
    let names: Vec<PathBuf> = (0..40).map(|i| a.mnt.join(format!("flat/f{i:02}"))).collect();
    assert!(Command::new("rm").args(&names).status().unwrap().success());
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    assert!(!s.local("d/tree").exists(), "rm -r returned, so the tree is gone at the server");
    // Of the files removed without a final wait, those gone are a prefix of the order
    // they were removed in: never a later one gone and an earlier one still there.
    let left: Vec<bool> = (0..40).map(|i| s.local(&format!("d/flat/f{i:02}")).exists()).collect();
    let first_left = left.iter().position(|&l| l).unwrap_or(40);
    assert!(left[first_left..].iter().all(|&l| l), "{left:?}");
}

#[test]
fn open_with_o_creat_and_o_rdonly_creates_the_file_in_every_mode() {
    if !locus_testkit::require_fuse() {
        return;
    }
    let s = TestServer::start();
    s.put_local("d/keep", b"k");
    let cache = s.scratch().join("cache");
    for mode in ["nfs", "sprite", "afs"] {
        let flags = ["--consistency", mode, "--cache-dir", cache.to_str().unwrap()];
        let m = mount(&s.url("/d"), s.scratch(), mode, "admin-token", &flags);
        let code = format!(
            "import os\n\
             os.close(os.open('{mode}.lock', os.O_CREAT | os.O_RDONLY, 0o600))\n\
             os.close(os.open('{mode}.excl', os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o600))\n\
             os.listdir('.')\n\
             open('{mode}.w', 'w').write('w')\n\
             os.close(os.open('{mode}.later', os.O_CREAT | os.O_RDONLY, 0o600))\n\
             os.close(os.open('{mode}.lock', os.O_CREAT | os.O_RDONLY, 0o600))\n"
        );
        let out = Command::new("python3").arg("-c").arg(&code).current_dir(&m.mnt).output().unwrap();
        assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        let out = Command::new("flock").arg(format!("{mode}.flock")).arg("true").current_dir(&m.mnt).output();
        let out = out.expect("flock (util-linux)");
        assert!(out.status.success(), "{mode}: flock: {}", String::from_utf8_lossy(&out.stderr));
        for name in ["lock", "excl", "later", "flock"] {
            let at = s.local(&format!("d/{mode}.{name}"));
            assert!(within(Duration::from_secs(2), || at.exists()), "{mode}: {mode}.{name} is not at the server");
            assert_eq!(std::fs::metadata(&at).unwrap().len(), 0);
        }
    }
}
