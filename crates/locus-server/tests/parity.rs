//! One suite, two deployments: the same end-to-end checks run against one server and
//! against a cluster (two heads on one PostgreSQL namespace, two data nodes), and both
//! must pass. What a head cannot do yet is asserted as such at the end, so that the
//! day it can, this file says to move it into the suite.

use locus_client::types::{open_flags, Rights, Value};
use locus_client::Client;
use locus_proto::Code;
use locus_testkit::{wait_for_break, TestPostgres, TestServer};

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

const SALES: &str = "region,price\nnorth,10\nsouth,5\nnorth,7\n";

/// Registers the shipped `csv` storelet as a handler at `server` (each head keeps its
/// own `handlers.conf`, as an operator installs it on each).
fn with_csv(server: &TestServer) {
    server.add_handler("csv", &locus_testkit::build_storelet("csv"), &[]);
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

/// The suite. `first` and `second` are two doors to one namespace: the same server
/// twice, or two heads.
async fn suite(first: &TestServer, second: &TestServer) {
    let admin = first.client("admin").await;
    let other = second.client("admin").await;
    admin.mkdir("/p", 0o755).await.unwrap();
    let big = pattern(3 << 20);
    admin.write_file("/p/big", 0o644, &big).await.unwrap();
    admin.write_file("/p/small", 0o644, b"small").await.unwrap();

    scripts(&admin, &other, &big).await;
    shared_state(&admin, &other).await;
    messages(&admin, &other).await;
    links(&admin, &other, &big).await;
    active_files(first, &admin, &other).await;
    writable_run(first, &admin, &other).await;
    callbacks(first, &other).await;
    refusals(first, second, &admin).await;
}

/// Scripts: registered once and called by hash through either door; `fs.*` over small
/// and large files; a file written by a script; state attached to a file.
async fn scripts(admin: &Client, other: &Client, big: &[u8]) {
    let src = r#"
        local p = ...
        local st = assert(fs.stat(p))
        local _, whole = fs.get(p)
        local f = assert(fs.open(p, 1, 0))
        local piece = fs.pread(f.handle, 1000, 8)
        fs.close(f.handle)
        local names = {}
        for _, e in ipairs(fs.readdir("/p")) do names[#names + 1] = e.name end
        table.sort(names)
        return st.size, #whole, piece, table.concat(names, " ")
    "#;
    let id = admin.script_register(src).await.unwrap();
    let (values, _) = other.script_call_id(&id, vec![s("/p/big")], b"").await.unwrap();
    let piece = Value::Bytes(big[1000..1008].to_vec());
    assert_eq!(values, vec![Value::Int(big.len() as i64), Value::Int(big.len() as i64), piece, s("big small")]);
    // A script writes a file (through a handle and whole), read back outside.
    let write = r#"
        local f = assert(fs.open("/p/by-script", 2 | 4 | 16, 420))  -- WRITE | CREATE | TRUNCATE
        fs.pwrite(f.handle, 0, "written ")
        fs.pwrite(f.handle, 8, "by a script")
        assert(fs.close(f.handle))
        assert(fs.put("/p/put-by-script", 420, input))
        return true
    "#;
    let input = pattern(300 << 10);
    admin.script_call(write, vec![], &input).await.unwrap();
    assert_eq!(other.read_file("/p/by-script").await.unwrap(), b"written by a script");
    assert_eq!(other.read_file("/p/put-by-script").await.unwrap(), input);
    // State attached to a file: kept across calls, gone with the file.
    let incr = "local st = assert(state.of(...)) return st:incr('opens')";
    assert_eq!(admin.script_call(incr, vec![s("/p/small")], b"").await.unwrap().0, vec![Value::Int(1)]);
    assert_eq!(admin.script_call(incr, vec![s("/p/small")], b"").await.unwrap().0, vec![Value::Int(2)]);
    assert_eq!(
        other.script_call(incr, vec![s("/p/small")], b"").await.unwrap().0,
        vec![Value::Int(3)],
        "one file's state through either door"
    );
    admin.write_file("/p/gone", 0o644, b"x").await.unwrap();
    admin.script_call(incr, vec![s("/p/gone")], b"").await.unwrap();
    admin.unlink("/p/gone").await.unwrap();
    admin.write_file("/p/gone", 0o644, b"y").await.unwrap();
    assert_eq!(admin.script_call(incr, vec![s("/p/gone")], b"").await.unwrap().0, vec![Value::Int(1)]);
    // Errors come back as values.
    let missing = "local x, m, code = fs.stat('/p/none') return x, code";
    assert_eq!(admin.script_call(missing, vec![], b"").await.unwrap().0, vec![Value::Nil, s("ENOENT")]);
}

/// What scripts keep between calls is one through either door: a subject's named values
/// and its locks (a lock one call holds, a call through the other door waits for).
async fn shared_state(admin: &Client, other: &Client) {
    let incr = "return state.incr('hits')";
    assert_eq!(admin.script_call(incr, vec![], b"").await.unwrap().0, vec![Value::Int(1)]);
    assert_eq!(other.script_call(incr, vec![], b"").await.unwrap().0, vec![Value::Int(2)]);
    other.script_call("state.push('log', 'a') return state.push('log', 'b')", vec![], b"").await.unwrap();
    let (log, _) = admin.script_call("return state.take('log')", vec![], b"").await.unwrap();
    assert_eq!(log, vec![Value::List(vec![s("a"), s("b")])]);
    assert_eq!(other.script_call("return state.get('log')", vec![], b"").await.unwrap().0, vec![Value::Nil]);

    // The holder keeps its lock until the test has seen it held (a handshake, not a
    // race against a timer: on a loaded machine either call may wait for a CPU).
    let holder = r#"
        assert(lock.acquire('L'))
        state.set('holding', true)
        local t = time.now()
        while not state.get('seen') and time.now() - t < 4 do fs.stat('/p') end
        state.set('holding', nil)
        return state.get('seen') == true
    "#;
    let held = {
        let admin = admin.clone();
        tokio::spawn(async move { admin.script_call(holder, vec![], b"").await })
    };
    while other.script_call("return state.get('holding')", vec![], b"").await.unwrap().0 != vec![Value::Bool(true)] {
        if held.is_finished() {
            panic!("the holder ended before it was seen holding its lock: {:?}", held.await);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let try_lock = "return lock.acquire('L', 100)";
    assert_eq!(
        other.script_call(try_lock, vec![], b"").await.unwrap().0,
        vec![Value::Bool(false)],
        "held through the other door"
    );
    other.script_call("state.set('seen', true)", vec![], b"").await.unwrap();
    assert_eq!(held.await.unwrap().unwrap().0, vec![Value::Bool(true)]);
    assert_eq!(
        other.script_call(try_lock, vec![], b"").await.unwrap().0,
        vec![Value::Bool(true)],
        "released when its call ended"
    );
}

/// `msg.send` from a call through one door reaches a client connected to the other
/// (answering true only when it did), with the sender's id; an id no client has
/// answers false.
async fn messages(admin: &Client, other: &Client) {
    let mut pushes = admin.subscribe();
    let send = "return msg.send(...)";
    let to = Value::Int(admin.client_id() as i64);
    let big = vec![7u8; 100 << 10];
    for data in [&b"hello"[..], &big] {
        let (sent, _) = other.script_call(send, vec![to.clone(), Value::Bytes(data.to_vec())], b"").await.unwrap();
        assert_eq!(sent, vec![Value::Bool(true)]);
        let m = loop {
            let m = tokio::time::timeout(std::time::Duration::from_secs(5), pushes.recv()).await.unwrap().unwrap();
            if m.topic == locus_proto::frame::PUSH_MESSAGE {
                break m;
            }
        };
        assert_eq!(&m.data[..], data, "the message reached the other door's client");
        assert_eq!(locus_proto::codec::decode::<u64>(&m.meta).unwrap(), other.client_id(), "from the sender");
    }
    // An id of the same head (or server) as the recipient's that no client has.
    let nobody = Value::Int(admin.client_id() as i64 + 1000);
    assert_eq!(other.script_call(send, vec![nobody, s("x")], b"").await.unwrap().0, vec![Value::Bool(false)]);
    // An id no head gave (on a cluster: no head takes it; its sender withdraws it).
    let no_head = Value::Int((((admin.client_id() >> 32) ^ 1) << 32 | 5) as i64);
    assert_eq!(other.script_call(send, vec![no_head, s("x")], b"").await.unwrap().0, vec![Value::Bool(false)]);
}

/// Active files: a missing name invoking a registered storelet handler reads as its
/// output, through either door, reused until an input changes; a failed run leaves an
/// error record; running code needs `x` at the root.
async fn active_files(first: &TestServer, admin: &Client, other: &Client) {
    admin.write_file("/p/sales.csv", 0o644, SALES.as_bytes()).await.unwrap();
    // A larger input, kept on a data node on a cluster.
    let mut rows = String::from("region,price\n");
    for i in 0..20_000 {
        rows.push_str(&format!("r{},{}\n", i % 3, i % 10));
    }
    admin.write_file("/p/many.csv", 0o644, rows.as_bytes()).await.unwrap();
    assert!(rows.len() > 64 << 10);
    let names = |h: Vec<locus_client::types::HandlerInfo>| h.into_iter().map(|h| h.name).collect::<Vec<_>>();
    assert_eq!(names(other.handlers().await.unwrap()), ["csv"]);

    let sum = "/p/csv@sales.csv,-sum,price";
    assert_eq!(admin.read_file(sum).await.unwrap(), b"22\n");
    let attr = other.stat(sum).await.unwrap();
    assert_eq!((attr.mode & 0o7777, attr.size), (0o444, 3), "a read-only file of its output's size");
    // Reused through either door while the input is unchanged (the same result file).
    assert_eq!(other.read_file(sum).await.unwrap(), b"22\n");
    assert_eq!(admin.stat(sum).await.unwrap().ino, attr.ino);
    let big_sum = other.read_file("/p/csv@many.csv,-sum,price").await.unwrap();
    assert_eq!(big_sum, format!("{}\n", (0..20_000).map(|i| i % 10).sum::<i64>()).into_bytes());
    // Read through a handle too (as the mount does).
    let h = admin.open(sum, open_flags::READ, 0).await.unwrap();
    assert_eq!(admin.pread(h.handle, 0, 100).await.unwrap(), &b"22\n"[..]);
    admin.close(h.handle).await.unwrap();
    // Results are not listed.
    let listed: Vec<String> = admin.readdir("/p").await.unwrap().into_iter().map(|e| e.name).collect();
    assert!(listed.iter().all(|n| !n.contains('@')), "{listed:?}");
    // A changed input runs the handler again.
    other.write_file("/p/sales.csv", 0o644, b"region,price\nnorth,1\n").await.unwrap();
    assert_eq!(admin.read_file(sum).await.unwrap(), b"1\n");
    assert_ne!(admin.stat(sum).await.unwrap().ino, attr.ino, "a new run makes a new file");
    // Unknown handlers are plain ENOENT; a failed run is EIO with an error record.
    assert_eq!(admin.stat("/p/nothing@sales.csv").await.unwrap_err().code(), Code::NOENT);
    let e = admin.read_file("/p/csv@absent.csv,-count").await.unwrap_err();
    assert_eq!(e.code(), Code::IO, "{e}");
    let record = String::from_utf8(other.read_file("/p/csv@absent.csv,-count.err").await.unwrap()).unwrap();
    assert!(record.contains("absent.csv"), "{record}");
    // Running code needs x at the root.
    admin.acl_set("/", "bob", Rights::parse("rl").unwrap()).await.unwrap();
    let bob = first.client("bob").await;
    assert_eq!(bob.read_file(sum).await.unwrap_err().code(), Code::ACCES);
}

/// A writable storelet run: what it writes and removes is there afterwards, through
/// either door (on a cluster, each node's share writes its files and the head commits
/// them); a read-only run changes nothing; a subject without `w` may not start one.
async fn writable_run(first: &TestServer, admin: &Client, other: &Client) {
    let big_log = pattern(300 << 10);
    admin.mkdir("/p/w", 0o755).await.unwrap();
    admin.mkdir("/p/w/sub", 0o755).await.unwrap();
    for (path, data) in [
        ("/p/w/a.txt", &b"alpha\n"[..]),
        ("/p/w/b.txt", b"beta\n"),
        ("/p/w/sub/c.txt", b"gamma\n"),
        ("/p/w/x.tmp", b"junk"),
        ("/p/w/sub/y.tmp", b"junk"),
        ("/p/w/big.log", &big_log),
    ] {
        admin.write_file(path, 0o644, data).await.unwrap();
    }
    let edit = locus_testkit::build_storelet("edit");
    let edits: Vec<String> =
        ["upper", ".txt", "copy", ".log", ".bak", "rm", ".tmp"].iter().map(|a| a.to_string()).collect();
    // Read-only: the run cannot write, and nothing changes.
    let _ = admin.storelet_run(&edit, "/p/w", edits.clone(), false).await;
    assert_eq!(other.read_file("/p/w/a.txt").await.unwrap(), b"alpha\n");
    assert_eq!(other.stat("/p/w/x.tmp").await.unwrap().size, 4);

    let out = other.storelet_run(&edit, "/p/w", edits.clone(), true).await.unwrap();
    assert_eq!(out.result.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(lines, ["copy big.log", "rm sub/y.tmp", "rm x.tmp", "upper a.txt", "upper b.txt", "upper sub/c.txt"]);
    for door in [admin, other] {
        assert_eq!(door.read_file("/p/w/a.txt").await.unwrap(), b"ALPHA\n");
        assert_eq!(door.read_file("/p/w/sub/c.txt").await.unwrap(), b"GAMMA\n");
        assert_eq!(door.read_file("/p/w/big.log.bak").await.unwrap(), big_log);
        assert_eq!(door.read_file("/p/w/big.log").await.unwrap(), big_log);
        assert_eq!(door.stat("/p/w/x.tmp").await.unwrap_err().code(), Code::NOENT);
        assert_eq!(door.stat("/p/w/sub/y.tmp").await.unwrap_err().code(), Code::NOENT);
    }
    // Without `w` on the directory, a writable run is refused.
    admin.acl_set("/", "alice", Rights::parse("rlx").unwrap()).await.unwrap();
    let alice = first.client("alice").await;
    let e = alice.storelet_run(&edit, "/p/w", edits, true).await.unwrap_err();
    assert_eq!(e.code(), Code::ACCES, "{e}");
    assert_eq!(admin.read_file("/p/w/b.txt").await.unwrap(), b"BETA\n");
}

/// Symbolic and hard links: made through one door, followed through the other; a hard
/// link is one file under two names, whatever writes it.
async fn links(admin: &Client, other: &Client, big: &[u8]) {
    admin.symlink("big", "/p/to-big").await.unwrap();
    assert_eq!(other.readlink("/p/to-big").await.unwrap(), "big");
    assert_eq!(other.read_file("/p/to-big").await.unwrap(), big);
    assert_eq!(other.stat("/p/to-big").await.unwrap().size, big.len() as u64);

    // Hard links, of a small file and of a large one: written through a handle, the
    // file is the same under both names.
    admin.link("/p/small", "/p/small-too").await.unwrap();
    admin.link("/p/big", "/p/big-too").await.unwrap();
    let (a, b) = (other.stat("/p/small").await.unwrap(), other.stat("/p/small-too").await.unwrap());
    assert_eq!((a.ino, a.nlink), (b.ino, 2));
    assert_eq!(other.read_file("/p/small-too").await.unwrap(), b"small");
    let rewrite = |c: &Client, path: &'static str, data: Vec<u8>| {
        let c = c.clone();
        async move {
            let h = c.open(path, open_flags::WRITE | open_flags::TRUNCATE, 0).await.unwrap();
            for (i, piece) in data.chunks(1 << 20).enumerate() {
                c.pwrite(h.handle, (i << 20) as u64, piece).await.unwrap();
            }
            c.close(h.handle).await.unwrap();
        }
    };
    rewrite(other, "/p/small-too", b"written through the other name".to_vec()).await;
    assert_eq!(admin.read_file("/p/small").await.unwrap(), b"written through the other name");
    let new_big = pattern(2 << 20).into_iter().rev().collect::<Vec<u8>>();
    rewrite(other, "/p/big-too", new_big.clone()).await;
    assert_eq!(admin.read_file("/p/big").await.unwrap(), new_big);
    admin.chmod("/p/big", 0o600).await.unwrap();
    assert_eq!(other.stat("/p/big-too").await.unwrap().mode & 0o7777, 0o600);
    // A whole file put under one name is a new file there (as a file renamed over it):
    // the other name keeps the old one.
    other.write_file("/p/big-too", 0o644, big).await.unwrap();
    assert_eq!(admin.read_file("/p/big").await.unwrap(), new_big);
    assert_eq!(admin.stat("/p/big").await.unwrap().nlink, 1);
    admin.link("/p/big", "/p/big-again").await.unwrap();
    // One name goes: the other keeps the file.
    other.unlink("/p/big-again").await.unwrap();
    assert_eq!(admin.stat("/p/big").await.unwrap().nlink, 1);
    assert_eq!(admin.read_file("/p/big").await.unwrap(), new_big);
    other.unlink("/p/big-too").await.unwrap();
    // Renaming one name of a file onto another does nothing (rename(2)).
    admin.rename("/p/small-too", "/p/small").await.unwrap();
    assert_eq!(other.stat("/p/small-too").await.unwrap().nlink, 2);
    admin.unlink("/p/small-too").await.unwrap();
    assert_eq!(other.read_file("/p/small").await.unwrap(), b"written through the other name");
    assert_eq!(other.stat("/p/small").await.unwrap().nlink, 1);
    assert!(admin.link("/p", "/p-too").await.is_err(), "a directory has one name");
    admin.write_file("/p/small", 0o644, b"small").await.unwrap();
    admin.write_file("/p/big", 0o644, big).await.unwrap();
}

/// Callbacks: a holder on the first door hears of a change made through the second.
async fn callbacks(first: &TestServer, other: &Client) {
    let (holder, listener) = (first.client("admin").await, first.client("admin").await);
    let mut pushes = listener.subscribe();
    holder.callbacks(100, listener.client_id()).await.unwrap();
    holder.stat("/p/small").await.unwrap();
    holder.readdir("/p").await.unwrap();
    // A name that invokes a handler is never promised (its output follows its inputs).
    let held = first.shared().callbacks.held();
    holder.stat("/p/csv@sales.csv,-sum,price").await.unwrap();
    assert_eq!(first.shared().callbacks.held(), held, "an active file's name is never promised");
    other.write_file("/p/small", 0o644, b"changed").await.unwrap();
    wait_for_break(&mut pushes, "/p/small").await;
    holder.readdir("/p").await.unwrap();
    other.write_file("/p/made", 0o644, b"made").await.unwrap();
    wait_for_break(&mut pushes, "/p/made").await;
}

/// ACL refusals: the same answers through either door, and scripts have exactly their
/// caller's rights.
async fn refusals(first: &TestServer, second: &TestServer, admin: &Client) {
    admin.mkdir("/p/secret", 0o755).await.unwrap();
    admin.write_file("/p/secret/key", 0o644, b"key").await.unwrap();
    admin.acl_set("/", "alice", Rights::parse("rlx").unwrap()).await.unwrap();
    admin.acl_set("/p", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/p/secret", "alice", Rights(0)).await.unwrap();
    admin.acl_set("/", "bob", Rights::parse("rl").unwrap()).await.unwrap();
    // A directory alice may only list, and one of her own holding a link into it.
    admin.mkdir("/p/listed", 0o755).await.unwrap();
    admin.write_file("/p/listed/f", 0o644, b"f").await.unwrap();
    admin.acl_set("/p/listed", "alice", Rights::parse("l").unwrap()).await.unwrap();
    admin.mkdir("/p/alice", 0o755).await.unwrap();
    admin.acl_set("/p/alice", "alice", Rights::parse("rlw").unwrap()).await.unwrap();
    first.client("alice").await.symlink("/p/listed/f", "/p/alice/ln").await.unwrap();
    for door in [first, second] {
        let alice = door.client("alice").await;
        assert_eq!(alice.read_file("/p/small").await.unwrap(), b"changed");
        assert_eq!(alice.write_file("/p/small", 0o644, b"no").await.unwrap_err().code(), Code::ACCES);
        assert_eq!(alice.read_file("/p/secret/key").await.unwrap_err().code(), Code::ACCES);
        assert_eq!(alice.readdir("/p/secret").await.unwrap_err().code(), Code::ACCES);
        assert_eq!(alice.unlink("/p/small").await.unwrap_err().code(), Code::ACCES);
        assert_eq!(alice.acl_set("/p", "alice", Rights::ALL).await.unwrap_err().code(), Code::ACCES);
        let e = alice.open("/p/small", open_flags::WRITE, 0).await.unwrap_err();
        assert_eq!(e.code(), Code::ACCES);
        // A script acting as alice reads what she may, and nothing else.
        let src = "local _, a = fs.get('/p/small') local x, m, code = fs.get('/p/secret/key') \
                   local y, m2, code2 = fs.put('/p/small', 420, 'no') return a, x, code, y, code2";
        let v = alice.script_call(src, vec![], b"").await.unwrap().0;
        assert_eq!(v, vec![s("changed"), Value::Nil, s("EACCES"), Value::Nil, s("EACCES")]);
        // A file's script state needs `r` on the file, however it is named.
        let through_link = "local st, m, code = state.of('/p/alice/ln') return code";
        assert_eq!(alice.script_call(through_link, vec![], b"").await.unwrap().0, vec![s("EACCES")]);
        // Bob may not run code at all.
        let bob = door.client("bob").await;
        assert_eq!(bob.script_call("return 1", vec![], b"").await.unwrap_err().code(), Code::ACCES);
        assert_eq!(bob.script_register("return 2").await.unwrap_err().code(), Code::ACCES);
    }
    assert_eq!(admin.read_file("/p/small").await.unwrap(), b"changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_passes_on_one_server() {
    let server = TestServer::start();
    with_csv(&server);
    suite(&server, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_passes_on_two_heads_with_two_data_nodes_on_postgresql() {
    if !locus_testkit::require_postgres() {
        return; // only with LOCUS_TEST_SKIP_MISSING set (see locus_testkit::require)
    }
    let pg = TestPostgres::start();
    let first = TestServer::head(Some(&pg.url()), |_| {});
    let second = TestServer::head(Some(&pg.url()), |_| {});
    let _nodes = [TestServer::data_node(&first), TestServer::data_node(&second)];
    with_csv(&first);
    with_csv(&second);
    suite(&first, &second).await;
}

/// A head with no data node keeps every version itself and runs storelets and handlers
/// itself: it passes the suite as one server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_passes_on_a_head_without_data_nodes() {
    let head = TestServer::head(None, |_| {});
    with_csv(&head);
    suite(&head, &head).await;
}
