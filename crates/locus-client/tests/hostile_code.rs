//! Code that runs for a client (native command handlers, storelets), tried as an attacker
//! would, against a real server: a handler runs as a user of its own in a root of its
//! own (a synthetic `/etc`, no `/proc`, no `/sys`, three device files, no network),
//! cannot reach past its directory through its arguments, cannot signal or trace the
//! server, and is stopped by the limits when it forks or writes without end, while the
//! server keeps serving; what any run sees is only what its subject may read (refused
//! subdirectories and ACL files are absent), on one device or several, on one server
//! or through a cluster's data nodes.

use locus_client::types::Rights;
use locus_client::Client;
use locus_proto::Code;
use locus_testkit::TestServer;
use std::path::Path;
use std::time::{Duration, Instant};

/// An active file's name: `handler@ARG,ARG` with every byte but letters and digits
/// percent-encoded.
fn inv(handler: &str, args: &[&str]) -> String {
    let enc = |a: &str| {
        a.bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect::<String>()
    };
    format!("{handler}@{}", args.iter().map(|a| enc(a)).collect::<Vec<_>>().join(","))
}

/// A server with the command handlers `cat`, `id` (`id -u`), `lines` (`wc -l`), `find`,
/// `sh` (`sh -c SCRIPT`) and `yes`, 2 s of wall time and 1 MiB of output per run.
fn server() -> TestServer {
    let srv = TestServer::start_with(|c| {
        c.storelets.limits.wall = Duration::from_secs(2);
        c.storelets.limits.output = 1 << 20;
    });
    add_commands(&srv);
    srv
}

fn add_commands(srv: &TestServer) {
    let conf = srv.state_dir().join(locus_testkit::server::active::HANDLERS_FILE);
    let mut text = std::fs::read_to_string(&conf).unwrap_or_default();
    text.push_str(
        "cat command /bin/cat\nid command /usr/bin/id -u\nlines command /usr/bin/wc -l\n\
         find command /usr/bin/find\nsh command /bin/sh -c\nyes command /usr/bin/yes\n",
    );
    std::fs::write(&conf, text).unwrap();
}

async fn text(c: &Client, path: &str) -> locus_client::Result<String> {
    c.read_file(path).await.map(|b| String::from_utf8_lossy(&b).into_owned())
}

#[tokio::test]
async fn a_command_handler_runs_as_its_own_user_with_a_synthetic_etc() {
    let srv = server();
    srv.put_local("d/a.txt", b"one\ntwo\n");
    // A file only its owner (the server) may read: the run reads it through its view.
    srv.put_local("d/own.txt", b"mine\n");
    std::fs::set_permissions(srv.local("d/own.txt"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let admin = srv.client("admin").await;

    let uid: u32 = text(&admin, "/d/id@").await.unwrap().trim().parse().unwrap();
    assert_ne!(uid, rustix::process::getuid().as_raw(), "never the server's user");
    if rustix::process::getuid().is_root() {
        assert!(uid >= locus_testkit::storelet::native::RUN_USERS, "a user of its own: {uid}");
    }
    assert_eq!(text(&admin, "/d/cat@own.txt").await.unwrap(), "mine\n");

    // The host's /etc is not there: no shadow, and a passwd naming the run's user alone.
    let shadow = std::fs::read("/etc/shadow").unwrap_or_default();
    let got = admin.read_file(&format!("/d/{}", inv("sh", &["cat /etc/shadow"]))).await;
    assert!(got.is_err(), "no /etc/shadow in the handler's root");
    assert!(shadow.is_empty() || got.as_deref().ok() != Some(&shadow[..]));
    let passwd = text(&admin, &format!("/d/{}", inv("sh", &["cat /etc/passwd"]))).await.unwrap();
    assert_eq!(passwd.lines().count(), 1, "{passwd}");
    // Its own user (each run may get another): the one passwd names is the one it runs as.
    let line = text(&admin, &format!("/d/{}", inv("sh", &["echo $(id -u):$(id -g):$(id -G):$(cat /etc/passwd)"])))
        .await
        .unwrap();
    let (ids, named) = line.split_at(line.find(":locus-run").unwrap_or(0));
    let own: Vec<&str> = ids.split(':').collect();
    assert!(own.len() == 3 && own.iter().all(|i| *i == own[0]), "one user and group, no other groups: {line}");
    assert!(named.starts_with(&format!(":locus-run:x:{}:{}:", own[0], own[0])), "{line}");
    assert!(passwd.starts_with("locus-run:x:"), "{passwd}");
    assert!(!passwd.contains("root:"), "{passwd}");
    let etc = text(&admin, &format!("/d/{}", inv("sh", &["ls /etc"]))).await.unwrap();
    assert!(!etc.lines().any(|n| ["shadow", "gshadow", "sudoers", "ssh"].contains(&n)), "{etc}");

    // Arguments that name paths outside the directory are refused.
    for args in [&["/etc/shadow"][..], &["../../etc/passwd"], &["a.txt", "/etc/passwd"], &["--files0-from=/etc/passwd"]]
    {
        let name = format!("/d/{}", inv("lines", args));
        let e = admin.read_file(&name).await.unwrap_err();
        assert_eq!(e.code(), Code::INVAL, "{args:?}: {e}");
    }
    let name = format!("/d/{}", inv("cat", &["/etc/shadow"]));
    assert_eq!(admin.read_file(&name).await.unwrap_err().code(), Code::INVAL);
    assert_eq!(text(&admin, &format!("/d/{}", inv("lines", &["a.txt"]))).await.unwrap(), "2 a.txt\n");
}

#[tokio::test]
async fn a_handler_reaches_no_proc_sys_devices_processes_or_network() {
    let srv = server();
    srv.put_local("d/a.txt", b"a\n");
    let admin = srv.client("admin").await;
    let sh = |script: &str| format!("/d/{}", inv("sh", &[script]));

    for script in ["ls /proc", "ls /sys", "cat /proc/1/environ", "ls /dev/sda /dev/mem /dev/kmsg"] {
        let e = admin.read_file(&sh(script)).await.unwrap_err();
        assert_eq!(e.code(), Code::IO, "{script}: {e}");
    }
    assert_eq!(text(&admin, &sh("ls /dev")).await.unwrap(), "null\nurandom\nzero\n");
    // The server (this process) can be neither signalled nor traced.
    let server = std::process::id();
    let e = admin.read_file(&sh(&format!("kill -0 {server}"))).await.unwrap_err();
    assert_eq!(e.code(), Code::IO, "kill -0 {server}: {e}");
    if locus_testkit::require("python3", Path::new("/usr/bin/python3").exists(), "apt-get install python3") {
        // PTRACE_SEIZE (0x4206) would attach without stopping the server.
        let seize = format!(
            "python3 -c 'import ctypes,sys; sys.exit(3 if ctypes.CDLL(None).ptrace(0x4206, {server}, 0, 0) == 0 else 0)'"
        );
        assert_eq!(text(&admin, &sh(&seize)).await.unwrap(), "", "ptrace refused");
        let connect = format!(
            "python3 -c 'import socket,sys; socket.create_connection((\"127.0.0.1\", {}), 2)' 2>/dev/null && echo connected || echo refused",
            srv.addr.port()
        );
        assert_eq!(text(&admin, &sh(&connect)).await.unwrap(), "refused\n", "no network");
    }
}

/// Processes now running as user `uid` (zombies aside: they are dead already, and
/// whoever reaps orphans here may be slow to).
fn processes_of(uid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("").trim().to_string();
        let real = field("Uid:").split_whitespace().next().and_then(|u| u.parse::<u32>().ok());
        if real == Some(uid) && !field("State:").starts_with('Z') {
            found.push(field("Name:"));
        }
    }
    found
}

#[tokio::test]
async fn a_fork_bomb_and_endless_output_are_stopped_and_the_server_keeps_serving() {
    if !locus_testkit::require("root", rustix::process::getuid().is_root(), "run the tests as root") {
        return;
    }
    let srv = server();
    srv.put_local("d/a.txt", b"a\n");
    let admin = srv.client("admin").await;
    let started = Instant::now();
    // Forks until the process limit refuses, then leaves children that left its group.
    let bomb = format!("/d/{}", inv("sh", &["id -u >&2; setsid sleep 60 & f(){ f|f& };f; sleep 30"]));
    // Stopped by the wall-time limit, or ended by its shell once forks are refused.
    let e = admin.read_file(&bomb).await.unwrap_err();
    assert!(matches!(e.code(), Code::LIMIT | Code::IO), "{e}");
    assert!(started.elapsed() < Duration::from_secs(20), "stopped by the 2 s limit: {:?}", started.elapsed());
    let record = text(&admin, &format!("{bomb}.err")).await.unwrap();
    let uid: u32 = record.lines().find_map(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("{record}"));
    assert!(uid >= locus_testkit::storelet::native::RUN_USERS, "{record}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_of(uid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(processes_of(uid), Vec::<String>::new(), "nothing of the run is left");

    let e = admin.read_file("/d/yes@").await.unwrap_err();
    assert_eq!(e.code(), Code::LIMIT, "{e}");
    assert!(e.to_string().contains("output"), "{e}");
    // Still serving, files and handlers alike.
    assert_eq!(admin.read_file("/d/a.txt").await.unwrap(), b"a\n");
    assert_eq!(text(&admin, &format!("/d/{}", inv("lines", &["a.txt"]))).await.unwrap(), "1 a.txt\n");
}

#[tokio::test]
async fn command_handlers_run_on_an_export_of_several_devices() {
    let srv = TestServer::start_with(|c| {
        let base = c.root.parent().unwrap().to_path_buf();
        c.devices = vec![base.join("dev1")];
    });
    add_commands(&srv);
    std::fs::create_dir_all(srv.root().join("d")).unwrap();
    let on_one = srv.scratch().join("dev1/d/three");
    std::fs::create_dir_all(on_one.parent().unwrap()).unwrap();
    std::fs::write(&on_one, "1\n2\n3\n").unwrap();
    srv.put_local("d/two", b"1\n2\n");
    let admin = srv.client("admin").await;
    assert_eq!(text(&admin, "/d/lines@three").await.unwrap(), "3 three\n");
    assert_eq!(text(&admin, "/d/lines@two").await.unwrap(), "2 two\n");
    assert_eq!(text(&admin, "/lines@d%2Fthree").await.unwrap(), "3 d/three\n");
}

/// `/data` readable by alice, `/data/private` refused her, `/data/sub/deep` granted her
/// again beneath a refused `/data/sub` (still absent: its parent is).
async fn acl_tree(srv: &TestServer) -> (Client, Client) {
    let admin = srv.client("admin").await;
    for d in ["/data", "/data/private", "/data/open", "/data/sub", "/data/sub/deep"] {
        admin.mkdir(d, 0o755).await.unwrap();
    }
    for (f, body) in [
        ("/data/pub.txt", "public\n"),
        ("/data/private/secret.txt", "secret\n"),
        ("/data/open/ok.txt", "ok\n"),
        ("/data/sub/deep/hidden.txt", "hidden\n"),
    ] {
        admin.write_file(f, 0o644, body.as_bytes()).await.unwrap();
    }
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    admin.acl_set("/data", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/data/private", "alice", Rights(0)).await.unwrap();
    admin.acl_set("/data/sub", "alice", Rights::parse("l").unwrap()).await.unwrap();
    admin.acl_set("/data/sub/deep", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    let alice = srv.client("alice").await;
    assert_eq!(alice.read_file("/data/private/secret.txt").await.unwrap_err().code(), Code::ACCES);
    (admin, alice)
}

fn sorted_lines(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().map(String::from).collect();
    v.sort();
    v
}

#[tokio::test]
async fn code_sees_only_what_its_subject_may_read() {
    let srv = server();
    let (admin, alice) = acl_tree(&srv).await;

    // A native handler started by alice on /data.
    let found = text(&alice, "/data/find@.").await.unwrap();
    assert_eq!(sorted_lines(&found), [".", "./open", "./open/ok.txt", "./pub.txt"], "{found}");
    let e = alice.read_file(&format!("/data/{}", inv("cat", &["private/secret.txt"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::IO, "{e}");
    // The same for the admin shows every directory, and never an ACL file.
    let all = text(&admin, "/data/find@.").await.unwrap();
    assert!(all.contains("./private/secret.txt") && all.contains("./sub/deep/hidden.txt"), "{all}");
    assert!(!all.contains(".__locus"), "{all}");

    // A storelet alice runs on /data.
    let find = locus_testkit::build_storelet("find");
    let out = alice.storelet_run(&find, "/data", vec!["/".into()], false).await.unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    let listed: Vec<String> = sorted_lines(&listed).into_iter().filter(|l| l != "/").collect();
    assert_eq!(listed, ["/open", "/open/ok.txt", "/pub.txt"], "{listed:?}");
    // A writable run where something must be hidden is refused rather than shown it.
    admin.acl_set("/data", "alice", Rights::parse("rlw").unwrap()).await.unwrap();
    let e = alice.storelet_run(&find, "/data", vec!["/".into()], true).await.unwrap_err();
    assert_eq!(e.code(), Code::ACCES, "{e}");
    // Where nothing is hidden it runs as before.
    let out = alice.storelet_run(&find, "/data/open", vec!["/".into()], true).await.unwrap();
    let listed: Vec<String> =
        sorted_lines(&String::from_utf8_lossy(&out.stdout)).into_iter().filter(|l| l != "/").collect();
    assert_eq!(listed, ["/ok.txt"]);
    // The views' scratch directories are gone with their runs.
    let left: Vec<_> = std::fs::read_dir(srv.state_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().starts_with("hide-")), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_storelet_sees_only_what_its_subject_may_read() {
    let head = TestServer::head(None, |_| {});
    let _nodes = [TestServer::data_node(&head)];
    let (_admin, alice) = acl_tree(&head).await;
    let find = locus_testkit::build_storelet("find");
    let out = alice.storelet_run(&find, "/data", vec!["/".into()], false).await.unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(listed.contains("/pub.txt") && listed.contains("/open/ok.txt"), "{listed}");
    assert!(!listed.contains("private") && !listed.contains("secret"), "{listed}");
    assert!(!listed.contains("hidden"), "{listed}");
}

/// A refused directory renamed (or moved in) while code runs over its parent does not
/// appear in the run's view under its new name: names in a directory code runs over are
/// not changed until the run ends (`EBUSY`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_during_a_run_cannot_bring_a_refused_directory_into_its_view() {
    let srv = server();
    let (admin, alice) = acl_tree(&srv).await;
    // alice may rename in /data (d on it, w to make names there).
    admin.acl_set("/data", "alice", Rights::parse("rlwd").unwrap()).await.unwrap();
    let run = {
        let alice = srv.client("alice").await;
        let name = format!("/data/{}", inv("sh", &["sleep 1; ls -R; cat p2/secret.txt"]));
        tokio::spawn(async move { text(&alice, &name).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let e = alice.rename("/data/private", "/data/p2").await.unwrap_err();
    assert_eq!(e.code(), Code::BUSY, "{e}");
    let out = run.await.unwrap().unwrap_or_default();
    assert!(!out.contains("secret"), "the run saw the refused directory: {out}");
    // Once the run is over (its view let go just after its output ends), names change again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match alice.rename("/data/pub.txt", "/data/pub2.txt").await {
            Ok(()) => break,
            Err(e) if e.code() == Code::BUSY && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("names still cannot change after the run: {e}"),
        }
    }
}
