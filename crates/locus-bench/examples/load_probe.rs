//! Throughput of many clients at once: CLIENTS connections, each on its own thread,
//! `stat` in a loop for SECONDS; prints the total rate and the p50 latency. For checking
//! how a server setting (say `--poll-us`) behaves under load rather than in conversation.
//! `LOCUS_TOKEN=admin:TOKEN cargo run --release -p locus-bench --example load_probe -- 127.0.0.1:9610 32 3`
use locus_client::{blocking, ConnectOptions, Credentials};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, clients, seconds] = &args[..] else {
        eprintln!("usage: load_probe ADDR CLIENTS SECONDS (LOCUS_TOKEN=SUBJECT:TOKEN)");
        std::process::exit(2);
    };
    let (clients, seconds): (usize, u64) = (clients.parse().expect("CLIENTS"), seconds.parse().expect("SECONDS"));
    let token = std::env::var("LOCUS_TOKEN").expect("LOCUS_TOKEN=SUBJECT:TOKEN");
    let (subject, token) = token.split_once(':').expect("SUBJECT:TOKEN");
    let opts = ConnectOptions {
        addr: addr.clone(),
        credentials: Credentials { subject: subject.into(), token: token.into() },
        tls_ca: None,
        tls_name: None,
    };
    let until = Instant::now() + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let opts = opts.clone();
            std::thread::spawn(move || {
                let c = blocking::Client::connect(&opts).expect("connect");
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
