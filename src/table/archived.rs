//! The archived tier's reader: a published bucket's rows, read from the payload its
//! manifest names.
//!
//! A read starts from an Archived [`Route`](super::Route), seen by a listing, a hot page or
//! head read, or the cache. The manifest is taken from the route cache when it names the
//! same object, else read from the archive, checked against the bucket and cached; then the
//! payload is scanned with the read's bounds (a cursor included, when the read moved here
//! from the hot store part way through a bucket). An archive error is returned as it is,
//! never answered from hot rows that may still exist until cleanup. The reader neither
//! slices nor counts rows: the read's [`RowLimit`](super::RowLimit) does, once, above it.
//!
//! The bucket's delete and edit records ([`super::masks`]) are read from the hot store
//! before the payload is opened and applied to every batch, for per-bucket objects and
//! segments alike.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream, StreamExt};

use super::masks::Masks;
use super::routes::Step;
use super::{BucketChunk, BucketScan, DurableTable, TableError, Tier};
use crate::archive::{ArchiveError, ArchiveScan, ArchiveScanMetrics, RouteManifest};
use crate::model::{BucketId, ScanBounds};

impl DurableTable {
    /// Streams an archived bucket's rows matching `bounds`, in the read's order, from the
    /// manifest at `object_key`. The first non-empty batch is the bucket's first chunk when
    /// `first_of_bucket` (nothing was read from another tier before).
    pub(super) fn read_archived(
        &self,
        bucket: BucketId,
        object_key: String,
        bounds: ScanBounds,
        req: &BucketScan,
        first_of_bucket: bool,
    ) -> BoxStream<'static, Result<Step, TableError>> {
        let table = self.clone();
        let req = req.clone();
        stream::once(async move {
            match table
                .open_archive(&bucket, &object_key, &req, &bounds)
                .await
            {
                Ok(batches) => chunks(bucket, batches, first_of_bucket),
                Err(e) => stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    /// The validated manifest of an Archived route: from the cache when fresh and naming the
    /// same object, else read from the archive (checked against the bucket) and cached.
    async fn manifest_for(
        &self,
        bucket: &BucketId,
        object_key: &str,
    ) -> Result<RouteManifest, TableError> {
        if let Some(m) = self.inner.cache.manifest(bucket, object_key) {
            return Ok(m);
        }
        let manifest = self
            .inner
            .archive
            .open_route(object_key, bucket)
            .await
            .map_err(|source| TableError::Archive {
                bucket: bucket.clone(),
                source: Box::new(source),
            })?;
        self.inner
            .cache
            .insert(bucket.clone(), object_key.to_string(), manifest.clone());
        Ok(manifest)
    }

    // The archive's own error type is the stream's; boxing it here alone would differ
    // from every other archived read.
    #[allow(clippy::result_large_err)]
    async fn open_archive(
        &self,
        bucket: &BucketId,
        object_key: &str,
        req: &BucketScan,
        bounds: &ScanBounds,
    ) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, TableError> {
        let manifest = self.manifest_for(bucket, object_key).await?;
        // Read on every archived bucket read, never cached: a DELETE is visible to every
        // read that starts after it returns.
        let masks = Masks::new(self.inner.store.row_masks(bucket).await?);
        let scan = ArchiveScan {
            bounds: bounds.clone(),
            descending: req.descending,
            include_value: req.include_value,
            // The exact bounds are applied on these two columns, so bounded reads need them;
            // so do masks, which name rows by them.
            include_keys: req.include_keys || *bounds != ScanBounds::all() || !masks.is_empty(),
            // Sized by the rows the read wanted when it started (`req.limit`), not by what
            // is left: the limit slices the last batch.
            batch_rows: req.page_rows.min(req.limit.unwrap_or(usize::MAX)).max(1),
        };
        let batches = self
            .inner
            .archive
            .scan_route(
                &manifest,
                bucket,
                &scan,
                req.archive_metrics
                    .clone()
                    .unwrap_or_else(|| Arc::new(ArchiveScanMetrics::default())),
            )
            .await
            .map_err(|source| TableError::Archive {
                bucket: bucket.clone(),
                source: Box::new(source),
            })?;
        if masks.is_empty() {
            return Ok(batches);
        }
        Ok(batches
            .map(move |b| {
                b.and_then(|b| {
                    masks
                        .apply(b)
                        .map_err(|e| ArchiveError::decode("<masked batch>", e.to_string()))
                })
            })
            .boxed())
    }
}

/// The archive's batches as chunks: empty batches skipped, the first error returned as the
/// bucket's and the read ended there.
fn chunks(
    bucket: BucketId,
    batches: BoxStream<'static, Result<RecordBatch, ArchiveError>>,
    first_of_bucket: bool,
) -> BoxStream<'static, Result<Step, TableError>> {
    stream::unfold(
        Some((batches, bucket, first_of_bucket)),
        |state| async move {
            let (mut batches, bucket, mut first_of_bucket) = state?;
            loop {
                match batches.next().await? {
                    Err(source) => {
                        let e = TableError::Archive {
                            bucket,
                            source: Box::new(source),
                        };
                        return Some((Err(e), None));
                    }
                    Ok(batch) if batch.num_rows() == 0 => continue,
                    Ok(batch) => {
                        let chunk = BucketChunk {
                            tier: Tier::Archived,
                            pages: 0,
                            first_of_bucket: std::mem::take(&mut first_of_bucket),
                            batch,
                        };
                        let state = Some((batches, bucket, first_of_bucket));
                        return Some((Ok(Step::Rows(chunk)), state));
                    }
                }
            }
        },
    )
    .boxed()
}
