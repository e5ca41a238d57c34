//! SQL surfaces: how the envelope `(partition_key, event_time, sort_key, value)` appears as
//! SQL columns, and back.
//!
//! The chat surface shows `channel_id BIGINT, timestamp TIMESTAMP(µs, UTC), id BIGINT,
//! content TEXT`. Integer keys are stored as 8 bytes, big-endian, with the sign bit flipped,
//! so that byte order equals numeric order: id ranges become sort-key byte ranges and
//! channels list in numeric order. The raw surface shows the envelope as it is.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, Int64Array, StringArray, TimestampMicrosecondArray,
    TimestampNanosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};

use super::ProviderError;
use crate::model::{EventTime, PartitionKey, Record, SortKey};

/// The time zone of every timestamp column.
pub const UTC: &str = "UTC";

/// How a table is shown in SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Surface {
    /// `channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT`.
    Chat,
    /// `partition_key BYTEA, event_time TIMESTAMPTZ, sort_key BYTEA, value BYTEA`.
    Raw,
}

/// The role of a surface column in the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The partition key column.
    Partition,
    /// The event time column.
    Time,
    /// The sort key column.
    Sort,
    /// The value column.
    Value,
}

impl Surface {
    /// Parses a surface name (`chat` or `raw`).
    pub fn parse(name: &str) -> Result<Self, ProviderError> {
        match name {
            "chat" => Ok(Self::Chat),
            "raw" => Ok(Self::Raw),
            other => Err(ProviderError::UnknownSurface(other.to_string())),
        }
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Raw => "raw",
        }
    }

    /// Column names in schema order (partition, time, sort, value).
    pub fn column_names(self) -> [&'static str; 4] {
        match self {
            Self::Chat => ["channel_id", "timestamp", "id", "content"],
            Self::Raw => ["partition_key", "event_time", "sort_key", "value"],
        }
    }

    /// The role of a column by name.
    pub fn role_of(self, column: &str) -> Option<Role> {
        let names = self.column_names();
        let roles = [Role::Partition, Role::Time, Role::Sort, Role::Value];
        names.iter().position(|n| *n == column).map(|i| roles[i])
    }

    /// The role of the column at a schema index.
    pub fn role_at(index: usize) -> Role {
        [Role::Partition, Role::Time, Role::Sort, Role::Value][index]
    }

    /// The full SQL schema. Every column is non-null: the envelope has no nulls.
    pub fn schema(self) -> SchemaRef {
        let ts = micros_utc();
        let fields = match self {
            Self::Chat => vec![
                Field::new("channel_id", DataType::Int64, false),
                Field::new("timestamp", ts, false),
                Field::new("id", DataType::Int64, false),
                Field::new("content", DataType::Utf8, false),
            ],
            Self::Raw => vec![
                Field::new("partition_key", DataType::Binary, false),
                Field::new("event_time", ts, false),
                Field::new("sort_key", DataType::Binary, false),
                Field::new("value", DataType::Binary, false),
            ],
        };
        Arc::new(Schema::new(fields))
    }

    /// Converts envelope batches (as the table streams them) into this surface's columns,
    /// keeping only `projection` (indices into [`Self::schema`]).
    pub fn envelope_to_surface(
        self,
        envelope: &RecordBatch,
        projection: &[usize],
        out_schema: &SchemaRef,
    ) -> Result<RecordBatch, ProviderError> {
        let col = |name: &str| {
            envelope
                .column_by_name(name)
                .ok_or_else(|| ProviderError::Internal(format!("envelope batch lacks {name}")))
        };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(projection.len());
        for &i in projection {
            let arr: ArrayRef = match (self, Self::role_at(i)) {
                (_, Role::Time) => time_to_micros(col("event_time")?)?,
                (Self::Chat, Role::Partition) => {
                    decode_i64_column(col("partition_key")?, "channel_id")?
                }
                (Self::Chat, Role::Sort) => decode_i64_column(col("sort_key")?, "id")?,
                (Self::Chat, Role::Value) => utf8_column(col("value")?)?,
                (Self::Raw, Role::Partition) => col("partition_key")?.clone(),
                (Self::Raw, Role::Sort) => col("sort_key")?.clone(),
                (Self::Raw, Role::Value) => col("value")?.clone(),
            };
            columns.push(arr);
        }
        let opts = RecordBatchOptions::new().with_row_count(Some(envelope.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            out_schema.clone(),
            columns,
            &opts,
        )?)
    }

    /// Converts a batch in this surface's full schema into records (for INSERT).
    pub fn batch_to_records(self, batch: &RecordBatch) -> Result<Vec<Record>, ProviderError> {
        let names = self.column_names();
        let get = |i: usize| {
            batch
                .column_by_name(names[i])
                .ok_or_else(|| ProviderError::InvalidInsert(format!("missing column {}", names[i])))
        };
        let (p, t, s, v) = (get(0)?, get(1)?, get(2)?, get(3)?);
        for (i, c) in [p, t, s, v].iter().enumerate() {
            if c.null_count() > 0 {
                return Err(ProviderError::InvalidInsert(format!(
                    "column {} must not be NULL",
                    names[i]
                )));
            }
        }
        let times = micros_of(t)?;
        let mut out = Vec::with_capacity(batch.num_rows());
        for (row, &micros) in times.iter().enumerate() {
            let (pk, sk, value) = match self {
                Self::Chat => {
                    let p = downcast::<Int64Array>(p, "channel_id")?.value(row);
                    let s = downcast::<Int64Array>(s, "id")?.value(row);
                    let v = downcast::<StringArray>(v, "content")?.value(row);
                    (
                        encode_i64(p).to_vec(),
                        encode_i64(s).to_vec(),
                        v.as_bytes().to_vec(),
                    )
                }
                Self::Raw => (
                    downcast::<BinaryArray>(p, "partition_key")?
                        .value(row)
                        .to_vec(),
                    downcast::<BinaryArray>(s, "sort_key")?.value(row).to_vec(),
                    downcast::<BinaryArray>(v, "value")?.value(row).to_vec(),
                ),
            };
            out.push(Record {
                partition_key: PartitionKey::new(pk)?,
                event_time: EventTime::from_micros(micros)?,
                sort_key: SortKey::new(sk)?,
                value,
            });
        }
        Ok(out)
    }

    /// The partition key of a partition-column literal value of this surface.
    pub fn partition_key_of_i64(value: i64) -> PartitionKey {
        PartitionKey::new(encode_i64(value).to_vec()).expect("8 bytes is a valid key")
    }
}

/// Order-preserving encoding of an `i64`: big-endian with the sign bit flipped.
pub fn encode_i64(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1u64 << 63)).to_be_bytes()
}

/// Inverse of [`encode_i64`]; `None` unless exactly 8 bytes.
pub fn decode_i64(bytes: &[u8]) -> Option<i64> {
    let arr: [u8; 8] = bytes.try_into().ok()?;
    Some((u64::from_be_bytes(arr) ^ (1u64 << 63)) as i64)
}

fn downcast<'a, T: 'static>(a: &'a ArrayRef, name: &str) -> Result<&'a T, ProviderError> {
    a.as_any().downcast_ref::<T>().ok_or_else(|| {
        ProviderError::InvalidInsert(format!("column {name} has type {}", a.data_type()))
    })
}

fn micros_of(a: &ArrayRef) -> Result<Vec<i64>, ProviderError> {
    match a.data_type() {
        DataType::Timestamp(TimeUnit::Microsecond, _) => Ok(a
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .expect("checked type")
            .values()
            .to_vec()),
        other => Err(ProviderError::InvalidInsert(format!(
            "timestamp column has type {other}, expected Timestamp(µs, UTC)"
        ))),
    }
}

fn time_to_micros(a: &ArrayRef) -> Result<ArrayRef, ProviderError> {
    let ns = a
        .as_any()
        .downcast_ref::<TimestampNanosecondArray>()
        .ok_or_else(|| ProviderError::Internal(format!("event_time has type {}", a.data_type())))?;
    let us: TimestampMicrosecondArray = ns.unary(|v| v.div_euclid(1_000));
    Ok(Arc::new(us.with_data_type(micros_utc())))
}

/// `Timestamp(µs, "UTC")`, its time zone string allocated once (every hot page converts
/// its times into this type).
fn micros_utc() -> DataType {
    static TYPE: OnceLock<DataType> = OnceLock::new();
    TYPE.get_or_init(|| DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())))
        .clone()
}

fn decode_i64_column(a: &ArrayRef, name: &str) -> Result<ArrayRef, ProviderError> {
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
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn integer_encoding_preserves_order(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(a.cmp(&b), encode_i64(a).cmp(&encode_i64(b)));
            prop_assert_eq!(decode_i64(&encode_i64(a)), Some(a));
        }
    }

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
    }
}
