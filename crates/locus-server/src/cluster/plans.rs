//! Runs planned once: a read-only storelet run over a directory of a cluster is
//! planned by the head (which node runs which files) and each node makes a tree of its
//! share; both are kept, so running the same or another program over the same
//! directory again costs the head no listing of the namespace and the nodes no tree.
//!
//! **At the head** ([`KeptPlans`]), a plan is kept per subject and directory once its
//! first run ended well, with a keyed 64-bit hash of each file's path and version per
//! share (8 bytes a file, not the files). It is forgotten when anything at, beneath or above its
//! directory changes: every change a head makes or hears from the other heads for
//! callbacks goes through [`KeptPlans::changed`] (so a change through another head is
//! seen once its notice arrives, as a cached mount sees it), and renames and ACL changes
//! above the directory count. A plan made while a change touching its directory was
//! made is not kept (the recent changes are numbered and remembered), nor one naming a
//! file with other names (a change through another name would not be heard here). A
//! kept plan is not used when one of its nodes is not live, or while the head does not
//! hear the other heads.
//!
//! **At a node** ([`KeptTrees`]), a share's tree is kept under the plan's number (drawn
//! at random by the head) once its run ended well, least recently used first out past
//! [`TREES_KEPT`] trees or [`TREE_BYTES_KEPT`] bytes. Any object dropped or found
//! damaged at the node forgets them all, since a tree could name it, and a tree naming a
//! version found damaged here is not kept; a node that has no tree for a plan answers
//! [`PLAN_NOT_HERE`].
//!
//! When a node fails during a run over a kept plan, or no longer has its tree, the
//! head lists the directory again (once a run) and picks that share's files by their
//! hashes (`Head::replay`), plans them over the nodes holding them now, and forgets the
//! plan; if the listing is not exactly the plan's files and versions (the directory
//! changed since), the run fails (`EAGAIN`) rather than mix what the other shares saw
//! with what is there now.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a node answers (`ENOENT`) for a run over a plan whose tree it does not keep.
pub(crate) const PLAN_NOT_HERE: &str = "run plan not kept here";

/// Plans a head keeps at most, and for one subject.
const PLANS_KEPT: usize = 64;
const PLANS_KEPT_PER_SUBJECT: usize = 8;

/// Files a head's kept plans name at most, together (8 bytes each).
const PLAN_FILES_KEPT: usize = 8_000_000;

/// Changes remembered to decide whether a plan made meanwhile may be kept.
const CHANGES_REMEMBERED: usize = 4096;

/// Trees a node keeps at most (its heads' plans together).
pub(crate) const TREES_KEPT: usize = 64;

/// Bytes of memory a node's kept trees hold at most, together
/// (`locus_storelet::Tree::held_bytes`: about 200 an entry, plus the bytes of small
/// files kept in the namespace).
pub(crate) const TREE_BYTES_KEPT: usize = 512 << 20;

/// One node's share of a kept plan.
pub(crate) struct KeptShare {
    /// The node's id.
    pub(crate) node: u64,
    /// The number the node keeps the share's tree under.
    pub(crate) plan: u64,
    /// The share's files' hashes (path and version), sorted.
    paths: Vec<u64>,
}

/// A read-only run's plan over a directory for a subject.
pub(crate) struct KeptPlan {
    pub(crate) who: String,
    pub(crate) dir: String,
    pub(crate) shares: Vec<KeptShare>,
    /// Where changes stood when its files were listed (see [`KeptPlans::now`]).
    since: u64,
    /// What its path hashes are keyed with (the head's own random key).
    hasher: RandomState,
}

impl KeptPlan {
    /// The plan of `shares` (each a node and its files: path, object and version),
    /// listed when changes stood at `since`, each share's tree to be kept under a new
    /// random number.
    pub(crate) fn of<'a, P>(
        plans: &KeptPlans,
        who: &str,
        dir: &str,
        since: u64,
        shares: impl IntoIterator<Item = (u64, P)>,
    ) -> KeptPlan
    where
        P: IntoIterator<Item = (&'a str, u64, u64)>,
    {
        let hasher = plans.hasher.clone();
        let shares = shares
            .into_iter()
            .map(|(node, files)| {
                let mut paths: Vec<u64> = files.into_iter().map(|f| hasher.hash_one(f)).collect();
                paths.sort_unstable();
                let mut plan = [0u8; 8];
                getrandom::fill(&mut plan).expect("the OS provides randomness");
                KeptShare { node, plan: u64::from_le_bytes(plan).max(1), paths }
            })
            .collect();
        KeptPlan { who: who.to_string(), dir: dir.to_string(), shares, since, hasher }
    }

    /// The number `node`'s share is kept under (0: the node has no share).
    pub(crate) fn plan_of(&self, node: u64) -> u64 {
        self.shares.iter().find(|s| s.node == node).map_or(0, |s| s.plan)
    }

    /// The node whose share holds the file `path` at `object`.`version`, if any.
    pub(crate) fn holder(&self, path: &str, object: u64, version: u64) -> Option<u64> {
        let h = self.hasher.hash_one((path, object, version));
        self.shares.iter().find(|s| s.paths.binary_search(&h).is_ok()).map(|s| s.node)
    }

    /// Whether `files` (path, object, version) are exactly the plan's: the directory
    /// holds what it did when the plan was made.
    pub(crate) fn is_exactly<'a>(&self, files: impl ExactSizeIterator<Item = (&'a str, u64, u64)>) -> bool {
        files.len() == self.files() && files.into_iter().all(|(p, o, v)| self.holder(p, o, v).is_some())
    }

    fn files(&self) -> usize {
        self.shares.iter().map(|s| s.paths.len()).sum()
    }
}

/// Whether a change at `changed` touches a plan over `dir`: at, beneath or above it.
fn touches(changed: &str, dir: &str) -> bool {
    let under = |path: &str, dir: &str| {
        dir == "/" || path == dir || (path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
    };
    under(changed, dir) || under(dir, changed)
}

#[derive(Default)]
struct Plans {
    kept: VecDeque<Arc<KeptPlan>>,
    /// How many changes have been heard.
    changes: u64,
    /// The last [`CHANGES_REMEMBERED`] changes, numbered.
    recent: VecDeque<(u64, String)>,
}

impl Plans {
    fn changed_since(&self, since: u64, dir: &str) -> bool {
        let heard = self.changes - since;
        heard > self.recent.len() as u64 || self.recent.iter().rev().take(heard as usize).any(|(_, p)| touches(p, dir))
    }
}

/// A head's kept plans (see the module's comment).
#[derive(Default)]
pub(crate) struct KeptPlans {
    plans: Mutex<Plans>,
    /// What path hashes are keyed with: drawn at random when the head starts, so
    /// nobody can make two paths collide on purpose.
    hasher: RandomState,
    /// Runs planned from the namespace.
    pub(crate) planned: AtomicU64,
    /// Runs over a kept plan.
    pub(crate) reused: AtomicU64,
}

impl KeptPlans {
    /// Where changes stand now: what a plan made from here on is kept against.
    pub(crate) fn now(&self) -> u64 {
        self.plans.lock().changes
    }

    /// The plan kept for `who` over `dir`, if any.
    pub(crate) fn get(&self, who: &str, dir: &str) -> Option<Arc<KeptPlan>> {
        let plans = self.plans.lock();
        plans.kept.iter().find(|p| p.who == who && p.dir == dir).cloned()
    }

    /// Keeps `plan`, unless a change touching its directory came since its files were
    /// listed, or too many came to tell. Past the bounds, the subject's oldest plan goes
    /// first, then anyone's.
    pub(crate) fn keep(&self, plan: Arc<KeptPlan>) {
        let mut plans = self.plans.lock();
        if plans.changed_since(plan.since, &plan.dir) {
            return;
        }
        plans.kept.retain(|p| !(p.who == plan.who && p.dir == plan.dir));
        if plans.kept.iter().filter(|p| p.who == plan.who).count() >= PLANS_KEPT_PER_SUBJECT {
            let oldest = plans.kept.iter().position(|p| p.who == plan.who).expect("counted");
            plans.kept.remove(oldest);
        }
        plans.kept.push_back(plan);
        let mut files: usize = plans.kept.iter().map(|p| p.files()).sum();
        while plans.kept.len() > PLANS_KEPT || files > PLAN_FILES_KEPT {
            files -= plans.kept.pop_front().map_or(0, |p| p.files());
        }
    }

    /// Forgets `plan` (one of its nodes failed, or lost its tree).
    pub(crate) fn forget(&self, plan: &Arc<KeptPlan>) {
        self.plans.lock().kept.retain(|p| !Arc::ptr_eq(p, plan));
    }

    /// `path` changed: plans it touches are forgotten.
    pub(crate) fn changed(&self, path: &str) {
        let mut plans = self.plans.lock();
        plans.changes += 1;
        let n = plans.changes;
        plans.recent.push_back((n, path.to_string()));
        if plans.recent.len() > CHANGES_REMEMBERED {
            plans.recent.pop_front();
        }
        plans.kept.retain(|p| !touches(path, &p.dir));
    }

    /// Counts a run: over a kept plan, or planned from the namespace.
    pub(crate) fn count(&self, reused: bool) {
        let counter = if reused { &self.reused } else { &self.planned };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Trees {
    /// Least recently used first.
    kept: VecDeque<(u64, Arc<locus_storelet::Tree>)>,
    /// How many times objects were dropped here.
    drops: u64,
    /// Versions found damaged here since the node started (few: each is a failure).
    damaged: std::collections::HashSet<(u64, u64)>,
}

/// A data node's kept trees (see the module's comment).
#[derive(Default)]
pub(crate) struct KeptTrees(Mutex<Trees>);

impl KeptTrees {
    /// The tree kept for `plan` (now the most recently used).
    pub(crate) fn get(&self, plan: u64) -> Option<Arc<locus_storelet::Tree>> {
        let mut trees = self.0.lock();
        let at = trees.kept.iter().position(|(p, _)| *p == plan)?;
        let found = trees.kept.remove(at).expect("found");
        trees.kept.push_back(found.clone());
        Some(found.1)
    }

    /// Whether a tree naming these versions may be kept: none was found damaged here.
    pub(crate) fn may_keep(&self, mut versions: impl Iterator<Item = (u64, u64)>) -> bool {
        let trees = self.0.lock();
        trees.damaged.is_empty() || !versions.any(|v| trees.damaged.contains(&v))
    }

    /// Where drops stand now: what a tree made from here on is kept against.
    pub(crate) fn now(&self) -> u64 {
        self.0.lock().drops
    }

    /// Keeps `tree` for `plan`, made when drops stood at `since`, unless an object was
    /// dropped since.
    pub(crate) fn keep(&self, plan: u64, tree: Arc<locus_storelet::Tree>, since: u64) {
        let mut trees = self.0.lock();
        if trees.drops != since || tree.held_bytes() > TREE_BYTES_KEPT {
            return;
        }
        trees.kept.retain(|(p, _)| *p != plan);
        trees.kept.push_back((plan, tree));
        let mut held: usize = trees.kept.iter().map(|(_, t)| t.held_bytes()).sum();
        while trees.kept.len() > TREES_KEPT || held > TREE_BYTES_KEPT {
            held -= trees.kept.pop_front().map_or(0, |(_, t)| t.held_bytes());
        }
    }

    /// An object was dropped here: every kept tree is forgotten.
    pub(crate) fn dropped(&self) {
        let mut trees = self.0.lock();
        trees.drops += 1;
        trees.kept.clear();
    }

    /// A version was found damaged here (and moved aside): every kept tree is
    /// forgotten, and none naming it is kept from now on.
    pub(crate) fn damaged(&self, object: u64, version: u64) {
        self.dropped();
        self.0.lock().damaged.insert((object, version));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_touches_plans_at_beneath_and_above_it_only() {
        assert!(touches("/a/b/c", "/a/b"));
        assert!(touches("/a/b", "/a/b"));
        assert!(touches("/a", "/a/b"));
        assert!(touches("/", "/a/b"));
        assert!(touches("/x", "/"));
        assert!(!touches("/a/bc", "/a/b"));
        assert!(!touches("/a/c", "/a/b"));
    }

    fn plan(plans: &KeptPlans, who: &str, dir: &str, since: u64) -> Arc<KeptPlan> {
        Arc::new(KeptPlan::of(plans, who, dir, since, [(1, [("a", 5, 1), ("b/c", 6, 1)])]))
    }

    #[test]
    fn a_plan_made_across_a_change_to_its_directory_is_not_kept() {
        let plans = KeptPlans::default();
        let since = plans.now();
        plans.changed("/elsewhere/f");
        plans.keep(plan(&plans, "u", "/d", since));
        assert!(plans.get("u", "/d").is_some(), "a change elsewhere does not matter");
        let kept = plans.get("u", "/d").unwrap();
        assert_eq!(kept.holder("b/c", 6, 1), Some(1));
        assert_eq!(kept.holder("b/c", 6, 2), None, "another version");
        assert_eq!(kept.holder("b", 6, 1), None);
        assert!(kept.is_exactly([("b/c", 6, 1), ("a", 5, 1)].into_iter()));
        assert!(!kept.is_exactly([("b/c", 6, 1)].into_iter()), "a file gone");
        assert!(!kept.is_exactly([("b/c", 6, 1), ("a", 5, 2)].into_iter()), "a file written again");
        let since = plans.now();
        plans.changed("/d/f");
        plans.keep(plan(&plans, "u", "/d2", since));
        plans.keep(plan(&plans, "u", "/d", since));
        assert!(plans.get("u", "/d2").is_some());
        plans.changed("/d/g");
        assert!(plans.get("u", "/d").is_none(), "forgotten on a change beneath it");
        let since = plans.now();
        plans.changed("/d/h");
        plans.keep(plan(&plans, "u", "/d", since));
        assert!(plans.get("u", "/d").is_none(), "made across a change beneath it");
        let since = plans.now();
        for i in 0..=CHANGES_REMEMBERED {
            plans.changed(&format!("/other/{i}"));
        }
        plans.keep(plan(&plans, "u", "/d", since));
        assert!(plans.get("u", "/d").is_none(), "too many changes to tell");
    }

    #[test]
    fn one_subject_keeps_a_few_plans_and_leaves_the_others_theirs() {
        let plans = KeptPlans::default();
        plans.keep(plan(&plans, "v", "/v", plans.now()));
        for i in 0..PLANS_KEPT {
            plans.keep(plan(&plans, "u", &format!("/d{i}"), plans.now()));
        }
        assert!(plans.get("v", "/v").is_some(), "another subject's plan stays");
        let kept = (0..PLANS_KEPT).filter(|i| plans.get("u", &format!("/d{i}")).is_some()).count();
        assert_eq!(kept, PLANS_KEPT_PER_SUBJECT);
        assert!(plans.get("u", &format!("/d{}", PLANS_KEPT - 1)).is_some(), "the newest stay");
    }

    #[test]
    fn a_node_forgets_its_trees_when_an_object_goes() {
        let trees = KeptTrees::default();
        let since = trees.now();
        trees.keep(7, Arc::new(locus_storelet::Tree::new()), since);
        assert!(trees.get(7).is_some());
        trees.dropped();
        assert!(trees.get(7).is_none());
        trees.keep(8, Arc::new(locus_storelet::Tree::new()), since);
        assert!(trees.get(8).is_none(), "made before a drop: not kept");
        assert!(trees.may_keep([(1, 1), (2, 1)].into_iter()));
        trees.damaged(2, 1);
        assert!(!trees.may_keep([(1, 1), (2, 1)].into_iter()), "names a damaged version");
        assert!(trees.may_keep([(1, 1)].into_iter()));
    }

    #[test]
    fn a_node_keeps_the_trees_it_used_last() {
        let trees = KeptTrees::default();
        for plan in 1..=TREES_KEPT as u64 {
            trees.keep(plan, Arc::new(locus_storelet::Tree::new()), trees.now());
        }
        assert!(trees.get(1).is_some(), "used: now the most recent");
        trees.keep(1000, Arc::new(locus_storelet::Tree::new()), trees.now());
        assert!(trees.get(1).is_some() && trees.get(2).is_none(), "the least recently used went");
    }
}
