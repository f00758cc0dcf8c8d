//! Scripts through the client API against a real server: calls, bindings, rights, the
//! sandbox, every limit, and the Scriptable RPC case studies shipped in examples/scripts.

use locus_client::types::{Rights, Value};
use locus_client::{Client, ClientError};
use locus_proto::Code;
use locus_testkit::TestServer;
use std::time::{Duration, Instant};

fn example(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../../examples/scripts/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

async fn run(c: &Client, src: &str, args: Vec<Value>) -> Result<Vec<Value>, ClientError> {
    c.script_call(src, args, &[]).await.map(|r| r.0)
}

fn code(r: Result<Vec<Value>, ClientError>) -> (Code, String) {
    let e = r.expect_err("the call should fail");
    (e.code(), e.to_string())
}

#[tokio::test]
async fn register_then_call_by_id_with_input_and_output() {
    let srv = TestServer::start();
    let c = srv.client("admin").await;
    let src = "local a, b = ...\noutput:append(input)\noutput:append('!')\nreturn a + b, 'sum'";
    let id = c.script_register(src).await.unwrap();
    assert_eq!(id, locus_client::script_id(src));
    let (values, out) = c.script_call_id(&id, vec![Value::Int(2), Value::Int(40)], b"hello").await.unwrap();
    assert_eq!(values, vec![Value::Int(42), s("sum")]);
    assert_eq!(&out[..], b"hello!");
    // The next call of the same script starts with its own input and an empty output.
    let (_, out) = c.script_call_id(&id, vec![Value::Int(0), Value::Int(0)], b"").await.unwrap();
    assert_eq!(&out[..], b"!");
    // an unknown id says so; the source-carrying call registers it
    let e = c.script_call_id(&"0".repeat(64), vec![], &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::NO_SCRIPT);
    assert_eq!(run(&c, "return 7", vec![]).await.unwrap(), vec![Value::Int(7)]);
    // compile errors and runtime errors keep their line numbers
    let (code1, msg) = code(run(&c, "return +", vec![]).await);
    assert_eq!(code1, Code::SCRIPT_ERROR);
    assert!(msg.contains("script:1"), "{msg}");
    let (code2, msg) = code(run(&c, "local x = 1\nerror('boom')", vec![]).await);
    assert_eq!(code2, Code::SCRIPT_ERROR);
    assert!(msg.contains("script:2") && msg.contains("boom"), "{msg}");
}

#[tokio::test]
async fn evicted_scripts_are_registered_again_transparently() {
    let srv = TestServer::start_with(|c| c.script_cache = 1);
    let c = srv.client("admin").await;
    let a = "return 'a'";
    let b = "return 'b'";
    assert_eq!(run(&c, a, vec![]).await.unwrap(), vec![s("a")]);
    assert_eq!(run(&c, b, vec![]).await.unwrap(), vec![s("b")]); // evicts a
    let e = c.script_call_id(&locus_client::script_id(a), vec![], &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::NO_SCRIPT);
    assert_eq!(run(&c, a, vec![]).await.unwrap(), vec![s("a")]);
}

#[tokio::test]
async fn every_file_operation_is_bound_and_errors_come_back_as_values() {
    let srv = TestServer::start();
    let c = srv.client("admin").await;
    srv.put_local("d/f", b"0123456789");
    let src = r#"
        local st = fs.stat("/d/f")
        local f = fs.open("/d/f", 3, 0)           -- READ | WRITE
        local n = fs.pwrite(f.handle, 2, "ab")
        local bytes = fs.pread(f.handle, 0, 4)
        fs.close(f.handle)
        local ok = fs.mkdir("/d/sub", 493)
        local entries = fs.readdir("/d")
        local missing, msg, code = fs.stat("/nope")
        local _, whole = fs.get("/d/f")
        return st.size, n, bytes, ok, #entries, missing, code, whole, fs.whoami()
    "#;
    let v = run(&c, src, vec![]).await.unwrap();
    assert_eq!(
        v,
        vec![
            Value::Int(10),
            Value::Int(2),
            s("01ab"),
            Value::Bool(true),
            Value::Int(2),
            Value::Nil,
            s("ENOENT"),
            s("01ab456789"),
            s("admin")
        ]
    );
    // bindings exist for every file operation of the table, and for nothing else
    let names = run(&c, "local t = {} for _, n in ipairs({'stat','lstat','fstat','open','close','pread','pwrite','get','put','readdir','mkdir','rmdir','unlink','rename','symlink','readlink','link','truncate','chmod','utimes','fsync','statfs','access','ftruncate','acl_get','acl_set','stats','whoami'}) do if type(fs[n]) ~= 'function' then t[#t+1] = n end end return #t, fs.hello, fs.script_call", vec![]).await.unwrap();
    assert_eq!(names, vec![Value::Int(0), Value::Nil, Value::Nil]);
    // arguments are the request's fields in order: a missing or mistyped one is refused
    // with the binding's name; enum fields take their variant names
    let bad = r#"
        local a, m1, c1 = fs.stat()
        local b, m2, c2 = fs.open("/d/f", "read", 0)
        local t = fs.utimes("/d/f", "Now", "Now")
        return a, c1, m1, b, c2, m2, t
    "#;
    let v = run(&c, bad, vec![]).await.unwrap();
    assert_eq!(
        (&v[0], &v[1], &v[3], &v[4], &v[6]),
        (&Value::Nil, &s("EINVAL"), &Value::Nil, &s("EINVAL"), &Value::Bool(true))
    );
    for (i, name) in [(2, "fs.stat: bad arguments (path)"), (5, "fs.open: bad arguments (path, flags, mode)")] {
        assert!(matches!(&v[i], Value::Str(m) if m.starts_with(name)), "{:?}", v[i]);
    }
}

#[tokio::test]
async fn scripts_need_the_x_right_and_act_with_the_callers_rights() {
    let srv = TestServer::start();
    let admin = srv.client("admin").await;
    let alice = srv.client("alice").await;
    srv.put_local("secret/key", b"k");
    srv.put_local("pub/readme", b"r");
    let (c1, _) = code(run(&alice, "return 1", vec![]).await);
    assert_eq!(c1, Code::ACCES);
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    admin.acl_set("/pub", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/secret", "alice", Rights(0)).await.unwrap();
    let v = run(
        &alice,
        "local _, a = fs.get('/pub/readme') local x, m, code = fs.get('/secret/key') return a, x, code",
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(v, vec![s("r"), Value::Nil, s("EACCES")]);
}

#[tokio::test]
async fn the_sandbox_has_no_way_out() {
    let srv = TestServer::start();
    let c = srv.client("admin").await;
    let v = run(
        &c,
        "return io, os, require, load, loadfile, dofile, debug, string.dump, package, collectgarbage, rawset",
        vec![],
    )
    .await
    .unwrap();
    assert!(v.iter().all(|x| *x == Value::Nil), "{v:?}");
    // libraries are read-only, and globals do not leak between calls
    let (code1, _) = code(run(&c, "string.rep = function() return 'pwned' end", vec![]).await);
    assert_eq!(code1, Code::SCRIPT_ERROR);
    assert!(run(&c, "return getmetatable('')", vec![]).await.unwrap() == vec![Value::Bool(false)]);
    run(&c, "leaked = 42 fs_backup = fs", vec![]).await.unwrap();
    assert_eq!(run(&c, "return leaked, ('x'):rep(3)", vec![]).await.unwrap(), vec![Value::Nil, s("xxx")]);
    // nor between calls of one script, whether the call ends well or fails
    let again = "local before = seen seen = true if ... then error('stop') end return before";
    for fail in [false, true, false] {
        let r = run(&c, again, vec![Value::Bool(fail)]).await;
        if fail {
            assert_eq!(code(r).0, Code::SCRIPT_ERROR);
        } else {
            assert_eq!(r.unwrap(), vec![Value::Nil]);
        }
    }
}

#[tokio::test]
async fn hostile_scripts_end_with_the_named_limit_and_free_their_locks() {
    let srv = TestServer::start_with(|c| {
        c.script_limits.wall = Duration::from_secs(2);
        c.script_limits.instructions = 20_000_000;
        c.script_limits.memory = 8 << 20;
        c.script_limits.result_bytes = 1 << 20;
    });
    let c = srv.client("admin").await;
    let cases = [
        ("while true do end", "instruction"),
        ("local t = {} while true do t[#t+1] = ('x'):rep(1000) end", "memory"),
        // deep recursion runs out of memory or of stack, whichever comes first
        ("local function f(n) return 1 + f(n + 1) end return f(1)", "stack|memory"),
        ("return ('x'):rep(2 * 1024 * 1024)", "result"),
        ("local b = buffer.new() while true do b:append(('y'):rep(65536)) end", "memory"),
        ("while true do pcall(function() while true do end end) end", "instruction"),
        ("lock.acquire('L') error('oops')", ""),
        ("lock.acquire('L') while true do end", "instruction"),
    ];
    for (src, limit) in cases {
        let t = Instant::now();
        let (got, msg) = code(run(&c, src, vec![]).await);
        if limit.is_empty() {
            assert_eq!(got, Code::SCRIPT_ERROR, "{src}: {msg}");
        } else {
            assert_eq!(got, Code::LIMIT, "{src}: {msg}");
            assert!(limit.split('|').any(|l| msg.contains(l)), "{src}: {msg}");
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{src} took {:?}", t.elapsed());
        assert!(!srv.shared().scripts.lock_held("L"), "{src} left its lock held");
    }
    // a script that sleeps on a lock held by another is stopped by its deadline
    let srv2 = TestServer::start_with(|c| c.script_limits.wall = Duration::from_millis(300));
    let c2 = srv2.client("admin").await;
    let waiter = "return lock.acquire('M')";
    assert_eq!(run(&c2, "return lock.acquire('M')", vec![]).await.unwrap(), vec![Value::Bool(true)]);
    assert_eq!(run(&c2, waiter, vec![]).await.unwrap(), vec![Value::Bool(true)], "released when the first call ended");
    // the server is fine afterwards
    assert_eq!(run(&c, "return 1", vec![]).await.unwrap(), vec![Value::Int(1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_operations_keep_going_while_hostile_scripts_run() {
    let srv = TestServer::start_with(|c| c.script_limits.wall = Duration::from_secs(3));
    srv.put_local("f", b"x");
    let c = srv.client("admin").await;
    let mut hostile = Vec::new();
    for _ in 0..4 {
        let c = srv.client("admin").await;
        hostile.push(tokio::spawn(async move { c.script_call("while true do end", vec![], &[]).await }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    for _ in 0..500 {
        c.stat("/f").await.unwrap();
    }
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "500 stats took {took:?} beside busy scripts");
    for h in hostile {
        assert_eq!(h.await.unwrap().unwrap_err().code(), Code::LIMIT);
    }
}

#[tokio::test]
async fn case_study_read_getattr_and_read_if_modified() {
    let srv = TestServer::start();
    let c = srv.client("admin").await;
    srv.put_local("dir/a", b"aaaa");
    srv.put_local("dir/b", b"bb");
    let v = run(&c, &example("lookup.lua"), vec![s("/dir"), s("b")]).await.unwrap();
    let Value::Map(attr) = &v[0] else { panic!("{v:?}") };
    assert!(attr.contains(&("size".to_string(), Value::Int(2))));
    let v = run(&c, &example("lookup.lua"), vec![s("/dir"), s("zz")]).await.unwrap();
    assert_eq!(v[0], Value::Nil);

    let st = c.stat("/dir/a").await.unwrap();
    let src = example("read_if_modified.lua");
    let args = |sec: i64, nsec: u32| vec![s("/dir/a"), Value::Int(sec), Value::Int(nsec as i64)];
    let (v, out) = c.script_call(&src, args(st.mtime.sec, st.mtime.nsec), &[]).await.unwrap();
    assert_eq!((v, out.len()), (vec![s("unchanged")], 0));
    let (v, out) = c.script_call(&src, args(1, 0), &[]).await.unwrap();
    assert_eq!(v[0], s("changed"));
    assert_eq!(&out[..], b"aaaa");
}

#[tokio::test]
async fn case_study_partial_write() {
    let srv = TestServer::start();
    let c = srv.client("admin").await;
    srv.put_local("big", &vec![b'.'; 100_000]);
    let (v, _) =
        c.script_call(&example("partial_write.lua"), vec![s("/big"), Value::Int(500)], &[b'#'; 100]).await.unwrap();
    assert_eq!(v, vec![Value::Int(100)]);
    let data = std::fs::read(srv.local("big")).unwrap();
    assert_eq!(data.len(), 100_000);
    assert!(data[500..600].iter().all(|b| *b == b'#') && data[499] == b'.' && data[600] == b'.');
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_study_directory_updates_under_contention_lose_nothing() {
    let srv = TestServer::start();
    srv.put_local("shared.dir", b"");
    let src = example("dir_append.lua");
    let mut tasks = Vec::new();
    for client in 0..8 {
        let c = srv.client("admin").await;
        let src = src.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                c.script_call(&src, vec![s("/shared.dir"), s(&format!("c{client}-e{i}"))], &[]).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let body = std::fs::read_to_string(srv.local("shared.dir")).unwrap();
    let mut names: Vec<&str> = body.lines().collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 200, "lost updates");
}

#[tokio::test]
async fn case_study_afs_callbacks_reach_every_caching_client() {
    let srv = TestServer::start();
    srv.put_local("doc", b"v1");
    let src = example("afs_callbacks.lua");
    let writer = srv.client("admin").await;
    let mut readers = Vec::new();
    for _ in 0..3 {
        let r = srv.client("admin").await;
        let pushes = r.subscribe();
        r.script_call(&src, vec![s("open"), s("/doc")], &[]).await.unwrap();
        readers.push((r, pushes));
    }
    writer.script_call(&src, vec![s("open"), s("/doc")], &[]).await.unwrap();
    assert_eq!(srv.shared().scripts.object_states().len(), 1, "the callbacks are /doc's own state");
    let (v, _) = writer.script_call(&src, vec![s("close"), s("/doc")], &[]).await.unwrap();
    assert_eq!(v, vec![Value::Int(3)]);
    assert!(srv.shared().scripts.object_states().is_empty(), "broken callbacks are taken");
    for (_, pushes) in readers.iter_mut() {
        let m = tokio::time::timeout(Duration::from_secs(2), pushes.recv()).await.unwrap().unwrap();
        assert_eq!(m.topic, locus_proto::frame::PUSH_MESSAGE);
        assert_eq!(&m.data[..], b"break /doc");
        let from: u64 = locus_proto::codec::decode(&m.meta).unwrap();
        assert_eq!(from, writer.client_id());
    }
}

#[tokio::test]
async fn limits_can_differ_per_subject() {
    let srv = TestServer::start_with(|c| {
        let tight = locus_testkit::script::Limits { instructions: 10_000, ..c.script_limits };
        c.script_limits_by_subject.insert("alice".into(), tight);
    });
    let admin = srv.client("admin").await;
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    let alice = srv.client("alice").await;
    let busy = "local n = 0 for i = 1, 100000 do n = n + i end return n";
    assert_eq!(run(&admin, busy, vec![]).await.unwrap(), vec![Value::Int(5_000_050_000)]);
    let (c, msg) = code(run(&alice, busy, vec![]).await);
    assert_eq!(c, Code::LIMIT);
    assert!(msg.contains("instruction"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_replies_arrive_whole_and_after_the_messages_they_sent() {
    let srv = TestServer::start();
    srv.put_local("f", b"data");
    let c = srv.client("admin").await;
    // Small replies leave from the interpreter's thread; replies larger than the
    // connection's write buffer go through the connection's thread: mix both, pipelined.
    let src = "local n, tag = ...\noutput:append(string.rep(tag, n))\nreturn n, tag";
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..64i64 {
        let c = c.clone();
        let src = src.to_string();
        calls.spawn(async move {
            let n = if i % 4 == 0 { 300_000 } else { i };
            let tag = format!("{}", (b'a' + (i % 26) as u8) as char);
            let (v, out) = c.script_call(&src, vec![Value::Int(n), s(&tag)], &[]).await.unwrap();
            assert_eq!(v, vec![Value::Int(n), s(&tag)]);
            assert_eq!(out.len(), n as usize);
            assert!(out.iter().all(|&b| b == tag.as_bytes()[0]));
            c.stat("/f").await.unwrap().size
        });
    }
    while let Some(size) = calls.join_next().await {
        assert_eq!(size.unwrap(), 4);
    }
    // A message a script sends its caller is on the client before the call's reply.
    let mut pushes = c.subscribe();
    for i in 0..20 {
        let (v, _) =
            c.script_call("msg.send(msg.caller(), ...) return 1", vec![s(&format!("m{i}"))], &[]).await.unwrap();
        assert_eq!(v, vec![Value::Int(1)]);
        let m = pushes.try_recv().expect("the message came before the reply");
        assert_eq!(&m.data[..], format!("m{i}").as_bytes());
    }
}

#[tokio::test]
async fn state_attached_to_a_file_follows_it_and_goes_with_it() {
    let srv = TestServer::start();
    let admin = srv.client("admin").await;
    let objects = srv.shared().scripts.object_states();
    let count = "local st, m, code = state.of(...) if not st then return nil, code end return st:get('opens')";
    let open = "local st = assert(state.of(...)) return st:incr('opens')";
    srv.put_local("f", b"x");
    assert_eq!(run(&admin, open, vec![s("/f")]).await.unwrap(), vec![Value::Int(1)]);
    assert_eq!(run(&admin, open, vec![s("/f")]).await.unwrap(), vec![Value::Int(2)]);
    assert_eq!(objects.len(), 1);
    // Another file has none of it.
    srv.put_local("other", b"y");
    assert_eq!(run(&admin, count, vec![s("/other")]).await.unwrap(), vec![Value::Nil]);
    // It follows the file across a rename, as an open handle does.
    admin.rename("/f", "/g").await.unwrap();
    assert_eq!(run(&admin, count, vec![s("/g")]).await.unwrap(), vec![Value::Int(2)]);
    assert_eq!(run(&admin, count, vec![s("/f")]).await.unwrap(), vec![Value::Nil, s("ENOENT")]);
    // Removing the file drops its state; so do replacing it by rename and by put.
    admin.unlink("/g").await.unwrap();
    assert_eq!(objects.len(), 0);
    srv.put_local("g", b"new");
    assert_eq!(run(&admin, count, vec![s("/g")]).await.unwrap(), vec![Value::Nil]);
    run(&admin, open, vec![s("/g")]).await.unwrap();
    admin.rename("/other", "/g").await.unwrap();
    assert_eq!(objects.len(), 0);
    run(&admin, open, vec![s("/g")]).await.unwrap();
    admin.write_file("/g", 0o644, b"replaced").await.unwrap();
    assert_eq!(objects.len(), 0);
    // A second name keeps the object (and its state) alive until the last one goes.
    run(&admin, open, vec![s("/g")]).await.unwrap();
    std::fs::hard_link(srv.local("g"), srv.local("h")).unwrap();
    admin.unlink("/g").await.unwrap();
    assert_eq!(run(&admin, count, vec![s("/h")]).await.unwrap(), vec![Value::Int(1)]);
    admin.unlink("/h").await.unwrap();
    assert_eq!(objects.len(), 0);
    // Directories too.
    admin.mkdir("/d", 0o755).await.unwrap();
    run(&admin, open, vec![s("/d")]).await.unwrap();
    admin.rmdir("/d").await.unwrap();
    assert_eq!(objects.len(), 0);
}

#[tokio::test]
async fn a_files_state_needs_the_callers_read_access_to_the_file() {
    let srv = TestServer::start();
    let admin = srv.client("admin").await;
    let alice = srv.client("alice").await;
    srv.put_local("pub/f", b"x");
    srv.put_local("secret/f", b"x");
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    admin.acl_set("/pub", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/secret", "alice", Rights::parse("l").unwrap()).await.unwrap();
    let set = "local p, v = ... assert(state.of(p)):set('owner', v)";
    run(&admin, set, vec![s("/pub/f"), s("admin")]).await.unwrap();
    run(&admin, set, vec![s("/secret/f"), s("admin")]).await.unwrap();
    let get = "local st, m, code = state.of(...) if not st then return nil, code end return st:get('owner')";
    assert_eq!(run(&alice, get, vec![s("/pub/f")]).await.unwrap(), vec![s("admin")]);
    assert_eq!(run(&alice, get, vec![s("/secret/f")]).await.unwrap(), vec![Value::Nil, s("EACCES")]);
    assert_eq!(run(&alice, get, vec![s("/pub/none")]).await.unwrap(), vec![Value::Nil, s("ENOENT")]);
}

#[tokio::test]
async fn buffers_copy_to_and_from_files_without_lua_strings() {
    let srv = TestServer::start();
    let admin = srv.client("admin").await;
    srv.put_local("in", b"hello, world");
    let src = r#"
        local src = assert(fs.open('/in', 1, 0)).handle
        local dst = assert(fs.open('/out', 2 | 4, 420)).handle
        local b = assert(buffer.read(src, 7, 100))
        b:append('!')
        local n = assert(b:write(dst, 0))
        local bad, msg, code = buffer.read(9999, 0, 1)
        local bad2, msg2, code2 = b:write(src, 0)
        return b:len(), n, bad, code, bad2, code2
    "#;
    let v = run(&admin, src, vec![]).await.unwrap();
    assert_eq!(v, vec![Value::Int(6), Value::Int(6), Value::Nil, s("EBADF"), Value::Nil, s("EBADF")]);
    assert_eq!(std::fs::read(srv.local("out")).unwrap(), b"world!");
    // What a read asks for counts against the call's memory before it is read.
    let limited = TestServer::start_with(|c| c.script_limits.memory = 1 << 20);
    let c = limited.client("admin").await;
    limited.put_local("in", b"x");
    let (c1, msg) =
        code(run(&c, "local h = fs.open('/in', 1, 0).handle return buffer.read(h, 0, 4000000)", vec![]).await);
    assert_eq!(c1, Code::LIMIT, "{msg}");
    assert!(msg.contains("memory"), "{msg}");
}

#[tokio::test]
async fn named_state_is_each_subjects_own() {
    let srv = TestServer::start();
    let admin = srv.client("admin").await;
    let alice = srv.client("alice").await;
    admin.acl_set("/", "alice", Rights::parse("x").unwrap()).await.unwrap();
    run(&admin, "state.set('secret', 'admin only') state.push('list', 1)", vec![]).await.unwrap();
    let look = "return state.get('secret'), state.take('list')";
    assert_eq!(run(&alice, look, vec![]).await.unwrap(), vec![Value::Nil, Value::Nil]);
    run(&alice, "state.set('secret', 'alice only')", vec![]).await.unwrap();
    let v = run(&admin, look, vec![]).await.unwrap();
    assert_eq!(v[0], s("admin only"));
    assert_eq!(run(&alice, "return state.get('secret')", vec![]).await.unwrap(), vec![s("alice only")]);
}

#[tokio::test]
async fn a_handle_to_a_removed_file_cannot_attach_state_to_its_successor() {
    let srv = TestServer::start();
    let admin = srv.client("admin").await;
    srv.put_local("s", b"x");
    let src = r#"
        local old = assert(state.of('/s'))
        assert(fs.unlink('/s'))
        assert(fs.put('/s', 420, 'a new file, perhaps with the old inode number'))
        local ok, err = pcall(function() old:set('k', 1) end)
        local new = assert(state.of('/s'))
        new:set('k', 2)
        return ok, err, new:get('k')
    "#;
    let v = run(&admin, src, vec![]).await.unwrap();
    assert_eq!(v[0], Value::Bool(false));
    let Value::Str(msg) = &v[1] else { panic!("{v:?}") };
    assert!(msg.contains("removed or replaced"), "{msg}");
    assert_eq!(v[2], Value::Int(2));
    assert_eq!(srv.shared().scripts.object_states().len(), 1);
}

#[tokio::test]
async fn short_lookups_answer_at_once_and_anything_more_runs_once_with_its_own_limits() {
    let srv = TestServer::start();
    srv.put_local("f", b"abc");
    let c = srv.client("admin").await;
    // A lookup, answered on the connection's thread.
    assert_eq!(run(&c, "return fs.stat('/f').size", vec![]).await.unwrap(), vec![Value::Int(3)]);
    assert_eq!(run(&c, "local a, e, code = fs.stat('/nope') return code", vec![]).await.unwrap(), vec![s("ENOENT")]);
    // A lookup and then a change: the call moves to an interpreter before the change, so
    // the change is made once (made twice, the second mkdir would fail).
    for n in 1..=3 {
        let src = "fs.stat('/f') local ok = fs.mkdir('/d' .. select(1, ...), 493) return ok, state.incr('n', 1)";
        let got = run(&c, src, vec![Value::Int(n)]).await.unwrap();
        assert_eq!(got, vec![Value::Bool(true), Value::Int(n)], "call {n}");
    }
    // Longer than the inline budget, within the call's own limits: it completes.
    let src = "local s = 0 for i = 1, 200000 do s = s + i end return s";
    assert_eq!(run(&c, src, vec![]).await.unwrap(), vec![Value::Int(20_000_100_000)]);
    // A script error is the same error either way.
    let (got, msg) = code(run(&c, "error('plain')", vec![]).await);
    assert_eq!(got, Code::SCRIPT_ERROR, "{msg}");
    assert!(msg.contains("plain"), "{msg}");
}
