//! Fetches the console's charting libraries (Chart.js and its matrix chart, pinned in
//! `web/package-lock.json`) with `npm ci` into the build directory, so the binary can
//! serve them. Without npm or a registry the console still builds and works; its pages
//! then show tables where the plots would be, and the build says why.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files served, and where npm puts them.
const LIBRARIES: [(&str, &str); 2] = [
    ("chart.js", "node_modules/chart.js/dist/chart.umd.min.js"),
    ("chart-matrix.js", "node_modules/chartjs-chart-matrix/dist/chartjs-chart-matrix.min.js"),
];

fn main() {
    println!("cargo:rerun-if-changed=web/package.json");
    println!("cargo:rerun-if-changed=web/package-lock.json");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let web = out.join("web");
    if let Err(why) = fetch(&web) {
        println!(
            "cargo:warning=the console's plots are unavailable in this build ({why}); its pages show tables instead"
        );
        for (name, _) in LIBRARIES {
            let stub = format!("/* {name}: not fetched at build time ({why}) */\n");
            std::fs::write(out.join(name), stub).expect("write to OUT_DIR");
        }
        return;
    }
    for (name, from) in LIBRARIES {
        std::fs::copy(web.join(from), out.join(name)).expect("copy a fetched library");
    }
}

/// Runs `npm ci` for the pinned packages in `web`.
fn fetch(web: &Path) -> Result<(), String> {
    std::fs::create_dir_all(web).map_err(|e| e.to_string())?;
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(Path::new("web").join(f), web.join(f)).map_err(|e| format!("{f}: {e}"))?;
    }
    if LIBRARIES.iter().all(|(_, from)| web.join(from).exists()) {
        return Ok(());
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"])
        .current_dir(web)
        .status()
        .map_err(|e| format!("npm: {e}"))?;
    if !status.success() {
        return Err(format!("npm ci failed: {status}"));
    }
    match LIBRARIES.iter().find(|(_, from)| !web.join(from).exists()) {
        Some((_, missing)) => Err(format!("npm ci did not give {missing}")),
        None => Ok(()),
    }
}
