//! The chat surface: `channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT`.
//!
//! Channel and message ids are integer keys (see [`crate::model::encode_i64`]), so id
//! ranges become sort-key byte ranges; the message body is the record's value, UTF-8.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BinaryArray, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::scalar::ScalarValue;

use super::{downcast, int_of, Role, SurfaceKind};
use crate::model::{decode_i64, encode_i64, PartitionKey, SortKey};
use crate::provider::ProviderError;

/// The chat surface.
pub(super) struct Chat;

impl SurfaceKind for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn column_names(&self) -> [&'static str; 4] {
        ["channel_id", "timestamp", "id", "content"]
    }

    fn key_field(&self, role: Role) -> Field {
        match role {
            Role::Partition => Field::new("channel_id", DataType::Int64, false),
            Role::Sort => Field::new("id", DataType::Int64, false),
            Role::Value => Field::new("content", DataType::Utf8, false),
            Role::Time => unreachable!("the time column is common to every surface"),
        }
    }

    fn column_from_envelope(
        &self,
        role: Role,
        column: &ArrayRef,
    ) -> Result<ArrayRef, ProviderError> {
        match role {
            Role::Partition => decode_i64_column(column, "channel_id"),
            Role::Sort => decode_i64_column(column, "id"),
            _ => utf8_column(column),
        }
    }

    fn envelope_bytes(
        &self,
        role: Role,
        column: &ArrayRef,
        row: usize,
    ) -> Result<Vec<u8>, ProviderError> {
        Ok(match role {
            Role::Partition => {
                encode_i64(downcast::<Int64Array>(column, "channel_id")?.value(row)).to_vec()
            }
            Role::Sort => encode_i64(downcast::<Int64Array>(column, "id")?.value(row)).to_vec(),
            _ => downcast::<StringArray>(column, "content")?
                .value(row)
                .as_bytes()
                .to_vec(),
        })
    }

    fn partition_of(&self, v: &ScalarValue) -> Option<PartitionKey> {
        Some(PartitionKey::from_i64(int_of(v)?))
    }

    fn sort_key_of(&self, v: &ScalarValue) -> Option<SortKey> {
        Some(SortKey::from_i64(int_of(v)?))
    }

    fn display_key(&self, key: &[u8]) -> String {
        decode_i64(key).map_or_else(|| format!("0x{}", hex::encode(key)), |v| v.to_string())
    }
}

pub(super) fn decode_i64_column(a: &ArrayRef, name: &str) -> Result<ArrayRef, ProviderError> {
    let bin = a.as_any().downcast_ref::<BinaryArray>().ok_or_else(|| {
        ProviderError::Internal(format!("{name} source has type {}", a.data_type()))
    })?;
    // Straight over the offsets: every key must be 8 bytes (a null slot is empty, so it is
    // rejected like any other malformed key).
    let data = bin.value_data();
    let mut out = Vec::with_capacity(bin.len());
    for w in bin.value_offsets().windows(2) {
        let v = &data[w[0] as usize..w[1] as usize];
        let n = decode_i64(v).ok_or_else(|| {
            ProviderError::CorruptRow(format!(
                "{name} key 0x{} is not an 8-byte integer key",
                hex::encode(v)
            ))
        })?;
        out.push(n);
    }
    Ok(Arc::new(Int64Array::from(out)))
}

fn utf8_column(a: &ArrayRef) -> Result<ArrayRef, ProviderError> {
    let bin = a
        .as_any()
        .downcast_ref::<BinaryArray>()
        .ok_or_else(|| ProviderError::Internal(format!("value has type {}", a.data_type())))?;
    // Validated in place: the string array reuses the binary array's buffers.
    let s = StringArray::try_from_binary(bin.clone())
        .map_err(|e| ProviderError::CorruptRow(format!("content is not valid UTF-8 ({e})")))?;
    Ok(Arc::new(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_columns_decode_slices_and_reject_malformed_keys() {
        let keys: Vec<[u8; 8]> = [-5i64, 0, 7, i64::MAX].map(encode_i64).to_vec();
        let mut refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let whole: ArrayRef = Arc::new(BinaryArray::from(refs.clone()));
        let got = decode_i64_column(&whole.slice(1, 3), "id").unwrap();
        let got = got.as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(got.values().as_ref(), &[0, 7, i64::MAX]);
        refs[2] = b"abc";
        let bad: ArrayRef = Arc::new(BinaryArray::from(refs));
        match decode_i64_column(&bad, "id") {
            Err(ProviderError::CorruptRow(m)) => assert!(m.contains("id key 0x616263"), "{m}"),
            other => panic!("expected a corrupt-row error, got {other:?}"),
        }
    }
}
