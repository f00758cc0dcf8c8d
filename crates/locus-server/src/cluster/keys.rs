//! The cluster's keys in transit and at rest.
//!
//! - **In transit:** a data node joins with a fresh nonce; the head answers with its
//!   own and the cluster's [`KeyRing`] sealed (ChaCha20-Poly1305) under a key derived by
//!   HMAC-SHA256 from the node's token (`locus-node` at the head) and both nonces. The
//!   token never crosses the wire (challenge-response), so neither do the keys.
//! - **At rest:** the namespace database holds the ring sealed under a wrap key that
//!   only heads hold, in the file [`WRAP_FILE`] of their state directory (created, mode
//!   0600, by the first head of a namespace; every other head needs a copy); the
//!   head's side of that is `head_keys`, built with the `cluster` feature.

use hmac::{Hmac, Mac};
use locus_proto::capability::KeyRing;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use sha2::Sha256;

/// The file in a head's state directory holding the key that wraps the cluster's keys
/// in the namespace database.
pub const WRAP_FILE: &str = "cluster-wrap.key";
/// The setting (in the namespace database) holding the sealed key ring, in hex.
pub const KEYS_SETTING: &str = "cluster_keys";
fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        m.update(&(part.len() as u32).to_le_bytes());
        m.update(part);
    }
    m.finalize().into_bytes().into()
}

fn aead(key: &[u8], label: &[u8]) -> LessSafeKey {
    let k = mac(key, &[b"locus seal", label]);
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &k).expect("a 32-byte key"))
}

/// Seals `plain` under `key` (any length; a subkey is derived per `label`), bound to
/// `aad`: a random nonce, then the ciphertext and its tag.
pub fn seal(key: &[u8], label: &[u8], aad: &[u8], plain: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).expect("the OS provides randomness");
    let mut buf = plain.to_vec();
    aead(key, label)
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut buf)
        .expect("sealing cannot fail for these sizes");
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    out
}

/// Opens what [`seal`] made with the same key, label and `aad`; `None` if anything
/// differs or the bytes were altered.
pub fn unseal(key: &[u8], label: &[u8], aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < NONCE_LEN {
        return None;
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let mut buf = body.to_vec();
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let plain = aead(key, label).open_in_place(nonce, Aad::from(aad), &mut buf).ok()?;
    Some(plain.to_vec())
}

/// The key a join's ring is sealed under: only a holder of the node's token can derive
/// it, and each join's nonces make it new.
fn transport_key(token: &[u8], node_nonce: &[u8], head_nonce: &[u8]) -> [u8; 32] {
    mac(token, &[b"locus key transport", node_nonce, head_nonce])
}

/// A data node's TLS identity as its head issues it: the certificate chain, its key
/// and the cluster's authority, each PEM.
pub type NodeTls = (String, String, String);

/// The head's side of a join: `keys` (and the node's TLS identity, if any) sealed for
/// the node that authenticated with `token`, sent `node_nonce` and announced `addr`.
/// Answers the head's nonce, the sealed ring and the sealed identity (empty if none).
pub fn seal_for_node(
    keys: &KeyRing,
    tls: Option<&NodeTls>,
    token: &[u8],
    node_nonce: &[u8],
    addr: &str,
) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut head_nonce = vec![0u8; 32];
    getrandom::fill(&mut head_nonce).expect("the OS provides randomness");
    let k = transport_key(token, node_nonce, &head_nonce);
    let sealed = seal(&k, b"join", addr.as_bytes(), &locus_proto::codec::encode(keys));
    let tls = tls.map_or_else(Vec::new, |t| seal(&k, b"join tls", addr.as_bytes(), &locus_proto::codec::encode(t)));
    (head_nonce, sealed, tls)
}

/// The node's side of a join's TLS identity; `None` if it does not open.
pub fn open_tls_from_head(
    token: &[u8],
    node_nonce: &[u8],
    head_nonce: &[u8],
    addr: &str,
    sealed: &[u8],
) -> Option<NodeTls> {
    open_join(b"join tls", token, node_nonce, head_nonce, addr, sealed)
}

/// The node's side of a join: the ring the head sealed, or `None` if it does not open
/// (another token, nonce or address, or altered on the way).
pub fn open_from_head(
    token: &[u8],
    node_nonce: &[u8],
    head_nonce: &[u8],
    addr: &str,
    sealed: &[u8],
) -> Option<KeyRing> {
    open_join(b"join", token, node_nonce, head_nonce, addr, sealed)
}

/// What [`seal_for_node`] sealed under `label`, opened and decoded.
fn open_join<T: serde::de::DeserializeOwned>(
    label: &[u8],
    token: &[u8],
    node_nonce: &[u8],
    head_nonce: &[u8],
    addr: &str,
    sealed: &[u8],
) -> Option<T> {
    let k = transport_key(token, node_nonce, head_nonce);
    locus_proto::codec::decode(&unseal(&k, label, addr.as_bytes(), sealed)?).ok()
}

/// The ring as the database keeps it: sealed under the wrap key, in hex.
pub fn wrap(wrap_key: &[u8], keys: &KeyRing) -> String {
    seal_ring(wrap_key, b"at rest", KEYS_SETTING, keys)
}

/// A ring sealed under `key` (with `label` and bound to `aad`), in hex.
fn seal_ring(key: &[u8], label: &[u8], aad: &str, keys: &KeyRing) -> String {
    hex::encode(seal(key, label, aad.as_bytes(), &locus_proto::codec::encode(keys)))
}

/// A ring [`seal_ring`] sealed; `None` if anything differs.
fn open_ring(key: &[u8], label: &[u8], aad: &str, text: &str) -> Option<KeyRing> {
    let plain = unseal(key, label, aad.as_bytes(), &hex::decode(text.trim()).ok()?)?;
    locus_proto::codec::decode(&plain).ok()
}

/// The ring from its database form; `None` if the wrap key is not the one it was
/// sealed with.
pub fn unwrap(wrap_key: &[u8], text: &str) -> Option<KeyRing> {
    open_ring(wrap_key, b"at rest", KEYS_SETTING, text)
}

/// The ring as a data node keeps it in its state directory, sealed under its own
/// token (`locus-node`), so that a node restarted while no head answers goes on serving.
pub fn seal_at_node(token: &[u8], keys: &KeyRing) -> String {
    seal_ring(token, b"node at rest", NODE_KEYS_FILE, keys)
}

/// The ring a data node kept; `None` if `token` is not the one it was sealed with.
pub fn open_at_node(token: &[u8], text: &str) -> Option<KeyRing> {
    open_ring(token, b"node at rest", NODE_KEYS_FILE, text)
}

/// The file in a data node's state directory holding the cluster's keys it last
/// received, sealed under its token.
pub const NODE_KEYS_FILE: &str = "cluster-keys.sealed";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_seal_opens_only_with_the_same_token_nonces_and_address() {
        let ring = KeyRing::new(b"k".repeat(32));
        let tls: NodeTls = ("CHAIN".into(), "SECRET KEY".into(), "CA".into());
        let (head_nonce, sealed, sealed_tls) =
            seal_for_node(&ring, Some(&tls), b"token", b"node nonce", "10.0.0.1:9610");
        let open_tls = |token: &[u8], addr| open_tls_from_head(token, b"node nonce", &head_nonce, addr, &sealed_tls);
        assert_eq!(open_tls(b"token", "10.0.0.1:9610"), Some(tls));
        assert!(open_tls(b"other", "10.0.0.1:9610").is_none());
        assert!(open_tls(b"token", "10.0.0.2:9610").is_none());
        assert!(!sealed_tls.windows(10).any(|w| w == b"SECRET KEY"), "the node's key never in clear");
        assert!(seal_for_node(&ring, None, b"token", b"n", "a").2.is_empty(), "no identity from a plain head");
        assert_eq!(open_from_head(b"token", b"node nonce", &head_nonce, "10.0.0.1:9610", &sealed), Some(ring));
        assert!(open_from_head(b"other", b"node nonce", &head_nonce, "10.0.0.1:9610", &sealed).is_none());
        assert!(open_from_head(b"token", b"other nonce", &head_nonce, "10.0.0.1:9610", &sealed).is_none());
        assert!(open_from_head(b"token", b"node nonce", &head_nonce, "10.0.0.2:9610", &sealed).is_none());
        let mut altered = sealed.clone();
        altered[20] ^= 1;
        assert!(open_from_head(b"token", b"node nonce", &head_nonce, "10.0.0.1:9610", &altered).is_none());
        assert!(!sealed.windows(32).any(|w| w == &b"k".repeat(32)[..]));
    }

    #[test]
    fn a_nodes_kept_keys_open_only_with_its_token() {
        let ring = KeyRing::new(b"k".repeat(32));
        let kept = seal_at_node(b"token", &ring);
        assert_eq!(open_at_node(b"token", &kept), Some(ring));
        assert!(open_at_node(b"other", &kept).is_none());
        assert!(!kept.contains(&hex::encode(b"k".repeat(32))));
    }
}
