//! Routes to either kind of archive: what a published route names (a bucket's own v4
//! archive or a v5 segment holding it), how it is opened and checked against the routed
//! bucket, and how it is read; plus segment writes and the per-request retry of transient
//! failures that segment work and compaction share. Split from `mod.rs` so the store's
//! per-bucket API and the segment-aware API each read as one piece.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::{
    batches_to_records, check_scan, segment, ArchiveError, ArchiveScan, ArchiveScanMetrics,
    ArchiveStore, Manifest, SegmentManifest, SegmentSpec, SegmentUpload, SegmentWriter,
    WrittenSegment,
};
use crate::model::{BucketId, Record};

/// What a published route names: a per-bucket archive (manifest v4) or a segment holding the
/// bucket among others (manifest v5). Both are immutable; a route may move from the first
/// to the second (compaction), never back.
#[derive(Debug, Clone)]
pub enum RouteManifest {
    /// One bucket's own payload.
    Bucket(Arc<Manifest>),
    /// A segment of many partitions' buckets.
    Segment(Arc<SegmentManifest>),
}

impl RouteManifest {
    /// Whether [`ArchiveStore::scan_segment_run`] reads this route's buckets as one run (a
    /// v6 segment); otherwise they are read one by one.
    pub fn reads_runs(&self) -> bool {
        matches!(self, Self::Segment(m) if m.version >= 6)
    }
}

impl ArchiveStore {
    /// Writes one segment from rows sorted by `(partition_key, event_time, sort_key)` with
    /// the default [`SegmentUpload`] settings: encoded into a spill file, uploaded
    /// create-once, verified by ranges against digests of the rows, then the manifest (see
    /// `segment/write.rs`). Returns only when all of that succeeded.
    pub async fn write_segment(
        &self,
        spec: &SegmentSpec,
        records: &[Record],
    ) -> Result<WrittenSegment, ArchiveError> {
        segment::write_segment(self, spec, records).await
    }

    /// A streaming writer of one segment (see `segment/write.rs`): rows are pushed in
    /// order, encoded into a spill file, and [`SegmentWriter::finish`] uploads, verifies
    /// and commits it. Memory is bounded by the settings, not by the segment's size.
    pub fn segment_writer(
        &self,
        spec: &SegmentSpec,
        upload: &SegmentUpload,
    ) -> Result<SegmentWriter, ArchiveError> {
        SegmentWriter::new(self, spec, upload, None)
    }

    /// [`Self::segment_writer`] for a declared table: the segment's payload in the columnar
    /// layout of `layout` (record schema 3), as per-bucket payloads are written.
    pub fn segment_writer_with(
        &self,
        spec: &SegmentSpec,
        upload: &SegmentUpload,
        layout: Option<crate::archive::ValueColumns>,
    ) -> Result<SegmentWriter, ArchiveError> {
        SegmentWriter::new(self, spec, upload, layout)
    }

    /// A segment manifest, validated (and kept: manifests are immutable).
    pub async fn read_segment_manifest(
        &self,
        key: &str,
    ) -> Result<Arc<SegmentManifest>, ArchiveError> {
        if let Some(m) = self.segments.manifest(key) {
            return Ok(m);
        }
        let bytes = self
            .op
            .read(key)
            .await
            .map_err(|e| ArchiveError::storage("read", key, e))?
            .to_bytes();
        let m = Arc::new(SegmentManifest::parse(&bytes, key)?);
        self.segments.keep_manifest(key, m.clone());
        Ok(m)
    }

    /// The manifest a route names, whichever kind it is, checked against the bucket the
    /// route is for: a v4 manifest must describe exactly that bucket, a v5 segment must hold
    /// it. Unknown versions are [`ArchiveError::UnsupportedManifestVersion`].
    pub async fn open_route(
        &self,
        key: &str,
        bucket: &BucketId,
    ) -> Result<RouteManifest, ArchiveError> {
        if let Some(m) = self.segments.manifest(key) {
            m.entry_for(key, bucket)?;
            return Ok(RouteManifest::Segment(m));
        }
        let bytes = self
            .op
            .read(key)
            .await
            .map_err(|e| ArchiveError::storage("read", key, e))?
            .to_bytes();
        let version = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("manifest_version").and_then(|v| v.as_u64()));
        if version.is_some_and(|v| {
            segment::SEGMENT_MANIFEST_VERSIONS
                .iter()
                .any(|s| u64::from(*s) == v)
        }) {
            let m = Arc::new(SegmentManifest::parse(&bytes, key)?);
            m.entry_for(key, bucket)?;
            self.segments.keep_manifest(key, m.clone());
            return Ok(RouteManifest::Segment(m));
        }
        Ok(RouteManifest::Bucket(Arc::new(Manifest::parse(
            &bytes, key, bucket,
        )?)))
    }

    /// [`Self::scan_with_metrics`] for either kind of route: a segment is read one partition
    /// at a time (ranged reads of its row groups, each verified) and sliced to the bucket.
    pub async fn scan_route(
        &self,
        route: &RouteManifest,
        bucket: &BucketId,
        req: &ArchiveScan,
        metrics: Arc<ArchiveScanMetrics>,
    ) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
        let m = match route {
            RouteManifest::Bucket(m) => return self.scan_with_metrics(m, req, metrics).await,
            RouteManifest::Segment(m) => m,
        };
        check_scan(req)?;
        if m.version >= 6 {
            return segment::pruned::bucket_stream(
                self.op.clone(),
                self.segments.clone(),
                m.clone(),
                bucket.clone(),
                req.clone(),
                metrics,
            );
        }
        let batches = self.segment_bucket(m, bucket, req, &metrics).await?;
        let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        ArchiveScanMetrics::add(&metrics.rows_returned, rows);
        Ok(futures::stream::iter(batches.into_iter().map(Ok)).boxed())
    }

    /// The rows of several buckets of one partition that all route to the v6 segment
    /// `route` names, read as one ([`segment::pruned::run_stream`]), each batch with the
    /// number of buckets it begins; `None` when `route` is not such a segment (a per-bucket
    /// object, a v5 segment), whose buckets are read one by one.
    pub fn scan_segment_run(
        &self,
        route: &RouteManifest,
        buckets: &[BucketId],
        req: &ArchiveScan,
        metrics: Arc<ArchiveScanMetrics>,
    ) -> Result<Option<RunStream>, ArchiveError> {
        let RouteManifest::Segment(m) = route else {
            return Ok(None);
        };
        if !route.reads_runs() {
            return Ok(None);
        }
        check_scan(req)?;
        segment::pruned::run_stream(
            self.op.clone(),
            self.segments.clone(),
            m.clone(),
            buckets,
            req.clone(),
            metrics,
        )
        .map(Some)
    }

    async fn segment_bucket(
        &self,
        m: &Arc<SegmentManifest>,
        bucket: &BucketId,
        req: &ArchiveScan,
        metrics: &ArchiveScanMetrics,
    ) -> Result<Vec<RecordBatch>, ArchiveError> {
        if m.version >= 6 {
            let stream = segment::pruned::bucket_stream(
                self.op.clone(),
                self.segments.clone(),
                m.clone(),
                bucket.clone(),
                req.clone(),
                Arc::new(ArchiveScanMetrics::default()),
            )?;
            return stream.try_collect().await;
        }
        let (entry, _) = m.entry_for(&m.payload_key, bucket)?;
        let rows =
            segment::read::partition_rows(&self.op, &self.segments, m, entry, metrics).await?;
        segment::read::bucket_batches(&m.payload_key, &rows, bucket, req)
    }

    /// Every record of one bucket, verified, from either kind of route (the compactor's
    /// read of its sources; the row count is checked against the manifest).
    pub async fn read_bucket(
        &self,
        route: &RouteManifest,
        bucket: &BucketId,
    ) -> Result<Vec<Record>, ArchiveError> {
        let m = match route {
            RouteManifest::Bucket(m) => return self.read_all(m).await,
            RouteManifest::Segment(m) => m,
        };
        let (_, want) = m.entry_for(&m.payload_key, bucket)?;
        let req = ArchiveScan {
            batch_rows: usize::MAX,
            ..ArchiveScan::default()
        };
        let metrics = ArchiveScanMetrics::default();
        let batches = self.segment_bucket(m, bucket, &req, &metrics).await?;
        let records = batches_to_records(&batches)?;
        if records.len() as u64 != want {
            return Err(ArchiveError::RowCountMismatch {
                key: m.payload_key.clone(),
                expected: want,
                actual: records.len() as u64,
            });
        }
        Ok(records)
    }
}

/// The batches of a run of buckets read as one, each with the number of buckets whose
/// first returned rows it holds ([`ArchiveStore::scan_segment_run`]).
pub type RunStream = BoxStream<'static, Result<(RecordBatch, u32), ArchiveError>>;

/// Attempts after the first of one request retried by [`retry_transient`].
const TRANSIENT_RETRIES: u32 = 8;

/// Whether to retry a request that failed transiently, after a pause (the store's own retry
/// layer has given up, or a fault layer sits above it). For work that makes hundreds of
/// requests in a row (compaction, segment writes), where one unlucky request should not
/// throw the rest away. Integrity errors are never retried. Call with `attempt` at 0 for a
/// new request.
pub(crate) async fn retry_transient(e: &ArchiveError, attempt: &mut u32) -> bool {
    if !e.is_retryable() || *attempt >= TRANSIENT_RETRIES {
        return false;
    }
    *attempt += 1;
    tokio::time::sleep(std::time::Duration::from_millis(
        (25 << *attempt).min(1_000),
    ))
    .await;
    true
}
