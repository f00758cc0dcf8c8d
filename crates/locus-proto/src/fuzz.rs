//! The body of the fuzz target (`fuzz/fuzz_targets/frame_decoder.rs`), kept here so that
//! the ordinary test suite runs it on pseudo-random input too.

use crate::codec::decode;
use crate::frame::{decode_frame, parse_preamble, Limits};
use crate::ops::*;
use crate::types::*;

macro_rules! decode_all_requests {
    ($( $(#[doc = $doc:literal])* $code:literal $name:ident $method:ident $shape:ident
        { $($field:ident : $fty:ty),* $(,)? } -> $reply:ty; )*) => {
        /// Decodes `meta` as the request and the reply of operation `op`.
        fn decode_op(op: u16, meta: &[u8]) {
            match op {
                $( $code => {
                    let _ = decode::<$name>(meta);
                    let _ = decode::<$reply>(meta);
                } )*
                _ => {}
            }
        }
    };
}

crate::operation_table!(decode_all_requests);

/// Runs every decoder on `data`: as a stream of frames, as a preamble, as metadata of
/// every operation, as an error body and as Chirp text lines. Must never panic.
pub fn decode_everything(data: &[u8]) {
    if let Some(p) = data.get(..8) {
        let _ = parse_preamble(p.try_into().expect("8 bytes"));
    }
    let mut rest = data;
    while let Ok(Some(frame)) = decode_frame(rest, Limits::SERVER) {
        decode_op(frame.header.op, frame.meta);
        let _ = decode::<crate::Error>(frame.meta);
        rest = &rest[frame.header.frame_len()..];
    }
    for op in OPERATIONS {
        decode_op(op.code, data);
    }
    let _ = decode::<Vec<DirEntry>>(data);
    // A Chirp endpoint reads lines of text.
    for line in String::from_utf8_lossy(data).lines() {
        let _ = crate::chirp::parse_command(line);
        let _ = crate::chirp::parse_stat_line(line);
        let _ = crate::chirp::rights_of_text(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode;
    use crate::frame::{Header, Kind};

    /// A small xorshift generator: deterministic, no dependency.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn decoders_survive_random_and_mutated_input() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let valid = {
            let meta = encode(&Rename { from: "a".into(), to: "b".into() });
            let h = Header { kind: Kind::Request, flags: 0, op: 0x1d, id: 1, meta_len: meta.len() as u32, data_len: 0 };
            let mut v = h.encode().to_vec();
            v.extend(meta);
            v
        };
        for round in 0..20_000 {
            let mut buf = if round % 2 == 0 {
                let len = (next(&mut seed) % 96) as usize;
                (0..len).map(|_| next(&mut seed) as u8).collect::<Vec<u8>>()
            } else {
                valid.clone()
            };
            for _ in 0..(next(&mut seed) % 4) {
                if !buf.is_empty() {
                    let i = (next(&mut seed) as usize) % buf.len();
                    buf[i] = next(&mut seed) as u8;
                }
            }
            decode_everything(&buf);
        }
    }
}
