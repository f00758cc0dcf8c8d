//! Keeping the kernel's attributes of listed directories fresh, so that the second walk
//! of a tree costs what the third does.
//!
//! The kernel marks a FUSE directory's access time stale whenever it reads the
//! directory's listing from the file system (every listing the mount answers), and
//! then asks the file system again at the directory's next `stat`, however long it was
//! told to trust the attributes. The second `find` over a tree would ask once per
//! directory. While callbacks hold, the mount answers these from what it knows, but
//! each is still a trip through the kernel. Instead, once listings stop coming for a
//! moment, a thread of the mount `stat`s each directory listed since, through the
//! mount itself: the kernel's attributes are whole again before the next walk comes.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

/// How long listings must stop coming before the thread goes through them; a listing
/// that comes during a sweep ends it, so a walk that starts again is slowed by one
/// `statx` at most.
const QUIET: Duration = Duration::from_millis(50);

/// The most directories remembered between two sweeps; more are let go (the kernel
/// then asks for them, as it would without this).
const MOST: usize = 1 << 16;

/// Where listed directories go to have their attributes read again.
pub(crate) struct Freshener {
    listed: Sender<String>,
}

impl Freshener {
    /// A thread that reads attributes through `root` (the directory where the kernel
    /// shows this mount's root).
    pub(crate) fn start(root: PathBuf) -> Option<Freshener> {
        let (listed, heard) = channel::<String>();
        let sweep = move || {
            // This thread asks the mount its own process serves. Its table of descriptors
            // is made its own and holds none of the process's (/dev/fuse, the rings): a
            // process killed while this thread waits for an answer then still lets go of
            // /dev/fuse, which aborts the connection and ends the wait. Sharing the table,
            // the waiting thread kept /dev/fuse open and the killed process never ended.
            // SAFETY: unshare and close_range act on this thread's own descriptor table.
            unsafe {
                if libc::unshare(libc::CLONE_FILES) == 0 {
                    libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                }
            }
            let mut pending: Option<BTreeSet<String>> = None;
            loop {
                let mut due = match pending.take() {
                    Some(due) => due,
                    None => match heard.recv() {
                        Ok(first) => BTreeSet::from([first]),
                        Err(_) => return,
                    },
                };
                loop {
                    match heard.recv_timeout(QUIET) {
                        Ok(dir) if due.len() < MOST => {
                            due.insert(dir);
                        }
                        Ok(_) => {}
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                // By whole paths, holding nothing open between them: an open descriptor
                // beneath the mount would keep it busy, and its unmount would fail. A
                // listing that comes meanwhile (a walk again) ends the sweep: it starts
                // over once that walk pauses.
                let mut due = due.into_iter();
                for dir in due.by_ref() {
                    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
                    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT;
                    let _ = statx(CWD, root.join(dir), flags, StatxFlags::BASIC_STATS);
                    if let Ok(next) = heard.try_recv() {
                        let mut again: BTreeSet<String> = due.collect();
                        again.insert(next);
                        pending = Some(again);
                        break;
                    }
                }
            }
        };
        let spawned = std::thread::Builder::new().name("locus-freshen".into()).spawn(sweep);
        spawned.map_err(|e| tracing::warn!("no thread to keep attributes fresh: {e}")).ok()?;
        Some(Freshener { listed })
    }

    /// Says that the kernel read the listing of `dir` (relative to the mount's root,
    /// `.` for the root itself).
    pub(crate) fn listed(&self, dir: String) {
        let _ = self.listed.send(dir);
    }
}
