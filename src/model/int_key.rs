//! Integer keys: how a signed 64-bit integer becomes an opaque partition or sort key.
//!
//! Keys are compared as bytes everywhere (the hot store's indexes, the archive's clustering
//! order, bucket listings), so an integer is stored as 8 bytes, big-endian, with the sign bit
//! flipped: byte order is then numeric order, an id range is a sort-key byte range, and
//! channels list in numeric order. Every surface, tool and test that turns an integer into a
//! key uses this one encoding.

use super::{PartitionKey, SortKey};

/// Order-preserving encoding of an `i64`: big-endian with the sign bit flipped.
pub fn encode_i64(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1u64 << 63)).to_be_bytes()
}

/// Inverse of [`encode_i64`]; `None` unless exactly 8 bytes.
pub fn decode_i64(bytes: &[u8]) -> Option<i64> {
    let arr: [u8; 8] = bytes.try_into().ok()?;
    Some((u64::from_be_bytes(arr) ^ (1u64 << 63)) as i64)
}

impl PartitionKey {
    /// The partition key of an integer (see [`encode_i64`]).
    pub fn from_i64(value: i64) -> Self {
        Self::new(encode_i64(value).to_vec()).expect("8 bytes is a valid partition key")
    }
}

impl SortKey {
    /// The sort key of an integer (see [`encode_i64`]).
    pub fn from_i64(value: i64) -> Self {
        Self::new(encode_i64(value).to_vec()).expect("8 bytes is a valid sort key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn integer_encoding_preserves_order(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(a.cmp(&b), encode_i64(a).cmp(&encode_i64(b)));
            prop_assert_eq!(decode_i64(&encode_i64(a)), Some(a));
        }
    }

    #[test]
    fn encoding_edges() {
        assert_eq!(encode_i64(i64::MIN), [0; 8]);
        assert_eq!(
            encode_i64(-1),
            [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
        assert_eq!(encode_i64(0), [0x80, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_i64(i64::MAX), [0xff; 8]);
        assert_eq!(decode_i64(&[1, 2, 3]), None);
        assert_eq!(PartitionKey::from_i64(-1).as_bytes(), &encode_i64(-1));
        assert_eq!(SortKey::from_i64(7).as_bytes(), &encode_i64(7));
    }
}
