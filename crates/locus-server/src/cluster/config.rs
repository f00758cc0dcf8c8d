//! How a head serves its cluster: plain settings, built with or without the `cluster`
//! feature, so the CLI can parse them and a build without a namespace engine can refuse
//! them clearly.

use std::time::Duration;

/// How often a node reports to its head (its heartbeat), unless the head asks for
/// another period when it answers (a third of [`HeadConfig::node_timeout`]).
pub const REJOIN_EVERY: Duration = Duration::from_secs(10);

/// How a head serves its cluster.
#[derive(Clone, Debug)]
pub struct HeadConfig {
    /// Where the namespace is: a SQLite file's path, or a `postgres://` URL.
    pub meta: String,
    /// Files at least this large are read from data nodes (third-party transfer).
    pub tp_threshold: u64,
    /// Files at most this large live in the namespace, not on data nodes.
    pub inline_max: u64,
    /// Data nodes that hold each version.
    pub replication: usize,
    /// How long a capability is valid.
    pub capability_ttl: Duration,
    /// `host:port` of the head's HTTP endpoint, for the URLs `share` makes.
    pub http: Option<String>,
    /// The longest lifetime a shared URL may be given (`locus serve --share-max-ttl`);
    /// a longer ask is refused with `EINVAL`, and a URL expiring further ahead is not
    /// honoured, so a URL cannot be made to live forever.
    pub share_max_ttl: Duration,
    /// After a key rotation, how long the head goes on signing with the old key while
    /// the data nodes learn the new one (they rejoin every [`REJOIN_EVERY`]).
    pub key_grace: Duration,
    /// A data node not heard from for this long is down: no new versions go to it, and
    /// the versions it holds are copied from their other replicas until each has
    /// [`HeadConfig::replication`] live copies again. Nodes send heartbeats three times
    /// within it.
    pub node_timeout: Duration,
    /// How fast healing copies versions between nodes, in bytes a second (0: as fast as
    /// the links go), so that clients' reads keep their speed meanwhile.
    pub repair_rate: u64,
    /// `host:port` other heads' data nodes reach this head at (`locus serve --advertise`;
    /// by default the listen address unless it is a wildcard), kept in the namespace so
    /// that every data node learns every head.
    pub advertise: Option<String>,
}

/// The default of [`HeadConfig::share_max_ttl`]: seven days.
pub const SHARE_MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

impl HeadConfig {
    /// The defaults, with the namespace at `meta`.
    pub fn new(meta: impl Into<String>) -> Self {
        HeadConfig {
            meta: meta.into(),
            tp_threshold: 1 << 20,
            inline_max: 64 << 10,
            replication: 1,
            capability_ttl: Duration::from_secs(60),
            http: None,
            share_max_ttl: SHARE_MAX_TTL,
            key_grace: REJOIN_EVERY + Duration::from_secs(5),
            node_timeout: 3 * REJOIN_EVERY,
            repair_rate: 64 << 20,
            advertise: None,
        }
    }
}
