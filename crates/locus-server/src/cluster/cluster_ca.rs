//! One certificate authority for every TLS link of a cluster whose heads serve TLS
//! (`--tls`): clients to heads, clients to data nodes, heads to nodes and nodes to
//! nodes all check their peer against it.
//!
//! The first TLS head of a namespace makes the authority (an ECDSA P-256 key and a
//! self-signed certificate) and keeps it in the namespace (`settings`, sealed under the
//! heads' wrap key, like the cluster's keys), so every head issues under the same one.
//! A head's own certificate is issued for the names a local server's would have, and
//! its state directory's `cert.pem` holds the authority's certificate: the one file
//! clients (`LOCUS_TLS_CA`) and data nodes trust. A data node gets a certificate for the
//! host it advertises, and its key, sealed in the answer to each join.

use crate::cluster::keys::{seal, unseal};
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// The setting holding the authority, sealed under the wrap key, in hex.
pub const CA_SETTING: &str = "cluster_ca";

/// The cluster's certificate authority, as a head holds it.
pub struct ClusterCa {
    /// The authority's certificate (PEM): what every peer trusts.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// The authority's parameters: the same at every head, so an issuer rebuilt from them
/// and the kept key names the kept certificate.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "Locus cluster CA");
    params.distinguished_name = name;
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

/// A new authority: its key and certificate (PEM), joined by a NUL.
fn make() -> Result<String, String> {
    let key = KeyPair::generate().map_err(|e| format!("a key for the cluster's authority: {e}"))?;
    let cert = ca_params().self_signed(&key).map_err(|e| format!("the cluster's authority: {e}"))?;
    Ok(format!("{}\0{}", key.serialize_pem(), cert.pem()))
}

impl ClusterCa {
    /// The namespace's authority (made by the first head that asks), opened with the
    /// heads' `wrap` key.
    pub fn open(meta: &locus_cluster::Meta, wrap: &[u8]) -> Result<ClusterCa, String> {
        let sealed = meta
            .update_setting(CA_SETTING, |old| match old {
                Some(text) => Ok(text.to_string()),
                None => {
                    let plain = make().map_err(locus_cluster::MetaError::Invalid)?;
                    Ok(hex::encode(seal(wrap, b"cluster ca", CA_SETTING.as_bytes(), plain.as_bytes())))
                }
            })
            .map_err(|e| format!("the cluster's authority in the namespace: {e}"))?;
        let plain = hex::decode(sealed.trim())
            .ok()
            .and_then(|b| unseal(wrap, b"cluster ca", CA_SETTING.as_bytes(), &b))
            .and_then(|p| String::from_utf8(p).ok())
            .ok_or("the cluster's authority does not open with this head's wrap key")?;
        let (key_pem, cert_pem) = plain.split_once('\0').ok_or("the cluster's authority is malformed")?;
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("the cluster's authority's key: {e}"))?;
        Ok(ClusterCa { cert_pem: cert_pem.to_string(), issuer: Issuer::new(ca_params(), key) })
    }

    /// A certificate for `names` (host names or IP addresses) issued by the authority,
    /// with a new key: the chain (the certificate, then the authority's) and the key, in
    /// PEM.
    pub fn issue(&self, names: &[String]) -> Result<(String, String), String> {
        let key = KeyPair::generate().map_err(|e| format!("a TLS key: {e}"))?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(|e| format!("TLS names {names:?}: {e}"))?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, names.first().map_or("locus", String::as_str));
        params.distinguished_name = name;
        let cert = params.signed_by(&key, &self.issuer).map_err(|e| format!("a certificate for {names:?}: {e}"))?;
        Ok((format!("{}{}", cert.pem(), self.cert_pem), key.serialize_pem()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_certificate_chains_to_the_kept_authority() {
        let dir = tempfile::tempdir().unwrap();
        let meta = locus_cluster::Meta::open(dir.path().join("ns.db").to_str().unwrap(), "admin").unwrap();
        let wrap = [7u8; 32];
        let ca = ClusterCa::open(&meta, &wrap).unwrap();
        let again = ClusterCa::open(&meta, &wrap).unwrap();
        assert_eq!(ca.cert_pem, again.cert_pem, "one authority per namespace");
        assert!(ClusterCa::open(&meta, &[8u8; 32]).is_err(), "another wrap key opens nothing");
        // Issued by the reopened authority, checked against the kept certificate.
        let (chain, _key) = again.issue(&["10.1.2.3".into(), "node.example".into()]).unwrap();
        let roots = {
            let mut store = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut ca.cert_pem.as_bytes()) {
                store.add(c.unwrap()).unwrap();
            }
            std::sync::Arc::new(store)
        };
        let leaf = rustls_pemfile::certs(&mut chain.as_bytes()).next().unwrap().unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider).build().unwrap();
        let now = rustls::pki_types::UnixTime::now();
        for (name, ok) in [("10.1.2.3", true), ("node.example", true), ("10.1.2.4", false)] {
            let name = rustls::pki_types::ServerName::try_from(name).unwrap();
            let checked = rustls::client::danger::ServerCertVerifier::verify_server_cert(
                verifier.as_ref(),
                &leaf,
                &[],
                &name,
                &[],
                now,
            );
            assert_eq!(checked.is_ok(), ok, "{name:?}: {checked:?}");
        }
    }
}
