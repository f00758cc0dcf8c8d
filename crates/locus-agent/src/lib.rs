//! `locus run`: runs an unmodified program, and every process it starts, with remote
//! storage spliced into its namespace, as Parrot's interposition agent does, without
//! privileges.
//!
//! Two ways, chosen by [`Interposition`]. Where the kernel allows it, the program runs in
//! a private mount namespace where the remote trees are a FUSE file system the agent
//! serves, and nothing of the program is intercepted ([`fuse_path`]). Otherwise the
//! program runs under a seccomp filter, so only file-related system calls reach the
//! agent (everything else runs at native speed): the frequent ones as user
//! notifications, the rest as ptrace stops. A call that names a remote
//! path (`/locus/HOST:PORT/path`, or a logical name from `--mount` or a mount list) is
//! served through a local staging area: the agent brings the local shadow of the remote
//! file up to date and points the call at it, so the kernel gives the program real
//! descriptors, `mmap`, `exec` and `getdents`. Writes go back to the server on close.
//! See [`stage`] for the caching rules and [`tracer`] for the mechanism.
//!
//! # Exit statuses
//! - the program's own status (128 + signal number if a signal ended it);
//! - [`EXIT_PERMANENT`] (1): a request no driver can ever satisfy (listing an HTTP
//!   directory, for one); the program was stopped;
//! - [`EXIT_TRANSIENT`] (75, `EX_TEMPFAIL`): a server stayed unreachable for the whole
//!   retry window; the program was stopped and may be run again;
//! - [`EXIT_SETUP`] (70): the agent could not start (bad mount, no ptrace);
//! - 127: the command was not found.

pub mod fuse_path;
pub mod names;
mod notify;
pub mod ns_driver;
pub mod stage;
pub mod syscalls;
pub mod tracee;
pub mod tracer;
mod warm;

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;
use tracer::Abort;

/// Exit status when a driver reports a permanent error.
pub const EXIT_PERMANENT: i32 = 1;
/// Exit status when a server stays unreachable for the retry window (`EX_TEMPFAIL`).
pub const EXIT_TRANSIENT: i32 = 75;
/// Exit status when the agent itself cannot start (`EX_SOFTWARE`).
pub const EXIT_SETUP: i32 = 70;

/// How a failed step ends: an errno for the program, or the end of the run.
pub enum Fail {
    Errno(i32),
    Stop(Abort),
}

impl Fail {
    /// A server unreachable beyond the retry window.
    pub fn transient(message: impl std::fmt::Display) -> Fail {
        Fail::Stop(Abort {
            status: EXIT_TRANSIENT,
            message: format!("{message}; the program was stopped and may be run again"),
        })
    }

    /// The errno, retry or stop that a driver error calls for (error triage).
    pub fn driver(e: locus_drivers::DriverError, url: &str) -> Fail {
        use locus_drivers::ErrorClass;
        match e.class {
            ErrorClass::Answer => Fail::Errno(e.errno),
            ErrorClass::Transient => Fail::transient(format!("{url}: {e}")),
            ErrorClass::Permanent => Fail::Stop(Abort {
                status: EXIT_PERMANENT,
                message: format!("{url}: {e}; the program was stopped (this can never succeed)"),
            }),
        }
    }
}

/// What `locus run` is given besides the command.
pub struct RunOptions {
    /// `(logical name, URL)` pairs spliced into the namespace.
    pub mounts: Vec<(String, String)>,
    /// How long a server may stay unreachable before the program is stopped.
    pub retry: Duration,
    /// How long attributes and listings are trusted before asking the server again,
    /// where no callback covers them.
    pub attr_timeout: Duration,
    /// On the FUSE path, whether servers' callbacks let the kernel cache until a change
    /// (see [`locus_mount::Consistency`]); the traced path uses `attr_timeout` alone.
    pub consistency: locus_mount::Consistency,
    /// Under `afs` consistency on the FUSE path: where local copies of files being
    /// written are kept, and the most bytes they may hold (as `locus mount`'s).
    pub cache_dir: std::path::PathBuf,
    pub cache_limit: u64,
    /// On the FUSE path, how the kernel's requests reach the agent (see
    /// [`locus_mount::MountOptions::transport`]).
    pub transport: locus_fuse::TransportChoice,
    /// How the program is given its namespace.
    pub interposition: Interposition,
    /// On the FUSE path, how long the namespace, its file system and caches stay after
    /// the last program under them ends, for the next `locus run` with the same mounts
    /// and options to find them warm ([`warm`]); zero: each run has its own.
    pub keep_warm: Duration,
}

/// How the agent shows the namespace to the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interposition {
    /// FUSE in a private mount namespace where the kernel allows it, else tracing.
    Auto,
    /// FUSE in a private mount namespace, or fail to start ([`fuse_path`]).
    Fuse,
    /// ptrace and seccomp ([`tracer`]).
    Trace,
}

impl std::str::FromStr for Interposition {
    type Err = String;
    fn from_str(s: &str) -> Result<Interposition, String> {
        match s {
            "auto" => Ok(Interposition::Auto),
            "fuse" => Ok(Interposition::Fuse),
            "trace" => Ok(Interposition::Trace),
            _ => Err(format!("{s}: expected auto, fuse or trace")),
        }
    }
}

/// Parses a mount list: one `LOGICAL REMOTE` pair a line (as Parrot's), `#` comments and
/// blank lines ignored. REMOTE is a URL, a `/locus/HOST:PORT/path` name or a local path.
pub fn parse_mount_list(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(logical), Some(remote), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!("line {}: expected `LOGICAL REMOTE`, got {line:?}", n + 1));
        };
        out.push(parse_mount(logical, remote).map_err(|e| format!("line {}: {e}", n + 1))?);
    }
    Ok(out)
}

/// One mount: a logical absolute path and where it leads.
pub fn parse_mount(logical: &str, remote: &str) -> Result<(String, String), String> {
    if !logical.starts_with('/') {
        return Err(format!("{logical}: a logical name must be an absolute path"));
    }
    let url = if remote.contains("://") {
        remote.to_string()
    } else if let Some(rest) = remote.strip_prefix("/locus/") {
        format!("locus://{rest}")
    } else if remote.starts_with('/') {
        format!("file://{remote}")
    } else {
        return Err(format!("{remote}: expected a URL, /locus/HOST:PORT/path or a local absolute path"));
    };
    Ok((logical.to_string(), url))
}

/// Runs `command` under the agent; answers the exit status `locus run` should end with.
pub fn run(command: &[OsString], options: RunOptions) -> i32 {
    match run_inner(command, options) {
        Ok(status) => status,
        Err(abort) => {
            eprintln!("locus run: {}", abort.message);
            abort.status
        }
    }
}

fn run_inner(command: &[OsString], options: RunOptions) -> Result<i32, Abort> {
    let setup = |message: String| Abort { status: EXIT_SETUP, message };
    // Said to the program (after the warm agent's key is taken, which counts only runs
    // started outside): a `locus run` beneath this one goes on its own.
    let inside = std::env::var_os(warm::INSIDE).is_some();
    // (One thread still: nothing reads the environment meanwhile.)
    std::env::set_var(warm::INSIDE, "1");
    let argv: Vec<CString> = command
        .iter()
        .map(|a| CString::new(a.clone().into_vec()).map_err(|_| setup("an argument holds a NUL byte".into())))
        .collect::<Result<_, _>>()?;
    if argv.is_empty() {
        return Err(setup("no command given".into()));
    }
    if options.interposition != Interposition::Trace {
        let mount = locus_mount::MountOptions {
            attr_timeout: options.attr_timeout,
            consistency: options.consistency,
            cache_dir: options.cache_dir.clone(),
            cache_limit: options.cache_limit,
            transport: options.transport,
            ..Default::default()
        };
        let warm = if options.keep_warm.is_zero() || inside { None } else { warm::run(&argv, &options, &mount) };
        let ran = match warm {
            Some(ran) => ran,
            None => match fuse_path::plan(&options.mounts) {
                Ok(plan) => {
                    let ns = names::Namespace::new(&options.mounts, options.retry).map_err(setup)?;
                    fuse_path::run(&argv, ns, plan, mount)
                }
                Err(why) => Err(fuse_path::NotRun::Unavailable(why)),
            },
        };
        let unavailable = match ran {
            Ok(status) => return Ok(status),
            Err(fuse_path::NotRun::Stopped(abort)) => return Err(abort),
            Err(fuse_path::NotRun::Unavailable(why)) => why,
        };
        if options.interposition == Interposition::Fuse {
            return Err(setup(format!("no FUSE path here: {unavailable}")));
        }
        tracing::debug!("tracing the program: no FUSE path here: {unavailable}");
    }
    let ns = names::Namespace::new(&options.mounts, options.retry).map_err(setup)?;
    let stage = stage::Stage::new(ns, options.attr_timeout).map_err(setup)?;
    let mut agent = syscalls::Agent { stage };
    let outcome = tracer::run(&argv, &mut agent);
    // Whatever happened, write back what the program wrote (unless the server is gone).
    // A program that ended well whose files cannot be written back has not ended well.
    let outcome = match outcome {
        Err(abort) if abort.status == EXIT_TRANSIENT => Err(abort),
        Err(abort) => {
            let _ = agent.stage.sync_all();
            Err(abort)
        }
        Ok(status) => match agent.stage.sync_all() {
            Err(Fail::Stop(abort)) => Err(abort),
            _ => Ok(status),
        },
    };
    if agent.stage.has_unsent() {
        if let Some(dir) = agent.stage.keep() {
            eprintln!("locus run: files not written back are kept in {}", dir.display());
        }
    }
    outcome
}
