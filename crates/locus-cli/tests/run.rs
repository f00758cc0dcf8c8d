//! `locus run` against real servers, both through FUSE in a private namespace and traced:
//! unmodified programs (ls, cp, grep, find, tar, make
//! and cc, Python, a forking shell, a static threaded binary) work on remote paths under
//! the agent with the Locus, Chirp, HTTP and local-files drivers; and its error triage:
//! errnos pass through, a permanent error stops the program with status 1, a server
//! down past the retry window with status 75, one back within it goes unnoticed; and the
//! agent that keeps the FUSE path warm between runs.
//!
//! Longer than 700 lines because each test file is a binary of its own to build and
//! link in release: `locus run`'s end-to-end tests share one (helpers in `common`).

mod common;

use common::{admin_token, serve, start_chirp, wait_for_port};
use locus_testkit::TestServer;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `locus run --interpose MODE FLAGS... -- sh -c SCRIPT` as admin of the test server,
/// with `home` as `LOCUS_HOME`, ready to start.
fn run_command(mode: &str, flags: &[&str], script: &str, home: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_locus"));
    command
        .args(["run", "--interpose", mode])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .env("LOCUS_HOME", home)
        .env("LOCUS_TOKEN", "admin:admin-token")
        .env_remove("RUST_BACKTRACE");
    command
}

/// Where a program under `locus run` sees `path` of the test server.
fn remote(s: &TestServer, path: &str) -> String {
    format!("/locus/{}{path}", s.url("").trim_start_matches("locus://"))
}

/// [`run_command`], run to its end.
fn run(mode: &str, flags: &[&str], script: &str, home: &Path) -> Output {
    run_command(mode, flags, script, home).output().expect("locus run")
}

/// Like [`run`], asserting success; answers stdout.
fn run_ok(mode: &str, flags: &[&str], script: &str, home: &Path) -> String {
    let out = run(mode, flags, script, home);
    assert!(
        out.status.success(),
        "{script}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A small C project with a subdirectory, a header and a Makefile.
fn c_project(dir: &Path) {
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::write(
        dir.join("lib/greet.c"),
        "#include <stdio.h>\n#include \"../greet.h\"\nvoid greet(void) { puts(\"hello from locus\"); }\n",
    )
    .unwrap();
    std::fs::write(dir.join("greet.h"), "void greet(void);\n").unwrap();
    std::fs::write(dir.join("main.c"), "#include \"greet.h\"\nint main(void) { greet(); return 0; }\n").unwrap();
    std::fs::write(
        dir.join("Makefile"),
        "hello: main.o lib/greet.o\n\tcc -o $@ $^\n%.o: %.c greet.h\n\tcc -c -o $@ $<\n",
    )
    .unwrap();
}

fn unmodified_programs_work_under_the_agent(mode: &str) {
    let s = TestServer::start();
    s.put_local("data/notes.txt", b"alpha\nbeta\n");
    let home = s.scratch().join("home");
    let src = s.scratch().join("proj");
    c_project(&src);
    let r = remote(&s, "/data");

    // Listing with attributes, a copy in, search, find, a build, the program it built.
    // `/locus` lists the servers in use, and any other HOST:PORT connects when named.
    let out = run_ok(mode, &[], &format!("ls /locus && ls -la {r}"), &home);
    assert!(out.contains("notes.txt") && out.contains(" 11 "), "ls -la shows the name and size: {out}");
    run_ok(mode, &[], &format!("cp -r {} {r}/proj", src.display()), &home);
    assert!(s.local("data/proj/lib/greet.c").is_file(), "cp -r landed in the export");
    let out = run_ok(mode, &[], &format!("grep -rn greet {r}/proj | sort"), &home);
    assert_eq!(out.lines().count(), 7, "grep -r: {out}");
    let out = run_ok(mode, &[], &format!("cd {r} && find proj -name '*.c' | sort"), &home);
    assert_eq!(out, "proj/lib/greet.c\nproj/main.c\n");
    let out = run_ok(mode, &[], &format!("cd {r}/proj && make -s && pwd && ./hello"), &home);
    assert_eq!(out, format!("{r}/proj\nhello from locus\n"), "a remote working directory, make and cc");
    assert!(s.local("data/proj/hello").is_file() && s.local("data/proj/lib/greet.o").is_file());

    // tar both ways, keeping modification times.
    let tarball = s.scratch().join("proj.tar");
    run_ok(
        mode,
        &[],
        &format!("cd {r} && tar cf {} proj && mkdir back && tar xf {} -C back", tarball.display(), tarball.display()),
        &home,
    );
    let diff =
        Command::new("diff").arg("-r").arg(s.local("data/proj")).arg(s.local("data/back/proj")).output().unwrap();
    assert!(diff.status.success(), "tar round trip: {}", String::from_utf8_lossy(&diff.stdout));
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let (a, b) = (mtime(&s.local("data/proj/main.c")), mtime(&s.local("data/back/proj/main.c")));
    let skew = a.duration_since(b).or_else(|_| b.duration_since(a)).unwrap();
    assert!(skew < Duration::from_secs(2), "tar xf kept the modification time ({skew:?})");

    // Python reads and writes; a shell forks and execs children that share a file.
    run_ok(
        mode,
        &[],
        &format!("python3 -c \"p='{r}/py.txt'; open(p,'w').write('x'*100000); assert len(open(p).read()) == 100000\""),
        &home,
    );
    assert_eq!(std::fs::metadata(s.local("data/py.txt")).unwrap().len(), 100000);
    let out = run_ok(
        mode,
        &[],
        &format!("cd {r} && (echo one > kids.txt; sh -c 'echo two >> kids.txt'; cat kids.txt) | wc -l"),
        &home,
    );
    assert_eq!(out.trim(), "2");
    assert_eq!(std::fs::read_to_string(s.local("data/kids.txt")).unwrap(), "one\ntwo\n");

    // Renames and links act remotely; a file removed at the server while open stays readable.
    run_ok(mode, &[], &format!("cd {r} && mv notes.txt renamed.txt && ln -s renamed.txt link && test \"$(cat link)\" = \"$(printf 'alpha\\nbeta')\""), &home);
    assert!(s.local("data/renamed.txt").is_file() && !s.local("data/notes.txt").exists());
    let gone = s.local("data/renamed.txt");
    let script = format!("exec 3<{r}/renamed.txt; rm {}; cat <&3", gone.display());
    assert_eq!(run_ok(mode, &[], &script, &home), "alpha\nbeta\n");

    // Errors keep their errno.
    let out = run(mode, &[], &format!("cat {r}/missing"), &home);
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));
    let out = run(mode, &[], &format!("rmdir {r}/proj"), &home);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Directory not empty"));
    let out = run(mode, &[], &format!("mv {r}/kids.txt /tmp/never-here-{}", std::process::id()), &home);
    assert!(out.status.success(), "mv across file systems copies (EXDEV): {}", String::from_utf8_lossy(&out.stderr));
    assert!(!s.local("data/kids.txt").exists());
    let _ = std::fs::remove_file(format!("/tmp/never-here-{}", std::process::id()));

    // Logical names: --mount and a mount list; the program's own exit status passes through.
    let list = s.scratch().join("mounts");
    std::fs::write(&list, format!("# logical remote\n/project {r}/proj\n")).unwrap();
    let flags = ["--mount-list", list.to_str().unwrap(), "--mount", &format!("/d={}", s.url("/data"))];
    let out = run_ok(mode, &flags, "ls /project/lib && cat /d/py.txt >/dev/null && test -d /locus", &home);
    assert_eq!(out, "greet.c\ngreet.o\n");
    let out = run(mode, &flags, "exit 3", &home);
    assert_eq!(out.status.code(), Some(3));
    let out = run_ok(mode, &[], &format!("rm -r {r}/proj {r}/back && ls {r}"), &home);
    assert!(!out.contains("proj") && !s.local("data/proj").exists());
}

fn a_static_threaded_binary_forks_and_execs_under_the_agent(mode: &str) {
    let s = TestServer::start();
    s.put_local("data/in.txt", b"input\n");
    let dir = s.scratch().join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("threads.c");
    std::fs::write(
        &source,
        r#"#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
static const char *dir;
static void *work(void *arg) {
    long i = (long)arg; char p[4096], buf[64];
    snprintf(p, sizeof p, "%s/t%ld.txt", dir, i);
    FILE *f = fopen(p, "w"); if (!f) { perror(p); exit(2); }
    fprintf(f, "thread %ld\n", i); fclose(f);
    f = fopen(p, "r"); if (!f || !fgets(buf, sizeof buf, f)) { perror(p); exit(3); } fclose(f);
    if (strncmp(buf, "thread", 6)) exit(4);
    return 0;
}
int main(int argc, char **argv) {
    dir = argv[1];
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, work, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    pid_t pid = vfork();
    if (pid == 0) { execl("/bin/cat", "cat", argv[2], (char *)0); _exit(9); }
    int st; waitpid(pid, &st, 0);
    if (fork() == 0) { execl("/bin/sh", "sh", "-c", "echo forked", (char *)0); _exit(9); }
    wait(&st);
    return 0;
}
"#,
    )
    .unwrap();
    let binary = dir.join("threads");
    let built =
        Command::new("cc").args(["-static", "-pthread", "-O2", "-o"]).arg(&binary).arg(&source).status().unwrap();
    assert!(built.success(), "cc -static (libc6-dev) builds the test program");
    let r = remote(&s, "/data");
    let out = run_ok(mode, &[], &format!("{} {r} {r}/in.txt", binary.display()), &s.scratch().join("home"));
    assert_eq!(out, "input\nforked\n");
    for i in 0..4 {
        assert_eq!(std::fs::read_to_string(s.local(&format!("data/t{i}.txt"))).unwrap(), format!("thread {i}\n"));
    }
}

fn the_chirp_http_and_local_drivers_work_under_the_agent(mode: &str) {
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    // Chirp: CCTools' chirp_server, dropping clients idle for a second.
    let (root, chirp) = start_chirp(work.path());
    let flag = format!("/c=chirp://{}/", chirp.addr);
    let src = work.path().join("proj");
    c_project(&src);
    let out = run_ok(mode, &["--mount", &flag],
        &format!("ls -la /c/docs && cat /c/docs/readme.txt && sleep 1.5 && cp -r {} /c/proj && cd /c/proj && make -s && ./hello && find . -name '*.o' | sort", src.display()),
        &home,
    );
    assert!(out.contains("chirp says hi"), "{out}");
    assert!(out.ends_with("hello from locus\n./lib/greet.o\n./main.o\n"), "{out}");
    assert!(root.join("proj/hello").is_file(), "the build is on the chirp server");
    let tarball = work.path().join("c.tar");
    run_ok(mode, &["--mount", &flag], &format!("tar cf {0} -C /c proj && mkdir /c/back && tar xf {0} -C /c/back && diff -r /c/proj /c/back/proj && rm -r /c/back", tarball.display()), &home);

    // HTTP: reads through a real HTTP server; a listing can never work (permanent: status 1).
    let www = work.path().join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    std::fs::write(www.join("sub/a.txt"), "over http\n").unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = Command::new("python3")
        .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1"])
        .current_dir(&www)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    wait_for_port(port, "http.server");
    let flag = format!("/w=http://127.0.0.1:{port}/");
    let out = run_ok(mode, &["--mount", &flag], "cat /w/sub/a.txt && wc -c < /w/sub/a.txt && test -d /w/sub", &home);
    assert_eq!(out, "over http\n10\n");
    let out = run(mode, &["--mount", &flag], "echo no > /w/new.txt", &home);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Read-only file system"), "writes: EROFS");
    let out = run(mode, &["--mount", &flag], "ls /w/sub; echo still running", &home);
    assert_eq!(out.status.code(), Some(1), "a permanent error stops the program");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("still running"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP has no directory listings"));
    let _ = server.kill();
    let _ = server.wait();

    // Local files under a logical name, through the same driver trait.
    let local = work.path().join("local");
    std::fs::create_dir_all(&local).unwrap();
    let flag = format!("/l={}", local.display());
    run_ok(
        mode,
        &["--mount", &flag],
        "echo local > /l/x.txt && mkdir /l/d && mv /l/x.txt /l/d/ && cat /l/d/x.txt",
        &home,
    );
    assert_eq!(std::fs::read_to_string(local.join("d/x.txt")).unwrap(), "local\n");
}

fn a_server_back_within_the_window_goes_unnoticed_and_one_that_stays_down_ends_the_run_with_75(mode: &str) {
    let work = tempfile::tempdir().unwrap();
    let (root, state) = (work.path().join("root"), work.path().join("state"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), "first\n").unwrap();
    std::fs::write(root.join("b.txt"), "second\n").unwrap();
    let port = locus_testkit::peers::free_port().unwrap();
    let mut server = serve(&root, &state, port);
    let token = admin_token(&state);
    let agent = |script: &str| {
        Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["run", "--interpose", mode, "--retry-secs", "3", "--", "sh", "-c", script])
            .env("LOCUS_HOME", work.path().join("home"))
            .env("LOCUS_TOKEN", format!("admin:{token}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let r = format!("/locus/127.0.0.1:{port}");
    let marker = work.path().join("marker");
    let script =
        format!("cat {r}/a.txt && touch {} && sleep 1 && cat {r}/b.txt && echo written > {r}/c.txt", marker.display());

    // Killed mid-run and back within the window: the program finishes.
    let child = agent(&script);
    wait_for(&marker);
    server.kill().unwrap();
    server.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut server = serve(&root, &state, port);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\nsecond\n");
    assert_eq!(std::fs::read_to_string(root.join("c.txt")).unwrap(), "written\n");

    // Down past the window: the program is stopped with status 75 and a message to retry.
    std::fs::remove_file(&marker).unwrap();
    let child = agent(&script);
    wait_for(&marker);
    server.kill().unwrap();
    server.wait().unwrap();
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("may be run again"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\n", "the program did not go on");
    assert!(started.elapsed() >= Duration::from_secs(2), "gave up after {:?}", started.elapsed());

    // A command that does not exist: 127, as a shell says.
    let out = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["run", "--interpose", mode, "--", "/no/such/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn listings_follow_the_programs_own_changes_at_once_and_others_within_the_timeout(mode: &str) {
    let s = TestServer::start();
    s.put_local("d/old.txt", b"old");
    let home = s.scratch().join("home");
    let r = remote(&s, "/d");
    let flags = ["--attr-timeout-ms", "300"];
    // Every change the program makes shows in the listing it already has, whether the
    // agent mirrors it locally (create, remove, rename) or only at the server (mkdir,
    // symlink, link).
    let script = format!(
        "cd {r} && ls >/dev/null && echo hi > new.txt && rm old.txt && mkdir sub && ln -s new.txt lnk \
         && ln new.txt hard && mv new.txt sub/moved.txt && ls && ls sub && test ! -e old.txt && test ! -e new.txt"
    );
    let out = run_ok(mode, &flags, &script, &home);
    assert_eq!(out, "hard\nlnk\nsub\nmoved.txt\n", "{out}");
    // Another client's changes show once the listing is older than the timeout.
    let script = format!(
        "cd {r} && ls >/dev/null && test ! -e theirs.txt \
         && while [ ! -e {dir}/go ]; do sleep 0.05; done && sleep 0.4 && cat theirs.txt",
        dir = s.scratch().display()
    );
    let runner = {
        let (script, home) = (script.clone(), home.clone());
        let mode = mode.to_string();
        std::thread::spawn(move || run_ok(&mode, &flags, &script, &home))
    };
    std::thread::sleep(Duration::from_millis(1500));
    s.put_local("d/theirs.txt", b"from elsewhere");
    std::fs::write(s.scratch().join("go"), b"").unwrap();
    assert_eq!(runner.join().unwrap(), "from elsewhere");
}

fn opening_an_invocation_under_the_agent_runs_the_handler(mode: &str) {
    let s = TestServer::start();
    s.add_handler("csv", &locus_testkit::build_storelet("csv"), &[]);
    s.put_local("data/sales.csv", b"region,price\nnorth,10\nsouth,5\nnorth,7\n");
    let home = s.scratch().join("home");
    let r = remote(&s, "/data");
    let script = format!(
        "cd {r} && ls && cat csv@sales.csv,-sum,price %2Fopt%2Fcsv+sales.csv+-count && \
         python3 -c \"print(open('csv@sales.csv,-by,region,-sum,price').read(), end='')\""
    );
    assert_eq!(run_ok(mode, &[], &script, &home), "sales.csv\n22\n3\nnorth,17\nsouth,5\n");
    let out = run(mode, &[], &format!("cat {r}/nothing@sales.csv"), &home);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("No such file"));
}

/// Each test runs both ways the agent can show the namespace to the program.
macro_rules! both_ways {
    ($($name:ident),*) => {
        mod fuse {
            $(#[test]
            fn $name() {
                super::$name("fuse")
            })*
        }
        mod trace {
            $(#[test]
            fn $name() {
                super::$name("trace")
            })*
        }
    };
}

both_ways!(
    unmodified_programs_work_under_the_agent,
    a_static_threaded_binary_forks_and_execs_under_the_agent,
    the_chirp_http_and_local_drivers_work_under_the_agent,
    a_server_back_within_the_window_goes_unnoticed_and_one_that_stays_down_ends_the_run_with_75,
    listings_follow_the_programs_own_changes_at_once_and_others_within_the_timeout,
    opening_an_invocation_under_the_agent_runs_the_handler
);

#[test]
fn the_fuse_path_runs_unprivileged_and_auto_falls_back_to_tracing_where_it_cannot_mount() {
    let s = TestServer::start();
    s.put_local("data/in.txt", b"remote\n");
    let home = s.scratch().join("home");
    let r = remote(&s, "/data");
    // Not root: in a user namespace where this user is uid 1000 (or as this user when
    // the tests do not run as root), the agent makes its own user namespace.
    let script = format!("id -u && cat {r}/in.txt && echo mine > {r}/out.txt && stat -c %u {r}/out.txt");
    let locus = env!("CARGO_BIN_EXE_locus");
    let euid = rustix::process::geteuid().as_raw();
    let as_root = euid == 0;
    let mut command = if as_root {
        let mut c = Command::new("unshare");
        c.args(["--user", "--map-user=1000", "--map-group=1000", locus]);
        c
    } else {
        Command::new(locus)
    };
    let out = command
        .args(["run", "--interpose", "fuse", "--", "sh", "-c", &script])
        .env("LOCUS_HOME", &home)
        .env("LOCUS_TOKEN", "admin:admin-token")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let uid = if as_root { "1000".to_string() } else { euid.to_string() };
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{uid}\nremote\n{uid}\n"), "files are the user's own");
    assert_eq!(std::fs::read(s.local("data/out.txt")).unwrap(), b"mine\n");

    // A logical name with nowhere to mount it (its parent exists, it does not): the FUSE
    // path says so, and by default the agent traces the program instead.
    let nowhere = s.scratch().join("no-such-dir/remote");
    let flag = format!("{}={r}", nowhere.display());
    let script = format!("cat {}/in.txt", nowhere.display());
    let out = run("fuse", &["--mount", &flag], &script, &home);
    assert_eq!(out.status.code(), Some(70), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no directory to mount it on"));
    assert_eq!(run_ok("auto", &["--mount", &flag], &script, &home), "remote\n");
}

#[test]
fn on_the_fuse_path_callbacks_show_another_clients_change_however_long_the_timeout() {
    let s = TestServer::start();
    s.put_local("d/f.txt", b"one");
    let home = s.scratch().join("home");
    let r = remote(&s, "/d");
    // Cached (read, listed), then changed by another client through the protocol while
    // the program waits; a ten-minute timeout leaves the callback alone to show it.
    let script = format!(
        "cd {r} && cat f.txt && ls && while [ ! -e {dir}/go ]; do sleep 0.05; done \
         && for i in $(seq 100); do [ \"$(cat f.txt)\" = two ] && [ -e g.txt ] && break; sleep 0.02; done \
         && echo && cat f.txt && ls",
        dir = s.scratch().display()
    );
    let runner = {
        let home = home.clone();
        std::thread::spawn(move || run_ok("fuse", &["--attr-timeout-ms", "600000"], &script, &home))
    };
    std::thread::sleep(Duration::from_millis(1500));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let c = s.client("admin").await;
        c.write_file("/d/f.txt", 0o644, b"two").await.unwrap();
        c.write_file("/d/g.txt", 0o644, b"new").await.unwrap();
    });
    std::fs::write(s.scratch().join("go"), b"").unwrap();
    assert_eq!(runner.join().unwrap(), "onef.txt\n\ntwof.txt\ng.txt\n");
}

#[test]
fn on_the_fuse_path_afs_writes_back_at_close_with_the_cache_flags_given() {
    let s = TestServer::start();
    let home = s.scratch().join("home");
    let r = remote(&s, "");
    // One process, so no other close of the file (a shell's redirections close copies of
    // their descriptors, and every close stores). A first file made tells the mount the
    // server lets it write there; then it writes, reads the server's copy beside it in
    // the export, closes, and reads the file back through the mount.
    let script = format!(
        "python3 -c \"open('{r}/first.txt', 'w').close(); f = open('{r}/w.txt', 'w'); f.write('new'); f.flush(); print(open('{}').read()); \
         f.close(); print(open('{r}/w.txt').read())\"",
        s.local("w.txt").display()
    );
    let not_a_dir = s.scratch().join("not-a-dir");
    std::fs::write(&not_a_dir, b"").unwrap();
    // With a cache directory, the server has the old bytes until close; with one that
    // cannot hold copies (a file), the open truncated the server's file at once and the
    // write follows it there (pipelined: it may not have landed when the program looks).
    for (dir, written_back) in [(s.scratch().join("cache"), true), (not_a_dir, false)] {
        s.put_local("w.txt", b"old");
        let dir = dir.to_str().unwrap();
        let flags = ["--consistency", "afs", "--cache-mb", "64", "--cache-dir", dir];
        let out = run_ok("fuse", &flags, &script, &home);
        let (before_close, after) = out.split_once('\n').unwrap();
        assert_eq!(after, "new\n", "cache dir {dir}");
        match written_back {
            true => assert_eq!(before_close, "old", "cache dir {dir}"),
            false => assert!(before_close.is_empty() || before_close == "new", "cache dir {dir}: {before_close:?}"),
        }
        assert_eq!(std::fs::read(s.local("w.txt")).unwrap(), b"new");
    }
}

/// The processes of `locus run` agents started with `home` as `LOCUS_HOME`: in a session
/// of their own (the runs and their programs are in the test's), not a child of another
/// (an agent's namespace holder).
fn agents_of(home: &Path) -> Vec<i32> {
    let ours = rustix::process::getsid(None).map(|p| p.as_raw_nonzero().get()).unwrap_or(0);
    let wanted = format!("LOCUS_HOME={}", home.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if !environ.split(|&b| b == 0).any(|v| v == wanted.as_bytes()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if !cmdline.split(|&b| b == 0).any(|a| a == b"run") {
            continue;
        }
        let sid = rustix::process::Pid::from_raw(pid)
            .and_then(|p| rustix::process::getsid(Some(p)).ok())
            .map_or(0, |p| p.as_raw_nonzero().get());
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid: i32 = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
        if sid != ours {
            found.push((pid, ppid));
        }
    }
    // Not the namespace's holder, the agent's child.
    found.iter().filter(|(_, ppid)| !found.iter().any(|(p, _)| p == ppid)).map(|(pid, _)| *pid).collect()
}

/// Every request the test server has answered.
fn served_total(s: &TestServer) -> u64 {
    s.shared().store.stats("admin", 0).unwrap().ops.iter().map(|o| o.count).sum()
}

#[test]
fn a_second_run_finds_the_namespace_warm_and_keep_warm_0_does_not() {
    let s = TestServer::start();
    for i in 0..20 {
        s.put_local(&format!("d/t/{i}/f.txt"), format!("file {i}\n").as_bytes());
    }
    let r = remote(&s, "/d");
    let script = format!("find {r}/t | wc -l && cat {r}/t/7/f.txt");
    for keep in ["30", "0"] {
        let home = s.scratch().join(format!("home-{keep}"));
        let flags = ["--keep-warm", keep, "--attr-timeout-ms", "600000"];
        assert_eq!(run_ok("fuse", &flags, &script, &home), "41\nfile 7\n");
        let before = served_total(&s);
        assert_eq!(run_ok("fuse", &flags, &script, &home), "41\nfile 7\n");
        let asked = served_total(&s) - before;
        match keep {
            // The names, attributes, listings and pages were kept, promised by callbacks.
            "30" => {
                assert_eq!(asked, 0, "a warm run asked the server {asked} times");
                assert_eq!(agents_of(&home).len(), 1, "one agent serves both runs");
            }
            _ => {
                assert!(asked >= 20, "a run of its own asks again ({asked})");
                assert!(agents_of(&home).is_empty(), "no agent stays with --keep-warm 0");
            }
        }
    }
    // The agent's socket is in a directory of this user's alone.
    let dir = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).join("locus").is_dir() => Path::new(&d).join("locus"),
        _ => std::env::temp_dir().join(format!("locus-run-{}", rustix::process::geteuid().as_raw())),
    };
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
}

#[test]
fn another_token_gets_an_agent_of_its_own_and_an_idle_agent_goes() {
    let s = TestServer::start();
    s.put_local("d/secret.txt", b"for admin only\n");
    let home = s.scratch().join("home");
    let r = remote(&s, "/d");
    let flags = ["--keep-warm", "2", "--retry-secs", "1"];
    assert_eq!(run_ok("fuse", &flags, &format!("cat {r}/secret.txt"), &home), "for admin only\n");
    assert_eq!(agents_of(&home).len(), 1);
    // The same user with a token the server refuses: not the warm namespace of the
    // admin's runs, but one of its own, whose connection is refused.
    let out = run_command("fuse", &flags, &format!("cat {r}/secret.txt"), &home)
        .env("LOCUS_TOKEN", "admin:not-the-token")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("for admin only"));
    // Idle past --keep-warm, the agents go.
    let gone = Instant::now() + Duration::from_secs(10);
    while !agents_of(&home).is_empty() {
        assert!(Instant::now() < gone, "agents still there: {:?}", agents_of(&home));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_killed_agent_stops_the_programs_in_its_namespace_with_75_and_the_next_run_starts_another() {
    let s = TestServer::start();
    s.put_local("d/f.txt", b"here\n");
    let home = s.scratch().join("home");
    let r = remote(&s, "/d");
    let started = s.scratch().join("started");
    let script = format!("cat {r}/f.txt && touch {} && sleep 30 && echo survived", started.display());
    let child = run_command("fuse", &[], &script, &home).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for(&started);
    let agents = agents_of(&home);
    assert_eq!(agents.len(), 1, "{agents:?}");
    rustix::process::kill_process(rustix::process::Pid::from_raw(agents[0]).unwrap(), rustix::process::Signal::KILL)
        .unwrap();
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "the program went on for {:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "here\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(run_ok("fuse", &[], &format!("cat {r}/f.txt"), &home), "here\n");
}

#[test]
fn a_run_inside_a_run_goes_on_its_own_and_sigterm_reaches_the_program() {
    let s = TestServer::start();
    s.put_local("d/f.txt", b"inner\n");
    let home = s.scratch().join("home");
    let r = remote(&s, "/d");
    // The inner run must not start an agent beneath the outer one, which waits for
    // every process beneath it: the outer run ends as soon as the inner program does.
    let locus = env!("CARGO_BIN_EXE_locus");
    let t = Instant::now();
    let out = run_ok("fuse", &[], &format!("{locus} run --mount /inner={r} -- cat /inner/f.txt"), &home);
    assert_eq!(out, "inner\n");
    assert!(t.elapsed() < Duration::from_secs(20), "the outer run waited {:?}", t.elapsed());

    // SIGTERM to `locus run` alone goes on to the program, which may end as it likes.
    let started = s.scratch().join("started");
    let script = format!("trap 'echo terminated; exit 3' TERM; touch {}; sleep 4 & wait", started.display());
    let child = run_command("fuse", &[], &script, &home).stdout(Stdio::piped()).spawn().unwrap();
    wait_for(&started);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "terminated\n");
}

#[test]
fn what_a_warm_run_removed_and_wrote_is_at_the_server_when_it_ends() {
    let s = TestServer::start();
    for i in 0..20 {
        s.put_local(&format!("d/f{i}"), b"x");
    }
    let home = s.scratch().join("home");
    let r = remote(&s, "/d");
    let cache = s.scratch().join("cache");
    let flags = ["--consistency", "afs", "--cache-dir", cache.to_str().unwrap()];
    // Removals after the first go without waiting, and the file is stored at close: the
    // run ends only once the server has answered them all.
    run_ok("fuse", &flags, &format!("ls {r} > /dev/null && rm {r}/f* && echo new > {r}/made.txt"), &home);
    let left: Vec<String> =
        std::fs::read_dir(s.local("d")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert_eq!(left, ["made.txt"]);
    assert_eq!(std::fs::read_to_string(s.local("d/made.txt")).unwrap(), "new\n");
}

#[test]
fn runs_started_together_share_one_agent_and_new_credentials_get_another() {
    let s = TestServer::start();
    s.put_local("d/f.txt", b"same\n");
    let home = s.scratch().join("home");
    let r = remote(&s, "/d");
    // Two first runs at once: the lock lets one start the agent, the other joins it.
    let script = format!("cat {r}/f.txt");
    let both: Vec<_> = (0..2)
        .map(|_| {
            let (home, script) = (home.clone(), script.clone());
            std::thread::spawn(move || run_ok("fuse", &["--keep-warm", "5"], &script, &home))
        })
        .collect();
    for run in both {
        assert_eq!(run.join().unwrap(), "same\n");
    }
    assert_eq!(agents_of(&home).len(), 1, "{:?}", agents_of(&home));
    // A credentials file written since (in LOCUS_HOME): the rights may differ, so the
    // next run has an agent of its own.
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("credentials"), "# none\n").unwrap();
    assert_eq!(run_ok("fuse", &["--keep-warm", "5"], &script, &home), "same\n");
    assert_eq!(agents_of(&home).len(), 2, "{:?}", agents_of(&home));
    // Idle, they go.
    let gone = Instant::now() + Duration::from_secs(15);
    while !agents_of(&home).is_empty() {
        assert!(Instant::now() < gone, "agents still there: {:?}", agents_of(&home));
        std::thread::sleep(Duration::from_millis(100));
    }
}
