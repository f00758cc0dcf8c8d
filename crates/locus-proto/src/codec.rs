//! Encoding of frame metadata with postcard (a compact, documented serde format:
//! varint integers, length-prefixed strings and sequences).

use crate::error::{Code, Error};
use serde::{de::DeserializeOwned, Serialize};

/// Encodes a metadata value.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("metadata types always serialize")
}

/// Decodes a metadata value; the whole input must be consumed, so trailing junk is an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((v, [])) => Ok(v),
        Ok(_) => Err(Error::new(Code::BAD_REQUEST, "trailing bytes after metadata")),
        Err(e) => Err(Error::new(Code::BAD_REQUEST, format!("malformed metadata: {e}"))),
    }
}
