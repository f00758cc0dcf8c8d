//! Throughput of many clients at once: CLIENTS connections, each on its own thread,
//! `stat` in a loop for SECONDS; prints the total rate and the p50 latency. For checking
//! how a server setting (say `--poll-us`) behaves under load rather than in conversation.
//! `LOCUS_TOKEN=admin:TOKEN cargo run --release -p locus-bench --example load_probe -- 127.0.0.1:9610 32 3`
use locus_client::{blocking, LocusUrl};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, clients, seconds] = &args[..] else {
        eprintln!(
            "usage: load_probe ADDR CLIENTS SECONDS (credentials: LOCUS_TOKEN=SUBJECT:TOKEN or ~/.locus/credentials)"
        );
        std::process::exit(2);
    };
    let (clients, seconds): (usize, u64) = (clients.parse().expect("CLIENTS"), seconds.parse().expect("SECONDS"));
    // Credentials as a locus:// URL finds them: LOCUS_TOKEN, else ~/.locus/credentials.
    let url = LocusUrl::parse(&format!("locus://{addr}/")).expect("ADDR is HOST:PORT");
    let until = Instant::now() + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let c = blocking::Client::connect_url(&url).expect("connect");
                let mut times = Vec::new();
                while Instant::now() < until {
                    let t = Instant::now();
                    c.run(|c| c.stat("/")).expect("stat");
                    times.push(t.elapsed());
                }
                times
            })
        })
        .collect();
    let mut all: Vec<Duration> = threads.into_iter().flat_map(|t| t.join().expect("client thread")).collect();
    all.sort();
    println!(
        "{clients} clients: {:.0} stat/s, p50 {:.1} µs, p99 {:.1} µs",
        all.len() as f64 / seconds as f64,
        all[all.len() / 2].as_secs_f64() * 1e6,
        all[all.len() * 99 / 100].as_secs_f64() * 1e6
    );
}
