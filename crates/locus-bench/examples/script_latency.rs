//! Where does a scripted lookup's time go over the network? Times, against a server given
//! as ADDR and TOKEN, a plain `stat` and scripts that return a constant, a stat, a
//! constant table like a stat's, and a stat they drop. Run:
//! cargo run --release -p locus-bench --example script_latency -- 127.0.0.1:9610 TOKEN
use locus_client::types::Value;
use locus_client::{blocking, ConnectOptions, Credentials};
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
    };
    let b = blocking::Client::connect(&opts).unwrap();
    b.run(|c| c.write_file("/probe", 0o644, b"x")).unwrap();
    let scripts = [
        "return 1",
        "return fs.stat(...)",
        "local a = fs.stat(...) return 1",
        "return {size=1,mode=2,uid=3,gid=4,nlink=5,mtime={sec=6,nsec=7},atime={sec=6,nsec=7},ctime={sec=6,nsec=7},ino=9,dev=10,rdev=0,blksize=4096,blocks=8}",
    ];
    for round in 0..3 {
        let mut line = format!("round {round}:");
        let mut v = Vec::new();
        for _ in 0..2000 {
            let t = Instant::now();
            b.run(|c| c.stat("/probe")).unwrap();
            v.push(t.elapsed());
        }
        line.push_str(&format!(" stat {:.1}", p50(v)));
        for src in scripts {
            let mut v = Vec::new();
            for _ in 0..2000 {
                let t = Instant::now();
                b.run(|c| c.script_call(src, vec![Value::Str("/probe".into())], &[])).unwrap();
                v.push(t.elapsed());
            }
            line.push_str(&format!(" | {src:.30}: {:.1}", p50(v)));
        }
        println!("{line}");
    }
}
