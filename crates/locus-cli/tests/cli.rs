//! The `locus` binary against real servers: the README's flow, every file command,
//! `--json`, and one-line errors with a non-zero exit.

use locus_testkit::TestServer;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn locus(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(args)
        .env("LOCUS_HOME", home)
        .env("LOCUS_TOKEN", "admin:admin-token")
        .output()
        .expect("run locus")
}

fn ok(home: &Path, args: &[&str]) -> String {
    let out = locus(home, args);
    assert!(out.status.success(), "locus {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn file_commands_work_end_to_end() {
    let s = TestServer::start();
    let home = s.scratch().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let u = |p: &str| s.url(p);
    let local = s.scratch().join("local");
    std::fs::create_dir_all(local.join("tree/sub")).unwrap();
    std::fs::write(local.join("tree/a.txt"), b"alpha").unwrap();
    std::fs::write(local.join("tree/sub/b.txt"), vec![7u8; 5 << 20]).unwrap();
    std::os::unix::fs::symlink("a.txt", local.join("tree/link")).unwrap();

    ok(&home, &["mkdir", "-p", &u("/x/y/z")]);
    ok(&home, &["mkdir", "-p", &u("/x/y/z")]); // idempotent
    ok(&home, &["put", local.join("tree/a.txt").to_str().unwrap(), &u("/x/a.txt")]);
    assert_eq!(ok(&home, &["cat", &u("/x/a.txt")]), "alpha");
    assert_eq!(ok(&home, &["ls", &u("/x")]), "a.txt\ny\n");
    assert!(ok(&home, &["ls", "-l", &u("/x")]).contains("-rw-"));
    let v: serde_json::Value = serde_json::from_str(&ok(&home, &["--json", "stat", &u("/x/a.txt")])).unwrap();
    assert_eq!(v["size"], 5);
    let v: serde_json::Value = serde_json::from_str(&ok(&home, &["--json", "ls", &u("/x")])).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);

    // cp -r up and back down, then compare
    ok(&home, &["cp", "-r", local.join("tree").to_str().unwrap(), &u("/x")]);
    assert_eq!(std::fs::read(s.local("x/tree/sub/b.txt")).unwrap().len(), 5 << 20);
    assert_eq!(std::fs::read_link(s.local("x/tree/link")).unwrap(), Path::new("a.txt"));
    let back = s.scratch().join("back");
    ok(&home, &["cp", "-r", &u("/x/tree"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read(back.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(std::fs::read(back.join("sub/b.txt")).unwrap(), vec![7u8; 5 << 20]);
    ok(&home, &["get", &u("/x/a.txt"), s.scratch().join("got").to_str().unwrap()]);
    assert_eq!(std::fs::read(s.scratch().join("got")).unwrap(), b"alpha");

    ok(&home, &["mv", &u("/x/a.txt"), &u("/x/b.txt")]);
    assert!(s.local("x/b.txt").exists());
    ok(&home, &["acl", "set", &u("/x"), "alice", "rl"]);
    assert!(ok(&home, &["acl", "get", &u("/x")]).contains("alice rl"));
    let v: serde_json::Value = serde_json::from_str(&ok(&home, &["--json", "df", &u("/")])).unwrap();
    assert!(v["blocks"].as_u64().unwrap() > 0);
    let v: serde_json::Value = serde_json::from_str(&ok(&home, &["--json", "stats", &u("/"), "--top", "2"])).unwrap();
    assert_eq!(v["busiest"].as_array().unwrap().len(), 2);
    assert!(ok(&home, &["stats", &u("/")]).contains("busiest files"));

    let out = locus(&home, &["rm", &u("/x")]);
    assert!(!out.status.success());
    ok(&home, &["rm", "-r", &u("/x")]);
    assert!(!s.local("x").exists());
}

#[test]
fn errors_are_one_line_with_a_nonzero_exit() {
    let s = TestServer::start();
    let home = s.scratch().join("home");
    for (args, needle) in [
        (vec!["cat".to_string(), s.url("/missing")], "ENOENT"),
        (vec!["ls".to_string(), "http://x/".to_string()], "not a locus:// URL"),
        (vec!["acl".to_string(), "set".to_string(), s.url("/"), "bob".to_string(), "rz".to_string()], "unknown right"),
    ] {
        let out = locus(&home, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("locus: ") && err.contains(needle), "{err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["ls", &s.url("/")])
        .env("LOCUS_HOME", &home)
        .env("LOCUS_TOKEN", "admin:wrong")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("authentication"));
}

/// The README's first command: `locus serve` with no configuration, then the CLI finds
/// the server's admin token by itself.
#[test]
fn serve_with_embedded_defaults_then_use_it() {
    let home = tempfile::tempdir().unwrap();
    serve_then_use_it(home.path(), &[]);
    assert!(home.path().join("export/hello").is_dir());
}

/// The same with an export and state of the user's choosing: the new admin token is
/// saved as the default credentials too.
#[test]
fn serve_with_a_root_of_ones_own_then_use_it() {
    let home = tempfile::tempdir().unwrap();
    let (root, state) = (home.path().join("mine"), home.path().join("state"));
    std::fs::create_dir_all(&root).unwrap();
    serve_then_use_it(home.path(), &["--root", root.to_str().unwrap(), "--state", state.to_str().unwrap()]);
    assert!(root.join("hello").is_dir());
}

/// Starts `locus serve FLAGS` with `home` as LOCUS_HOME, makes a directory `hello` and
/// lists it with the CLI and no token given, then stops the server with SIGTERM.
fn serve_then_use_it(home: &Path, flags: &[&str]) {
    let port_file = home.join("port");
    let mut server = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--listen", "127.0.0.1:0", "--port-file", port_file.to_str().unwrap()])
        .args(flags)
        .env("LOCUS_HOME", home)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = loop {
        if let Some(p) = std::fs::read_to_string(&port_file).ok().and_then(|s| s.trim().parse::<u16>().ok()) {
            break p;
        }
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let url = format!("locus://127.0.0.1:{port}/");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(args)
            .env("LOCUS_HOME", home)
            .env_remove("LOCUS_TOKEN")
            .output()
            .unwrap()
    };
    let out = run(&["mkdir", &format!("{url}hello")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&run(&["ls", &url]).stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&run(&["ls", &format!("locus://localhost:{port}/")]).stdout), "hello\n");
    // The admin token is saved for this server's addresses only: another server (here
    // another loopback address at the same port) is not sent a login.
    let saved = std::fs::read_to_string(home.join("credentials")).unwrap();
    let servers: Vec<&str> =
        saved.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(servers, [format!("127.0.0.1:{port}"), format!("localhost:{port}")], "{saved}");
    let out = run(&["ls", &format!("locus://127.0.0.2:{port}/")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no credentials for 127.0.0.2"), "{err}");
    // graceful stop on SIGTERM
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(server.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn bench_ops_runs_and_reports_every_row() {
    let out = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args([
            "bench",
            "ops",
            "--iterations",
            "20",
            "--repeat",
            "1",
            "--size-mb",
            "4",
            "--targets",
            "pingpong,pingpong-poll,locus",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    for row in [
        "| stat |",
        "| open+close |",
        "| read 8KB |",
        "| write 1B |",
        "| seq read MB/s |",
        "ping-pong p50",
        "locus ÷ pingpong-poll",
        "placement: ",
    ] {
        assert!(table.contains(row), "{row} missing from\n{table}");
    }
}

#[test]
fn script_register_and_call_from_the_command_line() {
    let s = TestServer::start();
    let home = s.scratch().join("home");
    s.put_local("d/a.txt", b"abc");
    let script = s.scratch().join("lookup.lua");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scripts/lookup.lua"), &script).unwrap();
    let id = ok(&home, &["script", "register", &s.url("/"), script.to_str().unwrap()]);
    assert_eq!(id.trim().len(), 64);
    let out = ok(&home, &["script", "call", &s.url("/"), id.trim(), "/d", "a.txt"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v[0]["size"], 3);
    // by file, with input and output buffers
    let echo = s.scratch().join("echo.lua");
    std::fs::write(&echo, "output:append(input) return input:len(), ...").unwrap();
    std::fs::write(s.scratch().join("in"), b"xyz").unwrap();
    let out = ok(
        &home,
        &[
            "script",
            "call",
            &s.url("/"),
            echo.to_str().unwrap(),
            "7",
            "word",
            "--input",
            s.scratch().join("in").to_str().unwrap(),
        ],
    );
    assert_eq!(out, "xyz[3,7,\"word\"]\n");
    let bad = locus(&home, &["script", "call", &s.url("/"), echo.to_str().unwrap().replace("echo", "nope").as_str()]);
    assert_eq!(bad.status.code(), Some(1));
}

#[test]
fn storelet_run_ps_cancel_and_stats_from_the_command_line() {
    let s = TestServer::start();
    let home = s.scratch().join("home");
    s.put_local("src/a.go", b"package a\n");
    s.put_local("src/b.txt", b"b\n");
    let find = s.scratch().join("find.wasm");
    std::fs::write(&find, locus_testkit::build_storelet("find")).unwrap();
    let find = find.to_str().unwrap();
    let out =
        locus(&home, &["storelet", "run", find, "--dir", &s.url("/src"), "--account", "--", "/", "-name", "*.go"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/a.go\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("exit 0, fuel"), "the account goes to stderr");

    // A run that spins until cancelled from another invocation.
    let spin = s.scratch().join("spin.wat");
    std::fs::write(&spin, r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#).unwrap();
    let running = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["storelet", "run", spin.to_str().unwrap(), "--dir", &s.url("/")])
        .env("LOCUS_HOME", &home)
        .env("LOCUS_TOKEN", "admin:admin-token")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let run = loop {
        let ps: serde_json::Value =
            serde_json::from_str(&ok(&home, &["--json", "storelet", "ps", &s.url("/")])).unwrap();
        if let Some(r) = ps.as_array().unwrap().iter().find(|r| r["running"] == true) {
            break r["run"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "the run never showed up in ps");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(ok(&home, &["storelet", "ps", &s.url("/")]).contains("running"));
    ok(&home, &["storelet", "cancel", &s.url("/"), &run.to_string()]);
    let out = running.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cancelled") && err.lines().count() == 1, "{err}");
    let stats = ok(&home, &["storelet", "stats", &s.url("/")]);
    assert!(stats.contains("admin") && stats.contains("cancelled"), "{stats}");
}

#[test]
fn locus_cat_of_an_invocation_runs_the_handler() {
    let s = TestServer::start();
    let home = s.scratch().join("home");
    std::fs::create_dir_all(&home).unwrap();
    s.add_handler("csv", &locus_testkit::build_storelet("csv"), &[]);
    s.put_local("d/sales.csv", b"region,price\nnorth,10\nsouth,5\nnorth,7\n");
    let listed = ok(&home, &["handlers", &s.url("/")]);
    assert!(listed.lines().nth(1).is_some_and(|l| l.starts_with("csv ") && l.contains("storelet")), "{listed}");
    assert_eq!(ok(&home, &["cat", &s.url("/d/csv@sales.csv,-sum,price")]), "22\n");
    assert_eq!(ok(&home, &["cat", &s.url("/d/%2Fopt%2Fcsv+sales.csv+-count")]), "3\n");
    let out = locus(&home, &["cat", &s.url("/d/nothing@sales.csv")]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("ENOENT"));
    let json: serde_json::Value = serde_json::from_str(&ok(&home, &["--json", "handlers", &s.url("/")])).unwrap();
    assert_eq!(json[0]["name"], "csv");
}

#[test]
fn logs_are_json_objects_with_locus_log_format_json() {
    let dir = tempfile::tempdir().unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--root")
        .arg(dir.path().join("export"))
        .arg("--state")
        .arg(dir.path().join("state"))
        .env("LOCUS_LOG_FORMAT", "json")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "locus serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let wrong = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["ls", &format!("locus://127.0.0.1:{port}/")])
        .env("LOCUS_TOKEN", "admin:wrong")
        .env("LOCUS_HOME", dir.path().join("home"))
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    serve.kill().unwrap();
    let out = serve.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let event = stderr.lines().find(|l| l.contains("authentication failed")).unwrap_or_else(|| panic!("{stderr}"));
    let v: serde_json::Value = serde_json::from_str(event).expect("one JSON object per event");
    assert_eq!(v["level"], "WARN");
    assert_eq!(v["fields"]["subject"], "admin");
}

/// `locus get URL /dev/null` (or a pipe) writes into it: such targets are never
/// replaced by a regular file.
#[test]
fn get_into_a_pipe_writes_through_it() {
    let s = TestServer::start();
    let home = s.scratch().join("home");
    s.put_local("f", b"through the pipe");
    let fifo = s.scratch().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    ok(&home, &["get", &s.url("/f"), fifo.to_str().unwrap()]);
    assert_eq!(reader.join().unwrap(), b"through the pipe");
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&std::fs::metadata(&fifo).unwrap().file_type()));
}

/// One `GET path` on a fresh connection to the loopback `port`, with extra header lines.
fn http_get(port: u16, path: &str, headers: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: locus\r\n{headers}\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn serve_metrics_on_a_bare_port_listens_on_loopback_and_wants_the_files_token() {
    let home = tempfile::tempdir().unwrap();
    let (port_file, log) = (home.path().join("ports"), home.path().join("serve.log"));
    let token_file = home.path().join("metrics-token");
    std::fs::write(&token_file, "from-a-file\n").unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics", "0", "--metrics-token-file"])
        .arg(&token_file)
        .arg("--port-file")
        .arg(&port_file)
        .arg("--root")
        .arg(home.path().join("export"))
        .arg("--state")
        .arg(home.path().join("state"))
        .env("LOCUS_HOME", home.path())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = loop {
        let ports = std::fs::read_to_string(&port_file).unwrap_or_default();
        if let Some(p) = ports.lines().find_map(|l| l.strip_prefix("metrics ")?.trim().parse::<u16>().ok()) {
            break p;
        }
        assert!(server.try_wait().unwrap().is_none(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains(&format!("metrics: http://127.0.0.1:{port}/metrics (bearer token required)")), "{said}");
    let bare = http_get(port, "/metrics", "");
    assert!(bare.starts_with("HTTP/1.1 401"), "{bare}");
    let good = http_get(port, "/metrics", "Authorization: Bearer from-a-file\r\n");
    assert!(good.starts_with("HTTP/1.1 200 OK") && good.contains("locus_connections"), "{good}");
    let _ = server.kill();
    let _ = server.wait();
    // A token file that holds no token is an error, not an open endpoint.
    std::fs::write(&token_file, "\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics", "0", "--metrics-token-file"])
        .arg(&token_file)
        .arg("--root")
        .arg(home.path().join("export"))
        .arg("--state")
        .arg(home.path().join("state"))
        .env("LOCUS_HOME", home.path())
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("one token"), "{out:?}");
}
