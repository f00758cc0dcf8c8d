//! A head's keys at rest: the wrap key in its state directory, and the cluster's ring
//! sealed under it in the namespace database (created by a namespace's first head,
//! rotated in one transaction).

use crate::cluster::keys::{unwrap, wrap, KEYS_SETTING, WRAP_FILE};
use locus_proto::capability::KeyRing;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where heads before sealing kept the key in clear (hex); moved on first start.
const LEGACY_SETTING: &str = "cluster_key";

/// Why a head cannot have its keys.
fn missing(path: &Path) -> String {
    format!(
        "the namespace's cluster key is sealed with a wrap key this head does not have: copy {WRAP_FILE} \
         from the state directory of a head that serves this namespace to {} (mode 0600), then start again",
        path.display()
    )
}

fn fresh_key() -> Vec<u8> {
    let mut k = vec![0u8; 32];
    getrandom::fill(&mut k).expect("the OS provides randomness");
    k
}

/// Reads the wrap key file (hex), if there is one.
fn read_wrap(path: &Path) -> Result<Option<Vec<u8>>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => hex::decode(text.trim())
            .ok()
            .filter(|k| k.len() == 32)
            .map(Some)
            .ok_or_else(|| format!("{}: not a wrap key (64 hex digits)", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Creates the wrap key file (mode 0600); answers the key.
fn create_wrap(path: &Path) -> Result<Vec<u8>, String> {
    let key = fresh_key();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{}", hex::encode(&key)).and_then(|()| f.sync_all()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(key)
}

/// A head's keys: the wrap key from its state directory and the cluster's ring from
/// the namespace, both created when this is the namespace's first head.
pub struct HeadKeys {
    /// The key that seals the ring in the database.
    pub wrap: Vec<u8>,
    /// Where the wrap key lives.
    pub path: PathBuf,
}

impl HeadKeys {
    /// Opens (or, for a namespace without keys, creates) the wrap key in `state_dir`
    /// and the ring in `meta`; a head that lacks the wrap key of a namespace that has
    /// keys fails, saying which file to copy.
    pub fn open(meta: &locus_cluster::Meta, state_dir: &Path) -> Result<(HeadKeys, KeyRing), String> {
        let path = state_dir.join(WRAP_FILE);
        let stored = meta.setting(KEYS_SETTING).map_err(|e| e.to_string())?;
        let wrap_key = match (read_wrap(&path)?, &stored) {
            (Some(k), _) => k,
            (None, None) => create_wrap(&path)?,
            (None, Some(_)) => return Err(missing(&path)),
        };
        let keys = HeadKeys { wrap: wrap_key, path };
        // A namespace from before sealing keeps its key in clear: it is sealed now.
        let legacy = meta.setting(LEGACY_SETTING).map_err(|e| e.to_string())?;
        let first = match legacy.as_deref().and_then(|h| hex::decode(h).ok()) {
            Some(old) => KeyRing::new(old),
            None => KeyRing::new(fresh_key()),
        };
        let text = meta
            .update_setting(KEYS_SETTING, |old| Ok(old.map_or_else(|| wrap(&keys.wrap, &first), str::to_string)))
            .map_err(|e| e.to_string())?;
        let ring = keys.ring_from(&text)?;
        if legacy.is_some() {
            meta.remove_setting(LEGACY_SETTING).map_err(|e| e.to_string())?;
        }
        Ok((keys, ring))
    }

    fn ring_from(&self, text: &str) -> Result<KeyRing, String> {
        unwrap(&self.wrap, text).ok_or_else(|| {
            format!(
                "{}: this wrap key does not open the namespace's cluster key (each head of a namespace needs \
                 the same {WRAP_FILE}: copy it from the head that made it)",
                self.path.display()
            )
        })
    }

    /// The ring as the namespace holds it now (another head may have rotated it).
    pub fn load(&self, meta: &locus_cluster::Meta) -> Result<KeyRing, String> {
        let text = meta.setting(KEYS_SETTING).map_err(|e| e.to_string())?.ok_or("the cluster key is gone")?;
        self.ring_from(&text)
    }

    /// Replaces the key with a new one in the namespace (one transaction); see
    /// [`KeyRing::rotate`]. Answers the new ring.
    pub fn rotate(&self, meta: &locus_cluster::Meta, grace: u64, lifetime: u64) -> Result<KeyRing, String> {
        let mut failure = None;
        let mut rotated = None;
        let result = meta.update_setting(KEYS_SETTING, |old| {
            let Some(old) = old else { return Err(locus_cluster::MetaError::Engine("the cluster key is gone".into())) };
            match self.ring_from(old) {
                Ok(ring) => {
                    let next = ring.rotate(fresh_key(), locus_proto::capability::now(), grace, lifetime);
                    let text = wrap(&self.wrap, &next);
                    rotated = Some(next);
                    Ok(text)
                }
                Err(e) => {
                    failure = Some(e);
                    Err(locus_cluster::MetaError::Invalid("the cluster key does not open".into()))
                }
            }
        });
        match (result, failure) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(e.to_string()),
            (Ok(_), None) => rotated.ok_or_else(|| "no rotation happened".into()),
        }
    }
}
