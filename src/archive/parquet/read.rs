//! The verified, ranged scan of a Parquet payload, and the decoder of a whole payload held
//! in memory.
//!
//! A scan reads the footer (or takes it from the [`FooterCache`]), checks the schema and the
//! row count against the manifest, plans the row groups and pages to read (`prune.rs`), and
//! streams the selected rows through a reader in which every byte is block-verified. Every
//! row read is checked: its partition, and, when the keys are read, the strictly increasing
//! `(event_time, sort_key)` order across batches and row groups.
//!
//! # Descending scans
//!
//! Row groups are visited newest first; each one's selected rows are read and checked in
//! stored order, then reversed and re-sliced into batches, so memory is bounded by one row
//! group's selected rows.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, BinaryArray, BooleanArray, TimestampNanosecondArray, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions, RowFilter,
};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStream};
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use super::columns::{envelope_batch, is_columnar, to_envelope, value_columns};
use super::prune::{
    excluded_row_groups, filter_mask, plan_row_groups, prune_by_values, FilePredicate, RowGroupPlan,
};
use super::{envelope_schema, from_parquet, ENCODE_BATCH_ROWS};
use crate::archive::integrity::{check_stored_length, RowCheck, VerifiedReader};
use crate::archive::COLUMNAR_SCHEMA_VERSION;
use crate::archive::{ArchiveError, ArchiveScan, ArchiveScanMetrics, Manifest};
use crate::lru::Lru;
use crate::model::envelope::{COL_SORT, COL_TIME, COL_VALUE};
use crate::model::schema::predicate::ValuePredicate;
use crate::model::schema::ColumnType;
use crate::model::{batch_to_records, Record, ScanBounds};

/// The envelope as a scan returns it: without `event_time` and `sort_key` when the scan
/// does not read them (see `ArchiveScan::include_keys`).
fn scan_schema(include_keys: bool, include_value: bool) -> SchemaRef {
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

/// An [`AsyncFileReader`] over OpenDAL ranged reads in which every byte is block-verified.
#[derive(Clone)]
struct VerifiedParquetReader {
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

/// The typed value columns of a columnar payload (record schema 3), `None` for the binary
/// envelope (record schema 2); which one the file is must be what its manifest says.
type Columnar = Option<Arc<Vec<(u32, ColumnType)>>>;

fn check_schema(key: &str, schema: &Schema, schema_version: u32) -> Result<Columnar, ArchiveError> {
    let columnar = is_columnar(schema);
    if columnar != (schema_version == COLUMNAR_SCHEMA_VERSION) {
        return Err(ArchiveError::decode(
            key,
            format!("the manifest says record schema {schema_version}, the file's layout differs"),
        ));
    }
    if columnar {
        return Ok(Some(Arc::new(value_columns(key, schema)?)));
    }
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
    Ok(None)
}

/// What a scan of a columnar payload reads of the value, and the predicates it applies.
#[derive(Default)]
struct ValuePlan {
    /// The typed columns read, in file order: `(file column index, field id, stored type)`.
    columns: Vec<(usize, u32, ColumnType)>,
    /// The fields the rebuilt values hold (`None`: all, each value exactly as stored).
    only: Option<Arc<[u32]>>,
    /// The predicates that apply to this file's columns.
    filters: Arc<Vec<FilePredicate>>,
}

impl ValuePlan {
    /// The plan of a scan of a payload with these typed columns. A predicate on a column the
    /// file does not have (added since), or whose stored type does not widen to the
    /// predicate's, is left to SQL above the scan.
    fn new(columnar: &Columnar, req: &ArchiveScan) -> Self {
        let Some(cols) = columnar else {
            return Self::default();
        };
        let columns = if req.include_value {
            cols.iter()
                .enumerate()
                .filter(|(_, (id, _))| req.value.wants(*id))
                .map(|(i, (id, ty))| (COL_VALUE + i, *id, *ty))
                .collect()
        } else {
            Vec::new()
        };
        let filters = file_predicates(cols, &req.value.filters);
        Self {
            columns,
            only: req.value.fields.clone(),
            filters: Arc::new(filters),
        }
    }
}

/// The predicates that apply to a columnar file with these typed columns. A predicate on a
/// column the file does not have (added since), or whose stored type does not widen to the
/// predicate's, is left to SQL above the scan.
fn file_predicates(cols: &[(u32, ColumnType)], preds: &[ValuePredicate]) -> Vec<FilePredicate> {
    preds
        .iter()
        .filter_map(|p| {
            let i = cols.iter().position(|(c, _)| *c == p.field)?;
            let stored = cols[i].1;
            stored.widens_to(p.ty).then(|| FilePredicate {
                predicate: p.clone(),
                column: COL_VALUE + i,
                stored,
            })
        })
        .collect()
}

/// Which row groups of a payload the predicates exclude from their statistics; all `false`
/// for a file in the binary envelope.
pub(crate) fn excluded_by_values(
    key: &str,
    meta: &ParquetMetaData,
    file_schema: &Schema,
    preds: &[ValuePredicate],
) -> Result<Vec<bool>, ArchiveError> {
    if preds.is_empty() || !is_columnar(file_schema) {
        return Ok(vec![false; meta.num_row_groups()]);
    }
    let cols = value_columns(key, file_schema)?;
    let filters = file_predicates(&cols, preds);
    Ok(excluded_row_groups(meta, file_schema, &filters))
}

/// A batch's columns with a columnar payload's value columns (and residual) turned back into
/// the envelope's `value`; `keys` is how many key columns lead the batch.
fn envelope_columns(
    key: &str,
    batch: &RecordBatch,
    columnar: &Columnar,
    value: &ValuePlan,
    keys: usize,
) -> Result<Vec<datafusion::arrow::array::ArrayRef>, ArchiveError> {
    match columnar {
        Some(_) => {
            let cols: Vec<(u32, ColumnType)> =
                value.columns.iter().map(|(_, id, ty)| (*id, *ty)).collect();
            to_envelope(key, &cols, batch, keys, value.only.as_deref())
        }
        None => Ok(batch.columns().to_vec()),
    }
}

/// The rows of a batch of predicate columns (in file order) for which every predicate may
/// hold.
fn value_mask(
    filters: &[FilePredicate],
    batch: &RecordBatch,
) -> Result<BooleanArray, datafusion::arrow::error::ArrowError> {
    let mut order: Vec<usize> = filters.iter().map(|f| f.column).collect();
    order.sort_unstable();
    order.dedup();
    let mut mask: Option<BooleanArray> = None;
    for f in filters {
        let at = order.binary_search(&f.column).expect("a projected column");
        let m = f.predicate.evaluate(batch.column(at), f.stored)?;
        mask = Some(match mask {
            None => m,
            Some(prev) => datafusion::arrow::compute::and(&prev, &m)?,
        });
    }
    Ok(mask.unwrap_or_else(|| BooleanArray::from(vec![true; batch.num_rows()])))
}

/// Checks that every row of a batch read without `event_time` and `sort_key` belongs to
/// the manifest's partition, and re-labels it with the scan schema.
fn check_partition_batch(
    key: &str,
    batch: RecordBatch,
    include_value: bool,
    manifest: &Manifest,
    columnar: &Columnar,
    value: &ValuePlan,
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
    let columns = envelope_columns(key, &batch, columnar, value, 1)?;
    RecordBatch::try_new(scan_schema(false, include_value), columns)
        .map_err(|e| ArchiveError::decode(key, e))
}

/// Checks every row of a batch (stored order) and re-labels it with the envelope schema.
fn check_batch(
    key: &str,
    batch: RecordBatch,
    include_value: bool,
    check: &mut RowCheck<'_>,
    columnar: &Columnar,
    value: &ValuePlan,
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
    let columns = envelope_columns(key, &batch, columnar, value, 3)?;
    RecordBatch::try_new(envelope_schema(include_value), columns)
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
    columnar: Columnar,
    value: ValuePlan,
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
            match &self.columnar {
                // The typed columns read and the residual: the value is rebuilt from them.
                Some(c) => {
                    cols.extend(self.value.columns.iter().map(|(i, _, _)| *i));
                    cols.push(COL_VALUE + c.len());
                }
                None => cols.push(COL_VALUE),
            }
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
        let mut predicates: Vec<Box<dyn parquet::arrow::arrow_reader::ArrowPredicate>> = Vec::new();
        if self.req.bounds != ScanBounds::all() {
            let bounds = self.req.bounds.clone();
            predicates.push(Box::new(ArrowPredicateFn::new(
                ProjectionMask::roots(&schema_descr, [COL_TIME, COL_SORT]),
                move |batch: RecordBatch| filter_mask(&bounds, &batch),
            )));
        }
        if !self.value.filters.is_empty() {
            // Late materialisation: the predicate columns are decoded first, and the other
            // columns only for the rows they keep.
            let filters = self.value.filters.clone();
            let cols: Vec<usize> = filters.iter().map(|f| f.column).collect();
            predicates.push(Box::new(ArrowPredicateFn::new(
                ProjectionMask::roots(&schema_descr, cols),
                move |batch: RecordBatch| value_mask(&filters, &batch),
            )));
        }
        if !predicates.is_empty() {
            builder = builder.with_row_filter(RowFilter::new(predicates));
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
                            &self.columnar,
                            &self.value,
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
                        let checked = check_batch(
                            &self.key,
                            batch,
                            self.req.include_value,
                            &mut check,
                            &self.columnar,
                            &self.value,
                        );
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
                    &self.columnar,
                    &self.value,
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
            let b = check_batch(
                &self.key,
                b,
                self.req.include_value,
                &mut check,
                &self.columnar,
                &self.value,
            )?;
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
const FOOTER_CACHE_ENTRIES: usize = 4096;

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

/// Opens a verified, pruned, ranged scan of a Parquet payload.
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
            check_schema(&key, meta.schema(), manifest.schema_version)?;
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
    let columnar = check_schema(&key, meta.schema(), manifest.schema_version)?;
    let value = ValuePlan::new(&columnar, &req);
    let plan = plan_row_groups(meta.metadata(), &req.bounds, &metrics);
    let plan = prune_by_values(
        meta.metadata(),
        meta.schema(),
        plan,
        &value.filters,
        &metrics,
    );
    let mut plan: VecDeque<RowGroupPlan> = plan.into();
    if req.descending {
        plan = plan.into_iter().rev().collect();
    }
    let state = ScanState {
        columnar,
        value,
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
pub(crate) fn decode_all(
    key: &str,
    bytes: Bytes,
    schema_version: u32,
) -> Result<Vec<Record>, ArchiveError> {
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| from_parquet(key, "read", e))?;
    let columnar = check_schema(key, builder.schema(), schema_version)?;
    let reader = builder
        .with_batch_size(ENCODE_BATCH_ROWS)
        .build()
        .map_err(|e| from_parquet(key, "read", e))?;
    let mut out = Vec::new();
    for b in reader {
        let b = b.map_err(|e| ArchiveError::decode(key, e))?;
        let b = match &columnar {
            Some(cols) => envelope_batch(key, cols, &b)?,
            None => b,
        };
        out.extend(batch_to_records(&b).map_err(|e| ArchiveError::decode(key, e))?);
    }
    Ok(out)
}
