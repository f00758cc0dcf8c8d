//! `locus bench soak` for a few seconds: every client kind does work without an error,
//! and the report (`--json`) has every field the issue asks for.

use std::process::Command;

#[test]
fn a_short_soak_reports_every_field_and_no_client_errors() {
    if !locus_testkit::require_fuse() {
        return;
    }
    let go = Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    if !locus_testkit::require("go", go, "Go 1.21 or later, for the storelets") {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["--json", "bench", "soak", "--seconds", "8", "--interval-secs", "1", "--large-mb", "4"])
        .args(["--small-rate", "50", "--script-rate", "10", "--storelet-every", "1", "--mount-rate", "10"])
        .args(["--settle-secs", "15"])
        .output()
        .expect("run locus bench soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("no JSON report ({e}): {stdout}\n{stderr}"));
    // The command fails exactly when a check fails (a few seconds are too short for the
    // RSS and throughput checks to mean much, so only the agreement is asserted here).
    assert_eq!(report["pass"].as_bool(), Some(out.status.success()), "{stderr}");
    let intervals = report["intervals"].as_array().expect("intervals");
    assert!(intervals.len() >= 6, "{} intervals", intervals.len());
    let kinds = ["small", "large", "script", "storelet", "mount", "change"];
    for row in intervals {
        for k in kinds {
            let kind = &row["kinds"][k];
            assert!(kind["ops_per_s"].is_number() && kind["p99_ms"].is_number(), "{k} in {row}");
        }
        assert!(row["total_ops_per_s"].as_f64().is_some_and(|t| t > 0.0), "{row}");
        assert!(row["rss_kib"].as_u64().is_some_and(|r| r > 0), "{row}");
        assert!(row["fds"].as_u64().is_some_and(|f| f > 0), "{row}");
        assert!(row["threads"].as_u64().is_some_and(|t| t > 0), "{row}");
    }
    // Every kind did work over the run.
    for k in kinds {
        let ops: u64 = intervals.iter().map(|r| r["kinds"][k]["ops"].as_u64().unwrap_or(0)).sum();
        assert!(ops > 0, "no {k} operations: {stdout}");
    }
    let resources = report["resources"].as_object().expect("resources");
    assert_eq!(resources.len(), 4, "{resources:?}");
    for r in resources.values() {
        assert!(r["rss_kib"].as_u64().is_some_and(|v| v > 0) && r["fds"].as_u64().is_some_and(|v| v > 0), "{r}");
        assert!(r["threads"].as_u64().is_some_and(|v| v > 0), "{r}");
    }
    // No client errors, and the checks are all there.
    let errors: u64 = report["errors"].as_object().expect("errors").values().filter_map(|v| v.as_u64()).sum();
    assert_eq!(errors, 0, "client errors: {}", report["first_errors"]);
    let checks: Vec<&str> =
        report["checks"].as_array().expect("checks").iter().filter_map(|c| c["name"].as_str()).collect();
    for name in ["throughput", "RSS", "descriptors", "threads", "client errors"] {
        assert!(checks.iter().any(|c| c.contains(name)), "no {name} check in {checks:?}");
    }
}
