//! One suite, two deployments: the same end-to-end checks run against one server and
//! against a cluster (two heads on one PostgreSQL namespace, two data nodes), and both
//! must pass. What a head cannot do yet is asserted as such at the end, so that the
//! day it can, this file says to move it into the suite.

use locus_client::types::{open_flags, Rights, Value};
use locus_client::{Client, PushMessage};
use locus_proto::Code;
use locus_testkit::{TestPostgres, TestServer};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

/// Waits (up to 5 s) until a break names `path`.
async fn told(pushes: &mut UnboundedReceiver<PushMessage>, path: &str) {
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(push) = pushes.recv().await {
            if push.topic == locus_proto::frame::PUSH_BREAK
                && locus_proto::codec::decode::<Vec<String>>(&push.meta).unwrap().iter().any(|p| p == path)
            {
                return;
            }
        }
    });
    found.await.unwrap_or_else(|_| panic!("no break named {path} within 5 s"));
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
    links(&admin, &other, &big).await;
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
    admin.write_file("/p/gone", 0o644, b"x").await.unwrap();
    admin.script_call(incr, vec![s("/p/gone")], b"").await.unwrap();
    admin.unlink("/p/gone").await.unwrap();
    admin.write_file("/p/gone", 0o644, b"y").await.unwrap();
    assert_eq!(admin.script_call(incr, vec![s("/p/gone")], b"").await.unwrap().0, vec![Value::Int(1)]);
    // Errors come back as values.
    let missing = "local x, m, code = fs.stat('/p/none') return x, code";
    assert_eq!(admin.script_call(missing, vec![], b"").await.unwrap().0, vec![Value::Nil, s("ENOENT")]);
}

/// Symbolic links: made through one door, followed through the other.
async fn links(admin: &Client, other: &Client, big: &[u8]) {
    admin.symlink("big", "/p/to-big").await.unwrap();
    assert_eq!(other.readlink("/p/to-big").await.unwrap(), "big");
    assert_eq!(other.read_file("/p/to-big").await.unwrap(), big);
    assert_eq!(other.stat("/p/to-big").await.unwrap().size, big.len() as u64);
}

/// Callbacks: a holder on the first door hears of a change made through the second.
async fn callbacks(first: &TestServer, other: &Client) {
    let (holder, listener) = (first.client("admin").await, first.client("admin").await);
    let mut pushes = listener.subscribe();
    holder.callbacks(100, listener.client_id()).await.unwrap();
    holder.stat("/p/small").await.unwrap();
    holder.readdir("/p").await.unwrap();
    other.write_file("/p/small", 0o644, b"changed").await.unwrap();
    told(&mut pushes, "/p/small").await;
    holder.readdir("/p").await.unwrap();
    other.write_file("/p/made", 0o644, b"made").await.unwrap();
    told(&mut pushes, "/p/made").await;
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
    suite(&first, &second).await;
}
