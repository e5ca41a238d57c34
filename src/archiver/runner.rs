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
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::archive::ArchiveStore;
use crate::failpoint;
use crate::model::{BucketId, EventTime};
use crate::store::{BucketState, Claim, HotStore, JobKind, StoreError, WorkItem, WorkKind};

use super::cleanup::Cleanup;
use super::config::january_first_of_previous_year;
use super::control::{default_worker_name, PolicyCache};
use super::{ArchiverConfig, ArchiverError, ArchiverMetrics};

/// How often an archiver's GC lists the whole archive (and at its start); its other passes
/// list only the directories noted as ones where unrouted objects may be left
/// ([`super::gc::collect_garbage_incremental`]). The full pass is the backstop for objects no
/// noting names: written by an older build, or by a writer that kept going past its deadline.
pub const FULL_GC_EVERY: Duration = Duration::from_secs(24 * 3600);

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
    /// Of the failed items, those the database role's grants refused (SQLSTATE 42501):
    /// running again cannot help, changing the grants does.
    pub denied: usize,
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
        self.denied += other.denied;
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
    /// Buckets past their table's retention removed at the end of the drain.
    pub expired: u64,
    /// Re-applying the erasure log at the start failed for some erasure (logged; a later
    /// run tries again).
    pub erasures_failed: bool,
}

/// Where the default cutoff reads the time (injectable for tests).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// One archiver process's worker.
pub struct Runner {
    pub(super) store: Arc<dyn HotStore>,
    pub(super) archive: Arc<ArchiveStore>,
    pub(super) config: ArchiverConfig,
    pub(super) metrics: Arc<ArchiverMetrics>,
    pub(super) policies: PolicyCache,
    pub(super) worker: String,
    pub(super) clock: Clock,
    /// Where the last compaction pass stopped at its budget or shutdown (table, window
    /// start): the next pass resumes there (`compact.rs`).
    pub(super) compact_cursor: std::sync::Mutex<Option<(crate::model::TableId, EventTime)>>,
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
            policies: PolicyCache::default(),
            worker: default_worker_name(),
            clock: Arc::new(Utc::now),
            compact_cursor: std::sync::Mutex::default(),
        })
    }

    /// Names this process in job history (default: host and pid).
    #[must_use]
    pub fn with_worker(mut self, name: impl Into<String>) -> Self {
        self.worker = name.into();
        self
    }

    /// Replaces the wall clock the default cutoff is computed from.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The GC delays of this configuration: the orphan delay, and the retirement delay
    /// ([`super::ArchiverConfig::retirement_delay`]: readers' bounds, backup retention).
    pub fn gc_delays(&self) -> super::GcDelays {
        super::GcDelays {
            orphans: self.config.gc_delay,
            retired: self.config.retirement_delay(),
            erased: self.config.erased_retirement_delay(),
        }
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
        // Policies first: the work found below is done with the formats and delays in force.
        self.refresh_policies().await;
        let rule = self.eligibility();
        self.op(
            "discover",
            self.store
                .discover_ready(&rule, self.config.scan_limit, self.config.cleanup_delay),
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
                    if matches!(e, ArchiverError::Store(StoreError::PermissionDenied { .. })) {
                        report.denied += 1;
                    }
                    report.errors.push(format!("{}: {e}", item.bucket));
                }
            }
        }
        self.metrics
            .cycle_finished(&*self.store, &self.eligibility(), &report)
            .await;
        self.prune_history().await;
        report
    }

    /// Re-applies the erasure log ([`crate::erasure::reapply_all`]); whether every erasure
    /// was re-applied (a failure is logged, and the caller tries again later).
    pub async fn erasure_pass(&self) -> bool {
        match crate::erasure::reapply_all(self.store.clone(), self.archive.clone()).await {
            Ok(r) => {
                if r.rows_deleted + r.routes_repaired > 0 {
                    info!(
                        erasures = r.erasures,
                        rows_deleted = r.rows_deleted,
                        routes_repaired = r.routes_repaired,
                        "erasure log re-applied"
                    );
                }
                r.failed.is_empty()
            }
            Err(e) => {
                warn!(error = %e, "re-applying the erasure log failed; retried at the next cycle");
                false
            }
        }
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
        report.erasures_failed = !self.erasure_pass().await;
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
        if !report.interrupted {
            report.expired = self.retention_pass().await?.buckets;
        }
        let rule = self.eligibility();
        let left = self
            .op("discover", self.store.discover(&rule, REMAINING_COUNT_CAP))
            .await?;
        let due = self
            .op(
                "discover",
                self.store
                    .discover_ready(&rule, REMAINING_COUNT_CAP, self.config.cleanup_delay),
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
        let mut last_full_gc: Option<Instant> = None;
        let mut last_compact: Option<Instant> = None;
        // The erasure log first, at every start (a restored hot store may hold erased rows
        // again), and at every cycle until a pass has re-applied all of it.
        let mut erasures_due = true;
        while !shutdown.is_cancelled() {
            if erasures_due {
                erasures_due = !self.erasure_pass().await;
            }
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
            // Retention every cycle: a bucket past it must not stay readable for long.
            match self.retention_pass().await {
                Ok(r) if r.buckets + r.failed > 0 => info!(
                    buckets = r.buckets,
                    rows = r.rows,
                    retired = r.retired,
                    failed = r.failed,
                    "retention pass finished"
                ),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "retention pass failed"),
            }
            // Not while the erasure log is not re-applied: after a hot-store restore the
            // objects its route repair switches to are orphans until it has run.
            if !erasures_due && last_gc.is_none_or(|t| t.elapsed() >= gc_every) {
                // A full listing at the start and daily (it finds what no noting names);
                // incremental passes in between list only the noted directories.
                let full = last_full_gc.is_none_or(|t| t.elapsed() >= FULL_GC_EVERY);
                let pass = if full {
                    super::gc::collect_garbage_with(
                        &*self.store,
                        &self.archive,
                        self.gc_delays(),
                        &self.metrics,
                    )
                    .await
                } else {
                    super::gc::collect_garbage_incremental(
                        &*self.store,
                        &self.archive,
                        self.gc_delays(),
                        &self.metrics,
                    )
                    .await
                };
                match pass {
                    Ok(r) => {
                        info!(
                            full,
                            listed = r.listed,
                            deleted = r.deleted,
                            "orphan GC finished"
                        );
                        if full {
                            last_full_gc = Some(Instant::now());
                        }
                    }
                    Err(e) => warn!(full, error = %e, "orphan GC failed"),
                }
                last_gc = Some(Instant::now());
            }
            // Compaction when archiving is caught up (cutover comes first), and during a long
            // backlog at least every ten intervals, so windows already complete do not wait
            // for the whole backlog.
            let compact_due = self.config.compaction
                && (!backlog
                    || last_compact
                        .is_none_or(|t: Instant| t.elapsed() >= self.config.interval * 10));
            if compact_due {
                last_compact = Some(Instant::now());
                match self.compact_pass_until(&shutdown).await {
                    Ok(r) if r.windows + r.failed > 0 => info!(
                        windows = r.windows,
                        segments = r.segments,
                        buckets = r.buckets,
                        failed = r.failed,
                        "compaction pass finished"
                    ),
                    Ok(_) => debug!("compaction found no window due"),
                    Err(e) => warn!(error = %e, "compaction pass failed"),
                }
                if shutdown.is_cancelled() {
                    break;
                }
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
                    let job = self.job_started(&claim, JobKind::Archive).await;
                    failpoint::hit("after_claim");
                    let result = self.archive_claimed(claim, sent, shutdown).await;
                    self.archive_job_ended(job, &result).await;
                    result?
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

    /// Hands a claimed bucket back to Hot, claimable after `retry`.
    pub(super) async fn defer(&self, claim: &Claim, reason: String, retry: Duration) {
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

    /// One store call under the operation deadline.
    pub(super) async fn op<T>(
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
