//! The scan's per-partition metrics, named by tier (`hot_rows`, `archived_batches`, ...,
//! which `EXPLAIN ANALYZE` shows), and the byte size of a batch that both they and the
//! per-query byte limit count. Kept apart from the plan node so that one reads as the
//! translation it is.

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::bit_util;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder};

use crate::archive::ArchiveScanMetrics;
use crate::table::{BucketChunk, Tier};

/// Per-partition metrics, named by tier.
#[derive(Clone)]
pub(super) struct TierMetrics {
    hot_buckets: Count,
    hot_rows: Count,
    hot_pages: Count,
    hot_bytes: Count,
    archived_buckets: Count,
    archived_rows: Count,
    archived_batches: Count,
    archived_bytes: Count,
    /// The object store's side of the archived reads (requests, bytes fetched, row groups
    /// and pages skipped), copied from the counters the archive readers keep.
    object_reads: Gauge,
    object_bytes: Gauge,
    row_groups: Gauge,
    row_groups_pruned: Gauge,
    pages_pruned: Gauge,
}

impl TierMetrics {
    pub(super) fn new(m: &ExecutionPlanMetricsSet, p: usize) -> Self {
        let c = |name: &'static str| MetricBuilder::new(m).counter(name, p);
        let g = |name: &'static str| MetricBuilder::new(m).gauge(name, p);
        Self {
            hot_buckets: c("hot_buckets"),
            hot_rows: c("hot_rows"),
            hot_pages: c("hot_pages"),
            hot_bytes: c("hot_bytes"),
            archived_buckets: c("archived_buckets"),
            archived_rows: c("archived_rows"),
            archived_batches: c("archived_batches"),
            archived_bytes: c("archived_bytes"),
            object_reads: g("archived_object_reads"),
            object_bytes: g("archived_object_bytes"),
            row_groups: g("archived_row_groups"),
            row_groups_pruned: g("archived_row_groups_pruned"),
            pages_pruned: g("archived_pages_pruned"),
        }
    }

    /// Brings the object-store figures up to what the partition's archive readers have
    /// counted so far. Gauges, set rather than added, so calling it after every chunk and
    /// once more at the end counts each request once.
    pub(super) fn sync(&self, archive: &ArchiveScanMetrics) {
        let s = archive.snapshot();
        let n = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        self.object_reads.set(n(s.requests));
        self.object_bytes.set(n(s.bytes_read));
        self.row_groups.set(n(s.row_groups_total));
        self.row_groups_pruned.set(n(s.row_groups_pruned));
        self.pages_pruned.set(n(s.pages_pruned));
    }

    pub(super) fn record(&self, chunk: &BucketChunk, bytes: usize) {
        let rows = chunk.batch.num_rows();
        let buckets = chunk.buckets as usize;
        match chunk.tier {
            Tier::Hot => {
                self.hot_buckets.add(buckets);
                self.hot_rows.add(rows);
                self.hot_pages.add(chunk.pages as usize);
                self.hot_bytes.add(bytes);
            }
            Tier::Archived => {
                self.archived_buckets.add(buckets);
                self.archived_rows.add(rows);
                self.archived_batches.add(1);
                self.archived_bytes.add(bytes);
            }
        }
    }
}

/// The bytes a batch's rows occupy (what `ArrayData::get_slice_memory_size` reports), for
/// the byte limit and the metrics. The scan's own column types are measured from their
/// offsets and widths directly: going through `to_data()` copied every column's buffer list
/// twice per chunk, a visible share of a hot page.
pub(super) fn batch_bytes(b: &RecordBatch) -> usize {
    b.columns().iter().map(array_bytes).sum()
}

fn array_bytes(a: &ArrayRef) -> usize {
    let len = a.len();
    // Arrow drops a null buffer without nulls when it builds the array data, so only a
    // buffer with a null in it is counted.
    let nulls = a
        .nulls()
        .filter(|n| n.null_count() > 0)
        .map_or(0, |_| bit_util::ceil(len, 8));
    match a.data_type() {
        DataType::Binary => {
            let o = a.as_binary::<i32>().value_offsets();
            (o[len] - o[0]) as usize + (len + 1) * 4 + nulls
        }
        DataType::Utf8 => {
            let o = a.as_string::<i32>().value_offsets();
            (o[len] - o[0]) as usize + (len + 1) * 4 + nulls
        }
        t if t.is_primitive() => t.primitive_width().map_or(0, |w| w * len) + nulls,
        _ => a.to_data().get_slice_memory_size().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn batch_bytes_match_arrow_slice_sizes() {
        use datafusion::arrow::array::{
            BinaryArray, Int64Array, StringArray, TimestampMicrosecondArray,
        };
        let cols: Vec<ArrayRef> = vec![
            Arc::new(BinaryArray::from(vec![
                Some(b"ab".as_ref()),
                None,
                Some(b"cdef".as_ref()),
                Some(b"".as_ref()),
            ])),
            Arc::new(StringArray::from(vec!["x", "yy", "zzz", "w"])),
            Arc::new(Int64Array::from(vec![Some(1), Some(2), None, Some(4)])),
            Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3, 4]).with_timezone("UTC")),
            Arc::new(datafusion::arrow::array::BooleanArray::from(vec![
                true, false, true, true,
            ])),
        ];
        for col in &cols {
            for (offset, len) in [(0, 4), (1, 2), (3, 1), (2, 0)] {
                let part = col.slice(offset, len);
                assert_eq!(
                    array_bytes(&part),
                    part.to_data().get_slice_memory_size().unwrap(),
                    "{} sliced {offset}+{len}",
                    part.data_type()
                );
            }
        }
    }
}
