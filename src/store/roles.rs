//! The hot store's contract, split by the role each caller plays, so a reader depends on
//! routed reads alone and the archiver on the lifecycle, and a new backend can be written
//! and reviewed one role at a time.
//!
//! - [`Catalog`]: migrations, table registrations and the store's clock.
//! - [`Appends`]: fenced, idempotent writes of records.
//! - [`RoutedReads`]: bucket listings and hot pages that carry their route.
//! - [`Lifecycle`]: the archiver's claim, snapshot, publish, cleanup and discovery steps and
//!   the queries garbage collection relies on.
//! - [`Control`]: the control plane: per-table policies, the store-wide pause and the
//!   archiver's job history.
//! - [`Compaction`]: the registry side of segment compaction: window claims, a window's
//!   sources, the one-transaction route switch and the retired objects GC waits on.
//! - [`Changes`]: `DELETE`/`UPDATE` of rows (in place when hot, masked when archived), the
//!   masks archived reads apply, and retention's removal of whole buckets.
//!
//! [`HotStore`] is all seven together, implemented for every type that implements them; it is
//! what a session or an archiver holds. Every method is one serializable transaction or one
//! statement.

use std::time::Duration;

use async_trait::async_trait;

use super::migrate::Migrated;
use super::{
    AcrossListing, AppendOutcome, Backlog, BatchOutcome, BucketFilter, BucketMeta, ChangeOutcome,
    Claim, CompactionClaim, CompactionSource, Eligibility, ExpiredBucket, GcPrefix, HeadPage,
    HotPage, JobEnd, JobFilter, JobRecord, JobStart, PageRequest, PolicyUpdate, ReaderInfo,
    RetiredObject, RouteSwitch, RoutedBucket, RowChange, RowMask, StoreResult, StoredSchema,
    TableDefinition, TablePolicy, WindowState, WorkItem,
};
use crate::model::{BucketId, BucketKey, ClusteringKey, EventTime, PartitionKey, Record, TableId};

/// Registrations, migrations and the store's clock.
#[async_trait]
pub trait Catalog: Send + Sync + 'static {
    /// Applies pending migrations; safe when several processes call it at once. Needs the
    /// rights to create tables and indexes (the schema owner's step, `pulpitum migrate`).
    async fn migrate(&self) -> StoreResult<Migrated>;

    /// Checks, reading only, that every migration of this build is applied and that none
    /// recorded by a newer build forbids this one; returns the schema version. What every
    /// start that is not `migrate` runs: it needs no DDL right. A missing migration is
    /// [`StoreError::SchemaBehind`](super::StoreError::SchemaBehind).
    async fn check_schema(&self) -> StoreResult<i64>;

    /// Registers a table. The identical definition twice is a no-op; a different strategy or
    /// surface for an existing id is [`StoreError::TableConflict`]. Returns the stored row.
    async fn register_table(&self, def: &TableDefinition) -> StoreResult<TableDefinition>;

    /// One table's definition.
    async fn table(&self, table_id: &TableId) -> StoreResult<Option<TableDefinition>>;

    /// Every registered table, ordered by id.
    async fn tables(&self) -> StoreResult<Vec<TableDefinition>>;

    /// The store's current time (its clock decides leases).
    async fn now(&self) -> StoreResult<EventTime>;

    /// The newest stored version of a declared table's schema; `None` when none is stored.
    async fn table_schema(&self, table_id: &TableId) -> StoreResult<Option<StoredSchema>>;

    /// Stores `schema` as the table's next version, in one transaction: version 1 when none
    /// is stored, otherwise exactly one more than the newest. Storing the newest version
    /// again with the same definition is a no-op; anything else is
    /// [`StoreError::SchemaChanged`](super::StoreError::SchemaChanged), and an unregistered
    /// table [`StoreError::UnknownTable`](super::StoreError::UnknownTable).
    async fn put_table_schema(&self, table_id: &TableId, schema: &StoredSchema) -> StoreResult<()>;

    /// Records a reader, or refreshes it, with the store's clock as `seen_at`.
    async fn announce_reader(&self, reader: &ReaderInfo) -> StoreResult<()>;

    /// Forgets a reader (its process is stopping); a reader not recorded is no error.
    async fn withdraw_reader(&self, reader_id: &str) -> StoreResult<()>;

    /// The readers seen at or after `since`, oldest first. A row that cannot be read (a
    /// time out of range, a negative version) is left out with a warning: it names no
    /// process this build could check.
    async fn readers_since(&self, since: EventTime) -> StoreResult<Vec<ReaderInfo>>;

    /// Deletes the readers last seen before `before` or after `after` (processes long gone,
    /// and rows no running process wrote); returns how many.
    async fn forget_readers(&self, before: EventTime, after: EventTime) -> StoreResult<u64>;
}

/// Fenced appends: a record commits only into a Hot bucket inside the table's guard.
#[async_trait]
pub trait Appends: Send + Sync + 'static {
    /// Appends one record: creates the bucket as Hot if absent, commits only if the bucket is
    /// Hot, inserts if absent. An identical duplicate is `AlreadyPresent`; a different value
    /// under the same key is `DuplicateKey`.
    async fn append(&self, table_id: &TableId, record: &Record) -> StoreResult<AppendOutcome>;

    /// Appends records atomically: all commit or none (one fenced bucket rejects the batch).
    async fn append_batch(
        &self,
        table_id: &TableId,
        records: &[Record],
    ) -> StoreResult<BatchOutcome>;
}

/// Reads that carry their route: listings of buckets and pages of hot rows observed together
/// with the bucket's state, so one page never mixes tiers.
#[async_trait]
pub trait RoutedReads: Send + Sync + 'static {
    /// Buckets of a table matching the filter, ordered by partition key, then bucket start
    /// (descending when [`BucketFilter::descending`]), cut at [`BucketFilter::limit`].
    async fn list_buckets(
        &self,
        table_id: &TableId,
        filter: &BucketFilter,
    ) -> StoreResult<Vec<BucketMeta>>;

    /// Every partition's buckets overlapping `[from, to]`, with the segments that hold
    /// theirs whole named once instead of bucket by bucket (see [`AcrossListing`]); `None`
    /// when this store cannot tell, and the caller lists with
    /// [`list_buckets`](Self::list_buckets). A listing across a table's partitions then
    /// costs the segments and the buckets outside them, not one row per (partition, bucket).
    async fn list_across(
        &self,
        table_id: &TableId,
        from: EventTime,
        to: EventTime,
    ) -> StoreResult<Option<AcrossListing>> {
        let _ = (table_id, from, to);
        Ok(None)
    }

    /// One bucket's metadata.
    async fn bucket(&self, bucket: &BucketId) -> StoreResult<Option<BucketMeta>>;

    /// The route and one page of hot rows, from one statement.
    async fn read_page(&self, bucket: &BucketId, req: &PageRequest) -> StoreResult<HotPage>;

    /// The first of one partition's buckets overlapping `[from, to]` in scan order (the
    /// newest when `page.descending`, else the oldest), with its route and first page.
    /// `first` is [`HotPage::Missing`] when no bucket overlaps.
    ///
    /// This is how a scan that starts at execution time finds its first bucket and reads its
    /// first rows in one round trip; the buckets after it are found by further calls on the
    /// interval beyond it, then by [`list_buckets`](Self::list_buckets) (see
    /// [`crate::table::HEAD_READS`]). The default runs a listing of one and a page read one
    /// after another; a store that can answer both in one statement should.
    async fn read_head(
        &self,
        table_id: &TableId,
        partition: &PartitionKey,
        from: Option<EventTime>,
        to: Option<EventTime>,
        page: &PageRequest,
    ) -> StoreResult<HeadPage> {
        let filter = BucketFilter {
            partitions: Some(vec![partition.clone()]),
            from,
            to,
            descending: page.descending,
            limit: Some(1),
        };
        let bucket = self.list_buckets(table_id, &filter).await?.pop();
        let first = match &bucket {
            None => HotPage::Missing,
            Some(m) => self.read_page(&m.id, page).await?,
        };
        Ok(HeadPage {
            bucket: bucket.map(RoutedBucket::from),
            first,
        })
    }
}

/// The archiving lifecycle: every step checks owner token, fencing generation and lease
/// against the store's clock in the statement that writes.
#[async_trait]
pub trait Lifecycle: Send + Sync + 'static {
    /// Claims a bucket for archiving: a Hot bucket whose retry time has passed, or an
    /// Archiving bucket whose lease expired, becomes Archiving with a fresh token,
    /// `generation + 1` and `expires_at = now + lease`. `Ok(None)` when not claimable,
    /// which includes a paused table or store: the pause is read in the claiming statement,
    /// so once a pause commits no claim that follows it succeeds.
    async fn claim(&self, bucket: &BucketId, lease: Duration) -> StoreResult<Option<Claim>>;

    /// Claims a published bucket's cleanup: an Archived bucket with hot rows whose previous
    /// owner's lease expired gets a fresh token and `generation + 1`. `Ok(None)` otherwise.
    async fn claim_cleanup(&self, bucket: &BucketId, lease: Duration)
        -> StoreResult<Option<Claim>>;

    /// Extends the lease of a current claim; [`StoreError::StaleClaim`] if it is not current.
    async fn renew(&self, claim: &Claim, lease: Duration) -> StoreResult<Claim>;

    /// One ordered page of an Archiving bucket's rows strictly after `after`, verifying token,
    /// generation and lease in the same statement that reads.
    async fn snapshot_page(
        &self,
        claim: &Claim,
        after: Option<&ClusteringKey>,
        limit: usize,
    ) -> StoreResult<Vec<Record>>;

    /// Returns a claimed Archiving bucket to Hot, claimable again after `retry_after`.
    async fn defer_archive(&self, claim: &Claim, retry_after: Duration) -> StoreResult<()>;

    /// The read-cutover commit point: Archiving with this claim becomes
    /// `Archived { object_key, hot_deleted: false }`.
    async fn publish_archive(&self, claim: &Claim, object_key: &str) -> StoreResult<()>;

    /// Deletes up to `limit` hot rows of a published bucket under a current cleanup claim;
    /// when none remain, sets `hot_deleted = true`. Returns rows deleted and whether done.
    /// Refused until `min_age` has passed since publication (the readers' route-cache bound).
    async fn cleanup_step(
        &self,
        claim: &Claim,
        limit: usize,
        min_age: Duration,
    ) -> StoreResult<(u64, bool)>;

    /// Work for the archiver: eligible Hot buckets (by [`Eligibility`] and the table's
    /// policy, retry passed), expired pre-publication claims, and published buckets with
    /// cleanup pending whose owner lease (if any) expired, up to `limit`, oldest buckets
    /// first. Buckets of a paused table or store are archive work for no one; their cleanup
    /// still is.
    async fn discover(&self, rule: &Eligibility, limit: usize) -> StoreResult<Vec<WorkItem>>;

    /// [`discover`](Self::discover), except that a published bucket's cleanup is work only
    /// once the larger of `cleanup_delay` and its table's policy delay has passed since its
    /// publication, so cleanups not yet due never fill the batch ahead of eligible buckets;
    /// the condition is in the statement, so the batch is full whenever that much work is
    /// due.
    async fn discover_ready(
        &self,
        rule: &Eligibility,
        limit: usize,
        cleanup_delay: Duration,
    ) -> StoreResult<Vec<WorkItem>>;

    /// Counts the eligible backlog (by time, paused or not) per table with its oldest
    /// bucket end, and the buckets being archived, reading only the Hot and Archiving range
    /// of the `(state, bucket_end)` index, so the archiver can afford it every cycle.
    async fn backlog(&self, rule: &Eligibility) -> StoreResult<Backlog>;

    /// Every object key referenced by a published route. A full read of the registry's
    /// routes: for checks and tools; orphan GC asks [`routed_among`](Self::routed_among).
    async fn referenced_object_keys(&self) -> StoreResult<Vec<String>>;

    /// Every bucket in the Archiving state (an in-flight claim) of every table, read from
    /// the `(state, bucket_end)` index: what orphan GC must not touch, in a read that grows
    /// with the claims, not the registry.
    async fn archiving_claims(&self) -> StoreResult<Vec<BucketMeta>>;

    /// Those of `keys` some bucket routes to (each once, in any order): orphan GC's check of
    /// its candidates, one index probe per key, so a pass costs what it may delete rather
    /// than a read of every route.
    async fn routed_among(&self, keys: &[String]) -> StoreResult<Vec<String>>;

    /// Notes `prefix` (a directory ending with `/`) as one where objects no route names may
    /// be left, at the store's now (a noting again refreshes it); returns the row as noted.
    /// Called before anything is written there, so a directory GC must look at is always
    /// noted (a failed noting writes nothing).
    async fn note_gc_prefix(&self, prefix: &str) -> StoreResult<GcPrefix>;

    /// Up to `limit` noted prefixes starting with `under` (an archive's root; `""`: all),
    /// last noted at least `min_age` ago (store clock), oldest first. Filtered here, so
    /// notings of another root (a changed archive prefix) never crowd out this one's.
    async fn gc_prefixes(
        &self,
        min_age: Duration,
        under: &str,
        limit: usize,
    ) -> StoreResult<Vec<GcPrefix>>;

    /// Forgets each of `seen` whose row is still as read (not noted again since); returns
    /// how many were forgotten.
    async fn forget_gc_prefixes(&self, seen: &[GcPrefix]) -> StoreResult<u64>;
}

/// The control plane: tiering policies, pauses and job history. Policies and pauses are
/// read by discovery and claims in their own statements; history is written beside the
/// lifecycle's transactions, never inside them, so a history write that fails cannot fail
/// or weaken a fenced step.
#[async_trait]
pub trait Control: Send + Sync + 'static {
    /// Every table's policy, ordered by table id; a table that never had one is absent.
    async fn policies(&self) -> StoreResult<Vec<TablePolicy>>;

    /// Applies `update` to a table's policy in one transaction (fields it leaves alone keep
    /// their value, even under concurrent updates) and returns the result.
    /// [`StoreError::UnknownTable`](super::StoreError::UnknownTable) for an unregistered table.
    async fn update_policy(
        &self,
        table_id: &TableId,
        update: &PolicyUpdate,
    ) -> StoreResult<TablePolicy>;

    /// Whether the whole store is paused (no new archive claims on any table).
    async fn store_paused(&self) -> StoreResult<bool>;

    /// Pauses or resumes the whole store; durable.
    async fn set_store_paused(&self, paused: bool) -> StoreResult<()>;

    /// Records a job's start; marks any earlier unfinished job of the same bucket as
    /// abandoned (its worker stopped and this claim took the bucket over). Idempotent.
    async fn record_job_start(&self, job: &JobStart) -> StoreResult<()>;

    /// Records a job's end (writing its start too if that was never recorded).
    async fn record_job_end(&self, end: &JobEnd) -> StoreResult<()>;

    /// Job history matching the filter, newest start first.
    async fn jobs(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>>;

    /// Deletes up to `limit` history rows started before `before`; returns how many.
    async fn prune_jobs(&self, before: EventTime, limit: usize) -> StoreResult<u64>;
}

/// The registry side of segment compaction (docs/segments.md, sections 5 to 7): a window of
/// one table is claimed like a bucket (fresh token, generation + 1, a lease on the store's
/// clock), its archived buckets are read as sources, and their routes are moved to segments
/// in one serializable transaction that checks the claim and every bucket's route, and
/// records the replaced objects for garbage collection.
///
/// A window claim never fences a bucket: compaction reads objects that are already
/// immutable, and the switch's route check (each bucket still routes to the object the
/// compaction read) is what keeps a re-archived or otherwise moved bucket from being
/// switched to stale rows.
#[async_trait]
pub trait Compaction: Send + Sync + 'static {
    /// The start of the earliest bucket of `table_id` starting at or after `from` that
    /// compaction has work for, or `None`. Work is an archived bucket with
    /// `hot_deleted = true` that either is routed to a per-bucket object (its key does not
    /// match [`SEGMENT_KEY_LIKE`]) and ends at or before `before`, or has masks not yet
    /// rewritten (`purged_at` NULL; due at once, whatever `before`). The first kind is one
    /// probe of the partial index of migration 18 (both stores), whatever the number of
    /// buckets already in segments or not yet due (if the earliest such bucket ends after
    /// `before`, no later one is due: for one table, a later start never has an earlier
    /// end); the second reads the masks not yet rewritten, which rewriting keeps few. The
    /// compactor walks the windows with work with it, jumping from one window's end to the
    /// next.
    ///
    /// [`SEGMENT_KEY_LIKE`]: super::compaction::SEGMENT_KEY_LIKE
    async fn next_compaction_start(
        &self,
        table_id: &TableId,
        from: EventTime,
        before: EventTime,
    ) -> StoreResult<Option<EventTime>>;

    /// Up to `limit` partitions of `table_id`, in key order and after `after` (from the
    /// first when `None`), that hold a bucket with `bucket_start` in `[start, end)` that is
    /// archived with `hot_deleted = true` and either routed to a per-bucket object or
    /// masked by records not yet rewritten: the partitions of a window that compaction has
    /// work for. Paged so that a window of millions of partitions is never listed at once;
    /// served by the same partial index (and the masks' primary key). With `routes_due`
    /// false (a window not over by the compaction cutoff) only the masked kind counts.
    async fn partitions_to_compact(
        &self,
        table_id: &TableId,
        start: EventTime,
        end: EventTime,
        after: Option<&PartitionKey>,
        limit: usize,
        routes_due: bool,
    ) -> StoreResult<Vec<PartitionKey>>;

    /// The buckets of `partitions` (of `table_id`) with `bucket_start` in `[start, end)`,
    /// read in one snapshot (see [`WindowState`]): the archived, cleaned ones as sources
    /// (whatever they route to, older segments included), in partition then start order,
    /// and the partitions that hold any other bucket (hot, being archived, or archived with
    /// hot rows not deleted yet), which compaction leaves for a later pass.
    async fn partition_sources(
        &self,
        table_id: &TableId,
        start: EventTime,
        end: EventTime,
        partitions: &[PartitionKey],
    ) -> StoreResult<WindowState>;

    /// Marks `masks` of `bucket` as rewritten (`purged_at` = the store's `now()`), in one
    /// transaction, each only while it still holds the kind and value given (a mask
    /// changed since the rewrite read it is left for the next one) and only while the
    /// bucket routes to `route` (the segment the rewrite wrote, which holds the rows with
    /// the masks applied). Returns how many were marked. Called after the switch: marking
    /// before it could let garbage collection forget a mask whose rows are still in the
    /// routed object.
    async fn mark_masks_purged(
        &self,
        bucket: &BucketId,
        route: &str,
        masks: &[RowMask],
    ) -> StoreResult<u64>;

    /// Deletes up to `limit` masks marked rewritten at least `older_than` ago by the
    /// store's clock (no reader can still hold a route to the objects before the rewrite);
    /// returns how many.
    async fn forget_purged_masks(&self, older_than: Duration, limit: usize) -> StoreResult<u64>;

    /// Claims a window: succeeds when the window has no row yet, or its lease expired, or
    /// it was released; sets a fresh owner token, `generation + 1` (1 for a new window) and
    /// `lease_expires_at = now + lease` on the store's clock, and records `start` and `end`.
    /// `Ok(None)` while another claim's lease is live.
    async fn claim_compaction(
        &self,
        table_id: &TableId,
        window_key: &str,
        start: EventTime,
        end: EventTime,
        lease: Duration,
    ) -> StoreResult<Option<CompactionClaim>>;

    /// Extends a current claim (token and generation match and the lease has not expired,
    /// checked in the statement that writes); [`StoreError::StaleCompaction`] otherwise.
    ///
    /// [`StoreError::StaleCompaction`]: super::StoreError::StaleCompaction
    async fn renew_compaction(
        &self,
        claim: &CompactionClaim,
        lease: Duration,
    ) -> StoreResult<CompactionClaim>;

    /// Releases a claim whose token and generation still hold the window, so the window is
    /// claimable at once. A claim that no longer holds it is not an error: there is nothing
    /// to release, and the claim that holds it now is left alone.
    async fn release_compaction(&self, claim: &CompactionClaim) -> StoreResult<()>;

    /// Every window claim not released, whether its lease is live or expired, ordered by
    /// table and window: garbage collection protects their generations' objects.
    async fn compaction_claims(&self) -> StoreResult<Vec<CompactionClaim>>;

    /// The switch, one serializable transaction:
    ///
    /// 1. the claim is current (token, generation, lease unexpired on the store's clock),
    ///    else [`StoreError::StaleCompaction`];
    /// 2. every switch's bucket is of the claim's table and window, listed once, `archived`
    ///    with `hot_deleted = true` and `object_key = from_object_key`, else
    ///    [`StoreError::RouteChanged`] naming the first switch (in the given order) that
    ///    fails;
    /// 3. each bucket's `object_key` becomes `to_object_key`; the rows updated must number
    ///    `switches.len()`, or the transaction rolls back;
    /// 4. every distinct `from_object_key` is recorded as retired at the store's `now`
    ///    (a key retired before takes the later time: readers may hold a route to it until
    ///    the last switch that replaced it, plus their cache bound).
    ///
    /// On any error nothing is written. Returns the number of buckets switched. A switch
    /// whose commit had an unknown outcome is not retried blindly: if it committed, the
    /// retry meets [`StoreError::RouteChanged`] (the routes are already the segments'), so
    /// the caller re-reads the routes ([`partition_sources`](Self::partition_sources)) to tell.
    ///
    /// [`StoreError::StaleCompaction`]: super::StoreError::StaleCompaction
    /// [`StoreError::RouteChanged`]: super::StoreError::RouteChanged
    async fn switch_routes(
        &self,
        claim: &CompactionClaim,
        switches: &[RouteSwitch],
    ) -> StoreResult<u64>;

    /// Removes archived buckets of the claim's window whose archive holds no rows once
    /// their masks are applied, in one transaction checked like
    /// [`switch_routes`](Self::switch_routes): the claim is current, and every bucket is of
    /// the claim's table and window, listed once, `archived` with `hot_deleted = true` and
    /// routed to its source's `object_key` (else [`StoreError::RouteChanged`] naming the
    /// first that is not, and nothing is written). Each bucket's metadata (its route) is
    /// deleted, its masks are marked rewritten (a reader holding the old route still
    /// applies them until garbage collection forgets them), and its object is recorded as
    /// retired, as retention does: a bucket with no metadata reads as empty
    /// ([`HotPage::Missing`]), which is what it holds. A segment lists only buckets with
    /// rows, so an empty bucket cannot be switched to one; kept with its per-bucket route,
    /// it would bring its window back on every pass. Returns the number removed.
    ///
    /// [`StoreError::RouteChanged`]: super::StoreError::RouteChanged
    /// [`HotPage::Missing`]: super::HotPage::Missing
    async fn drop_empty_buckets(
        &self,
        claim: &CompactionClaim,
        buckets: &[CompactionSource],
    ) -> StoreResult<u64>;

    /// Every retired object with the time it was (last) retired, ordered by key.
    async fn retired_objects(&self) -> StoreResult<Vec<RetiredObject>>;

    /// Deletes the retired rows of these keys (after GC deleted the objects); returns how
    /// many rows were deleted. Unknown keys are ignored.
    async fn forget_retired(&self, keys: &[String]) -> StoreResult<u64>;

    /// Segment routes whose bucket count is not known (`-1`: recorded by the backfill of
    /// segments switched before segment routes existed, or by an erasure's re-apply), at
    /// most `limit` of them, ordered by (table, key) and starting after `after` (exclusive),
    /// so a caller pages through them all. A listing across partitions reads such a
    /// segment's buckets one by one until its count is recorded
    /// ([`record_segment_count`](Self::record_segment_count)).
    async fn segments_not_counted(
        &self,
        after: Option<&(TableId, String)>,
        limit: usize,
    ) -> StoreResult<Vec<(TableId, String)>>;

    /// Records that the manifest of segment `object_key` of `table` holds `buckets` buckets,
    /// where its count is still not known; a count recorded meanwhile (by a switch to the
    /// segment, from the same immutable manifest) is left as it is. Returns whether this
    /// call recorded it. The caller takes the count from the manifest itself, never from the
    /// routes: a listing names the segment whole only while as many buckets are routed to
    /// it as its manifest holds.
    async fn record_segment_count(
        &self,
        table: &TableId,
        object_key: &str,
        buckets: u64,
    ) -> StoreResult<bool>;
}

/// Row changes and retention (see [`super::changes`]).
///
/// A change set is one serializable transaction. Every bucket it touches is read first:
/// a Hot bucket's metadata row is written too (so a claim that fences it conflicts with
/// the change, whichever commits first) and its rows are deleted or updated in place; an
/// Archived bucket gets a delete or edit record per row; an Archiving bucket refuses the
/// whole set with [`StoreError::BeingArchived`](super::StoreError::BeingArchived). Each
/// change applies only while its row still holds [`RowChange::old_value`] (with its
/// masks applied); if any row does not, nothing is written and the answer is
/// [`StoreError::ChangeConflict`](super::StoreError::ChangeConflict), so the caller can
/// read again.
#[async_trait]
pub trait Changes: Send + Sync + 'static {
    /// Applies `changes` (rows of one table) all or nothing; returns what was changed.
    /// `read_at` is the store's time before the statement read the rows: a bucket
    /// published since then is a conflict (the rows were read from the hot tier, and the
    /// archive may hold other values).
    async fn apply_changes(
        &self,
        table_id: &TableId,
        read_at: EventTime,
        changes: &[RowChange],
    ) -> StoreResult<ChangeOutcome>;

    /// Every delete or edit record of one bucket, in clustering order.
    async fn row_masks(&self, bucket: &BucketId) -> StoreResult<Vec<RowMask>>;

    /// The delete and edit records of several buckets of one partition (`buckets`, keys in
    /// `partition` of `table_id`), each as [`row_masks`](Self::row_masks) gives them: a run
    /// of archived buckets read as one asks once, not once per bucket. The backends answer
    /// in one statement; this default asks bucket by bucket (for wrappers).
    async fn row_masks_of(
        &self,
        table_id: &TableId,
        partition: &PartitionKey,
        buckets: &[BucketKey],
    ) -> StoreResult<Vec<RowMask>> {
        let mut out = Vec::new();
        for bucket_key in buckets {
            let bucket = BucketId {
                table_id: table_id.clone(),
                partition_key: partition.clone(),
                bucket_key: *bucket_key,
            };
            out.extend(self.row_masks(&bucket).await?);
        }
        Ok(out)
    }

    /// The buckets of `table_id` whose keys lie in `first..=last` (compared as text, which
    /// orders the keys of one strategy by time), in `partitions` (`None`: any partition),
    /// that hold at least one delete record, purged or not and of any incarnation: at most
    /// `limit`, in no order. A scan asks before it states an exact row count from manifests
    /// (an edit keeps its row, a delete does not); a bucket missing from the answer has no
    /// delete record when the statement ran. Named partitions are read by the primary key's
    /// prefix; without them the statement walks the table's delete records in the key
    /// range. `None`: this store cannot tell (the default, for wrappers), and no count is
    /// stated.
    async fn buckets_with_deletes(
        &self,
        table_id: &TableId,
        partitions: Option<&[PartitionKey]>,
        (first, last): (&BucketKey, &BucketKey),
        limit: usize,
    ) -> StoreResult<Option<Vec<(PartitionKey, BucketKey)>>> {
        let _ = (table_id, partitions, first, last, limit);
        Ok(None)
    }

    /// Buckets of `table_id` that ended at or before `before` and are Hot or Archived
    /// (an Archiving bucket waits for its publication), oldest first, at most `limit`.
    async fn expired_buckets(
        &self,
        table_id: &TableId,
        before: EventTime,
        limit: usize,
    ) -> StoreResult<Vec<BucketId>>;

    /// Removes one bucket that ended at or before `before` from the hot store, in one
    /// transaction: its metadata (the route), its hot rows and its masks. A per-bucket
    /// object is recorded as retired for garbage collection; a segment is not (other
    /// buckets still route to it). `Ok(None)` when the bucket is absent, Archiving, or
    /// ends after `before`.
    async fn expire_bucket(
        &self,
        bucket: &BucketId,
        before: EventTime,
    ) -> StoreResult<Option<ExpiredBucket>>;
}

/// Every role together: what a session, the archiver and the conformance suite hold.
pub trait HotStore:
    Catalog + Appends + RoutedReads + Lifecycle + Control + Compaction + Changes
{
}

impl<T: Catalog + Appends + RoutedReads + Lifecycle + Control + Compaction + Changes + ?Sized>
    HotStore for T
{
}
