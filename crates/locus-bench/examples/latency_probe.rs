//! Where does a small request's time go? Times `ping` three ways against a server given
//! as ADDR and TOKEN. Run: cargo run --release -p locus-bench --example latency_probe -- 127.0.0.1:9610 TOKEN
//! With `scripts` after the token, times instead a plain `stat` beside scripts that
//! return a constant, a stat, a constant table like a stat's, and a stat they drop (or the
//! scripts in `PROBE_SCRIPTS`, separated by `;;`).
use locus_client::types::Value;
use locus_client::{blocking, Client, ConnectOptions, Credentials};
use std::time::{Duration, Instant};

fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opts = ConnectOptions {
        addr: args[1].clone(),
        credentials: Credentials { subject: "admin".into(), token: args[2].clone() },
        tls_ca: None,
        tls_name: None,
        deadlines: Default::default(),
    };
    let b = blocking::Client::connect(&opts).unwrap();
    if args.get(3).is_some_and(|a| a == "scripts") {
        return scripts(&b);
    }
    if args.get(3).is_some_and(|a| a == "stores") {
        return stores(&b);
    }
    for round in 0..3 {
        let mut v = Vec::new();
        for _ in 0..2000 {
            let t = Instant::now();
            b.run(|c| c.ping()).unwrap();
            v.push(t.elapsed());
        }
        let facade = p50(v);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let in_loop = rt.block_on(async {
            let c = Client::connect(&opts).await.unwrap();
            let mut v = Vec::new();
            for _ in 0..2000 {
                let t = Instant::now();
                c.ping().await.unwrap();
                v.push(t.elapsed());
            }
            p50(v)
        });
        let raw = raw_blocking_ping(&args[1], &args[2]);
        println!("round {round}: blocking facade {facade:.1} µs, one block_on loop {in_loop:.1} µs, raw blocking socket {raw:.1} µs (p50)");
    }
}

/// p50 of 2000 calls of `f`, in µs.
fn timed(mut f: impl FnMut()) -> f64 {
    let mut v = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        f();
        v.push(t.elapsed());
    }
    p50(v)
}

/// A plain `stat` beside scripted lookups whose replies or work differ, three rounds.
fn scripts(b: &blocking::Client) {
    b.run(|c| c.write_file("/probe", 0o644, b"x")).unwrap();
    let scripts = [
        "return 1",
        "return fs.stat(...)",
        "local a = fs.stat(...) return 1",
        "return {size=1,mode=2,uid=3,gid=4,nlink=5,mtime={sec=6,nsec=7},atime={sec=6,nsec=7},ctime={sec=6,nsec=7},ino=9,dev=10,rdev=0,blksize=4096,blocks=8}",
    ];
    // `PROBE_SCRIPTS='a;;b'` times those scripts instead.
    let chosen = std::env::var("PROBE_SCRIPTS").ok();
    let scripts: Vec<&str> = match &chosen {
        Some(list) => list.split(";;").collect(),
        None => scripts.to_vec(),
    };
    for round in 0..3 {
        let mut line = format!(
            "round {round}: stat {:.1}",
            timed(|| {
                b.run(|c| c.stat("/probe")).unwrap();
            })
        );
        for &src in &scripts {
            let args = || vec![Value::Str("/probe".into())];
            let p = timed(|| {
                b.run(|c| c.script_call(src, args(), &[])).unwrap();
            });
            line.push_str(&format!(" | {src:.30}: {p:.1}"));
        }
        println!("{line}");
    }
}

/// A plain `stat` beside whole-file stores of 4 KiB (what a write-back mount sends at
/// close) and the same bytes through an open, write and close, three rounds.
fn stores(b: &blocking::Client) {
    let data = vec![7u8; 4096];
    b.run(|c| c.write_file("/probe", 0o644, b"x")).unwrap();
    for round in 0..3 {
        let stat = timed(|| {
            b.run(|c| c.stat("/probe")).unwrap();
        });
        let one = timed(|| {
            b.run(|c| c.write_file_cached("/probe", 0o644, b"x")).unwrap();
        });
        let cached = timed(|| {
            b.run(|c| c.write_file_cached("/probe", 0o644, &data)).unwrap();
        });
        let durable = timed(|| {
            b.run(|c| c.write_file("/probe", 0o644, &data)).unwrap();
        });
        println!("round {round}: stat {stat:.1} µs | store of 1 byte {one:.1} | store (write_file_cached) {cached:.1} | write_file {durable:.1} (p50)");
    }
}

/// A raw blocking client: login by hand, then ping frames on a plain blocking socket.
#[allow(dead_code)]
pub fn raw_blocking_ping(addr: &str, token: &str) -> f64 {
    use locus_proto::frame::{self, Header, Kind, Limits, HEADER_LEN};
    use locus_proto::ops::{Auth, Hello};
    use locus_proto::{auth, codec, Operation};
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&frame::preamble(frame::VERSION)).unwrap();
    let mut p = [0u8; 8];
    s.read_exact(&mut p).unwrap();
    let call = |s: &mut std::net::TcpStream, op: u16, meta: Vec<u8>| -> Vec<u8> {
        let h = Header { kind: Kind::Request, flags: 0, op, id: 1, meta_len: meta.len() as u32, data_len: 0 };
        let mut buf = h.encode().to_vec();
        buf.extend(meta);
        s.write_all(&buf).unwrap();
        let mut head = [0u8; HEADER_LEN];
        s.read_exact(&mut head).unwrap();
        let h = Header::decode(&head, Limits::CLIENT).unwrap();
        let mut rest = vec![0u8; (h.meta_len + h.data_len) as usize];
        s.read_exact(&mut rest).unwrap();
        rest
    };
    let ch: locus_proto::types::Challenge = codec::decode(&call(
        &mut s,
        Hello::INFO.code,
        codec::encode(&Hello { version: frame::VERSION, client: "raw".into() }),
    ))
    .unwrap();
    let nonce = vec![1u8; 32];
    let bind = auth::Binding { server: addr, tls: b"" };
    let proof = auth::client_proof(token.as_bytes(), &ch.nonce, &nonce, "admin", &bind);
    let server = addr.to_string();
    call(&mut s, Auth::INFO.code, codec::encode(&Auth { subject: "admin".into(), nonce, proof, server }));
    let mut v = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        call(&mut s, 0x03, Vec::new());
        v.push(t.elapsed());
    }
    p50(v)
}
