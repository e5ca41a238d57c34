//! `DurableTable`: one logical table over both tiers, below the SQL layer.
//!
//! It owns the two operations the SQL provider needs and nothing of DataFusion's planner:
//! fenced appends (delegated to the hot store, whose single statement checks the bucket is
//! Hot) and reads. Reading is all here: which buckets a scan reads and how they are split
//! into scan partitions, where each bucket is read from, each tier's reader, and the row
//! limit. The provider above only turns SQL filters into a scan request and envelope rows
//! into SQL columns.
//!
//! # Layout
//!
//! - [`plan`]: bucket listing, pruning and grouping into scan partitions, for both planning
//!   modes: listed while the scan is planned ([`DurableTable::plan_buckets`],
//!   [`plan_groups`]), or per partition key when it runs ([`DurableTable::scan_key`]: head
//!   reads, then listings a page at a time); and the read-policy constants [`HEAD_READS`]
//!   and [`LIST_PAGE`].
//! - [`routes`]: the one route type of every tier ([`Route`]) and the archived-route cache.
//! - `hot`: the hot tier's reader (pages that carry their route, head reads).
//! - `archived`: the archived tier's reader (manifest, then payload).
//! - `counts`: exact row counts of a planned scan from manifests
//!   ([`DurableTable::exact_rows`]), for the optimiser's statistics.
//!
//! A third tier is one reader file, a [`Route`] variant (and a [`Tier`] for its chunks)
//! and one arm in `DurableTable::reader`.
//!
//! # One query's path
//!
//! 1. Planning. The provider turns the SQL filters into partition keys and [`ScanBounds`]
//!    and asks [`DurableTable::plan_buckets`] for the buckets they can match: listed,
//!    pruned and counted by state now, or, in the execution-time mode, only the keys.
//!    [`plan_groups`] splits them into DataFusion's scan partitions.
//! 2. Execution. Each scan partition reads its [`ScanUnit`]s ([`scan_units`]) one after
//!    another with [`DurableTable::scan_unit`], under one [`RowLimit`]. A key unit finds its
//!    buckets as it reaches them (head reads, then listings: [`plan`]); a bucket unit
//!    carries the route its listing saw.
//! 3. A bucket read starts from its [`Route`]: a listing's Archived route is final;
//!    otherwise the cache's, else the hot store's. Each hot page comes with the route from
//!    the same statement, so one page never mixes tiers; when it says Archived, the hot
//!    reader hands the read over and it continues in the archive at the same cursor. After
//!    publication every read goes to the archive, and an object-store error is returned as
//!    it is, never answered from the hot rows that may still exist until cleanup.
//! 4. The chunks, envelope batches tagged with their tier, are counted against the limit
//!    and handed up; the provider turns them into SQL columns.
//!
//! # Row limits
//!
//! A read's readers size their requests by what its [`RowLimit`] still wants, but only
//! `RowLimit::count`, applied once above them all (by [`DurableTable::scan_bucket`],
//! [`DurableTable::scan_key`] and [`DurableTable::scan_unit`]), slices chunks to the limit
//! and counts them down: every tier's rows, every bucket and every unit of a scan partition
//! are counted in that one place, and nothing is read once the limit is spent.

mod archived;
mod counts;
mod hot;
mod masks;
pub mod plan;
pub mod routes;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream, StreamExt};

use crate::archive::{ArchiveError, ArchiveScanMetrics, ArchiveStore};
use crate::model::{BucketId, Record, ScanBounds};
use crate::store::{AppendOutcome, BatchOutcome, BucketFilter, BucketMeta};
use routes::{RouteCache, Step};

pub use plan::{
    plan_groups, scan_units, BucketCounts, BucketPlan, KeyBuckets, ScanUnit, HEAD_READS, LIST_PAGE,
};
pub use routes::{Route, RouteCacheConfig, ROUTE_CACHE_CAPACITY, ROUTE_CACHE_TTL};
// The store's types in this layer's own signatures, so the layer above names them here and
// never imports the store.
pub use crate::store::{ChangeOutcome, HotStore, RowChange, StoreError, TableDefinition};

/// Default rows per hot page and per archive batch.
pub const DEFAULT_PAGE_ROWS: usize = 1_000;

/// Every way a table operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The hot store failed or refused (fenced bucket, duplicate key, ...).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The archive failed while reading a published bucket. Never replaced by hot rows.
    #[error("archived bucket {bucket}: {source}")]
    Archive {
        /// The bucket being read.
        bucket: BucketId,
        /// The cold-tier error.
        #[source]
        source: Box<ArchiveError>,
    },
    /// The archive failed while reading a run of one partition's buckets read as one
    /// ([`ScanUnit::Run`]): the run is named by its first and last bucket, and the error
    /// names the bucket or row group at fault where it knows it.
    #[error("archived buckets {first} to {last}: {source}")]
    ArchiveRun {
        /// The run's first bucket.
        first: BucketId,
        /// The run's last bucket key.
        last: crate::model::BucketKey,
        /// The cold-tier error.
        #[source]
        source: Box<ArchiveError>,
    },
}

impl TableError {
    /// Whether retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store(e) => e.is_retryable(),
            Self::Archive { source, .. } | Self::ArchiveRun { source, .. } => source.is_retryable(),
        }
    }
}

/// Which tier produced a chunk of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Rows from the hot store (bucket Hot or Archiving at the time of the page).
    Hot,
    /// Rows from a published archive.
    Archived,
}

/// A chunk of one bucket's rows in the archive's envelope schema.
#[derive(Debug, Clone)]
pub struct BucketChunk {
    /// Where the rows came from.
    pub tier: Tier,
    /// Hot-store statements (pages) this chunk cost; 0 for archive batches.
    pub pages: u64,
    /// Buckets whose first rows this chunk holds (for per-bucket counts): 0 or 1 for a
    /// bucket read, any number for a run of archived buckets read as one.
    pub buckets: u32,
    /// Envelope rows (`partition_key`, `event_time`, `sort_key`, `value` if requested).
    pub batch: RecordBatch,
}

/// One bucket read request.
#[derive(Debug, Clone)]
pub struct BucketScan {
    /// Predicates every tier applies exactly.
    pub bounds: ScanBounds,
    /// Newest first.
    pub descending: bool,
    /// Whether value bytes are fetched.
    pub include_value: bool,
    /// Whether `event_time` and `sort_key` are needed in the returned batches. Archive reads
    /// with unbounded bounds skip decoding them when not (hot pages always carry them).
    pub include_keys: bool,
    /// Rows per page / batch.
    pub page_rows: usize,
    /// Stop after this many rows of this bucket (a pushed-down LIMIT), if any.
    pub limit: Option<usize>,
    /// Where archived reads count their object-store requests, bytes and pruning (the
    /// scan's `EXPLAIN ANALYZE` figures); `None` counts nowhere.
    pub archive_metrics: Option<Arc<ArchiveScanMetrics>>,
    /// The value fields read and the predicates archived reads may apply early (see
    /// [`crate::archive::ArchiveScan::value`]); hot reads return whole values.
    pub value: crate::model::schema::predicate::ValueRead,
}

impl BucketScan {
    /// This request for a read that starts now: its `limit` is what `limit` still wants.
    fn starting(&self, limit: &RowLimit) -> Self {
        Self {
            limit: limit.limit(),
            ..self.clone()
        }
    }
}

/// The rows a read still wants, shared by everything one scan partition (or one direct
/// read) reads, one after another.
///
/// Readers size their requests by [`left`](Self::left); `count`, applied once above them,
/// is the one place where chunks are sliced to the limit and the limit is counted down.
#[derive(Debug, Clone)]
pub struct RowLimit(Arc<AtomicUsize>);

impl RowLimit {
    const UNLIMITED: usize = usize::MAX;

    /// A limit of `limit` rows; `None` is no limit.
    pub fn new(limit: Option<usize>) -> Self {
        Self(Arc::new(AtomicUsize::new(limit.unwrap_or(Self::UNLIMITED))))
    }

    /// Rows still wanted (`usize::MAX` without a limit).
    pub fn left(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Rows still wanted; `None` without a limit.
    pub fn limit(&self) -> Option<usize> {
        let left = self.left();
        (left != Self::UNLIMITED).then_some(left)
    }

    /// Whether the limit has been reached.
    pub fn is_spent(&self) -> bool {
        self.left() == 0
    }

    /// `chunks`, each sliced to the rows still wanted and counted, ending (without polling
    /// `chunks` again) once the limit is spent.
    fn count(
        &self,
        chunks: BoxStream<'static, Result<BucketChunk, TableError>>,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        stream::unfold((chunks, self.clone()), |(mut chunks, limit)| async move {
            if limit.is_spent() {
                return None;
            }
            let item = chunks.next().await?.map(|chunk| BucketChunk {
                batch: limit.take(chunk.batch),
                ..chunk
            });
            Some((item, (chunks, limit)))
        })
        .boxed()
    }

    fn take(&self, batch: RecordBatch) -> RecordBatch {
        let Some(left) = self.limit() else {
            return batch;
        };
        let batch = if batch.num_rows() > left {
            batch.slice(0, left)
        } else {
            batch
        };
        self.0.fetch_sub(batch.num_rows(), Ordering::SeqCst);
        batch
    }
}

/// One logical table over the hot store and the archive.
#[derive(Debug, Clone)]
pub struct DurableTable {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    def: TableDefinition,
    cache: RouteCache,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTable")
            .field("def", &self.def)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl DurableTable {
    /// A table handle with the default route-cache bounds.
    pub fn new(store: Arc<dyn HotStore>, archive: Arc<ArchiveStore>, def: TableDefinition) -> Self {
        Self::with_cache(store, archive, def, RouteCacheConfig::default())
    }

    /// A table handle with explicit route-cache bounds.
    pub fn with_cache(
        store: Arc<dyn HotStore>,
        archive: Arc<ArchiveStore>,
        def: TableDefinition,
        cache: RouteCacheConfig,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                archive,
                def,
                cache: RouteCache::new(cache),
            }),
        }
    }

    /// The table's registration.
    pub fn definition(&self) -> &TableDefinition {
        &self.inner.def
    }

    /// The hot store.
    pub fn store(&self) -> &Arc<dyn HotStore> {
        &self.inner.store
    }

    /// The archive.
    pub fn archive(&self) -> &Arc<ArchiveStore> {
        &self.inner.archive
    }

    /// Archived routes currently cached (for tests and diagnostics).
    pub fn cached_routes(&self) -> usize {
        self.inner.cache.len()
    }

    /// The cached archived route of a bucket, if any and fresh.
    pub fn cached_route(&self, bucket: &BucketId) -> Option<Route> {
        self.inner.cache.route(bucket)
    }

    /// Appends one record; the store refuses it unless its bucket is Hot at commit time.
    pub async fn append(&self, record: &Record) -> Result<AppendOutcome, TableError> {
        Ok(self
            .inner
            .store
            .append(&self.inner.def.table_id, record)
            .await?)
    }

    /// Appends records atomically (all or none).
    pub async fn append_batch(&self, records: &[Record]) -> Result<BatchOutcome, TableError> {
        Ok(self
            .inner
            .store
            .append_batch(&self.inner.def.table_id, records)
            .await?)
    }

    /// Applies a `DELETE` or `UPDATE`'s row changes in one transaction of the hot store (see
    /// [`crate::store::Changes::apply_changes`]); `read_at` is the store's time before the
    /// statement read the rows.
    pub async fn apply_changes(
        &self,
        read_at: crate::model::EventTime,
        changes: &[RowChange],
    ) -> Result<ChangeOutcome, TableError> {
        Ok(self
            .inner
            .store
            .apply_changes(&self.inner.def.table_id, read_at, changes)
            .await?)
    }

    /// The store's clock (a change set's `read_at`).
    pub async fn store_now(&self) -> Result<crate::model::EventTime, TableError> {
        Ok(self.inner.store.now().await?)
    }

    /// Bucket metadata from the hot store, ordered by partition, then time.
    pub async fn list_buckets(&self, filter: &BucketFilter) -> Result<Vec<BucketMeta>, TableError> {
        let metas = self
            .inner
            .store
            .list_buckets(&self.inner.def.table_id, filter)
            .await?;
        Ok(metas)
    }

    /// Streams one bucket's matching rows in clustering order (reverse when descending),
    /// at most `req.limit` of them.
    ///
    /// `known` is the route the caller observed (from a listing), if any. An Archived route
    /// is final, so the hot store is not asked; so is a fresh route in the cache. Otherwise
    /// each hot page comes with its route; on the first page that reports Archived the read
    /// continues from the archive strictly after the last row already returned.
    pub fn scan_bucket(
        &self,
        bucket: BucketId,
        known: Option<Route>,
        req: BucketScan,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let limit = RowLimit::new(req.limit);
        let bounds = req.bounds.clone();
        limit.count(self.read_bucket(bucket, known, bounds, req, limit.clone(), true))
    }

    /// Streams one unit of a scan partition (see [`plan::scan_units`]) under the
    /// partition's shared `limit`: a bucket as [`scan_bucket`](Self::scan_bucket) reads it,
    /// or a partition key as [`scan_key`](Self::scan_key) does. Nothing is read once the
    /// limit is spent.
    pub fn scan_unit(
        &self,
        unit: ScanUnit,
        req: &BucketScan,
        limit: &RowLimit,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        if limit.is_spent() {
            return stream::empty().boxed();
        }
        let req = req.starting(limit);
        let rows = match unit {
            ScanUnit::Key(partition) => self.read_key(partition, req, limit),
            ScanUnit::Bucket(bucket, route) => {
                let bounds = req.bounds.clone();
                self.read_bucket(bucket, Some(route), bounds, req, limit.clone(), true)
            }
            ScanUnit::Run(buckets, object_key, read_at) => {
                self.read_run(buckets, (object_key, read_at), req, limit.clone())
            }
        };
        limit.count(rows)
    }

    /// One bucket's rows matching `bounds`, from the route it resolves to (see
    /// [`scan_bucket`](Self::scan_bucket)). Not counted: the caller counts.
    fn read_bucket(
        &self,
        bucket: BucketId,
        known: Option<Route>,
        bounds: ScanBounds,
        req: BucketScan,
        limit: RowLimit,
        first_of_bucket: bool,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let route = self.inner.cache.resolve(&bucket, known);
        self.read_route(bucket, route, bounds, req, limit, first_of_bucket)
    }

    /// One bucket's rows from `route` on, following the route from tier to tier as the
    /// readers hand it over ([`Step::Moved`]).
    fn read_route(
        &self,
        bucket: BucketId,
        route: Route,
        bounds: ScanBounds,
        req: BucketScan,
        limit: RowLimit,
        first_of_bucket: bool,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let steps = self.reader(&bucket, route, bounds, &req, &limit, first_of_bucket);
        // The read's context travels in the state, so a chunk costs no copies of it.
        let read = (self.clone(), bucket, req, limit);
        stream::unfold(Some((steps, read)), |state| async move {
            let (mut steps, read) = state?;
            loop {
                match steps.next().await? {
                    Ok(Step::Rows(chunk)) => return Some((Ok(chunk), Some((steps, read)))),
                    Ok(Step::Moved {
                        route,
                        bounds,
                        first_of_bucket,
                    }) => {
                        let (table, bucket, req, limit) = &read;
                        steps = table.reader(bucket, route, bounds, req, limit, first_of_bucket);
                    }
                    Err(e) => return Some((Err(e), None)),
                }
            }
        })
        .boxed()
    }

    /// The reader of the tier `route` names.
    fn reader(
        &self,
        bucket: &BucketId,
        route: Route,
        bounds: ScanBounds,
        req: &BucketScan,
        limit: &RowLimit,
        first_of_bucket: bool,
    ) -> BoxStream<'static, Result<Step, TableError>> {
        match route {
            Route::Hot => self.read_hot(bucket.clone(), bounds, req, limit, first_of_bucket),
            Route::Archived {
                object_key,
                read_at,
            } => self.read_archived(
                bucket.clone(),
                (object_key, read_at),
                bounds,
                req,
                first_of_bucket,
            ),
        }
    }
}
