//! Encoding of frame metadata with postcard (a compact, documented serde format:
//! varint integers, length-prefixed strings and sequences).

use crate::error::{Code, Error};
use serde::{de::DeserializeOwned, Serialize};

/// Encodes a metadata value.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("metadata types always serialize")
}

/// The length of [`encode`]'s output, without building it.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> usize {
    postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
        .expect("metadata types always serialize")
}

/// Decodes a metadata value; the whole input must be consumed, so trailing junk is an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((v, [])) => Ok(v),
        Ok(_) => Err(Error::new(Code::BAD_REQUEST, "trailing bytes after metadata")),
        Err(e) => Err(Error::new(Code::BAD_REQUEST, format!("malformed metadata: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Value;

    #[test]
    fn encoded_len_is_the_length_of_the_encoding() {
        let v = vec![Value::Int(-300), Value::Str("é".repeat(200)), Value::Map(vec![("k".into(), Value::Nil)])];
        assert_eq!(encoded_len(&v), encode(&v).len());
        assert_eq!(encoded_len(&v[..]), encode(&v).len());
    }
}
