//! `locus`: serve an export, use one from the command line, and benchmark it.
//!
//! - [`serve`]: `locus serve`, the embedded default and its options.
//! - [`files`]: `ls`, `stat`, `cat`, `get`, `put`, `cp`, `rm`, `mkdir`, `mv`, `df`, `acl`, `stats`.
//! - [`output`]: human and `--json` rendering.
//!
//! Every failure prints one line, `locus: ...`, and exits non-zero.

mod files;
mod mount;
mod output;
mod s3_door;
mod serve;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Locus: a remote file server that runs your code next to your data.
#[derive(Parser)]
#[command(name = "locus", version, about, long_about = None)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a directory (by default ~/.locus/export, created on first start).
    Serve(Box<serve::ServeArgs>),
    /// Create a token for a subject in a server's token file and print it (with --s3,
    /// print the subject's S3 access key and secret, creating its token if need be).
    Token {
        /// The subject name.
        subject: String,
        /// Print the S3 keys derived from the subject's token (the token itself never
        /// goes to S3 tools), as AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=... lines.
        #[arg(long)]
        s3: bool,
        /// The server's state directory.
        #[arg(long, default_value_os_t = locus_client::credentials::locus_home().join("server"))]
        state: PathBuf,
    },
    /// List a directory (or describe a file).
    Ls {
        /// A locus:// URL: locus://HOST[:PORT]/path, or locus+tls://...
        url: String,
        /// Long format: mode, links, owner, size, time.
        #[arg(short, long)]
        long: bool,
    },
    /// Show the attributes of a path.
    Stat {
        /// A locus:// URL: locus://HOST[:PORT]/path, or locus+tls://...
        url: String,
        /// Describe a symlink itself instead of following it.
        #[arg(short = 'L', long)]
        no_follow: bool,
    },
    /// Write a remote file to standard output.
    Cat {
        /// A locus:// URL: locus://HOST[:PORT]/path, or locus+tls://...
        url: String,
    },
    /// Download a remote file.
    Get {
        /// The remote file, as a locus:// URL.
        url: String,
        /// Where to write it.
        local: PathBuf,
    },
    /// Upload a local file.
    Put {
        /// The local file.
        local: PathBuf,
        /// Where it goes, as a locus:// URL (replaced atomically when complete).
        url: String,
    },
    /// Copy files; either side may be remote (`-r` for directories).
    Cp {
        /// A local path or a locus:// URL.
        source: String,
        /// A local path or a locus:// URL.
        dest: String,
        #[arg(short, long)]
        recursive: bool,
    },
    /// Remove files (`-r` for directories and their contents).
    Rm {
        /// What to remove, as locus:// URLs.
        #[arg(required = true)]
        urls: Vec<String>,
        #[arg(short, long)]
        recursive: bool,
    },
    /// Create directories (`-p` creates parents and tolerates existing ones).
    Mkdir {
        /// The directories, as locus:// URLs.
        #[arg(required = true)]
        urls: Vec<String>,
        #[arg(short, long)]
        parents: bool,
    },
    /// Rename a remote path (both on one server).
    Mv {
        /// The path to rename, as a locus:// URL.
        from: String,
        /// Its new name, as a locus:// URL on the same server.
        to: String,
    },
    /// Show file-system space of an export.
    Df {
        /// Any path of the export, as a locus:// URL.
        url: String,
    },
    /// Read or change a directory's access-control list.
    #[command(subcommand)]
    Acl(AclCommand),
    /// Show server statistics: totals, operations and the busiest files.
    Stats {
        /// The server, as a locus:// URL (needs the `a` right at its root).
        url: String,
        /// How many of the busiest files to show.
        #[arg(long, default_value_t = 10)]
        top: u32,
        /// Show only the devices: their load, service times and space.
        #[arg(long)]
        devices: bool,
    },
    /// Even out the measured load of a server's devices by moving files between them
    /// (names never change; needs the `a` right at the root).
    #[command(subcommand)]
    Rebalance(RebalanceCommand),
    /// List the active-file handlers a server has registered (opening a missing
    /// `HANDLER@ARG,...` name, or a URL-encoded command line, runs one at the server).
    Handlers {
        /// The server, as a locus:// URL.
        url: String,
    },
    /// Print a signed HTTP URL of a file on a cluster head, through which any HTTP
    /// client (curl, a browser, pandas) may read it as you until it expires.
    Share {
        /// The file, as a locus:// URL of a head started with --http-port.
        url: String,
        /// Seconds the URL stays valid (at most the head's --share-max-ttl, a week by
        /// default; a longer ask is refused).
        #[arg(long, default_value_t = 3600)]
        ttl: u64,
    },
    /// Administer a cluster head.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// See and retire a cluster's data nodes (needs the `a` right at the head's root).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Register and call Lua scripts that run at the server.
    #[command(subcommand)]
    Script(ScriptCommand),
    /// Run WebAssembly programs at the server, beside the data.
    #[command(subcommand)]
    Storelet(StoreletCommand),
    /// Mount a remote directory on MOUNTPOINT with FUSE; runs until unmounted, SIGINT or SIGTERM.
    Mount {
        /// locus://HOST:PORT/path, chirp://HOST:PORT/path (CCTools' chirp_server) or http(s)://HOST/path (read-only).
        url: String,
        /// An existing, empty directory.
        mountpoint: PathBuf,
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Unmount a `locus mount`.
    Umount {
        /// Where `locus mount` mounted the directory.
        mountpoint: PathBuf,
    },
    /// Run a program (and every process it starts) with remote storage in its namespace:
    /// `/locus/HOST:PORT/path` always, plus the names given by --mount and --mount-list.
    /// No privileges needed. By default the program runs in a private mount namespace
    /// where the remote trees are a FUSE file system (nothing intercepted), or, where the
    /// kernel does not allow that, under ptrace and seccomp. Exits with the program's status; 75 if a server stayed
    /// unreachable for the retry window (run it again), 1 on a request a driver can never
    /// satisfy, 70 if the agent could not start.
    #[command(name = "run")]
    RunAgent {
        /// LOGICAL=REMOTE: show REMOTE (a URL, /locus/HOST:PORT/path or a local path) at the
        /// absolute path LOGICAL. Repeatable.
        #[arg(long = "mount", value_name = "LOGICAL=REMOTE")]
        mounts: Vec<String>,
        /// A file of `LOGICAL REMOTE` lines (as Parrot's mount lists); `#` starts a comment.
        #[arg(long, value_name = "FILE")]
        mount_list: Option<PathBuf>,
        #[command(flatten)]
        cache: CacheArgs,
        /// How the program sees the namespace: `fuse` (a private mount namespace with a
        /// FUSE file system; fails if the kernel refuses), `trace` (ptrace and seccomp), or
        /// `auto` (fuse where possible, else trace; LOCUS_LOG=debug says why).
        #[arg(long, default_value = "auto", value_name = "auto|fuse|trace")]
        interpose: locus_agent::Interposition,
        /// On the FUSE path: seconds the namespace, its file system and what it caches
        /// stay after the last program under them ends, so that the next `locus run` by
        /// this user with the same mounts, options and environment starts warm (a
        /// per-user agent keeps them; its socket is in $XDG_RUNTIME_DIR/locus or
        /// $TMPDIR/locus-run-UID). Programs sharing an agent share its fate (a stopping
        /// error stops them all). 0: each run makes its own and takes it away.
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        keep_warm: u64,
        /// The program and its arguments (after `--`).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Run benchmarks side by side with peers.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// How `locus mount` and `locus run` cache, and how long they wait for a server: the
/// flags both take.
#[derive(clap::Args)]
struct CacheArgs {
    /// How long (ms) attributes, names, listings and cached pages of unchanged files are trusted before asking the server again, where no callback covers them (`--consistency nfs`, or a server without callbacks).
    #[arg(long, default_value_t = 1000)]
    attr_timeout_ms: u64,
    /// Seconds to keep retrying an unreachable server (with backoff) before calls fail with EIO (`locus run`: before the program is stopped, exit 75).
    #[arg(long, default_value_t = 30)]
    retry_secs: u64,
    /// `sprite`: the server promises callbacks for what is cached and breaks them when another client changes it, so cached attributes, names, listings and pages are trusted until then (a change shows once its break has arrived, a one-way trip after the change is answered); writes go through as they are made (`locus run`: only while every mounted server has callbacks). `afs`: as `sprite` for reads, and a file opened for writing is written in a local copy (under --cache-dir) and stored at the server when closed or synced, in one round trip: others see it after close, and a failed store shows as an error of close or fsync. `nfs`: everything is trusted for --attr-timeout-ms, then asked again (another client's change may stay unseen that long).
    #[arg(long, default_value = "sprite", value_parser = ["sprite", "afs", "nfs"])]
    consistency: String,
    /// Where `--consistency afs` keeps local copies of files being written (default: $XDG_CACHE_HOME/locus/writeback or ~/.cache/locus/writeback).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The most MiB of local copies under `--consistency afs`, and of those not stored yet (a writer past it waits while others are stored, or writes through); a file larger than an eighth of it is written through.
    #[arg(long, default_value_t = 1024)]
    cache_mb: u64,
    /// How the kernel's FUSE requests reach Locus: `auto` uses FUSE over io_uring where the kernel offers it (Linux 6.14 or later with /sys/module/fuse/parameters/enable_uring set to Y, which root may do) and /dev/fuse reads elsewhere; `uring` fails to mount without it; `classic` always reads /dev/fuse.
    #[arg(long, default_value = "auto", value_parser = ["auto", "uring", "classic"])]
    fuse_transport: String,
}

impl CacheArgs {
    /// The mount's options for a mount of `origin` (its URL, or the program's namespace).
    fn mount_options(&self, origin: &str) -> locus_mount::MountOptions {
        let defaults = locus_mount::MountOptions::default();
        locus_mount::MountOptions {
            attr_timeout: Duration::from_millis(self.attr_timeout_ms),
            consistency: match self.consistency.as_str() {
                "nfs" => locus_mount::Consistency::Nfs,
                "afs" => locus_mount::Consistency::Afs,
                _ => locus_mount::Consistency::Sprite,
            },
            cache_dir: self.cache_dir.clone().unwrap_or(defaults.cache_dir),
            cache_limit: self.cache_mb.saturating_mul(1 << 20),
            origin: origin.to_string(),
            transport: self.fuse_transport.parse().unwrap_or_default(),
            ..defaults
        }
    }

    /// How long an unreachable server is retried.
    fn retry(&self) -> Duration {
        Duration::from_secs(self.retry_secs)
    }
}

#[derive(Subcommand)]
enum AclCommand {
    /// Show the ACL in force on a directory.
    Get {
        /// The directory, as a locus:// URL.
        url: String,
    },
    /// Give SUBJECT the RIGHTS (letters from rwldax; `-` for none) on a directory.
    Set {
        /// The directory, as a locus:// URL.
        url: String,
        /// A subject name; `*` for every subject holding a Locus token (Chirp's host
        /// subjects match only entries naming them, or patterns such as `address:10.0.*`).
        subject: String,
        /// Letters from rwldax (read, write, list, delete, admin, execute code), or `-`.
        rights: String,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Replace the cluster key (needs the `a` right at the head's root): data nodes learn
    /// the new key within seconds; capabilities and shared URLs signed with the old one
    /// stop working once the longest-lived capability has expired.
    RotateKey {
        /// The head, as a locus:// URL.
        url: String,
    },
}

#[derive(Subcommand)]
enum NodeCommand {
    /// The head's data nodes: address, state (up; down after --node-timeout-s without a
    /// heartbeat; draining; drained), seconds since the last heartbeat, free space and
    /// how many current file versions each holds.
    List {
        /// The head, as a locus:// URL.
        url: String,
    },
    /// Stop placing versions on a node and copy those it holds to other nodes (online,
    /// at the head's --repair-rate-mib); `node list` shows it drained when done.
    Drain {
        /// The head, as a locus:// URL.
        url: String,
        /// The node's id, as `node list` shows it.
        node: u64,
    },
    /// Forget a node that holds no current version (drained, or dead and healed).
    Remove {
        /// The head, as a locus:// URL.
        url: String,
        /// The node's id, as `node list` shows it.
        node: u64,
    },
}

#[derive(Subcommand)]
enum ScriptCommand {
    /// Register a script file with the server at URL; prints its id.
    Register {
        /// The server, as a locus:// URL (locus://HOST[:PORT]/).
        url: String,
        /// The Lua source file.
        file: PathBuf,
    },
    /// Call a script by id, or by file (registered on first use), with arguments.
    Call {
        /// The server, as a locus:// URL (locus://HOST[:PORT]/).
        url: String,
        /// A script id (64 hex digits) or a file holding the script.
        script: String,
        /// Arguments: integers, numbers, true/false/nil, or strings.
        args: Vec<String>,
        /// File whose bytes are the script's `input` buffer.
        #[arg(long)]
        input: Option<PathBuf>,
        /// Write the script's `output` buffer here instead of standard output.
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum RebalanceCommand {
    /// Propose moves from the accounting, without moving anything.
    Plan {
        /// The server, as a locus:// URL.
        url: String,
        /// At most this many moves.
        #[arg(long, default_value_t = 1000)]
        max_moves: u32,
    },
    /// Plan, then carry the moves out online (open files keep working).
    Apply {
        /// The server, as a locus:// URL.
        url: String,
        /// At most this many moves.
        #[arg(long, default_value_t = 1000)]
        max_moves: u32,
    },
}

#[derive(Subcommand)]
enum StoreletCommand {
    /// Run MODULE.wasm (WASI preview 1) with the directory of --dir as its `/`; its
    /// output streams back as it is written, its account goes to stderr with --account.
    Run {
        /// The WebAssembly module (a .wasm file).
        module: PathBuf,
        /// The directory the program sees, as a locus:// URL.
        #[arg(long)]
        dir: String,
        /// Let the program write there (needs the `w` right).
        #[arg(long)]
        write: bool,
        /// An environment variable for the program (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Print the run's account (fuel, CPU, memory, I/O) to stderr when it ends.
        #[arg(long)]
        account: bool,
        /// Arguments for the program.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// List storelet runs queued or running (yours; everyone's for an admin).
    Ps {
        /// The server, as a locus:// URL (locus://HOST[:PORT]/).
        url: String,
    },
    /// Cancel a run by the number `ps` shows (yours; any for an admin).
    Cancel {
        /// The server, as a locus:// URL (locus://HOST[:PORT]/).
        url: String,
        /// The run's number, as `ps` shows it.
        run: u64,
    },
    /// Storelet accounts: totals per subject and recent runs.
    Stats {
        /// The server, as a locus:// URL (locus://HOST[:PORT]/).
        url: String,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Figure 4 rows (getpid, stat, open+close, read/write, bandwidth) under `locus run`, local and remote.
    Agent(locus_bench::agent::AgentArgs),
    /// The measuring process of `bench agent` (prints JSON).
    #[command(hide = true)]
    Syscalls(locus_bench::agent::SyscallArgs),
    /// Per-operation latency and bandwidth against Locus, chirp_server, XRootD and a bare TCP ping-pong.
    Ops(locus_bench::ops::OpsArgs),
    /// CCTools' chirp tool against Locus' Chirp endpoint and chirp_server, per operation.
    Chirp(locus_bench::chirp::ChirpArgs),
    /// What scripts buy: call overhead (beside Redis), combined and partial operations across RTTs.
    Scripts(locus_bench::scripts::ScriptsArgs),
    /// find at the server vs client-side traversal vs local, across RTTs; the file service under hostile storelets.
    Storelets(locus_bench::storelets::StoreletsArgs),
    /// Lerna's experiment: a job triggered by opening an active file, against the same
    /// program at the server and on the client over `locus mount`, across RTTs.
    Active(locus_bench::active::ActiveArgs),
    /// Figure 4 rows and an Andrew-like run on locus mount (Locus and Chirp drivers) beside local.
    Mount(locus_bench::mount::MountArgs),
    /// A head, data nodes and clients in network namespaces on rate-limited links:
    /// aggregate read throughput with third-party transfer on and off (needs root).
    Cluster(locus_bench::cluster::ClusterArgs),
    /// `locus mount --consistency afs` on a cluster head beside the same mount on a
    /// single server: cold and warm `find` over a large tree (Go's sources by default).
    ClusterMount(locus_bench::cluster_mount::ClusterMountArgs),
    /// Fault injection: kill -9 of servers, heads, data nodes, PostgreSQL and mounts, a
    /// full disk, a cut link, each during writes; checks that every acknowledged write
    /// reads back and nothing is half-written (needs root).
    Faults(locus_bench::faults::FaultsArgs),
    /// Mixed clients (small ops, large files, scripts, storelets, afs mounts) against one
    /// server for N minutes: throughput and p99 over time; RSS, descriptors and threads
    /// at start, end and after the clients leave. Fails if a check fails.
    Soak(locus_bench::soak::SoakArgs),
}

/// The agent's options from `locus run`'s flags.
fn agent_options(
    mounts: &[String],
    mount_list: Option<&std::path::Path>,
    cache: &CacheArgs,
    interposition: locus_agent::Interposition,
    keep_warm: Duration,
) -> Result<locus_agent::RunOptions, String> {
    let mut all = Vec::new();
    if let Some(file) = mount_list {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        all = locus_agent::parse_mount_list(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    }
    for m in mounts {
        let (logical, remote) = m.split_once('=').ok_or_else(|| format!("--mount {m}: expected LOGICAL=REMOTE"))?;
        all.push(locus_agent::parse_mount(logical, remote)?);
    }
    let options = cache.mount_options("");
    Ok(locus_agent::RunOptions {
        mounts: all,
        retry: cache.retry(),
        attr_timeout: options.attr_timeout,
        consistency: options.consistency,
        cache_dir: options.cache_dir,
        cache_limit: options.cache_limit,
        transport: options.transport,
        interposition,
        keep_warm,
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `locus run` shares the program's stderr: it says only what ends the run, unless asked.
    let quiet = matches!(cli.command, Command::RunAgent { .. });
    // The s3s crate logs every S3 error answered (a 404 too) as an error: the door logs
    // its own failures instead (LOCUS_LOG=s3s=debug shows them all).
    let filter = tracing_subscriber::EnvFilter::try_from_env("LOCUS_LOG")
        .unwrap_or_else(|_| if quiet { "off" } else { "info,s3s=off" }.into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // LOCUS_LOG_FORMAT=json: one JSON object per event, for log collectors.
    if std::env::var("LOCUS_LOG_FORMAT").is_ok_and(|f| f == "json") {
        logs.json().init();
    } else {
        logs.init();
    }
    if let Command::RunAgent { mounts, mount_list, cache, interpose, keep_warm, command } = cli.command {
        // The program's own exit status passes through, so this does not go through
        // the one-line-error path below.
        let keep_warm = Duration::from_secs(keep_warm);
        return match agent_options(&mounts, mount_list.as_deref(), &cache, interpose, keep_warm) {
            Ok(options) => ExitCode::from(locus_agent::run(&command, options).clamp(0, 255) as u8),
            Err(msg) => {
                eprintln!("locus: {msg}");
                ExitCode::from(locus_agent::EXIT_SETUP as u8)
            }
        };
    }
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Mount { url, mountpoint, cache } => {
            mount::run(&url, &mountpoint, cache.mount_options(&url), cache.retry())
        }
        Command::Umount { mountpoint } => mount::umount(&mountpoint),
        Command::Bench(BenchCommand::Ops(args)) => locus_bench::ops::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Chirp(args)) => locus_bench::chirp::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Scripts(args)) => locus_bench::scripts::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Agent(args)) => locus_bench::agent::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Syscalls(args)) => locus_bench::agent::syscalls(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Mount(args)) => locus_bench::mount::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Cluster(args)) => locus_bench::cluster::run(args.clone())
            .and_then(|()| locus_bench::cluster_heal::run(&args))
            .map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::ClusterMount(args)) => {
            locus_bench::cluster_mount::run(args).map_err(|e| e.to_string())
        }
        Command::Bench(BenchCommand::Faults(args)) => locus_bench::faults::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Storelets(args)) => locus_bench::storelets::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Active(args)) => locus_bench::active::run(args).map_err(|e| e.to_string()),
        Command::Bench(BenchCommand::Soak(args)) => locus_bench::soak::run(args, cli.json).map_err(|e| e.to_string()),
        Command::Token { subject, state, s3 } => serve::add_token(&subject, &state, s3),
        other => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(files::run(other, cli.json))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("locus: {msg}");
            ExitCode::FAILURE
        }
    }
}
