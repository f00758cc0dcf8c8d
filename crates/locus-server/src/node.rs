//! A data node: an ordinary server that has joined a head (`locus serve --data-node`).
//!
//! It keeps object versions under [`crate::session::OBJECTS_DIR`] in its export, serves
//! them to any subject that presents a capability the head signed, and stores and drops
//! them only for the head. It learns the cluster key when it joins, and joins again
//! every [`REJOIN_EVERY`] to report its free space (and to rejoin a restarted head).

use crate::Shared;
use locus_client::{Client, ConnectOptions};
use locus_proto::ops::NodeJoin;
use std::sync::Arc;
use std::time::Duration;

/// How often a node reports to its head.
pub const REJOIN_EVERY: Duration = Duration::from_secs(10);

/// Free bytes in the file system under the node's export.
fn free_bytes(shared: &Shared) -> u64 {
    rustix::fs::statvfs(&shared.config.root).map_or(0, |s| s.f_bavail * s.f_frsize)
}

/// Joins the head once: the head records the node (`advertise` is the address clients
/// reach it at) and answers the cluster key, which the node then trusts.
pub async fn join(shared: &Shared, head: &ConnectOptions, advertise: &str, http: Option<&str>) -> Result<u64, String> {
    let client = Client::connect(head).await.map_err(|e| format!("head at {}: {e}", head.addr))?;
    let welcome = client
        .call(NodeJoin { addr: advertise.to_string(), http: http.map(str::to_string), free: free_bytes(shared) })
        .await
        .map_err(|e| format!("head at {} refused the node: {e}", head.addr))?;
    shared.set_node_key(welcome.key);
    Ok(welcome.node)
}

/// Prepares the object directory and joins the head, then keeps reporting to it; a head
/// that cannot be reached is retried.
pub async fn serve_head(shared: Arc<Shared>, head: ConnectOptions, advertise: String, http: Option<String>) {
    let objects = shared.config.root.join(crate::session::OBJECTS_DIR);
    if let Err(e) = std::fs::create_dir_all(&objects) {
        tracing::error!("cannot create {}: {e}", objects.display());
    }
    let mut joined = false;
    loop {
        match join(&shared, &head, &advertise, http.as_deref()).await {
            Ok(node) if !joined => {
                tracing::info!(node, head = %head.addr, "joined the cluster");
                joined = true;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{e}; retrying"),
        }
        tokio::time::sleep(if joined { REJOIN_EVERY } else { Duration::from_secs(1) }).await;
    }
}
