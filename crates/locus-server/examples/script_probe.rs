//! Where a script call's time goes, without the network: times the plain store `stat`,
//! and script calls of `return 1`, `return fs.whoami()` and `return fs.stat(p)` through
//! the engine with the server's real host. Run:
//! cargo run --release -p locus-server --example script_probe
//! With `PROBE_SRC='return fs.stat(...)'` it runs only that script, many times (for perf);
//! with `PROBE_INLINE=1` too, on the calling thread as a connection would.
use locus_proto::types::Value;
use locus_script::CallRequest;
use locus_server::script_host::ScriptHost;
use locus_server::{Server, ServerConfig, Tokens};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("big"), vec![b'.'; 1000]).unwrap();
    let config = ServerConfig::new(&root, dir.path().join("state"));
    let tokens = Tokens::from_pairs([("admin", "secret")]);
    let server = Server::new(config, tokens).unwrap();
    let shared = server.shared().clone();
    let only = std::env::var("PROBE_SRC").ok();
    if let Some(src) = &only {
        let id = shared.scripts.register(src).unwrap();
        let inline = std::env::var_os("PROBE_INLINE").is_some();
        let t = Instant::now();
        for _ in 0..200000 {
            if inline {
                call_inline(&shared, &id);
            } else {
                call_and_wait(&shared, &id);
            }
        }
        println!("{src}: {:.2} µs", t.elapsed().as_secs_f64() * 1e6 / 200000.0);
        return;
    }
    let n = 20000;
    let t = Instant::now();
    for _ in 0..n {
        shared.store.stat("admin", "/big").unwrap();
    }
    println!("store.stat: {:.2} µs", t.elapsed().as_secs_f64() * 1e6 / n as f64);
    std::fs::create_dir_all(root.join("dir")).unwrap();
    for i in 0..20 {
        std::fs::write(root.join(format!("dir/f{i}")), b"x").unwrap();
    }
    let t = Instant::now();
    for _ in 0..n {
        shared.store.readdir("admin", "/dir").unwrap();
    }
    println!("store.readdir (20 entries): {:.2} µs", t.elapsed().as_secs_f64() * 1e6 / n as f64);
    // Bindings alone: a thousand calls inside one script call.
    for body in ["fs.whoami()", "fs.stat(p)", "fs.readdir('/dir')"] {
        let src = format!("local p = ... for i = 1, 1000 do {body} end");
        let id = shared.scripts.register(&src).unwrap();
        let t = Instant::now();
        for _ in 0..20 {
            call_and_wait(&shared, &id);
        }
        println!("binding {body}: {:.2} µs", t.elapsed().as_secs_f64() * 1e6 / 20_000.0);
    }
    for src in [
        "return 1",
        "return fs.whoami()",
        "return fs.stat(...)",
        "local a = fs.stat(...) return 1",
        "return {size=1,mode=2,uid=3,gid=4,nlink=5,mtime=6,atime=7,ctime=8,ino=9,dev=10,kind=\"file\"}",
    ] {
        let id = shared.scripts.register(src).unwrap();
        for round in 0..2 {
            let t = Instant::now();
            for _ in 0..n {
                call_and_wait(&shared, &id);
            }
            println!("{src} (round {round}): {:.2} µs", t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        let t = Instant::now();
        for _ in 0..n {
            call_inline(&shared, &id);
        }
        println!("{src} (inline): {:.2} µs", t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
}

/// Runs script `id` with the argument "/big" on this thread (it must not need the pool).
fn call_inline(shared: &Arc<locus_server::Shared>, id: &str) {
    let call = CallRequest {
        id: id.to_string(),
        source: None,
        args: vec![Value::Str("/big".into())],
        input: Vec::new(),
        limits: locus_script::Limits::default(),
        host: Box::new(ScriptHost::new(shared.clone(), "admin", 0)),
    };
    shared.scripts.try_inline(call).expect("runs inline").unwrap();
}

/// Runs script `id` with the argument "/big" and waits for its result.
fn call_and_wait(shared: &Arc<locus_server::Shared>, id: &str) {
    let host = ScriptHost::new(shared.clone(), "admin", 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let reply = Box::new(move |r| drop(tx.send(r)));
    let call = CallRequest {
        id: id.to_string(),
        source: None,
        args: vec![Value::Str("/big".into())],
        input: Vec::new(),
        limits: Default::default(),
        host: Box::new(host),
    };
    shared.scripts.call(call, reply).unwrap();
    rx.recv().unwrap().unwrap();
}
