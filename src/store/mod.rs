//! The hot tier: the durable authority for mutable records and for routing state.
//!
//! [`HotStore`] is the contract; [`postgres::PgStore`] implements it on CockroachDB or
//! PostgreSQL and [`embedded::SqliteStore`] on an embedded SQLite file. Both run one
//! conformance suite (`tests/conformance/`). The fencing rules live in the store itself: an
//! append commits only into a Hot bucket, and every archiver step that writes checks owner
//! token, fencing generation and lease expiry in the same statement, against the store's own
//! clock, so a paused or stale worker is rejected whatever its own clock says.

use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use crate::model::{
    records_to_batch, BucketId, BucketKey, BucketStrategy, ClusteringKey, EventTime, ModelError,
    PartitionKey, Record, ScanBounds, TableId,
};

pub mod embedded;
pub mod migrate;
mod pg_timeouts;
pub mod postgres;
mod retry;

pub use retry::RetryPolicy;

/// The record schema version that the hot store and the archive write today.
pub const RECORD_SCHEMA_VERSION: i32 = 2;

/// A table's registration: persisted in `pulpitum_v4_tables`, immutable in its strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDefinition {
    /// The table id.
    pub table_id: TableId,
    /// How event times map to buckets; fixed for the table's lifetime.
    pub strategy: BucketStrategy,
    /// Ingestion guard: appends are accepted only into the newest N buckets (counted in this
    /// strategy's buckets, ending with the bucket of the store's "now"; see
    /// [`writable_range`]), so both old and future buckets are refused; `None` accepts any
    /// bucket.
    pub writable_buckets: Option<u32>,
    /// Record schema version of the table's records.
    pub record_schema_version: i32,
    /// The SQL surface the table is exposed as (`chat` or `raw`); opaque to the store.
    pub surface: String,
}

impl TableDefinition {
    /// A definition with the default guard (none) and the current record schema.
    pub fn new(table_id: TableId, strategy: BucketStrategy, surface: impl Into<String>) -> Self {
        Self {
            table_id,
            strategy,
            writable_buckets: None,
            record_schema_version: RECORD_SCHEMA_VERSION,
            surface: surface.into(),
        }
    }
}

/// The lifecycle state of a bucket, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketState {
    /// Accepts appends; read from the hot store.
    Hot,
    /// Write-fenced by a claim; still read from the hot store.
    Archiving,
    /// Published: reads use the manifest at `object_key`.
    Archived {
        /// Key of the published manifest.
        object_key: String,
        /// Whether cleanup has removed the hot rows.
        hot_deleted: bool,
    },
}

impl BucketState {
    /// Short name used in messages and EXPLAIN (`hot`, `archiving`, `archived`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hot => "hot",
            Self::Archiving => "archiving",
            Self::Archived { .. } => "archived",
        }
    }
}

/// Everything the store knows about one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketMeta {
    /// Identity.
    pub id: BucketId,
    /// Current state.
    pub state: BucketState,
    /// Current fencing generation (0 before the first claim).
    pub generation: i64,
    /// Current owner token, if a claim or cleanup claim holds it.
    pub owner_token: Option<String>,
    /// Lease expiry of the current owner.
    pub lease_expires_at: Option<EventTime>,
    /// Earliest time a deferred bucket may be claimed again.
    pub retry_at: Option<EventTime>,
    /// When the route was published.
    pub published_at: Option<EventTime>,
}

/// Proof of ownership returned by a successful claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claimed bucket.
    pub bucket: BucketId,
    /// Opaque owner token, unique per claim.
    pub token: String,
    /// Fencing generation of this claim.
    pub generation: i64,
    /// Lease expiry by the store's clock.
    pub expires_at: EventTime,
}

/// The route observed together with one page of hot rows, from one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HotPage {
    /// The bucket has no metadata: it holds no records.
    Missing,
    /// The bucket is Hot or Archiving: `rows` are its hot rows for the request, in order.
    Hot {
        /// `hot` or `archiving` at the moment of the read.
        state: BucketState,
        /// Up to `limit` rows matching the bounds, in the requested order.
        rows: Vec<Record>,
    },
    /// The bucket is published: read the archive at `object_key`. No hot rows are returned.
    Archived {
        /// Key of the published manifest.
        object_key: String,
    },
}

/// Buckets a scan reads with head statements ([`HotStore::read_head`]: the next bucket's
/// route and first rows together) before it lists the rest [`LIST_PAGE`] at a time. A
/// "latest N" page mostly ends in its first bucket or spills into the next (a quiet day),
/// and a head statement finds that next bucket and reads its rows in one round trip where a
/// listing and a read take two; past that, a scan is reading history, where one listing
/// per [`LIST_PAGE`] buckets is cheaper than one route lookup per bucket.
pub const HEAD_READS: usize = 2;

/// Buckets a scan lists per round trip once it reads past its head reads: enough that
/// a scan over years of daily buckets lists in a few statements, few enough that a listing
/// the scan never reaches costs little.
pub const LIST_PAGE: usize = 64;

/// A bucket as a scan needs to know it: its identity and its route (the lease, owner and
/// times of [`BucketMeta`] are the archiver's business). The head statement returns only
/// this much of the bucket beside its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedBucket {
    /// Identity.
    pub id: BucketId,
    /// State at the moment of the listing (for Archived, the route).
    pub state: BucketState,
}

impl From<BucketMeta> for RoutedBucket {
    fn from(m: BucketMeta) -> Self {
        Self {
            id: m.id,
            state: m.state,
        }
    }
}

/// The first bucket of a partition in scan order and its first page (see
/// [`HotStore::read_head`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadPage {
    /// The first bucket in scan order among those overlapping the interval, with its route
    /// at the moment of the read; `None` when no bucket overlaps.
    pub bucket: Option<RoutedBucket>,
    /// Route and first page of that bucket ([`FirstPage::Missing`] when `bucket` is `None`).
    /// This, not `bucket.state`, decides the tier a scan reads: a store that reads the two
    /// apart (the default [`HotStore::read_head`]) may see the bucket published in between.
    pub first: FirstPage,
}

/// The first bucket of a [`HeadPage`]: its route and, when it is not archived, its first
/// page of rows as an envelope batch (see [`crate::model::envelope`]), the form the scan
/// consumes, so a store can decode rows straight into it.
#[derive(Debug, Clone, PartialEq)]
pub enum FirstPage {
    /// No bucket overlaps the interval.
    Missing,
    /// The bucket is Hot or Archiving: up to `limit` matching rows in the requested order,
    /// with `value` only when the request included it.
    Hot {
        /// `hot` or `archiving` at the moment of the read.
        state: BucketState,
        /// The rows.
        rows: RecordBatch,
    },
    /// The bucket is published: read the archive at `object_key`.
    Archived {
        /// Key of the published manifest.
        object_key: String,
    },
}

impl FirstPage {
    /// The same page with its rows as an envelope batch.
    pub fn from_page(page: HotPage, include_value: bool) -> Self {
        match page {
            HotPage::Missing => Self::Missing,
            HotPage::Archived { object_key } => Self::Archived { object_key },
            HotPage::Hot { state, rows } => Self::Hot {
                state,
                rows: records_to_batch(&rows, include_value),
            },
        }
    }
}

/// One page request against one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// Predicates applied exactly by the store (cursors included).
    pub bounds: ScanBounds,
    /// Newest first when true.
    pub descending: bool,
    /// Maximum rows returned (at least 1).
    pub limit: usize,
    /// When false, `value` is returned empty and its bytes are not fetched.
    pub include_value: bool,
}

/// A selection of buckets of one table for [`HotStore::list_buckets`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketFilter {
    /// Only these partitions (`None`: all).
    pub partitions: Option<Vec<PartitionKey>>,
    /// Only buckets with `bucket_end > from`, i.e. overlapping `[from, to]`.
    pub from: Option<EventTime>,
    /// Only buckets with `bucket_start <= to`.
    pub to: Option<EventTime>,
    /// Within each partition, newest bucket first.
    pub descending: bool,
    /// At most this many buckets, the first in the listing's order (`None`: all).
    pub limit: Option<usize>,
}

/// Why the archiver should look at a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkKind {
    /// A Hot bucket that ended at or before the cutoff and whose retry time has passed.
    Eligible,
    /// An Archiving claim whose lease expired before publication.
    ExpiredClaim,
    /// A published bucket whose hot rows are not yet deleted.
    CleanupPending,
}

/// One discovered work item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItem {
    /// The bucket.
    pub bucket: BucketId,
    /// Why it was found.
    pub kind: WorkKind,
}

/// How much archiver work the store holds at one moment (see [`HotStore::backlog`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Hot buckets that ended at or before the cutoff, whether or not a retry time holds
    /// them back: eligible and not yet archived.
    pub eligible: u64,
    /// Buckets claimed for archiving and not yet published, by any process, whatever their
    /// lease.
    pub archiving: u64,
}

/// Result of a single append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOutcome {
    /// A new record was committed.
    Inserted,
    /// An identical record was already present (an idempotent retry).
    AlreadyPresent,
}

/// Result of a batch append.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Records newly committed.
    pub inserted: u64,
    /// Identical records already present.
    pub already_present: u64,
}

/// Every way a hot-store operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Input that violates the model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The table id is not registered.
    #[error("table {0} is not registered")]
    UnknownTable(TableId),
    /// Registering an existing table id with a different definition.
    #[error("table {table_id} is already registered as {existing}; requested {requested} (the bucket strategy and surface of a table are immutable)")]
    TableConflict {
        /// The table.
        table_id: TableId,
        /// The stored definition, summarised.
        existing: String,
        /// The requested definition, summarised.
        requested: String,
    },
    /// The append targets a bucket that is not Hot: it is being archived or is archived.
    #[error("bucket {bucket} is {state}: writes are fenced")]
    Fenced {
        /// The bucket.
        bucket: BucketId,
        /// Its state name.
        state: &'static str,
    },
    /// The append falls outside the table's writable-bucket guard: older than the newest N
    /// buckets, or later than the bucket of the store's clock (plus
    /// [`WRITABLE_CLOCK_ALLOWANCE`]).
    #[error(
        "bucket {bucket} is outside the table's writable buckets: writable_buckets = {writable_buckets} \
         accepts {oldest} to {newest} by the store's clock"
    )]
    NotWritable {
        /// The bucket.
        bucket: BucketId,
        /// The configured guard.
        writable_buckets: u32,
        /// The oldest bucket the guard accepted at the time of the append.
        oldest: BucketKey,
        /// The newest bucket the guard accepted at the time of the append.
        newest: BucketKey,
    },
    /// A different value already exists under the same physical key.
    #[error("a different record already exists in {bucket} at event_time {event_time}, sort_key {sort_key}")]
    DuplicateKey {
        /// The bucket.
        bucket: BucketId,
        /// Event time of the key.
        event_time: EventTime,
        /// Sort key, displayed as hex.
        sort_key: String,
    },
    /// The caller's claim is not current: another token or generation, an expired lease, or
    /// the bucket is in another state. Nothing was written.
    #[error("claim on {bucket} (generation {generation}) is stale: {reason}")]
    StaleClaim {
        /// The bucket.
        bucket: BucketId,
        /// The generation the caller held.
        generation: i64,
        /// What the store found instead.
        reason: String,
    },
    /// A transition that the bucket's current state does not allow (for example cleanup
    /// before publication, or publishing twice).
    #[error("bucket {bucket}: cannot {operation} in state {state}")]
    InvalidTransition {
        /// The bucket.
        bucket: BucketId,
        /// The refused operation.
        operation: &'static str,
        /// The state found.
        state: String,
    },
    /// The commit's outcome is unknown (40003, or the connection dropped during COMMIT). The
    /// caller must re-read durable state to learn whether it took effect.
    #[error("outcome of {operation} is unknown: {detail}")]
    OutcomeUnknown {
        /// The operation.
        operation: &'static str,
        /// The underlying error.
        detail: String,
    },
    /// Serialization conflicts persisted past the retry budget.
    #[error("{operation} kept conflicting after {attempts} attempts: {detail}")]
    RetriesExhausted {
        /// The operation.
        operation: &'static str,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        detail: String,
    },
    /// A stored row that does not decode (a corrupted or foreign value).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// Migration bookkeeping disagrees with this build (edited or unknown migrations).
    #[error("migration error: {0}")]
    Migration(String),
    /// Bad connection settings.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A database session the store must not run on: a setting that the fence or the
    /// store's isolation from other schemas relies on has another value (see
    /// `postgres::session`). Not retryable: the deployment must change.
    #[error("unsafe database session: {setting} is {value:?}, the store needs {required:?} (were the connection's startup options dropped, by a pooler for one? set it for the role or database instead)")]
    UnsafeSession {
        /// The session setting.
        setting: &'static str,
        /// The value the session has.
        value: String,
        /// The value the store needs.
        required: String,
    },
    /// Any other database or I/O failure (retryable by the caller).
    #[error("database error during {operation}: {detail}")]
    Backend {
        /// The operation.
        operation: &'static str,
        /// The underlying error.
        detail: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::OutcomeUnknown { .. } | Self::RetriesExhausted { .. } | Self::Backend { .. }
        )
    }
}

/// Result alias for store operations.
pub type StoreResult<T> = Result<T, StoreError>;

/// The hot-tier contract. Every method is one serializable transaction or one statement.
#[async_trait]
pub trait HotStore: Send + Sync + 'static {
    /// Applies pending migrations; safe when several processes call it at once.
    async fn migrate(&self) -> StoreResult<()>;

    /// Registers a table. The identical definition twice is a no-op; a different strategy or
    /// surface for an existing id is [`StoreError::TableConflict`]. Returns the stored row.
    async fn register_table(&self, def: &TableDefinition) -> StoreResult<TableDefinition>;

    /// One table's definition.
    async fn table(&self, table_id: &TableId) -> StoreResult<Option<TableDefinition>>;

    /// Every registered table, ordered by id.
    async fn tables(&self) -> StoreResult<Vec<TableDefinition>>;

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

    /// Buckets of a table matching the filter, ordered by partition key, then bucket start
    /// (descending when [`BucketFilter::descending`]), cut at [`BucketFilter::limit`].
    async fn list_buckets(
        &self,
        table_id: &TableId,
        filter: &BucketFilter,
    ) -> StoreResult<Vec<BucketMeta>>;

    /// One bucket's metadata.
    async fn bucket(&self, bucket: &BucketId) -> StoreResult<Option<BucketMeta>>;

    /// The route and one page of hot rows, from one statement.
    async fn read_page(&self, bucket: &BucketId, req: &PageRequest) -> StoreResult<HotPage>;

    /// The first of one partition's buckets overlapping `[from, to]` in scan order (the
    /// newest when `page.descending`, else the oldest), with its route and first page.
    /// `first` is [`FirstPage::Missing`] when no bucket overlaps.
    ///
    /// This is how a scan that starts at execution time finds its first bucket and reads its
    /// first rows in one round trip; the buckets after it are found by further calls on the
    /// interval beyond it, then by [`list_buckets`](Self::list_buckets) (see
    /// [`HEAD_READS`]). The default runs a listing of one and a page read one after
    /// another; a store that can answer both in one statement should.
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
            None => FirstPage::Missing,
            Some(m) => FirstPage::from_page(self.read_page(&m.id, page).await?, page.include_value),
        };
        Ok(HeadPage {
            bucket: bucket.map(RoutedBucket::from),
            first,
        })
    }

    /// Claims a bucket for archiving: a Hot bucket whose retry time has passed, or an
    /// Archiving bucket whose lease expired, becomes Archiving with a fresh token,
    /// `generation + 1` and `expires_at = now + lease`. `Ok(None)` when not claimable.
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

    /// Work for the archiver: eligible Hot buckets (`bucket_end <= cutoff`, retry passed),
    /// expired pre-publication claims, and published buckets with cleanup pending whose
    /// owner lease (if any) expired, up to `limit`, oldest buckets first.
    async fn discover(&self, cutoff: EventTime, limit: usize) -> StoreResult<Vec<WorkItem>>;

    /// [`discover`](Self::discover), except that a published bucket's cleanup is work only
    /// once `cleanup_delay` has passed since its publication, so cleanups not yet due never
    /// fill the batch ahead of eligible buckets. The default filters `discover`'s answer
    /// (and so can still return fewer than `limit` items); a store should push the condition
    /// into its statement.
    async fn discover_ready(
        &self,
        cutoff: EventTime,
        limit: usize,
        cleanup_delay: Duration,
    ) -> StoreResult<Vec<WorkItem>> {
        let now = self.now().await?.as_micros();
        let delay = i64::try_from(cleanup_delay.as_micros()).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        for item in self.discover(cutoff, limit).await? {
            if item.kind == WorkKind::CleanupPending {
                let published = self
                    .bucket(&item.bucket)
                    .await?
                    .and_then(|m| m.published_at);
                if published.is_none_or(|p| p.as_micros().saturating_add(delay) > now) {
                    continue;
                }
            }
            out.push(item);
        }
        Ok(out)
    }
    /// Counts the eligible backlog and the buckets being archived, in one statement that
    /// reads only the `(state, bucket_end)` index range of Hot and Archiving buckets, so the
    /// archiver can afford it every cycle.
    async fn backlog(&self, cutoff: EventTime) -> StoreResult<Backlog>;

    /// Every object key referenced by a published route (for orphan GC).
    async fn referenced_object_keys(&self) -> StoreResult<Vec<String>>;

    /// The store's current time (its clock decides leases).
    async fn now(&self) -> StoreResult<EventTime>;
}

/// How far ahead of the store's clock an append may be and still count as "now" for the
/// writable-bucket guard: writers' clocks run a little ahead of the database's, and a
/// message stamped a second after midnight by such a writer belongs to the new day's
/// bucket, not to a refused one.
pub const WRITABLE_CLOCK_ALLOWANCE: Duration = Duration::from_secs(300);

/// The buckets a table's guard accepts at `now`, oldest and newest, or `None` when the
/// table has no guard: the newest `writable_buckets` buckets ending with the bucket of
/// `now`, plus the bucket of `now +` [`WRITABLE_CLOCK_ALLOWANCE`] when that is the next one.
pub fn writable_range(def: &TableDefinition, now: EventTime) -> Option<(BucketKey, BucketKey)> {
    let n = def.writable_buckets?;
    let current = def.strategy.bucket_of(now);
    let mut oldest = current;
    for _ in 1..n.max(1) {
        match oldest.prev() {
            Some(p) => oldest = p,
            None => break,
        }
    }
    let allowance = i64::try_from(WRITABLE_CLOCK_ALLOWANCE.as_micros()).unwrap_or(i64::MAX);
    let newest = EventTime::from_micros(now.as_micros().saturating_add(allowance))
        .map(|t| def.strategy.bucket_of(t))
        .unwrap_or(current);
    Some((oldest, newest))
}

/// Helper shared by both stores: the bucket a record lands in, with the guard applied
/// (see [`writable_range`]). A bucket in the future is refused like an old one: a writer
/// whose clock or data is years off would otherwise create buckets the archiver cannot
/// reach for years, out of sight of every "latest" read.
pub fn bucket_for_append(
    def: &TableDefinition,
    record: &Record,
    now: EventTime,
) -> StoreResult<BucketId> {
    let id = BucketId::of_record(&def.table_id, def.strategy, record);
    if let (Some(n), Some((oldest, newest))) = (def.writable_buckets, writable_range(def, now)) {
        let start = id.bucket_key.start();
        if start < oldest.start() || start > newest.start() {
            return Err(StoreError::NotWritable {
                bucket: id,
                writable_buckets: n,
                oldest,
                newest,
            });
        }
    }
    Ok(id)
}

/// Opens the hot store a locator names (see [`crate::locator`]): a `postgres://` /
/// `postgresql://` URL or key=value string (CockroachDB or PostgreSQL), `sqlite://PATH`,
/// `sqlite:PATH` or a clear file path (the embedded store; created if absent) or
/// `sqlite::memory:`. Anything else is [`StoreError::Config`], with secrets redacted.
pub async fn open(database_url: &str) -> StoreResult<std::sync::Arc<dyn HotStore>> {
    use crate::locator::{parse_database_url, DatabaseLocator};
    let locator =
        parse_database_url(database_url).map_err(|e| StoreError::Config(e.to_string()))?;
    Ok(match locator {
        DatabaseLocator::Postgres(url) => {
            std::sync::Arc::new(postgres::PgStore::connect(&url).await?)
        }
        DatabaseLocator::SqliteMemory => {
            std::sync::Arc::new(embedded::SqliteStore::open_in_memory()?)
        }
        DatabaseLocator::SqliteFile(path) => {
            std::sync::Arc::new(embedded::SqliteStore::open(path)?)
        }
    })
}
