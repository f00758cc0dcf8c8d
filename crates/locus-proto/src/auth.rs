//! Challenge-response authentication by a shared secret token.
//!
//! The server sends a random nonce; the client answers with an HMAC-SHA256 over both
//! nonces and its subject name, keyed by its token; the server answers with its own
//! HMAC so the client knows it talks to a server that holds the same token. The token
//! itself never crosses the wire.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of each side's nonce in bytes.
pub const NONCE_LEN: usize = 32;

fn mac(token: &[u8], label: &[u8], a: &[u8], b: &[u8], subject: &str) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes any key length");
    for part in [label, a, b, subject.as_bytes()] {
        m.update(&(part.len() as u32).to_le_bytes());
        m.update(part);
    }
    m.finalize().into_bytes().to_vec()
}

/// The proof a client sends: it knows `token` for `subject`.
pub fn client_proof(token: &[u8], server_nonce: &[u8], client_nonce: &[u8], subject: &str) -> Vec<u8> {
    mac(token, b"locus client", server_nonce, client_nonce, subject)
}

/// The proof a server sends back: it knows the same token.
pub fn server_proof(token: &[u8], server_nonce: &[u8], client_nonce: &[u8], subject: &str) -> Vec<u8> {
    mac(token, b"locus server", client_nonce, server_nonce, subject)
}

/// Compares two proofs in constant time.
pub fn proofs_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_every_input() {
        let p = client_proof(b"tok", b"sn", b"cn", "alice");
        assert!(proofs_equal(&p, &client_proof(b"tok", b"sn", b"cn", "alice")));
        assert!(!proofs_equal(&p, &client_proof(b"tok2", b"sn", b"cn", "alice")));
        assert!(!proofs_equal(&p, &client_proof(b"tok", b"sn", b"cn", "bob")));
        assert!(!proofs_equal(&p, &server_proof(b"tok", b"sn", b"cn", "alice")));
    }
}
