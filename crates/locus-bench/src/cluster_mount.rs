//! `locus bench cluster-mount`: `locus mount --consistency afs` on a cluster head (one
//! data node, SQLite) beside the same mount on a single server, on one machine over
//! loopback: a `find` over a large tree (Go's standard library sources by default),
//! cold (a fresh mount) and warm (the same mount again). With callbacks from the head,
//! the warm pass trusts the kernel's caches as it does on one server.

use crate::mount::{find, go_sources, mount_with, Mounted};
use crate::stats::median;
use crate::BenchError;
use locus_testkit::peers;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Options of `locus bench cluster-mount`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterMountArgs {
    /// The tree to `find` over (default: `$(go env GOROOT)/src`).
    #[arg(long)]
    pub tree: Option<PathBuf>,
    /// Warm passes (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
}

/// A process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Cold and warm `find` times over `dir`.
fn passes(dir: &Path, repeat: usize) -> Result<(f64, f64), BenchError> {
    let cold = find(dir).map_err(BenchError::Setup)?;
    let warm: Vec<f64> = (0..repeat.max(1)).map(|_| find(dir)).collect::<Result<_, _>>().map_err(BenchError::Setup)?;
    Ok((cold, median(warm)))
}

/// Starts a data node joining the head at `head`, its state and export under `work`.
fn start_node(exe: &Path, work: &Path, head: &str, node_token: &str) -> Result<Killed, BenchError> {
    let (root, state) = (work.join("node-root"), work.join("node-state"));
    for d in [&root, &state] {
        std::fs::create_dir_all(d).map_err(|e| BenchError::io("mkdir", e))?;
    }
    let child = Command::new(exe)
        .args(["serve", "--data-node", head, "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .arg("--state")
        .arg(&state)
        .env("LOCUS_TOKEN", format!("locus-node:{node_token}"))
        .env("LOCUS_HOME", work.join("node-home"))
        .env("LOCUS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| BenchError::io("start the data node", e))?;
    Ok(Killed(child))
}

pub fn run(args: ClusterMountArgs) -> Result<(), BenchError> {
    let setup = BenchError::Setup;
    let tree =
        args.tree.clone().or_else(go_sources).ok_or_else(|| setup("no tree: give --tree (or install Go)".into()))?;
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let work = tempfile::Builder::new()
        .prefix("locus-bench-cluster-mount-")
        .tempdir_in(base)
        .map_err(|e| BenchError::io("temp", e))?;
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let copy = |to: &Path| -> Result<(), BenchError> {
        let copied = Command::new("cp").arg("-r").arg(&tree).arg(to).status();
        match copied {
            Ok(s) if s.success() => Ok(()),
            _ => Err(setup(format!("cannot copy {}", tree.display()))),
        }
    };
    // The tree locally, in a single server's export, and put into the head.
    let (local, export) = (work.path().join("local"), work.path().join("single-export"));
    for d in [&local, &export] {
        std::fs::create_dir_all(d).map_err(|e| BenchError::io("mkdir", e))?;
    }
    copy(&local.join("findtree"))?;
    copy(&export.join("findtree"))?;
    let single_work = work.path().join("single");
    std::fs::create_dir_all(&single_work).map_err(|e| BenchError::io("mkdir", e))?;
    let (single, single_token) = peers::start_locus_with(&exe, &single_work, &export, &[])?;

    let head_work = work.path().join("head");
    let head_state = head_work.join("locus-state");
    std::fs::create_dir_all(&head_state).map_err(|e| BenchError::io("mkdir", e))?;
    let (head_token, node_token) = ("bench-admin-token-0123456789abcdef", "bench-node-token-0123456789abcdef");
    std::fs::write(head_state.join("tokens"), format!("admin {head_token}\nlocus-node {node_token}\n"))
        .map_err(|e| BenchError::io("tokens", e))?;
    let head_root = head_work.join("root");
    std::fs::create_dir_all(&head_root).map_err(|e| BenchError::io("mkdir", e))?;
    let (head, _) = peers::start_locus_with(&exe, &head_work, &head_root, &["--head".to_string()])?;
    let head_url = format!("locus://{}/", head.addr);
    let _node = start_node(&exe, work.path(), &head_url, node_token)?;
    std::thread::sleep(Duration::from_millis(1500));
    let put = Instant::now();
    let status = Command::new(&exe)
        .args(["cp", "-r"])
        .arg(&tree)
        .arg(format!("{head_url}findtree"))
        .env("LOCUS_TOKEN", format!("admin:{head_token}"))
        .env("LOCUS_HOME", work.path().join("client-home"))
        .stdout(Stdio::null())
        .status()
        .map_err(|e| BenchError::io("locus cp -r", e))?;
    if !status.success() {
        return Err(setup("locus cp -r into the head failed".into()));
    }
    let files =
        Command::new("find").arg(local.join("findtree")).output().map(|o| o.stdout.split(|b| *b == b'\n').count());
    eprintln!("put {} entries into the head in {:.1} s", files.unwrap_or(0), put.elapsed().as_secs_f64());

    let local_times = passes(&local.join("findtree"), args.repeat)?;
    let afs = |name: &str| {
        let cache = work.path().join(format!("cache-{name}"));
        vec!["--consistency".to_string(), "afs".to_string(), "--cache-dir".to_string(), cache.display().to_string()]
    };
    let mount_at = |url: &str, token: &str, name: &str| -> Result<Mounted, BenchError> {
        let flags = afs(name);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        mount_with(&exe, url, &work.path().join(format!("m-{name}")), token, &flags)
    };
    let m = mount_at(&format!("locus://{}/", single.addr), &single_token, "single")?;
    let single_times = passes(&m.dir.join("findtree"), args.repeat)?;
    drop(m);
    let m = mount_at(&head_url, head_token, "head")?;
    let head_times = passes(&m.dir.join("findtree"), args.repeat)?;
    drop(m);

    println!(
        "\n### bench cluster-mount: `locus mount --consistency afs`, find over {} (loopback; warm: median of {})\n",
        tree.display(),
        args.repeat
    );
    println!("| target | cold s | warm s | warm ÷ local | warm ÷ single server |\n|---|---|---|---|---|");
    for (name, (cold, warm)) in
        [("local", local_times), ("single server", single_times), ("cluster head, 1 data node", head_times)]
    {
        println!(
            "| {name} | {cold:.3} | {warm:.3} | {:.2}x | {:.2}x |",
            warm / local_times.1.max(1e-9),
            warm / single_times.1.max(1e-9)
        );
    }
    Ok(())
}
