//! Challenge-response authentication by a shared secret token.
//!
//! The server sends a random nonce; the client answers with an HMAC-SHA256 over both
//! nonces, its subject name and the [`Binding`] of the connection, keyed by its token;
//! the server answers with its own HMAC so the client knows it talks to a server that
//! holds the same token. The token itself never crosses the wire.
//!
//! The binding is what stops a relay: a proof covers the server address the client
//! dialled (as written in its URL) and, under TLS, the session's exporter secret. A
//! server the client merely lists cannot pass its challenge on to another server and
//! hand that server the answer: the other server refuses an address that does not name
//! it, and a TLS session it did not terminate has another exporter.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of each side's nonce in bytes.
pub const NONCE_LEN: usize = 32;

/// The TLS exporter label (RFC 5705 / RFC 8446 §7.5) both sides derive the session's
/// binding secret with.
pub const TLS_EXPORTER_LABEL: &[u8] = b"EXPORTER-locus-login";

/// Length of the TLS exporter secret a proof covers.
pub const TLS_EXPORTER_LEN: usize = 32;

/// What a proof is bound to besides the nonces: the connection it was made for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Binding<'a> {
    /// The server's address as the client dialled it: `HOST:PORT` (`[V6]:PORT`).
    pub server: &'a str,
    /// The TLS exporter secret of the connection ([`TLS_EXPORTER_LABEL`]); empty on
    /// plain TCP.
    pub tls: &'a [u8],
}

fn mac(token: &[u8], label: &[u8], a: &[u8], b: &[u8], subject: &str, bind: &Binding) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes any key length");
    for part in [label, a, b, subject.as_bytes(), bind.server.as_bytes(), bind.tls] {
        m.update(&(part.len() as u32).to_le_bytes());
        m.update(part);
    }
    m.finalize().into_bytes().to_vec()
}

/// The proof a client sends: it knows `token` for `subject`, on this connection.
pub fn client_proof(token: &[u8], server_nonce: &[u8], client_nonce: &[u8], subject: &str, bind: &Binding) -> Vec<u8> {
    mac(token, b"locus client 2", server_nonce, client_nonce, subject, bind)
}

/// The proof a server sends back: it knows the same token, on this connection.
pub fn server_proof(token: &[u8], server_nonce: &[u8], client_nonce: &[u8], subject: &str, bind: &Binding) -> Vec<u8> {
    mac(token, b"locus server 2", client_nonce, server_nonce, subject, bind)
}

/// Compares two proofs in constant time.
pub fn proofs_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Splits a dialled `HOST:PORT` (`[V6]:PORT`) into its host, lower-cased and without
/// brackets or a final dot, and port; `None` when it is not of that form.
pub fn split_server(server: &str) -> Option<(String, u16)> {
    let (host, port) = match server.strip_prefix('[') {
        Some(v6) => {
            let (h, rest) = v6.split_once(']')?;
            (h, rest.strip_prefix(':')?)
        }
        None => server.rsplit_once(':')?,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    (!host.is_empty() && !host.contains(['[', ']'])).then_some(())?;
    Some((host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_every_input() {
        let b = Binding { server: "a:1", tls: b"" };
        let p = client_proof(b"tok", b"sn", b"cn", "alice", &b);
        assert!(proofs_equal(&p, &client_proof(b"tok", b"sn", b"cn", "alice", &b)));
        assert!(!proofs_equal(&p, &client_proof(b"tok2", b"sn", b"cn", "alice", &b)));
        assert!(!proofs_equal(&p, &client_proof(b"tok", b"sn", b"cn", "bob", &b)));
        assert!(!proofs_equal(&p, &server_proof(b"tok", b"sn", b"cn", "alice", &b)));
        // The binding: another server address, or another TLS session, is another proof.
        assert!(!proofs_equal(&p, &client_proof(b"tok", b"sn", b"cn", "alice", &Binding { server: "b:1", tls: b"" })));
        assert!(!proofs_equal(&p, &client_proof(b"tok", b"sn", b"cn", "alice", &Binding { server: "a:1", tls: b"x" })));
    }

    #[test]
    fn splits_dialled_servers() {
        assert_eq!(split_server("Host.Example.:9610"), Some(("host.example".into(), 9610)));
        assert_eq!(split_server("[::1]:7"), Some(("::1".into(), 7)));
        assert_eq!(split_server("127.0.0.1:0"), Some(("127.0.0.1".into(), 0)));
        for bad in ["host", ":9", "[::1]", "[::1]7", "h:x", "h:70000", "[]:1"] {
            assert_eq!(split_server(bad), None, "{bad}");
        }
    }
}
