//! A storelet run across the cluster: each node runs its share over a view of the
//! files it holds, and the head merges their outputs in order.

use crate::cluster::Head;
use crate::transport::EventFrame;
use bytes::Bytes;
use locus_cluster::Node;
use locus_proto::frame::Kind;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{codec, Code, Error as WireError};
use std::sync::Arc;

/// Runs one share per node at once and hands their events on as they arrive: one
/// `Started`, every node's output, then one `Finished` adding up the accounts (the
/// highest exit code), or the first node's error.
pub(crate) async fn merge_runs(
    head: Arc<Head>,
    subject: String,
    shares: Vec<(Node, Vec<ViewFile>)>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    module: Bytes,
    tx: tokio::sync::mpsc::UnboundedSender<EventFrame>,
) {
    let frame = |kind: Kind, more: bool, meta: Vec<u8>, data: Bytes| EventFrame {
        kind,
        more,
        meta,
        data,
        mergeable: kind == Kind::Reply && more,
    };
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut running = 0;
    for (node, files) in shares {
        let req = NodeRun { subject: subject.clone(), files, args: args.clone(), env: env.clone() };
        let (head, module, events_tx) = (head.clone(), module.clone(), events_tx.clone());
        running += 1;
        tokio::spawn(async move {
            let frames = match head.writer(&node).await {
                Ok(c) => c.call_stream_with(req, &module).await.map_err(|e| WireError::new(e.code(), e.to_string())),
                Err(e) => Err(e),
            };
            match frames {
                Ok(mut frames) => {
                    while let Some(f) = frames.recv().await {
                        let last = f.as_ref().map_or(true, |f| !f.header.more());
                        let _ = events_tx
                            .send(f.map_err(|e| WireError::new(e.code(), format!("data node {}: {e}", node.id))));
                        if last {
                            return;
                        }
                    }
                    let _ = events_tx.send(Err(WireError::new(Code::IO, format!("data node {} went away", node.id))));
                }
                Err(e) => drop(events_tx.send(Err(e))),
            }
        });
    }
    drop(events_tx);
    let mut total = StoreletResult::default();
    let mut started = false;
    while running > 0 {
        let Some(event) = events.recv().await else { break };
        let f = match event {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.send(frame(Kind::Error, false, codec::encode(&e), Bytes::new()));
                return;
            }
        };
        match codec::decode::<StoreletEvent>(&f.meta) {
            Ok(StoreletEvent::Started { module, .. }) if !started => {
                started = true;
                let _ = tx.send(frame(
                    Kind::Reply,
                    true,
                    codec::encode(&StoreletEvent::Started { run: 0, module }),
                    Bytes::new(),
                ));
            }
            Ok(StoreletEvent::Started { .. }) => {}
            Ok(e @ (StoreletEvent::Stdout | StoreletEvent::Stderr)) => {
                let _ = tx.send(frame(Kind::Reply, true, codec::encode(&e), f.data));
            }
            Ok(StoreletEvent::Finished(r)) => {
                running -= 1;
                total.module = r.module;
                total.exit_code = total.exit_code.max(r.exit_code);
                total.fuel += r.fuel;
                total.cpu_us += r.cpu_us;
                total.peak_memory = total.peak_memory.max(r.peak_memory);
                total.wall_us = total.wall_us.max(r.wall_us);
                total.output_bytes += r.output_bytes;
                total.read_bytes += r.read_bytes;
                total.write_bytes += r.write_bytes;
                total.files_opened += r.files_opened;
            }
            Err(e) => {
                let _ = tx.send(frame(Kind::Error, false, codec::encode(&e), Bytes::new()));
                return;
            }
        }
    }
    let _ = tx.send(frame(Kind::Reply, false, codec::encode(&StoreletEvent::Finished(total)), Bytes::new()));
}
