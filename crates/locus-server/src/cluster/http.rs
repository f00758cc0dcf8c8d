//! A head's HTTP door: reads by bearer token or by a URL signed with the cluster key,
//! large files redirected to their data nodes.

use crate::cluster::{attr_of, Head};
use crate::http::body::{query, ranged, text, HttpBody};
use crate::Shared;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use locus_cluster::{normalise, split, Kind};
use locus_proto::capability;
use locus_proto::types::Rights;
use std::sync::Arc;

impl Head {
    /// A URL of `path` signed for `who`, good for `ttl_s` seconds (at most the head's
    /// `--share-max-ttl`): any HTTP client reads the file through it as `who`.
    pub(crate) fn share_url(&self, who: &str, path: &str, ttl_s: u64) -> Result<String, locus_proto::Error> {
        let max = self.config.share_max_ttl.as_secs();
        if ttl_s > max {
            return Err(locus_proto::Error::new(
                locus_proto::Code::INVAL,
                format!(
                    "a shared URL may live at most {max} s on this head (asked {ttl_s} s): ask for less, or start \
                     the head with a larger --share-max-ttl"
                ),
            ));
        }
        let expires = capability::now().saturating_add(ttl_s);
        let sig = capability::url_signature(&self.key(), who, path, expires);
        let encoded: String = path
            .split('/')
            .map(|p| percent_encoding::utf8_percent_encode(p, percent_encoding::NON_ALPHANUMERIC).to_string())
            .collect::<Vec<_>>()
            .join("/");
        let subject = percent_encoding::utf8_percent_encode(who, percent_encoding::NON_ALPHANUMERIC);
        let rel = format!("{encoded}?s={subject}&e={expires}&sig={sig}");
        // Under --tls the door is the web console's, which speaks HTTPS.
        let tls = self.shared.get().and_then(|s| s.upgrade()).is_some_and(|s| s.config.tls);
        Ok(match &self.config.http {
            Some(http) => format!("{}://{http}{rel}", if tls { "https" } else { "http" }),
            None => rel,
        })
    }
}

/// The subject a head request is made as: by bearer token or signed URL.
fn subject(shared: &Shared, head: &Head, req: &Request<hyper::body::Incoming>, path: &str) -> Option<String> {
    if let Some(auth) = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let (who, token) = auth.strip_prefix("Bearer ")?.split_once(':')?;
        let known = shared.tokens.get(who)?;
        return locus_proto::auth::proofs_equal(known, token.as_bytes()).then(|| who.to_string());
    }
    let (who, expires, sig) = (query(req, "s")?, query(req, "e")?.parse::<u64>().ok()?, query(req, "sig")?);
    let who = percent_encoding::percent_decode_str(who).decode_utf8().ok()?;
    let good = capability::url_signature(&head.key(), &who, path, expires);
    let now = capability::now();
    let within = now <= expires && expires - now <= head.config.share_max_ttl.as_secs();
    (locus_proto::auth::proofs_equal(good.as_bytes(), sig.as_bytes()) && within).then(|| who.into_owned())
}

/// Answers a `GET`/`HEAD` at a head: a directory's listing, a small file's bytes, or a
/// redirect to the data node that holds a large one.
pub(crate) async fn from_head(
    shared: &Shared,
    head: &Arc<Head>,
    req: &Request<hyper::body::Incoming>,
) -> Response<HttpBody> {
    let Ok(raw) = percent_encoding::percent_decode_str(req.uri().path()).decode_utf8() else {
        return text(StatusCode::BAD_REQUEST, "the path is not UTF-8");
    };
    let Ok(path) = normalise(&raw) else { return text(StatusCode::BAD_REQUEST, "bad path") };
    let Some(who) = subject(shared, head, req, &path) else {
        let mut r =
            text(StatusCode::UNAUTHORIZED, "authenticate with 'Authorization: Bearer SUBJECT:TOKEN' or a shared URL");
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"locus\""));
        return r;
    };
    let entry = match head.meta.get(&path) {
        Ok(Some(e)) => e,
        Ok(None) => return text(StatusCode::NOT_FOUND, format!("{path}: no such file or directory")),
        Err(e) => return text(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let is_dir = entry.kind == Kind::Dir;
    let governing = if is_dir { path.as_str() } else { split(&path).map_or("/", |(p, _)| p) };
    let need = if is_dir { Rights::LIST } else { Rights::READ };
    if !head.meta.rights(&who, governing).is_ok_and(|r| r.contains(need)) {
        return text(StatusCode::FORBIDDEN, format!("{path}: permission denied"));
    }
    if is_dir {
        let Ok(list) = head.meta.list(&path) else { return text(StatusCode::SERVICE_UNAVAILABLE, "listing failed") };
        let names: Vec<String> = list
            .iter()
            .map(|e| {
                let name = split(&e.path).map_or("", |(_, n)| n);
                if e.kind == Kind::Dir {
                    format!("{name}/")
                } else {
                    name.to_string()
                }
            })
            .collect();
        return text(StatusCode::OK, names.join("\n"));
    }
    if req.method() == Method::GET {
        if let Some(url) = head.http_location(&who, &entry) {
            let mut r = text(StatusCode::TEMPORARY_REDIRECT, "read it from its data node");
            if let Ok(v) = HeaderValue::from_str(&url) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            return r;
        }
    }
    let etag = format!("\"{}.{}\"", entry.object, entry.version);
    let size = attr_of(&entry).size;
    let head = head.clone();
    ranged(req, size, &etag, move |offset, len| {
        let (head, entry) = (head.clone(), entry.clone());
        async move { head.read(entry, offset, len as u32).await.map_err(|e| std::io::Error::other(e.message)) }
    })
}
