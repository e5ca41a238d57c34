//! The values the store's roles exchange: table definitions, bucket routes and states,
//! claims, page requests and the archiver's work items. Plain data, shared by both backends.

use datafusion::arrow::record_batch::RecordBatch;

use crate::model::{
    records_to_batch, BucketId, BucketStrategy, EventTime, PartitionKey, Record, ScanBounds,
    TableId, RECORD_SCHEMA_VERSION,
};

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
            record_schema_version: RECORD_SCHEMA_VERSION as i32,
            surface: surface.into(),
        }
    }
}

/// One version of a declared table's schema as the registry keeps it: the version and the
/// definition's JSON (read by `crate::model::schema::TableSchema::from_json`; opaque here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchema {
    /// The table schema version, from 1.
    pub version: u32,
    /// The definition, JSON.
    pub definition: String,
}

/// A process that reads the store, and the newest versions it reads
/// (`pulpitum_v4_readers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderInfo {
    /// Unique per process run.
    pub reader_id: String,
    /// What it is: `shell`, `serve`, `archiver`, or an application's own name.
    pub role: String,
    /// Its build (the crate version).
    pub build: String,
    /// The newest record schema version it reads.
    pub record_schema: u32,
    /// The newest table schema format it reads.
    pub schema_format: u32,
    /// When it last said it was running (the store's clock); ignored when announcing.
    pub seen_at: EventTime,
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
#[derive(Debug, Clone, PartialEq)]
pub enum HotPage {
    /// The bucket has no metadata: it holds no records.
    Missing,
    /// The bucket is Hot or Archiving: up to `limit` rows matching the bounds, in the
    /// requested order, as an envelope batch (see [`crate::model::envelope`]) with `value`
    /// only when the request included it. Every hot read, a page or a head, answers in this
    /// one shape, so the reader above converts and counts rows in one place.
    Hot {
        /// `hot` or `archiving` at the moment of the read.
        state: BucketState,
        /// The rows.
        rows: RecordBatch,
    },
    /// The bucket is published: read the archive at `object_key`. No hot rows are returned.
    Archived {
        /// Key of the published manifest.
        object_key: String,
    },
}

impl HotPage {
    /// A hot page built from owned records (stores that decode rows one by one).
    pub fn hot(state: BucketState, rows: &[Record], include_value: bool) -> Self {
        Self::Hot {
            state,
            rows: records_to_batch(rows, include_value),
        }
    }
}

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
/// [`RoutedReads::read_head`](super::RoutedReads::read_head)).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadPage {
    /// The first bucket in scan order among those overlapping the interval, with its route
    /// at the moment of the read; `None` when no bucket overlaps.
    pub bucket: Option<RoutedBucket>,
    /// Route and first page of that bucket ([`HotPage::Missing`] when `bucket` is `None`).
    /// This, not `bucket.state`, decides the tier a scan reads: a store that reads the two
    /// apart (the default [`RoutedReads::read_head`](super::RoutedReads::read_head)) may see the bucket published in between.
    pub first: HotPage,
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

/// Every partition's buckets of one table over an interval, as
/// [`RoutedReads::list_across`](super::RoutedReads::list_across) answers: the segments that
/// hold theirs whole, and the other buckets one by one. Read in one snapshot, so a bucket
/// is named exactly once, by its segment or by its own row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcrossListing {
    /// Segments overlapping the interval whose every bucket is still routed to them: each
    /// segment manifest's key and how many buckets it holds (its manifest must say the
    /// same). Their buckets are read from the manifests.
    pub segments: Vec<(String, u64)>,
    /// Every other bucket overlapping the interval (`bucket_end > from` and
    /// `bucket_start <= to`), in no particular order.
    pub buckets: Vec<BucketMeta>,
}

/// A selection of buckets of one table for [`RoutedReads::list_buckets`](super::RoutedReads::list_buckets).
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

/// A directory of the archive where objects no route names may be left (a bucket claim's
/// generation directory, a window's segments directory), as noted in the store: orphan GC
/// lists these rather than the whole archive (see [`Lifecycle::note_gc_prefix`](super::Lifecycle::note_gc_prefix)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcPrefix {
    /// The directory's key prefix, ending with `/`.
    pub prefix: String,
    /// When it was last noted (the store's clock).
    pub recorded_at: EventTime,
}

/// One discovered work item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItem {
    /// The bucket.
    pub bucket: BucketId,
    /// Why it was found.
    pub kind: WorkKind,
}

/// How much archiver work the store holds at one moment (see [`Lifecycle::backlog`](super::Lifecycle::backlog)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Hot buckets eligible by time (the cutoff and their table's policy), whether or not a
    /// retry time or a pause holds them back: eligible and not yet archived.
    pub eligible: u64,
    /// Buckets claimed for archiving and not yet published, by any process, whatever their
    /// lease.
    pub archiving: u64,
    /// The eligible backlog per table with any, ordered by table id.
    pub tables: Vec<super::TableLag>,
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
