//! Frames: a fixed 16-byte header, then `meta_len` bytes of encoded metadata, then
//! `data_len` bytes of raw bulk data.
//!
//! Bulk data never passes through the metadata codec, so the server can send it with
//! `sendfile` and the client can hand it on without copying. The header is checked
//! against [`Limits`] before anything is allocated.

use thiserror::Error;

/// Length of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 16;

/// The 8 bytes each side sends first: `LOCUS`, a zero byte, and the protocol version.
pub const PREAMBLE_MAGIC: [u8; 6] = *b"LOCUS\0";

/// The protocol version this crate speaks. Version 2 binds the login proof to the
/// server address the client dialled and to the TLS session (see [`crate::auth`]); a
/// server answers an older client's `hello` with an error saying so.
pub const VERSION: u16 = 6;

/// The oldest protocol version a peer may speak: [`VERSION`]. Version 1's login proof
/// is not bound to the server; version 2's `Welcome` and `NodeWelcome` lack the heads
/// and the TLS identity that version 3 carries, version 3's `node_run` the module's
/// hash that lets a head leave out a module its node has, and version 4's the plan a
/// node keeps its share's tree under (a peer of another version would fail to decode
/// them, so it is told to upgrade instead); a version 5 server would take `put`'s
/// `PUT_NEW` bit for no bit at all and replace a file a create-only write must not.
pub const MIN_VERSION: u16 = 6;

/// Push topic of a message sent by a script (`msg.send`); the push's metadata is the
/// sending client's id (u64), its data the message.
pub const PUSH_MESSAGE: u16 = 1;

/// Push topic of a callback break (see the `callbacks` operation); the push's metadata
/// is the changed paths (`Vec<String>`): a path's content, attributes or existence
/// changed, and so did its directory's listing.
pub const PUSH_BREAK: u16 = 2;

/// Push topic sent on a connection with callbacks on just before a reply, when the
/// request's paths (the push's metadata, `Vec<String>`) hold no promise (a server bound
/// was reached, or the subject may not see them): the client must not trust that
/// reply beyond its own timeout.
pub const PUSH_NO_PROMISE: u16 = 3;

/// Set on every frame of a multi-frame message except the last.
pub const FLAG_MORE: u8 = 1;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client to server: an operation.
    Request = 1,
    /// Server to client: the successful answer to the request with the same id.
    Reply = 2,
    /// Server to client: the request with the same id failed; meta is an [`crate::Error`].
    Error = 3,
    /// Server to client, unsolicited: a message pushed to this client (callbacks).
    Push = 4,
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub flags: u8,
    /// Operation code (requests and replies) or push topic.
    pub op: u16,
    /// Chosen by the client; echoed by the server so replies can come out of order.
    pub id: u32,
    pub meta_len: u32,
    pub data_len: u32,
}

/// Size limits that a receiver enforces on each frame before allocating for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_meta: u32,
    pub max_data: u32,
}

impl Limits {
    /// What a server accepts from clients: paths and arguments are small, writes are chunked.
    pub const SERVER: Limits = Limits { max_meta: 1 << 20, max_data: 16 << 20 };
    /// What a client accepts from servers: directory listings can be large.
    pub const CLIENT: Limits = Limits { max_meta: 64 << 20, max_data: 64 << 20 };
    /// What a server accepts before the client has authenticated (hello, auth, ping), so
    /// that an unknown peer cannot make it allocate much.
    pub const BEFORE_AUTH: Limits = Limits { max_meta: 16 << 10, max_data: 16 << 10 };
}

/// Why a header or preamble was rejected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("unknown frame flags {0:#x}")]
    BadFlags(u8),
    #[error("frame metadata of {0} bytes exceeds the limit of {1}")]
    MetaTooLarge(u32, u32),
    #[error("frame data of {0} bytes exceeds the limit of {1}")]
    DataTooLarge(u32, u32),
    #[error("not a Locus peer (bad preamble)")]
    BadPreamble,
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
}

impl Header {
    /// The header as wire bytes (little-endian).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.op.to_le_bytes());
        b[4..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..12].copy_from_slice(&self.meta_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.data_len.to_le_bytes());
        b
    }

    /// Parses and checks a header; nothing is allocated, so a hostile header costs nothing.
    pub fn decode(b: &[u8; HEADER_LEN], limits: Limits) -> Result<Header, FrameError> {
        let kind = match b[0] {
            1 => Kind::Request,
            2 => Kind::Reply,
            3 => Kind::Error,
            4 => Kind::Push,
            k => return Err(FrameError::BadKind(k)),
        };
        let flags = b[1];
        if flags & !FLAG_MORE != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let h = Header {
            kind,
            flags,
            op: u16::from_le_bytes([b[2], b[3]]),
            id: u32_at(4),
            meta_len: u32_at(8),
            data_len: u32_at(12),
        };
        if h.meta_len > limits.max_meta {
            return Err(FrameError::MetaTooLarge(h.meta_len, limits.max_meta));
        }
        if h.data_len > limits.max_data {
            return Err(FrameError::DataTooLarge(h.data_len, limits.max_data));
        }
        Ok(h)
    }

    /// True when more frames of the same message follow.
    pub fn more(&self) -> bool {
        self.flags & FLAG_MORE != 0
    }

    /// Total length of the frame on the wire, header included.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.meta_len as usize + self.data_len as usize
    }
}

/// The preamble for a version.
pub fn preamble(version: u16) -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..6].copy_from_slice(&PREAMBLE_MAGIC);
    p[6..].copy_from_slice(&version.to_le_bytes());
    p
}

/// Checks a peer's preamble and returns the version it offers.
pub fn parse_preamble(p: &[u8; 8]) -> Result<u16, FrameError> {
    if p[..6] != PREAMBLE_MAGIC {
        return Err(FrameError::BadPreamble);
    }
    let v = u16::from_le_bytes([p[6], p[7]]);
    if v == 0 {
        return Err(FrameError::BadVersion(v));
    }
    Ok(v)
}

/// A whole frame found at the start of a buffer, borrowed from it.
#[derive(Debug)]
pub struct FrameRef<'a> {
    pub header: Header,
    pub meta: &'a [u8],
    pub data: &'a [u8],
}

/// Finds one complete frame at the start of `buf`: `Ok(None)` if more bytes are needed.
///
/// It checks cheaply that the whole frame has arrived before handing out slices, the way
/// a streaming decoder must; the fuzz target drives this function.
pub fn decode_frame(buf: &[u8], limits: Limits) -> Result<Option<FrameRef<'_>>, FrameError> {
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let header = Header::decode(head.try_into().expect("16 bytes"), limits)?;
    if buf.len() < header.frame_len() {
        return Ok(None);
    }
    let meta_end = HEADER_LEN + header.meta_len as usize;
    Ok(Some(FrameRef { header, meta: &buf[HEADER_LEN..meta_end], data: &buf[meta_end..header.frame_len()] }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h() -> Header {
        Header { kind: Kind::Request, flags: 0, op: 0x10, id: 7, meta_len: 3, data_len: 2 }
    }

    #[test]
    fn header_round_trips() {
        let bytes = h().encode();
        assert_eq!(Header::decode(&bytes, Limits::SERVER).unwrap(), h());
    }

    #[test]
    fn oversized_and_malformed_headers_are_rejected_before_allocation() {
        let mut big = h();
        big.data_len = u32::MAX;
        assert_eq!(
            Header::decode(&big.encode(), Limits::SERVER),
            Err(FrameError::DataTooLarge(u32::MAX, Limits::SERVER.max_data))
        );
        big = h();
        big.meta_len = (1 << 20) + 1;
        assert!(matches!(Header::decode(&big.encode(), Limits::SERVER), Err(FrameError::MetaTooLarge(..))));
        let mut b = h().encode();
        b[0] = 9;
        assert_eq!(Header::decode(&b, Limits::SERVER), Err(FrameError::BadKind(9)));
        b = h().encode();
        b[1] = 0x80;
        assert_eq!(Header::decode(&b, Limits::SERVER), Err(FrameError::BadFlags(0x80)));
    }

    #[test]
    fn decode_frame_waits_for_whole_frame() {
        let mut buf = h().encode().to_vec();
        buf.extend_from_slice(b"abc");
        assert!(decode_frame(&buf, Limits::SERVER).unwrap().is_none());
        buf.extend_from_slice(b"xy");
        let f = decode_frame(&buf, Limits::SERVER).unwrap().unwrap();
        assert_eq!((f.meta, f.data), (&b"abc"[..], &b"xy"[..]));
        assert!(decode_frame(&buf[..5], Limits::SERVER).unwrap().is_none());
    }

    #[test]
    fn preamble_checks_magic_and_version() {
        assert_eq!(parse_preamble(&preamble(1)), Ok(1));
        assert_eq!(parse_preamble(b"GET / HT"), Err(FrameError::BadPreamble));
        assert_eq!(parse_preamble(&preamble(0)), Err(FrameError::BadVersion(0)));
    }
}
