//! A delay proxy on its own, for looking at a workload at an emulated round-trip time.
//! Run: cargo run --release -p locus-bench --example delay_proxy -- TARGET RTT_MS
//! It prints the address to connect to and runs until killed.
use locus_testkit::proxy::DelayProxy;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let target = args.get(1).expect("TARGET address").parse().expect("HOST:PORT");
    let rtt: f64 = args.get(2).map_or(1.0, |s| s.parse().expect("RTT in ms"));
    let proxy = DelayProxy::start(target, Duration::from_secs_f64(rtt / 2000.0)).expect("proxy");
    println!("{}", proxy.addr);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
