//! Times the shipped `find` storelet over a directory, outside any server (`RUNS=N` runs,
//! `STORELET_ENV=NAME=VALUE` for one environment variable):
//! `cargo run --release -p locus-storelet --example time_find DIR [GLOB]`.
use locus_storelet::{build_shipped, Limits, RunSpec, Runner};
use std::time::Instant;

fn main() {
    let mut a = std::env::args().skip(1);
    let (dir, glob) = (a.next().expect("DIR"), a.next().unwrap_or_else(|| "*_test.go".into()));
    let runner = Runner::new(&std::env::temp_dir().join("locus-time-find-cache")).unwrap();
    let wasm = build_shipped("find").unwrap();
    let t = Instant::now();
    let (_, m) = runner.module(&wasm).unwrap();
    println!("module: {:?}", t.elapsed());
    let args: Vec<String> = ["find", "/", "-name", &glob].iter().map(|s| s.to_string()).collect();
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    for _ in 0..runs {
        let t = Instant::now();
        let env: Vec<(String, String)> = std::env::var("STORELET_ENV")
            .ok()
            .and_then(|kv| kv.split_once('=').map(|(k, v)| vec![(k.to_string(), v.to_string())]))
            .unwrap_or_default();
        let mut spec = RunSpec::new(&args, Limits::default()).dir(std::path::Path::new(&dir), false);
        spec.env = &env;
        let out = runner.run(&m, spec).unwrap();
        let lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
        println!("run: {:?} lines {lines} account {:?}", t.elapsed(), out.account);
    }
}
