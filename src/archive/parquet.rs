//! The Parquet payload: the record schema v2 envelope, record <-> Arrow conversion, the
//! deterministic streaming encoder, and the pruning, verified, ranged-read scanner.
//!
//! Files are plain Parquet (zstd, statistics and page index, `sorting_columns` declared), so
//! DataFusion's own Parquet reader can scan them through an `object_store` bridge. Encoding is
//! deterministic for a given sequence of records (fixed `created_by`, no timestamps, input
//! re-chunked into fixed-size batches before it reaches the encoder), so a retried write of
//! the same snapshot produces the same bytes and finds its earlier payload identical.

use std::collections::VecDeque;
use std::ops::{Bound, Range};
use std::sync::{Arc, Mutex};

use crate::lru::Lru;

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, BinaryArray, BooleanArray, TimestampNanosecondArray, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions, RowFilter, RowSelection, RowSelector,
};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStream};
use parquet::arrow::async_writer::AsyncFileWriter;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, SortingColumn,
};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;

use super::integrity::{check_stored_length, PayloadDigest, RowCheck, VerifiedReader};
use super::{ArchiveError, ArchiveScan, ArchiveScanMetrics, Manifest};
use crate::model::envelope::{COL_SORT, COL_TIME};
use crate::model::{batch_to_records, Record, ScanBounds};
pub use crate::model::{envelope_schema, records_to_batch};

/// Rows per row group: 64 Ki rows keeps a row group's encoded buffer in the writer to a few
/// MiB for typical values, and makes statistics fine-grained enough that a time-range read
/// of a year bucket touches a small fraction of it.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Rows per data page (the page index granularity inside a row group) at the default size.
const PAGE_ROWS: usize = 8 * 1024;
/// Records per batch handed to the encoder; fixed so page boundaries never depend on how the
/// caller paged the snapshot.
pub(crate) const ENCODE_BATCH_ROWS: usize = 8 * 1024;
/// `created_by` written in every file: fixed, so the bytes do not depend on the build.
const CREATED_BY: &str = "pulpitum archive (record schema v2)";

/// The envelope as a scan returns it: without `event_time` and `sort_key` when the scan
/// does not read them (see `ArchiveScan::include_keys`).
pub(crate) fn scan_schema(include_keys: bool, include_value: bool) -> SchemaRef {
    let full = envelope_schema(include_value);
    if include_keys {
        return full;
    }
    let keep: Vec<usize> = (0..full.fields().len())
        .filter(|&i| i != COL_TIME && i != COL_SORT)
        .collect();
    Arc::new(full.project(&keep).expect("indices of the envelope"))
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T, ArchiveError> {
    let col = batch.column_by_name(name).ok_or_else(|| {
        ArchiveError::decode("<batch>", format!("envelope batch has no `{name}` column"))
    })?;
    if col.null_count() > 0 {
        return Err(ArchiveError::decode(
            "<batch>",
            format!("`{name}` holds nulls"),
        ));
    }
    col.as_any().downcast_ref::<T>().ok_or_else(|| {
        ArchiveError::decode(
            "<batch>",
            format!(
                "`{name}` has type {}, not the envelope type",
                col.data_type()
            ),
        )
    })
}

/// The writer settings of archive Parquet files with row groups of `row_group_rows` rows
/// ([`ROW_GROUP_ROWS`] by default; public so the benchmark's baseline writes with exactly the
/// same encoding). Pages hold at most an eighth of a row group, and at most 8192 rows.
pub fn writer_properties(row_group_rows: usize) -> WriterProperties {
    let col = |name: &str| ColumnPath::from(name);
    let row_group_rows = row_group_rows.max(8);
    let page_rows = PAGE_ROWS.min(row_group_rows / 8);
    WriterProperties::builder()
        .set_created_by(CREATED_BY.to_string())
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid zstd level"),
        ))
        .set_max_row_group_row_count(Some(row_group_rows))
        .set_data_page_row_count_limit(page_rows)
        .set_write_batch_size(page_rows.min(1024))
        .set_statistics_enabled(EnabledStatistics::Page)
        // Unique keys and opaque values gain nothing from a dictionary; the partition key is
        // one value per file and compresses to almost nothing with one.
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(col("partition_key"), true)
        .set_column_encoding(col("event_time"), Encoding::DELTA_BINARY_PACKED)
        .set_sorting_columns(Some(vec![
            SortingColumn {
                column_idx: COL_TIME as i32,
                descending: false,
                nulls_first: false,
            },
            SortingColumn {
                column_idx: COL_SORT as i32,
                descending: false,
                nulls_first: false,
            },
        ]))
        .build()
}

/// Where payload bytes go while they are encoded: an OpenDAL writer (or nowhere, when only
/// the digest of an existing payload's twin is wanted), hashed and counted on the way.
///
/// An upload that is not closed successfully is aborted: on an error in `close`, on
/// [`Self::abort`], and when the sink is dropped with the upload still open (the write was
/// cancelled), so no multipart upload is left behind to be billed and no partial object
/// stays at the key.
pub(crate) struct PayloadSink {
    writer: Option<opendal::Writer>,
    /// The operator and key of the upload, for removing a partial file on abort.
    target: (opendal::Operator, String),
    digest: PayloadDigest,
}

/// Aborts an unfinished upload. Multipart uploads (S3) are aborted by the writer. The
/// filesystem cannot abort a file written in place; the writer created that file with
/// `O_EXCL`, so it is this writer's own and is removed. Nothing else is ever deleted here: on
/// other backends an existing object at the key may be another writer's.
async fn abort_upload(mut w: opendal::Writer, op: &opendal::Operator, key: &str) {
    match w.abort().await {
        Ok(()) => {}
        Err(e) if e.kind() == opendal::ErrorKind::Unsupported && op.info().scheme() == "fs" => {
            if let Err(e) = op.delete(key).await {
                tracing::warn!(key, error = %e, "could not remove a partial payload");
            }
        }
        Err(e) => tracing::warn!(key, error = %e, "could not abort a payload upload"),
    }
}

impl Drop for PayloadSink {
    fn drop(&mut self) {
        let Some(w) = self.writer.take() else {
            return;
        };
        let (op, key) = self.target.clone();
        // The abort is asynchronous; a dropped write has no future left to run it in.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move { abort_upload(w, &op, &key).await });
            }
            Err(_) => tracing::warn!(key, "payload upload dropped outside a runtime"),
        }
    }
}

impl PayloadSink {
    pub fn new(
        writer: Option<opendal::Writer>,
        op: &opendal::Operator,
        key: &str,
        block_size: u64,
    ) -> Self {
        Self {
            writer,
            target: (op.clone(), key.to_string()),
            digest: PayloadDigest::new(block_size),
        }
    }

    pub async fn put(&mut self, bs: Bytes) -> Result<(), opendal::Error> {
        self.digest.update(&bs);
        if let Some(w) = &mut self.writer {
            w.write(bs).await?;
        }
        Ok(())
    }

    /// Closes the upload (the conditional create happens here on most backends); a failed
    /// close aborts it.
    pub async fn close(&mut self) -> Result<(), opendal::Error> {
        if let Some(mut w) = self.writer.take() {
            if let Err(e) = w.close().await {
                let (op, key) = &self.target;
                abort_upload(w, op, key).await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Aborts the upload (best effort: failures are logged; a crash's leftovers are cleared
    /// by the bucket lifecycle rule in `docs/archiver.md`).
    pub async fn abort(&mut self) {
        if let Some(w) = self.writer.take() {
            let (op, key) = &self.target;
            abort_upload(w, op, key).await;
        }
    }

    pub fn finish_digest(mut self) -> super::integrity::Digests {
        std::mem::replace(&mut self.digest, PayloadDigest::new(4096)).finish()
    }
}

impl AsyncFileWriter for PayloadSink {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        async move {
            self.put(bs)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        // The upload is closed by the caller, which needs to tell a failed conditional create
        // apart from an encoding error.
        async { Ok(()) }.boxed()
    }
}

/// Maps a Parquet error back, recovering storage and archive errors smuggled through it.
pub(crate) fn from_parquet(key: &str, op: &'static str, e: ParquetError) -> ArchiveError {
    match e {
        ParquetError::External(inner) => match inner.downcast::<ArchiveError>() {
            Ok(a) => *a,
            Err(inner) => match inner.downcast::<opendal::Error>() {
                Ok(o) => ArchiveError::storage(op, key, *o),
                Err(other) => ArchiveError::decode(key, other),
            },
        },
        // Lengths are verified before Parquet sees a byte, so a Parquet "end of file" means a
        // footer or page that claims more bytes than exist: damaged encoding, not truncation.
        other => ArchiveError::decode(key, other),
    }
}

/// An [`AsyncFileReader`] over OpenDAL ranged reads in which every byte is block-verified.
#[derive(Clone)]
pub(crate) struct VerifiedParquetReader {
    inner: Arc<VerifiedReader>,
}

impl AsyncFileReader for VerifiedParquetReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let r = self.inner.clone();
        async move {
            r.read(range)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let len = self.inner.len();
            let meta = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .with_prefetch_hint(Some(64 * 1024))
                .load_and_finish(self, len)
                .await?;
            Ok(Arc::new(meta))
        }
        .boxed()
    }
}

fn check_schema(key: &str, schema: &Schema) -> Result<(), ArchiveError> {
    let want = envelope_schema(true);
    let same = schema.fields().len() == want.fields().len()
        && schema
            .fields()
            .iter()
            .zip(want.fields().iter())
            .all(|(a, b)| {
                a.name() == b.name() && a.data_type() == b.data_type() && !a.is_nullable()
            });
    if !same {
        return Err(ArchiveError::decode(
            key,
            format!("file schema is not the record schema v2 envelope: {schema}"),
        ));
    }
    Ok(())
}

/// The scan plan of one row group: its index and the pages to read (`None` = all).
struct RowGroupPlan {
    index: usize,
    selection: Option<RowSelection>,
}

fn sort_stat_excludes(bounds: &ScanBounds, min: &[u8], max: &[u8]) -> bool {
    // Byte-array statistics may be truncated: min is then a prefix (<= the true min) and max
    // an incremented prefix (>= the true max), so these comparisons stay conservative.
    let below = match &bounds.sort_lower {
        Bound::Included(x) => max < x.as_bytes(),
        Bound::Excluded(x) => max <= x.as_bytes(),
        Bound::Unbounded => false,
    };
    let above = match &bounds.sort_upper {
        Bound::Included(x) => min > x.as_bytes(),
        Bound::Excluded(x) => min >= x.as_bytes(),
        Bound::Unbounded => false,
    };
    below || above
}

fn plan_row_groups(
    meta: &ParquetMetaData,
    bounds: &ScanBounds,
    metrics: &ArchiveScanMetrics,
) -> Vec<RowGroupPlan> {
    let Some((lo, hi)) = bounds.time_interval() else {
        ArchiveScanMetrics::add(&metrics.row_groups_pruned, meta.num_row_groups() as u64);
        return Vec::new();
    };
    let (lo, hi) = (lo.as_nanos(), hi.as_nanos());
    let mut plan = Vec::new();
    for (i, rg) in meta.row_groups().iter().enumerate() {
        let time_out = match rg.column(COL_TIME).statistics() {
            Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
                (Some(mn), Some(mx)) => *mx < lo || *mn > hi,
                _ => false,
            },
            _ => false,
        };
        let sort_out = match rg.column(COL_SORT).statistics() {
            Some(Statistics::ByteArray(s)) => match (s.min_opt(), s.max_opt()) {
                (Some(mn), Some(mx)) => sort_stat_excludes(bounds, mn.data(), mx.data()),
                _ => false,
            },
            _ => false,
        };
        if time_out || sort_out {
            ArchiveScanMetrics::add(&metrics.row_groups_pruned, 1);
            continue;
        }
        let selection = page_selection(meta, i, lo, hi, metrics);
        plan.push(RowGroupPlan {
            index: i,
            selection,
        });
    }
    plan
}

/// Pages of row group `rg` whose event-time range misses `[lo, hi]` are skipped: rows are
/// sorted by time, so a narrow time range selects a few pages of a large row group.
fn page_selection(
    meta: &ParquetMetaData,
    rg: usize,
    lo: i64,
    hi: i64,
    metrics: &ArchiveScanMetrics,
) -> Option<RowSelection> {
    let ci = meta.column_index()?.get(rg)?.get(COL_TIME)?;
    let oi = meta.offset_index()?.get(rg)?.get(COL_TIME)?;
    let ColumnIndexMetaData::INT64(idx) = ci else {
        return None;
    };
    let locs = oi.page_locations();
    let rows = meta.row_group(rg).num_rows() as usize;
    let mut selectors = Vec::with_capacity(locs.len());
    let mut skipped = 0u64;
    for (i, loc) in locs.iter().enumerate() {
        let start = loc.first_row_index as usize;
        let end = locs.get(i + 1).map_or(rows, |l| l.first_row_index as usize);
        let keep = match (idx.min_value(i), idx.max_value(i)) {
            (Some(mn), Some(mx)) => !(*mx < lo || *mn > hi),
            _ => true,
        };
        if keep {
            selectors.push(RowSelector::select(end - start));
        } else {
            skipped += 1;
            selectors.push(RowSelector::skip(end - start));
        }
    }
    if skipped == 0 {
        return None;
    }
    ArchiveScanMetrics::add(&metrics.pages_pruned, skipped);
    Some(RowSelection::from(selectors))
}

/// [`ScanBounds::matches_key`] on raw column values, without allocating a `SortKey` per row.
/// The scan tests compare its results with `ScanBounds::matches` record by record.
fn matches_raw(b: &ScanBounds, micros: i64, k: &[u8]) -> bool {
    let t_ok = match b.time_lower {
        Bound::Included(x) => micros >= x.as_micros(),
        Bound::Excluded(x) => micros > x.as_micros(),
        Bound::Unbounded => true,
    } && match b.time_upper {
        Bound::Included(x) => micros <= x.as_micros(),
        Bound::Excluded(x) => micros < x.as_micros(),
        Bound::Unbounded => true,
    };
    let s_ok = match &b.sort_lower {
        Bound::Included(x) => k >= x.as_bytes(),
        Bound::Excluded(x) => k > x.as_bytes(),
        Bound::Unbounded => true,
    } && match &b.sort_upper {
        Bound::Included(x) => k <= x.as_bytes(),
        Bound::Excluded(x) => k < x.as_bytes(),
        Bound::Unbounded => true,
    };
    let after_ok = b
        .after
        .as_ref()
        .is_none_or(|c| (micros, k) > (c.event_time.as_micros(), c.sort_key.as_bytes()));
    let before_ok = b
        .before
        .as_ref()
        .is_none_or(|c| (micros, k) < (c.event_time.as_micros(), c.sort_key.as_bytes()));
    t_ok && s_ok && after_ok && before_ok
}

pub(crate) fn filter_mask(b: &ScanBounds, batch: &RecordBatch) -> Result<BooleanArray, ArrowError> {
    let t = batch
        .column_by_name("event_time")
        .and_then(|c| c.as_any().downcast_ref::<TimestampNanosecondArray>())
        .ok_or_else(|| ArrowError::SchemaError("filter needs event_time".into()))?;
    let k = batch
        .column_by_name("sort_key")
        .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
        .ok_or_else(|| ArrowError::SchemaError("filter needs sort_key".into()))?;
    Ok((0..batch.num_rows())
        .map(|i| Some(matches_raw(b, t.value(i).div_euclid(1000), k.value(i))))
        .collect())
}

/// Checks that every row of a batch read without `event_time` and `sort_key` belongs to
/// the manifest's partition, and re-labels it with the scan schema.
fn check_partition_batch(
    key: &str,
    batch: RecordBatch,
    include_value: bool,
    manifest: &Manifest,
) -> Result<RecordBatch, ArchiveError> {
    let pk = column::<BinaryArray>(&batch, "partition_key").map_err(|e| relabel(key, e))?;
    let want = manifest.partition_key.as_bytes();
    if let Some(bad) = pk.iter().flatten().find(|p| *p != want) {
        return Err(ArchiveError::decode(
            key,
            format!(
                "row of partition {} in an archive of partition {}",
                hex::encode(bad),
                manifest.partition_key.to_hex()
            ),
        ));
    }
    RecordBatch::try_new(scan_schema(false, include_value), batch.columns().to_vec())
        .map_err(|e| ArchiveError::decode(key, e))
}

/// Checks every row of a batch (stored order) and re-labels it with the envelope schema.
pub(crate) fn check_batch(
    key: &str,
    batch: RecordBatch,
    include_value: bool,
    check: &mut RowCheck<'_>,
) -> Result<RecordBatch, ArchiveError> {
    let pk = column::<BinaryArray>(&batch, "partition_key").map_err(|e| relabel(key, e))?;
    let t =
        column::<TimestampNanosecondArray>(&batch, "event_time").map_err(|e| relabel(key, e))?;
    let sk = column::<BinaryArray>(&batch, "sort_key").map_err(|e| relabel(key, e))?;
    for i in 0..batch.num_rows() {
        let nanos = t.value(i);
        if nanos % 1000 != 0 {
            return Err(ArchiveError::decode(
                key,
                "event_time with sub-microsecond digits",
            ));
        }
        check.row(pk.value(i), nanos / 1000, sk.value(i))?;
    }
    RecordBatch::try_new(envelope_schema(include_value), batch.columns().to_vec())
        .map_err(|e| ArchiveError::decode(key, e))
}

fn relabel(key: &str, e: ArchiveError) -> ArchiveError {
    match e {
        ArchiveError::Decode { reason, .. } => ArchiveError::decode(key, reason),
        other => other,
    }
}

/// Reverses the rows of one row group (given as ascending batches) and re-slices them.
fn reverse_rows(
    key: &str,
    schema: SchemaRef,
    batches: &[RecordBatch],
    batch_rows: usize,
) -> Result<Vec<RecordBatch>, ArchiveError> {
    let all = concat_batches(&schema, batches).map_err(|e| ArchiveError::decode(key, e))?;
    let n = all.num_rows() as u32;
    let idx = UInt32Array::from_iter_values((0..n).rev());
    let rev = take_record_batch(&all, &idx).map_err(|e| ArchiveError::decode(key, e))?;
    let mut out = Vec::new();
    let mut off = 0;
    while off < rev.num_rows() {
        let len = batch_rows.min(rev.num_rows() - off);
        out.push(rev.slice(off, len));
        off += len;
    }
    Ok(out)
}

struct ScanState {
    key: String,
    manifest: Arc<Manifest>,
    reader: VerifiedParquetReader,
    meta: ArrowReaderMetadata,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
    plan: VecDeque<RowGroupPlan>,
    current: Option<ParquetRecordBatchStream<VerifiedParquetReader>>,
    pending: VecDeque<RecordBatch>,
    /// Last row returned in stored order (ascending scans) or the smallest row of the row
    /// group returned last (descending scans): the order check across row groups.
    frontier: Option<(i64, Vec<u8>)>,
    done: bool,
}

impl ScanState {
    fn open(
        &self,
        rg: RowGroupPlan,
    ) -> Result<ParquetRecordBatchStream<VerifiedParquetReader>, ArchiveError> {
        let schema_descr = self.meta.metadata().file_metadata().schema_descr_ptr();
        let mut cols: Vec<usize> = if self.req.include_keys {
            vec![0, COL_TIME, COL_SORT]
        } else {
            vec![0]
        };
        if self.req.include_value {
            cols.push(3);
        }
        let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(
            self.reader.clone(),
            self.meta.clone(),
        )
        .with_row_groups(vec![rg.index])
        .with_projection(ProjectionMask::roots(&schema_descr, cols))
        .with_batch_size(self.req.batch_rows);
        if let Some(sel) = rg.selection {
            builder = builder.with_row_selection(sel);
        }
        if self.req.bounds != ScanBounds::all() {
            let bounds = self.req.bounds.clone();
            let pred = ArrowPredicateFn::new(
                ProjectionMask::roots(&schema_descr, [COL_TIME, COL_SORT]),
                move |batch: RecordBatch| filter_mask(&bounds, &batch),
            );
            builder = builder.with_row_filter(RowFilter::new(vec![Box::new(pred)]));
        }
        builder
            .build()
            .map_err(|e| from_parquet(&self.key, "read", e))
    }

    async fn next_batch(&mut self) -> Option<Result<RecordBatch, ArchiveError>> {
        if self.done {
            return None;
        }
        let out = self.advance().await;
        match &out {
            Some(Ok(b)) => {
                ArchiveScanMetrics::add(&self.metrics.rows_returned, b.num_rows() as u64)
            }
            Some(Err(_)) | None => self.done = true,
        }
        out
    }

    async fn advance(&mut self) -> Option<Result<RecordBatch, ArchiveError>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Some(Ok(b));
            }
            if let Some(stream) = &mut self.current {
                match stream.next().await {
                    Some(Ok(batch)) if !self.req.include_keys => {
                        let checked = check_partition_batch(
                            &self.key,
                            batch,
                            self.req.include_value,
                            &self.manifest,
                        );
                        match checked {
                            Ok(b) if b.num_rows() == 0 => continue,
                            other => return Some(other),
                        }
                    }
                    Some(Ok(batch)) => {
                        let manifest = self.manifest.clone();
                        let mut check = RowCheck::new(&self.key, &manifest);
                        check.resume(self.frontier.take());
                        let checked =
                            check_batch(&self.key, batch, self.req.include_value, &mut check);
                        self.frontier = check.last();
                        match checked {
                            Ok(b) if b.num_rows() == 0 => continue,
                            other => return Some(other),
                        }
                    }
                    Some(Err(e)) => return Some(Err(from_parquet(&self.key, "read", e))),
                    None => {
                        self.current = None;
                        continue;
                    }
                }
            }
            let rg = self.plan.pop_front()?;
            let stream = match self.open(rg) {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            if !self.req.descending {
                self.current = Some(stream);
                continue;
            }
            if let Err(e) = self.load_reversed(stream).await {
                return Some(Err(e));
            }
        }
    }

    /// Descending: one row group at a time, checked in stored order, then reversed. Memory
    /// is bounded by one row group's selected rows.
    async fn load_reversed(
        &mut self,
        mut stream: ParquetRecordBatchStream<VerifiedParquetReader>,
    ) -> Result<(), ArchiveError> {
        let manifest = self.manifest.clone();
        let schema = scan_schema(self.req.include_keys, self.req.include_value);
        if !self.req.include_keys {
            let mut batches = Vec::new();
            while let Some(b) = stream.next().await {
                let b = b.map_err(|e| from_parquet(&self.key, "read", e))?;
                batches.push(check_partition_batch(
                    &self.key,
                    b,
                    self.req.include_value,
                    &manifest,
                )?);
            }
            self.pending.extend(reverse_rows(
                &self.key,
                schema,
                &batches,
                self.req.batch_rows,
            )?);
            return Ok(());
        }
        let mut check = RowCheck::new(&self.key, &manifest);
        let mut batches = Vec::new();
        let mut first: Option<(i64, Vec<u8>)> = None;
        while let Some(b) = stream.next().await {
            let b = b.map_err(|e| from_parquet(&self.key, "read", e))?;
            let b = check_batch(&self.key, b, self.req.include_value, &mut check)?;
            if first.is_none() && b.num_rows() > 0 {
                first = Some(first_key(&b));
            }
            batches.push(b);
        }
        if let (Some(last), Some(frontier)) = (check.last(), &self.frontier) {
            if last >= *frontier {
                return Err(ArchiveError::decode(
                    &self.key,
                    "row groups are not in increasing (event_time, sort_key) order",
                ));
            }
        }
        if first.is_some() {
            self.frontier = first;
        }
        self.pending.extend(reverse_rows(
            &self.key,
            schema,
            &batches,
            self.req.batch_rows,
        )?);
        Ok(())
    }
}

fn first_key(b: &RecordBatch) -> (i64, Vec<u8>) {
    let t = b
        .column(COL_TIME)
        .as_any()
        .downcast_ref::<TimestampNanosecondArray>()
        .expect("checked");
    let k = b
        .column(COL_SORT)
        .as_any()
        .downcast_ref::<BinaryArray>()
        .expect("checked");
    (t.value(0) / 1000, k.value(0).to_vec())
}

/// Opens a verified, pruned, ranged scan of a Parquet payload.
/// Parsed footers of payloads already opened, so a bucket scanned again reads only the pages
/// it needs. A payload is immutable and its footer was verified (block digests, schema, row
/// count) and its stored length checked when it was first opened; the data pages read later
/// are verified block by block as always. Keyed by payload key and digest; the oldest entry
/// goes first when full.
#[derive(Debug)]
pub(crate) struct FooterCache {
    entries: Mutex<Lru<(String, String), ArrowReaderMetadata>>,
}

/// Footers kept per archive store: small files' footers are a few KiB each.
pub(crate) const FOOTER_CACHE_ENTRIES: usize = 4096;

impl Default for FooterCache {
    fn default() -> Self {
        Self {
            entries: Mutex::new(Lru::new(FOOTER_CACHE_ENTRIES)),
        }
    }
}

impl FooterCache {
    fn get(&self, key: &(String, String)) -> Option<ArrowReaderMetadata> {
        self.entries.lock().expect("footer cache lock").get(key)
    }

    fn insert(&self, key: (String, String), meta: ArrowReaderMetadata) {
        self.entries
            .lock()
            .expect("footer cache lock")
            .insert(key, meta);
    }
}

pub(crate) async fn scan(
    op: opendal::Operator,
    manifest: Manifest,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
    footers: &FooterCache,
) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
    scan_inner(op, manifest, req, metrics, false, Some(footers)).await
}

/// [`scan`]; `just_verified` skips the block digests (the writer's own check, right after it
/// compared every stored block with what it uploaded).
pub(crate) async fn scan_with(
    op: opendal::Operator,
    manifest: Manifest,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
    just_verified: bool,
) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
    scan_inner(op, manifest, req, metrics, just_verified, None).await
}

async fn scan_inner(
    op: opendal::Operator,
    manifest: Manifest,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
    just_verified: bool,
    footers: Option<&FooterCache>,
) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
    let key = manifest.payload_key.clone();
    let cache_key = (key.clone(), manifest.sha256.clone());
    let cached = footers.and_then(|c| c.get(&cache_key));
    if cached.is_none() {
        check_stored_length(&op, &manifest, &metrics).await?;
    }
    let manifest = Arc::new(manifest);
    let mut inner = VerifiedReader::new(op, manifest.clone(), metrics.clone());
    if just_verified {
        inner = inner.just_verified();
    }
    let mut reader = VerifiedParquetReader {
        inner: Arc::new(inner),
    };
    let meta = match cached {
        Some(meta) => meta,
        None => {
            let options =
                ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
            let meta = ArrowReaderMetadata::load_async(&mut reader, options)
                .await
                .map_err(|e| from_parquet(&key, "read", e))?;
            check_schema(&key, meta.schema())?;
            let total: i64 = meta.metadata().file_metadata().num_rows();
            if total as u64 != manifest.row_count {
                return Err(ArchiveError::RowCountMismatch {
                    key,
                    expected: manifest.row_count,
                    actual: total.max(0) as u64,
                });
            }
            if let Some(c) = footers {
                c.insert(cache_key, meta.clone());
            }
            meta
        }
    };
    ArchiveScanMetrics::add(
        &metrics.row_groups_total,
        meta.metadata().num_row_groups() as u64,
    );
    let mut plan: VecDeque<RowGroupPlan> =
        plan_row_groups(meta.metadata(), &req.bounds, &metrics).into();
    if req.descending {
        plan = plan.into_iter().rev().collect();
    }
    let state = ScanState {
        key,
        manifest,
        reader,
        meta,
        req,
        metrics,
        plan,
        current: None,
        pending: VecDeque::new(),
        frontier: None,
        done: false,
    };
    Ok(futures::stream::unfold(state, |mut s| async move {
        let item = s.next_batch().await?;
        Some((item, s))
    })
    .boxed())
}

/// Decodes a whole payload held in memory (after the caller verified its checksum).
pub(crate) fn decode_all(key: &str, bytes: Bytes) -> Result<Vec<Record>, ArchiveError> {
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| from_parquet(key, "read", e))?;
    check_schema(key, builder.schema())?;
    let reader = builder
        .with_batch_size(ENCODE_BATCH_ROWS)
        .build()
        .map_err(|e| from_parquet(key, "read", e))?;
    let mut out = Vec::new();
    for b in reader {
        let b = b.map_err(|e| ArchiveError::decode(key, e))?;
        out.extend(batch_to_records(&b).map_err(|e| ArchiveError::decode(key, e))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusteringKey, EventTime, PartitionKey, SortKey};

    fn rec(us: i64, k: &[u8], v: &[u8]) -> Record {
        Record {
            partition_key: PartitionKey::new(vec![7]).unwrap(),
            event_time: EventTime::from_micros(us).unwrap(),
            sort_key: SortKey::new(k.to_vec()).unwrap(),
            value: v.to_vec(),
        }
    }

    #[test]
    fn batches_round_trip() {
        let rs = vec![
            rec(1_700_000_000_000_000, b"a", b"x"),
            rec(1_700_000_000_000_001, b"", b""),
        ];
        let b = records_to_batch(&rs, true);
        assert_eq!(b.schema(), envelope_schema(true));
        assert_eq!(batch_to_records(&b).unwrap(), rs);
        let nv = records_to_batch(&rs, false);
        assert_eq!(nv.num_columns(), 3);
        assert!(batch_to_records(&nv).is_err());
    }

    #[test]
    fn raw_matching_agrees_with_the_model() {
        let base = 1_700_000_000_000_000;
        let keys: [&[u8]; 4] = [b"", b"a", b"b", b"bb"];
        let mut boundss = vec![ScanBounds::all()];
        for (i, k) in keys.iter().enumerate() {
            let t = EventTime::from_micros(base + i as i64).unwrap();
            let sk = SortKey::new(k.to_vec()).unwrap();
            boundss.push(ScanBounds {
                time_lower: Bound::Excluded(t),
                sort_upper: Bound::Included(sk.clone()),
                ..ScanBounds::all()
            });
            boundss.push(ScanBounds::all().with_after(ClusteringKey {
                event_time: t,
                sort_key: sk.clone(),
            }));
            boundss.push(ScanBounds {
                time_upper: Bound::Included(t),
                sort_lower: Bound::Excluded(sk.clone()),
                ..ScanBounds::all().with_before(ClusteringKey {
                    event_time: t,
                    sort_key: sk,
                })
            });
        }
        for b in &boundss {
            for i in 0..4 {
                for k in keys {
                    let r = rec(base + i, k, b"");
                    assert_eq!(
                        matches_raw(b, base + i, k),
                        b.matches(&r),
                        "{b:?} {i} {k:?}"
                    );
                }
            }
        }
    }
}
