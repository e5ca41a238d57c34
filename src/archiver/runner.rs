//! The per-bucket archival protocol and the discovery loop around it.
//!
//! For each discovered bucket: claim, snapshot in pages under the fence, upload and verify,
//! publish the route in one conditional transaction, wait out the readers' route-cache bound,
//! then delete the hot rows in small transactions. A heartbeat renews the lease the whole
//! time; losing it stops the bucket before anything else is written. Every step is
//! idempotent and every ambiguous result is settled by re-reading the store, so dropping the
//! work at any await point (a crash, a deadline, SIGKILL) leaves state another worker can
//! finish.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, FuturesUnordered, StreamExt};
use tokio::sync::{Mutex, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::archive::{ArchiveError, ArchiveStore};
use crate::failpoint;
use crate::model::{BucketId, ClusteringKey, Record};
use crate::store::{BucketState, Claim, HotStore, StoreError, WorkItem, WorkKind};

use super::{ArchiverConfig, ArchiverError, ArchiverMetrics};

/// What happened to one work item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketOutcome {
    /// Published (and cleaned up when `cleaned`).
    Archived {
        /// Rows in the archive.
        rows: u64,
        /// Payload bytes.
        bytes: u64,
        /// Whether the hot rows were deleted in the same attempt.
        cleaned: bool,
    },
    /// A published bucket's hot rows were deleted.
    Cleaned {
        /// Rows deleted.
        rows_deleted: u64,
    },
    /// Work failed before publication; the bucket is Hot again with a retry time.
    Deferred {
        /// Why.
        reason: String,
    },
    /// Another worker owns the bucket or it is no longer eligible.
    Skipped,
    /// The claim was lost mid-way; nothing more was written under it.
    LeaseLost,
}

impl BucketOutcome {
    /// Whether the attempt counts as a failure for `--once`.
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Deferred { .. } | Self::LeaseLost)
    }
}

/// Totals of one discovery cycle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleReport {
    /// Work items discovered.
    pub discovered: usize,
    /// Buckets published.
    pub archived: usize,
    /// Buckets cleaned up (including those archived in this cycle).
    pub cleaned: usize,
    /// Buckets deferred.
    pub deferred: usize,
    /// Items that failed (deferred, lease lost, or errors).
    pub failed: usize,
    /// Items skipped because someone else owns them.
    pub skipped: usize,
    /// One line per failure.
    pub errors: Vec<String>,
}

/// How a cleanup attempt ended.
enum Cleanup {
    /// All hot rows deleted (this many by us).
    Done(u64),
    /// Already clean, or another worker holds the cleanup.
    NotOurs,
    /// Our cleanup claim went stale mid-way.
    LeaseLost,
}

/// One archiver process's worker.
pub struct Runner {
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    config: ArchiverConfig,
    metrics: Arc<ArchiverMetrics>,
}

/// Renews a claim in the background until dropped; `lost` fires when renewal fails for good.
struct LeaseKeeper {
    lost: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        // Cancellation safety: whoever drops the work also stops renewing its lease.
        self.handle.abort();
    }
}

impl Runner {
    /// Validates the configuration and builds a runner.
    pub fn new(
        store: Arc<dyn HotStore>,
        archive: Arc<ArchiveStore>,
        config: ArchiverConfig,
    ) -> Result<Self, ArchiverError> {
        config.validate()?;
        Ok(Self {
            store,
            archive,
            config,
            metrics: Arc::new(ArchiverMetrics::default()),
        })
    }

    /// This runner's counters.
    pub fn metrics(&self) -> Arc<ArchiverMetrics> {
        self.metrics.clone()
    }

    /// The configuration in force.
    pub fn config(&self) -> &ArchiverConfig {
        &self.config
    }

    /// Discovers work once and processes all of it, `config.concurrency` buckets at a time.
    /// `progress(done, total)` is called after each item. Items not yet started when
    /// `shutdown` fires are left for the next process.
    pub async fn run_cycle(
        &self,
        shutdown: &CancellationToken,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<CycleReport, ArchiverError> {
        let items = self
            .op(
                "discover",
                self.store
                    .discover(self.config.eligible_before, self.config.scan_limit),
            )
            .await?;
        let total = items.len();
        let mut report = CycleReport {
            discovered: total,
            ..CycleReport::default()
        };
        progress(0, total);
        let permits = Arc::new(Semaphore::new(self.config.concurrency));
        let mut running: FuturesUnordered<_> = items
            .iter()
            .map(|item| {
                let permits = permits.clone();
                async move {
                    if shutdown.is_cancelled() {
                        return (item, Ok(BucketOutcome::Skipped));
                    }
                    let r = self.process(item, &permits).await;
                    (item, r)
                }
            })
            .collect();
        let mut done = 0;
        while let Some((item, result)) = running.next().await {
            done += 1;
            progress(done, total);
            match result {
                Ok(BucketOutcome::Archived { cleaned, .. }) => {
                    report.archived += 1;
                    report.cleaned += usize::from(cleaned);
                }
                Ok(BucketOutcome::Cleaned { .. }) => report.cleaned += 1,
                Ok(BucketOutcome::Skipped) => report.skipped += 1,
                Ok(BucketOutcome::Deferred { reason }) => {
                    report.deferred += 1;
                    report.failed += 1;
                    report
                        .errors
                        .push(format!("{}: deferred: {reason}", item.bucket));
                }
                Ok(BucketOutcome::LeaseLost) => {
                    report.failed += 1;
                    report.errors.push(format!("{}: lease lost", item.bucket));
                }
                Err(e) => {
                    self.metrics.buckets_failed.inc();
                    report.failed += 1;
                    report.errors.push(format!("{}: {e}", item.bucket));
                }
            }
        }
        let cutoff = self.config.eligible_before;
        self.metrics
            .cycle_finished(&*self.store, cutoff, &report)
            .await;
        Ok(report)
    }

    /// Loops discovery cycles (and periodic GC) until `shutdown` fires; the cycle in progress
    /// finishes its started buckets first.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), ArchiverError> {
        let gc_every = self.config.interval.max(Duration::from_secs(600));
        let mut last_gc: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            match self.run_cycle(&shutdown, &|_, _| {}).await {
                Ok(r) if r.discovered > 0 => info!(
                    discovered = r.discovered,
                    archived = r.archived,
                    cleaned = r.cleaned,
                    failed = r.failed,
                    "cycle finished"
                ),
                Ok(_) => debug!("cycle found no work"),
                Err(e) => warn!(error = %e, "cycle failed; retrying after the interval"),
            }
            if last_gc.is_none_or(|t| t.elapsed() >= gc_every) {
                match super::gc::collect_garbage(
                    &*self.store,
                    &self.archive,
                    self.config.gc_delay,
                    &self.metrics,
                )
                .await
                {
                    Ok(r) => info!(listed = r.listed, deleted = r.deleted, "orphan GC finished"),
                    Err(e) => warn!(error = %e, "orphan GC failed"),
                }
                last_gc = Some(Instant::now());
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.config.interval) => {}
            }
        }
        info!("archiver stopped");
        Ok(())
    }

    /// Runs one work item to its end.
    pub async fn process(
        &self,
        item: &WorkItem,
        permits: &Semaphore,
    ) -> Result<BucketOutcome, ArchiverError> {
        let span = info_span!("bucket", bucket = %item.bucket, kind = ?item.kind);
        async {
            let permit = permits.acquire().await.expect("semaphore never closed");
            let _in_flight = self.metrics.track_in_flight();
            let outcome = match item.kind {
                WorkKind::Eligible | WorkKind::ExpiredClaim => {
                    let Some(claim) = self
                        .op("claim", self.store.claim(&item.bucket, self.config.lease))
                        .await?
                    else {
                        debug!("not claimable (owned elsewhere or no longer eligible)");
                        return Ok(BucketOutcome::Skipped);
                    };
                    info!(generation = claim.generation, "claimed");
                    failpoint::hit("after_claim");
                    self.archive_claimed(claim, permit, permits).await?
                }
                WorkKind::CleanupPending => {
                    drop(permit);
                    match self.finish_cleanup(&item.bucket, permits).await? {
                        Cleanup::Done(rows_deleted) => BucketOutcome::Cleaned { rows_deleted },
                        Cleanup::NotOurs => BucketOutcome::Skipped,
                        Cleanup::LeaseLost => BucketOutcome::LeaseLost,
                    }
                }
            };
            if outcome == BucketOutcome::LeaseLost {
                self.metrics.lease_losses.inc();
                warn!("lease lost; stopped without writing further");
            }
            Ok(outcome)
        }
        .instrument(span)
        .await
    }

    async fn archive_claimed(
        &self,
        claim: Claim,
        permit: tokio::sync::SemaphorePermit<'_>,
        permits: &Semaphore,
    ) -> Result<BucketOutcome, ArchiverError> {
        let started = Instant::now();
        let keeper = self.keep_lease(claim.clone());
        let store_error: Arc<Mutex<Option<StoreError>>> = Arc::new(Mutex::new(None));
        let pages = snapshot_pages(
            self.store.clone(),
            claim.clone(),
            self.config.snapshot_page_rows,
            self.config.op_deadline,
            store_error.clone(),
        );
        let upload =
            self.archive
                .write_bucket(&claim.bucket, claim.generation, self.config.format, pages);
        let written = tokio::select! {
            biased;
            _ = keeper.lost.cancelled() => return Ok(BucketOutcome::LeaseLost),
            r = tokio::time::timeout(self.config.upload_deadline, upload) => match r {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => {
                    let reason = match store_error.lock().await.take() {
                        Some(StoreError::StaleClaim { .. }) => return Ok(BucketOutcome::LeaseLost),
                        Some(se) => format!("snapshot failed: {se}"),
                        None => format!("upload failed: {e}"),
                    };
                    return self.defer(&claim, reason).await;
                }
                Err(_) => return self.defer(&claim, "upload deadline passed".into()).await,
            },
        };
        failpoint::hit("after_verify");
        info!(
            key = %written.manifest_key,
            rows = written.manifest.row_count,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshotted, uploaded and verified"
        );
        if keeper.lost.is_cancelled() {
            return Ok(BucketOutcome::LeaseLost);
        }
        if !self.publish(&claim, &written.manifest_key).await? {
            return Ok(BucketOutcome::LeaseLost);
        }
        failpoint::hit("after_publish");
        self.metrics.buckets_archived.inc();
        self.metrics
            .rows_archived
            .inc_by(written.manifest.row_count);
        self.metrics
            .bytes_archived
            .inc_by(written.manifest.byte_length);
        info!(key = %written.manifest_key, elapsed_ms = started.elapsed().as_millis() as u64, "published");
        // Publication released the claim; cleanup is a separate, freshly claimed step.
        drop(keeper);
        drop(permit);
        let cleaned = match self.finish_cleanup(&claim.bucket, permits).await? {
            Cleanup::Done(_) => true,
            Cleanup::NotOurs => false,
            Cleanup::LeaseLost => return Ok(BucketOutcome::LeaseLost),
        };
        Ok(BucketOutcome::Archived {
            rows: written.manifest.row_count,
            bytes: written.manifest.byte_length,
            cleaned,
        })
    }

    /// Publishes, settling an ambiguous result by re-reading the route. `Ok(false)` when the
    /// claim turned out not to be current (nothing was published under it).
    async fn publish(&self, claim: &Claim, manifest_key: &str) -> Result<bool, ArchiverError> {
        let mut last_error = None;
        for attempt in 0..5u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            match tokio::time::timeout(
                self.config.op_deadline,
                self.store.publish_archive(claim, manifest_key),
            )
            .await
            {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(e)) => last_error = Some(e.to_string()),
                Err(_) => last_error = Some("publish deadline passed".into()),
            }
            // The commit may have happened even though we saw an error: ask the authority.
            match tokio::time::timeout(self.config.op_deadline, self.store.bucket(&claim.bucket))
                .await
            {
                Ok(Ok(Some(meta))) => match meta.state {
                    BucketState::Archived { object_key, .. } if object_key == manifest_key => {
                        return Ok(true)
                    }
                    BucketState::Archiving
                        if meta.generation == claim.generation
                            && meta.owner_token.as_deref() == Some(claim.token.as_str()) =>
                    {
                        continue;
                    }
                    _ => return Ok(false),
                },
                Ok(Ok(None)) => return Ok(false),
                Ok(Err(e)) => last_error = Some(e.to_string()),
                Err(_) => last_error = Some("re-read deadline passed".into()),
            }
        }
        Err(ArchiverError::Unresolved {
            bucket: claim.bucket.clone(),
            step: "publish",
            detail: last_error.unwrap_or_default(),
        })
    }

    /// Waits out the cleanup delay (without holding a concurrency slot or a lease), claims
    /// the cleanup, then deletes the hot rows in small transactions under that claim.
    async fn finish_cleanup(
        &self,
        bucket: &BucketId,
        permits: &Semaphore,
    ) -> Result<Cleanup, ArchiverError> {
        let meta = self.op("bucket", self.store.bucket(bucket)).await?;
        let Some(published_at) = meta.and_then(|m| m.published_at) else {
            return Ok(Cleanup::NotOurs);
        };
        let now = self.op("now", self.store.now()).await?;
        let ready_at = published_at.as_micros() + self.config.cleanup_delay.as_micros() as i64;
        let wait = ready_at - now.as_micros();
        if wait > 0 {
            debug!(
                wait_ms = wait / 1000,
                "waiting for readers' route-cache bound"
            );
            tokio::time::sleep(Duration::from_micros(wait as u64 + 1_000)).await;
        }
        let _permit = permits.acquire().await.expect("semaphore never closed");
        let Some(claim) = self
            .op(
                "claim_cleanup",
                self.store.claim_cleanup(bucket, self.config.lease),
            )
            .await?
        else {
            debug!("cleanup owned elsewhere or already done");
            return Ok(Cleanup::NotOurs);
        };
        debug!(generation = claim.generation, "claimed cleanup");
        let keeper = self.keep_lease(claim.clone());
        let started = Instant::now();
        let mut deleted = 0u64;
        let mut steps = 0u32;
        loop {
            if keeper.lost.is_cancelled() {
                return Ok(Cleanup::LeaseLost);
            }
            let step = self.store.cleanup_step(
                &claim,
                self.config.cleanup_batch_rows,
                self.config.cleanup_delay,
            );
            match tokio::time::timeout(self.config.op_deadline, step).await {
                Ok(Ok((n, finished))) => {
                    deleted += n;
                    self.metrics.rows_deleted.inc_by(n);
                    steps += 1;
                    if steps == 1 {
                        failpoint::hit("mid_cleanup");
                    }
                    if finished {
                        self.metrics.buckets_cleaned.inc();
                        info!(
                            rows_deleted = deleted,
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            "hot rows deleted"
                        );
                        return Ok(Cleanup::Done(deleted));
                    }
                }
                Ok(Err(StoreError::StaleClaim { .. })) => return Ok(Cleanup::LeaseLost),
                Ok(Err(e)) if e.is_retryable() => {
                    warn!(error = %e, "cleanup step failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => warn!("cleanup step deadline passed; retrying"),
            }
        }
    }

    async fn defer(&self, claim: &Claim, reason: String) -> Result<BucketOutcome, ArchiverError> {
        warn!(%reason, "deferring bucket");
        match tokio::time::timeout(
            self.config.op_deadline,
            self.store.defer_archive(claim, self.config.retry),
        )
        .await
        {
            Ok(Ok(())) => {}
            // Not deferred: the lease expiry makes the bucket claimable again anyway.
            Ok(Err(e)) => warn!(error = %e, "defer failed; the lease will expire instead"),
            Err(_) => warn!("defer deadline passed; the lease will expire instead"),
        }
        self.metrics.buckets_deferred.inc();
        Ok(BucketOutcome::Deferred { reason })
    }

    fn keep_lease(&self, claim: Claim) -> LeaseKeeper {
        let lost = CancellationToken::new();
        let store = self.store.clone();
        let lease = self.config.lease;
        let deadline = self.config.op_deadline.min(lease / 2);
        let signal = lost.clone();
        let handle = tokio::spawn(async move {
            let mut current = claim;
            // Conservative local bound: the store's expiry is at least `lease` after the
            // moment the last successful renewal (or the claim) was *sent*.
            let mut valid_until = Instant::now() + lease;
            loop {
                tokio::time::sleep(lease / 3).await;
                let sent = Instant::now();
                match tokio::time::timeout(deadline, store.renew(&current, lease)).await {
                    Ok(Ok(c)) => {
                        current = c;
                        valid_until = sent + lease;
                    }
                    Ok(Err(
                        StoreError::StaleClaim { .. } | StoreError::InvalidTransition { .. },
                    )) => {
                        signal.cancel();
                        return;
                    }
                    _ if Instant::now() + lease / 3 >= valid_until => {
                        signal.cancel();
                        return;
                    }
                    _ => {}
                }
            }
        });
        LeaseKeeper { lost, handle }
    }

    async fn op<T>(
        &self,
        name: &'static str,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, ArchiverError> {
        match tokio::time::timeout(self.config.op_deadline, fut).await {
            Ok(r) => r.map_err(ArchiverError::from),
            Err(_) => Err(ArchiverError::Deadline { operation: name }),
        }
    }
}

/// The fenced snapshot as a stream of pages for the archive writer. The next page is
/// fetched while the writer encodes the current one, so the database and the encoder work
/// at the same time. A store error is kept in `error_slot` (the writer only sees that its
/// source failed) so the runner can tell a lost claim from a transient failure.
fn snapshot_pages(
    store: Arc<dyn HotStore>,
    claim: Claim,
    page_rows: usize,
    deadline: Duration,
    error_slot: Arc<Mutex<Option<StoreError>>>,
) -> impl futures::Stream<Item = Result<Vec<Record>, ArchiveError>> + Send + 'static {
    type Fetch = tokio::task::JoinHandle<Result<Vec<Record>, StoreError>>;
    let fetch = {
        let (store, claim) = (store.clone(), claim.clone());
        move |after: Option<ClusteringKey>| -> Fetch {
            let (store, claim) = (store.clone(), claim.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(
                    deadline,
                    store.snapshot_page(&claim, after.as_ref(), page_rows),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Backend {
                        operation: "snapshot",
                        detail: "snapshot page deadline passed".into(),
                    }),
                }
            })
        }
    };
    /// Aborts a prefetch nobody will read (the writer stopped or the work was dropped).
    struct Pending(Option<Fetch>);
    impl Drop for Pending {
        fn drop(&mut self) {
            if let Some(h) = self.0.take() {
                h.abort();
            }
        }
    }
    let first = Pending(Some(fetch(None)));
    stream::try_unfold((first, 0u64), move |(mut pending, page_no)| {
        let error_slot = error_slot.clone();
        let fetch = fetch.clone();
        async move {
            let Some(handle) = pending.0.take() else {
                return Ok(None);
            };
            if page_no == 1 {
                // The first page has been handed to the writer: we are mid-upload.
                failpoint::hit("mid_upload");
            }
            let page = match handle.await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    let msg = e.to_string();
                    *error_slot.lock().await = Some(e);
                    return Err(ArchiveError::Source(msg));
                }
                Err(e) => return Err(ArchiveError::Source(format!("snapshot task failed: {e}"))),
            };
            if page_no == 0 {
                failpoint::hit("mid_snapshot");
            }
            if page.is_empty() {
                return Ok(None);
            }
            if page.len() >= page_rows {
                pending.0 = Some(fetch(page.last().map(Record::clustering_key)));
            }
            Ok(Some((page, (pending, page_no + 1))))
        }
    })
}

/// Whether `bucket` is fully archived: published with its hot rows deleted.
pub async fn is_fully_archived(
    store: &dyn HotStore,
    bucket: &BucketId,
) -> Result<bool, StoreError> {
    Ok(matches!(
        store.bucket(bucket).await?.map(|m| m.state),
        Some(BucketState::Archived {
            hot_deleted: true,
            ..
        })
    ))
}
