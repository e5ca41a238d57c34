//! A hot store that delegates to the real one and lets a test disturb the archiver's view at
//! exact points: run a step in the gap between GC's two metadata reads, delay a claim's
//! answer after it committed, cut or silently drop lease renewals, refuse snapshot pages as
//! stale, fail job history writes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pulpitum::model::{BucketId, ClusteringKey, EventTime, PartitionKey, Record, TableId};
use pulpitum::store::{
    AcrossListing, AppendOutcome, Appends, Backlog, BatchOutcome, BucketFilter, BucketMeta,
    Catalog, Claim, Compaction, CompactionClaim, Control, Eligibility, HeadPage, HotPage, HotStore,
    JobEnd, JobFilter, JobRecord, JobStart, Lifecycle, PageRequest, PolicyUpdate, RetiredObject,
    RouteSwitch, RoutedReads, StoreError, StoreResult, TableDefinition, TablePolicy, WindowState,
    WorkItem,
};

/// What [`Hooked::renew`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Renewal {
    /// Renew in the store.
    Pass = 0,
    /// Fail as a cut connection does (nothing reaches the store).
    Cut = 1,
    /// Answer success without renewing: the renewal task as good as disabled.
    Ignore = 2,
}

type Step = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The wrapper; every method not hooked goes straight to `inner`.
pub struct Hooked {
    inner: Arc<dyn HotStore>,
    gap: Mutex<Option<Step>>,
    claim_reply_delay: Mutex<Duration>,
    renewal: AtomicU8,
    stale_snapshots: AtomicBool,
    failing_history: AtomicBool,
    /// When the last claim statement was sent.
    pub claim_sent: Mutex<Option<Instant>>,
}

impl Hooked {
    /// A transparent wrapper.
    pub fn new(inner: Arc<dyn HotStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            gap: Mutex::new(None),
            claim_reply_delay: Mutex::new(Duration::ZERO),
            renewal: AtomicU8::new(Renewal::Pass as u8),
            stale_snapshots: AtomicBool::new(false),
            failing_history: AtomicBool::new(false),
            claim_sent: Mutex::new(None),
        })
    }

    /// Runs `step` once, right after whichever of GC's two metadata reads (the in-flight
    /// claims, the routes among its candidates) comes first returns (also after a bucket
    /// listing or a read of every route, the reads an earlier GC made).
    pub fn in_gc_gap(&self, step: impl Future<Output = ()> + Send + 'static) {
        *self.gap.lock().unwrap() = Some(Box::pin(step));
    }

    /// Holds every claim's answer back for `d` after the claim committed.
    pub fn delay_claim_replies(&self, d: Duration) {
        *self.claim_reply_delay.lock().unwrap() = d;
    }

    /// Sets what renewals do from now on.
    pub fn renewals(&self, r: Renewal) {
        self.renewal.store(r as u8, Ordering::SeqCst);
    }

    /// From now on, every snapshot page is refused as the store refuses a claim that another
    /// worker has taken over (`StaleClaim`), without reaching the store.
    pub fn refuse_snapshots_as_stale(&self) {
        self.stale_snapshots.store(true, Ordering::SeqCst);
    }

    /// From now on, every job history write fails as a dropped connection does, without
    /// reaching the store.
    pub fn fail_history_writes(&self) {
        self.failing_history.store(true, Ordering::SeqCst);
    }

    fn history(&self) -> StoreResult<()> {
        if self.failing_history.load(Ordering::SeqCst) {
            return Err(StoreError::Backend {
                operation: "record_job",
                detail: "connection reset (injected)".into(),
            });
        }
        Ok(())
    }

    async fn gap(&self) {
        let step = self.gap.lock().unwrap().take();
        if let Some(step) = step {
            step.await;
        }
    }
}

#[async_trait]
impl Catalog for Hooked {
    async fn migrate(&self) -> StoreResult<pulpitum::store::migrate::Migrated> {
        self.inner.migrate().await
    }

    async fn check_schema(&self) -> StoreResult<i64> {
        self.inner.check_schema().await
    }

    async fn register_table(&self, def: &TableDefinition) -> StoreResult<TableDefinition> {
        self.inner.register_table(def).await
    }

    async fn table(&self, t: &TableId) -> StoreResult<Option<TableDefinition>> {
        self.inner.table(t).await
    }

    async fn tables(&self) -> StoreResult<Vec<TableDefinition>> {
        self.inner.tables().await
    }

    async fn now(&self) -> StoreResult<EventTime> {
        self.inner.now().await
    }

    async fn table_schema(
        &self,
        t: &TableId,
    ) -> StoreResult<Option<pulpitum::store::StoredSchema>> {
        self.inner.table_schema(t).await
    }

    async fn announce_reader(&self, r: &pulpitum::store::ReaderInfo) -> StoreResult<()> {
        self.inner.announce_reader(r).await
    }

    async fn withdraw_reader(&self, id: &str) -> StoreResult<()> {
        self.inner.withdraw_reader(id).await
    }

    async fn readers_since(
        &self,
        since: EventTime,
    ) -> StoreResult<Vec<pulpitum::store::ReaderInfo>> {
        self.inner.readers_since(since).await
    }

    async fn forget_readers(&self, before: EventTime, after: EventTime) -> StoreResult<u64> {
        self.inner.forget_readers(before, after).await
    }

    async fn put_table_schema(
        &self,
        t: &TableId,
        s: &pulpitum::store::StoredSchema,
    ) -> StoreResult<()> {
        self.inner.put_table_schema(t, s).await
    }
}

#[async_trait]
impl Appends for Hooked {
    async fn append(&self, t: &TableId, r: &Record) -> StoreResult<AppendOutcome> {
        self.inner.append(t, r).await
    }

    async fn append_batch(&self, t: &TableId, r: &[Record]) -> StoreResult<BatchOutcome> {
        self.inner.append_batch(t, r).await
    }
}

#[async_trait]
impl RoutedReads for Hooked {
    async fn list_buckets(&self, t: &TableId, f: &BucketFilter) -> StoreResult<Vec<BucketMeta>> {
        let r = self.inner.list_buckets(t, f).await;
        self.gap().await;
        r
    }

    async fn list_across(
        &self,
        t: &TableId,
        from: EventTime,
        to: EventTime,
    ) -> StoreResult<Option<AcrossListing>> {
        let r = self.inner.list_across(t, from, to).await;
        self.gap().await;
        r
    }

    async fn bucket(&self, b: &BucketId) -> StoreResult<Option<BucketMeta>> {
        self.inner.bucket(b).await
    }

    async fn read_page(&self, b: &BucketId, r: &PageRequest) -> StoreResult<HotPage> {
        self.inner.read_page(b, r).await
    }

    async fn read_head(
        &self,
        t: &TableId,
        p: &PartitionKey,
        from: Option<EventTime>,
        to: Option<EventTime>,
        page: &PageRequest,
    ) -> StoreResult<HeadPage> {
        self.inner.read_head(t, p, from, to, page).await
    }
}

#[async_trait]
impl Lifecycle for Hooked {
    async fn claim(&self, b: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        *self.claim_sent.lock().unwrap() = Some(Instant::now());
        let r = self.inner.claim(b, lease).await;
        let delay = *self.claim_reply_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        r
    }

    async fn claim_cleanup(&self, b: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        self.inner.claim_cleanup(b, lease).await
    }

    async fn renew(&self, c: &Claim, lease: Duration) -> StoreResult<Claim> {
        match self.renewal.load(Ordering::SeqCst) {
            0 => self.inner.renew(c, lease).await,
            1 => Err(StoreError::Backend {
                operation: "renew",
                detail: "connection reset (injected by the test)".into(),
            }),
            _ => Ok(c.clone()),
        }
    }

    async fn snapshot_page(
        &self,
        c: &Claim,
        after: Option<&ClusteringKey>,
        limit: usize,
    ) -> StoreResult<Vec<Record>> {
        if self.stale_snapshots.load(Ordering::SeqCst) {
            return Err(StoreError::StaleClaim {
                bucket: c.bucket.clone(),
                generation: c.generation,
                reason: "taken over by another worker (injected by the test)".into(),
            });
        }
        self.inner.snapshot_page(c, after, limit).await
    }

    async fn defer_archive(&self, c: &Claim, retry_after: Duration) -> StoreResult<()> {
        self.inner.defer_archive(c, retry_after).await
    }

    async fn publish_archive(&self, c: &Claim, key: &str) -> StoreResult<()> {
        self.inner.publish_archive(c, key).await
    }

    async fn cleanup_step(
        &self,
        c: &Claim,
        limit: usize,
        min_age: Duration,
    ) -> StoreResult<(u64, bool)> {
        self.inner.cleanup_step(c, limit, min_age).await
    }

    async fn discover(&self, rule: &Eligibility, limit: usize) -> StoreResult<Vec<WorkItem>> {
        self.inner.discover(rule, limit).await
    }

    async fn discover_ready(
        &self,
        rule: &Eligibility,
        limit: usize,
        cleanup_delay: Duration,
    ) -> StoreResult<Vec<WorkItem>> {
        self.inner.discover_ready(rule, limit, cleanup_delay).await
    }

    async fn backlog(&self, rule: &Eligibility) -> StoreResult<Backlog> {
        self.inner.backlog(rule).await
    }

    async fn archiving_claims(&self) -> StoreResult<Vec<BucketMeta>> {
        let r = self.inner.archiving_claims().await;
        self.gap().await;
        r
    }

    async fn routed_among(&self, keys: &[String]) -> StoreResult<Vec<String>> {
        let r = self.inner.routed_among(keys).await;
        self.gap().await;
        r
    }

    async fn note_gc_prefix(&self, prefix: &str) -> StoreResult<pulpitum::store::GcPrefix> {
        self.inner.note_gc_prefix(prefix).await
    }

    async fn gc_prefixes(
        &self,
        min_age: Duration,
        under: &str,
        limit: usize,
    ) -> StoreResult<Vec<pulpitum::store::GcPrefix>> {
        self.inner.gc_prefixes(min_age, under, limit).await
    }

    async fn forget_gc_prefixes(&self, seen: &[pulpitum::store::GcPrefix]) -> StoreResult<u64> {
        self.inner.forget_gc_prefixes(seen).await
    }

    async fn referenced_object_keys(&self) -> StoreResult<Vec<String>> {
        let r = self.inner.referenced_object_keys().await;
        self.gap().await;
        r
    }
}

#[async_trait]
impl Control for Hooked {
    async fn policies(&self) -> StoreResult<Vec<TablePolicy>> {
        self.inner.policies().await
    }

    async fn update_policy(&self, t: &TableId, u: &PolicyUpdate) -> StoreResult<TablePolicy> {
        self.inner.update_policy(t, u).await
    }

    async fn store_paused(&self) -> StoreResult<bool> {
        self.inner.store_paused().await
    }

    async fn set_store_paused(&self, paused: bool) -> StoreResult<()> {
        self.inner.set_store_paused(paused).await
    }

    async fn record_job_start(&self, job: &JobStart) -> StoreResult<()> {
        self.history()?;
        self.inner.record_job_start(job).await
    }

    async fn record_job_end(&self, end: &JobEnd) -> StoreResult<()> {
        self.history()?;
        self.inner.record_job_end(end).await
    }

    async fn jobs(&self, f: &JobFilter) -> StoreResult<Vec<JobRecord>> {
        self.inner.jobs(f).await
    }

    async fn prune_jobs(&self, before: EventTime, limit: usize) -> StoreResult<u64> {
        self.inner.prune_jobs(before, limit).await
    }
}

#[async_trait]
impl pulpitum::store::Changes for Hooked {
    async fn apply_changes(
        &self,
        t: &TableId,
        read_at: EventTime,
        changes: &[pulpitum::store::RowChange],
    ) -> StoreResult<pulpitum::store::ChangeOutcome> {
        self.inner.apply_changes(t, read_at, changes).await
    }

    async fn row_masks(&self, b: &BucketId) -> StoreResult<Vec<pulpitum::store::RowMask>> {
        self.inner.row_masks(b).await
    }

    async fn row_masks_of(
        &self,
        t: &TableId,
        p: &pulpitum::model::PartitionKey,
        keys: &[pulpitum::model::BucketKey],
    ) -> StoreResult<Vec<pulpitum::store::RowMask>> {
        self.inner.row_masks_of(t, p, keys).await
    }

    async fn buckets_with_deletes(
        &self,
        t: &TableId,
        partitions: Option<&[pulpitum::model::PartitionKey]>,
        range: (&pulpitum::model::BucketKey, &pulpitum::model::BucketKey),
        limit: usize,
    ) -> StoreResult<Option<Vec<(pulpitum::model::PartitionKey, pulpitum::model::BucketKey)>>> {
        self.inner
            .buckets_with_deletes(t, partitions, range, limit)
            .await
    }

    async fn expired_buckets(
        &self,
        t: &TableId,
        before: EventTime,
        limit: usize,
    ) -> StoreResult<Vec<BucketId>> {
        self.inner.expired_buckets(t, before, limit).await
    }

    async fn expire_bucket(
        &self,
        b: &BucketId,
        before: EventTime,
    ) -> StoreResult<Option<pulpitum::store::ExpiredBucket>> {
        self.inner.expire_bucket(b, before).await
    }
}

#[async_trait]
impl Compaction for Hooked {
    async fn next_compaction_start(
        &self,
        t: &TableId,
        from: EventTime,
        before: EventTime,
    ) -> StoreResult<Option<EventTime>> {
        self.inner.next_compaction_start(t, from, before).await
    }

    async fn partitions_to_compact(
        &self,
        t: &TableId,
        start: EventTime,
        end: EventTime,
        after: Option<&PartitionKey>,
        limit: usize,
        routes_due: bool,
    ) -> StoreResult<Vec<PartitionKey>> {
        self.inner
            .partitions_to_compact(t, start, end, after, limit, routes_due)
            .await
    }

    async fn partition_sources(
        &self,
        t: &TableId,
        start: EventTime,
        end: EventTime,
        partitions: &[PartitionKey],
    ) -> StoreResult<WindowState> {
        self.inner
            .partition_sources(t, start, end, partitions)
            .await
    }

    async fn mark_masks_purged(
        &self,
        b: &BucketId,
        route: &str,
        masks: &[pulpitum::store::RowMask],
    ) -> StoreResult<u64> {
        self.inner.mark_masks_purged(b, route, masks).await
    }

    async fn forget_purged_masks(
        &self,
        older_than: std::time::Duration,
        limit: usize,
    ) -> StoreResult<u64> {
        self.inner.forget_purged_masks(older_than, limit).await
    }

    async fn claim_compaction(
        &self,
        t: &TableId,
        window_key: &str,
        start: EventTime,
        end: EventTime,
        lease: Duration,
    ) -> StoreResult<Option<CompactionClaim>> {
        self.inner
            .claim_compaction(t, window_key, start, end, lease)
            .await
    }

    async fn renew_compaction(
        &self,
        c: &CompactionClaim,
        lease: Duration,
    ) -> StoreResult<CompactionClaim> {
        self.inner.renew_compaction(c, lease).await
    }

    async fn release_compaction(&self, c: &CompactionClaim) -> StoreResult<()> {
        self.inner.release_compaction(c).await
    }

    async fn compaction_claims(&self) -> StoreResult<Vec<CompactionClaim>> {
        self.inner.compaction_claims().await
    }

    async fn switch_routes(&self, c: &CompactionClaim, s: &[RouteSwitch]) -> StoreResult<u64> {
        self.inner.switch_routes(c, s).await
    }

    async fn drop_empty_buckets(
        &self,
        c: &CompactionClaim,
        b: &[pulpitum::store::CompactionSource],
    ) -> StoreResult<u64> {
        self.inner.drop_empty_buckets(c, b).await
    }

    async fn retired_objects(&self) -> StoreResult<Vec<RetiredObject>> {
        self.inner.retired_objects().await
    }

    async fn forget_retired(&self, keys: &[String]) -> StoreResult<u64> {
        self.inner.forget_retired(keys).await
    }

    async fn segments_not_counted(
        &self,
        after: Option<&(TableId, String)>,
        limit: usize,
    ) -> StoreResult<Vec<(TableId, String)>> {
        self.inner.segments_not_counted(after, limit).await
    }

    async fn record_segment_count(
        &self,
        table: &TableId,
        object_key: &str,
        buckets: u64,
    ) -> StoreResult<bool> {
        self.inner
            .record_segment_count(table, object_key, buckets)
            .await
    }
}
