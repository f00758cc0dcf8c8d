//! The code running next to the data: script calls on the interpreter pool, storelets and
//! active-file handler runs, running and recent, with what each used and the limit that
//! stopped it. A subject sees and cancels its own; an admin sees and cancels all.

use crate::auth::User;
use crate::{error, json, query, wire_error, Req, Resp};
use hyper::StatusCode;
use locus_server::Shared;

/// `GET /api/runs`.
pub fn runs(shared: &Shared, user: &User) -> Resp {
    let (scripts_running, scripts_recent) = shared.scripts.runs().list(&user.subject, user.admin);
    let (runs_live, runs_ended) = shared.storelets.runs(&user.subject, user.admin);
    let (storelets, active): (Vec<_>, Vec<_>) = runs_live.into_iter().partition(|r| r.active_file.is_none());
    let (storelets_recent, active_recent): (Vec<_>, Vec<_>) =
        runs_ended.into_iter().partition(|r| r.active_file.is_none());
    json(
        StatusCode::OK,
        &serde_json::json!({
            "admin": user.admin,
            "scripts": { "running": scripts_running, "recent": scripts_recent },
            "storelets": { "running": storelets, "recent": storelets_recent },
            "active_files": { "running": active, "recent": active_recent },
        }),
    )
}

/// `POST /api/cancel?kind=storelet|script&id=N`: stops a run (an active file's run is a
/// storelet run: `kind=storelet`).
pub fn cancel(shared: &Shared, user: &User, req: &Req) -> Resp {
    let Some(id) = query(req, "id").and_then(|v| v.parse::<u64>().ok()) else {
        return error(StatusCode::BAD_REQUEST, "give id=N");
    };
    let done = match query(req, "kind").as_deref() {
        Some("storelet") => shared.storelets.cancel(&user.subject, user.admin, id),
        Some("script") => shared.scripts.runs().cancel(&user.subject, user.admin, id),
        _ => return error(StatusCode::BAD_REQUEST, "give kind=storelet or kind=script"),
    };
    match done {
        Ok(()) => {
            tracing::info!(subject = %user.subject, id, "cancelled from the console");
            json(StatusCode::OK, &serde_json::json!({ "cancelled": id }))
        }
        Err(e) => wire_error(&e),
    }
}
