//! Scripts' messages across heads: `msg.send` to a client connected to another head of
//! the namespace.
//!
//! The sending head leaves the message in the namespace (`script_messages`, under a
//! random id) and names it on the engine's [`CHANNEL`] (PostgreSQL `NOTIFY`). The head
//! the recipient is connected to (its id's head bits say which) takes it, pushes it as
//! a single server would, and answers with a receipt on the same channel; the sender
//! waits at most [`RECEIPT_WAIT`] for it, so `msg.send` answers true only when the
//! recipient had the message, as on one server. A message no head took is withdrawn
//! by its sender, or swept once [`LETTER_KEPT`] has passed (its sender died meanwhile).
//! A SQLite namespace has one head: every client is its own.

use crate::cluster::Head;
use crate::{Push, Shared};
use locus_cluster::sql::Notice;
use locus_cluster::Letter;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The channel heads name messages and receipts on.
pub(crate) const CHANNEL: &str = "locus_messages";

/// How long a sender waits for the recipient's head to say whether it delivered.
const RECEIPT_WAIT: Duration = Duration::from_secs(2);

/// How long a message nobody took stays in the namespace.
const LETTER_KEPT: Duration = Duration::from_secs(60);

/// What heads say on [`CHANNEL`].
#[derive(Serialize, Deserialize)]
#[serde(tag = "k")]
enum Word {
    /// A message for client `to` from head `h` waits under `id`.
    #[serde(rename = "m")]
    Message { id: u64, to: u64, h: u64 },
    /// The message `id` that head `h` sent was delivered (`ok`) or not.
    #[serde(rename = "r")]
    Receipt { id: u64, h: u64, ok: bool },
}

impl Head {
    /// Starts taking the messages other heads leave for this head's clients, and their
    /// receipts for what this head sent (where the engine has other heads).
    pub(crate) fn start_messages(self: &Arc<Self>, shared: Weak<Shared>) {
        let head = Arc::downgrade(self);
        let listening = self.meta.listen(
            CHANNEL,
            Box::new(move |notice| {
                let (Some(head), Some(shared)) = (head.upgrade(), shared.upgrade()) else { return false };
                let Notice::Payload(p) = notice else { return true };
                match serde_json::from_str::<Word>(&p) {
                    Ok(Word::Message { id, to, h }) if head.is_own_client(to) => head.deliver(&shared, id, h),
                    Ok(Word::Receipt { id, h, ok }) if h == head.id => {
                        if let Some(waiting) = head.receipts.lock().get(&id) {
                            let _ = waiting.send(ok);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("an unreadable message notice ({e}): ignored"),
                }
                true
            }),
        );
        self.messages_across.store(listening, std::sync::atomic::Ordering::SeqCst);
    }

    /// Takes the message left under `id`, pushes it to its recipient, and tells its
    /// sender, head `from`, whether that worked.
    fn deliver(&self, shared: &Shared, id: u64, from: u64) {
        let Ok(Some(letter)) = self.meta.take_letter(id) else { return };
        let push = Push {
            topic: locus_proto::frame::PUSH_MESSAGE,
            meta: locus_proto::codec::encode(&letter.sender),
            data: letter.data.into(),
        };
        let ok = shared.registry.push(letter.recipient, push);
        let receipt = serde_json::to_string(&Word::Receipt { id, h: from, ok }).expect("encodable");
        if let Err(e) = self.meta.notify(CHANNEL, &[receipt]) {
            tracing::warn!("cannot tell the sending head whether a message was delivered: {e}");
        }
    }

    /// `msg.send` to `to`, a client of another head, from the call of client `from`:
    /// true once that head says it pushed the message.
    pub(crate) fn send_across(&self, to: u64, from: u64, data: &[u8]) -> bool {
        if !self.messages_across.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).expect("the OS provides randomness");
        let id = u64::from_le_bytes(id) >> 1;
        let (tx, rx) = std::sync::mpsc::channel();
        self.receipts.lock().insert(id, tx);
        let kept = locus_cluster::now_ns().saturating_add(LETTER_KEPT.as_nanos() as i64);
        let letter = Letter { recipient: to, sender: from, data: data.to_vec() };
        let word = serde_json::to_string(&Word::Message { id, to, h: self.id }).expect("encodable");
        let sent = self.meta.post_letter(id, &letter, kept).and_then(|()| self.meta.notify(CHANNEL, &[word]));
        let receipt = match sent {
            Ok(()) => rx.recv_timeout(RECEIPT_WAIT).ok(),
            Err(e) => {
                tracing::warn!("a script's message to another head's client could not be left: {e}");
                Some(false)
            }
        };
        self.receipts.lock().remove(&id);
        match receipt {
            Some(ok) => ok,
            // No answer in time: withdrawn if still there (not delivered); taken
            // meanwhile, it reached the other head, whose push went out or failed.
            None => matches!(self.meta.take_letter(id), Ok(None)),
        }
    }
}
