//! Pruned reads of v6 segments: one bucket's rows, fetched one row group at a time.
//!
//! A v6 manifest gives, for every row group a partition spans, the partition's first and
//! last `(event_time, sort_key)` in it. A bucket read keeps only the groups whose time range
//! meets the bucket's and the read's bounds, and streams them in the read's order: each
//! group is fetched with its own ranged read (checked against its digest), decoded alone,
//! cut to the partition's rows and checked (partition, strict order, first and last rows
//! equal to the manifest's bounds) before any of its rows are handed over. A consumer that
//! stops early (a LIMIT, the latest page of a busy month) never fetches the other groups,
//! and memory holds one group, not the partition. When the read covers the whole bucket,
//! the rows seen in it are counted against the manifest at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::{Array, BinaryArray, TimestampNanosecondArray};
use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;

use super::manifest::{GroupSlice, PartitionEntry, SegmentManifest};
use super::read::{bucket_batches, check_range, footer, ranged, SegmentCache, VerifiedRanges};
use crate::archive::{ArchiveError, ArchiveScan, ArchiveScanMetrics};
use crate::model::envelope::{COL_PARTITION, COL_SORT, COL_TIME};
use crate::model::{envelope_schema, BucketId, EventTime};

/// One partition's rows in one row group: cached, or fetched (footer from the cache when
/// there, the group with one ranged read), verified, decoded and checked.
pub(crate) async fn slice_rows(
    op: &opendal::Operator,
    cache: &SegmentCache,
    m: &SegmentManifest,
    entry: &PartitionEntry,
    slice: &GroupSlice,
    metrics: &ArchiveScanMetrics,
    only: Option<&[u32]>,
) -> Result<RecordBatch, ArchiveError> {
    let cache_key = (
        m.payload_key.clone(),
        entry.partition_key.as_bytes().to_vec(),
        slice.row_group,
        only.map(<[u32]>::to_vec),
    );
    if let Some(b) = cache.cached(&cache_key) {
        return Ok(b);
    }
    let key = m.payload_key.as_str();
    let meta = footer(op, cache, m, metrics).await?;
    if meta.num_row_groups() != m.row_groups.len() {
        return Err(ArchiveError::decode(
            key,
            format!(
                "footer has {} row groups, the manifest {}",
                meta.num_row_groups(),
                m.row_groups.len()
            ),
        ));
    }
    let g = &m.row_groups[slice.row_group];
    let bytes = ranged(op, key, &g.range, metrics).await?;
    check_range(
        key,
        &format!("row group {}", slice.row_group),
        &g.range,
        &bytes,
    )?;
    let input = VerifiedRanges::new(m.byte_length, vec![(g.range.offset, bytes)]);
    let arrow_meta = ArrowReaderMetadata::try_new(meta, ArrowReaderOptions::new())
        .map_err(|e| ArchiveError::decode(key, e))?;
    let file_schema = arrow_meta.schema().clone();
    // A declared table's segment decodes only the value columns the read names (the bytes
    // of the whole row group are fetched and verified either way).
    let projection = crate::archive::parquet::projected_columns(key, &file_schema, only)?;
    let parquet_schema = arrow_meta.metadata().file_metadata().schema_descr_ptr();
    let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(input, arrow_meta)
        .with_row_groups(vec![slice.row_group])
        .with_batch_size(g.rows.max(1) as usize);
    if let Some(cols) = projection {
        builder = builder.with_projection(ProjectionMask::roots(&parquet_schema, cols));
    }
    let reader = builder.build().map_err(|e| ArchiveError::decode(key, e))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| ArchiveError::decode(key, e))?);
    }
    let all = match batches.len() {
        1 => batches.pop().expect("one batch"),
        _ => {
            let schema = batches
                .first()
                .map(|b| b.schema())
                .unwrap_or_else(|| envelope_schema(true));
            datafusion::arrow::compute::concat_batches(&schema, &batches)
                .map_err(|e| ArchiveError::decode(key, e))?
        }
    };
    let all = crate::archive::parquet::decoded_envelope(
        key,
        &file_schema,
        &all,
        m.table_schema_version.is_some(),
        only,
    )?;
    if all.num_rows() as u64 != g.rows || slice.skip + slice.rows > g.rows {
        return Err(ArchiveError::RowCountMismatch {
            key: key.to_string(),
            expected: g.rows,
            actual: all.num_rows() as u64,
        });
    }
    let rows = all.slice(slice.skip as usize, slice.rows as usize);
    check_slice(key, entry, slice, &rows)?;
    cache.keep(cache_key, rows.clone());
    Ok(rows)
}

/// Every row is the partition's, in strictly increasing `(event_time, sort_key)` order,
/// and the first and last are the manifest's bounds of this group.
fn check_slice(
    key: &str,
    entry: &PartitionEntry,
    slice: &GroupSlice,
    rows: &RecordBatch,
) -> Result<(), ArchiveError> {
    let bad = |reason: String| ArchiveError::decode(key, reason);
    let col = |i: usize| -> Result<&BinaryArray, ArchiveError> {
        let c = rows.column(i);
        if c.null_count() > 0 {
            return Err(bad(format!("column {i} holds nulls")));
        }
        c.as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(|| bad(format!("column {i} is not Binary")))
    };
    let (pk, sk) = (col(COL_PARTITION)?, col(COL_SORT)?);
    let t = rows
        .column(COL_TIME)
        .as_any()
        .downcast_ref::<TimestampNanosecondArray>()
        .filter(|a| a.null_count() == 0)
        .ok_or_else(|| bad("event_time is not a Timestamp(ns) without nulls".into()))?;
    let want = entry.partition_key.as_bytes();
    let n = rows.num_rows();
    for i in 0..n {
        if pk.value(i) != want {
            return Err(bad(format!(
                "row {i} of group {} holds partition {}, not {}",
                slice.row_group,
                hex::encode(pk.value(i)),
                entry.partition_key.to_hex()
            )));
        }
        if i > 0 && (t.value(i - 1), sk.value(i - 1)) >= (t.value(i), sk.value(i)) {
            return Err(bad(format!(
                "rows of partition {} out of clustering order in group {} at {i}",
                entry.partition_key.to_hex(),
                slice.row_group
            )));
        }
    }
    if let Some(((ft, fs), (lt, ls))) = &slice.bounds {
        let at = |i: usize| -> Result<(EventTime, &[u8]), ArchiveError> {
            Ok((EventTime::from_nanos(t.value(i))?, sk.value(i)))
        };
        if n == 0 || at(0)? != (*ft, fs.as_bytes()) || at(n - 1)? != (*lt, ls.as_bytes()) {
            return Err(bad(format!(
                "group {} of partition {}: first or last row differs from the manifest's bounds",
                slice.row_group,
                entry.partition_key.to_hex()
            )));
        }
    }
    Ok(())
}

/// The groups of `entry` a read of `bucket` with `req`'s bounds must fetch, in the read's
/// order, and whether the read covers the whole bucket (then its rows are counted).
fn pick(
    entry: &PartitionEntry,
    bucket: &BucketId,
    req: &ArchiveScan,
) -> Result<(Vec<GroupSlice>, bool), ArchiveError> {
    let (bs, be) = bucket.bucket_key.bounds();
    let last = EventTime::from_micros(be.as_micros() - 1)?;
    let Some((lo, hi)) = req.bounds.time_interval() else {
        return Ok((Vec::new(), false));
    };
    let (lo, hi) = (lo.max(bs), hi.min(last));
    if lo > hi {
        return Ok((Vec::new(), false));
    }
    let whole = lo == bs
        && hi == last
        && req.bounds.sort_lower == std::ops::Bound::Unbounded
        && req.bounds.sort_upper == std::ops::Bound::Unbounded
        && req.bounds.after.is_none()
        && req.bounds.before.is_none();
    let mut picked: Vec<GroupSlice> = entry
        .slices
        .iter()
        .filter(|s| match &s.bounds {
            Some(((ft, _), (lt, _))) => *ft <= hi && *lt >= lo,
            None => true,
        })
        .cloned()
        .collect();
    if req.descending {
        picked.reverse();
    }
    Ok((picked, whole))
}

/// One bucket's rows matching `req`, streamed group by group (see the module comment).
pub(crate) fn bucket_stream(
    op: opendal::Operator,
    cache: Arc<SegmentCache>,
    m: Arc<SegmentManifest>,
    bucket: BucketId,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
    let (entry, want) = m.entry_for(&m.payload_key, &bucket)?;
    let entry = Arc::new(entry.clone());
    let (picked, whole) = pick(&entry, &bucket, &req)?;
    ArchiveScanMetrics::add(&metrics.row_groups_total, entry.slices.len() as u64);
    ArchiveScanMetrics::add(
        &metrics.row_groups_pruned,
        (entry.slices.len() - picked.len()) as u64,
    );
    if req.value.filters.is_empty() || m.table_schema_version.is_none() || picked.is_empty() {
        return Ok(slices_stream(
            op, cache, m, entry, bucket, req, metrics, picked, whole, want,
        ));
    }
    // Predicates on value columns: the row groups whose statistics (over every partition
    // in them, so a superset of this one's rows) exclude a match are not fetched. The
    // bucket's rows are then not all seen, so they are not counted.
    Ok(stream::once(async move {
        let key = m.payload_key.clone();
        let meta = footer(&op, &cache, &m, &metrics).await?;
        let arrow = ArrowReaderMetadata::try_new(meta.clone(), ArrowReaderOptions::new())
            .map_err(|e| ArchiveError::decode(&key, e))?;
        let out = crate::archive::parquet::excluded_by_values(
            &key,
            &meta,
            arrow.schema(),
            &req.value.filters,
        )?;
        let before = picked.len();
        let picked: Vec<GroupSlice> = picked
            .into_iter()
            .filter(|s| !out.get(s.row_group).copied().unwrap_or(false))
            .collect();
        let skipped = before - picked.len();
        ArchiveScanMetrics::add(&metrics.row_groups_pruned, skipped as u64);
        let whole = whole && skipped == 0;
        Ok::<_, ArchiveError>(slices_stream(
            op, cache, m, entry, bucket, req, metrics, picked, whole, want,
        ))
    })
    .try_flatten()
    .boxed())
}

/// The rows of the picked slices, streamed in order; with `whole`, counted against `want`
/// at the end.
#[allow(clippy::too_many_arguments)]
fn slices_stream(
    op: opendal::Operator,
    cache: Arc<SegmentCache>,
    m: Arc<SegmentManifest>,
    entry: Arc<PartitionEntry>,
    bucket: BucketId,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
    picked: Vec<GroupSlice>,
    whole: bool,
    want: u64,
) -> BoxStream<'static, Result<RecordBatch, ArchiveError>> {
    let seen = Arc::new(AtomicU64::new(0));
    let (bs, be) = bucket.bucket_key.bounds();
    let (bs, be) = (bs.as_nanos(), be.as_nanos());
    let key = m.payload_key.clone();
    let rows = {
        let (m, entry, seen, metrics) = (m.clone(), entry.clone(), seen.clone(), metrics.clone());
        stream::iter(picked).then(move |slice| {
            let (op, cache, m, entry) = (op.clone(), cache.clone(), m.clone(), entry.clone());
            let (bucket, req, seen, metrics) =
                (bucket.clone(), req.clone(), seen.clone(), metrics.clone());
            async move {
                let only = if req.include_value {
                    req.value.fields.as_deref()
                } else {
                    Some(&[][..])
                };
                let rows = slice_rows(&op, &cache, &m, &entry, &slice, &metrics, only).await?;
                if whole {
                    let t = rows
                        .column(COL_TIME)
                        .as_any()
                        .downcast_ref::<TimestampNanosecondArray>()
                        .expect("checked by slice_rows")
                        .values();
                    let n = t.partition_point(|&v| v < be) - t.partition_point(|&v| v < bs);
                    seen.fetch_add(n as u64, Ordering::Relaxed);
                }
                let batches = bucket_batches(&m.payload_key, &rows, &bucket, &req)?;
                let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                ArchiveScanMetrics::add(&metrics.rows_returned, n as u64);
                Ok::<_, ArchiveError>(batches)
            }
        })
    };
    let check = stream::once(async move {
        let n = seen.load(Ordering::Relaxed);
        if whole && n != want {
            return Err(ArchiveError::RowCountMismatch {
                key,
                expected: want,
                actual: n,
            });
        }
        Ok(Vec::new())
    });
    rows.chain(check)
        .map_ok(|batches| stream::iter(batches.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
}
