//! Prepared queries: one hot-store call for a "latest N" page, bucket listing at execution
//! (a bucket created after `prepare` is read), the plan shown with `buckets=[at execution]`,
//! and clear errors for bad parameters and statements.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::physical_plan::displayable;
use datafusion::scalar::ScalarValue;
use pulpitum::archive::ArchiveStore;
use pulpitum::model::{BucketId, ClusteringKey, EventTime, PartitionKey, Record, TableId};
use pulpitum::prepared::{prepare, PreparedError};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::postgres::PgStore;
use pulpitum::store::{
    AcrossListing, AppendOutcome, Appends, BatchOutcome, BucketFilter, BucketMeta, Catalog, Claim,
    Compaction, CompactionClaim, Control, Eligibility, HeadPage, HotPage, HotStore, JobEnd,
    JobFilter, JobRecord, JobStart, Lifecycle, PageRequest, PolicyUpdate, RetiredObject,
    RouteSwitch, RoutedReads, StoreResult, TableDefinition, TablePolicy, WindowState, WorkItem,
};

use crate::common::*;

/// The real PostgreSQL store, with a count of calls per read method.
struct Counting {
    inner: Arc<PgStore>,
    calls: Mutex<BTreeMap<&'static str, usize>>,
}

impl Counting {
    fn hit(&self, name: &'static str) {
        *self.calls.lock().unwrap().entry(name).or_default() += 1;
    }

    fn take(&self) -> BTreeMap<&'static str, usize> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

#[async_trait]
impl Catalog for Counting {
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
impl Appends for Counting {
    async fn append(&self, t: &TableId, r: &Record) -> StoreResult<AppendOutcome> {
        self.inner.append(t, r).await
    }

    async fn append_batch(&self, t: &TableId, r: &[Record]) -> StoreResult<BatchOutcome> {
        self.inner.append_batch(t, r).await
    }
}

#[async_trait]
impl RoutedReads for Counting {
    async fn list_buckets(&self, t: &TableId, f: &BucketFilter) -> StoreResult<Vec<BucketMeta>> {
        self.hit("list_buckets");
        self.inner.list_buckets(t, f).await
    }

    async fn list_across(
        &self,
        t: &TableId,
        from: EventTime,
        to: EventTime,
    ) -> StoreResult<Option<AcrossListing>> {
        self.hit("list_across");
        self.inner.list_across(t, from, to).await
    }

    async fn bucket(&self, b: &BucketId) -> StoreResult<Option<BucketMeta>> {
        self.hit("bucket");
        self.inner.bucket(b).await
    }

    async fn read_page(&self, b: &BucketId, r: &PageRequest) -> StoreResult<HotPage> {
        self.hit("read_page");
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
        self.hit("read_head");
        self.inner.read_head(t, p, from, to, page).await
    }
}

#[async_trait]
impl Lifecycle for Counting {
    async fn claim(&self, b: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        self.inner.claim(b, lease).await
    }

    async fn claim_cleanup(&self, b: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        self.inner.claim_cleanup(b, lease).await
    }

    async fn renew(&self, c: &Claim, lease: Duration) -> StoreResult<Claim> {
        self.inner.renew(c, lease).await
    }

    async fn snapshot_page(
        &self,
        c: &Claim,
        after: Option<&ClusteringKey>,
        limit: usize,
    ) -> StoreResult<Vec<Record>> {
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

    async fn backlog(&self, rule: &Eligibility) -> StoreResult<pulpitum::store::Backlog> {
        self.inner.backlog(rule).await
    }

    async fn archiving_claims(&self) -> StoreResult<Vec<BucketMeta>> {
        self.inner.archiving_claims().await
    }

    async fn routed_among(&self, keys: &[String]) -> StoreResult<Vec<String>> {
        self.inner.routed_among(keys).await
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
        self.inner.referenced_object_keys().await
    }
}

#[async_trait]
impl Control for Counting {
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
        self.inner.record_job_start(job).await
    }

    async fn record_job_end(&self, end: &JobEnd) -> StoreResult<()> {
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
impl pulpitum::store::Changes for Counting {
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
impl Compaction for Counting {
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

const CREATE: &str = "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
    OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')";
const LATEST: &str =
    "SELECT id FROM chat WHERE channel_id = $1 ORDER BY timestamp DESC, id DESC LIMIT 5";

/// A session over the env's store wrapped in [`Counting`], with table `chat` created.
async fn counting_session(env: &Env) -> (Arc<Counting>, datafusion::prelude::SessionContext) {
    let counting = Arc::new(Counting {
        inner: env.store.clone(),
        calls: Mutex::new(BTreeMap::new()),
    });
    let archive = Arc::new(ArchiveStore::from_url("memory://").unwrap());
    let ctx = session(
        counting.clone() as Arc<dyn HotStore>,
        archive,
        SessionOptions::default(),
    )
    .await
    .unwrap();
    run(&ctx, CREATE).await.unwrap();
    (counting, ctx)
}

fn ids(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<i64> {
    use datafusion::arrow::array::Int64Array;
    batches
        .iter()
        .flat_map(|b| {
            let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            a.values().to_vec()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_page_is_one_store_call_and_sees_buckets_created_after_prepare() {
    let env = Env::new("prepcount").await;
    let (counting, ctx) = counting_session(&env).await;
    run(
        &ctx,
        "INSERT INTO chat VALUES (1, TIMESTAMP '2024-05-01T10:00:00Z', 1, 'a'), \
         (1, TIMESTAMP '2024-05-01T11:00:00Z', 2, 'b'), (1, TIMESTAMP '2024-05-01T12:00:00Z', 3, 'c'), \
         (1, TIMESTAMP '2024-05-01T13:00:00Z', 4, 'd'), (1, TIMESTAMP '2024-05-01T14:00:00Z', 5, 'e'), \
         (1, TIMESTAMP '2024-05-01T15:00:00Z', 6, 'f'), (2, TIMESTAMP '2024-05-01T15:00:00Z', 60, 'x')",
    )
    .await
    .unwrap();
    let latest = prepare(&ctx, LATEST).await.unwrap();
    assert_eq!(
        latest.parameter_types(),
        &[datafusion::arrow::datatypes::DataType::Int64]
    );
    counting.take();
    let page = latest
        .execute(&[ScalarValue::Int64(Some(1))])
        .await
        .unwrap();
    assert_eq!(ids(&page), vec![6, 5, 4, 3, 2]);
    // Listing, route and rows in one call (one statement on PostgreSQL); no planning I/O.
    assert_eq!(counting.take(), BTreeMap::from([("read_head", 1)]));

    // A newer bucket appears after the statement was prepared: the next execution reads it.
    run(
        &ctx,
        "INSERT INTO chat VALUES (1, TIMESTAMP '2024-05-02T09:00:00Z', 7, 'g'), \
         (1, TIMESTAMP '2024-05-02T09:30:00Z', 8, 'h')",
    )
    .await
    .unwrap();
    counting.take();
    let page = latest
        .execute(&[ScalarValue::Int64(Some(1))])
        .await
        .unwrap();
    assert_eq!(ids(&page), vec![8, 7, 6, 5, 4]);
    // The newest bucket held 2 rows: the next bucket and its rows from one more head read.
    assert_eq!(counting.take(), BTreeMap::from([("read_head", 2)]));
    // The second execution for channel 1 ran a cached physical plan: it still listed the
    // buckets anew (the newer bucket was read) and cost the same one call.
    assert_eq!(latest.cached_plans(), 1);
    let other = latest
        .execute(&[ScalarValue::Int64(Some(2))])
        .await
        .unwrap();
    assert_eq!(ids(&other), vec![60]);
    let none = latest
        .execute(&[ScalarValue::Int64(Some(3))])
        .await
        .unwrap();
    assert!(ids(&none).is_empty());
    assert_eq!(latest.cached_plans(), 3);
    // What the wire server runs on a worker thread (the rest it plans off the workers): an
    // execution whose physical plan is cached for its values, of a statement that does not
    // re-optimise at every execution (`random()`, `now()` do).
    assert!(latest.plans_nothing(&[ScalarValue::Int64(Some(2))]));
    assert!(!latest.plans_nothing(&[ScalarValue::Int64(Some(4))]));
    // ... which `execute_cached` runs: the same rows from the cached plan, nothing planned
    // (no plan added), and no answer at all where it would have to plan.
    let cached = latest
        .execute_cached(&[ScalarValue::Int64(Some(2))])
        .expect("a plan is cached for channel 2")
        .unwrap();
    let rows = datafusion::physical_plan::common::collect(cached)
        .await
        .unwrap();
    assert_eq!(ids(&rows), vec![60]);
    assert!(latest
        .execute_cached(&[ScalarValue::Int64(Some(4))])
        .is_none());
    assert_eq!(latest.cached_plans(), 3);
    // Values that cannot bind are refused there, as at any execution.
    assert!(matches!(
        latest.execute_cached(&[]),
        Some(Err(
            pulpitum::prepared::PreparedError::ParameterCount { .. }
        ))
    ));
    let unstable = prepare(
        &ctx,
        "SELECT id, random() AS r FROM chat WHERE channel_id = $1 \
         ORDER BY timestamp DESC, id DESC LIMIT 5",
    )
    .await
    .unwrap();
    unstable
        .execute(&[ScalarValue::Int64(Some(2))])
        .await
        .unwrap();
    assert!(!unstable.plans_nothing(&[ScalarValue::Int64(Some(2))]));
    assert!(unstable
        .execute_cached(&[ScalarValue::Int64(Some(2))])
        .is_none());

    // Ad-hoc SQL lists at planning time, then reads the page.
    counting.take();
    let b = run(
        &ctx,
        "SELECT id FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC, id DESC LIMIT 5",
    )
    .await
    .unwrap();
    assert_eq!(ids(&b), vec![8, 7, 6, 5, 4]);
    assert_eq!(
        counting.take(),
        BTreeMap::from([("list_buckets", 1), ("read_page", 2)])
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_plan_shows_listing_at_execution() {
    let env = Env::new("prepplan").await;
    env.sql(CREATE).await;
    env.sql("INSERT INTO chat VALUES (1, TIMESTAMP '2024-05-01T10:00:00Z', 1, 'a')")
        .await;
    let latest = prepare(&env.ctx, LATEST).await.unwrap();
    let plan = latest
        .physical_plan(&[ScalarValue::Int64(Some(1))])
        .await
        .unwrap();
    let text = displayable(plan.as_ref()).indent(true).to_string();
    insta::assert_snapshot!(text);
    // Without a channel predicate the keys come from the listing, done while planning.
    let all = prepare(&env.ctx, "SELECT count(*) FROM chat WHERE timestamp > $1")
        .await
        .unwrap();
    let plan = all
        .physical_plan(&[ScalarValue::TimestampMicrosecond(
            Some(0),
            Some("UTC".into()),
        )])
        .await
        .unwrap();
    let text = displayable(plan.as_ref()).indent(true).to_string();
    assert!(
        text.contains("buckets=[hot=1, archiving=0, archived=0, pruned=0]"),
        "{text}"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_and_statements_are_refused_clearly() {
    let env = Env::new("preperr").await;
    env.sql(CREATE).await;
    env.sql(
        "CREATE EXTERNAL TABLE raw STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'raw', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    let latest = prepare(&env.ctx, LATEST).await.unwrap();
    let e = latest.execute(&[]).await.unwrap_err();
    assert!(
        matches!(
            e,
            PreparedError::ParameterCount {
                expected: 1,
                got: 0
            }
        ),
        "{e}"
    );
    let e = latest
        .execute(&[ScalarValue::Utf8(Some("seven".into()))])
        .await
        .unwrap_err();
    assert!(matches!(e, PreparedError::ParameterType { .. }), "{e}");
    assert!(e.to_string().contains("parameter $1 is Int64"), "{e}");

    let e = prepare(&env.ctx, "SELECT id FROM chat WHERE channel_id = $2")
        .await
        .unwrap_err();
    assert!(matches!(e, PreparedError::ParameterNames(_)), "{e}");
    let e = prepare(&env.ctx, "SELECT $1").await.unwrap_err();
    assert!(matches!(e, PreparedError::UntypedParameter(_)), "{e}");
    let e = prepare(&env.ctx, "CREATE VIEW v AS SELECT 1")
        .await
        .unwrap_err();
    assert!(matches!(e, PreparedError::NotAQuery(_)), "{e}");
    let e = prepare(&env.ctx, "SELEC 1").await.unwrap_err();
    assert!(matches!(e, PreparedError::DataFusion(_)), "{e}");

    // A raw key parameter that no stored row can have (empty) cannot be pushed exactly:
    // the query fails instead of dropping the filter.
    env.sql("INSERT INTO raw VALUES (X'01', TIMESTAMP '2024-05-01T10:00:00Z', X'02', X'03')")
        .await;
    let by_key = prepare(
        &env.ctx,
        "SELECT count(*) FROM raw WHERE partition_key = $1",
    )
    .await
    .unwrap();
    let n = by_key
        .execute(&[ScalarValue::Binary(Some(vec![1]))])
        .await
        .unwrap();
    assert_eq!(pretty(&n).matches("| 1 ").count(), 1, "{}", pretty(&n));
    let e = by_key
        .execute(&[ScalarValue::Binary(Some(vec![]))])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot be applied exactly"), "{e}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_insert_appends_through_the_fence() {
    let env = Env::new("prepins").await;
    env.sql(CREATE).await;
    let insert = prepare(&env.ctx, "INSERT INTO chat VALUES ($1, $2, $3, $4)")
        .await
        .unwrap();
    let ts = |s: &str| {
        ScalarValue::TimestampMicrosecond(
            Some(EventTime::parse_rfc3339(s).unwrap().as_micros()),
            Some("UTC".into()),
        )
    };
    for (id, at) in [(1, "2024-05-01T10:00:00Z"), (2, "2024-05-01T11:00:00Z")] {
        insert
            .execute(&[
                ScalarValue::Int64(Some(9)),
                ts(at),
                ScalarValue::Int64(Some(id)),
                ScalarValue::Utf8(Some(format!("m{id}"))),
            ])
            .await
            .unwrap();
    }
    let latest = prepare(&env.ctx, LATEST).await.unwrap();
    let page = latest
        .execute(&[ScalarValue::Int64(Some(9))])
        .await
        .unwrap();
    assert_eq!(ids(&page), vec![2, 1]);
    // A row aimed at a fenced bucket fails the statement, naming the bucket.
    let bucket = BucketId {
        table_id: TableId::new("chat").unwrap(),
        partition_key: PartitionKey::new(pulpitum::model::encode_i64(9).to_vec()).unwrap(),
        bucket_key: pulpitum::model::BucketStrategy::CalendarDayUtc
            .bucket_of(EventTime::parse_rfc3339("2024-05-01T00:00:00Z").unwrap()),
    };
    env.store
        .claim(&bucket, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let e = insert
        .execute(&[
            ScalarValue::Int64(Some(9)),
            ts("2024-05-01T12:00:00Z"),
            ScalarValue::Int64(Some(3)),
            ScalarValue::Utf8(Some("late".into())),
        ])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("archiving"), "{e}");
    assert!(e.to_string().contains("day:2024-05-01"), "{e}");
    let page = latest
        .execute(&[ScalarValue::Int64(Some(9))])
        .await
        .unwrap();
    assert_eq!(ids(&page), vec![2, 1], "nothing was written");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_plans_run_concurrently_with_fresh_state() {
    use datafusion::physical_plan::collect;
    let env = Env::new("prepcache").await;
    env.sql(CREATE).await;
    for ch in 1..=4i64 {
        let values: Vec<String> = (0..20)
            .map(|i| {
                format!(
                    "({ch}, TIMESTAMP '2024-05-0{}T10:{i:02}:00Z', {i}, 'm')",
                    1 + i % 3
                )
            })
            .collect();
        env.sql(&format!("INSERT INTO chat VALUES {}", values.join(", ")))
            .await;
    }
    let latest = Arc::new(prepare(&env.ctx, LATEST).await.unwrap());
    let mut tasks = Vec::new();
    for t in 0..8i64 {
        let latest = latest.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25i64 {
                let ch = 1 + (t + i) % 4;
                let page = latest
                    .execute(&[ScalarValue::Int64(Some(ch))])
                    .await
                    .unwrap();
                // Day 3 holds ids 2, 5, 8, ..., 17 at minutes 2..17: the newest five.
                assert_eq!(ids(&page), vec![17, 14, 11, 8, 5], "channel {ch}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(latest.cached_plans(), 4);
    // A plan from the cache starts with fresh metrics: one execution's rows, not all of them.
    let plan = latest
        .physical_plan(&[ScalarValue::Int64(Some(1))])
        .await
        .unwrap();
    collect(plan.clone(), env.ctx.task_ctx()).await.unwrap();
    let mut hot_rows = 0;
    let mut node = plan;
    loop {
        if let Some(m) = node.metrics() {
            hot_rows += m.sum_by_name("hot_rows").map_or(0, |v| v.as_usize());
        }
        let next = node.children().first().map(|c| (*c).clone());
        match next {
            Some(c) => node = c,
            None => break,
        }
    }
    assert_eq!(hot_rows, 5);
    // Plans with state DataFusion cannot reset, or listings made while planning, are not kept.
    let agg = prepare(
        &env.ctx,
        "SELECT count(*) FROM chat WHERE channel_id = $1 AND timestamp > $2",
    )
    .await
    .unwrap();
    let since = ScalarValue::TimestampMicrosecond(Some(0), Some("UTC".into()));
    for _ in 0..2 {
        let n = agg
            .execute(&[ScalarValue::Int64(Some(2)), since.clone()])
            .await
            .unwrap();
        assert!(pretty(&n).contains("| 20 "), "{}", pretty(&n));
    }
    assert_eq!(agg.cached_plans(), 0);
    env.cleanup().await;
}

/// A channel with a long history of daily buckets: a "latest" page that the head reads
/// answer never lists buckets; pages and full scans that read past them list the rest a page
/// of buckets at a time, only as far as they read, and return every row once, in order, both
/// ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_histories_read_heads_then_list_the_rest() {
    use pulpitum::model::encode_i64;
    use pulpitum::model::SortKey;
    use pulpitum::table::{HEAD_READS, LIST_PAGE};

    let env = Env::new("preplong").await;
    let (counting, ctx) = counting_session(&env).await;
    // The head reads, one full listing page, and six more.
    let days = (HEAD_READS + LIST_PAGE) as i64 + 6;
    let day0 = EventTime::parse_rfc3339("2024-01-01T08:00:00Z")
        .unwrap()
        .as_micros();
    // Two messages a day; ids ascend with time.
    let records: Vec<Record> = (0..days * 2)
        .map(|i| Record {
            partition_key: PartitionKey::new(encode_i64(1).to_vec()).unwrap(),
            event_time: EventTime::from_micros(day0 + (i / 2) * 86_400_000_000 + (i % 2) * 1_000)
                .unwrap(),
            sort_key: SortKey::new(encode_i64(i).to_vec()).unwrap(),
            value: format!("m{i}").into_bytes(),
        })
        .collect();
    env.store
        .append_batch(&TableId::new("chat").unwrap(), &records)
        .await
        .unwrap();
    let all: Vec<i64> = (0..days * 2).collect();
    let one = [ScalarValue::Int64(Some(1))];

    // Latest 3: the newest bucket from the first head statement, one row of the next from
    // the second (no listing). Latest 5 reaches a third bucket, past the head reads: one
    // listing page; so do two buckets past them, and exactly the rows of the head reads and
    // the first listing page (the scan stops there without listing the next page); one row
    // more lists the next. Short pages also check every store call.
    for (want, listings, exact) in [
        (3, 0, Some(vec![("read_head", 2)])),
        (
            5,
            1,
            Some(vec![
                ("read_head", 2),
                ("list_buckets", 1),
                ("read_page", 1),
            ]),
        ),
        (2 * (HEAD_READS + 2), 1, None),
        (2 * (HEAD_READS + LIST_PAGE), 1, None),
        (2 * (HEAD_READS + LIST_PAGE) + 1, 2, None),
    ] {
        let latest = prepare(
            &ctx,
            &format!(
                "SELECT id FROM chat WHERE channel_id = $1 ORDER BY timestamp DESC, id DESC LIMIT {want}"
            ),
        )
        .await
        .unwrap();
        counting.take();
        let page = latest.execute(&one).await.unwrap();
        assert_eq!(
            ids(&page),
            all.iter().rev().take(want).copied().collect::<Vec<_>>()
        );
        let calls = counting.take();
        assert_eq!(
            calls.get("list_buckets").copied().unwrap_or(0),
            listings,
            "{want}: {calls:?}"
        );
        assert_eq!(
            calls.get("read_head"),
            Some(&HEAD_READS),
            "{want}: {calls:?}"
        );
        if let Some(exact) = exact {
            assert_eq!(calls, BTreeMap::from_iter(exact), "latest {want}");
        }
    }
    // Limits below SQL, with the stream drained to its end (DataFusion's limit stops polling
    // once it has its rows; a consumer that does not must not look further): the newest
    // bucket's two rows need one head read, three rows a second, and the rows of the head
    // reads and one listing page no second listing.
    {
        use futures::StreamExt;
        use pulpitum::model::ScanBounds;
        use pulpitum::table::{BucketScan, DurableTable};
        let tid = TableId::new("chat").unwrap();
        let def = counting.table(&tid).await.unwrap().unwrap();
        let archive = Arc::new(ArchiveStore::from_url("memory://").unwrap());
        let table = DurableTable::new(counting.clone() as Arc<dyn HotStore>, archive, def);
        for (want, calls) in [
            (2, vec![("read_head", 1)]),
            (3, vec![("read_head", 2)]),
            (
                2 * (HEAD_READS + LIST_PAGE),
                vec![
                    ("read_head", HEAD_READS),
                    ("list_buckets", 1),
                    ("read_page", LIST_PAGE),
                ],
            ),
        ] {
            let req = BucketScan {
                bounds: ScanBounds::all(),
                descending: true,
                include_value: false,
                include_keys: true,
                page_rows: 50,
                limit: Some(want),
                archive_metrics: None,
                value: Default::default(),
            };
            counting.take();
            let chunks: Vec<_> = table
                .scan_key(PartitionKey::new(encode_i64(1).to_vec()).unwrap(), req)
                .collect()
                .await;
            let rows: usize = chunks
                .iter()
                .map(|c| c.as_ref().unwrap().batch.num_rows())
                .sum();
            assert_eq!(rows, want);
            assert_eq!(
                counting.take(),
                BTreeMap::from_iter(calls),
                "drained {want}"
            );
        }
    }

    // Unlimited, ascending, and with a time window that starts inside the history.
    let asc = prepare(
        &ctx,
        "SELECT id FROM chat WHERE channel_id = $1 ORDER BY timestamp, id",
    )
    .await
    .unwrap();
    counting.take();
    assert_eq!(ids(&asc.execute(&one).await.unwrap()), all);
    // A full listing page, then the six left.
    assert_eq!(counting.take().get("list_buckets"), Some(&2));
    let window = prepare(
        &ctx,
        "SELECT id FROM chat WHERE channel_id = $1 AND timestamp >= $2 ORDER BY timestamp, id",
    )
    .await
    .unwrap();
    let from =
        ScalarValue::TimestampMicrosecond(Some(day0 + 3 * 86_400_000_000), Some("UTC".into()));
    let got = ids(&window.execute(&[one[0].clone(), from]).await.unwrap());
    assert_eq!(got, all[6..].to_vec());
    env.cleanup().await;
}

/// A scan drained below SQL stops at its limit whichever tier each bucket is in: the limit is
/// counted across a hot bucket found by the first head read and an archived one found by the
/// second, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_scans_count_the_limit_across_tiers() {
    use datafusion::arrow::array::{Array, BinaryArray};
    use futures::StreamExt;
    use pulpitum::archive::PayloadFormat;
    use pulpitum::model::{decode_i64, encode_i64};
    use pulpitum::model::{BucketStrategy, ScanBounds};
    use pulpitum::table::{BucketScan, DurableTable};

    let env = Env::new("preptiers").await;
    env.sql(CREATE).await;
    // Day 1 holds ids 1-4 and is archived; day 2 holds ids 5 and 6 and stays hot.
    env.sql(
        "INSERT INTO chat VALUES (1, TIMESTAMP '2024-05-01T10:00:00Z', 1, 'a'), \
         (1, TIMESTAMP '2024-05-01T11:00:00Z', 2, 'b'), (1, TIMESTAMP '2024-05-01T12:00:00Z', 3, 'c'), \
         (1, TIMESTAMP '2024-05-01T13:00:00Z', 4, 'd'), (1, TIMESTAMP '2024-05-02T09:00:00Z', 5, 'e'), \
         (1, TIMESTAMP '2024-05-02T10:00:00Z', 6, 'f')",
    )
    .await;
    let tid = TableId::new("chat").unwrap();
    let partition = PartitionKey::new(encode_i64(1).to_vec()).unwrap();
    let day1 = BucketId {
        table_id: tid.clone(),
        partition_key: partition.clone(),
        bucket_key: BucketStrategy::CalendarDayUtc
            .bucket_of(EventTime::parse_rfc3339("2024-05-01T10:00:00Z").unwrap()),
    };
    let mut loaded = crate::dataset::Loaded::default();
    crate::dataset::archive(&env, &day1, PayloadFormat::Parquet, false, &mut loaded).await;
    let def = env.store.table(&tid).await.unwrap().unwrap();
    let table = DurableTable::new(
        env.store.clone() as Arc<dyn HotStore>,
        env.archive.clone(),
        def,
    );
    for (descending, want) in [
        (true, vec![6, 5, 4]),
        (true, vec![6, 5, 4, 3, 2]),
        (false, vec![1, 2, 3]),
        (false, vec![1, 2, 3, 4, 5]),
    ] {
        let req = BucketScan {
            bounds: ScanBounds::all(),
            descending,
            include_value: false,
            include_keys: true,
            page_rows: 50,
            limit: Some(want.len()),
            archive_metrics: None,
            value: Default::default(),
        };
        let chunks: Vec<_> = table.scan_key(partition.clone(), req).collect().await;
        let mut got = Vec::new();
        for chunk in chunks {
            let batch = chunk.unwrap().batch;
            let keys = batch.column_by_name("sort_key").unwrap();
            let keys = keys.as_any().downcast_ref::<BinaryArray>().unwrap();
            got.extend((0..keys.len()).map(|i| decode_i64(keys.value(i)).unwrap()));
        }
        assert_eq!(got, want, "descending {descending}");
    }
    env.cleanup().await;
}
