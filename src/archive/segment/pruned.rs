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
use super::read::{
    bucket_batches, bucket_interval, check_range, footer, range_batches, ranged, time_range,
    SegmentCache, VerifiedRanges,
};
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

/// [`slice_rows`] with the value fields `req` reads (none when it takes no value).
async fn read_slice(
    op: &opendal::Operator,
    cache: &SegmentCache,
    m: &SegmentManifest,
    entry: &PartitionEntry,
    slice: &GroupSlice,
    metrics: &ArchiveScanMetrics,
    req: &ArchiveScan,
) -> Result<RecordBatch, ArchiveError> {
    let only = if req.include_value {
        req.value.fields.as_deref()
    } else {
        Some(&[][..])
    };
    slice_rows(op, cache, m, entry, slice, metrics, only).await
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
    let Some((lo, hi, whole)) = bucket_interval(bucket, req)? else {
        return Ok((Vec::new(), false));
    };
    let mut picked = meeting(entry, &[(lo, hi)]);
    if req.descending {
        picked.reverse();
    }
    Ok((picked, whole))
}

/// The slices of `entry` whose rows may fall in one of `intervals` (all of them in a v5
/// manifest, which has no bounds per slice), in file order.
fn meeting(entry: &PartitionEntry, intervals: &[(EventTime, EventTime)]) -> Vec<GroupSlice> {
    entry
        .slices
        .iter()
        .filter(|s| match &s.bounds {
            Some(((ft, _), (lt, _))) => intervals.iter().any(|(lo, hi)| ft <= hi && lt >= lo),
            None => true,
        })
        .cloned()
        .collect()
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
        let (picked, skipped) = by_values(&op, &cache, &m, &req, &metrics, picked).await?;
        let whole = whole && skipped == 0;
        Ok::<_, ArchiveError>(slices_stream(
            op, cache, m, entry, bucket, req, metrics, picked, whole, want,
        ))
    })
    .try_flatten()
    .boxed())
}

/// `picked` without the row groups whose statistics exclude every match of the read's
/// value predicates, and how many were left out (counted as pruned).
async fn by_values(
    op: &opendal::Operator,
    cache: &SegmentCache,
    m: &SegmentManifest,
    req: &ArchiveScan,
    metrics: &ArchiveScanMetrics,
    picked: Vec<GroupSlice>,
) -> Result<(Vec<GroupSlice>, usize), ArchiveError> {
    let key = m.payload_key.as_str();
    let meta = footer(op, cache, m, metrics).await?;
    let arrow = ArrowReaderMetadata::try_new(meta.clone(), ArrowReaderOptions::new())
        .map_err(|e| ArchiveError::decode(key, e))?;
    let out = crate::archive::parquet::excluded_by_values(
        key,
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
    Ok((picked, skipped))
}

/// Rows of a run and how many buckets begin in them (see [`run_stream`]).
pub(crate) type RunBatch = (RecordBatch, u32);

/// One bucket of a run: its interval as the read covers it, the manifest's row count, and
/// whether the read takes all of it (then its rows are counted against that).
struct Span {
    bucket: BucketId,
    lo: EventTime,
    hi: EventTime,
    want: u64,
    whole: bool,
}

/// The rows of several buckets of one partition in one segment, read as one: every row
/// group the buckets' intervals meet is fetched, verified and checked once (as a bucket
/// read does, through the same cache), and each group's rows of all the buckets, which are
/// adjacent when the buckets are, leave as one run of batches instead of a few rows per
/// bucket. Each bucket whose whole interval the read takes has its rows counted against
/// the manifest at the end, so a bucket the manifest misstates is refused as a bucket read
/// refuses it. Rows of a bucket not in `buckets` are never returned, even when it lies
/// between two of them in the segment (its route may lead elsewhere now). Each batch comes
/// with the number of buckets whose first returned rows are in it (for per-bucket counts).
pub(crate) fn run_stream(
    op: opendal::Operator,
    cache: Arc<SegmentCache>,
    m: Arc<SegmentManifest>,
    buckets: &[BucketId],
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
) -> Result<BoxStream<'static, Result<RunBatch, ArchiveError>>, ArchiveError> {
    let Some(first) = buckets.first() else {
        return Ok(stream::empty().boxed());
    };
    let key = m.payload_key.clone();
    let (entry, _) = m.entry_for(&key, first)?;
    let entry = Arc::new(entry.clone());
    let mut spans = Vec::with_capacity(buckets.len());
    for b in buckets {
        if b.partition_key != first.partition_key {
            return Err(ArchiveError::decode(
                &key,
                format!(
                    "a run of buckets spans partitions {} and {}",
                    first.partition_key.to_hex(),
                    b.partition_key.to_hex()
                ),
            ));
        }
        let (_, want) = m.entry_for(&key, b)?;
        if let Some((lo, hi, whole)) = bucket_interval(b, &req)? {
            spans.push(Span {
                bucket: b.clone(),
                lo,
                hi,
                want,
                whole,
            });
        }
    }
    spans.sort_by_key(|s| s.lo);
    if let Some(w) = spans.windows(2).find(|w| w[0].hi >= w[1].lo) {
        return Err(ArchiveError::decode(
            &key,
            format!("a run names bucket {} twice", w[1].bucket.bucket_key),
        ));
    }
    let intervals: Vec<(EventTime, EventTime)> = spans.iter().map(|s| (s.lo, s.hi)).collect();
    let mut picked = meeting(&entry, &intervals);
    ArchiveScanMetrics::add(&metrics.row_groups_total, entry.slices.len() as u64);
    ArchiveScanMetrics::add(
        &metrics.row_groups_pruned,
        (entry.slices.len() - picked.len()) as u64,
    );
    if req.descending {
        picked.reverse();
    }
    Ok(stream::once(async move {
        let mut spans = spans;
        if !(req.value.filters.is_empty() || m.table_schema_version.is_none() || picked.is_empty())
        {
            let (kept, skipped) = by_values(&op, &cache, &m, &req, &metrics, picked).await?;
            picked = kept;
            if skipped > 0 {
                // Rows were left unread: no bucket's count can be checked.
                spans.iter_mut().for_each(|s| s.whole = false);
            }
        }
        Ok::<_, ArchiveError>(run_slices(op, cache, m, entry, spans, req, metrics, picked))
    })
    .try_flatten()
    .boxed())
}

/// What [`run_slices`] carries from group to group: the rows seen of each span, and which
/// spans have returned a row.
struct RunState {
    seen: Vec<u64>,
    started: Vec<bool>,
}

/// How many buckets begin in each of the `batches` batches [`range_batches`] cut `range`
/// into, `members` being the buckets' rows in it: a bucket is counted once in the run, on
/// the batch holding its first row in the read's order. With row-by-row bounds (which may
/// drop rows) they are all counted on the range's first batch.
fn begun_per_batch(
    state: &std::sync::Mutex<RunState>,
    req: &ArchiveScan,
    range: &std::ops::Range<usize>,
    members: &[(usize, std::ops::Range<usize>)],
    batches: usize,
) -> Vec<u32> {
    let step = req.batch_rows.max(1);
    let exact = super::read::exact_bounds(req);
    let mut begun = vec![0u32; batches];
    let mut st = state.lock().expect("run state");
    for (i, r) in members {
        if std::mem::replace(&mut st.started[*i], true) {
            continue;
        }
        let first = match (exact, req.descending) {
            (true, _) => 0,
            (false, false) => r.start - range.start,
            (false, true) => range.end - r.end,
        };
        begun[(first / step).min(batches - 1)] += 1;
    }
    begun
}

/// The picked slices of a run, in order, as batches with the buckets they begin; then each
/// whole bucket's count checked.
#[allow(clippy::too_many_arguments)]
fn run_slices(
    op: opendal::Operator,
    cache: Arc<SegmentCache>,
    m: Arc<SegmentManifest>,
    entry: Arc<PartitionEntry>,
    spans: Vec<Span>,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
    picked: Vec<GroupSlice>,
) -> BoxStream<'static, Result<RunBatch, ArchiveError>> {
    let spans = Arc::new(spans);
    let state = Arc::new(std::sync::Mutex::new(RunState {
        seen: vec![0; spans.len()],
        started: vec![false; spans.len()],
    }));
    let rows = {
        let (m, spans, state) = (m.clone(), spans.clone(), state.clone());
        stream::iter(picked).then(move |slice| {
            let (op, cache, m, entry) = (op.clone(), cache.clone(), m.clone(), entry.clone());
            let (spans, state, req, metrics) =
                (spans.clone(), state.clone(), req.clone(), metrics.clone());
            async move {
                let rows = read_slice(&op, &cache, &m, &entry, &slice, &metrics, &req).await?;
                let key = m.payload_key.as_str();
                // Each span's rows in this group, then adjacent ones joined: the buckets of
                // a run usually follow one another, so a group's rows leave as one range.
                type Members = Vec<(usize, std::ops::Range<usize>)>;
                let mut ranges: Vec<(std::ops::Range<usize>, Members)> = Vec::new();
                {
                    let mut st = state.lock().expect("run state");
                    for (i, s) in spans.iter().enumerate() {
                        let r = time_range(key, &rows, (s.lo, s.hi))?;
                        if r.is_empty() {
                            continue;
                        }
                        st.seen[i] += r.len() as u64;
                        match ranges.last_mut() {
                            Some((last, members)) if last.end == r.start => {
                                last.end = r.end;
                                members.push((i, r));
                            }
                            _ => ranges.push((r.clone(), vec![(i, r)])),
                        }
                    }
                }
                if req.descending {
                    ranges.reverse();
                }
                let mut out = Vec::new();
                for (range, members) in ranges {
                    let batches = range_batches(key, &rows, range.clone(), &req)?;
                    if batches.is_empty() {
                        continue;
                    }
                    let begun = begun_per_batch(&state, &req, &range, &members, batches.len());
                    let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                    ArchiveScanMetrics::add(&metrics.rows_returned, n as u64);
                    out.extend(batches.into_iter().zip(begun));
                }
                Ok::<_, ArchiveError>(out)
            }
        })
    };
    let key = m.payload_key.clone();
    let check = stream::once(async move {
        let st = state.lock().expect("run state");
        for (i, s) in spans.iter().enumerate() {
            if s.whole && st.seen[i] != s.want {
                return Err(ArchiveError::RowCountMismatch {
                    key: format!("{key} (bucket {})", s.bucket.bucket_key),
                    expected: s.want,
                    actual: st.seen[i],
                });
            }
        }
        Ok(Vec::new())
    });
    rows.chain(check)
        .map_ok(|batches| stream::iter(batches.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
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
                let rows = read_slice(&op, &cache, &m, &entry, &slice, &metrics, &req).await?;
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
