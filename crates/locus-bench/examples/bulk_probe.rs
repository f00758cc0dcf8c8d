//! Whole-file read rate of one client (Locus `get`, Chirp `getfile`) or Locus' write rate
//! (8 MiB `pwrite`s, four in flight, as `bench ops` writes), repeated, for profiling one
//! bulk path on its own. Run against a running server:
//! `LOCUS_TOKEN=admin:TOKEN cargo run --release -p locus-bench --example bulk_probe -- locus 127.0.0.1:9610 /big 5`
//! `cargo run --release -p locus-bench --example bulk_probe -- chirp 127.0.0.1:9094 /big 5`
use locus_client::types::open_flags as of;
use locus_client::{blocking, CountingSink, LocusUrl};
use locus_drivers::chirp::ChirpClient;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, kind, addr, path, times] = &args[..] else {
        eprintln!(
            "usage: bulk_probe locus|locus-write|chirp ADDR PATH TIMES (locus-write writes 256 MiB to PATH each time)"
        );
        std::process::exit(2);
    };
    let times: usize = times.parse().expect("TIMES is a number");
    match kind.as_str() {
        "locus" => {
            let c = locus_client(addr);
            for _ in 0..times {
                let t = Instant::now();
                let mut sink = CountingSink::default();
                c.run(|c| c.get(path, &mut sink, |_, _| {})).expect("get");
                println!("locus get: {:.0} MB/s", sink.0 as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
        }
        "locus-write" => {
            let c = locus_client(addr);
            let block = bytes::Bytes::from(vec![b'z'; 8 << 20]);
            let h = c.run(|c| c.open(path, of::WRITE | of::CREATE, 0o644)).expect("open").handle;
            for _ in 0..times {
                let t = Instant::now();
                let size = 256u64 << 20;
                c.run(|c| async {
                    let mut inflight = tokio::task::JoinSet::<locus_client::Result<u64>>::new();
                    let mut off = 0u64;
                    while off < size {
                        if inflight.len() >= 4 {
                            inflight.join_next().await.expect("non-empty").expect("task").expect("pwrite");
                        }
                        let (c, block) = (c.clone(), block.clone());
                        inflight.spawn(async move { c.pwrite(h, off, &block).await });
                        off += 8 << 20;
                    }
                    while let Some(r) = inflight.join_next().await {
                        r.expect("task").expect("pwrite");
                    }
                });
                println!("locus pwrite: {:.0} MB/s", size as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
        }
        "chirp" => {
            let mut c = ChirpClient::connect(addr.parse().expect("HOST:PORT")).expect("connect");
            for _ in 0..times {
                let t = Instant::now();
                let n = c.getfile(path, &mut std::io::sink()).expect("getfile");
                println!("chirp getfile: {:.0} MB/s", n as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
        }
        other => panic!("unknown kind {other}"),
    }
}

/// A Locus client of the server at `addr`, with the credentials a `locus://` URL finds
/// (`LOCUS_TOKEN`, else `~/.locus/credentials`).
fn locus_client(addr: &str) -> blocking::Client {
    let url = LocusUrl::parse(&format!("locus://{addr}/")).expect("ADDR is HOST:PORT");
    blocking::Client::connect_url(&url).expect("connect")
}
