//! The cluster's own records beside the names: its data nodes and their free space,
//! settings (such as the sealed cluster key), and the versions waiting to be collected.

use crate::sql::Val;
use crate::COLUMNS;
use crate::{
    entry_of, get, next_id, nodes_text, Content, Damaged, Entry, Garbage, Kind, Meta, MetaError, Node, Result,
};

/// Seconds since the epoch.
fn now_s() -> i64 {
    crate::now_ns() / 1_000_000_000
}

/// A `LIKE` pattern that matches a `nodes` list (`1,5,7`, wrapped in commas) naming `node`.
fn naming(node: u64) -> Val {
    Val::Text(format!("%,{node},%"))
}

impl Meta {
    /// Records a data node (keeping its id if its address is known), its free space and
    /// the time: a join is the node's heartbeat.
    pub fn join_node(&self, addr: &str, http: Option<&str>, free: u64) -> Result<u64> {
        self.tx(|tx| {
            let http = Val::Text(http.unwrap_or("").into());
            let known = tx.query("SELECT id FROM nodes WHERE addr = $1", &[Val::Text(addr.into())])?;
            if let Some(id) = known.first().and_then(|r| r[0].int()) {
                tx.exec(
                    "UPDATE nodes SET http = $2, free = $3, seen = $4 WHERE id = $1",
                    &[Val::Int(id), http, Val::Int(free as i64), Val::Int(now_s())],
                )?;
                return Ok(id as u64);
            }
            let id = next_id(tx)?;
            tx.exec(
                "INSERT INTO nodes (id, addr, http, free, seen, draining) VALUES ($1, $2, $3, $4, $5, 0)",
                &[Val::Int(id as i64), Val::Text(addr.into()), http, Val::Int(free as i64), Val::Int(now_s())],
            )?;
            Ok(id)
        })
    }

    /// Records that the head reached at `addr` is serving now, and answers the heads
    /// heard from within `within_s` seconds (itself included); rows silent for a day go.
    pub fn head_alive(&self, addr: &str, within_s: u64) -> Result<Vec<String>> {
        self.tx(|tx| {
            let now = now_s();
            tx.exec(
                "INSERT INTO heads (addr, seen) VALUES ($1, $2) ON CONFLICT (addr) DO UPDATE SET seen = excluded.seen",
                &[Val::Text(addr.into()), Val::Int(now)],
            )?;
            tx.exec("DELETE FROM heads WHERE seen < $1", &[Val::Int(now - 24 * 3600)])?;
            let rows =
                tx.query("SELECT addr FROM heads WHERE seen >= $1 ORDER BY addr", &[Val::Int(now - within_s as i64)])?;
            Ok(rows.iter().filter_map(|r| r[0].text().map(str::to_string)).collect())
        })
    }

    /// Claims a number below `limit` that no other head process of the namespace holds,
    /// for this one's client ids: a free one at random, else (every number taken) the
    /// one heard from longest ago.
    pub fn claim_head_number(&self, limit: u64) -> Result<u64> {
        self.tx(|tx| {
            let now = Val::Int(now_s());
            for _ in 0..64 {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b).expect("the OS provides randomness");
                let number = u64::from_le_bytes(b) % limit.max(1);
                let args = [Val::Int(number as i64), now.clone()];
                if tx.exec(
                    "INSERT INTO head_numbers (number, seen) VALUES ($1, $2) ON CONFLICT (number) DO NOTHING",
                    &args,
                )? == 1
                {
                    return Ok(number);
                }
            }
            let oldest = tx.query("SELECT number FROM head_numbers ORDER BY seen LIMIT 1", &[])?;
            let number = oldest.first().and_then(|r| r[0].int()).unwrap_or(0);
            tx.exec("UPDATE head_numbers SET seen = $1 WHERE number = $2", &[now, Val::Int(number)])?;
            Ok(number as u64)
        })
    }

    /// Records that the head holding `number` is serving now, and answers the numbers of
    /// the heads heard from within `within_s` seconds (its own included).
    pub fn head_numbers_alive(&self, number: u64, within_s: u64) -> Result<Vec<u64>> {
        self.tx(|tx| {
            let now = now_s();
            tx.exec("UPDATE head_numbers SET seen = $1 WHERE number = $2", &[Val::Int(now), Val::Int(number as i64)])?;
            let rows =
                tx.query("SELECT number FROM head_numbers WHERE seen >= $1", &[Val::Int(now - within_s as i64)])?;
            Ok(rows.iter().filter_map(|r| r[0].int()).map(|n| n as u64).collect())
        })
    }

    /// Records what a data node's heartbeat reports of its work: its I/O totals, and the
    /// versions it served most with their load (`IoCounters::load`) since it started, in
    /// place of what it reported before; one transaction.
    pub fn record_node_accounts(
        &self,
        node: u64,
        io: &locus_proto::types::IoCounters,
        busiest: &[(u64, u64, u64)],
    ) -> Result<()> {
        let n = Val::count;
        self.tx(|tx| {
            tx.exec(
                "INSERT INTO node_io (node, reads, read_bytes, read_ns, writes, write_bytes, write_ns) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (node) DO UPDATE SET reads = excluded.reads, \
                 read_bytes = excluded.read_bytes, read_ns = excluded.read_ns, writes = excluded.writes, \
                 write_bytes = excluded.write_bytes, write_ns = excluded.write_ns",
                &[
                    n(node),
                    n(io.reads),
                    n(io.read_bytes),
                    n(io.read_ns),
                    n(io.writes),
                    n(io.write_bytes),
                    n(io.write_ns),
                ],
            )?;
            tx.exec("DELETE FROM version_load WHERE node = $1", &[n(node)])?;
            for &(object, version, load) in busiest {
                tx.exec(
                    "INSERT INTO version_load (node, object, version, load) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (node, object, version) DO UPDATE SET load = excluded.load",
                    &[n(node), n(object), n(version), n(load)],
                )?;
            }
            Ok(())
        })
    }

    /// The load of each version the data nodes reported, summed over the nodes that
    /// served it: `(object, version, load)`.
    pub fn version_loads(&self) -> Result<Vec<(u64, u64, u64)>> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT object, version, CAST(sum(load) AS BIGINT) FROM version_load GROUP BY object, version",
                &[],
            )?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let v = |i: usize| r.get(i).and_then(Val::uint);
                    Some((v(0)?, v(1)?, v(2)?))
                })
                .collect())
        })
    }

    /// Every data node's I/O totals as it last reported them, by node id.
    pub fn node_io(&self) -> Result<Vec<(u64, locus_proto::types::IoCounters)>> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT node, reads, read_bytes, read_ns, writes, write_bytes, write_ns FROM node_io ORDER BY node",
                &[],
            )?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let v = |i: usize| r.get(i).and_then(Val::uint);
                    Some((
                        v(0)?,
                        locus_proto::types::IoCounters {
                            reads: v(1)?,
                            read_bytes: v(2)?,
                            read_ns: v(3)?,
                            writes: v(4)?,
                            write_bytes: v(5)?,
                            write_ns: v(6)?,
                            ..Default::default()
                        },
                    ))
                })
                .collect())
        })
    }

    /// Every data node that has joined.
    pub fn nodes(&self) -> Result<Vec<Node>> {
        self.tx(|tx| {
            let rows = tx.query("SELECT id, addr, http, free, seen, draining FROM nodes ORDER BY id", &[])?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some(Node {
                        id: r[0].int()? as u64,
                        addr: r[1].text()?.to_string(),
                        http: r[2].text().filter(|h| !h.is_empty()).map(str::to_string),
                        free: r[3].int()? as u64,
                        seen: r[4].int()?.max(0) as u64,
                        draining: r[5].int()? != 0,
                    })
                })
                .collect())
        })
    }

    /// Starts (or, with `false`, stops) draining a node.
    pub fn set_draining(&self, node: u64, draining: bool) -> Result<()> {
        self.tx(|tx| {
            match tx.exec(
                "UPDATE nodes SET draining = $2 WHERE id = $1",
                &[Val::Int(node as i64), Val::Int(draining as i64)],
            )? {
                0 => Err(MetaError::NotFound(format!("data node {node}"))),
                _ => Ok(()),
            }
        })
    }

    /// Forgets a node, unless a file's current version is still on it.
    pub fn remove_node(&self, node: u64) -> Result<()> {
        self.tx(|tx| {
            let held = count_on(tx, node)?;
            if held > 0 {
                return Err(MetaError::Busy(format!(
                    "data node {node} is still listed for {held} current version(s): drain it (`locus node \
                     drain`), or, if it died, let healing copy them, until `locus node list` shows 0"
                )));
            }
            tx.exec("DELETE FROM node_io WHERE node = $1", &[Val::Int(node as i64)])?;
            tx.exec("DELETE FROM version_load WHERE node = $1", &[Val::Int(node as i64)])?;
            match tx.exec("DELETE FROM nodes WHERE id = $1", &[Val::Int(node as i64)])? {
                0 => Err(MetaError::NotFound(format!("data node {node}"))),
                _ => Ok(()),
            }
        })
    }

    /// How many files' current versions are on `node`.
    pub fn versions_on(&self, node: u64) -> Result<u64> {
        self.tx(|tx| count_on(tx, node))
    }

    /// Up to `limit` files whose current version is on `node`, in path order.
    pub fn files_on(&self, node: u64, limit: u64) -> Result<Vec<Entry>> {
        self.tx(|tx| {
            let rows = tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM entries WHERE kind = $1 AND inline IS NULL \
                     AND (',' || nodes || ',') LIKE $2 ORDER BY path LIMIT $3"
                ),
                &[Val::Int(Kind::File as i64), naming(node), Val::Int(limit as i64)],
            )?;
            rows.iter().map(|r| entry_of(r)).collect()
        })
    }

    /// The file whose current version is `(object, version)`, if any.
    pub fn file_of(&self, object: u64, version: u64) -> Result<Option<Entry>> {
        self.tx(|tx| {
            let rows = tx.query(
                &format!("SELECT {COLUMNS} FROM entries WHERE object = $1 AND version = $2"),
                &[Val::Int(object as i64), Val::Int(version as i64)],
            )?;
            rows.first().map(|r| entry_of(r)).transpose()
        })
    }

    /// Changes which nodes hold the file at `path`, adding `add` and taking out `drop`,
    /// if its current version is still `(object, version)`; answers whether it was.
    pub fn move_replica(
        &self,
        path: &str,
        object: u64,
        version: u64,
        drop: Option<u64>,
        add: Option<u64>,
    ) -> Result<bool> {
        self.tx(|tx| {
            let Some(e) = get(tx, path)? else { return Ok(false) };
            let Content::Nodes(mut nodes) = e.content else { return Ok(false) };
            if e.object != object || e.version != version {
                return Ok(false);
            }
            nodes.retain(|n| Some(*n) != drop);
            if let Some(add) = add.filter(|a| !nodes.contains(a)) {
                nodes.push(add);
            }
            // Every name of the file (hard links) holds the same version.
            tx.exec(
                "UPDATE entries SET nodes = $3 WHERE object = $1 AND version = $2",
                &[Val::Int(object as i64), Val::Int(version as i64), Val::Text(nodes_text(&nodes))],
            )?;
            Ok(true)
        })
    }

    /// Records that `node` found its copies of `versions` damaged.
    pub fn add_damaged(&self, node: u64, versions: &[(u64, u64)]) -> Result<()> {
        if versions.is_empty() {
            return Ok(());
        }
        self.tx(|tx| {
            for &(object, version) in versions {
                tx.exec(
                    "INSERT INTO damaged (object, version, node) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[Val::Int(object as i64), Val::Int(version as i64), Val::Int(node as i64)],
                )?;
            }
            Ok(())
        })
    }

    /// Up to `limit` damaged copies waiting to be replaced.
    pub fn damaged(&self, limit: u64) -> Result<Vec<Damaged>> {
        self.tx(|tx| {
            let rows = tx.query("SELECT object, version, node FROM damaged LIMIT $1", &[Val::Int(limit as i64)])?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some(Damaged { object: r[0].int()? as u64, version: r[1].int()? as u64, node: r[2].int()? as u64 })
                })
                .collect())
        })
    }

    /// Forgets a damaged copy that was replaced (or whose version is gone).
    pub fn forget_damaged(&self, d: &Damaged) -> Result<()> {
        self.tx(|tx| {
            tx.exec(
                "DELETE FROM damaged WHERE object = $1 AND version = $2 AND node = $3",
                &[Val::Int(d.object as i64), Val::Int(d.version as i64), Val::Int(d.node as i64)],
            )
            .map(drop)
        })
    }

    /// The last result kept for active-file invocation `key` (see [`ActiveResult`]).
    pub fn active_result(&self, key: &str) -> Result<Option<ActiveResult>> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT stamp, error, size, mtime, object, version, nodes, inline FROM active_results WHERE key = $1",
                &[Val::Text(key.into())],
            )?;
            let Some(r) = rows.first() else { return Ok(None) };
            let bad = || MetaError::Engine("malformed active result row".into());
            let int = |i: usize| r.get(i).and_then(Val::int).ok_or_else(bad);
            let content = match r.get(7) {
                Some(Val::Blob(Some(bytes))) => Content::Inline(bytes.clone()),
                _ => Content::Nodes(nodes_from(r.get(6).and_then(Val::text).unwrap_or(""))),
            };
            Ok(Some(ActiveResult {
                key: key.to_string(),
                stamp: r[0].text().ok_or_else(bad)?.to_string(),
                error: r[1].text().ok_or_else(bad)?.to_string(),
                size: int(2)? as u64,
                mtime_ns: int(3)?,
                object: int(4)? as u64,
                version: int(5)? as u64,
                content,
            }))
        })
    }

    /// Keeps `result` for its invocation, replacing the one before, in one transaction;
    /// beyond `keep` results in all, the least recently made go too. Answers what it
    /// replaced or dropped (their versions' bytes become garbage).
    pub fn put_active_result(&self, result: &ActiveResult, keep: u64) -> Result<Vec<ActiveResult>> {
        let (nodes, inline) = match &result.content {
            Content::Inline(bytes) => (String::new(), Some(bytes.clone())),
            Content::Nodes(n) => (nodes_text(n), None),
        };
        self.tx(|tx| {
            let mut gone = Vec::new();
            let old = tx.query(
                "SELECT key, object, version, nodes FROM active_results WHERE key = $1",
                &[Val::Text(result.key.clone())],
            )?;
            let over = tx.query(
                "SELECT key, object, version, nodes FROM active_results ORDER BY mtime LIMIT \
                 (SELECT CASE WHEN count(*) >= $1 THEN count(*) - $1 + 1 ELSE 0 END FROM active_results)",
                &[Val::Int(keep as i64)],
            )?;
            for r in old.iter().chain(over.iter()) {
                let key = r[0].text().unwrap_or_default().to_string();
                tx.exec("DELETE FROM active_results WHERE key = $1", &[Val::Text(key.clone())])?;
                let (object, version) = (r[1].int().unwrap_or(0) as u64, r[2].int().unwrap_or(0) as u64);
                let ids = nodes_from(r[3].text().unwrap_or(""));
                if version != result.version && !gone.iter().any(|g: &ActiveResult| g.key == key) {
                    let content = Content::Nodes(ids);
                    gone.push(ActiveResult { key, object, version, content, ..result.clone() });
                }
            }
            tx.exec(
                "INSERT INTO active_results (key, stamp, error, size, mtime, object, version, nodes, inline) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[
                    Val::Text(result.key.clone()),
                    Val::Text(result.stamp.clone()),
                    Val::Text(result.error.clone()),
                    Val::Int(result.size as i64),
                    Val::Int(result.mtime_ns),
                    Val::Int(result.object as i64),
                    Val::Int(result.version as i64),
                    Val::Text(nodes.clone()),
                    Val::Blob(inline.clone()),
                ],
            )?;
            Ok(gone)
        })
    }

    /// Commits what a writable storelet run did, in one transaction: each file in
    /// `files` becomes its path's current version (the directories above it made where
    /// missing), and each of `removed` goes (one already gone is passed over). Answers
    /// the versions replaced or removed, whose bytes become garbage.
    pub fn commit_run(&self, files: &[Entry], removed: &[String]) -> Result<Vec<Entry>> {
        self.tx(|tx| {
            let mut gone = Vec::new();
            for e in files {
                make_parents(tx, &e.path)?;
                gone.extend(crate::commit(tx, e)?);
            }
            for path in removed {
                let Some(e) = get(tx, path)? else { continue };
                if e.kind == Kind::Dir {
                    return Err(MetaError::IsDir(path.clone()));
                }
                tx.exec("DELETE FROM entries WHERE path = $1", &[Val::Text(path.clone())])?;
                crate::links::unlinked(tx, e.object)?;
                gone.push(e);
            }
            Ok(gone)
        })
    }

    /// Keeps a registered script's source, so that every head can run it by its id.
    /// At most `keep` are kept: past that, the oldest go.
    pub fn add_script(&self, id: &str, source: &str, keep: u64) -> Result<()> {
        self.tx(|tx| {
            let added = tx.exec(
                "INSERT INTO scripts (id, source, added) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
                &[Val::Text(id.into()), Val::Text(source.into()), Val::Int(crate::now_ns())],
            )?;
            if added > 0 {
                tx.exec(
                    "DELETE FROM scripts WHERE id IN (SELECT id FROM scripts ORDER BY added LIMIT \
                     (SELECT CASE WHEN count(*) > $1 THEN count(*) - $1 ELSE 0 END FROM scripts))",
                    &[Val::Int(keep as i64)],
                )?;
            }
            Ok(())
        })
    }

    /// The source of the script registered as `id`, if any head registered it.
    pub fn script(&self, id: &str) -> Result<Option<String>> {
        self.tx(|tx| {
            let rows = tx.query("SELECT source FROM scripts WHERE id = $1", &[Val::Text(id.into())])?;
            Ok(rows.first().and_then(|r| r[0].text().map(str::to_string)))
        })
    }

    /// A setting's value (the cluster's sealed keys live in one), if it has one.
    pub fn setting(&self, name: &str) -> Result<Option<String>> {
        self.tx(|tx| {
            let rows = tx.query("SELECT value FROM settings WHERE name = $1", &[Val::Text(name.into())])?;
            Ok(rows.first().and_then(|r| r[0].text()).map(str::to_string))
        })
    }

    /// Sets a setting to what `f` makes of its current value, in one transaction (so
    /// two heads that change it at once do not lose either change); answers the value.
    /// `f` answering the value it was given leaves the row as it is.
    pub fn update_setting(
        &self,
        name: &str,
        mut f: impl FnMut(Option<&str>) -> Result<String> + Send,
    ) -> Result<String> {
        self.tx(|tx| {
            let rows = tx.query("SELECT value FROM settings WHERE name = $1", &[Val::Text(name.into())])?;
            let old = rows.first().and_then(|r| r[0].text()).map(str::to_string);
            let new = f(old.as_deref())?;
            if old.as_deref() != Some(new.as_str()) {
                tx.exec("DELETE FROM settings WHERE name = $1", &[Val::Text(name.into())])?;
                tx.exec(
                    "INSERT INTO settings (name, value) VALUES ($1, $2)",
                    &[Val::Text(name.into()), Val::Text(new.clone())],
                )?;
            }
            Ok(new)
        })
    }

    /// Every setting, by name (what a dump of the table shows).
    pub fn settings(&self) -> Result<Vec<(String, String)>> {
        self.tx(|tx| {
            let rows = tx.query("SELECT name, value FROM settings ORDER BY name", &[])?;
            Ok(rows.iter().filter_map(|r| Some((r[0].text()?.to_string(), r[1].text()?.to_string()))).collect())
        })
    }

    /// Removes a setting.
    pub fn remove_setting(&self, name: &str) -> Result<()> {
        self.tx(|tx| tx.exec("DELETE FROM settings WHERE name = $1", &[Val::Text(name.into())]).map(drop))
    }

    /// Queues a version's bytes for removal once `after` (seconds since the epoch) has
    /// passed: by then no capability for it is valid.
    pub fn add_garbage(&self, entry: &Entry, after: u64) -> Result<()> {
        let Content::Nodes(nodes) = &entry.content else { return Ok(()) };
        if entry.kind != Kind::File || nodes.is_empty() {
            return Ok(());
        }
        self.add_garbage_on(entry.object, entry.version, nodes, after)
    }

    /// Queues the copies of a version on `nodes` (not every copy: one moved away, say)
    /// for removal once `after` has passed.
    pub fn add_garbage_on(&self, object: u64, version: u64, nodes: &[u64], after: u64) -> Result<()> {
        self.tx(|tx| {
            tx.exec(
                "INSERT INTO garbage (object, version, nodes, after) VALUES ($1, $2, $3, $4)",
                &[
                    Val::Int(object as i64),
                    Val::Int(version as i64),
                    Val::Text(nodes_text(nodes)),
                    Val::Int(after as i64),
                ],
            )
            .map(drop)
        })
    }

    /// Keeps the versions `(object, version)` waiting for removal until at least
    /// `until`, in one transaction: a head holds the versions its clients have open,
    /// whichever head collects them.
    pub fn hold_garbage(&self, versions: &[(u64, u64)], until: u64) -> Result<()> {
        if versions.is_empty() {
            return Ok(());
        }
        self.tx(|tx| {
            for &(object, version) in versions {
                tx.exec(
                    "UPDATE garbage SET after = $1 WHERE object = $2 AND version = $3 AND after < $1",
                    &[Val::Int(until as i64), Val::Int(object as i64), Val::Int(version as i64)],
                )?;
            }
            Ok(())
        })
    }

    /// Versions whose removal is due at `now`.
    pub fn due_garbage(&self, now: u64) -> Result<Vec<Garbage>> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT object, version, nodes FROM garbage WHERE after <= $1 LIMIT 1000",
                &[Val::Int(now as i64)],
            )?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some(Garbage {
                        object: r[0].int()? as u64,
                        version: r[1].int()? as u64,
                        nodes: nodes_from(r[2].text()?),
                    })
                })
                .collect())
        })
    }

    /// Forgets a version whose bytes are gone.
    pub fn forget_garbage(&self, g: &Garbage) -> Result<()> {
        self.tx(|tx| {
            tx.exec(
                "DELETE FROM garbage WHERE object = $1 AND version = $2 AND nodes = $3",
                &[Val::Int(g.object as i64), Val::Int(g.version as i64), Val::Text(nodes_text(&g.nodes))],
            )
            .map(drop)
        })
    }
}

fn count_on(tx: &mut dyn crate::sql::Tx, node: u64) -> Result<u64> {
    let rows = tx.query(
        "SELECT count(*) FROM entries WHERE kind = $1 AND inline IS NULL AND (',' || nodes || ',') LIKE $2",
        &[Val::Int(Kind::File as i64), naming(node)],
    )?;
    Ok(rows.first().and_then(|r| r[0].int()).unwrap_or(0).max(0) as u64)
}

/// The output of an active-file invocation run on a cluster (Lerna's active files at
/// cluster scale): kept as a version like a file's, under a key naming who asked, where,
/// which handler and which arguments, and reused while the inputs' versions (`stamp`)
/// are unchanged. A failed run keeps its error instead (`error` not empty, no content).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveResult {
    pub key: String,
    /// A digest of the input files' names and versions when the run started.
    pub stamp: String,
    /// The failed run's error (empty for an output).
    pub error: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub object: u64,
    pub version: u64,
    pub content: Content,
}

/// Makes the directories above `path` that are missing.
fn make_parents(tx: &mut dyn crate::sql::Tx, path: &str) -> Result<()> {
    let Some((parent, _)) = crate::split(path) else { return Ok(()) };
    match get(tx, parent)? {
        Some(p) if p.kind == Kind::Dir => Ok(()),
        Some(_) => Err(MetaError::NotDir(parent.into())),
        None => {
            make_parents(tx, parent)?;
            let id = next_id(tx)?;
            crate::insert(tx, &Entry::empty(parent.to_string(), Kind::Dir, 0o755, id))
        }
    }
}

/// The node ids `nodes_text` wrote.
pub(crate) fn nodes_from(text: &str) -> Vec<u64> {
    text.split(',').filter_map(|n| n.parse().ok()).collect()
}
