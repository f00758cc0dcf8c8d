//! The cluster's own records beside the names: its data nodes and their free space,
//! settings (such as the sealed cluster key), and the versions waiting to be collected.

use crate::sql::Val;
use crate::{next_id, nodes_text, Content, Entry, Garbage, Kind, Meta, Node, Result};

impl Meta {
    /// Records a data node (keeping its id if its address is known) and its free space.
    pub fn join_node(&self, addr: &str, http: Option<&str>, free: u64) -> Result<u64> {
        self.tx(|tx| {
            let http = Val::Text(http.unwrap_or("").into());
            let known = tx.query("SELECT id FROM nodes WHERE addr = $1", &[Val::Text(addr.into())])?;
            if let Some(id) = known.first().and_then(|r| r[0].int()) {
                tx.exec(
                    "UPDATE nodes SET http = $2, free = $3 WHERE id = $1",
                    &[Val::Int(id), http, Val::Int(free as i64)],
                )?;
                return Ok(id as u64);
            }
            let id = next_id(tx)?;
            tx.exec(
                "INSERT INTO nodes (id, addr, http, free) VALUES ($1, $2, $3, $4)",
                &[Val::Int(id as i64), Val::Text(addr.into()), http, Val::Int(free as i64)],
            )?;
            Ok(id)
        })
    }

    /// Every data node that has joined.
    pub fn nodes(&self) -> Result<Vec<Node>> {
        self.tx(|tx| {
            let rows = tx.query("SELECT id, addr, http, free FROM nodes ORDER BY id", &[])?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some(Node {
                        id: r[0].int()? as u64,
                        addr: r[1].text()?.to_string(),
                        http: r[2].text().filter(|h| !h.is_empty()).map(str::to_string),
                        free: r[3].int()? as u64,
                    })
                })
                .collect())
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
        self.tx(|tx| {
            tx.exec(
                "INSERT INTO garbage (object, version, nodes, after) VALUES ($1, $2, $3, $4)",
                &[
                    Val::Int(entry.object as i64),
                    Val::Int(entry.version as i64),
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
                        nodes: r[2].text()?.split(',').filter_map(|n| n.parse().ok()).collect(),
                    })
                })
                .collect())
        })
    }

    /// Forgets a version whose bytes are gone.
    pub fn forget_garbage(&self, g: &Garbage) -> Result<()> {
        self.tx(|tx| {
            tx.exec(
                "DELETE FROM garbage WHERE object = $1 AND version = $2",
                &[Val::Int(g.object as i64), Val::Int(g.version as i64)],
            )
            .map(drop)
        })
    }
}
