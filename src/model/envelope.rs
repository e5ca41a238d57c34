//! The columnar form of records: the envelope batch (`partition_key`, `event_time`,
//! `sort_key` and, when asked for, `value`) that every tier hands to the layers above it.
//!
//! The archive stores records in this shape, and hot pages travel in it too, so a scan sees
//! one batch type whatever tier answered. Building a hot page straight into an
//! [`EnvelopeBuilder`] from the bytes a database row lends, rather than through owned
//! [`Record`]s, saves three allocations and a copy per row on the hottest read path.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, PrimitiveArray, TimestampNanosecondArray,
};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::datatypes::{
    DataType, Field, Schema, SchemaRef, TimeUnit, TimestampNanosecondType,
};
use datafusion::arrow::record_batch::RecordBatch;

use super::{ClusteringKey, EventTime, ModelError, Record, SortKey};

/// Column of `partition_key` in the envelope.
pub const COL_PARTITION: usize = 0;
/// Column of `event_time` (nanoseconds, UTC) in the envelope.
pub const COL_TIME: usize = 1;
/// Column of `sort_key` in the envelope.
pub const COL_SORT: usize = 2;
/// Column of `value` in the envelope, when present.
pub const COL_VALUE: usize = 3;

/// The record schema v2 envelope: `partition_key Binary, event_time Timestamp(ns, "UTC"),
/// sort_key Binary, value Binary`, all non-null; `include_value = false` drops `value`.
pub fn envelope_schema(include_value: bool) -> SchemaRef {
    // Built once: every hot page and archived batch names one of these two schemas.
    static WITH_VALUE: OnceLock<SchemaRef> = OnceLock::new();
    static KEYS_ONLY: OnceLock<SchemaRef> = OnceLock::new();
    let cell = if include_value {
        &WITH_VALUE
    } else {
        &KEYS_ONLY
    };
    cell.get_or_init(|| {
        let mut fields = vec![
            Field::new("partition_key", DataType::Binary, false),
            Field::new("event_time", time_type(), false),
            Field::new("sort_key", DataType::Binary, false),
        ];
        if include_value {
            fields.push(Field::new("value", DataType::Binary, false));
        }
        Arc::new(Schema::new(fields))
    })
    .clone()
}

/// `Timestamp(ns, "UTC")`, with its time zone string allocated once for the process.
fn time_type() -> DataType {
    static TYPE: OnceLock<DataType> = OnceLock::new();
    TYPE.get_or_init(|| DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())))
        .clone()
}

/// Accumulates envelope rows in clustering order and finishes them as one batch.
#[derive(Debug)]
pub struct EnvelopeBuilder {
    partition: BinaryBuilder,
    times: Vec<i64>,
    sort: BinaryBuilder,
    value: Option<BinaryBuilder>,
}

impl EnvelopeBuilder {
    /// A builder for about `rows` rows whose keys and values total about `bytes` bytes;
    /// `include_value = false` builds the keys-only envelope and ignores values.
    pub fn with_capacity(rows: usize, bytes: usize, include_value: bool) -> Self {
        Self {
            partition: BinaryBuilder::with_capacity(rows, rows * 8),
            times: Vec::with_capacity(rows),
            sort: BinaryBuilder::with_capacity(rows, rows * 8),
            value: include_value.then(|| BinaryBuilder::with_capacity(rows, bytes)),
        }
    }

    /// Appends one row. The caller has validated the keys (see [`SortKey::check`]); `value`
    /// is ignored by a keys-only builder.
    pub fn push(&mut self, partition: &[u8], time: EventTime, sort: &[u8], value: &[u8]) {
        self.partition.append_value(partition);
        self.times.push(time.as_nanos());
        self.sort.append_value(sort);
        if let Some(v) = &mut self.value {
            v.append_value(value);
        }
    }

    /// Appends a record.
    pub fn push_record(&mut self, r: &Record) {
        self.push(
            r.partition_key.as_bytes(),
            r.event_time,
            r.sort_key.as_bytes(),
            &r.value,
        );
    }

    /// Rows appended so far.
    pub fn len(&self) -> usize {
        self.times.len()
    }

    /// Whether no row was appended.
    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// The rows as one envelope batch.
    pub fn finish(mut self) -> RecordBatch {
        let include_value = self.value.is_some();
        let times: TimestampNanosecondArray =
            PrimitiveArray::new(ScalarBuffer::from(self.times), None).with_data_type(time_type());
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(self.partition.finish()),
            Arc::new(times),
            Arc::new(self.sort.finish()),
        ];
        if let Some(v) = &mut self.value {
            cols.push(Arc::new(v.finish()));
        }
        RecordBatch::try_new(envelope_schema(include_value), cols)
            .expect("columns built to the envelope schema, of equal length")
    }
}

/// Records as one envelope batch, in the given order.
pub fn records_to_batch(records: &[Record], include_value: bool) -> RecordBatch {
    let bytes = if include_value {
        records.iter().map(|r| r.value.len()).sum()
    } else {
        0
    };
    let mut b = EnvelopeBuilder::with_capacity(records.len(), bytes, include_value);
    for r in records {
        b.push_record(r);
    }
    b.finish()
}

/// The clustering key of an envelope batch's last row (`None` when it is empty): where the
/// next page of a keyset scan starts.
pub fn last_clustering_key(batch: &RecordBatch) -> Result<Option<ClusteringKey>, ModelError> {
    let n = batch.num_rows();
    if n == 0 {
        return Ok(None);
    }
    let shape = |what: &str| ModelError::Envelope(what.to_string());
    let time = batch
        .column_by_name("event_time")
        .and_then(|c| c.as_primitive_opt::<TimestampNanosecondType>())
        .ok_or_else(|| shape("no event_time column of Timestamp(ns)"))?;
    let sort = batch
        .column_by_name("sort_key")
        .and_then(|c| c.as_binary_opt::<i32>())
        .ok_or_else(|| shape("no sort_key column of Binary"))?;
    if time.is_null(n - 1) || sort.is_null(n - 1) {
        return Err(shape("a null clustering key"));
    }
    Ok(Some(ClusteringKey {
        event_time: EventTime::from_nanos(time.value(n - 1))?,
        sort_key: SortKey::new(sort.value(n - 1).to_vec())?,
    }))
}

/// Envelope batch rows as owned records. The batch must carry all four columns, non-null: a
/// projection without `value` cannot become records without inventing values.
pub fn batch_to_records(batch: &RecordBatch) -> Result<Vec<Record>, ModelError> {
    fn binary<'a>(
        batch: &'a RecordBatch,
        name: &str,
    ) -> Result<&'a datafusion::arrow::array::BinaryArray, ModelError> {
        let col = batch.column_by_name(name).ok_or_else(|| {
            ModelError::Envelope(format!("envelope batch has no `{name}` column"))
        })?;
        if col.null_count() > 0 {
            return Err(ModelError::Envelope(format!("`{name}` holds nulls")));
        }
        col.as_binary_opt::<i32>().ok_or_else(|| {
            ModelError::Envelope(format!(
                "`{name}` has type {}, not the envelope type",
                col.data_type()
            ))
        })
    }
    let pk = binary(batch, "partition_key")?;
    let sk = binary(batch, "sort_key")?;
    let v = binary(batch, "value")?;
    let t = batch
        .column_by_name("event_time")
        .ok_or_else(|| ModelError::Envelope("envelope batch has no `event_time` column".into()))?;
    if t.null_count() > 0 {
        return Err(ModelError::Envelope("`event_time` holds nulls".into()));
    }
    let t = t
        .as_primitive_opt::<TimestampNanosecondType>()
        .ok_or_else(|| {
            ModelError::Envelope(format!(
                "`event_time` has type {}, not the envelope type",
                t.data_type()
            ))
        })?;
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        out.push(Record {
            partition_key: super::PartitionKey::new(pk.value(i))?,
            event_time: EventTime::from_nanos(t.value(i))?,
            sort_key: SortKey::new(sk.value(i))?,
            value: v.value(i).to_vec(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PartitionKey;

    fn rec(t: i64, s: &[u8], v: &str) -> Record {
        Record {
            partition_key: PartitionKey::new(vec![1, 2]).unwrap(),
            event_time: EventTime::from_micros(t).unwrap(),
            sort_key: SortKey::new(s.to_vec()).unwrap(),
            value: v.as_bytes().to_vec(),
        }
    }

    #[test]
    fn builder_and_records_agree_and_last_key_is_the_last_row() {
        let rs = vec![rec(5, b"a", "x"), rec(5, b"b", ""), rec(9, b"", "zz")];
        for include_value in [true, false] {
            let batch = records_to_batch(&rs, include_value);
            assert_eq!(batch.schema(), envelope_schema(include_value));
            assert_eq!(batch.num_rows(), 3);
            let times = batch
                .column(COL_TIME)
                .as_primitive::<TimestampNanosecondType>();
            assert_eq!(times.values().as_ref(), &[5_000, 5_000, 9_000]);
            assert_eq!(batch.column(COL_SORT).as_binary::<i32>().value(1), b"b");
            assert_eq!(
                batch.column(COL_PARTITION).as_binary::<i32>().value(2),
                &[1, 2]
            );
            if include_value {
                assert_eq!(batch.column(COL_VALUE).as_binary::<i32>().value(2), b"zz");
            }
            let last = last_clustering_key(&batch).unwrap().unwrap();
            assert_eq!(last, rs[2].clustering_key());
        }
        assert_eq!(
            last_clustering_key(&records_to_batch(&[], true)).unwrap(),
            None
        );
    }

    #[test]
    fn records_round_trip_and_a_batch_without_values_is_refused() {
        let rs = vec![rec(5, b"a", "x"), rec(9, b"", "zz")];
        assert_eq!(batch_to_records(&records_to_batch(&rs, true)).unwrap(), rs);
        let e = batch_to_records(&records_to_batch(&rs, false)).unwrap_err();
        assert!(
            matches!(e, ModelError::Envelope(ref m) if m.contains("value")),
            "{e}"
        );
    }

    #[test]
    fn last_key_of_a_batch_without_keys_is_a_typed_error() {
        let batch = records_to_batch(&[rec(1, b"a", "v")], true)
            .project(&[COL_PARTITION, COL_VALUE])
            .unwrap();
        let e = last_clustering_key(&batch).unwrap_err();
        assert!(
            matches!(e, ModelError::Envelope(ref m) if m.contains("event_time")),
            "{e}"
        );
    }
}
