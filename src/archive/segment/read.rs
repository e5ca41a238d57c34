//! Reading one partition out of a segment with ranged reads, every byte verified.
//!
//! A partition's rows are a contiguous run of one or a few row groups. The reader takes the
//! Parquet footer from a cache or fetches the payload's tail (one ranged read, checked
//! against the manifest's digest), fetches each of the partition's row groups (one ranged
//! read each, checked against its own digest) and decodes only those, through a
//! [`ChunkReader`] that holds nothing but the verified ranges: a byte the manifest did not
//! vouch for can never reach the decoder, and damage in another partition's row group does
//! not disturb this read. The decoded rows are checked (partition, strict clustering order,
//! per-bucket row counts against the manifest) before anything is returned, and kept in a
//! small byte-bounded cache, since a scan visits one partition's buckets one after another
//! and each of them is a slice of the same rows.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use datafusion::arrow::array::BooleanArray;
use datafusion::arrow::array::{Array, BinaryArray, TimestampNanosecondArray, UInt32Array};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, take_record_batch};
use datafusion::arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};

use super::manifest::{ByteRange, PartitionEntry, SegmentManifest};
use crate::archive::integrity::sha256_hex;
use crate::archive::{ArchiveError, ArchiveScan, ArchiveScanMetrics};
use crate::lru::Lru;
use crate::model::envelope::{COL_PARTITION, COL_SORT, COL_TIME};
use crate::model::{BucketId, EventTime, SortKey};

/// The payload's verified ranges as a Parquet input: reads outside them are refused.
pub(crate) struct VerifiedRanges {
    len: u64,
    /// `(offset, bytes)`, sorted by offset, not overlapping.
    ranges: Vec<(u64, Bytes)>,
}

impl VerifiedRanges {
    pub(crate) fn new(len: u64, mut ranges: Vec<(u64, Bytes)>) -> Self {
        ranges.sort_by_key(|(o, _)| *o);
        Self { len, ranges }
    }

    /// The bytes at `start` (`length` of them, or to the end of its range). Row groups are
    /// contiguous, so `start` can be both the end of one range and the start of the next:
    /// the range holding the byte at `start` is the one meant (taking the first that merely
    /// touches `start` handed the decoder an empty read at every row-group boundary). A
    /// read running past its range continues into the next one only if that one is
    /// adjacent (then the pieces are copied into one buffer).
    fn slice(&self, start: u64, length: Option<usize>) -> parquet::errors::Result<Bytes> {
        let outside = || {
            ParquetError::General(format!(
                "read of {start}+{} outside the verified ranges",
                length.unwrap_or(0)
            ))
        };
        let at = self
            .ranges
            .partition_point(|(o, b)| *o + b.len() as u64 <= start);
        let Some((o, b)) = self.ranges.get(at).filter(|(o, _)| *o <= start) else {
            // An empty read at the very end of a range is still inside it.
            return match (length, at.checked_sub(1).map(|i| &self.ranges[i])) {
                (Some(0), Some((o, b))) if *o + b.len() as u64 == start => Ok(Bytes::new()),
                _ => Err(outside()),
            };
        };
        let from = (start - o) as usize;
        let Some(length) = length else {
            return Ok(b.slice(from..));
        };
        if from + length <= b.len() {
            return Ok(b.slice(from..from + length));
        }
        let mut out = Vec::with_capacity(length);
        out.extend_from_slice(&b[from..]);
        let mut next_start = o + b.len() as u64;
        for (o, b) in &self.ranges[at + 1..] {
            if *o != next_start || out.len() == length {
                break;
            }
            let take = (length - out.len()).min(b.len());
            out.extend_from_slice(&b[..take]);
            next_start = o + b.len() as u64;
        }
        if out.len() != length {
            return Err(outside());
        }
        Ok(Bytes::from(out))
    }
}

impl Length for VerifiedRanges {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for VerifiedRanges {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, Some(length))
    }
}

/// Checks bytes against a manifest range's digest.
pub(crate) fn check_range(
    key: &str,
    what: &str,
    range: &ByteRange,
    bytes: &[u8],
) -> Result<(), ArchiveError> {
    if bytes.len() as u64 != range.length {
        return Err(ArchiveError::Truncated {
            key: key.to_string(),
            reason: format!(
                "{what} at {} has {} bytes, the manifest says {}",
                range.offset,
                bytes.len(),
                range.length
            ),
        });
    }
    let actual = sha256_hex(bytes);
    if actual != range.sha256 {
        return Err(ArchiveError::ChecksumMismatch {
            key: format!("{key} ({what})"),
            expected: range.sha256.clone(),
            actual,
        });
    }
    Ok(())
}

/// The Parquet metadata in a verified tail (page indexes, footer, length, magic).
pub(crate) fn footer_metadata(
    key: &str,
    tail: &[u8],
) -> Result<Arc<ParquetMetaData>, ArchiveError> {
    let n = tail.len();
    if n < 8 || &tail[n - 4..] != b"PAR1" {
        return Err(ArchiveError::decode(
            key,
            "payload tail does not end in PAR1",
        ));
    }
    let len = u32::from_le_bytes(tail[n - 8..n - 4].try_into().expect("4 bytes")) as usize;
    if len + 8 > n {
        return Err(ArchiveError::decode(
            key,
            format!("footer of {len} bytes does not fit the {n}-byte tail"),
        ));
    }
    let meta = ParquetMetaDataReader::decode_metadata(&tail[n - 8 - len..n - 8])
        .map_err(|e| ArchiveError::decode(key, e))?;
    Ok(Arc::new(meta))
}

/// Decodes a partition's rows from verified ranges that cover its row groups, and checks
/// them against the manifest.
pub(crate) fn decode_partition(
    m: &SegmentManifest,
    meta: Arc<ParquetMetaData>,
    input: VerifiedRanges,
    entry: &PartitionEntry,
) -> Result<RecordBatch, ArchiveError> {
    let key = m.payload_key.as_str();
    let (groups, skip) = m.row_groups_of(entry);
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
    let arrow_meta = ArrowReaderMetadata::try_new(meta, ArrowReaderOptions::new())
        .map_err(|e| ArchiveError::decode(key, e))?;
    let file_schema = arrow_meta.schema().clone();
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(input, arrow_meta)
        .with_row_groups(groups.collect())
        .with_batch_size(64 * 1024)
        .build()
        .map_err(|e| ArchiveError::decode(key, e))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| ArchiveError::decode(key, e))?);
    }
    let Some(first) = batches.first() else {
        return Err(ArchiveError::RowCountMismatch {
            key: key.to_string(),
            expected: entry.rows,
            actual: 0,
        });
    };
    let all =
        concat_batches(&first.schema(), &batches).map_err(|e| ArchiveError::decode(key, e))?;
    let all = crate::archive::parquet::decoded_envelope(
        key,
        &file_schema,
        &all,
        m.table_schema_version.is_some(),
        None,
    )?;
    let end = skip + entry.rows;
    if (all.num_rows() as u64) < end {
        return Err(ArchiveError::RowCountMismatch {
            key: key.to_string(),
            expected: end,
            actual: all.num_rows() as u64,
        });
    }
    let rows = all.slice(skip as usize, entry.rows as usize);
    check_partition(m, entry, &rows)?;
    Ok(rows)
}

/// Every row belongs to the partition, rows are in strictly increasing `(event_time,
/// sort_key)` order, and each bucket holds exactly the rows the manifest says.
fn check_partition(
    m: &SegmentManifest,
    entry: &PartitionEntry,
    rows: &RecordBatch,
) -> Result<(), ArchiveError> {
    let key = m.payload_key.as_str();
    let bad = |reason: String| ArchiveError::decode(key, reason);
    let pk = binary(key, rows, COL_PARTITION)?;
    let sk = binary(key, rows, COL_SORT)?;
    let t = times(key, rows)?;
    let want = entry.partition_key.as_bytes();
    let mut buckets = entry.buckets.iter().peekable();
    let mut in_bucket = 0u64;
    for i in 0..rows.num_rows() {
        if pk.value(i) != want {
            return Err(bad(format!(
                "row {} of partition {} holds partition {}",
                i,
                entry.partition_key.to_hex(),
                hex::encode(pk.value(i))
            )));
        }
        if i > 0 && (t.value(i - 1), sk.value(i - 1)) >= (t.value(i), sk.value(i)) {
            return Err(bad(format!(
                "rows of partition {} out of clustering order at {i}",
                entry.partition_key.to_hex()
            )));
        }
        let at = EventTime::from_nanos(t.value(i))?;
        // Advance to the bucket holding this row; the buckets left behind must be complete.
        loop {
            let Some((k, n)) = buckets.peek() else {
                return Err(bad(format!("row at {at} is past the partition's buckets")));
            };
            if k.contains(at) {
                in_bucket += 1;
                break;
            }
            if at < k.start() || in_bucket != *n {
                return Err(bad(format!(
                    "bucket {k} of partition {} holds {in_bucket} rows, the manifest says {n}",
                    entry.partition_key.to_hex()
                )));
            }
            buckets.next();
            in_bucket = 0;
        }
    }
    match (buckets.next(), buckets.next()) {
        (Some((_, n)), None) if *n == in_bucket => Ok(()),
        _ => Err(bad(format!(
            "partition {}: rows do not match the manifest's bucket counts",
            entry.partition_key.to_hex()
        ))),
    }
}

fn binary<'a>(key: &str, b: &'a RecordBatch, i: usize) -> Result<&'a BinaryArray, ArchiveError> {
    let c = b.column(i);
    if c.null_count() > 0 {
        return Err(ArchiveError::decode(key, format!("column {i} holds nulls")));
    }
    c.as_any()
        .downcast_ref::<BinaryArray>()
        .ok_or_else(|| ArchiveError::decode(key, format!("column {i} is not Binary")))
}

fn times<'a>(key: &str, b: &'a RecordBatch) -> Result<&'a TimestampNanosecondArray, ArchiveError> {
    let c = b.column(COL_TIME);
    if c.null_count() > 0 {
        return Err(ArchiveError::decode(key, "event_time holds nulls"));
    }
    c.as_any()
        .downcast_ref::<TimestampNanosecondArray>()
        .ok_or_else(|| ArchiveError::decode(key, "event_time is not Timestamp(ns)"))
}

/// Verified footers and decoded partitions of segments, shared by a store's clones. Both
/// are immutable (an object is never rewritten under its key, and the key carries the
/// generation), so entries never go stale; they are only evicted.
#[derive(Debug)]
pub(crate) struct SegmentCache {
    footers: Mutex<Lru<String, Arc<ParquetMetaData>>>,
    manifests: Mutex<Lru<String, Arc<SegmentManifest>>>,
    partitions: Mutex<PartitionCache>,
}

/// Footers and manifests kept: a segment is large, so there are few of them.
const SEGMENT_ENTRIES: usize = 1024;
/// Bytes of decoded partitions kept per store.
const PARTITION_CACHE_BYTES: usize = 256 << 20;

impl Default for SegmentCache {
    fn default() -> Self {
        Self::with_partition_bytes(PARTITION_CACHE_BYTES)
    }
}

impl SegmentCache {
    /// A cache keeping at most `bytes` of decoded partitions (0: none, as the segment
    /// writer's verification wants: it reads each partition once).
    pub(crate) fn with_partition_bytes(bytes: usize) -> Self {
        Self {
            footers: Mutex::new(Lru::new(SEGMENT_ENTRIES)),
            manifests: Mutex::new(Lru::new(SEGMENT_ENTRIES)),
            partitions: Mutex::new(PartitionCache {
                limit: bytes,
                ..PartitionCache::default()
            }),
        }
    }

    pub(crate) fn manifest(&self, key: &str) -> Option<Arc<SegmentManifest>> {
        self.manifests.lock().expect("segment cache").get(key)
    }

    pub(super) fn cached(&self, key: &CacheKey) -> Option<RecordBatch> {
        self.partitions.lock().expect("segment cache").get(key)
    }

    pub(super) fn keep(&self, key: CacheKey, rows: RecordBatch) {
        self.partitions
            .lock()
            .expect("segment cache")
            .insert(key, rows);
    }

    pub(crate) fn keep_manifest(&self, key: &str, m: Arc<SegmentManifest>) {
        self.manifests
            .lock()
            .expect("segment cache")
            .insert(key.to_string(), m);
    }
}

/// `(payload key, partition key, row group)`: a partition's rows in one row group (v6
/// reads), or all of them (`WHOLE`, v5 reads).
/// The fourth part is the value fields decoded (`None`: every column, each value whole).
pub(super) type CacheKey = (String, Vec<u8>, usize, Option<Vec<u32>>);
const WHOLE: usize = usize::MAX;

/// Decoded partition slices, oldest evicted first, bounded by their Arrow memory.
#[derive(Debug, Default)]
struct PartitionCache {
    order: VecDeque<CacheKey>,
    entries: std::collections::HashMap<CacheKey, (RecordBatch, usize)>,
    bytes: usize,
    limit: usize,
}

impl PartitionCache {
    fn get(&self, key: &CacheKey) -> Option<RecordBatch> {
        self.entries.get(key).map(|(b, _)| b.clone())
    }

    fn insert(&mut self, key: CacheKey, batch: RecordBatch) {
        let size = batch.get_array_memory_size();
        if size > self.limit / 4 || self.entries.contains_key(&key) {
            return;
        }
        while self.bytes + size > self.limit {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((_, n)) = self.entries.remove(&old) {
                self.bytes -= n;
            }
        }
        self.bytes += size;
        self.order.push_back(key.clone());
        self.entries.insert(key, (batch, size));
    }
}

/// One partition's verified rows: from the cache, or read with ranged reads (the footer
/// from the cache when there).
pub(crate) async fn partition_rows(
    op: &opendal::Operator,
    cache: &SegmentCache,
    m: &SegmentManifest,
    entry: &PartitionEntry,
    metrics: &ArchiveScanMetrics,
) -> Result<RecordBatch, ArchiveError> {
    let cache_key = (
        m.payload_key.clone(),
        entry.partition_key.as_bytes().to_vec(),
        WHOLE,
        None,
    );
    if let Some(b) = cache
        .partitions
        .lock()
        .expect("segment cache")
        .get(&cache_key)
    {
        return Ok(b);
    }
    let key = m.payload_key.as_str();
    let meta = footer(op, cache, m, metrics).await?;
    let (groups, _) = m.row_groups_of(entry);
    ArchiveScanMetrics::add(&metrics.row_groups_total, groups.len() as u64);
    let mut ranges = Vec::with_capacity(groups.len());
    for i in groups {
        let g = &m.row_groups[i];
        let bytes = ranged(op, key, &g.range, metrics).await?;
        check_range(key, &format!("row group {i}"), &g.range, &bytes)?;
        ranges.push((g.range.offset, bytes));
    }
    let rows = decode_partition(m, meta, VerifiedRanges::new(m.byte_length, ranges), entry)?;
    cache
        .partitions
        .lock()
        .expect("segment cache")
        .insert(cache_key, rows.clone());
    Ok(rows)
}

/// The payload's Parquet metadata: cached, or its tail fetched with one ranged read and
/// checked against the manifest's digest.
pub(super) async fn footer(
    op: &opendal::Operator,
    cache: &SegmentCache,
    m: &SegmentManifest,
    metrics: &ArchiveScanMetrics,
) -> Result<Arc<ParquetMetaData>, ArchiveError> {
    let key = m.payload_key.as_str();
    let cached = cache.footers.lock().expect("segment cache").get(key);
    if let Some(meta) = cached {
        return Ok(meta);
    }
    let tail = ranged(op, key, &m.footer, metrics).await?;
    check_range(key, "footer", &m.footer, &tail)?;
    let meta = footer_metadata(key, &tail)?;
    cache
        .footers
        .lock()
        .expect("segment cache")
        .insert(key.to_string(), meta.clone());
    Ok(meta)
}

pub(super) async fn ranged(
    op: &opendal::Operator,
    key: &str,
    r: &ByteRange,
    metrics: &ArchiveScanMetrics,
) -> Result<Bytes, ArchiveError> {
    let bytes = op
        .read_with(key)
        .range(r.offset..r.end())
        .await
        .map_err(|e| ArchiveError::storage("read", key, e))?
        .to_bytes();
    ArchiveScanMetrics::add(&metrics.requests, 1);
    ArchiveScanMetrics::add(&metrics.bytes_read, bytes.len() as u64);
    Ok(bytes)
}

/// The part of `bucket` a read with `req`'s time bounds covers, as an inclusive interval of
/// event times, and whether that is the whole bucket with no other bound (then every row of
/// the bucket is returned, and the rows seen can be counted against the manifest); `None`
/// when the read takes nothing of it.
pub(crate) fn bucket_interval(
    bucket: &BucketId,
    req: &ArchiveScan,
) -> Result<Option<(EventTime, EventTime, bool)>, ArchiveError> {
    let (bs, be) = bucket.bucket_key.bounds();
    let last = EventTime::from_micros(be.as_micros() - 1)?;
    let Some((lo, hi)) = req.bounds.time_interval() else {
        return Ok(None);
    };
    let (lo, hi) = (lo.max(bs), hi.min(last));
    if lo > hi {
        return Ok(None);
    }
    let whole = lo == bs && hi == last && !exact_bounds(req);
    Ok(Some((lo, hi, whole)))
}

/// Whether `req` has bounds beyond a time interval (sort-key ranges, cursors), which are
/// applied row by row.
pub(super) fn exact_bounds(req: &ArchiveScan) -> bool {
    req.bounds.sort_lower != std::ops::Bound::Unbounded
        || req.bounds.sort_upper != std::ops::Bound::Unbounded
        || req.bounds.after.is_some()
        || req.bounds.before.is_some()
}

/// The rows of `rows` (one partition, in time order) whose event time lies in `lo..=hi`,
/// found by binary search.
pub(crate) fn time_range(
    key: &str,
    rows: &RecordBatch,
    (lo, hi): (EventTime, EventTime),
) -> Result<std::ops::Range<usize>, ArchiveError> {
    let values = times(key, rows)?.values();
    let (lo, hi) = (lo.as_nanos(), hi.as_nanos());
    let from = values.partition_point(|&v| v < lo);
    let to = values.partition_point(|&v| v <= hi).max(from);
    Ok(from..to)
}

/// One bucket's rows matching the scan, from its partition's rows: the bucket's time range
/// is found by binary search (rows are in time order), then [`range_batches`] applies the
/// rest of the scan.
pub(crate) fn bucket_batches(
    key: &str,
    rows: &RecordBatch,
    bucket: &BucketId,
    req: &ArchiveScan,
) -> Result<Vec<RecordBatch>, ArchiveError> {
    let Some((lo, hi, _)) = bucket_interval(bucket, req)? else {
        return Ok(Vec::new());
    };
    let range = time_range(key, rows, (lo, hi))?;
    range_batches(key, rows, range, req)
}

/// Rows `range` of `rows` (one partition, in time order) as the scan returns them: the
/// bounds beyond time (sort-key ranges, cursors) applied row by row, the columns projected,
/// the order reversed for descending scans, and the result cut into batches.
pub(crate) fn range_batches(
    key: &str,
    rows: &RecordBatch,
    range: std::ops::Range<usize>,
    req: &ArchiveScan,
) -> Result<Vec<RecordBatch>, ArchiveError> {
    if range.is_empty() {
        return Ok(Vec::new());
    }
    let mut slice = rows.slice(range.start, range.len());
    if exact_bounds(req) {
        let st = times(key, &slice)?;
        let sk = binary(key, &slice, COL_SORT)?;
        let mut keep = Vec::with_capacity(slice.num_rows());
        for i in 0..slice.num_rows() {
            let k = SortKey::new(sk.value(i).to_vec())?;
            keep.push(
                req.bounds
                    .matches_key(EventTime::from_nanos(st.value(i))?, &k),
            );
        }
        slice = filter_record_batch(&slice, &BooleanArray::from(keep))
            .map_err(|e| ArchiveError::decode(key, e))?;
    }
    let mut cols: Vec<usize> = vec![COL_PARTITION];
    if req.include_keys {
        cols.extend([COL_TIME, COL_SORT]);
    }
    if req.include_value {
        cols.push(crate::model::envelope::COL_VALUE);
    }
    let mut out = slice
        .project(&cols)
        .map_err(|e| ArchiveError::decode(key, e))?;
    if req.descending && out.num_rows() > 1 {
        let n = out.num_rows() as u32;
        let idx = UInt32Array::from_iter_values((0..n).rev());
        out = take_record_batch(&out, &idx).map_err(|e| ArchiveError::decode(key, e))?;
    }
    let step = req.batch_rows.max(1);
    Ok((0..out.num_rows())
        .step_by(step)
        .map(|i| out.slice(i, step.min(out.num_rows() - i)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges() -> VerifiedRanges {
        // Two adjacent ranges (row groups 0 and 1), a gap, then a third (the tail).
        VerifiedRanges::new(
            100,
            vec![
                (60, Bytes::from_static(b"TAIL")),
                (4, Bytes::from_static(b"aaaa")),
                (8, Bytes::from_static(b"bbbbbb")),
            ],
        )
    }

    #[test]
    fn a_read_at_a_boundary_comes_from_the_range_that_holds_it() {
        let r = ranges();
        // Where group 0 ends and group 1 starts: group 1's bytes, not group 0's empty end.
        assert_eq!(&r.get_bytes(8, 3).unwrap()[..], b"bbb");
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut r.get_read(8).unwrap(), &mut rest).unwrap();
        assert_eq!(rest, b"bbbbbb");
        assert_eq!(&r.get_bytes(4, 4).unwrap()[..], b"aaaa");
        assert_eq!(r.get_bytes(14, 0).unwrap().len(), 0);
    }

    #[test]
    fn a_read_across_adjacent_ranges_is_joined_and_nothing_outside_is_served() {
        let r = ranges();
        assert_eq!(&r.get_bytes(6, 5).unwrap()[..], b"aabbb");
        // Past the end of group 1 into the gap, before the first range, in the gap.
        assert!(r.get_bytes(12, 4).is_err());
        assert!(r.get_bytes(0, 2).is_err());
        assert!(r.get_read(20).is_err());
        assert!(r.get_bytes(59, 2).is_err());
        assert_eq!(&r.get_bytes(60, 4).unwrap()[..], b"TAIL");
    }
}
