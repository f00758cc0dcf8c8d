//! What scripts keep between calls on a cluster, in the namespace so that every head sees
//! the same: named values (`script_values`, by scope and key, each value an encoded blob)
//! and named locks (`script_locks`, each with its owner and the time it lapses, so that
//! a lock whose head died is free again once its call could no longer be running).
//! Scripts' messages to a client of another head wait in `script_messages` until that
//! head takes them.

use crate::sql::Val;
use crate::{now_ns, Meta, Result};

/// What the scope of a file's values starts with (the object id follows).
const OBJECT_SCOPE: &str = "o:";

/// The scope of the values attached to the file whose object is `object`.
pub fn object_scope(object: u64) -> String {
    format!("{OBJECT_SCOPE}{object}")
}

/// How many keys a scope may hold, and, for a file's first key, how many files may have
/// values.
pub struct ValueLimits {
    pub keys: u64,
    pub files: Option<u64>,
}

impl Meta {
    /// The value of `key` in `scope`, if set.
    pub fn script_value(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT value FROM script_values WHERE scope = $1 AND key = $2",
                &[Val::Text(scope.into()), Val::Text(key.into())],
            )?;
            Ok(rows.into_iter().next().and_then(|mut r| match r.swap_remove(0) {
                Val::Blob(b) => b,
                _ => None,
            }))
        })
    }

    /// Applies `change` to the value of `key` in `scope` in one transaction (a
    /// conflicting one runs it again): it sees the value and may replace or remove it.
    /// Its refusal (`Err`), or a new key past `limits`, changes nothing and is answered
    /// as the inner `Err`.
    pub fn update_script_value<R: Send>(
        &self,
        scope: &str,
        key: &str,
        limits: &ValueLimits,
        mut change: impl FnMut(&mut Option<Vec<u8>>) -> std::result::Result<R, String> + Send,
    ) -> Result<std::result::Result<R, String>> {
        self.tx(|tx| {
            let args = [Val::Text(scope.into()), Val::Text(key.into())];
            let rows = tx.query("SELECT value FROM script_values WHERE scope = $1 AND key = $2", &args)?;
            let old = rows.into_iter().next().and_then(|mut r| match r.swap_remove(0) {
                Val::Blob(b) => b,
                _ => None,
            });
            let was_set = old.is_some();
            let mut slot = old;
            let answer = match change(&mut slot) {
                Ok(a) => a,
                Err(refused) => return Ok(Err(refused)),
            };
            match slot {
                None if was_set => drop(tx.exec("DELETE FROM script_values WHERE scope = $1 AND key = $2", &args)?),
                None => {}
                Some(value) => {
                    if !was_set {
                        let count = |tx: &mut dyn crate::sql::Tx, sql: &str, arg: &str| -> Result<u64> {
                            let rows = tx.query(sql, &[Val::Text(arg.into())])?;
                            Ok(rows.first().and_then(|r| r[0].int()).unwrap_or(0) as u64)
                        };
                        let keys = count(tx, "SELECT count(*) FROM script_values WHERE scope = $1", scope)?;
                        if keys >= limits.keys {
                            return Ok(Err(format!("state is limited to {} keys", limits.keys)));
                        }
                        if let (0, Some(max), true) = (keys, limits.files, scope.starts_with(OBJECT_SCOPE)) {
                            let sql = "SELECT count(DISTINCT scope) FROM script_values WHERE scope LIKE $1";
                            if count(tx, sql, &format!("{OBJECT_SCOPE}%"))? >= max {
                                return Ok(Err(format!("state is attached to at most {max} files")));
                            }
                        }
                    }
                    tx.exec(
                        "INSERT INTO script_values (scope, key, value) VALUES ($1, $2, $3) \
                         ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value",
                        &[args[0].clone(), args[1].clone(), Val::Blob(Some(value))],
                    )?;
                }
            }
            Ok(Ok(answer))
        })
    }

    /// True if some file has values attached.
    pub fn any_file_values(&self) -> Result<bool> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT 1 FROM script_values WHERE scope LIKE $1 LIMIT 1",
                &[Val::Text(format!("{OBJECT_SCOPE}%"))],
            )?;
            Ok(!rows.is_empty())
        })
    }

    /// Drops the values of files whose object no entry names any more; answers how
    /// many went.
    pub fn sweep_script_values(&self) -> Result<u64> {
        self.tx(|tx| {
            tx.exec(
                "DELETE FROM script_values WHERE scope LIKE $1 AND NOT EXISTS \
                 (SELECT 1 FROM entries WHERE $2 || entries.object = script_values.scope)",
                &[Val::Text(format!("{OBJECT_SCOPE}%")), Val::Text(OBJECT_SCOPE.into())],
            )
        })
    }

    /// Drops every value of `scope`.
    pub fn forget_script_values(&self, scope: &str) -> Result<()> {
        self.tx(|tx| tx.exec("DELETE FROM script_values WHERE scope = $1", &[Val::Text(scope.into())]).map(drop))
    }

    /// Takes lock `name` for `owner` until `expires_ns` (wall clock) if it is free, has
    /// lapsed, or is `owner`'s already (whose lapse is then moved to `expires_ns`);
    /// true if `owner` holds it now.
    pub fn try_script_lock(&self, name: &str, owner: &str, expires_ns: i64) -> Result<bool> {
        self.tx(|tx| {
            let name = Val::Text(name.into());
            tx.exec("DELETE FROM script_locks WHERE name = $1 AND expires < $2", &[name.clone(), Val::Int(now_ns())])?;
            let taken = tx.exec(
                "INSERT INTO script_locks (name, owner, expires) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
                &[name.clone(), Val::Text(owner.into()), Val::Int(expires_ns)],
            )?;
            if taken == 1 {
                return Ok(true);
            }
            let renewed = tx.exec(
                "UPDATE script_locks SET expires = $3 WHERE name = $1 AND owner = $2",
                &[name, Val::Text(owner.into()), Val::Int(expires_ns)],
            )?;
            Ok(renewed == 1)
        })
    }

    /// Releases lock `name` if `owner` holds it; true if it did.
    pub fn release_script_lock(&self, name: &str, owner: &str) -> Result<bool> {
        self.tx(|tx| {
            tx.exec(
                "DELETE FROM script_locks WHERE name = $1 AND owner = $2",
                &[Val::Text(name.into()), Val::Text(owner.into())],
            )
            .map(|n| n == 1)
        })
    }

    /// True if a lock `name` is held and has not lapsed.
    pub fn script_lock_held(&self, name: &str) -> Result<bool> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT 1 FROM script_locks WHERE name = $1 AND expires >= $2",
                &[Val::Text(name.into()), Val::Int(now_ns())],
            )?;
            Ok(!rows.is_empty())
        })
    }
}

/// A script's message waiting for the head its recipient is connected to.
#[derive(Debug, PartialEq, Eq)]
pub struct Letter {
    pub recipient: u64,
    /// The client whose call sent it.
    pub sender: u64,
    pub data: Vec<u8>,
}

impl Meta {
    /// Leaves `letter` under `id` for the head its recipient is connected to, until
    /// `expires_ns` (wall clock).
    pub fn post_letter(&self, id: u64, letter: &Letter, expires_ns: i64) -> Result<()> {
        self.tx(|tx| {
            tx.exec(
                "INSERT INTO script_messages (id, recipient, sender, data, expires) VALUES ($1, $2, $3, $4, $5)",
                &[
                    Val::Int(id as i64),
                    Val::Int(letter.recipient as i64),
                    Val::Int(letter.sender as i64),
                    Val::Blob(Some(letter.data.clone())),
                    Val::Int(expires_ns),
                ],
            )
            .map(drop)
        })
    }

    /// Takes the letter left under `id` (once: a second take finds none).
    pub fn take_letter(&self, id: u64) -> Result<Option<Letter>> {
        self.tx(|tx| {
            let id = Val::Int(id as i64);
            let rows = tx.query("SELECT recipient, sender, data FROM script_messages WHERE id = $1", &[id.clone()])?;
            let Some(mut row) = rows.into_iter().next() else { return Ok(None) };
            if tx.exec("DELETE FROM script_messages WHERE id = $1", &[id])? == 0 {
                return Ok(None);
            }
            let data = match row.swap_remove(2) {
                Val::Blob(Some(b)) => b,
                _ => Vec::new(),
            };
            let number = |v: &Val| v.int().unwrap_or(0) as u64;
            Ok(Some(Letter { recipient: number(&row[0]), sender: number(&row[1]), data }))
        })
    }

    /// Drops letters no head took in time (their recipient's head died).
    pub fn sweep_letters(&self) -> Result<u64> {
        self.tx(|tx| tx.exec("DELETE FROM script_messages WHERE expires < $1", &[Val::Int(now_ns())]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> (tempfile::TempDir, Meta) {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::open(dir.path().join("ns.db").to_str().unwrap(), "admin").unwrap();
        (dir, meta)
    }

    #[test]
    fn values_change_in_place_and_keep_their_limits() {
        let (_d, meta) = meta();
        let limits = ValueLimits { keys: 2, files: Some(1) };
        let set = |v: &'static [u8]| {
            move |slot: &mut Option<Vec<u8>>| -> std::result::Result<(), String> {
                *slot = Some(v.to_vec());
                Ok(())
            }
        };
        meta.update_script_value("o:1", "a", &limits, set(b"1")).unwrap().unwrap();
        meta.update_script_value("o:1", "b", &limits, set(b"2")).unwrap().unwrap();
        let full = meta.update_script_value("o:1", "c", &limits, set(b"3")).unwrap().unwrap_err();
        assert!(full.contains("limited to 2"), "{full}");
        let other = meta.update_script_value("o:2", "a", &limits, set(b"1")).unwrap().unwrap_err();
        assert!(other.contains("at most 1 files"), "{other}");
        let refused = meta.update_script_value("o:1", "a", &limits, |_| Err::<(), _>("no".into())).unwrap();
        assert_eq!(refused, Err("no".to_string()));
        assert_eq!(meta.script_value("o:1", "a").unwrap(), Some(b"1".to_vec()), "a refusal changes nothing");
        meta.update_script_value("o:1", "a", &limits, |s| Ok(s.take())).unwrap().unwrap();
        assert_eq!(meta.script_value("o:1", "a").unwrap(), None);
        meta.forget_script_values("o:1").unwrap();
        meta.update_script_value("o:2", "a", &limits, set(b"1")).unwrap().unwrap();
        // Object 1 is the root directory's: its values stay; object 2 names no entry.
        meta.update_script_value("o:1", "a", &limits, set(b"1")).unwrap().unwrap_err();
        meta.forget_script_values("o:2").unwrap();
        meta.update_script_value("o:1", "a", &limits, set(b"1")).unwrap().unwrap();
        meta.update_script_value("o:7", "a", &ValueLimits { keys: 2, files: None }, set(b"1")).unwrap().unwrap();
        assert_eq!(meta.sweep_script_values().unwrap(), 1);
        assert_eq!(meta.script_value("o:1", "a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(meta.script_value("o:7", "a").unwrap(), None);
    }

    #[test]
    fn locks_have_one_owner_and_lapse() {
        let (_d, meta) = meta();
        let later = now_ns() + 60_000_000_000;
        assert!(meta.try_script_lock("l", "a", later).unwrap());
        assert!(meta.try_script_lock("l", "a", later).unwrap(), "its owner holds it again");
        assert!(!meta.try_script_lock("l", "b", later).unwrap());
        assert!(!meta.release_script_lock("l", "b").unwrap());
        assert!(meta.script_lock_held("l").unwrap());
        assert!(meta.release_script_lock("l", "a").unwrap());
        assert!(meta.try_script_lock("l", "b", now_ns() - 1).unwrap(), "free again");
        assert!(!meta.script_lock_held("l").unwrap(), "b's lease has lapsed");
        assert!(meta.try_script_lock("l", "a", later).unwrap(), "a lapsed lock is taken over");
    }

    #[test]
    fn a_letter_is_taken_once_and_one_left_too_long_is_swept() {
        let (_d, meta) = meta();
        let letter = Letter { recipient: 7 << 32 | 1, sender: 3, data: vec![0, 1, 255] };
        meta.post_letter(u64::MAX - 1, &letter, now_ns() + 60_000_000_000).unwrap();
        meta.post_letter(2, &Letter { data: vec![], ..letter }, now_ns() - 1).unwrap();
        assert_eq!(meta.take_letter(u64::MAX - 1).unwrap().as_ref().map(|l| &l.data), Some(&vec![0, 1, 255]));
        assert_eq!(meta.take_letter(u64::MAX - 1).unwrap(), None, "taken once");
        assert_eq!(meta.sweep_letters().unwrap(), 1, "the lapsed one");
        assert_eq!(meta.take_letter(2).unwrap(), None);
    }
}
