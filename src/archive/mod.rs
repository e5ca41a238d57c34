//! The cold tier: immutable, verified, generation-addressed bucket archives in object storage.
//!
//! One archived bucket is one payload (zstd Parquet or JSON Lines, record schema v2) plus one
//! manifest (v4 JSON) under `<prefix>/v4/<table>/<partition hex>/<bucket key>/g<generation>/`.
//! [`ArchiveStore::write_bucket`] streams the snapshot pages into the payload with
//! create-if-absent, reads it back and verifies it, then creates the manifest in a single
//! conditional PUT and verifies that too; only a fully verified archive gets a manifest key
//! that the archiver may publish. Readers validate the manifest strictly and then either stream
//! whole-object reads (JSON) or issue ranged reads (Parquet), and every byte they decode is
//! checked against the SHA-256 block digests in the manifest, so a damaged object yields a
//! typed error, never rows. Compaction later rewrites published buckets into segments
//! (`segment/`: many partitions' buckets in one object, manifest v5); `route.rs` opens and
//! reads whichever kind a route names. The on-store format is documented in
//! `docs/archive-format.md`.

// `ArchiveError::Storage` carries the OpenDAL error whole (its kind, context and temporary
// flag drive retries); errors are rare next to the I/O they describe, so its size is kept.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::BoxStream;
use futures::{Stream, TryStreamExt};

use crate::model::schema::predicate::ValueRead;
use crate::model::{BucketId, ModelError, Record, ScanBounds, TableId};

pub mod erasure;
pub mod faults;
mod integrity;
mod json;
mod manifest;
mod parquet;
mod probe;
mod route;
pub mod segment;
mod url;
mod write;

pub use faults::{FaultLayer, FaultOp, FaultPlan, FaultStats, WriteFault};
pub use integrity::BLOCK_SIZE;
pub use manifest::{
    Manifest, CLUSTERING_KEY, COLUMNAR_SCHEMA_VERSION, MANIFEST_VERSION, RECORD_SCHEMA_VERSION,
};
pub use parquet::ValueColumns;
pub use parquet::{envelope_schema, records_to_batch, writer_properties, ROW_GROUP_ROWS};
pub(crate) use route::retry_transient;
pub use route::{RouteManifest, RunStream};
pub use segment::{
    SegmentManifest, SegmentSpec, SegmentUpload, SegmentWriter, WrittenSegment, SEGMENTS_DIR,
};
pub use url::install_http_transport;
pub use write::WriteError;

/// The payload encoding of one archive; the manifest names it and readers pick the decoder
/// from it, so changing the configured write format never invalidates older archives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadFormat {
    /// zstd-compressed Parquet in the record schema v2 envelope (the default).
    Parquet,
    /// JSON Lines: one header line, then one record per line (see `docs/archive-format.md`).
    Json,
}

impl PayloadFormat {
    /// The stable name used in manifests and configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Json => "json",
        }
    }

    /// The file extension of the payload object.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Json => "json",
        }
    }
}

impl FromStr for PayloadFormat {
    type Err = ArchiveError;

    fn from_str(s: &str) -> Result<Self, ArchiveError> {
        match s {
            "parquet" => Ok(Self::Parquet),
            "json" => Ok(Self::Json),
            other => Err(ArchiveError::Config(format!(
                "unknown payload format {other:?} (expected \"parquet\" or \"json\")"
            ))),
        }
    }
}

impl fmt::Display for PayloadFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every way an archive operation can fail. Each variant names the object and what was wrong;
/// none of them is ever accompanied by rows.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A bad URL, scheme, option or argument.
    #[error("archive configuration: {0}")]
    Config(String),
    /// The object does not exist.
    #[error("archive object {key} not found")]
    NotFound {
        /// The missing key.
        key: String,
    },
    /// A create-if-absent found an object with different content at the key.
    #[error("archive object {key} already exists with different content")]
    AlreadyExistsDifferent {
        /// The occupied key.
        key: String,
    },
    /// The SHA-256 of the payload (or of one verified block of it) differs from the manifest.
    #[error("checksum mismatch for {key}: expected {expected}, found {actual}")]
    ChecksumMismatch {
        /// The payload key.
        key: String,
        /// The digest the manifest (or the writer) recorded.
        expected: String,
        /// The digest of the bytes in the store.
        actual: String,
    },
    /// The object's length differs from the manifest.
    #[error("length mismatch for {key}: expected {expected} bytes, found {actual}")]
    LengthMismatch {
        /// The payload key.
        key: String,
        /// Length recorded in the manifest.
        expected: u64,
        /// Length found in the store.
        actual: u64,
    },
    /// The decoded number of records differs from the manifest.
    #[error("row count mismatch for {key}: expected {expected}, decoded {actual}")]
    RowCountMismatch {
        /// The payload key.
        key: String,
        /// Row count recorded in the manifest.
        expected: u64,
        /// Rows actually decoded.
        actual: u64,
    },
    /// The object ended early (a short read or a cut-off payload).
    #[error("archive object {key} is truncated: {reason}")]
    Truncated {
        /// The payload key.
        key: String,
        /// What was missing.
        reason: String,
    },
    /// A manifest version this reader does not understand (4, per bucket, and 5, segments,
    /// are accepted).
    #[error("unsupported archive manifest version {0} (this reader accepts 4 and 5)")]
    UnsupportedManifestVersion(u32),
    /// A record schema version this reader does not understand (only 2 is accepted).
    #[error("unsupported record schema version {0} (this reader accepts 2)")]
    UnsupportedSchemaVersion(u32),
    /// The manifest describes a different bucket than the route names.
    #[error("manifest {key} names {field} {actual:?}, but the route expects {expected:?}")]
    IdentityMismatch {
        /// The manifest key.
        key: String,
        /// Which identity field differs.
        field: &'static str,
        /// The value the route expects.
        expected: String,
        /// The value in the manifest.
        actual: String,
    },
    /// A record of the erasure log that cannot be read (not JSON, missing fields, a bad
    /// key or time, a name the log does not use).
    #[error("invalid erasure log record {key}: {reason}")]
    InvalidErasureRecord {
        /// The record's key.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// An erasure log record of a version this build does not read (a newer build wrote it).
    #[error(
        "erasure log record {key} has version {version}; this build reads version 1 (upgrade it)"
    )]
    UnsupportedErasureVersion {
        /// The record's key.
        key: String,
        /// Its version.
        version: u64,
    },
    /// A manifest that is not valid v4 JSON (missing or unknown fields, bad values).
    #[error("invalid manifest {key}: {reason}")]
    InvalidManifest {
        /// The manifest key.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// A payload that does not decode (bad Parquet, bad JSON, bad encoding, rows out of order
    /// or outside the bucket).
    #[error("cannot decode archive payload {key}: {reason}")]
    Decode {
        /// The payload key.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// Records handed to the writer that cannot be archived as this bucket (wrong partition,
    /// outside the bucket, not in strictly increasing clustering order).
    #[error("invalid input for archive of {bucket}: {reason}")]
    InvalidInput {
        /// The bucket being written.
        bucket: String,
        /// What was wrong.
        reason: String,
    },
    /// An object-store operation failed.
    #[error("object store {op} of {key} failed: {source}")]
    Storage {
        /// The operation (`read`, `write`, `stat`, `list`, `delete`).
        op: &'static str,
        /// The key involved.
        key: String,
        /// The OpenDAL error.
        #[source]
        source: opendal::Error,
    },
    /// The store does not refuse a second create of an existing key (create-if-absent is
    /// unsupported or ignored), so archives there could be silently overwritten.
    #[error("archive store {store} does not honour create-if-absent: {reason}")]
    CreateOnceUnsupported {
        /// The store (scheme, bucket or root, prefix; never credentials).
        store: String,
        /// What the probe saw.
        reason: String,
    },
    /// The local spill file of a segment being written could not be created, written or
    /// read back (a full or missing spill directory).
    #[error("segment spill file in {dir}: {source}")]
    Spill {
        /// The spill directory.
        dir: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A value failed model validation.
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl ArchiveError {
    /// Whether retrying the same call may succeed: transient storage errors only. Integrity
    /// errors are permanent for the object that produced them (a write that fails its own
    /// verification may be retried as a whole, which then compares against what is stored).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Storage { source, .. } => {
                source.is_temporary()
                    || matches!(
                        source.kind(),
                        opendal::ErrorKind::RateLimited | opendal::ErrorKind::Unexpected
                    )
            }
            _ => false,
        }
    }

    pub(crate) fn storage(op: &'static str, key: &str, source: opendal::Error) -> Self {
        if source.kind() == opendal::ErrorKind::NotFound {
            return Self::NotFound {
                key: key.to_string(),
            };
        }
        Self::Storage {
            op,
            key: key.to_string(),
            source,
        }
    }

    pub(crate) fn decode(key: &str, reason: impl fmt::Display) -> Self {
        Self::Decode {
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// What a scan returns: rows matching `bounds` exactly, in clustering order.
#[derive(Debug, Clone)]
pub struct ArchiveScan {
    /// Rows to return ([`ScanBounds::matches`] semantics, applied exactly).
    pub bounds: ScanBounds,
    /// Newest first (`(event_time, sort_key)` descending) instead of oldest first.
    pub descending: bool,
    /// Whether the `value` column is read and returned.
    pub include_value: bool,
    /// Whether `event_time` and `sort_key` are read and returned. `false` is for scans that
    /// need neither (an aggregate over `channel_id` and `content`) and requires unbounded
    /// `bounds`: Parquet payloads then decode only `partition_key` (and `value`), and rows
    /// are checked for their partition but not re-checked for bucket bounds and order. The
    /// block digests prove the bytes are the ones the writer decoded and checked, row by
    /// row, before it published the manifest. JSON payloads always return every column.
    pub include_keys: bool,
    /// Maximum rows per returned batch (at least 1).
    pub batch_rows: usize,
    /// Which value fields are read, and predicates on value columns the scan may apply
    /// early. Only a declared table's columnar Parquet payloads (record schema 3) use it:
    /// they read just those columns, and may leave out rows the predicates exclude. Other
    /// payloads return every row's whole value.
    pub value: ValueRead,
}

impl Default for ArchiveScan {
    fn default() -> Self {
        Self {
            bounds: ScanBounds::all(),
            descending: false,
            include_value: true,
            include_keys: true,
            batch_rows: 8192,
            value: ValueRead::default(),
        }
    }
}

/// Counters of one or more scans, shared with the caller (EXPLAIN ANALYZE reads them).
#[derive(Debug, Default)]
pub struct ArchiveScanMetrics {
    /// Bytes fetched from the object store (block-aligned verified reads included).
    pub bytes_read: AtomicU64,
    /// Read requests sent to the object store.
    pub requests: AtomicU64,
    /// Row groups in the payloads scanned.
    pub row_groups_total: AtomicU64,
    /// Row groups skipped from their statistics, without reading their data.
    pub row_groups_pruned: AtomicU64,
    /// Data pages skipped from the page index.
    pub pages_pruned: AtomicU64,
    /// Rows returned to the caller.
    pub rows_returned: AtomicU64,
}

impl ArchiveScanMetrics {
    /// A snapshot `(bytes_read, requests, row_groups_total, row_groups_pruned, pages_pruned,
    /// rows_returned)` for tests and display.
    pub fn snapshot(&self) -> ScanMetricsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ScanMetricsSnapshot {
            bytes_read: g(&self.bytes_read),
            requests: g(&self.requests),
            row_groups_total: g(&self.row_groups_total),
            row_groups_pruned: g(&self.row_groups_pruned),
            pages_pruned: g(&self.pages_pruned),
            rows_returned: g(&self.rows_returned),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Plain values of [`ArchiveScanMetrics`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScanMetricsSnapshot {
    /// See [`ArchiveScanMetrics::bytes_read`].
    pub bytes_read: u64,
    /// See [`ArchiveScanMetrics::requests`].
    pub requests: u64,
    /// See [`ArchiveScanMetrics::row_groups_total`].
    pub row_groups_total: u64,
    /// See [`ArchiveScanMetrics::row_groups_pruned`].
    pub row_groups_pruned: u64,
    /// See [`ArchiveScanMetrics::pages_pruned`].
    pub pages_pruned: u64,
    /// See [`ArchiveScanMetrics::rows_returned`].
    pub rows_returned: u64,
}

/// A written and verified archive: the manifest key the archiver may publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenArchive {
    /// Key of the verified manifest.
    pub manifest_key: String,
    /// The manifest as stored (on a retry, the one found in the store).
    pub manifest: Manifest,
}

/// One object under the store's prefix (for orphan garbage collection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The full key (usable with [`ArchiveStore::delete_object`]).
    pub key: String,
    /// When the store last modified it, if the backend reports it.
    pub last_modified: Option<chrono::DateTime<chrono::Utc>>,
    /// Size in bytes.
    pub size: u64,
}

/// An archive namespace: an OpenDAL operator and a key prefix inside it.
#[derive(Debug, Clone)]
pub struct ArchiveStore {
    op: opendal::Operator,
    prefix: String,
    row_group_rows: usize,
    block_size: u64,
    /// Verified Parquet footers of payloads already opened (shared by clones).
    footers: Arc<parquet::FooterCache>,
    /// Segment manifests, footers and decoded partitions (shared by clones).
    segments: Arc<segment::SegmentCache>,
    /// Test hook (set only through `with_lossy_encoder`, a `failpoints` build): the encoder
    /// loses one row, so the bytes verify but the decoded row count does not.
    lossy_encoder: bool,
}

impl ArchiveStore {
    /// Builds a store from a URL: `file:///abs/path`, `s3://bucket/prefix`, `memory://`.
    /// See `archive/url.rs` (and the README) for the S3 environment variables.
    pub fn from_url(url: &str) -> Result<Self, ArchiveError> {
        url::store_from_url(url)
    }

    /// Wraps an operator; every key of this store starts with `prefix` (slashes trimmed).
    pub fn from_operator(op: opendal::Operator, prefix: &str) -> Self {
        Self {
            op,
            prefix: prefix.trim_matches('/').to_string(),
            row_group_rows: ROW_GROUP_ROWS,
            block_size: BLOCK_SIZE,
            footers: Arc::default(),
            segments: Arc::default(),
            lossy_encoder: false,
        }
    }

    /// The same store with an encoder that silently loses one row of every payload, as a
    /// buggy encoder would: the stored bytes match what was encoded, so only the writer's
    /// decode check can notice. For tests of that check; `failpoints` builds only.
    #[cfg(feature = "failpoints")]
    #[doc(hidden)]
    #[must_use]
    pub fn with_lossy_encoder(mut self) -> Self {
        self.lossy_encoder = true;
        self
    }

    pub(crate) fn lossy_encoder(&self) -> bool {
        self.lossy_encoder
    }

    /// The same store writing Parquet row groups of `rows` rows (default [`ROW_GROUP_ROWS`]).
    /// Smaller groups prune finer and cost more footer; tests use them to get many groups
    /// from few rows. Retries of one generation must use the same setting, since it changes
    /// the payload bytes.
    #[must_use]
    pub fn with_row_group_rows(mut self, rows: usize) -> Self {
        self.row_group_rows = rows.max(8);
        self
    }

    /// The same store recording verification digests every `bytes` bytes (default
    /// [`BLOCK_SIZE`], at least 4 KiB). Readers take the size from each manifest.
    #[must_use]
    pub fn with_block_size(mut self, bytes: u64) -> Self {
        self.block_size = bytes.max(4096);
        self
    }

    /// The same store with its own segment cache keeping at most `bytes` of decoded
    /// partition slices (default 256 MiB, shared by clones; 0 keeps none). The compactor
    /// reads its sources through a store with none, so its memory stays bounded by its own
    /// settings; footers and manifests are kept either way (a few KiB each, 1,024 of each).
    #[must_use]
    pub fn with_segment_cache_bytes(&self, bytes: usize) -> Self {
        Self {
            segments: Arc::new(segment::SegmentCache::with_partition_bytes(bytes)),
            ..self.clone()
        }
    }

    /// Verification block size of new archives.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Rows per Parquet row group this store writes.
    pub fn row_group_rows(&self) -> usize {
        self.row_group_rows
    }

    /// The same store with a fault-injecting layer on its operator (tests, chaos runs).
    #[must_use]
    pub fn with_faults(&self, layer: FaultLayer) -> Self {
        Self {
            op: self.op.clone().layer(layer),
            ..self.clone()
        }
    }

    /// The underlying operator.
    pub fn operator(&self) -> &opendal::Operator {
        &self.op
    }

    /// The key prefix (no leading or trailing slash; may be empty).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A key relative to the prefix made absolute.
    pub(crate) fn rooted(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{}", self.prefix, rel)
        }
    }

    fn generation_dir(&self, bucket: &BucketId, generation: i64) -> String {
        // Bucket keys contain ':' (`day:2024-03-10`): legal in S3 keys (percent-encoded on the
        // wire by OpenDAL) and in Linux file names, and kept verbatim so keys stay readable.
        let rel = format!(
            "v4/{}/{}/{}/g{}",
            bucket.table_id,
            bucket.partition_key.to_hex(),
            bucket.bucket_key,
            generation
        );
        if self.prefix.is_empty() {
            rel
        } else {
            format!("{}/{}", self.prefix, rel)
        }
    }

    /// The directory of one generation of a bucket, ending with `/`: where its claim
    /// writes, and the prefix noted for GC before it does.
    pub fn generation_prefix(&self, bucket: &BucketId, generation: i64) -> String {
        format!("{}/", self.generation_dir(bucket, generation))
    }

    /// The directory of a window's segments, ending with `/`: where a compaction of the
    /// window writes, and the prefix noted for GC before it does.
    pub fn segments_prefix(&self, table: &TableId, window_key: &str) -> String {
        self.rooted(&format!("v4/{table}/segments/{window_key}/"))
    }

    /// The payload key of one generation of a bucket.
    pub fn payload_key(&self, bucket: &BucketId, generation: i64, format: PayloadFormat) -> String {
        format!(
            "{}/payload.{}",
            self.generation_dir(bucket, generation),
            format.extension()
        )
    }

    /// The manifest key of one generation of a bucket.
    pub fn manifest_key(&self, bucket: &BucketId, generation: i64) -> String {
        format!("{}/manifest.json", self.generation_dir(bucket, generation))
    }

    /// Streams `pages` (each in clustering order, together strictly increasing) into one
    /// payload with create-if-absent, reads it back and verifies it (length, SHA-256, block
    /// digests, decoded row count and clustering order), creates the manifest in one
    /// conditional PUT and reads it back. Returns only when all of that succeeded. A retry
    /// that finds the same payload and an equivalent manifest already stored succeeds and
    /// returns the stored manifest; different content is [`ArchiveError::AlreadyExistsDifferent`].
    /// Memory stays bounded by one row group (Parquet) or one chunk (JSON), whatever the
    /// bucket size.
    ///
    /// An error of `pages` aborts the write and comes back as [`WriteError::Source`],
    /// unchanged.
    pub async fn write_bucket<S, E>(
        &self,
        bucket: &BucketId,
        generation: i64,
        format: PayloadFormat,
        pages: S,
    ) -> Result<WrittenArchive, WriteError<E>>
    where
        S: Stream<Item = Result<Vec<Record>, E>> + Send,
    {
        self.write_bucket_with(bucket, generation, format, None, pages)
            .await
    }

    /// [`Self::write_bucket`] for a declared table: a Parquet payload in the columnar
    /// layout of `layout` (each value column typed and named; see
    /// [`ValueColumns`]), record schema 3 in the manifest. A JSON payload is
    /// written as by [`Self::write_bucket`].
    pub async fn write_bucket_with<S, E>(
        &self,
        bucket: &BucketId,
        generation: i64,
        format: PayloadFormat,
        layout: Option<&ValueColumns>,
        pages: S,
    ) -> Result<WrittenArchive, WriteError<E>>
    where
        S: Stream<Item = Result<Vec<Record>, E>> + Send,
    {
        write::write_bucket(self, bucket, generation, format, layout, pages).await
    }

    /// Reads a manifest and validates it strictly against the bucket the route names.
    pub async fn read_manifest(
        &self,
        key: &str,
        expected: &BucketId,
    ) -> Result<Manifest, ArchiveError> {
        let bytes = self
            .op
            .read(key)
            .await
            .map_err(|e| ArchiveError::storage("read", key, e))?;
        Manifest::parse(&bytes.to_bytes(), key, expected)
    }

    /// Streams the matching rows of an archive as envelope batches (see [`ArchiveScan`]).
    pub async fn scan(
        &self,
        manifest: &Manifest,
        req: &ArchiveScan,
    ) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
        self.scan_with_metrics(manifest, req, Arc::new(ArchiveScanMetrics::default()))
            .await
    }

    /// [`Self::scan`], counting bytes, requests and pruning into `metrics`.
    pub async fn scan_with_metrics(
        &self,
        manifest: &Manifest,
        req: &ArchiveScan,
        metrics: Arc<ArchiveScanMetrics>,
    ) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
        check_scan(req)?;
        let stream = match manifest.format {
            PayloadFormat::Parquet => {
                parquet::scan(
                    self.op.clone(),
                    manifest.clone(),
                    req.clone(),
                    metrics,
                    &self.footers,
                )
                .await?
            }
            PayloadFormat::Json => {
                json::scan(self.op.clone(), manifest.clone(), req.clone(), metrics).await?
            }
        };
        Ok(stream)
    }

    /// All records of an archive, after verifying the whole payload (length, SHA-256, row
    /// count). Holds the payload in memory: for tests, tools and the archiver's checks.
    pub async fn read_all(&self, manifest: &Manifest) -> Result<Vec<Record>, ArchiveError> {
        let key = &manifest.payload_key;
        let bytes = self
            .op
            .read(key)
            .await
            .map_err(|e| ArchiveError::storage("read", key, e))?
            .to_bytes();
        integrity::verify_whole(key, &bytes, manifest)?;
        let records = match manifest.format {
            PayloadFormat::Parquet => parquet::decode_all(key, bytes, manifest.schema_version)?,
            PayloadFormat::Json => json::decode_all(key, &bytes, manifest.schema_version)?,
        };
        integrity::check_records(key, manifest, &records)?;
        Ok(records)
    }

    /// Every object under this store's prefix, for orphan garbage collection.
    pub async fn list_objects(&self) -> Result<Vec<ObjectInfo>, ArchiveError> {
        let root = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        self.list_under(&root).await
    }

    /// The root every key of this archive starts with (`""` or the prefix and `/`).
    pub fn root_prefix(&self) -> String {
        if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        }
    }

    /// Whether `key` lies under this store's prefix (an object of this archive).
    pub fn holds_key(&self, key: &str) -> bool {
        self.prefix.is_empty() || key.starts_with(&format!("{}/", self.prefix))
    }

    /// Every object whose key starts with `dir` (a directory ending with `/`, under this
    /// store's prefix), with its age, in key order: what an incremental GC pass looks at.
    pub async fn list_under(&self, dir: &str) -> Result<Vec<ObjectInfo>, ArchiveError> {
        let root = dir;
        if !(root.is_empty() || root.ends_with('/')) || !self.holds_key(root) {
            return Err(ArchiveError::Config(format!(
                "cannot list {root:?}: not a directory (ending with '/') under the archive prefix"
            )));
        }
        let lister = self
            .op
            .lister_with(root)
            .recursive(true)
            .await
            .map_err(|e| ArchiveError::storage("list", root, e))?;
        let entries: Vec<opendal::Entry> = lister
            .try_collect()
            .await
            .map_err(|e| ArchiveError::storage("list", root, e))?;
        let mut out = Vec::new();
        for entry in entries {
            if !entry.metadata().is_file() {
                continue;
            }
            let key = entry.path().to_string();
            let mut meta = entry.metadata().clone();
            if meta.last_modified().is_none() {
                // Some backends list names only; the GC needs ages, so ask for them.
                meta = match self.op.stat(&key).await {
                    Ok(m) => m,
                    // Deleted between list and stat: not an object any more.
                    Err(e) if e.kind() == opendal::ErrorKind::NotFound => continue,
                    Err(e) => return Err(ArchiveError::storage("stat", &key, e)),
                };
            }
            out.push(ObjectInfo {
                key,
                last_modified: meta.last_modified().and_then(|t| {
                    let t = t.into_inner();
                    chrono::DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond() as u32)
                }),
                size: meta.content_length(),
            });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Deletes one object (absent objects are not an error).
    pub async fn delete_object(&self, key: &str) -> Result<(), ArchiveError> {
        match self.op.delete(key).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ArchiveError::Storage {
                op: "delete",
                key: key.to_string(),
                source: e,
            }),
        }
    }
}

pub(crate) fn check_scan(req: &ArchiveScan) -> Result<(), ArchiveError> {
    if req.batch_rows == 0 {
        return Err(ArchiveError::Config("batch_rows must be at least 1".into()));
    }
    if !req.include_keys && req.bounds != ScanBounds::all() {
        return Err(ArchiveError::Config(
            "a scan with bounds must read event_time and sort_key (include_keys)".into(),
        ));
    }
    Ok(())
}

/// Collects a scan into batches (tests and small tools).
pub async fn collect_scan(
    stream: BoxStream<'static, Result<RecordBatch, ArchiveError>>,
) -> Result<Vec<RecordBatch>, ArchiveError> {
    stream.try_collect().await
}

/// Rows of scan batches as records (requires the `value` column).
pub fn batches_to_records(batches: &[RecordBatch]) -> Result<Vec<Record>, ArchiveError> {
    let mut out = Vec::new();
    for b in batches {
        out.extend(crate::model::batch_to_records(b)?);
    }
    Ok(out)
}
