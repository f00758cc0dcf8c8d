//! Server dispatch, generated from the operation table: one [`Handler`] method per
//! operation and a [`dispatch`] function that decodes a request and calls it.

use crate::transport::Body;
use bytes::Bytes;
use locus_proto::codec;
use locus_proto::ops;
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError};
use serde::Serialize;

/// What a handler answers: a typed reply (with its pages, body or stream), or an error.
pub type Reply<T> = Result<Answer<T>, WireError>;

/// A reply computed elsewhere (a storelet's event stream), sent when it is ready.
pub type Later = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Encoded, WireError>> + Send>>;

/// A handler's successful answer: one or more metadata pages and a body.
pub struct Answer<T> {
    pub pages: Vec<T>,
    pub body: Body,
    /// The reply is not sent now (a stream whose last frame has not arrived).
    pub deferred: bool,
    /// The reply will come from this future; the connection goes on meanwhile.
    pub later: Option<Later>,
}

impl<T> From<T> for Answer<T> {
    fn from(meta: T) -> Self {
        Answer { pages: vec![meta], body: Body::None, deferred: false, later: None }
    }
}

impl<T: Serialize> Answer<T> {
    /// An answer with a body after its metadata.
    pub fn with_body(meta: T, body: Body) -> Self {
        Answer { pages: vec![meta], body, deferred: false, later: None }
    }

    /// An answer sent as several frames, one per page.
    pub fn paged(pages: Vec<T>) -> Self {
        Answer { pages, body: Body::None, deferred: false, later: None }
    }

    /// No reply yet.
    pub fn deferred() -> Self {
        Answer { pages: Vec::new(), body: Body::None, deferred: true, later: None }
    }

    /// A reply streamed from frames produced elsewhere (a storelet's events, a file
    /// read from data nodes), each sent as it arrives.
    pub fn events(stream: crate::transport::EventStream) -> Self {
        Answer::later(Box::pin(async move {
            Ok(Encoded { metas: Vec::new(), body: Body::Events(stream), deferred: false, later: None })
        }))
    }

    /// A reply that `later` will produce.
    pub fn later(later: Later) -> Self {
        Answer { pages: Vec::new(), body: Body::None, deferred: false, later: Some(later) }
    }

    /// The answer with its metadata encoded.
    pub fn encode(self) -> Encoded {
        Encoded {
            metas: self.pages.iter().map(codec::encode).collect(),
            body: self.body,
            deferred: self.deferred,
            later: self.later,
        }
    }
}

/// An answer ready for the frame writer.
pub struct Encoded {
    pub metas: Vec<Vec<u8>>,
    pub body: Body,
    pub deferred: bool,
    pub later: Option<Later>,
}

macro_rules! define_dispatch {
    ($( $(#[doc = $doc:literal])* $code:literal $name:ident $method:ident $shape:ident
        { $($field:ident : $fty:ty),* $(,)? } -> $reply:ty; )*) => {
        /// Implements every operation of the table; `data` is the request frame's bulk data.
        pub trait Handler {
            $(
                $(#[doc = $doc])*
                fn $method(&mut self, req: ops::$name, data: Bytes) -> Result<Answer<$reply>, WireError>;
            )*
        }

        /// Decodes the metadata of a request with code `op` and runs it on `handler`.
        pub fn dispatch<H: Handler + ?Sized>(handler: &mut H, op: u16, meta: &[u8], data: Bytes) -> Result<Encoded, WireError> {
            match op {
                $( $code => {
                    let req: ops::$name = codec::decode(meta)?;
                    handler.$method(req, data).map(Answer::encode)
                } )*
                _ => Err(WireError::new(Code::UNKNOWN_OP, format!("unknown operation {op:#06x}"))),
            }
        }
    };
}

locus_proto::operation_table!(define_dispatch);
