//! The write path: validate and re-chunk the snapshot pages, stream-encode them into a
//! create-if-absent payload while hashing, read the payload back and verify it, then create
//! the manifest in one conditional PUT and read it back.
//!
//! Retries are first-class. A payload that already exists (from an earlier attempt whose
//! outcome was lost) is not overwritten: the pages are encoded into a hash-only sink and the
//! digests compared; equal bytes continue to the manifest, different bytes are
//! [`ArchiveError::AlreadyExistsDifferent`]. An existing manifest is accepted when it
//! describes the same archive (every field but `created_at`).

use std::sync::Arc;

use ::parquet::arrow::AsyncArrowWriter;
use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};

use super::integrity::{digest_stored, sha256_hex, Digests};
use super::parquet::{
    envelope_schema, from_parquet, records_to_batch, writer_properties, PayloadSink, ValueColumns,
    ENCODE_BATCH_ROWS,
};
use super::{
    json, parquet, ArchiveError, ArchiveScan, ArchiveScanMetrics, ArchiveStore, Manifest,
    PayloadFormat, WrittenArchive, CLUSTERING_KEY, COLUMNAR_SCHEMA_VERSION, MANIFEST_VERSION,
    RECORD_SCHEMA_VERSION,
};
use crate::model::{BucketId, EventTime, Record};

/// Why an archive write failed: the source of its pages, or the archive itself. Generic over
/// the source's error so that a caller (the archiver, reading fenced snapshot pages) gets its
/// own error back as it was, to decide on it (a stale claim is a lost lease, not a failed
/// upload), rather than a message.
#[derive(Debug, thiserror::Error)]
pub enum WriteError<E> {
    /// The page stream returned an error; nothing was published and the upload was aborted.
    #[error("the record source failed: {0}")]
    Source(E),
    /// Encoding, uploading, verifying or committing the archive failed.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
}

impl WriteError<ArchiveError> {
    /// The error as an [`ArchiveError`], for callers whose source already speaks it.
    pub fn into_archive(self) -> ArchiveError {
        match self {
            Self::Source(e) | Self::Archive(e) => e,
        }
    }
}

/// Upload chunk size: payloads up to this size are one PUT; larger ones are multipart with
/// parts of this size, so the writer holds at most one chunk of encoded bytes.
const UPLOAD_CHUNK: usize = 8 << 20;

/// What the encoder saw.
#[derive(Debug, Default)]
struct RowStats {
    rows: u64,
    min: Option<EventTime>,
    max: Option<EventTime>,
}

/// Validates the incoming records against the bucket and their order, and regroups them into
/// fixed-size chunks so that the encoded bytes do not depend on the caller's paging.
struct Rechunker<'a> {
    bucket: &'a BucketId,
    bounds_us: (i64, i64),
    last: Option<(EventTime, Vec<u8>)>,
    buf: Vec<Record>,
    stats: RowStats,
    /// Test hook: drop one row from the first chunk encoded (see `with_lossy_encoder`).
    lose_a_row: bool,
}

impl<'a> Rechunker<'a> {
    fn new(bucket: &'a BucketId, lossy: bool) -> Self {
        let (start, end) = bucket.bucket_key.bounds();
        Self {
            bucket,
            bounds_us: (start.as_micros(), end.as_micros()),
            last: None,
            buf: Vec::with_capacity(ENCODE_BATCH_ROWS),
            stats: RowStats::default(),
            lose_a_row: lossy,
        }
    }

    fn invalid(&self, reason: String) -> ArchiveError {
        ArchiveError::InvalidInput {
            bucket: self.bucket.to_string(),
            reason,
        }
    }

    /// Adds a page; returns full chunks ready to encode.
    fn push(&mut self, page: Vec<Record>) -> Result<Vec<Vec<Record>>, ArchiveError> {
        let mut ready = Vec::new();
        for r in page {
            if r.partition_key != self.bucket.partition_key {
                return Err(self.invalid(format!("record of partition {}", r.partition_key)));
            }
            let t = r.event_time.as_micros();
            if t < self.bounds_us.0 || t >= self.bounds_us.1 {
                return Err(
                    self.invalid(format!("record at {} is outside the bucket", r.event_time))
                );
            }
            if let Some((t, k)) = &self.last {
                if (r.event_time, r.sort_key.as_bytes()) <= (*t, k.as_slice()) {
                    return Err(self.invalid(format!(
                        "records not in strictly increasing (event_time, sort_key) order at {} {}",
                        r.event_time, r.sort_key
                    )));
                }
            }
            match &mut self.last {
                Some((lt, lk)) => {
                    *lt = r.event_time;
                    lk.clear();
                    lk.extend_from_slice(r.sort_key.as_bytes());
                }
                None => self.last = Some((r.event_time, r.sort_key.as_bytes().to_vec())),
            }
            self.stats.rows += 1;
            self.stats.min.get_or_insert(r.event_time);
            self.stats.max = Some(r.event_time);
            self.buf.push(r);
            if self.buf.len() == ENCODE_BATCH_ROWS {
                let full = std::mem::replace(&mut self.buf, Vec::with_capacity(ENCODE_BATCH_ROWS));
                ready.push(self.emit(full));
            }
        }
        Ok(ready)
    }

    fn rest(&mut self) -> Vec<Record> {
        let rest = std::mem::take(&mut self.buf);
        self.emit(rest)
    }

    fn emit(&mut self, mut chunk: Vec<Record>) -> Vec<Record> {
        if self.lose_a_row && !chunk.is_empty() {
            self.lose_a_row = false;
            chunk.pop();
        }
        chunk
    }
}

async fn encode_parquet<S, E>(
    sink: PayloadSink,
    row_group_rows: usize,
    key: &str,
    bucket: &BucketId,
    lossy: bool,
    layout: Option<&ValueColumns>,
    pages: S,
) -> (PayloadSink, Result<RowStats, WriteError<E>>)
where
    S: Stream<Item = Result<Vec<Record>, E>> + Send,
{
    let schema = layout.map_or_else(|| envelope_schema(true), ValueColumns::payload_schema);
    let encode = |chunk: &[Record]| -> Result<_, ArchiveError> {
        let batch = records_to_batch(chunk, true);
        match layout {
            Some(l) => l.to_payload(&batch),
            None => Ok(batch),
        }
    };
    let mut writer =
        match AsyncArrowWriter::try_new(sink, schema, Some(writer_properties(row_group_rows))) {
            Ok(w) => w,
            Err(e) => unreachable_writer(e),
        };
    let mut chunker = Rechunker::new(bucket, lossy);
    let result: Result<(), WriteError<E>> = async {
        futures::pin_mut!(pages);
        while let Some(page) = pages.next().await {
            for chunk in chunker.push(page.map_err(WriteError::Source)?)? {
                let batch = encode(&chunk)?;
                writer
                    .write(&batch)
                    .await
                    .map_err(|e| from_parquet(key, "write", e))?;
            }
        }
        let rest = chunker.rest();
        if !rest.is_empty() {
            let batch = encode(&rest)?;
            writer
                .write(&batch)
                .await
                .map_err(|e| from_parquet(key, "write", e))?;
        }
        writer
            .finish()
            .await
            .map_err(|e| from_parquet(key, "write", e))?;
        Ok(())
    }
    .await;
    (writer.into_inner(), result.map(|()| chunker.stats))
}

fn unreachable_writer(e: ::parquet::errors::ParquetError) -> ! {
    // The schema and properties are constants of this module; a failure here is a bug.
    panic!("the archive Parquet writer rejected its own schema: {e}")
}

async fn encode_json<S, E>(
    mut sink: PayloadSink,
    key: &str,
    bucket: &BucketId,
    lossy: bool,
    layout: Option<&ValueColumns>,
    pages: S,
) -> (PayloadSink, Result<RowStats, WriteError<E>>)
where
    S: Stream<Item = Result<Vec<Record>, E>> + Send,
{
    let mut chunker = Rechunker::new(bucket, lossy);
    let result: Result<(), WriteError<E>> = async {
        let put_err = |e| ArchiveError::storage("write", key, e);
        sink.put(json::header_line(layout).into())
            .await
            .map_err(put_err)?;
        futures::pin_mut!(pages);
        let mut buf = Vec::new();
        while let Some(page) = pages.next().await {
            for chunk in chunker.push(page.map_err(WriteError::Source)?)? {
                buf.clear();
                json::encode_lines(key, layout, &chunk, &mut buf)?;
                sink.put(buf.clone().into()).await.map_err(put_err)?;
            }
        }
        buf.clear();
        json::encode_lines(key, layout, &chunker.rest(), &mut buf)?;
        if !buf.is_empty() {
            sink.put(buf.into()).await.map_err(put_err)?;
        }
        Ok(())
    }
    .await;
    (sink, result.map(|()| chunker.stats))
}

pub(crate) fn is_condition_failure(e: &opendal::Error) -> bool {
    matches!(
        e.kind(),
        opendal::ErrorKind::ConditionNotMatch | opendal::ErrorKind::AlreadyExists
    )
}

pub(crate) async fn write_bucket<S, E>(
    store: &ArchiveStore,
    bucket: &BucketId,
    generation: i64,
    format: PayloadFormat,
    layout: Option<&ValueColumns>,
    pages: S,
) -> Result<WrittenArchive, WriteError<E>>
where
    S: Stream<Item = Result<Vec<Record>, E>> + Send,
{
    let uploaded = upload_payload(store, bucket, generation, format, layout, pages).await?;
    Ok(verify_and_commit(store, bucket, generation, format, layout, uploaded).await?)
}

/// A payload uploaded (or found from an earlier attempt) and the digests its encoding had.
struct Uploaded {
    payload_key: String,
    manifest_key: String,
    written: Digests,
    stats: RowStats,
    /// The payload was already there (an earlier attempt), or another writer created it
    /// first: a different stored payload is then someone else's, not a corruption.
    preexisting: bool,
}

/// Encodes the pages into a create-if-absent payload while hashing them. The only step that
/// reads the source, so the only one whose errors may be the source's.
async fn upload_payload<S, E>(
    store: &ArchiveStore,
    bucket: &BucketId,
    generation: i64,
    format: PayloadFormat,
    layout: Option<&ValueColumns>,
    pages: S,
) -> Result<Uploaded, WriteError<E>>
where
    S: Stream<Item = Result<Vec<Record>, E>> + Send,
{
    if generation < 0 {
        return Err(ArchiveError::Config(format!(
            "generation must not be negative, got {generation}"
        ))
        .into());
    }
    let op = store.operator();
    let payload_key = store.payload_key(bucket, generation, format);

    // A payload left by an earlier attempt is compared, never overwritten. (radosgw ignores
    // If-None-Match on multipart completion, so large payloads rely on this check and on the
    // archiver's fencing: one live writer per generation.)
    let mut existed = match op.stat(&payload_key).await {
        Ok(_) => true,
        Err(e) if e.kind() == opendal::ErrorKind::NotFound => false,
        Err(e) => return Err(ArchiveError::storage("stat", &payload_key, e).into()),
    };
    let writer = if existed {
        None
    } else {
        match op
            .writer_with(&payload_key)
            .if_not_exists(true)
            .chunk(UPLOAD_CHUNK)
            .await
        {
            Ok(w) => Some(w),
            Err(e) if is_condition_failure(&e) => {
                existed = true;
                None
            }
            Err(e) => return Err(ArchiveError::storage("write", &payload_key, e).into()),
        }
    };
    // From here on, every way out of this function that leaves the upload unfinished (an
    // error, or the future being dropped) aborts it: see `PayloadSink`.
    let sink = PayloadSink::new(writer, op, &payload_key, store.block_size());
    let lossy = store.lossy_encoder();
    let (mut sink, encoded) = match format {
        PayloadFormat::Parquet => {
            let rows = store.row_group_rows();
            encode_parquet(sink, rows, &payload_key, bucket, lossy, layout, pages).await
        }
        PayloadFormat::Json => encode_json(sink, &payload_key, bucket, lossy, layout, pages).await,
    };
    let stats = match encoded {
        Ok(s) => s,
        Err(e) => {
            sink.abort().await;
            return Err(e);
        }
    };
    let lost_race = match sink.close().await {
        Ok(()) => false,
        Err(e) if is_condition_failure(&e) => true,
        Err(e) => return Err(ArchiveError::storage("write", &payload_key, e).into()),
    };
    let written: Digests = sink.finish_digest();
    crate::failpoint::hit("after_upload");
    Ok(Uploaded {
        payload_key,
        manifest_key: store.manifest_key(bucket, generation),
        written,
        stats,
        preexisting: existed || lost_race,
    })
}

/// Reads the payload back and verifies it, then creates the manifest in one conditional PUT
/// and reads that back.
async fn verify_and_commit(
    store: &ArchiveStore,
    bucket: &BucketId,
    generation: i64,
    format: PayloadFormat,
    layout: Option<&ValueColumns>,
    uploaded: Uploaded,
) -> Result<WrittenArchive, ArchiveError> {
    let Uploaded {
        payload_key,
        manifest_key,
        written,
        stats,
        preexisting,
    } = uploaded;
    let op = store.operator();

    // Read back the whole payload and compare every block with what was encoded.
    // Equal length and equal block digests mean equal bytes, so the stored object's whole
    // SHA-256 is the one computed on upload; hashing it a second time would prove nothing.
    let stored = digest_stored(op, &payload_key, store.block_size()).await?;
    if stored.len != written.len || stored.blocks != written.blocks {
        if preexisting {
            return Err(ArchiveError::AlreadyExistsDifferent { key: payload_key });
        }
        if stored.len != written.len {
            return Err(ArchiveError::LengthMismatch {
                key: payload_key,
                expected: written.len,
                actual: stored.len,
            });
        }
        let (i, (expected, actual)) = written
            .blocks
            .iter()
            .zip(stored.blocks.iter())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .expect("equal lengths and different digests differ in some block");
        return Err(ArchiveError::ChecksumMismatch {
            key: format!("{payload_key} (block {i})"),
            expected: expected.clone(),
            actual: actual.clone(),
        });
    }

    let now = Utc::now();
    let created_at = DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now);
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        table_id: bucket.table_id.clone(),
        partition_key: bucket.partition_key.clone(),
        bucket_key: bucket.bucket_key,
        bucket_strategy: bucket.bucket_key.strategy(),
        bucket_start: bucket.bucket_key.start(),
        bucket_end: bucket.bucket_key.end(),
        generation,
        format,
        schema_version: match layout {
            Some(_) => COLUMNAR_SCHEMA_VERSION,
            None => RECORD_SCHEMA_VERSION,
        },
        table_schema_version: layout.map(ValueColumns::table_schema_version),
        payload_key: payload_key.clone(),
        row_count: stats.rows,
        byte_length: written.len,
        sha256: written.sha256,
        block_size: store.block_size(),
        block_sha256: written.blocks,
        clustering_key: CLUSTERING_KEY.iter().map(|s| s.to_string()).collect(),
        min_event_time: stats.min,
        max_event_time: stats.max,
        created_at,
    };
    verify_decoded(op, &manifest).await?;

    let bytes = manifest.to_json_bytes();
    match op
        .write_with(&manifest_key, bytes.clone())
        .if_not_exists(true)
        .await
    {
        Ok(_) => {}
        Err(e) if is_condition_failure(&e) => {
            let existing = read_existing_manifest(store, &manifest_key, bucket).await?;
            if existing.same_archive(&manifest) {
                return Ok(WrittenArchive {
                    manifest_key,
                    manifest: existing,
                });
            }
            return Err(ArchiveError::AlreadyExistsDifferent { key: manifest_key });
        }
        Err(e) => return Err(ArchiveError::storage("write", &manifest_key, e)),
    }
    let back = op
        .read(&manifest_key)
        .await
        .map_err(|e| ArchiveError::storage("read", &manifest_key, e))?
        .to_vec();
    if back != bytes {
        return Err(ArchiveError::ChecksumMismatch {
            key: manifest_key,
            expected: sha256_hex(&bytes),
            actual: sha256_hex(&back),
        });
    }
    let parsed = Manifest::parse(&back, &manifest_key, bucket)?;
    if parsed != manifest {
        return Err(ArchiveError::InvalidManifest {
            key: manifest_key,
            reason: "read-back manifest differs from the one written".into(),
        });
    }
    Ok(WrittenArchive {
        manifest_key,
        manifest: parsed,
    })
}

/// An existing manifest found by a conditional create. On a filesystem the winner's bytes may
/// still be arriving (create and write are two steps there), so a short read is retried
/// briefly before the content is judged.
async fn read_existing_manifest(
    store: &ArchiveStore,
    key: &str,
    bucket: &BucketId,
) -> Result<Manifest, ArchiveError> {
    let mut last = None;
    for attempt in 0..5 {
        match store.read_manifest(key, bucket).await {
            Ok(m) => return Ok(m),
            Err(e @ ArchiveError::InvalidManifest { .. }) => {
                last = Some(e);
                tokio::time::sleep(std::time::Duration::from_millis(20 << attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Decodes the stored payload through the same verified reader that scans use (block digests,
/// footer, schema, partition, bucket bounds, strict clustering order) and checks the decoded
/// row count and event-time range against the manifest about to be written.
async fn verify_decoded(op: &opendal::Operator, manifest: &Manifest) -> Result<(), ArchiveError> {
    let req = ArchiveScan {
        include_value: false,
        batch_rows: 64 * 1024,
        ..ArchiveScan::default()
    };
    let metrics = Arc::new(ArchiveScanMetrics::default());
    let mut stream = match manifest.format {
        PayloadFormat::Parquet => {
            parquet::scan_with(op.clone(), manifest.clone(), req, metrics, true).await?
        }
        PayloadFormat::Json => json::scan(op.clone(), manifest.clone(), req, metrics).await?,
    };
    let mut rows = 0u64;
    let mut first = None;
    let mut last = None;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let t = batch
            .column(1)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::TimestampNanosecondArray>()
            .ok_or_else(|| ArchiveError::decode(&manifest.payload_key, "event_time type"))?;
        if first.is_none() {
            first = Some(EventTime::from_nanos(t.value(0))?);
        }
        last = Some(EventTime::from_nanos(t.value(batch.num_rows() - 1))?);
        rows += batch.num_rows() as u64;
    }
    if rows != manifest.row_count {
        return Err(ArchiveError::RowCountMismatch {
            key: manifest.payload_key.clone(),
            expected: manifest.row_count,
            actual: rows,
        });
    }
    if (first, last) != (manifest.min_event_time, manifest.max_event_time) {
        return Err(ArchiveError::decode(
            &manifest.payload_key,
            "decoded event-time range differs from the rows written",
        ));
    }
    Ok(())
}
