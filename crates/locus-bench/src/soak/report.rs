//! What a soak reports: the server's resources, each interval's rates and latencies per
//! kind of client, the checks that pass or fail it, and the report as Markdown tables.

use crate::soak::SoakArgs;
use crate::soak::KINDS;
use serde::Serialize;
use std::collections::BTreeMap;

/// The server's resident memory, open descriptors and threads at one moment.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Resources {
    pub rss_kib: u64,
    pub fds: u64,
    pub threads: u64,
}

pub(super) fn resources(pid: u32) -> Resources {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let count = |dir: &str| std::fs::read_dir(format!("/proc/{pid}/{dir}")).map(|d| d.count() as u64).unwrap_or(0);
    Resources { rss_kib: field("VmRSS:"), fds: count("fd"), threads: field("Threads:").max(count("task")) }
}

/// One kind's numbers in one interval.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindInterval {
    pub ops: u64,
    pub ops_per_s: f64,
    pub p99_ms: f64,
    pub errors: u64,
}

/// One reported interval.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Interval {
    /// Seconds since the clients started, at the interval's end.
    pub t_s: f64,
    pub kinds: BTreeMap<String, KindInterval>,
    pub total_ops_per_s: f64,
    /// The median of the RSS samples taken during the interval.
    pub rss_kib: u64,
    /// Descriptors and threads at the interval's end.
    pub fds: u64,
    pub threads: u64,
}

/// One of the checks.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub start: f64,
    pub end: f64,
    pub pass: bool,
    pub rule: String,
}

/// The whole report (`--json` prints it).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub args: SoakArgs,
    pub duration_s: f64,
    pub interval_s: f64,
    pub warmup_intervals: usize,
    /// How many intervals each side of the throughput and RSS comparisons takes the median of.
    pub compare_intervals: usize,
    pub intervals: Vec<Interval>,
    /// The server before any client, after the warm-up, at the end with clients still
    /// running, and after every client left.
    pub resources: BTreeMap<String, Resources>,
    pub settle_s: f64,
    pub errors: BTreeMap<String, u64>,
    pub first_errors: BTreeMap<String, Vec<String>>,
    pub checks: Vec<Check>,
    pub pass: bool,
}

/// The report as Markdown tables.
pub fn table(r: &Report) -> String {
    let a = &r.args;
    let mut out = format!(
        "\n### bench soak: {:.0} s of mixed clients against one server ({} intervals of {:.0} s; the first {} are warm-up)\n\n\
         Clients, each paced: {} small-op at {}/s each; 1 large ({} MiB put/get) at {}/s; 1 script at {}/s; 1 storelet every {} s; {} afs mounts at {}/s each; 1 changer at {}/s.\n\n\
         Each cell: ops/s, p99 ms.\n\n| t s |",
        r.duration_s,
        r.intervals.len(),
        r.interval_s,
        r.warmup_intervals,
        a.small_clients,
        a.small_rate,
        a.large_mb,
        a.large_rate,
        a.script_rate,
        a.storelet_every,
        a.mounts,
        a.mount_rate,
        a.change_rate
    );
    for k in KINDS {
        out.push_str(&format!(" {k} |"));
    }
    out.push_str(" total ops/s | RSS MiB | fds | threads |\n|---|");
    out.push_str(&"---|".repeat(KINDS.len() + 4));
    out.push('\n');
    for (i, row) in r.intervals.iter().enumerate() {
        let mark = if i < r.warmup_intervals { " (warm-up)" } else { "" };
        out.push_str(&format!("| {:.0}{mark} |", row.t_s));
        for k in KINDS {
            let c = row.kinds.get(k).cloned().unwrap_or_default();
            let err = if c.errors > 0 { format!(" ({} errors)", c.errors) } else { String::new() };
            out.push_str(&format!(" {:.1}, {:.1}{err} |", c.ops_per_s, c.p99_ms));
        }
        out.push_str(&format!(
            " {:.0} | {:.1} | {} | {} |\n",
            row.total_ops_per_s,
            row.rss_kib as f64 / 1024.0,
            row.fds,
            row.threads
        ));
    }
    out.push_str("\n| server | RSS MiB | fds | threads |\n|---|---|---|---|\n");
    for (k, v) in &r.resources {
        out.push_str(&format!("| {} | {:.1} | {} | {} |\n", &k[2..], v.rss_kib as f64 / 1024.0, v.fds, v.threads));
    }
    out.push_str(&format!(
        "\n(after: {:.1} s after the last client left)\n\n| check | start | end | result | rule |\n|---|---|---|---|---|\n",
        r.settle_s
    ));
    for c in &r.checks {
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {} | {} |\n",
            c.name,
            c.start,
            c.end,
            if c.pass { "pass" } else { "FAIL" },
            c.rule
        ));
    }
    for (k, errs) in &r.first_errors {
        for e in errs {
            out.push_str(&format!("\n{k} error: {e}"));
        }
    }
    out.push_str(&format!("\n**soak: {}**\n", if r.pass { "PASS" } else { "FAIL" }));
    out
}
