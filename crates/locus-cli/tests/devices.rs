//! `locus serve --device` as a process: a `kill -9` in the middle of `locus rebalance
//! apply` loses nothing, and the next start finishes or undoes the move.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn serve(root: &Path, device: &Path, state: &Path, port: u16) -> Child {
    common::serve_with(root, state, port, &["--device".as_ref(), device.as_os_str()])
}

fn locus(state: &Path, args: &[&str]) -> std::process::Output {
    let token = common::admin_token(state);
    Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(args)
        .env("LOCUS_TOKEN", format!("admin:{token}"))
        .env("LOCUS_HOME", state.join("home"))
        .output()
        .expect("locus")
}

#[test]
fn a_kill_during_a_move_is_repaired_at_the_next_start() {
    let tmp = tempfile::tempdir_in(if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" }).unwrap();
    let (root, dev1, state) = (tmp.path().join("root"), tmp.path().join("dev1"), tmp.path().join("state"));
    std::fs::create_dir_all(&root).unwrap();
    // Large enough that copying it takes a while; every byte says where it is.
    let big: Vec<u8> = (0..(768u64 << 20) / 8).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(root.join("big"), &big).unwrap();
    std::fs::write(root.join("small"), b"small").unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = serve(&root, &dev1, &state, port);
    let url = format!("locus://127.0.0.1:{port}/");
    let read_both = || {
        let out = locus(&state, &["cat", &format!("{url}big")]);
        assert!(out.status.success() && out.stdout.len() == big.len());
        assert!(locus(&state, &["cat", &format!("{url}small")]).status.success());
    };
    read_both(); // so that both have load, the big one most

    let mut apply = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["rebalance", "apply", &url])
        .env("LOCUS_TOKEN", format!("admin:{}", common::admin_token(&state)))
        .env("LOCUS_HOME", state.join("home"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill the server as soon as the copy has started on the second device.
    let deadline = Instant::now() + Duration::from_secs(20);
    let copying = || {
        std::fs::read_dir(&dev1)
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with(".__locus_move_")))
            .unwrap_or(false)
    };
    while !copying() {
        assert!(Instant::now() < deadline, "the move did not start");
        std::thread::sleep(Duration::from_micros(200));
    }
    server.kill().unwrap(); // SIGKILL
    server.wait().unwrap();
    let _ = apply.wait();
    let intents = std::fs::read_dir(state.join("intents")).unwrap().count();
    assert_eq!(intents, 1, "killed in the middle of the move");

    let mut server = serve(&root, &dev1, &state, port);
    assert_eq!(std::fs::read_dir(state.join("intents")).unwrap().count(), 0, "repaired at start");
    let leftovers: Vec<_> = std::fs::read_dir(&dev1).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        leftovers.iter().all(|n| !n.to_string_lossy().starts_with(".__locus_move_")),
        "no partial copy left: {leftovers:?}"
    );
    let on = [root.join("big").exists(), dev1.join("big").exists()];
    assert_eq!(on.iter().filter(|&&x| x).count(), 1, "on exactly one device: {on:?}");
    let out = locus(&state, &["cat", &format!("{url}big")]);
    assert!(out.status.success());
    assert!(out.stdout == big, "every byte kept");

    // The move can be made again (the killed server's accounting since its last save is
    // gone, so the files are read again), and completes.
    read_both();
    let out = locus(&state, &["rebalance", "apply", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dev1.join("big").exists() && !root.join("big").exists());
    server.kill().unwrap();
    server.wait().unwrap();
}
