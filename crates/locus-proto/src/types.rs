//! Records carried in frame metadata: attributes, directory entries, file-system
//! statistics, access-control entries and I/O counters.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A point in time as seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// What `stat` says of a file, with the POSIX fields programs rely on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub dev: u64,
    pub ino: u64,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u32,
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
}

/// File-type bits of `st_mode`.
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

impl Attr {
    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    /// True for a regular file.
    pub fn is_file(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }
    /// True for a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }
}

/// One name in a directory listing with its attributes (as `lstat` gives them), so
/// that `ls -l` costs one round trip instead of one per entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub attr: Attr,
}

/// What `statfs` says of the file system holding the export.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    pub bsize: u64,
    pub frsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namemax: u64,
}

#[cfg(feature = "host")]
impl From<&rustix::fs::StatVfs> for StatFs {
    /// The record of a host `statvfs`: the one conversion, for the store and the local
    /// driver alike.
    fn from(s: &rustix::fs::StatVfs) -> Self {
        StatFs {
            bsize: s.f_bsize,
            frsize: s.f_frsize,
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            namemax: s.f_namemax,
        }
    }
}

/// Flags of `open`, in Locus' own stable bits (mapped to the host's `O_*` by the server).
pub mod open_flags {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const CREATE: u32 = 4;
    pub const EXCLUSIVE: u32 = 8;
    pub const TRUNCATE: u32 = 16;
    pub const APPEND: u32 = 32;
    pub const DIRECTORY: u32 = 64;
    pub const NOFOLLOW: u32 = 128;
    /// Every defined bit.
    pub const ALL: u32 = 255;
}

/// The answer to `open`: a handle and the attributes of what it names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    pub handle: u64,
    pub attr: Attr,
    /// Where a cluster head's large file can be read straight from its data nodes.
    pub location: Option<Location>,
}

/// A signed, expiring statement that one subject may read one version of one object:
/// what a data node checks before serving a third-party read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub subject: String,
    pub object: u64,
    pub version: u64,
    /// The version's length in bytes (a read past it gets nothing).
    pub size: u64,
    /// Seconds since the epoch after which nodes refuse it.
    pub expires: u64,
    /// HMAC-SHA256 of the fields above under the cluster key.
    pub mac: Vec<u8>,
}

/// Where to read a file's bytes in a cluster: the data nodes holding its version (the
/// first is preferred, the others are replicas), and the capability to present there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    /// `host:port` of each data node holding the version.
    pub nodes: Vec<String>,
    pub capability: Capability,
    /// The token the subject authenticates with at the data nodes (derived from the
    /// cluster key, so nodes keep no token file).
    pub node_token: String,
}

/// The answer to `locate`: a file's attributes and, when it is large enough to be read
/// from data nodes, where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Located {
    pub attr: Attr,
    pub location: Option<Location>,
}

/// One file of a data node's share of a cluster-wide storelet run: where it appears in
/// the run's directory, and its bytes (the object version the node holds, or inline).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewFile {
    /// Relative to the run's directory, `/`-separated, no `..`.
    pub path: String,
    pub object: u64,
    pub version: u64,
    /// A small file's bytes, which live at the head, not on the node.
    pub inline: Option<Vec<u8>>,
}

/// What a head tells a data node that joins it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeWelcome {
    /// The node's id in the cluster (stable across restarts for the same address).
    pub node: u64,
    /// The head's nonce of this join: with the node's and the node's token it derives
    /// the key `keys` is sealed with.
    pub nonce: Vec<u8>,
    /// The cluster's [`crate::capability::KeyRing`], encoded and sealed (AEAD) under a
    /// key only the node and its head can derive: the keys never cross the wire in clear.
    pub sealed: Vec<u8>,
    /// How often the head wants the node to join again (its heartbeat), in milliseconds.
    pub every_ms: u64,
    /// The addresses of the namespace's heads heard from lately (this one included), so
    /// that the node can join another when this one dies, whichever the node was told.
    pub heads: Vec<String>,
    /// From a head that serves TLS: the node's TLS identity (a certificate chain for
    /// the host it advertised, its key, and the cluster's authority, each PEM), sealed
    /// as `sealed` is; empty from a head that does not.
    pub tls: Vec<u8>,
}

/// Where a client writes a new version's bytes itself (a third-party write): the nodes
/// the head chose, the capability to present there, and the head's seal over the
/// write, which the client hands back with `write_commit`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteTarget {
    pub object: u64,
    pub version: u64,
    /// The nodes' ids, in the order of `nodes`.
    pub node_ids: Vec<u64>,
    /// `host:port` of each node to send every byte to.
    pub nodes: Vec<String>,
    /// A write capability: its subject may store exactly `size` bytes as this version
    /// until `expires`.
    pub capability: Capability,
    /// The token the subject authenticates with at the nodes.
    pub node_token: String,
    /// The head's MAC over the subject, path, version, size, nodes and expiry: a commit
    /// names only a write the head began.
    pub seal: Vec<u8>,
}

/// A data node as `node_list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: u64,
    pub addr: String,
    pub http: Option<String>,
    /// Free bytes it last reported.
    pub free: u64,
    /// `up`, `down` (no heartbeat within the head's timeout), `draining` or `drained`.
    pub state: String,
    /// Seconds since its last heartbeat.
    pub seen_s: u64,
    /// Current file versions it holds.
    pub versions: u64,
}

/// Timestamps to set with `utimes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    /// Leave this timestamp as it is.
    Omit,
    /// Set it to the server's current time.
    Now,
    /// Set it to this time.
    At(Time),
}

/// The answer to `hello`: the server's challenge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    pub version: u16,
    pub server: String,
    pub nonce: Vec<u8>,
}

/// The answer to a successful `auth`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// This connection's id, by which other clients (and scripts) address pushes to it.
    pub client_id: u64,
    pub subject: String,
    /// The server's proof that it knows the token too.
    pub proof: Vec<u8>,
    /// The server is a cluster head: large files may be read from its data nodes.
    pub head: bool,
    /// A head's: the namespace's heads heard from lately (addresses, this one among
    /// them), for a client to go on through another when this one is gone.
    pub heads: Vec<String>,
}

/// Chirp-like access rights, as a set of letters.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rights(pub u8);

impl Rights {
    /// `r`: read file contents.
    pub const READ: Rights = Rights(1);
    /// `w`: create and modify files and directories.
    pub const WRITE: Rights = Rights(2);
    /// `l`: list directories and stat names.
    pub const LIST: Rights = Rights(4);
    /// `d`: delete and rename away.
    pub const DELETE: Rights = Rights(8);
    /// `a`: change the ACL; at the root, administer the server.
    pub const ADMIN: Rights = Rights(16);
    /// `x`: run code (scripts, storelets, active files).
    pub const EXECUTE: Rights = Rights(32);
    /// Every right.
    pub const ALL: Rights = Rights(63);
    const LETTERS: [(char, Rights); 6] = [
        ('r', Rights::READ),
        ('w', Rights::WRITE),
        ('l', Rights::LIST),
        ('d', Rights::DELETE),
        ('a', Rights::ADMIN),
        ('x', Rights::EXECUTE),
    ];

    /// True when every right in `other` is held.
    pub fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of two sets.
    pub fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }

    /// Parses letters such as `rwl`; `-` or an empty string means no rights.
    pub fn parse(s: &str) -> Result<Rights, String> {
        let mut r = Rights(0);
        for c in s.chars() {
            if c == '-' {
                continue;
            }
            match Self::LETTERS.iter().find(|(l, _)| *l == c) {
                Some((_, bit)) => r = r.union(*bit),
                None => return Err(format!("unknown right '{c}' (expected letters from rwldax)")),
            }
        }
        Ok(r)
    }
}

impl fmt::Display for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("-");
        }
        for (l, bit) in Self::LETTERS {
            if self.contains(bit) {
                write!(f, "{l}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rights({self})")
    }
}

/// One line of a directory's access-control list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclEntry {
    /// A subject name; `*` for every subject that authenticated with a Locus token; or a
    /// Chirp-style pattern of a host subject (`hostname:*.example.org`, `address:10.0.*`).
    /// See [`acl_subject_matches`].
    pub subject: String,
    pub rights: Rights,
}

impl AclEntry {
    /// Whether this entry grants its rights to `subject` (see [`acl_subject_matches`]).
    pub fn admits(&self, subject: &str) -> bool {
        acl_subject_matches(&self.subject, subject)
    }
}

/// The methods whose subjects (`METHOD:NAME`) hold no Locus token: Chirp's, which name
/// a peer's address, its host name or a local user, and `anonymous`, the S3 door's
/// unsigned requests (`--s3-anonymous NAME` acts as `anonymous:NAME`). Each is a proof
/// weaker than a token (or none), so `*` never admits them.
pub const HOST_METHODS: [&str; 4] = ["unix", "hostname", "address", "anonymous"];

/// The Chirp method of a host subject (`address` for `address:10.0.0.7`), or `None` for
/// a subject that authenticated with a Locus token (their names hold no `:`).
pub fn host_method(subject: &str) -> Option<&str> {
    subject.split_once(':').map(|(m, _)| m).filter(|m| HOST_METHODS.contains(m))
}

/// Whether the ACL entry `entry` applies to `subject`. A subject matches its own name.
/// `*` matches every subject that authenticated with a Locus token, never a host subject
/// (Chirp's `unix:`, `hostname:`, `address:`), so turning on the Chirp endpoint widens no
/// existing entry. A host subject also matches a pattern an administrator wrote for its
/// method, where `*` stands for any run of characters, as in Chirp's ACLs:
/// `hostname:*.example.org`, `address:10.0.*`, `unix:*`. Patterns never match token
/// subjects.
pub fn acl_subject_matches(entry: &str, subject: &str) -> bool {
    if entry == subject {
        return true;
    }
    match host_method(subject) {
        None => entry == "*",
        Some(method) => host_method(entry) == Some(method) && wildcard_match(entry, subject),
    }
}

/// Glob matching where `*` in `pattern` stands for any run of bytes (none included) and
/// every other byte stands for itself. Linear in practice: it backtracks only to the
/// last `*` seen.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == t[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            // Let the last `*` take one more byte and try again after it.
            star = Some((si, sj + 1));
            i = si + 1;
            j = sj + 1;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&b| b == b'*')
}

/// A value crossing between a client and a script: arguments and results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    Num(f64),
    Str(String),
    /// A string that is not UTF-8.
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Map(Vec<(String, Value)>),
}

/// One event in the reply stream of `storelet_run`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreletEvent {
    /// The run left the queue; `run` names it for `storelet_cancel`.
    Started { run: u64, module: String },
    /// Bytes the program wrote to stdout (the frame's data).
    Stdout,
    /// Bytes the program wrote to stderr (the frame's data).
    Stderr,
    /// The program ended (the last frame); a run stopped by a limit or cancelled ends
    /// with an error frame instead.
    Finished(StoreletResult),
    /// Between a data node and its head only, in a writable run: the run wrote the file
    /// `path` (relative to the run's directory), `size` bytes, kept aside as `token`.
    Wrote { path: String, size: u64, token: String },
    /// Between a data node and its head only, in a writable run: the run removed `path`.
    Removed { path: String },
}

/// How a storelet run ended and what it used: its account.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreletResult {
    pub run: u64,
    /// SHA-256 of the module, the key of the server's compile cache.
    pub module: String,
    pub exit_code: i32,
    pub fuel: u64,
    pub cpu_us: u64,
    pub peak_memory: u64,
    pub wall_us: u64,
    /// Bytes written to stdout and stderr.
    pub output_bytes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub files_opened: u64,
}

/// A queued or running storelet, as `storelet_ps` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreletRunInfo {
    pub run: u64,
    pub subject: String,
    pub module: String,
    pub args: Vec<String>,
    /// False while it waits for a worker.
    pub running: bool,
    /// Time since it was submitted.
    pub age_us: u64,
    pub cpu_us: u64,
    pub fuel: u64,
}

/// A finished run in the server's storelet log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreletLogEntry {
    pub subject: String,
    pub args: Vec<String>,
    /// `exit N`, `LIMIT: ...` or `cancelled`.
    pub outcome: String,
    pub account: StoreletResult,
}

/// Storelet totals of one subject.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubjectStoreletStats {
    pub subject: String,
    pub runs: u64,
    /// Runs stopped by a limit, cancelled, or that trapped.
    pub stopped: u64,
    pub active: u64,
    pub cpu_us: u64,
    pub fuel: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// CPU time drawn from the subject's budget in the current window.
    pub budget_spent_us: u64,
    pub budget_us: u64,
}

/// The answer to `storelet_stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreletReport {
    pub subjects: Vec<SubjectStoreletStats>,
    /// Most recent first.
    pub recent: Vec<StoreletLogEntry>,
    /// Modules compiled since the server started (the rest came from the cache).
    pub compiles: u64,
}

/// One registered active-file handler, as `handlers` lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandlerInfo {
    /// The name invocations use (`NAME@ARGS`, or a command line whose program is NAME).
    pub name: String,
    /// What runs: `storelet` (a WebAssembly module).
    pub kind: String,
    /// The SHA-256 of the module.
    pub module: String,
    /// Arguments put before the invocation's own.
    pub args: Vec<String>,
}

/// Counts and service time of reads and writes, kept per file, per device and per export.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    pub reads: u64,
    pub read_bytes: u64,
    pub read_ns: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub write_ns: u64,
    /// The 99th percentile of read and write service times (from power-of-two buckets,
    /// so within a factor of two; 0 without operations).
    pub read_p99_ns: u64,
    pub write_p99_ns: u64,
}

impl IoCounters {
    /// The load these counters stand for, the measure rebalancing evens out: bytes moved
    /// plus 4 KiB per operation (a small operation costs a device a seek or a page).
    pub fn load(&self) -> u64 {
        self.read_bytes + self.write_bytes + 4096 * (self.reads + self.writes)
    }
}

/// Counters of one file, by its path at the time it was last used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStats {
    pub path: String,
    /// The device that holds its content (an index into `StatsReport::devices`).
    pub device: u32,
    pub io: IoCounters,
}

/// One storage device (directory) of the export and what it carried.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub index: u32,
    /// Its directory on the server.
    pub path: String,
    pub io: IoCounters,
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// Count and total service time of one operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStats {
    pub op: String,
    pub count: u64,
    pub total_ns: u64,
}

/// The answer to `stats`: export totals, per-operation counts and the busiest files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsReport {
    pub export: IoCounters,
    pub ops: Vec<OpStats>,
    pub busiest: Vec<FileStats>,
    pub clients: u64,
    /// Every device of the export, in order.
    pub devices: Vec<DeviceStats>,
    /// Callback promises held now, and refused since the server started (a bound on
    /// promises or watches reached: those answers were cached only for a timeout).
    pub promises_held: u64,
    pub promises_refused: u64,
    /// inotify watches the server holds for promises.
    pub watches: u64,
}

/// One move of a file's content between devices; its name does not change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub path: String,
    pub from: u32,
    pub to: u32,
    /// The file's measured load ([`IoCounters::load`]).
    pub load: u64,
    pub size: u64,
}

/// A rebalancing plan, or what applying one did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebalance {
    /// The moves, in the order they are (or were) made.
    pub moves: Vec<Move>,
    /// Measured load per device before, and as the plan leaves it.
    pub before: Vec<u64>,
    pub after: Vec<u64>,
    /// Files a plan wanted to move that could not be, with why (when applied).
    pub skipped: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn star_admits_token_subjects_and_never_host_subjects() {
        use super::acl_subject_matches as m;
        assert!(m("*", "alice") && m("*", "admin"));
        for host in ["address:127.0.0.1", "hostname:node7.example.org", "unix:alice", "address:::1"] {
            assert!(!m("*", host), "{host}");
            assert!(m(host, host), "{host} matches its own entry");
        }
        assert!(!m("alice", "unix:alice") && !m("unix:alice", "alice"));
        assert!(!m("address:127.0.0.2", "address:127.0.0.1"));
    }

    #[test]
    fn chirp_patterns_match_only_host_subjects_of_their_method() {
        use super::acl_subject_matches as m;
        assert!(m("address:127.0.*", "address:127.0.0.1"));
        assert!(m("address:10.0.*", "address:10.0.3.7"));
        assert!(!m("address:10.0.*", "address:10.1.0.7"));
        assert!(!m("address:10.0.*", "address:110.0.0.7"), "patterns are anchored at both ends");
        assert!(m("hostname:*.example.org", "hostname:node7.example.org"));
        assert!(m("hostname:*.example.org", "hostname:a.b.example.org"));
        assert!(!m("hostname:*.example.org", "hostname:example.org"));
        assert!(!m("hostname:*.example.org", "hostname:node7.example.org.evil.net"));
        assert!(m("unix:*", "unix:alice") && m("address:*", "address:::1"));
        // A pattern is for its own method only, and never for token subjects.
        assert!(!m("hostname:*", "address:10.0.0.7"));
        assert!(!m("address:*", "hostname:node7"));
        assert!(!m("*:*", "address:10.0.0.7") && !m("*a*", "address:10.0.0.7"));
        assert!(!m("ali*", "alice") && !m("unix:*", "alice"));
    }

    #[test]
    fn wildcard_matching() {
        use super::wildcard_match as w;
        for (p, t) in
            [("", ""), ("*", ""), ("*", "abc"), ("a*c", "abbbc"), ("a*b*c", "aXbYbZc"), ("**", "x"), ("a*", "a")]
        {
            assert!(w(p, t), "{p} ~ {t}");
        }
        for (p, t) in [("", "a"), ("a", ""), ("a*c", "abd"), ("a*b*c", "acb"), ("abc", "abcd"), ("*c", "cb")] {
            assert!(!w(p, t), "{p} !~ {t}");
        }
        // Many stars against a long text that fails at the end stays quick.
        let text = "a".repeat(256);
        assert!(!w(&format!("{}b", "*a".repeat(50)), &text));
    }

    use super::*;

    #[test]
    fn rights_parse_and_print() {
        let r = Rights::parse("rwl").unwrap();
        assert!(r.contains(Rights::READ) && r.contains(Rights::LIST) && !r.contains(Rights::ADMIN));
        assert_eq!(r.to_string(), "rwl");
        assert_eq!(Rights::parse("-").unwrap().to_string(), "-");
        assert_eq!(Rights::ALL.to_string(), "rwldax");
        assert!(Rights::parse("rq").is_err());
    }
}
