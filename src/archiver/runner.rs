//! The per-bucket archival protocol and the discovery loop around it.
//!
//! Publication and cleanup are separate work items. An archival item claims a bucket,
//! snapshots it in pages under the fence, uploads and verifies, and publishes the route in
//! one conditional transaction; then it is done. The bucket's cleanup (deleting the hot rows
//! in small transactions under a fresh claim) is discovered by a later cycle once the
//! readers' route-cache bound (the cleanup delay) has passed, so no cycle ever waits for it.
//! A heartbeat renews each claim's lease (see [`super::lease`]); losing it stops the work
//! before anything else is written. Every step is idempotent and every ambiguous result is
//! settled by re-reading the store, so dropping the work at any await point (a crash, a
//! deadline, SIGKILL) leaves state another worker can finish.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::stream::{self, FuturesUnordered, StreamExt};
use tokio::sync::{Mutex, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::archive::{ArchiveError, ArchiveStore};
use crate::failpoint;
use crate::model::{BucketId, ClusteringKey, EventTime, Record};
use crate::store::{BucketState, Claim, HotStore, StoreError, WorkItem, WorkKind};

use super::config::january_first_of_previous_year;
use super::lease::LeaseKeeper;
use super::{ArchiverConfig, ArchiverError, ArchiverMetrics};

/// Publication attempts before its outcome is reported unresolved.
const PUBLISH_ATTEMPTS: u32 = 5;

/// Pause before publication attempt `attempt` (from 1).
fn publish_backoff(attempt: u32) -> Duration {
    Duration::from_millis(100 << attempt)
}

/// The longest publication can take after the upload: every attempt and its re-read at the
/// operation deadline, plus the pauses between attempts. Part of the GC delay's floor.
pub(crate) fn publication_window(op_deadline: Duration) -> Duration {
    let pauses: Duration = (1..PUBLISH_ATTEMPTS).map(publish_backoff).sum();
    op_deadline
        .saturating_mul(2 * PUBLISH_ATTEMPTS)
        .saturating_add(pauses)
}

/// Upper bound on the backlog a drain counts at its end (one statement; a larger backlog is
/// reported as "at least" this).
pub const REMAINING_COUNT_CAP: usize = 10_000;

/// What happened to one work item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketOutcome {
    /// Published; its cleanup is a later work item.
    Archived {
        /// Rows in the archive.
        rows: u64,
        /// Payload bytes.
        bytes: u64,
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
    /// Another worker owns the bucket, it is no longer eligible, or its cleanup is not due.
    Skipped,
    /// Shutdown stopped the work: an unpublished bucket was handed back (claimable at once),
    /// a cleanup stopped between transactions (claimable once its lease expires).
    Interrupted,
    /// The claim was lost mid-way; nothing more was written under it.
    LeaseLost,
}

impl BucketOutcome {
    /// Whether the attempt counts as a failure for `--once`.
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Deferred { .. } | Self::LeaseLost)
    }
}

/// Totals of one discovery cycle (or, summed, of a drain).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleReport {
    /// Work items discovered.
    pub discovered: usize,
    /// Buckets published.
    pub archived: usize,
    /// Buckets cleaned up.
    pub cleaned: usize,
    /// Buckets deferred.
    pub deferred: usize,
    /// Items that failed (deferred, lease lost, or errors).
    pub failed: usize,
    /// Items skipped because someone else owns them or they are not due.
    pub skipped: usize,
    /// Items stopped or not started because of shutdown.
    pub interrupted: usize,
    /// One line per failure.
    pub errors: Vec<String>,
}

impl CycleReport {
    fn add(&mut self, other: CycleReport) {
        self.discovered += other.discovered;
        self.archived += other.archived;
        self.cleaned += other.cleaned;
        self.deferred += other.deferred;
        self.failed += other.failed;
        self.skipped += other.skipped;
        self.interrupted += other.interrupted;
        self.errors.extend(other.errors);
    }
}

/// What [`Runner::drain`] (`--once`) did and what it left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Totals over every batch.
    pub totals: CycleReport,
    /// Batches (discovery cycles) run.
    pub batches: usize,
    /// Buckets still to archive or clean that are due now (failed ones retried too soon,
    /// or all of them when interrupted), at most [`REMAINING_COUNT_CAP`].
    pub remaining: usize,
    /// Published buckets whose cleanup waits for its delay (left for a later run).
    pub cleanups_waiting: usize,
    /// Shutdown stopped the drain early.
    pub interrupted: bool,
}

/// How a cleanup attempt ended.
enum Cleanup {
    /// All hot rows deleted (this many by us).
    Done(u64),
    /// Already clean, not due yet, or another worker holds the cleanup.
    NotOurs,
    /// Shutdown stopped it between transactions.
    Interrupted,
    /// Our cleanup claim went stale mid-way.
    LeaseLost,
}

/// Where the default cutoff reads the time (injectable for tests).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// One archiver process's worker.
pub struct Runner {
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    config: ArchiverConfig,
    metrics: Arc<ArchiverMetrics>,
    clock: Clock,
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
            clock: Arc::new(Utc::now),
        })
    }

    /// Replaces the wall clock the default cutoff is computed from.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// This runner's counters.
    pub fn metrics(&self) -> Arc<ArchiverMetrics> {
        self.metrics.clone()
    }

    /// The configuration in force.
    pub fn config(&self) -> &ArchiverConfig {
        &self.config
    }

    /// The cutoff in force now: the configured one, or January 1 of the previous UTC year by
    /// the clock at this instant (so it moves when the year turns).
    pub fn cutoff(&self) -> EventTime {
        self.config
            .eligible_before
            .unwrap_or_else(|| january_first_of_previous_year((self.clock)()))
    }

    /// Discovers one batch (at most `scan_limit` items: eligible buckets, expired claims and
    /// cleanups whose delay has passed) and processes all of it, `concurrency` at a time.
    /// `progress(done, total)` is called after each item. Items not yet started when
    /// `shutdown` fires are left for the next process.
    pub async fn run_cycle(
        &self,
        shutdown: &CancellationToken,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<CycleReport, ArchiverError> {
        let items = self.discover().await?;
        Ok(self.run_items(&items, shutdown, progress).await)
    }

    async fn discover(&self) -> Result<Vec<WorkItem>, ArchiverError> {
        let cutoff = self.cutoff();
        self.op(
            "discover",
            self.store
                .discover_ready(cutoff, self.config.scan_limit, self.config.cleanup_delay),
        )
        .await
    }

    async fn run_items(
        &self,
        items: &[WorkItem],
        shutdown: &CancellationToken,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> CycleReport {
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
                    let r = self.process(item, &permits, shutdown).await;
                    (item, r)
                }
            })
            .collect();
        let mut done = 0;
        while let Some((item, result)) = running.next().await {
            done += 1;
            progress(done, total);
            match result {
                Ok(BucketOutcome::Archived { .. }) => report.archived += 1,
                Ok(BucketOutcome::Cleaned { .. }) => report.cleaned += 1,
                Ok(BucketOutcome::Skipped) => report.skipped += 1,
                Ok(BucketOutcome::Interrupted) => report.interrupted += 1,
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
        self.metrics
            .cycle_finished(&*self.store, self.cutoff(), &report)
            .await;
        report
    }

    /// `--once`: runs batches of at most `scan_limit` items until discovery finds nothing it
    /// has not already tried in this drain, so everything eligible at the start (and every
    /// cleanup that comes due meanwhile) is handled once. A failed item is not retried in
    /// the same drain; cleanups whose delay has not passed are left, and counted.
    pub async fn drain(
        &self,
        shutdown: &CancellationToken,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<DrainReport, ArchiverError> {
        let mut report = DrainReport::default();
        let mut tried: HashSet<(BucketId, WorkKind)> = HashSet::new();
        let mut done_before = 0;
        loop {
            if shutdown.is_cancelled() {
                report.interrupted = true;
                break;
            }
            let fresh: Vec<WorkItem> = self
                .discover()
                .await?
                .into_iter()
                .filter(|i| !tried.contains(&(i.bucket.clone(), i.kind)))
                .collect();
            if fresh.is_empty() {
                break;
            }
            tried.extend(fresh.iter().map(|i| (i.bucket.clone(), i.kind)));
            let batch = self
                .run_items(&fresh, shutdown, &|done, _| {
                    progress(done_before + done, tried.len())
                })
                .await;
            done_before += batch.discovered;
            report.batches += 1;
            report.totals.add(batch);
        }
        report.interrupted |= shutdown.is_cancelled();
        let left = self
            .op(
                "discover",
                self.store.discover(self.cutoff(), REMAINING_COUNT_CAP),
            )
            .await?;
        let due = self
            .op(
                "discover",
                self.store.discover_ready(
                    self.cutoff(),
                    REMAINING_COUNT_CAP,
                    self.config.cleanup_delay,
                ),
            )
            .await?;
        report.remaining = due.len();
        report.cleanups_waiting = left
            .iter()
            .filter(|i| i.kind == WorkKind::CleanupPending)
            .count()
            - due
                .iter()
                .filter(|i| i.kind == WorkKind::CleanupPending)
                .count();
        Ok(report)
    }

    /// Loops discovery cycles (and periodic GC) until `shutdown` fires. A cycle that filled
    /// its batch and made progress is followed at once by the next (a backlog drains at full
    /// speed); otherwise the loop pauses for the interval. On shutdown, items not started are
    /// left and unpublished work in progress is handed back (see [`BucketOutcome::Interrupted`]).
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), ArchiverError> {
        let gc_every = self.config.interval.max(Duration::from_secs(600));
        let mut last_gc: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            let mut backlog = false;
            match self.run_cycle(&shutdown, &|_, _| {}).await {
                Ok(r) if r.discovered > 0 => {
                    info!(
                        discovered = r.discovered,
                        archived = r.archived,
                        cleaned = r.cleaned,
                        failed = r.failed,
                        "cycle finished"
                    );
                    backlog = r.discovered >= self.config.scan_limit && r.archived + r.cleaned > 0;
                }
                Ok(_) => debug!("cycle found no work"),
                Err(e) => warn!(error = %e, "cycle failed; retrying after the interval"),
            }
            if shutdown.is_cancelled() {
                break;
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
            if backlog {
                continue;
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
        shutdown: &CancellationToken,
    ) -> Result<BucketOutcome, ArchiverError> {
        let span = info_span!("bucket", bucket = %item.bucket, kind = ?item.kind);
        async {
            let _permit = permits.acquire().await.expect("semaphore never closed");
            if shutdown.is_cancelled() {
                return Ok(BucketOutcome::Interrupted);
            }
            let _in_flight = self.metrics.track_in_flight();
            let outcome = match item.kind {
                WorkKind::Eligible | WorkKind::ExpiredClaim => {
                    let sent = Instant::now();
                    let Some(claim) = self
                        .op("claim", self.store.claim(&item.bucket, self.config.lease))
                        .await?
                    else {
                        debug!("not claimable (owned elsewhere or no longer eligible)");
                        return Ok(BucketOutcome::Skipped);
                    };
                    info!(generation = claim.generation, "claimed");
                    failpoint::hit("after_claim");
                    self.archive_claimed(claim, sent, shutdown).await?
                }
                WorkKind::CleanupPending => {
                    match self.finish_cleanup(&item.bucket, shutdown).await? {
                        Cleanup::Done(rows_deleted) => BucketOutcome::Cleaned { rows_deleted },
                        Cleanup::NotOurs => BucketOutcome::Skipped,
                        Cleanup::Interrupted => BucketOutcome::Interrupted,
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

    fn keep_lease(&self, claim: Claim, sent: Instant) -> LeaseKeeper {
        LeaseKeeper::start(
            self.store.clone(),
            claim,
            sent,
            self.config.lease,
            self.config.op_deadline,
        )
    }

    async fn archive_claimed(
        &self,
        claim: Claim,
        sent: Instant,
        shutdown: &CancellationToken,
    ) -> Result<BucketOutcome, ArchiverError> {
        let started = Instant::now();
        let keeper = self.keep_lease(claim.clone(), sent);
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
            _ = shutdown.cancelled() => {
                // Hand the bucket back at once rather than keep the process alive for an
                // upload that may take minutes; the dropped upload leaves only orphans.
                self.defer(&claim, "archiver shutting down".into(), Duration::ZERO).await;
                return Ok(BucketOutcome::Interrupted);
            }
            r = tokio::time::timeout(self.config.upload_deadline, upload) => match r {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => {
                    let reason = match store_error.lock().await.take() {
                        Some(StoreError::StaleClaim { .. }) => return Ok(BucketOutcome::LeaseLost),
                        Some(se) => format!("snapshot failed: {se}"),
                        None => format!("upload failed: {e}"),
                    };
                    self.defer(&claim, reason.clone(), self.config.retry).await;
                    return Ok(BucketOutcome::Deferred { reason });
                }
                Err(_) => {
                    let reason = "upload deadline passed".to_string();
                    self.defer(&claim, reason.clone(), self.config.retry).await;
                    return Ok(BucketOutcome::Deferred { reason });
                }
            },
        };
        failpoint::hit("after_verify");
        info!(
            key = %written.manifest_key,
            rows = written.manifest.row_count,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshotted, uploaded and verified"
        );
        if !keeper.holds() {
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
        Ok(BucketOutcome::Archived {
            rows: written.manifest.row_count,
            bytes: written.manifest.byte_length,
        })
    }

    /// Publishes, settling an ambiguous result by re-reading the route. `Ok(false)` when the
    /// claim turned out not to be current (nothing was published under it).
    async fn publish(&self, claim: &Claim, manifest_key: &str) -> Result<bool, ArchiverError> {
        let mut last_error = None;
        for attempt in 0..PUBLISH_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(publish_backoff(attempt)).await;
            }
            // The store answered that the conditional update matched nothing: definitive,
            // unless an earlier attempt's commit is what changed the row (the re-read tells).
            let mut refused = false;
            match tokio::time::timeout(
                self.config.op_deadline,
                self.store.publish_archive(claim, manifest_key),
            )
            .await
            {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(e @ StoreError::StaleClaim { .. })) => {
                    refused = true;
                    last_error = Some(e.to_string());
                }
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
                    // Still ours by token and generation, so the update was refused for the
                    // lease alone: it expired.
                    BucketState::Archiving
                        if meta.generation == claim.generation
                            && meta.owner_token.as_deref() == Some(claim.token.as_str()) =>
                    {
                        if refused {
                            return Ok(false);
                        }
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

    /// Claims a published bucket's cleanup once its delay has passed (never waiting for it:
    /// a bucket not yet due is left for a later cycle), then deletes the hot rows in small
    /// transactions under that claim, stopping between transactions on shutdown.
    async fn finish_cleanup(
        &self,
        bucket: &BucketId,
        shutdown: &CancellationToken,
    ) -> Result<Cleanup, ArchiverError> {
        let meta = self.op("bucket", self.store.bucket(bucket)).await?;
        let Some(published_at) = meta.and_then(|m| m.published_at) else {
            return Ok(Cleanup::NotOurs);
        };
        let now = self.op("now", self.store.now()).await?;
        let due = published_at.as_micros().saturating_add(
            i64::try_from(self.config.cleanup_delay.as_micros()).unwrap_or(i64::MAX),
        );
        if due > now.as_micros() {
            debug!("cleanup not due yet (readers' route-cache bound)");
            return Ok(Cleanup::NotOurs);
        }
        let sent = Instant::now();
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
        let keeper = self.keep_lease(claim.clone(), sent);
        let started = Instant::now();
        let mut deleted = 0u64;
        let mut steps = 0u32;
        loop {
            if !keeper.holds() {
                return Ok(Cleanup::LeaseLost);
            }
            if shutdown.is_cancelled() {
                return Ok(Cleanup::Interrupted);
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

    /// Hands a claimed bucket back to Hot, claimable after `retry`.
    async fn defer(&self, claim: &Claim, reason: String, retry: Duration) {
        warn!(%reason, "deferring bucket");
        match tokio::time::timeout(
            self.config.op_deadline,
            self.store.defer_archive(claim, retry),
        )
        .await
        {
            Ok(Ok(())) => {}
            // Not deferred: the lease expiry makes the bucket claimable again anyway.
            Ok(Err(e)) => warn!(error = %e, "defer failed; the lease will expire instead"),
            Err(_) => warn!("defer deadline passed; the lease will expire instead"),
        }
        self.metrics.buckets_deferred.inc();
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
