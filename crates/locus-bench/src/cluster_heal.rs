//! `locus bench cluster --heal-gib N`: what killing a data node costs and how fast its
//! versions get their replicas back, with readers on the surviving links and without,
//! against the rates the links allow (the setup is `cluster`'s).

use crate::cluster::{connect_head, start_cluster, ClusterArgs};
use crate::stats::median;
use crate::BenchError;
use std::process::Command;
use std::time::{Duration, Instant};

/// What killing a data node under a read load costs: reads failed, and the time until
/// every version it held has two live replicas again.
struct Healing {
    reads: usize,
    failed_reads: usize,
    lost_bytes: u64,
    detect_s: f64,
    restore_s: f64,
    /// What the readers took from the surviving nodes' links while the copies ran
    /// (gets that ended within the copying window), in bytes a second.
    read_rate: f64,
    /// Bytes the surviving node that holds the most lost replicas' other copies must send.
    busiest_source: u64,
}

/// Three nodes at replication 2 hold `heal_gib` GiB; `readers` clients (0 or 2) read it
/// in a loop while the first node is killed (SIGKILL).
fn measure_heal(args: &ClusterArgs, readers: usize, rt: &tokio::runtime::Runtime) -> Result<Healing, BenchError> {
    let flags = ["--replication", "2", "--node-timeout-s", "3"];
    let (net, _, node_pids) = start_cluster(args, 3, 2, &flags)?;
    let client = connect_head(&net, rt)?;
    let files = (args.heal_gib * 16) as usize;
    let data: Vec<u8> = (0..64u64 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for i in 0..files {
        rt.block_on(client.write_file(&format!("/h{i}"), 0o644, &data))
            .map_err(|e| BenchError::Setup(format!("put: {e}")))?;
    }
    let nodes = |rt: &tokio::runtime::Runtime| {
        rt.block_on(client.call(locus_client::ops::NodeList {}))
            .map_err(|e| BenchError::Setup(format!("node list: {e}")))
    };
    let victim = nodes(rt)?
        .into_iter()
        .find(|n| n.addr.starts_with("10.77.0.11:"))
        .ok_or_else(|| BenchError::Setup("the first data node did not join".into()))?;
    let lost_bytes = victim.versions * data.len() as u64;
    // Which surviving node holds the other replica of each version the victim holds:
    // each must send those bytes over its own link.
    let mut from_each: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for i in 0..files {
        let located = rt
            .block_on(client.call(locus_client::ops::Locate { path: format!("/h{i}") }))
            .map_err(|e| BenchError::Setup(format!("locate: {e}")))?;
        let holders = located.location.map(|l| l.nodes).unwrap_or_default();
        if holders.contains(&victim.addr) {
            for n in holders.iter().filter(|n| **n != victim.addr) {
                *from_each.entry(n.clone()).or_default() += data.len() as u64;
            }
        }
    }
    let busiest_source = from_each.values().copied().max().unwrap_or(0);
    let head_url = crate::cluster::head_url(args);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let outcome = std::thread::scope(|s| {
        let readers: Vec<_> = (1..=readers)
            .map(|c| {
                let (net, stop, head_url) = (&net, &stop, &head_url);
                s.spawn(move || {
                    let (mut reads, mut failed, mut ended) = (0, 0, Vec::new());
                    let mut i = c;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let url = format!("{head_url}h{}", i % files);
                        let status = net.locus(&format!("c{c}"), &[], &["get", &url, "/dev/null"]).status();
                        let ok = status.is_ok_and(|s| s.success());
                        failed += !ok as usize;
                        if ok {
                            ended.push(Instant::now());
                        }
                        reads += 1;
                        i += 7;
                    }
                    (reads, failed, ended)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        let killed = Instant::now();
        let _ = Command::new("kill").args(["-9", &node_pids[0].to_string()]).status();
        let (mut detect_s, mut restore_s) = (None, None);
        while restore_s.is_none() && killed.elapsed() < Duration::from_secs(1800) {
            std::thread::sleep(Duration::from_millis(200));
            let Ok(list) = nodes(rt) else { continue };
            let Some(v) = list.iter().find(|n| n.id == victim.id) else { continue };
            if v.state == "down" && detect_s.is_none() {
                detect_s = Some(killed.elapsed().as_secs_f64());
            }
            if v.versions == 0 {
                restore_s = Some(killed.elapsed().as_secs_f64());
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (detect_s, restore_s) = (detect_s.unwrap_or(f64::NAN), restore_s.unwrap_or(f64::NAN));
        let window = |t: &Instant| {
            let at = t.duration_since(killed).as_secs_f64();
            at >= detect_s && at <= restore_s
        };
        let (mut reads, mut failed, mut during) = (0, 0, 0);
        for r in readers {
            let (n, f, ended) = r.join().unwrap_or((0, 0, Vec::new()));
            reads += n;
            failed += f;
            during += ended.iter().filter(|t| window(t)).count();
        }
        let read_rate = during as f64 * data.len() as f64 / (restore_s - detect_s);
        (reads, failed, detect_s, restore_s, read_rate)
    });
    let (reads, failed_reads, detect_s, restore_s, read_rate) = outcome;
    Ok(Healing { reads, failed_reads, lost_bytes, detect_s, restore_s, read_rate, busiest_source })
}

/// Runs the healing experiment (`--heal-gib` GiB, with two readers and with none) and
/// prints a Markdown table; nothing when `--heal-gib` is 0.
pub fn run(args: &ClusterArgs) -> Result<(), BenchError> {
    if args.heal_gib == 0 {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("runtime", e))?;
    let args = args.clone();
    println!("\nHealing: {} GiB at replication 2 on 3 data nodes, the first killed (SIGKILL), with 2 clients reading in a loop and with none; head --node-timeout-s 3, --repair-rate-mib 64 (default); reads summed over {} runs, times their medians. The link-rate bounds: the lost replicas over the two surviving nodes' links at once (whole, or less what the readers took); and the tightest, the bytes the survivor holding most of the lost replicas' other copies must send over its own link (less half the readers' draw):\n", args.heal_gib, args.repeat);
    println!("| readers | reads | failed reads | replicas lost | down after s | restored after s | copying s | readers' MB/s while copying | bound s (whole links) | bound / copying | bound s (links less the readers) | bound / copying | busiest source's share | bound s (its link) | bound / copying |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for readers in [2, 0] {
        let runs: Vec<Healing> =
            (0..args.repeat).map(|_| measure_heal(&args, readers, &rt)).collect::<Result<_, _>>()?;
        let med = |f: fn(&Healing) -> f64| median(runs.iter().map(f).collect());
        let h = Healing {
            reads: runs.iter().map(|r| r.reads).sum(),
            failed_reads: runs.iter().map(|r| r.failed_reads).sum(),
            lost_bytes: med(|r| r.lost_bytes as f64) as u64,
            detect_s: med(|r| r.detect_s),
            restore_s: med(|r| r.restore_s),
            read_rate: med(|r| r.read_rate),
            busiest_source: med(|r| r.busiest_source as f64) as u64,
        };
        let link = args.rate_mbit as f64 * 1e6 / 8.0;
        let copy_s = h.restore_s - h.detect_s;
        let bound = h.lost_bytes as f64 / (2.0 * link);
        let left = (2.0 * link - h.read_rate).max(link * 0.01);
        let bound_left = h.lost_bytes as f64 / left;
        // The survivor holding the most lost replicas sends them over its link alone
        // (less its share of the readers' draw).
        let share = h.busiest_source as f64 / h.lost_bytes.max(1) as f64;
        let bound_source = h.busiest_source as f64 / (link - h.read_rate / 2.0).max(link * 0.01);
        println!(
                "| {readers} | {} | {} | {:.0} MiB | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} | {:.0}% | {:.1} | {:.2} |",
                h.reads,
                h.failed_reads,
                h.lost_bytes as f64 / (1 << 20) as f64,
                h.detect_s,
                h.restore_s,
                copy_s,
                h.read_rate / 1e6,
                bound,
                bound / copy_s,
                bound_left,
                bound_left / copy_s,
                share * 100.0,
                bound_source,
                bound_source / copy_s
            );
    }
    Ok(())
}
