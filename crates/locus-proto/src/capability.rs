//! Capabilities for third-party reads in a cluster (the SPIRAL paper's `tp_read`).
//!
//! The head signs, with the cluster key it shares with its data nodes, a statement that
//! one subject may read one version of one object until a time. A data node checks it
//! with the same key and serves the bytes without asking the head. The same key derives
//! the token each subject authenticates with at a data node, so nodes keep no token file.

use crate::types::Capability;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The subject a head authenticates as at its data nodes (to store and drop objects).
pub const HEAD_SUBJECT: &str = "locus-head";

/// The subject data nodes authenticate as at their head: it may join (and so receive
/// the cluster's keys, sealed) and do nothing else there.
pub const NODE_SUBJECT: &str = "locus-node";

fn mac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        m.update(&(part.len() as u32).to_le_bytes());
        m.update(part);
    }
    m.finalize().into_bytes().to_vec()
}

/// What a capability lets its subject do with the version it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant<'a> {
    /// Read its bytes at a node (`object_read`).
    Read,
    /// Store exactly its size in bytes as a new version at one of these nodes (by id;
    /// `object_write`): no other node takes it.
    Write(&'a [u64]),
}

fn capability_mac(key: &[u8], c: &Capability, grant: Grant) -> Vec<u8> {
    let (label, nodes): (&[u8], Vec<u8>) = match grant {
        Grant::Read => (b"locus capability", Vec::new()),
        Grant::Write(nodes) => (b"locus write capability", nodes.iter().flat_map(|n| n.to_le_bytes()).collect()),
    };
    mac(
        key,
        &[
            label,
            &nodes,
            c.subject.as_bytes(),
            &c.object.to_le_bytes(),
            &c.version.to_le_bytes(),
            &c.size.to_le_bytes(),
            &c.expires.to_le_bytes(),
        ],
    )
}

/// Signs a capability: `subject` may read `version` of `object` (`size` bytes) until
/// `expires` (seconds since the epoch).
pub fn sign(key: &[u8], subject: &str, object: u64, version: u64, size: u64, expires: u64) -> Capability {
    sign_for(Grant::Read, key, subject, object, version, size, expires)
}

/// Signs a capability that grants `grant` on `version` of `object` (`size` bytes).
pub fn sign_for(
    grant: Grant,
    key: &[u8],
    subject: &str,
    object: u64,
    version: u64,
    size: u64,
    expires: u64,
) -> Capability {
    let mut c = Capability { subject: subject.to_string(), object, version, size, expires, mac: Vec::new() };
    c.mac = capability_mac(key, &c, grant);
    c
}

/// The head's seal over a third-party write it began (see
/// [`crate::types::WriteTarget::seal`]).
pub fn write_seal(key: &[u8], c: &Capability, path: &str, node_ids: &[u64]) -> Vec<u8> {
    mac(key, &[b"locus write commit", &capability_mac(key, c, Grant::Write(node_ids)), path.as_bytes()])
}

/// Why a capability is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not signed by the cluster key, or altered since.
    Forged,
    /// Past its expiry.
    Expired,
    /// Signed for another subject than the one presenting it.
    OtherSubject,
}

/// Checks a capability presented by `subject` at time `now` (seconds since the epoch).
pub fn verify(key: &[u8], c: &Capability, subject: &str, now: u64) -> Result<(), Refusal> {
    verify_for(Grant::Read, key, c, subject, now)
}

/// Checks that a capability grants `grant`, presented by `subject` at `now`.
pub fn verify_for(grant: Grant, key: &[u8], c: &Capability, subject: &str, now: u64) -> Result<(), Refusal> {
    if !crate::auth::proofs_equal(&capability_mac(key, c, grant), &c.mac) {
        return Err(Refusal::Forged);
    }
    if c.subject != subject {
        return Err(Refusal::OtherSubject);
    }
    if now > c.expires {
        return Err(Refusal::Expired);
    }
    Ok(())
}

/// The signature of a URL through which anyone holding it may read `path` as `subject`
/// until `expires` (seconds since the epoch): the head's HTTP endpoint checks it.
pub fn url_signature(key: &[u8], subject: &str, path: &str, expires: u64) -> String {
    hex::encode(mac(key, &[b"locus url", subject.as_bytes(), path.as_bytes(), &expires.to_le_bytes()]))
}

/// The token `subject` authenticates with at the data nodes of a cluster.
pub fn node_token(key: &[u8], subject: &str) -> String {
    hex::encode(mac(key, &[b"locus node token", subject.as_bytes()]))
}

/// The keys of a cluster: the current one, and the one it replaced, which nodes still
/// accept until `previous_until` so that capabilities signed before a rotation run out
/// their lifetime, and no longer.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyRing {
    /// Signs capabilities (after the grace that follows a rotation).
    pub current: Vec<u8>,
    /// The key before the last rotation.
    pub previous: Option<Vec<u8>>,
    /// Seconds since the epoch after which `previous` is refused everywhere.
    pub previous_until: u64,
    /// When the last rotation happened (seconds since the epoch).
    pub rotated_at: u64,
}

impl KeyRing {
    /// A ring holding one key.
    pub fn new(current: Vec<u8>) -> Self {
        KeyRing { current, ..Default::default() }
    }

    /// The keys a node accepts at `now`: the current one, and the previous one until
    /// its time is up.
    pub fn valid(&self, now: u64) -> Vec<&[u8]> {
        let mut keys = vec![&self.current[..]];
        if let Some(p) = self.previous.as_ref().filter(|_| now <= self.previous_until) {
            keys.push(p);
        }
        keys
    }

    /// The key a head signs with at `now`: the previous one during `grace` seconds after
    /// a rotation (while the nodes learn the new one), the current one after.
    pub fn signing(&self, now: u64, grace: u64) -> &[u8] {
        match &self.previous {
            Some(p) if now < self.rotated_at.saturating_add(grace) && now <= self.previous_until => p,
            _ => &self.current,
        }
    }

    /// The ring after replacing the key with `fresh` at `now`: the key signing until
    /// now stays valid for `grace` (while nodes learn the new key) plus `lifetime` (the
    /// longest a capability it signed lives), then is refused.
    pub fn rotate(&self, fresh: Vec<u8>, now: u64, grace: u64, lifetime: u64) -> KeyRing {
        KeyRing {
            previous: Some(self.signing(now, grace).to_vec()),
            current: fresh,
            previous_until: now.saturating_add(grace).saturating_add(lifetime),
            rotated_at: now,
        }
    }

    /// Checks a read capability against every key valid at `now`.
    pub fn verify(&self, c: &Capability, subject: &str, now: u64) -> Result<(), Refusal> {
        self.verify_for(Grant::Read, c, subject, now)
    }

    /// Checks a capability for `grant` against every key valid at `now`.
    pub fn verify_for(&self, grant: Grant, c: &Capability, subject: &str, now: u64) -> Result<(), Refusal> {
        let mut refusal = Refusal::Forged;
        for key in self.valid(now) {
            match verify_for(grant, key, c, subject, now) {
                Ok(()) => return Ok(()),
                Err(Refusal::Forged) => {}
                Err(other) => refusal = other,
            }
        }
        Err(refusal)
    }

    /// The tokens `subject` may authenticate with at the nodes at `now`.
    pub fn node_tokens(&self, subject: &str, now: u64) -> Vec<String> {
        self.valid(now).into_iter().map(|k| node_token(k, subject)).collect()
    }
}

/// Now, in seconds since the epoch: the clock capabilities and signed URLs expire by.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capability_is_bound_to_everything_it_names() {
        let key = b"cluster key";
        let c = sign(key, "alice", 7, 3, 100, 1000);
        assert_eq!(verify(key, &c, "alice", 999), Ok(()));
        assert_eq!(verify(key, &c, "alice", 1001), Err(Refusal::Expired));
        assert_eq!(verify(key, &c, "bob", 999), Err(Refusal::OtherSubject));
        assert_eq!(verify(b"other key", &c, "alice", 999), Err(Refusal::Forged));
        for change in [
            |c: &mut Capability| c.object = 8,
            |c: &mut Capability| c.version = 4,
            |c: &mut Capability| c.size = 101,
            |c: &mut Capability| c.expires = 5000,
            |c: &mut Capability| c.subject = "bob".into(),
        ] {
            let mut forged = c.clone();
            change(&mut forged);
            assert_eq!(verify(key, &forged, &forged.subject.clone(), 999), Err(Refusal::Forged));
        }
    }

    #[test]
    fn a_read_capability_does_not_write_and_a_write_capability_does_not_read() {
        let key = b"cluster key";
        let read = sign(key, "alice", 7, 3, 100, 1000);
        let write = sign_for(Grant::Write(&[1, 2]), key, "alice", 7, 3, 100, 1000);
        assert_eq!(verify_for(Grant::Write(&[1, 2]), key, &write, "alice", 999), Ok(()));
        assert_eq!(verify_for(Grant::Write(&[1, 3]), key, &write, "alice", 999), Err(Refusal::Forged));
        assert_eq!(verify_for(Grant::Write(&[1, 2]), key, &read, "alice", 999), Err(Refusal::Forged));
        assert_eq!(verify(key, &write, "alice", 999), Err(Refusal::Forged));
        // The head's seal names the path and the nodes too.
        let seal = write_seal(key, &write, "/a", &[1, 2]);
        assert_eq!(write_seal(key, &write, "/a", &[1, 2]), seal);
        assert_ne!(write_seal(key, &write, "/b", &[1, 2]), seal);
        assert_ne!(write_seal(key, &write, "/a", &[1]), seal);
        assert_ne!(write_seal(b"other", &write, "/a", &[1, 2]), seal);
    }

    #[test]
    fn a_rotated_key_is_accepted_only_until_its_time_is_up() {
        let ring = KeyRing::new(b"old".to_vec());
        let before = sign(b"old", "alice", 1, 1, 10, u64::MAX);
        let rotated = ring.rotate(b"new".to_vec(), 1000, 15, 60);
        assert_eq!(rotated.signing(1000, 15), b"old");
        assert_eq!(rotated.signing(1015, 15), b"new");
        assert_eq!(rotated.verify(&before, "alice", 1075), Ok(()));
        assert_eq!(rotated.verify(&before, "alice", 1076), Err(Refusal::Forged));
        let after = sign(b"new", "alice", 1, 1, 10, 2000);
        assert_eq!(rotated.verify(&after, "alice", 1001), Ok(()));
        assert_eq!(rotated.node_tokens("alice", 1001).len(), 2);
        assert_eq!(rotated.node_tokens("alice", 1076), [node_token(b"new", "alice")]);
    }

    #[test]
    fn node_tokens_differ_by_subject_and_key() {
        assert_ne!(node_token(b"k", "alice"), node_token(b"k", "bob"));
        assert_ne!(node_token(b"k", "alice"), node_token(b"j", "alice"));
        assert_eq!(node_token(b"k", "alice").len(), 64);
    }
}
