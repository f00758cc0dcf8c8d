//! The code running next to the data: script calls on the interpreter pool, storelets and
//! active-file handler runs, running and recent, with what each used and the limit that
//! stopped it. A subject sees and cancels its own; an admin sees and cancels all. On a
//! cluster head the storelets running are those of every data node (as `storelet ps`
//! lists them: what each has used so far), and the recent ones the head's own.

use crate::auth::User;
use crate::{error, json, query, wire_error, Req, Resp};
use bytes::Bytes;
use hyper::StatusCode;
use locus_proto::ops::{StoreletCancel, StoreletPs};
use locus_server::acting::Acting;
use locus_server::storelet_host::RunView;
use locus_server::Shared;
use std::sync::Arc;

/// The storelets running on a head's data nodes (and the head), as the page shows runs.
fn runs_on_nodes(s: &mut Acting) -> Result<Vec<RunView>, locus_proto::Error> {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let (pages, _) = s.call(&StoreletPs {}, Bytes::new())?;
    Ok(pages
        .into_iter()
        .flatten()
        .map(|r| RunView {
            run: r.run,
            subject: r.subject,
            module: r.module,
            args: r.args,
            active_file: None,
            state: if r.running { "running" } else { "queued" }.into(),
            running: r.running,
            submitted_ms: now_ms.saturating_sub(r.age_us / 1000),
            wall_us: r.age_us,
            cpu_us: r.cpu_us,
            fuel: r.fuel,
            peak_memory: 0,
            read_bytes: 0,
            write_bytes: 0,
            output_bytes: 0,
        })
        .collect())
}

/// `GET /api/runs`.
pub async fn runs(shared: &Arc<Shared>, user: &User) -> Resp {
    let (scripts_running, scripts_recent) = shared.scripts.runs().list(&user.subject, user.admin);
    let (mut runs_live, runs_ended) = shared.storelets.runs(&user.subject, user.admin);
    if shared.is_head() {
        let (shared, subject) = (shared.clone(), user.subject.clone());
        let listed = tokio::task::spawn_blocking(move || runs_on_nodes(&mut Acting::new(&shared, &subject))).await;
        // A node that cannot list its runs leaves the head's own (and the scripts).
        match listed {
            Ok(Ok(on_nodes)) => runs_live = on_nodes,
            Ok(Err(e)) => tracing::warn!("the data nodes' runs are not listed: {e}"),
            Err(e) => tracing::warn!("the data nodes' runs are not listed: {e}"),
        }
    }
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
/// storelet run: `kind=storelet`), on whichever data node it runs on a head.
pub async fn cancel(shared: &Arc<Shared>, user: &User, req: &Req) -> Resp {
    let Some(id) = query(req, "id").and_then(|v| v.parse::<u64>().ok()) else {
        return error(StatusCode::BAD_REQUEST, "give id=N");
    };
    let done = match query(req, "kind").as_deref() {
        Some("storelet") => {
            let (shared, subject) = (shared.clone(), user.subject.clone());
            tokio::task::spawn_blocking(move || {
                Acting::new(&shared, &subject).call(&StoreletCancel { run: id }, Bytes::new()).map(drop)
            })
            .await
            .unwrap_or_else(|e| Err(locus_proto::Error::new(locus_proto::Code::IO, e.to_string())))
        }
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
