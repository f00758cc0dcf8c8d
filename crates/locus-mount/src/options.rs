//! What `locus mount` is told: the consistency mode and the options of a mount.

use crate::writeback;
use std::time::Duration;

/// How a mount keeps what it caches consistent with the server and its other clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Consistency {
    /// Attributes, names, listings and pages are trusted for the attribute timeout, then
    /// asked for again: another client's change may stay unseen that long.
    Nfs,
    /// The server promises a callback for everything the mount asks about, and breaks
    /// it when another client changes the path; until then the kernel and the mount
    /// trust what they have indefinitely. Writes go through to the server as they are
    /// made (behind, as always), so other clients never read stale data once a write
    /// is answered and its break has arrived. Where the driver has no callbacks, it is
    /// [`Consistency::Nfs`].
    #[default]
    Sprite,
    /// As [`Consistency::Sprite`] for what the mount reads, and files opened for writing
    /// are written back: into a whole-file copy on local disk ([`writeback`]), stored at
    /// the server in one round trip when closed or synced. Other clients see a file's
    /// new content once it is closed (AFS's close-to-open), and errors of the store show
    /// at `close` or `fsync`. A file made where the mount's callbacks say the name is
    /// free, in a directory the server let it write in within the attribute timeout, is
    /// made at the server by that store: creating, writing and closing a small file is
    /// one round trip.
    Afs,
}

/// How a mount behaves.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may trust attributes and names without asking again, when
    /// no callback covers them.
    pub attr_timeout: Duration,
    pub consistency: Consistency,
    /// The most callback promises the server keeps for the mount (the oldest are
    /// broken to make room).
    pub max_promises: u32,
    /// Where [`Consistency::Afs`] keeps its local copies.
    pub cache_dir: std::path::PathBuf,
    /// The most bytes of local copies (a file larger than an eighth of it is written
    /// through instead), and of copies not yet stored (a writer past it waits for
    /// stores).
    pub cache_limit: u64,
    /// What the mount shows (its URL): the journal's records name it, and a mount
    /// stores at start only the unsaved copies an earlier mount of the same origin left.
    pub origin: String,
    /// How the kernel's requests reach the mount: FUSE over io_uring where the kernel
    /// offers it (`auto`, the default), or /dev/fuse reads.
    pub transport: locus_fuse::TransportChoice,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            attr_timeout: Duration::from_secs(1),
            consistency: Consistency::default(),
            max_promises: 1 << 18,
            cache_dir: writeback::default_dir(),
            cache_limit: 1 << 30,
            origin: String::new(),
            transport: locus_fuse::TransportChoice::Auto,
        }
    }
}
