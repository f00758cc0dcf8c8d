//! Benchmarks of Locus side by side with its peers, in one run on one machine.
//!
//! - [`ops`]: `locus bench ops`, per-operation latency and bandwidth (Parrot's Figure 11
//!   rows) against Locus, CCTools' `chirp_server`, XRootD and a bare TCP ping-pong.
//! - [`chirp`]: `locus bench chirp`, CCTools' `chirp` tool against Locus' Chirp endpoint
//!   and `chirp_server`, per operation.
//! - [`active`]: `locus bench active`, a job triggered by opening an active file against
//!   the same program at the server and on the client over `locus mount`, across RTTs.
//! - [`cluster`]: `locus bench cluster`, SPIRAL's experiment: a head, data nodes and
//!   clients in network namespaces on rate-limited links, third-party transfer on and off.
//! - [`faults`]: `locus bench faults`, scenarios that kill, fill or cut a part of the
//!   system during writes and check that nothing acknowledged is lost or half-written.
//! - [`agent`]: `locus bench agent`, Figure 4 rows under `locus run`, local and remote,
//!   beside the same program unmodified and on `locus mount`.
//! - [`mount`]: `locus bench mount`, Figure 4 rows and an Andrew-like run on `locus mount`
//!   (Locus and Chirp drivers) beside a local directory.
//! - [`pingpong`]: the bare TCP request/reply floor.
//! - [`placement`]: pinning clients and servers to CPUs, the same for every target.
//! - [`storelets`]: `locus bench storelets`, `find` at the server against a client-side
//!   traversal and a local `find`, and the file service under hostile storelets.
//! - [`soak`]: `locus bench soak`, mixed clients against one server for minutes:
//!   throughput and p99 over time, and the server's memory, descriptors and threads.
//! - [`stats`]: summaries (mean, p50, p99) and medians across repeats.
//!
//! The peers' processes and the delay proxy that emulates round-trip time (this machine
//! has no netem) are `locus_testkit::peers` and `locus_testkit::proxy`, shared with the tests.

pub mod active;
pub mod agent;
pub mod chirp;
pub mod cluster;
pub mod cluster_heal;
pub mod cluster_mount;
pub mod faults;
mod fuse_transports;
pub mod mount;
pub mod ops;
pub mod pingpong;
pub mod placement;
pub mod scripts;
pub mod soak;
pub mod stats;
pub mod storelets;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Setup(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

impl From<locus_testkit::peers::PeerError> for BenchError {
    fn from(e: locus_testkit::peers::PeerError) -> Self {
        match e {
            locus_testkit::peers::PeerError::Setup(why) => BenchError::Setup(why),
            locus_testkit::peers::PeerError::Io(context, source) => BenchError::Io { context, source },
        }
    }
}

impl BenchError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        BenchError::Io { context: context.into(), source }
    }
}
