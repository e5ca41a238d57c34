//! Delete and edit records applied to archived rows, above the archive reader.
//!
//! Archived objects (per-bucket payloads and segments alike) are immutable, so a `DELETE` or
//! `UPDATE` of an archived row is recorded in the hot store as a mask
//! ([`RowMask`](crate::store::RowMask)), and every archived read of the bucket applies the
//! bucket's masks to the batches the archive reader returns: a deleted row is dropped, an
//! edited row's value replaced. The masks are read from the hot store at the start of each
//! archived bucket read, or of each run of buckets read as one (one statement for the run's
//! buckets), never cached, so a statement is visible to every read that starts after it
//! returns. Masks only ever change values and remove rows; the keys a scan's
//! bounds and the archive's pruning work on are never changed, so pruning cannot skip a
//! row an edit made match (a filter on the value is applied above the scan, and a bucket
//! with an edit is read without the value predicates an archived read may otherwise apply
//! early).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, BooleanArray, TimestampNanosecondArray,
};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;

use crate::store::RowMask;

/// One bucket's masks, by clustering key (event time in nanoseconds, as the envelope holds
/// it, and sort key).
#[derive(Debug, Default, Clone)]
pub(super) struct Masks {
    rows: HashMap<(i64, Vec<u8>), Option<Vec<u8>>>,
}

impl Masks {
    pub(super) fn new(masks: Vec<RowMask>) -> Self {
        Self {
            rows: masks
                .into_iter()
                .map(|m| {
                    let nanos = m.event_time.as_micros().saturating_mul(1_000);
                    ((nanos, m.sort_key.as_bytes().to_vec()), m.value)
                })
                .collect(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Whether any row's value is replaced (an `UPDATE`): its archived value then decides
    /// nothing, so no predicate on value columns may be applied below the masks.
    pub(super) fn has_edits(&self) -> bool {
        self.rows.values().any(Option::is_some)
    }

    /// `batch` (envelope columns, with `event_time` and `sort_key`) with deleted rows
    /// dropped and edited values replaced.
    pub(super) fn apply(&self, batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
        if self.is_empty() || batch.num_rows() == 0 {
            return Ok(batch);
        }
        let missing = |name: &str| {
            ArrowError::SchemaError(format!("masked archived batch lacks a usable `{name}`"))
        };
        let times = batch
            .column_by_name("event_time")
            .and_then(|c| c.as_any().downcast_ref::<TimestampNanosecondArray>())
            .ok_or_else(|| missing("event_time"))?;
        let sorts = batch
            .column_by_name("sort_key")
            .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
            .ok_or_else(|| missing("sort_key"))?;
        let value_at = batch.schema().index_of("value").ok();
        let values = value_at.map(|i| batch.column(i).clone());
        let values = values
            .as_ref()
            .map(|v| {
                v.as_any()
                    .downcast_ref::<BinaryArray>()
                    .ok_or_else(|| missing("value"))
            })
            .transpose()?;
        let mut keep = Vec::with_capacity(batch.num_rows());
        let mut edited: Option<BinaryBuilder> = None;
        let mut key = (0i64, Vec::new());
        for row in 0..batch.num_rows() {
            key.0 = times.value(row);
            key.1.clear();
            key.1.extend_from_slice(sorts.value(row));
            let mask = self.rows.get(&key);
            keep.push(!matches!(mask, Some(None)));
            if let Some(values) = values {
                if let Some(Some(new)) = mask {
                    let b = edited.get_or_insert_with(|| {
                        let mut b = BinaryBuilder::with_capacity(batch.num_rows(), 0);
                        for r in 0..row {
                            b.append_value(values.value(r));
                        }
                        b
                    });
                    b.append_value(new);
                } else if let Some(b) = edited.as_mut() {
                    b.append_value(values.value(row));
                }
            }
        }
        let batch = match (edited, value_at) {
            (Some(mut b), Some(i)) => {
                let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
                columns[i] = Arc::new(b.finish());
                RecordBatch::try_new(batch.schema(), columns)?
            }
            _ => batch,
        };
        if keep.iter().all(|k| *k) {
            return Ok(batch);
        }
        filter_record_batch(&batch, &BooleanArray::from(keep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{records_to_batch, EventTime, PartitionKey, Record, SortKey};

    fn rec(t: i64, s: u8, v: &str) -> Record {
        Record {
            partition_key: PartitionKey::from_i64(1),
            event_time: EventTime::from_micros(t).unwrap(),
            sort_key: SortKey::new(vec![s]).unwrap(),
            value: v.as_bytes().to_vec(),
        }
    }

    fn values(b: &RecordBatch) -> Vec<String> {
        let v = b
            .column_by_name("value")
            .unwrap()
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        (0..v.len())
            .map(|i| String::from_utf8(v.value(i).to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn deletes_drop_rows_and_edits_replace_values_by_exact_key() {
        let batch = records_to_batch(
            &[
                rec(10, 1, "a"),
                rec(10, 2, "b"),
                rec(11, 1, "c"),
                rec(12, 1, "d"),
            ],
            true,
        );
        let masks = Masks::new(vec![
            RowMask {
                event_time: EventTime::from_micros(10).unwrap(),
                sort_key: SortKey::new(vec![2]).unwrap(),
                value: None,
            },
            RowMask {
                event_time: EventTime::from_micros(12).unwrap(),
                sort_key: SortKey::new(vec![1]).unwrap(),
                value: Some(b"D".to_vec()),
            },
            // Same time, other key; and a key this batch does not hold.
            RowMask {
                event_time: EventTime::from_micros(11).unwrap(),
                sort_key: SortKey::new(vec![9]).unwrap(),
                value: None,
            },
        ]);
        let out = masks.apply(batch).unwrap();
        assert_eq!(values(&out), ["a", "c", "D"]);
        // Without values (a projection of keys only), deletes still apply.
        let keys_only = records_to_batch(&[rec(10, 1, "a"), rec(10, 2, "b")], false);
        assert_eq!(masks.apply(keys_only).unwrap().num_rows(), 1);
    }
}
