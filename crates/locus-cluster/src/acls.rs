//! Who may do what in the namespace: each directory's ACL (its own, or its nearest
//! ancestor's), as one server's store keeps them, in the `acls` table.

use crate::sql::{Tx, Val};
use crate::{get, split, Entry, Kind, Meta, MetaError, Result};
use locus_proto::types::{AclEntry, Rights};

impl Meta {
    /// The ACL that governs directory `dir`: its own, or its nearest ancestor's.
    pub fn acl(&self, dir: &str) -> Result<Vec<AclEntry>> {
        self.tx(|tx| acl(tx, dir))
    }

    /// The rights `subject` holds in directory `dir`.
    pub fn rights(&self, subject: &str, dir: &str) -> Result<Rights> {
        self.tx(|tx| rights(tx, subject, dir))
    }

    /// The rights `subject` holds in directory `dir` and the entry at `path`, read in
    /// one transaction (the check and the lookup of most operations).
    pub fn rights_and_get(&self, subject: &str, dir: &str, path: &str) -> Result<(Rights, Option<Entry>)> {
        self.tx(|tx| Ok((rights(tx, subject, dir)?, get(tx, path)?)))
    }

    /// Sets one subject's rights on directory `dir` (none removes them). A directory
    /// that had no ACL of its own starts from the one it inherited.
    pub fn acl_set(&self, dir: &str, subject: &str, rights: Rights) -> Result<()> {
        self.tx(|tx| {
            match get(tx, dir)? {
                None => return Err(MetaError::NotFound(dir.into())),
                Some(e) if e.kind != Kind::Dir => return Err(MetaError::NotDir(dir.into())),
                Some(_) => {}
            }
            let own = tx.query("SELECT subject FROM acls WHERE path = $1 LIMIT 1", &[Val::Text(dir.into())])?;
            if own.is_empty() {
                for e in acl(tx, dir)? {
                    tx.exec(
                        "INSERT INTO acls (path, subject, rights) VALUES ($1, $2, $3)",
                        &[Val::Text(dir.into()), Val::Text(e.subject), Val::Int(e.rights.0 as i64)],
                    )?;
                }
            }
            tx.exec(
                "DELETE FROM acls WHERE path = $1 AND subject = $2",
                &[Val::Text(dir.into()), Val::Text(subject.into())],
            )?;
            if rights.0 != 0 {
                tx.exec(
                    "INSERT INTO acls (path, subject, rights) VALUES ($1, $2, $3)",
                    &[Val::Text(dir.into()), Val::Text(subject.into()), Val::Int(rights.0 as i64)],
                )?;
            }
            Ok(())
        })
    }
}

pub(crate) fn rights(tx: &mut dyn Tx, subject: &str, dir: &str) -> Result<Rights> {
    let entries = acl(tx, dir)?;
    Ok(entries.iter().filter(|e| e.admits(subject)).fold(Rights(0), |r, e| r.union(e.rights)))
}

fn acl(tx: &mut dyn Tx, dir: &str) -> Result<Vec<AclEntry>> {
    let mut at = dir.to_string();
    loop {
        let rows =
            tx.query("SELECT subject, rights FROM acls WHERE path = $1 ORDER BY subject", &[Val::Text(at.clone())])?;
        if !rows.is_empty() {
            return Ok(rows
                .iter()
                .filter_map(|r| Some(AclEntry { subject: r[0].text()?.to_string(), rights: Rights(r[1].int()? as u8) }))
                .collect());
        }
        match split(&at) {
            Some((parent, _)) => at = parent.to_string(),
            None => return Ok(Vec::new()),
        }
    }
}
