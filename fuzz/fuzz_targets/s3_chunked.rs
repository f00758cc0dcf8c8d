//! Feeds signed `aws-chunked` streaming uploads (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`,
//! what the AWS SDKs send for a PUT or an UploadPart) to the S3 door: the chunk sizes are
//! fuzzed and every chunk is signed, so the decoder sees valid streams cut anywhere, and
//! one byte of the encoded body may then be changed (a size, a signature, a line end).
//! Input: a byte `k` (taken modulo 16), then `k` chunk sizes (one byte each, times 1, 16 or 4096 by the
//! top bits), two bytes naming a byte of the body to change and one to XOR it with,
//! then a request in the text form of `s3_common` (where `UPLOADID` stands for a
//! new upload in parts of its path). Same checks as `s3_door`.
//! Run: `cargo +nightly fuzz run s3_chunked -- -max_total_time=1800`
#![no_main]

#[path = "s3_common.rs"]
mod s3_common;

use libfuzzer_sys::fuzz_target;
use s3_common::{endpoint, Signer, Signing};

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else { return };
    let k = usize::from(k % 16);
    if rest.len() < k + 3 {
        return;
    }
    let (sizes, rest) = rest.split_at(k);
    let sizes = sizes.iter().map(|&s| usize::from(s & 0x3f) * [1, 16, 4096, 1][usize::from(s >> 6)]).collect();
    let (flip, rest) = rest.split_at(3);
    let Some(req) = s3_common::decode(rest) else { return };
    let door = s3_common::door();
    let req = s3_common::with_upload(door, req);
    let signer = Signer::new("admin");
    let mut bytes = s3_common::wire(&req, &signer, &Signing::Chunked { sizes }, &door.addr.to_string());
    if flip[2] != 0 {
        let body_start = bytes.windows(4).position(|w| w == b"\r\n\r\n").map_or(0, |p| p + 4);
        let at = body_start + usize::from(u16::from_le_bytes([flip[0], flip[1]]));
        if let Some(b) = bytes.get_mut(at) {
            *b ^= flip[2];
        }
    }
    let answer = endpoint::exchange(door.addr, &bytes, false, endpoint::QUICK);
    s3_common::check(door, &answer);
});
