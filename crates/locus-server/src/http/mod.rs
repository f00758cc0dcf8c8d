//! HTTP for unmodified clients (`--http-port`): curl, browsers, `pandas.read_csv` and any
//! HTTP library read a cluster's files with `GET` (with `Range`) and `HEAD`.
//!
//! - On a head, a request is authenticated by `Authorization: Bearer SUBJECT:TOKEN` or
//!   by a URL signed with the cluster key (`share`). A large file on data nodes is
//!   answered `307` to a data node's URL carrying a capability, so the bytes come
//!   straight from the node (third-party transfer); anything else the head serves.
//! - This door speaks plain HTTP, where a Bearer token (the secret the native protocol
//!   never sends) would cross the network readable. So a token is taken only when the
//!   door listens on a loopback address; elsewhere a request carrying one is refused
//!   (`403`, saying why), and signed URLs are the way in. A signed URL whose expiry lies
//!   further ahead than the head's `share_max_ttl` is refused too, so lowering that
//!   bound also ends longer-lived URLs made before.
//! - On a data node, `/o/OBJECT.VERSION?c=CAPABILITY` serves one object version to
//!   whoever holds a valid capability for it.

pub(crate) mod body;

use body::query;
pub use body::{ranged, text, HttpBody};

use crate::Shared;
use bytes::Bytes;
use hyper::header::{self};
use hyper::{Method, Request, Response, StatusCode};
use locus_proto::capability;
use locus_proto::types::Capability;
use std::convert::Infallible;
use std::sync::Arc;

/// Whether a listener's address is a loopback one, so what crosses it stays on this
/// host (an unspecified address such as `0.0.0.0` is not: it takes every interface).
pub fn is_loopback(listener: &tokio::net::TcpListener) -> bool {
    listener.local_addr().is_ok_and(|a| a.ip().to_canonical().is_loopback())
}

/// Why a Bearer token is refused on a plain-HTTP door off loopback.
pub const BEARER_REFUSED: &str = "a Bearer token is refused over plain HTTP on a non-loopback address, where \
     it would cross the network readable: read through a shared URL (locus share) or the native protocol \
     over TLS (locus serve --tls), or serve HTTP on a loopback address (--listen 127.0.0.1:PORT)";

/// Serves HTTP on `listener` until the task is dropped. Bearer tokens are taken only
/// when `listener` is on a loopback address (see the module's notes).
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let bearer = is_loopback(&listener);
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(answer(&shared, req, bearer).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

/// Answers one request; `bearer` says whether Bearer tokens may be taken on this door
/// (on a head, the web console passes on what is not its own).
pub async fn answer(shared: &Arc<Shared>, req: Request<hyper::body::Incoming>, bearer: bool) -> Response<HttpBody> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
    }
    if !bearer && req.headers().contains_key(header::AUTHORIZATION) {
        return text(StatusCode::FORBIDDEN, BEARER_REFUSED);
    }
    #[cfg(feature = "cluster")]
    if let Some(head) = &shared.head {
        return crate::cluster::http::from_head(shared, head, &req).await;
    }
    from_node(shared, &req)
}

/// Encodes a capability for a data node's URL.
pub fn encode_capability(c: &Capability) -> String {
    hex::encode(locus_proto::codec::encode(c))
}

fn decode_capability(text: &str) -> Option<Capability> {
    locus_proto::codec::decode(&hex::decode(text).ok()?).ok()
}

fn from_node(shared: &Arc<Shared>, req: &Request<hyper::body::Incoming>) -> Response<HttpBody> {
    let Some(key) = shared.node_key() else { return text(StatusCode::NOT_FOUND, "not a data node of a cluster") };
    let Some(name) = req.uri().path().strip_prefix("/o/") else { return text(StatusCode::NOT_FOUND, "no such object") };
    let Some((object, version)) =
        name.split_once('.').and_then(|(o, v)| Some((o.parse::<u64>().ok()?, v.parse::<u64>().ok()?)))
    else {
        return text(StatusCode::NOT_FOUND, "no such object");
    };
    let Some(cap) = query(req, "c").and_then(decode_capability) else {
        return text(StatusCode::FORBIDDEN, "a capability (c=...) is needed");
    };
    if let Err(why) = key.verify(&cap, &cap.subject, capability::now()) {
        return text(StatusCode::FORBIDDEN, format!("capability refused: {why:?}"));
    }
    if (cap.object, cap.version) != (object, version) {
        return text(StatusCode::FORBIDDEN, "capability refused: it is for another object");
    }
    if !crate::cluster::objects::objects_dir(shared)
        .join(crate::cluster::objects::object_name(object, version))
        .exists()
    {
        return text(StatusCode::NOT_FOUND, "that version is gone from this node");
    }
    let etag = format!("\"{object}.{version}\"");
    let shared = shared.clone();
    ranged(req, cap.size, &etag, move |offset, len| {
        let shared = shared.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                crate::cluster::objects::read_version(&shared, object, version, offset, len)
                    .map(Bytes::from)
                    .map_err(|e| std::io::Error::other(e.message))
            })
            .await
            .map_err(std::io::Error::other)?
        }
    })
}
