//! Time of one inline script call on this thread, with a host that answers `stat` from
//! memory: what the interpreter, the `fs` binding and the result conversion cost apart
//! from the file service and the network.
//!
//!     cargo run --release -p locus-script --example call_cost [ITERATIONS [ONLY]]
//!
//! ONLY runs just the scripts whose source contains it.

use locus_proto::types::{Attr, Time, Value};
use locus_proto::{codec, Error as WireError};
use locus_script::{CallRequest, Engine, Host, Limits};
use std::time::Instant;

/// Answers `whoami` with its subject and every other operation with one `Attr`.
struct MemoryHost;

impl Host for MemoryHost {
    fn call(&mut self, op: u16, _meta: &[u8], _data: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError> {
        use locus_proto::Operation;
        if op == locus_proto::ops::Whoami::INFO.code {
            return Ok((vec![codec::encode(&"admin".to_string())], Vec::new()));
        }
        let t = Time { sec: 1_700_000_000, nsec: 5 };
        let attr = Attr { ino: 7, mode: 0o100644, nlink: 1, size: 3, blksize: 4096, atime: t, mtime: t, ctime: t, ..Attr::default() };
        Ok((vec![codec::encode(&attr)], Vec::new()))
    }
    fn push(&self, _: u64, _: &[u8]) -> bool {
        false
    }
    fn caller(&self) -> u64 {
        1
    }
    fn subject(&self) -> &str {
        "admin"
    }
}

fn main() {
    let n: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let only = std::env::args().nth(2);
    let engine = Engine::new(1, 64, 64);
    for source in [
        "return 1",
        "return fs.whoami()",
        "local p = ... local a = fs.stat(p) return 1",
        "local p = ... return fs.stat(p)",
    ]
    .into_iter()
    .filter(|s| only.as_deref().is_none_or(|o| s.contains(o)))
    {
        let id = engine.register(source).expect("compiles");
        let call = || {
            let req = CallRequest {
                id: id.clone(),
                source: None,
                args: vec![Value::Str("/x".into())],
                input: Vec::new(),
                limits: Limits::default(),
                host: Box::new(MemoryHost),
            };
            let out = engine.try_inline(req).expect("inline").expect("runs");
            codec::encode(&out.values)
        };
        for _ in 0..1000 {
            call();
        }
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(call());
        }
        println!("{:>8.2} µs  {source}", start.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
}
