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
//!
//! Adjacent buckets of one key that a listing saw archived in the same segment are read as
//! one run ([`DurableTable::read_run`]): one manifest, one statement for their masks, each
//! row group once, and rows that leave a row group at a time; each bucket keeps its own
//! interval and row count check.
//!
//! A route may name an object that is gone: garbage collection deletes an object a
//! compaction replaced once it has been retired for the archiver's retirement delay, which
//! covers the readers' bounds, but a reader past them (a cursor held open, a route kept
//! against the configuration) meets `NotFound`. A read that meets it before returning any
//! row of the object asks the hot store for the bucket's route once, bypassing the cache
//! ([`DurableTable::reresolve`]); if the route moved to another object, the read follows it
//! from the same bounds, else the `NotFound` (naming the object) stands. Rows already
//! returned from an object are never re-read elsewhere: a later `NotFound` stands too.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream, StreamExt};

use super::masks::Masks;
use super::routes::Step;
use super::{BucketChunk, BucketScan, DurableTable, Route, TableError, Tier};
use crate::archive::{ArchiveError, ArchiveScan, ArchiveScanMetrics, RouteManifest, RunStream};
use crate::model::{BucketId, ScanBounds};

/// One archived read: the bucket, the route's object and when the route was read, the
/// bounds, and whether the route may still be re-read after a `NotFound`.
struct Read {
    table: DurableTable,
    bucket: BucketId,
    object_key: String,
    read_at: Instant,
    bounds: ScanBounds,
    req: BucketScan,
    first_of_bucket: bool,
    may_reresolve: bool,
}

impl DurableTable {
    /// Streams an archived bucket's rows matching `bounds`, in the read's order, from the
    /// manifest at `object_key` (a route read from the hot store at `read_at`). The first
    /// non-empty batch is the bucket's first chunk when `first_of_bucket` (nothing was read
    /// from another tier before).
    pub(super) fn read_archived(
        &self,
        bucket: BucketId,
        (object_key, read_at): (String, Instant),
        bounds: ScanBounds,
        req: &BucketScan,
        first_of_bucket: bool,
    ) -> BoxStream<'static, Result<Step, TableError>> {
        Read {
            table: self.clone(),
            bucket,
            object_key,
            read_at,
            bounds,
            req: req.clone(),
            first_of_bucket,
            may_reresolve: true,
        }
        .stream()
    }

    /// The bucket's route read again from the hot store, bypassing the cache, after its
    /// object `gone` was not found: `Some` when it now names another object (to be read
    /// instead), `None` when it did not change (or the bucket is no longer archived), so
    /// the `NotFound` stands.
    pub(super) async fn reresolve(
        &self,
        bucket: &BucketId,
        gone: &str,
    ) -> Result<Option<(String, Instant)>, TableError> {
        self.inner.cache.forget(bucket, gone);
        let read_at = Instant::now();
        let Some(meta) = self.inner.store.bucket(bucket).await? else {
            return Ok(None);
        };
        Ok(match Route::of_state(&meta.state, read_at) {
            Route::Archived { object_key, .. } if object_key != gone => Some((object_key, read_at)),
            _ => None,
        })
    }

    /// The validated manifest of an Archived route: from the cache when fresh and naming the
    /// same object, else read from the archive (checked against the bucket) and cached for
    /// what is left of the route's bound from `read_at`.
    pub(super) async fn manifest_for(
        &self,
        bucket: &BucketId,
        object_key: &str,
        read_at: Instant,
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
        self.inner.cache.insert(
            bucket.clone(),
            object_key.to_string(),
            manifest.clone(),
            read_at,
        );
        Ok(manifest)
    }

    // The archive's own error type is the stream's; boxing it here alone would differ
    // from every other archived read.
    #[allow(clippy::result_large_err)]
    async fn open_archive(
        &self,
        bucket: &BucketId,
        (object_key, read_at): (&str, Instant),
        req: &BucketScan,
        bounds: &ScanBounds,
    ) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, TableError> {
        let manifest = self.manifest_for(bucket, object_key, read_at).await?;
        // Read on every archived bucket read, never cached: a DELETE is visible to every
        // read that starts after it returns.
        let masks = Masks::new(self.inner.store.row_masks(bucket).await?);
        let scan = archive_scan(req, bounds, &masks);
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

/// The archive read of `req` within `bounds`, given the masks it will apply.
fn archive_scan(req: &BucketScan, bounds: &ScanBounds, masks: &Masks) -> ArchiveScan {
    ArchiveScan {
        bounds: bounds.clone(),
        descending: req.descending,
        include_value: req.include_value,
        // The exact bounds are applied on these two columns, so bounded reads need them;
        // so do masks, which name rows by them.
        include_keys: req.include_keys || *bounds != ScanBounds::all() || !masks.is_empty(),
        // Sized by the rows the read wanted when it started (`req.limit`), not by what
        // is left: the limit slices the last batch.
        batch_rows: req.page_rows.min(req.limit.unwrap_or(usize::MAX)).max(1),
        value: if masks.has_edits() {
            // An edit may make a row match whose archived value does not.
            crate::model::schema::predicate::ValueRead {
                filters: Arc::new([]),
                ..req.value.clone()
            }
        } else {
            req.value.clone()
        },
    }
}

impl DurableTable {
    /// The buckets of a [`ScanUnit::Run`](super::ScanUnit::Run) (one partition, in time
    /// order, listed as archived in the segment `object_key`), read as one: the manifest
    /// once, the masks of every bucket in one statement (read when the run starts, so a
    /// `DELETE` that returned before it is applied), then the segment's row groups once
    /// each, with every bucket's bounds and row count checked as a bucket read checks them
    /// ([`crate::archive::ArchiveStore::scan_segment_run`]). A route that is not a v6
    /// segment, or an object gone before any row of it was returned, falls back to reading
    /// the buckets one by one (each then follows its own route, as a bucket read does).
    pub(super) fn read_run(
        &self,
        buckets: Vec<BucketId>,
        (object_key, read_at): (String, Instant),
        req: BucketScan,
        limit: super::RowLimit,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let table = self.clone();
        stream::once(async move {
            let opened = table.open_run(&buckets, (&object_key, read_at), &req).await;
            let one_by_one = move |table: DurableTable, buckets: Vec<BucketId>| {
                let route = Route::Archived {
                    object_key: object_key.clone(),
                    read_at,
                };
                stream::iter(buckets)
                    .map(move |b| {
                        let bounds = req.bounds.clone();
                        table.read_bucket(
                            b,
                            Some(route.clone()),
                            bounds,
                            req.clone(),
                            limit.clone(),
                            true,
                        )
                    })
                    .flatten()
                    .boxed()
            };
            match opened {
                Ok(Some(rows)) => run_chunks(rows, buckets, table, one_by_one),
                Ok(None) => one_by_one(table, buckets),
                Err(e) if is_not_found(&e) => one_by_one(table, buckets),
                Err(e) => stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    /// The run's rows with its masks applied, or `None` when its route is not a v6 segment.
    // The archive's own error type is the stream's, as in `open_archive`.
    #[allow(clippy::result_large_err)]
    async fn open_run(
        &self,
        buckets: &[BucketId],
        (object_key, read_at): (&str, Instant),
        req: &BucketScan,
    ) -> Result<Option<RunStream>, TableError> {
        let Some(first) = buckets.first() else {
            return Ok(None);
        };
        let as_table = |source| run_error(buckets, source);
        let manifest = self.manifest_for(first, object_key, read_at).await?;
        // Not a run (a per-bucket object or a v5 segment): the bucket reads read their own
        // masks, so none are read here.
        if !manifest.reads_runs() {
            return Ok(None);
        }
        let keys: Vec<_> = buckets.iter().map(|b| b.bucket_key).collect();
        let masks = Masks::new(
            self.inner
                .store
                .row_masks_of(&first.table_id, &first.partition_key, &keys)
                .await?,
        );
        let scan = archive_scan(req, &req.bounds, &masks);
        let metrics = req
            .archive_metrics
            .clone()
            .unwrap_or_else(|| Arc::new(ArchiveScanMetrics::default()));
        let Some(rows) = self
            .inner
            .archive
            .scan_segment_run(&manifest, buckets, &scan, metrics)
            .map_err(as_table)?
        else {
            return Ok(None);
        };
        if masks.is_empty() {
            return Ok(Some(rows));
        }
        Ok(Some(
            rows.map(move |r| {
                r.and_then(|(b, n)| {
                    masks
                        .apply(b)
                        .map(|b| (b, n))
                        .map_err(|e| ArchiveError::decode("<masked batch>", e.to_string()))
                })
            })
            .boxed(),
        ))
    }
}

/// Whether `e` is an archive object not found (see the module comment).
fn is_not_found(e: &TableError) -> bool {
    matches!(e, TableError::Archive { source, .. } | TableError::ArchiveRun { source, .. }
        if matches!(**source, ArchiveError::NotFound { .. }))
}

/// `source` as the error of the run `buckets` (not empty).
fn run_error(buckets: &[BucketId], source: ArchiveError) -> TableError {
    TableError::ArchiveRun {
        first: buckets[0].clone(),
        last: buckets[buckets.len() - 1].bucket_key,
        source: Box::new(source),
    }
}

/// A run's batches as chunks: empty ones skipped, an error named after the run; an object found gone before any row was returned is read again bucket by bucket
/// (`one_by_one`), as a bucket read re-reads its route, and after a row it stands.
fn run_chunks<F>(
    rows: RunStream,
    buckets: Vec<BucketId>,
    table: DurableTable,
    one_by_one: F,
) -> BoxStream<'static, Result<BucketChunk, TableError>>
where
    F: FnOnce(DurableTable, Vec<BucketId>) -> BoxStream<'static, Result<BucketChunk, TableError>>
        + Send
        + 'static,
{
    enum State<F> {
        Reading(RunStream, bool, Vec<BucketId>, DurableTable, F),
        Rest(BoxStream<'static, Result<BucketChunk, TableError>>),
    }
    stream::unfold(
        Some(State::Reading(rows, false, buckets, table, one_by_one)),
        |state| async move {
            match state? {
                State::Rest(mut rest) => {
                    let item = rest.next().await?;
                    Some((item, Some(State::Rest(rest))))
                }
                State::Reading(mut rows, returned, buckets, table, one_by_one) => loop {
                    match rows.next().await? {
                        Ok((batch, _)) if batch.num_rows() == 0 => continue,
                        Ok((batch, n)) => {
                            let chunk = BucketChunk {
                                tier: Tier::Archived,
                                pages: 0,
                                buckets: n,
                                batch,
                            };
                            return Some((
                                Ok(chunk),
                                Some(State::Reading(rows, true, buckets, table, one_by_one)),
                            ));
                        }
                        Err(source) => {
                            let e = run_error(&buckets, source);
                            if returned || !is_not_found(&e) {
                                return Some((Err(e), None));
                            }
                            let mut rest = one_by_one(table, buckets);
                            let item = rest.next().await?;
                            return Some((item, Some(State::Rest(rest))));
                        }
                    }
                },
            }
        },
    )
    .boxed()
}

/// Where [`Read::chunks`] is: reading the object (and whether a row of it was returned),
/// or forwarding the read of the route found after a `NotFound`.
enum Chunks {
    Reading(
        BoxStream<'static, Result<RecordBatch, ArchiveError>>,
        Box<Read>,
        bool,
    ),
    Rest(BoxStream<'static, Result<Step, TableError>>),
}

impl Read {
    /// The rows, or after a `NotFound` before any of them the rows of the route read again
    /// (see the module comment).
    fn stream(self) -> BoxStream<'static, Result<Step, TableError>> {
        stream::once(async move {
            let opened = self
                .table
                .open_archive(
                    &self.bucket,
                    (&self.object_key, self.read_at),
                    &self.req,
                    &self.bounds,
                )
                .await;
            match opened {
                Ok(batches) => self.chunks(batches),
                Err(e) => self.failed(e).await,
            }
        })
        .flatten()
        .boxed()
    }

    /// A failure before any row of the object was returned: a `NotFound` re-reads the route
    /// once and reads the new object from the same bounds; anything else stands.
    async fn failed(self, e: TableError) -> BoxStream<'static, Result<Step, TableError>> {
        if !(is_not_found(&e) && self.may_reresolve) {
            return stream::once(async move { Err(e) }).boxed();
        }
        match self.table.reresolve(&self.bucket, &self.object_key).await {
            Ok(Some((object_key, read_at))) => Read {
                object_key,
                read_at,
                may_reresolve: false,
                ..self
            }
            .stream(),
            Ok(None) => stream::once(async move { Err(e) }).boxed(),
            Err(other) => stream::once(async move { Err(other) }).boxed(),
        }
    }

    /// The archive's batches as chunks: empty batches skipped, the first error returned as
    /// the bucket's and the read ended there (after a re-read of the route when no row of
    /// the object was returned yet).
    fn chunks(
        self,
        batches: BoxStream<'static, Result<RecordBatch, ArchiveError>>,
    ) -> BoxStream<'static, Result<Step, TableError>> {
        stream::unfold(
            Some(Chunks::Reading(batches, Box::new(self), false)),
            |state| async move {
                let (mut batches, mut read, returned) = match state? {
                    Chunks::Reading(batches, read, returned) => (batches, read, returned),
                    Chunks::Rest(mut rest) => {
                        let item = rest.next().await?;
                        return Some((item, Some(Chunks::Rest(rest))));
                    }
                };
                loop {
                    match batches.next().await? {
                        Err(source) => {
                            let e = TableError::Archive {
                                bucket: read.bucket.clone(),
                                source: Box::new(source),
                            };
                            if returned {
                                return Some((Err(e), None));
                            }
                            // Nothing of this object returned yet: the rest of the bucket is
                            // the whole of it, wherever its route now leads.
                            let mut rest = read.failed(e).await;
                            let item = rest.next().await?;
                            return Some((item, Some(Chunks::Rest(rest))));
                        }
                        Ok(batch) if batch.num_rows() == 0 => continue,
                        Ok(batch) => {
                            let chunk = BucketChunk {
                                tier: Tier::Archived,
                                pages: 0,
                                buckets: u32::from(std::mem::take(&mut read.first_of_bucket)),
                                batch,
                            };
                            let next = Chunks::Reading(batches, read, true);
                            return Some((Ok(Step::Rows(chunk)), Some(next)));
                        }
                    }
                }
            },
        )
        .boxed()
    }
}
