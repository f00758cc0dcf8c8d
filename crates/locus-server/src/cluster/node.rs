//! A data node: an ordinary server that has joined a head (`locus serve --data-node`).
//!
//! It keeps object versions under [`crate::cluster::objects::OBJECTS_DIR`] in its export, serves
//! them to any subject that presents a capability the head signed, and stores and drops
//! them only for the head. It learns the cluster's keys when it joins (sealed for it:
//! see [`crate::cluster::keys`]), and joins again every [`REJOIN_EVERY`] to report its free space,
//! to rejoin a restarted head and to learn a rotated key.
//!
//! A node authenticates at its head as [`NODE_SUBJECT`], which may join and nothing
//! else: a node holds no admin token of its head.

use crate::Shared;
use locus_client::{Client, ConnectOptions};
use locus_proto::capability::NODE_SUBJECT;
use locus_proto::ops::NodeJoin;
use std::sync::Arc;
use std::time::Duration;

pub use crate::cluster::config::REJOIN_EVERY;

/// Free bytes in the file system under the node's export.
fn free_bytes(shared: &Shared) -> u64 {
    rustix::fs::statvfs(&shared.config.root).map_or(0, |s| s.f_bavail * s.f_frsize)
}

/// Joins the head once: the head records the node (`advertise` is the address clients
/// reach it at) and answers the cluster's keys, sealed for this node, which it then
/// trusts. `head` must hold the credentials of [`NODE_SUBJECT`] at the head.
pub async fn join(shared: &Shared, head: &ConnectOptions, advertise: &str, http: Option<&str>) -> Result<u64, String> {
    if head.credentials.subject != NODE_SUBJECT {
        return Err(format!(
            "a data node joins its head as {NODE_SUBJECT}, not {} (make its token at the head with `locus token \
             {NODE_SUBJECT}`, then give it to the node as LOCUS_TOKEN={NODE_SUBJECT}:TOKEN)",
            head.credentials.subject
        ));
    }
    let client = Client::connect(head).await.map_err(|e| format!("head at {}: {e}", head.addr))?;
    let mut nonce = vec![0u8; 32];
    getrandom::fill(&mut nonce).expect("the OS provides randomness");
    let join = NodeJoin {
        addr: advertise.to_string(),
        http: http.map(str::to_string),
        free: free_bytes(shared),
        nonce: nonce.clone(),
    };
    let welcome = client.call(join).await.map_err(|e| format!("head at {} refused the node: {e}", head.addr))?;
    let token = head.credentials.token.as_bytes();
    let keys = crate::cluster::keys::open_from_head(token, &nonce, &welcome.nonce, advertise, &welcome.sealed)
        .ok_or_else(|| format!("the keys the head at {} sent do not open with this node's token", head.addr))?;
    shared.set_node_key(keys);
    Ok(welcome.node)
}

/// Prepares the object directory and joins the head, then keeps reporting to it; a head
/// that cannot be reached is retried.
pub async fn serve_head(shared: Arc<Shared>, head: ConnectOptions, advertise: String, http: Option<String>) {
    let objects = shared.config.root.join(crate::cluster::objects::OBJECTS_DIR);
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
