//! Rebalancing between data nodes by measured load (Lerna's rebalancing at cluster
//! scale): each node's heartbeat carries the versions it served most and their load
//! (`IoCounters::load`: bytes moved and a page's worth per operation); a version's load
//! is shared among the nodes that hold it now, and a plan moves the busiest versions of
//! the busiest node to the least busy one while that lowers the peak. Applying a move
//! copies the version node to node (as healing does), puts the new node in the file's
//! list and the old one's copy in the collector's hands once no capability can name it.
//! Names never change, and reads go on meanwhile.

use crate::cluster::meta_err;
use crate::cluster::Head;
use locus_cluster::{Content, Entry, Node};
use locus_proto::types::{Move, Rebalance};
use locus_proto::Error as WireError;
use std::collections::HashMap;

/// A planned move, with what applying it needs.
struct Planned {
    entry: Entry,
    from: u64,
    to: u64,
    load: u64,
}

/// A plan: its moves, each node's load before and after (in the order of `nodes`, the
/// live nodes that are not draining, by id).
struct Plan {
    moves: Vec<Planned>,
    before: Vec<u64>,
    after: Vec<u64>,
    nodes: Vec<Node>,
}

impl Head {
    /// Up to `max_moves` moves that even out the nodes' measured load.
    fn plan(&self, max_moves: u32) -> Result<Plan, WireError> {
        let nodes: Vec<Node> =
            self.meta.nodes().map_err(meta_err)?.into_iter().filter(|n| self.is_live(n) && !n.draining).collect();
        let index: HashMap<u64, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        let mut load = vec![0u64; nodes.len()];
        // Each reported version that is still a file's current one, with its holders.
        let mut versions: Vec<(Entry, u64, Vec<usize>)> = Vec::new();
        for (object, version, l) in self.meta.version_loads().map_err(meta_err)? {
            let Some(entry) = self.meta.file_of(object, version).map_err(meta_err)? else { continue };
            let Content::Nodes(ids) = &entry.content else { continue };
            let holders: Vec<usize> = ids.iter().filter_map(|id| index.get(id).copied()).collect();
            if holders.is_empty() || l == 0 {
                continue;
            }
            let share = l / holders.len() as u64;
            for &h in &holders {
                load[h] += share;
            }
            versions.push((entry, share, holders));
        }
        let before = load.clone();
        versions.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.path.cmp(&b.0.path)));
        let mut moves = Vec::new();
        let mut moved = std::collections::HashSet::new();
        while moves.len() < max_moves as usize && nodes.len() > 1 {
            let hot = (0..nodes.len()).max_by_key(|&i| (load[i], std::cmp::Reverse(i))).expect("nodes");
            let cold = (0..nodes.len()).min_by_key(|&i| (load[i], i)).expect("nodes");
            // The busiest version on the hot node, not on the cold one, that moved leaves
            // both below the hot node's load now (else it only shifts the peak).
            let pick = versions.iter().position(|(e, share, holders)| {
                holders.contains(&hot)
                    && !holders.contains(&cold)
                    && !moved.contains(&e.object)
                    && load[cold] + share < load[hot]
            });
            let Some(i) = pick else { break };
            let (entry, share, holders) = &mut versions[i];
            load[hot] -= *share;
            load[cold] += *share;
            moved.insert(entry.object);
            holders.retain(|h| *h != hot);
            holders.push(cold);
            moves.push(Planned { entry: entry.clone(), from: nodes[hot].id, to: nodes[cold].id, load: *share });
        }
        Ok(Plan { moves, before, after: load, nodes })
    }

    /// `rebalance_plan` on a head.
    pub(crate) fn rebalance_plan(&self, max_moves: u32) -> Result<Rebalance, WireError> {
        let plan = self.plan(max_moves)?;
        Ok(Rebalance {
            moves: plan.moves.iter().map(as_move).collect(),
            before: plan.before,
            after: plan.after,
            skipped: Vec::new(),
        })
    }

    /// `rebalance_apply` on a head: makes the plan's moves one after another; a file
    /// that changed meanwhile, or a copy that fails, is skipped and said why.
    pub(crate) async fn rebalance_apply(&self, max_moves: u32) -> Result<Rebalance, WireError> {
        let Plan { moves, before, after, nodes } = self.plan(max_moves)?;
        let mut done = Rebalance { before, after, ..Default::default() };
        for m in moves {
            let (Some(from), Some(to)) = (nodes.iter().find(|n| n.id == m.from), nodes.iter().find(|n| n.id == m.to))
            else {
                continue;
            };
            let e = &m.entry;
            if let Err(why) = self.fetch_to(to, e, std::slice::from_ref(&from.addr)).await {
                done.skipped.push((e.path.clone(), format!("copying to node {}: {why}", to.id)));
                continue;
            }
            let added = self.meta.move_replica(&e.path, e.object, e.version, None, Some(to.id)).map_err(meta_err)?;
            if !added {
                // The file has a new version (or went) meanwhile: the copy is not needed.
                let _ = self.meta.add_garbage_on(e.object, e.version, &[to.id], self.garbage_after());
                done.skipped.push((e.path.clone(), "it changed meanwhile".into()));
                continue;
            }
            self.meta.move_replica(&e.path, e.object, e.version, Some(from.id), None).map_err(meta_err)?;
            self.meta.add_garbage_on(e.object, e.version, &[from.id], self.garbage_after()).map_err(meta_err)?;
            tracing::info!(path = %e.path, from = from.id, to = to.id, load = m.load, "rebalanced");
            done.moves.push(as_move(&m));
        }
        self.forget_nodes();
        Ok(done)
    }
}

/// A move as the protocol says it: `from` and `to` are data node ids (as `locus node
/// list` shows them; an id past `u32::MAX` shows as that).
fn as_move(m: &Planned) -> Move {
    let id = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    Move { path: m.entry.path.clone(), from: id(m.from), to: id(m.to), load: m.load, size: m.entry.size }
}
