//! Callbacks across heads: a change made through one head breaks the promises that
//! every head made to its clients.
//!
//! A head breaks its own clients' promises as a single server does (the session calls
//! [`crate::callbacks::Callbacks::changed`]). It also announces each change on the
//! namespace's engine (PostgreSQL `NOTIFY` on [`CHANNEL`], sent in batches by a thread
//! of its own, so a writer never waits for it), and listens there for the other heads'
//! announcements, breaking its clients' promises on what they name. PostgreSQL delivers
//! a notice after the change's transaction committed, to every head listening then. A
//! head promises nothing while it is not listening (before its first `LISTEN`, or
//! while its link is down: a quiet link is checked every few seconds), and each time
//! it starts listening it breaks every promise it holds, since what was announced
//! meanwhile went unheard (its clients ask again). An announcement that fails is tried
//! again until it goes. A SQLite namespace has one head: nothing is announced. What
//! breaks promises also forgets the read-only run plans the head keeps (`plans`).

use crate::cluster::Head;
use crate::Shared;
use locus_cluster::sql::{Notice, MAX_NOTICE};
use serde::{Deserialize, Serialize};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

/// The channel heads announce changes on.
pub(crate) const CHANNEL: &str = "locus_changes";

use crate::cluster::head::Change;

/// Changes announced to the other heads at most in one notification round.
const BATCH: usize = 512;

/// One notice: the head that made the changes, and the changes.
#[derive(Serialize, Deserialize)]
struct Announcement {
    h: u64,
    c: Vec<Change>,
}

/// The payloads announcing `changes` by head `from`, each under [`MAX_NOTICE`] bytes. A
/// path too long to fit is announced as its nearest directory that fits, with names
/// changed there (which breaks every promise beneath it).
fn payloads(from: u64, changes: Vec<Change>) -> Vec<String> {
    let encode = |c: &[Change]| serde_json::to_string(&Announcement { h: from, c: c.to_vec() }).expect("encodable");
    let mut out = Vec::new();
    let mut batch: Vec<Change> = Vec::new();
    for (mut names, mut path) in changes {
        while encode(&[(names, path.clone())]).len() > MAX_NOTICE {
            path = crate::callbacks::parent(&path).to_string();
            names = true;
        }
        batch.push((names, path));
        if encode(&batch).len() > MAX_NOTICE {
            let last = batch.pop().expect("just pushed");
            out.push(encode(&batch));
            batch = vec![last];
        }
    }
    if !batch.is_empty() {
        out.push(encode(&batch));
    }
    out
}

impl Head {
    /// Starts announcing this head's changes and hearing the other heads' (where the
    /// engine has other heads: PostgreSQL). Breaks go to the clients of `shared`.
    pub(crate) fn start_changes(self: &Arc<Self>, shared: Weak<Shared>) {
        let _ = self.shared.set(shared.clone());
        let me = self.id;
        let listening = self.meta.listen(
            CHANNEL,
            Box::new(move |notice| {
                let Some(shared) = shared.upgrade() else { return false };
                // What another head changed (or, unheard, everything) breaks promises
                // and kept run plans here.
                let heard = |path: &str, names: bool, listening: Option<bool>| {
                    if let Some(head) = &shared.head {
                        if let Some(yes) = listening {
                            head.listening.store(yes, std::sync::atomic::Ordering::SeqCst);
                        }
                        head.plans.changed(path);
                    }
                    shared.callbacks.changed(&shared.registry, 0, &[path], names);
                };
                match notice {
                    Notice::Payload(p) => match serde_json::from_str::<Announcement>(&p) {
                        Ok(a) if a.h != me => a.c.iter().for_each(|(names, path)| heard(path, *names, None)),
                        Ok(_) => {}
                        Err(e) => tracing::warn!("an unreadable change notice ({e}): ignored"),
                    },
                    Notice::Listening => heard("/", true, Some(true)),
                    Notice::Down => {
                        tracing::warn!("not hearing other heads' changes: promising nothing until heard again");
                        heard("/", true, Some(false));
                    }
                    Notice::Idle => {}
                }
                true
            }),
        );
        if !listening {
            return;
        }
        let (tx, rx) = mpsc::channel::<Vec<Change>>();
        *self.announce.lock() = Some(tx);
        let head = Arc::downgrade(self);
        let announcing = move || {
            while let Ok(mut changes) = rx.recv() {
                while let (true, Ok(more)) = (changes.len() < BATCH, rx.try_recv()) {
                    changes.extend(more);
                }
                let payloads = payloads(me, changes);
                loop {
                    let Some(head) = head.upgrade() else { return };
                    match head.meta.notify(CHANNEL, &payloads) {
                        Ok(()) => break,
                        Err(e) => tracing::warn!("cannot tell the other heads of a change yet ({e}): trying again"),
                    }
                    drop(head);
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        };
        if let Err(e) = std::thread::Builder::new().name("locus-announce".into()).spawn(announcing) {
            tracing::warn!("cannot start announcing changes to other heads: {e}");
            *self.announce.lock() = None;
        }
    }

    /// Whether this head hears every change other heads make (always, when there are
    /// none: a SQLite namespace), so that it may promise callbacks.
    pub(crate) fn hears_others(&self) -> bool {
        self.announce.lock().is_none() || self.listening.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Announces to the other heads that `paths` changed (with `names`: names were made
    /// or removed there). The paths of one change go together, in one notice where
    /// they fit: a client told of one of them is not told of the others later, after
    /// it asked again (a rename's two names, say).
    pub(crate) fn announce(&self, paths: &[&str], names: bool) {
        if let Some(tx) = self.announce.lock().as_ref() {
            let _ = tx.send(paths.iter().map(|p| (names, p.to_string())).collect());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_stay_under_the_notice_limit_and_lose_no_change() {
        let long = format!("/d/{}", "x".repeat(MAX_NOTICE));
        let mut changes: Vec<Change> = (0..2000).map(|i| (i % 2 == 0, format!("/dir/file-{i}"))).collect();
        changes.push((false, long));
        let out = payloads(7, changes.clone());
        assert!(out.len() > 1);
        let mut back = Vec::new();
        for p in &out {
            assert!(p.len() <= MAX_NOTICE, "{}", p.len());
            let a: Announcement = serde_json::from_str(p).unwrap();
            assert_eq!(a.h, 7);
            back.extend(a.c);
        }
        assert_eq!(back[..2000], changes[..2000]);
        // The path too long for a notice is announced as its directory, names changed.
        assert_eq!(back[2000], (true, "/d".to_string()));
    }
}
