//! Who a request is: the access key names a subject, whose S3 secret is derived from its
//! Locus token, so the token itself is never sent nor shown to S3 tools.

use hmac::{Hmac, Mac};
use locus_server::Tokens;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::{s3_error, S3Request, S3Result};
use sha2::Sha256;

/// What the secret is derived under: a new version of the scheme changes every secret.
const SECRET_LABEL: &[u8] = b"locus s3 secret v1";

/// The S3 secret of a subject whose token is `token`: 40 hex digits of an HMAC-SHA256 of
/// a fixed label under the token. Knowing it does not give the token.
pub fn secret_of(token: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes a key of any length");
    mac.update(SECRET_LABEL);
    hex::encode(&mac.finalize().into_bytes()[..20])
}

/// Whether a subject's name can be an access key: S3 clients put it in the credential
/// scope (`KEY/DATE/REGION/s3/aws4_request`) and in URLs.
pub fn usable_as_access_key(subject: &str) -> bool {
    !subject.is_empty()
        && subject.len() <= 128
        && subject.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b'+'))
}

/// Secrets by access key, from the server's tokens.
pub(crate) struct Keys {
    pub tokens: Tokens,
}

#[async_trait::async_trait]
impl S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.tokens.get(access_key) {
            Some(token) if usable_as_access_key(access_key) => Ok(SecretKey::from(secret_of(token))),
            _ => Err(s3_error!(InvalidAccessKeyId, "no subject has this access key")),
        }
    }
}

/// Lets unsigned requests through only when the server names an anonymous subject.
pub(crate) struct Anonymous {
    pub subject: Option<String>,
}

#[async_trait::async_trait]
impl S3Access for Anonymous {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_some() || self.subject.is_some() {
            return Ok(());
        }
        Err(s3_error!(
            AccessDenied,
            "unsigned requests are refused here: sign with the keys `locus token SUBJECT --s3` prints"
        ))
    }
}

/// The method of the subject unsigned requests act as (`anonymous:NAME`): like Chirp's
/// host subjects, it matches only ACL entries naming it (or `anonymous:*`), never `*`.
pub const ANONYMOUS: &str = "anonymous";

/// The subject a request acts as: its access key's, or the anonymous subject.
pub(crate) fn subject_of<T>(req: &S3Request<T>, anonymous: &Option<String>) -> S3Result<String> {
    match (&req.credentials, anonymous) {
        (Some(c), _) => Ok(c.access_key.clone()),
        (None, Some(a)) => Ok(format!("{ANONYMOUS}:{a}")),
        (None, None) => Err(s3_error!(AccessDenied, "unsigned requests are refused here")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_differ_by_token_and_do_not_contain_it() {
        let a = secret_of(b"0123456789abcdef");
        assert_eq!(a.len(), 40);
        assert_ne!(a, secret_of(b"0123456789abcdeg"));
        assert!(!a.contains("0123456789abcdef"));
        assert_eq!(a, secret_of(b"0123456789abcdef"));
    }

    #[test]
    fn access_keys_are_plain_names() {
        assert!(usable_as_access_key("alice"));
        assert!(usable_as_access_key("svc-backup_2"));
        assert!(!usable_as_access_key("a/b"));
        assert!(!usable_as_access_key(""));
        assert!(!usable_as_access_key("unix:alice"));
    }
}
