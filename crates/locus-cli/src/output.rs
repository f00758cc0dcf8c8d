//! Rendering for people (`ls -l` style) and for programs (`--json`).

use locus_client::types::{
    Attr, DeviceStats, DirEntry, HandlerInfo, IoCounters, NodeInfo, Rebalance, StatFs, StatsReport, StoreletReport,
    StoreletResult, StoreletRunInfo, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG,
};
use serde_json::{json, Value};

/// `drwxr-xr-x` for a mode.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & S_IFMT {
        S_IFDIR => 'd',
        S_IFLNK => 'l',
        S_IFREG => '-',
        0o020000 => 'c',
        0o060000 => 'b',
        0o010000 => 'p',
        0o140000 => 's',
        _ => '?',
    };
    let mut s = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// A file time for people, in UTC: `2026-11-24T09:53Z`, or with seconds and nanoseconds.
fn when(t: &locus_proto::types::Time, precise: bool) -> String {
    let Ok(at) = time::OffsetDateTime::from_unix_timestamp(t.sec) else { return format!("{}s", t.sec) };
    let (d, h) = (at.date(), at.time());
    let day = format!("{:04}-{:02}-{:02}T{:02}:{:02}", d.year(), d.month() as u8, d.day(), h.hour(), h.minute());
    if precise {
        format!("{day}:{:02}.{:09}Z", h.second(), t.nsec)
    } else {
        format!("{day}Z")
    }
}

/// One `ls -l` line.
pub fn long_line(name: &str, a: &Attr) -> String {
    format!(
        "{} {:>3} {:>5} {:>5} {:>12} {} {}",
        mode_string(a.mode),
        a.nlink,
        a.uid,
        a.gid,
        a.size,
        when(&a.mtime, false),
        name
    )
}

/// Attributes as JSON.
pub fn attr_json(a: &Attr) -> Value {
    json!({
        "mode": format!("{:o}", a.mode), "type": mode_string(a.mode)[..1].to_string(),
        "size": a.size, "nlink": a.nlink, "uid": a.uid, "gid": a.gid, "ino": a.ino, "dev": a.dev,
        "blocks": a.blocks, "blksize": a.blksize,
        "atime": a.atime.sec, "mtime": a.mtime.sec, "ctime": a.ctime.sec,
    })
}

/// A listing as JSON.
pub fn entries_json(entries: &[DirEntry]) -> Value {
    Value::Array(entries.iter().map(|e| json!({"name": e.name, "attr": attr_json(&e.attr)})).collect())
}

/// `stat` output for people.
pub fn attr_text(path: &str, a: &Attr) -> String {
    format!(
        "  path: {path}\n  type: {}\n  mode: {:o} ({})\n  size: {}\n links: {}\n owner: {}:{}\n inode: {}\n mtime: {}\n atime: {}\n ctime: {}",
        match a.mode & S_IFMT { S_IFDIR => "directory", S_IFLNK => "symlink", S_IFREG => "file", _ => "other" },
        a.mode & 0o7777, mode_string(a.mode), a.size, a.nlink, a.uid, a.gid, a.ino,
        when(&a.mtime, true), when(&a.atime, true), when(&a.ctime, true)
    )
}

/// `df` as JSON.
pub fn statfs_json(s: &StatFs) -> Value {
    json!({"block_size": s.frsize, "blocks": s.blocks, "free": s.bfree, "available": s.bavail,
           "files": s.files, "files_free": s.ffree, "name_max": s.namemax})
}

/// Bytes for people: 1.5 GiB.
pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Mean and 99th percentile of a kind of operation, in µs.
fn times(count: u64, total_ns: u64, p99_ns: u64) -> String {
    if count == 0 {
        return "-".into();
    }
    format!("{:.1}/{:.0}", total_ns as f64 / count as f64 / 1000.0, p99_ns as f64 / 1000.0)
}

/// The columns of I/O counters shared by the file and device tables: bytes read and
/// written, reads, writes, and read and write times (mean/p99 µs).
fn io_columns(io: &IoCounters) -> String {
    format!(
        "{:>10} {:>10} {:>8} {:>8} {:>12} {:>12}",
        human(io.read_bytes),
        human(io.write_bytes),
        io.reads,
        io.writes,
        times(io.reads, io.read_ns, io.read_p99_ns),
        times(io.writes, io.write_ns, io.write_p99_ns)
    )
}

/// `stats` for people.
pub fn stats_text(r: &StatsReport) -> String {
    let e = &r.export;
    let mut s = format!(
        "clients connected: {}\nexport: {} reads ({}), {} writes ({})\n",
        r.clients,
        e.reads,
        human(e.read_bytes),
        e.writes,
        human(e.write_bytes)
    );
    s.push_str(&format!(
        "callbacks: {} promises held, {} refused (bounds reached), {} inotify watches\n",
        r.promises_held, r.promises_refused, r.watches
    ));
    s.push_str("\noperation        count   mean µs\n");
    let mut ops = r.ops.clone();
    ops.sort_by_key(|o| std::cmp::Reverse(o.count));
    for o in &ops {
        s.push_str(&format!(
            "{:<12} {:>9} {:>9.1}\n",
            o.op,
            o.count,
            o.total_ns as f64 / o.count.max(1) as f64 / 1000.0
        ));
    }
    s.push('\n');
    s.push_str(&devices_text(&r.devices));
    s.push_str("\nbusiest files (by load: bytes moved + 4 KiB per operation; read and write µs as mean/p99)\n");
    s.push_str(&format!(
        "{:>10} {:>10} {:>8} {:>8} {:>12} {:>12} {:>3}  PATH\n",
        "READ", "WRITTEN", "READS", "WRITES", "READ µs", "WRITE µs", "DEV"
    ));
    for f in &r.busiest {
        s.push_str(&format!("{} {:>3}  {}\n", io_columns(&f.io), f.device, f.path));
    }
    s
}

/// The devices' load, service times and space, for people.
pub fn devices_text(devices: &[DeviceStats]) -> String {
    let total: u64 = devices.iter().map(|d| d.io.load()).sum::<u64>().max(1);
    let mut s = format!(
        "{:>3} {:>6} {:>10} {:>10} {:>8} {:>8} {:>12} {:>12} {:>10} {:>10}  PATH\n",
        "DEV", "LOAD%", "READ", "WRITTEN", "READS", "WRITES", "READ µs", "WRITE µs", "FREE", "SIZE"
    );
    for d in devices {
        s.push_str(&format!(
            "{:>3} {:>6.1} {} {:>10} {:>10}  {}\n",
            d.index,
            100.0 * d.io.load() as f64 / total as f64,
            io_columns(&d.io),
            human(d.free_bytes),
            human(d.total_bytes),
            d.path
        ));
    }
    s
}

/// A rebalancing plan, or what applying one did, for people.
pub fn rebalance_text(r: &Rebalance, applied: bool) -> String {
    let loads = |v: &[u64]| v.iter().map(|&l| human(l)).collect::<Vec<_>>().join(" / ");
    let mut s = format!(
        "load per device (per data node on a cluster head) {} {}, {} after\n",
        if applied { "was" } else { "is" },
        loads(&r.before),
        loads(&r.after)
    );
    if r.moves.is_empty() {
        s.push_str("nothing to move\n");
    }
    for m in &r.moves {
        s.push_str(&format!(
            "{} {} ({}, load {}) from {} to {}\n",
            if applied { "moved" } else { "move" },
            m.path,
            human(m.size),
            human(m.load),
            m.from,
            m.to
        ));
    }
    for (path, why) in &r.skipped {
        s.push_str(&format!("not moved: {path}: {why}\n"));
    }
    s
}

/// A command-line argument as a script value: integers, numbers, booleans and nil are
/// typed; anything else is a string.
pub fn parse_arg(s: &str) -> locus_client::types::Value {
    use locus_client::types::Value;
    match s {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "nil" => Value::Nil,
        _ => s
            .parse::<i64>()
            .map(Value::Int)
            .or_else(|_| s.parse::<f64>().map(Value::Num))
            .unwrap_or_else(|_| Value::Str(s.to_string())),
    }
}

/// A script value as JSON (byte strings that are not UTF-8 become arrays of numbers).
pub fn value_json(v: &locus_client::types::Value) -> Value {
    use locus_client::types::Value as V;
    match v {
        V::Nil => Value::Null,
        V::Bool(b) => json!(b),
        V::Int(i) => json!(i),
        V::Num(n) => json!(n),
        V::Str(s) => json!(s),
        V::Bytes(b) => json!(b),
        V::List(items) => Value::Array(items.iter().map(value_json).collect()),
        V::Map(pairs) => Value::Object(pairs.iter().map(|(k, v)| (k.clone(), value_json(v))).collect()),
    }
}

/// A storelet run's account on one line.
pub fn storelet_account(r: &StoreletResult) -> String {
    format!(
        "run {}: exit {}, fuel {}, cpu {:.3} s, wall {:.3} s, peak memory {} KiB, read {} B, written {} B, files {}, output {} B",
        r.run,
        r.exit_code,
        r.fuel,
        r.cpu_us as f64 / 1e6,
        r.wall_us as f64 / 1e6,
        r.peak_memory >> 10,
        r.read_bytes,
        r.write_bytes,
        r.files_opened,
        r.output_bytes
    )
}

/// `locus handlers` as a table.
pub fn handlers(list: &[HandlerInfo]) -> String {
    let mut out = format!("{:<16} {:<9} {:<12} ARGS", "NAME", "KIND", "MODULE");
    for h in list {
        out.push_str(&format!(
            "\n{:<16} {:<9} {:<12} {}",
            h.name,
            h.kind,
            &h.module[..12.min(h.module.len())],
            h.args.join(" ")
        ));
    }
    out
}

/// A cluster's data nodes as a table.
pub fn nodes(list: &[NodeInfo]) -> String {
    let mut out =
        format!("{:>5} {:<22} {:<9} {:>7} {:>12} {:>9}", "NODE", "ADDRESS", "STATE", "SEEN s", "FREE MiB", "VERSIONS");
    for n in list {
        out.push_str(&format!(
            "\n{:>5} {:<22} {:<9} {:>7} {:>12} {:>9}",
            n.id,
            n.addr,
            n.state,
            n.seen_s,
            n.free >> 20,
            n.versions
        ));
    }
    out
}

/// Storelet runs as a table.
pub fn storelet_ps(runs: &[StoreletRunInfo]) -> String {
    let mut out =
        format!("{:>6} {:<12} {:<8} {:>9} {:>9} {:<12} ARGS", "RUN", "SUBJECT", "STATE", "AGE s", "CPU s", "MODULE");
    for r in runs {
        out.push_str(&format!(
            "\n{:>6} {:<12} {:<8} {:>9.2} {:>9.2} {:<12} {}",
            r.run,
            r.subject,
            if r.running { "running" } else { "queued" },
            r.age_us as f64 / 1e6,
            r.cpu_us as f64 / 1e6,
            &r.module[..12.min(r.module.len())],
            r.args.join(" ")
        ));
    }
    out
}

/// `locus storelet stats`: totals per subject, then recent runs.
pub fn storelet_report(r: &StoreletReport) -> String {
    let mut out = format!(
        "{:<12} {:>6} {:>7} {:>6} {:>10} {:>14} {:>12} {:>12} {:>16}",
        "SUBJECT", "RUNS", "STOPPED", "ACTIVE", "CPU s", "FUEL", "READ B", "WRITTEN B", "BUDGET USED s"
    );
    for s in &r.subjects {
        out.push_str(&format!(
            "\n{:<12} {:>6} {:>7} {:>6} {:>10.2} {:>14} {:>12} {:>12} {:>7.2}/{:<8.2}",
            s.subject,
            s.runs,
            s.stopped,
            s.active,
            s.cpu_us as f64 / 1e6,
            s.fuel,
            s.read_bytes,
            s.write_bytes,
            s.budget_spent_us as f64 / 1e6,
            s.budget_us as f64 / 1e6
        ));
    }
    out.push_str(&format!("\n\nrecent runs ({} modules compiled since start):", r.compiles));
    for e in &r.recent {
        out.push_str(&format!(
            "\n  {} [{}] {}: {}",
            e.subject,
            e.args.join(" "),
            e.outcome,
            storelet_account(&e.account)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_render_like_ls() {
        assert_eq!(mode_string(0o040755), "drwxr-xr-x");
        assert_eq!(mode_string(0o100644), "-rw-r--r--");
        assert_eq!(mode_string(0o120777), "lrwxrwxrwx");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(12), "12 B");
    }

    #[test]
    fn times_render_in_utc() {
        use locus_proto::types::Time;
        assert_eq!(when(&Time { sec: 0, nsec: 5 }, true), "1970-01-01T00:00:00.000000005Z");
        assert_eq!(when(&Time { sec: 1_795_513_847, nsec: 0 }, false), "2026-11-24T09:50Z");
        assert_eq!(when(&Time { sec: i64::MAX, nsec: 0 }, false), format!("{}s", i64::MAX));
    }
}
