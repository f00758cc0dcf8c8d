//! Scripts' messages across heads: `msg.send` to a client connected to another head of
//! the namespace.
//!
//! A client id carries its head's client number (unique among the namespace's head
//! processes: see `Head::client_id_base`). A message to a client of a head heard from
//! lately is left in the namespace (`script_messages`, under a random id) and named on
//! the engine's [`CHANNEL`] (PostgreSQL `NOTIFY`). That head takes it, pushes it as a
//! single server would, and answers with a receipt on the same channel; the sender
//! waits at most [`RECEIPT_WAIT`] for it, so `msg.send` answers true only when the
//! recipient's head said it pushed the message. A message no head took is withdrawn by
//! its sender, or swept once [`LETTER_KEPT`] has passed (its sender died meanwhile). A
//! message to a client of no live head, or larger than [`MAX_ACROSS`], answers false at
//! once. A SQLite namespace has one head: every client is its own.

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

/// The largest message that goes to another head's client (it crosses the database).
pub(crate) const MAX_ACROSS: usize = 1 << 20;

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
                let p = match notice {
                    Notice::Payload(p) => p,
                    // A receipt can come only while this head listens.
                    Notice::Listening | Notice::Down => {
                        let on = matches!(notice, Notice::Listening);
                        head.messages_across.store(on, std::sync::atomic::Ordering::SeqCst);
                        return true;
                    }
                    Notice::Idle => return true,
                };
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
        if !listening {
            tracing::debug!("one head in this namespace: messages stay on it");
        }
    }

    /// Takes the message left under `id`, pushes it to its recipient, and tells its
    /// sender, head `from`, whether that worked.
    fn deliver(&self, shared: &Shared, id: u64, from: u64) {
        let letter = match self.meta.take_letter(id) {
            Ok(Some(letter)) => letter,
            // Taken by another head holding this number (it cannot be), or withdrawn.
            Ok(None) => return,
            Err(e) => return tracing::warn!("a message for a client of this head could not be taken: {e}"),
        };
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
        if !self.messages_across.load(std::sync::atomic::Ordering::SeqCst)
            || data.len() > MAX_ACROSS
            || !self.numbers_alive().contains(&(to >> 32))
        {
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
        if receipt.is_none() {
            // No answer in time: withdrawn, if no head took it meanwhile.
            let _ = self.meta.take_letter(id);
        }
        receipt.unwrap_or(false)
    }
}
