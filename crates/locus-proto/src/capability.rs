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

fn mac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        m.update(&(part.len() as u32).to_le_bytes());
        m.update(part);
    }
    m.finalize().into_bytes().to_vec()
}

fn capability_mac(key: &[u8], c: &Capability) -> Vec<u8> {
    mac(
        key,
        &[
            b"locus capability",
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
    let mut c = Capability { subject: subject.to_string(), object, version, size, expires, mac: Vec::new() };
    c.mac = capability_mac(key, &c);
    c
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
    if !crate::auth::proofs_equal(&capability_mac(key, c), &c.mac) {
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
    fn node_tokens_differ_by_subject_and_key() {
        assert_ne!(node_token(b"k", "alice"), node_token(b"k", "bob"));
        assert_ne!(node_token(b"k", "alice"), node_token(b"j", "alice"));
        assert_eq!(node_token(b"k", "alice").len(), 64);
    }
}
