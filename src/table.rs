//! `DurableTable`: one logical table over both tiers, below the SQL layer.
//!
//! It owns the two operations the SQL provider needs and nothing of DataFusion's planner:
//! fenced appends (delegated to the hot store, whose single statement checks the bucket is
//! Hot) and routed bucket reads. A bucket read asks the hot store for one page of rows
//! *together with* the route (one statement), so one page never mixes tiers; when the route
//! says Archived, the read continues from the archive at the same cursor. Routes of archived
//! buckets are immutable (a manifest never changes and an archived bucket never becomes Hot
//! again), so they are kept in a bounded process-local cache; Hot and Archiving observations
//! are never cached, because they can change at any moment. After publication every read
//! goes to the archive, and an object-store error is returned as it is, never answered from
//! the hot rows that may still exist until cleanup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};

use crate::archive::{ArchiveError, ArchiveScan, ArchiveStore, Manifest};
use crate::model::envelope::last_clustering_key;
use crate::model::{BucketId, BucketKey, EventTime, PartitionKey, Record, ScanBounds};
use crate::store::{
    AppendOutcome, BatchOutcome, BucketFilter, BucketMeta, BucketState, HotPage, HotStore,
    PageRequest, StoreError, TableDefinition, HEAD_READS, LIST_PAGE,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// How long an archived route may be served from the cache before it is re-read from the
/// hot store. The archiver must wait at least this long after publication before deleting
/// hot rows (`HotStore::cleanup_step`'s `min_age`): a reader never trusts a cached route
/// older than this bound, so any reader that could still be acting on a pre-publication
/// observation has finished deciding by then.
pub const ROUTE_CACHE_TTL: Duration = Duration::from_secs(60);

/// Default number of archived routes kept per table.
pub const ROUTE_CACHE_CAPACITY: usize = 10_000;

/// Default rows per hot page and per archive batch.
pub const DEFAULT_PAGE_ROWS: usize = 1_000;

/// Bounds of the archived-route cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteCacheConfig {
    /// Most entries kept; the oldest entry is evicted first when full. 0 disables caching.
    pub capacity: usize,
    /// Longest time an entry is served. Must not exceed the archiver's cleanup delay.
    pub ttl: Duration,
}

impl Default for RouteCacheConfig {
    fn default() -> Self {
        Self {
            capacity: ROUTE_CACHE_CAPACITY,
            ttl: ROUTE_CACHE_TTL,
        }
    }
}

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
}

impl TableError {
    /// Whether retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store(e) => e.is_retryable(),
            Self::Archive { source, .. } => source.is_retryable(),
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
    /// Whether this is the first chunk of its bucket (for per-bucket counts).
    pub first_of_bucket: bool,
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
}

#[derive(Debug)]
struct CachedRoute {
    object_key: String,
    manifest: Arc<Manifest>,
    inserted: Instant,
}

/// A bounded cache of archived routes: bucket -> validated manifest.
#[derive(Debug)]
struct RouteCache {
    config: RouteCacheConfig,
    entries: Mutex<HashMap<BucketId, CachedRoute>>,
}

impl RouteCache {
    fn get(&self, bucket: &BucketId) -> Option<(String, Arc<Manifest>)> {
        let mut entries = self.entries.lock().expect("route cache poisoned");
        match entries.get(bucket) {
            Some(e) if e.inserted.elapsed() < self.config.ttl => {
                Some((e.object_key.clone(), e.manifest.clone()))
            }
            Some(_) => {
                entries.remove(bucket);
                None
            }
            None => None,
        }
    }

    fn insert(&self, bucket: BucketId, object_key: String, manifest: Arc<Manifest>) {
        if self.config.capacity == 0 {
            return;
        }
        let mut entries = self.entries.lock().expect("route cache poisoned");
        if entries.len() >= self.config.capacity && !entries.contains_key(&bucket) {
            let ttl = self.config.ttl;
            entries.retain(|_, e| e.inserted.elapsed() < ttl);
            if entries.len() >= self.config.capacity {
                if let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.inserted)
                    .map(|(k, _)| k.clone())
                {
                    entries.remove(&oldest);
                }
            }
        }
        entries.insert(
            bucket,
            CachedRoute {
                object_key,
                manifest,
                inserted: Instant::now(),
            },
        );
    }

    fn len(&self) -> usize {
        self.entries.lock().expect("route cache poisoned").len()
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
                cache: RouteCache {
                    config: cache,
                    entries: Mutex::new(HashMap::new()),
                },
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

    /// Bucket metadata from the hot store, ordered by partition, then time.
    pub async fn list_buckets(&self, filter: &BucketFilter) -> Result<Vec<BucketMeta>, TableError> {
        let metas = self
            .inner
            .store
            .list_buckets(&self.inner.def.table_id, filter)
            .await?;
        Ok(metas)
    }

    /// The validated manifest of an Archived route: from the cache when fresh and naming the
    /// same object, else read from the archive (checked against the bucket) and cached.
    async fn manifest_for(
        &self,
        bucket: &BucketId,
        object_key: &str,
    ) -> Result<Arc<Manifest>, TableError> {
        if let Some((key, m)) = self.inner.cache.get(bucket) {
            if key == object_key {
                return Ok(m);
            }
        }
        let manifest = self
            .inner
            .archive
            .read_manifest(object_key, bucket)
            .await
            .map_err(|source| TableError::Archive {
                bucket: bucket.clone(),
                source: Box::new(source),
            })?;
        let manifest = Arc::new(manifest);
        self.inner
            .cache
            .insert(bucket.clone(), object_key.to_string(), manifest.clone());
        Ok(manifest)
    }

    /// The cached archived route of a bucket, if any and fresh.
    pub fn cached_route(&self, bucket: &BucketId) -> Option<String> {
        self.inner.cache.get(bucket).map(|(k, _)| k)
    }

    /// Streams one bucket's matching rows in clustering order (reverse when descending).
    ///
    /// `known_archived` is an Archived route observed by the caller (from a listing); when
    /// present, or when the cache holds a fresh route, the hot store is not asked. Otherwise
    /// each hot page comes with its route; on the first page that reports Archived the read
    /// continues from the archive strictly after the last row already returned.
    pub fn scan_bucket(
        &self,
        bucket: BucketId,
        known_archived: Option<String>,
        req: BucketScan,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        self.scan_bucket_from(bucket, known_archived, req, true)
    }

    /// Streams one partition's matching rows across all its buckets in scan order, finding
    /// the buckets at call time: one [`HotStore::read_head`] statement finds the first
    /// bucket and returns its route and first page together, so a "latest N" page that one
    /// hot bucket answers costs one round trip. A scan that reads past it finds the next
    /// bucket the same way (the first [`HEAD_READS`] buckets), then lists the rest
    /// [`LIST_PAGE`] at a time, reading each bucket as [`scan_bucket`](Self::scan_bucket)
    /// does (archived routes from the listing are used directly; Hot and Archiving ones are
    /// re-read with each page). Nothing past a bucket is looked up once `req.limit` rows
    /// have been produced.
    pub fn scan_key(
        &self,
        partition: PartitionKey,
        req: BucketScan,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let Some(interval) = req.bounds.time_interval() else {
            return stream::empty().boxed();
        };
        let remaining = Arc::new(AtomicUsize::new(req.limit.unwrap_or(usize::MAX)));
        self.scan_from_head(partition, interval, req, remaining.clone(), HEAD_READS)
            .inspect(move |item| {
                if let Ok(chunk) = item {
                    let n = chunk.batch.num_rows();
                    let _ = remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                        (r != usize::MAX).then(|| r.saturating_sub(n))
                    });
                }
            })
            .boxed()
    }

    /// [`scan_key`](Self::scan_key) over `interval`: a head read of its first bucket, then
    /// (while `remaining`, which the caller counts down, is not zero) the interval beyond
    /// it, with `heads` more head reads before listing.
    fn scan_from_head(
        &self,
        partition: PartitionKey,
        (from, to): (EventTime, EventTime),
        req: BucketScan,
        remaining: Arc<AtomicUsize>,
        heads: usize,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let table = self.clone();
        stream::once(async move {
            let limit = remaining.load(Ordering::SeqCst);
            if limit == 0 {
                return Ok(stream::empty().boxed());
            }
            // What is left of the limit, not the scan's whole limit: a head read past the
            // first bucket reads only the rows still wanted, in either tier.
            let req = BucketScan {
                limit: req.limit.map(|_| limit),
                ..req
            };
            let page = PageRequest {
                bounds: req.bounds.clone(),
                descending: req.descending,
                limit: req.page_rows.min(limit).max(1),
                include_value: req.include_value,
            };
            let table_id = table.definition().table_id.clone();
            // Ends at the edge of the supported range bound nothing (every bucket lies
            // inside it); leaving them out keeps the head statement to its index probes.
            let lower = (from > EventTime::min_supported()).then_some(from);
            let upper =
                (to.as_micros() < EventTime::end_of_supported().as_micros() - 1).then_some(to);
            let head = table
                .inner
                .store
                .read_head(&table_id, &partition, lower, upper, &page)
                .await?;
            let Some(bucket) = head.bucket else {
                return Ok(stream::empty().boxed());
            };
            let edge = bucket.id.bucket_key;
            let first: BoxStream<'static, Result<BucketChunk, TableError>> = match head.first {
                HotPage::Missing => stream::empty().boxed(),
                HotPage::Archived { object_key } => {
                    table.scan_bucket(bucket.id, Some(object_key), req.clone())
                }
                HotPage::Hot { rows: batch, .. } => {
                    let n = batch.num_rows();
                    let full = n >= page.limit;
                    let last = if full && limit > n {
                        last_clustering_key(&batch).map_err(|e| TableError::Store(e.into()))?
                    } else {
                        None
                    };
                    let chunk = BucketChunk {
                        tier: Tier::Hot,
                        pages: 1,
                        first_of_bucket: true,
                        batch,
                    };
                    let head = stream::once(async move { Ok(chunk) });
                    match last {
                        Some(last) => {
                            let bounds = if req.descending {
                                req.bounds.with_before(last)
                            } else {
                                req.bounds.with_after(last)
                            };
                            let rest = BucketScan {
                                bounds,
                                limit: req.limit.map(|_| limit - n),
                                ..req.clone()
                            };
                            head.chain(table.scan_bucket_from(bucket.id, None, rest, false))
                                .boxed()
                        }
                        None => head.boxed(),
                    }
                }
            };
            // The buckets beyond this one in scan order, looked up only when the scan gets
            // there still wanting rows (both ways check `remaining` first), which a "latest
            // N" page that this bucket answers never does.
            let rest = stream::once(async move {
                match beyond(edge, (from, to), req.descending) {
                    None => stream::empty().boxed(),
                    Some(interval) if heads > 1 => {
                        table.scan_from_head(partition, interval, req, remaining, heads - 1)
                    }
                    Some(interval) => table.scan_listed(partition, interval, req, remaining),
                }
            })
            .flatten();
            Ok::<_, TableError>(first.chain(rest).boxed())
        })
        .try_flatten()
        .boxed()
    }

    /// The buckets of `interval` in scan order, listed [`LIST_PAGE`] at a time and read one
    /// after another while `remaining` is not zero.
    fn scan_listed(
        &self,
        partition: PartitionKey,
        interval: (EventTime, EventTime),
        req: BucketScan,
        remaining: Arc<AtomicUsize>,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let table = self.clone();
        let bounds = req.bounds.clone();
        self.list_in_pages(partition, interval, req.descending, remaining.clone())
            .map_ok(|page| stream::iter(page.into_iter().map(Ok)))
            .try_flatten()
            .filter(move |m| {
                let keep = match m {
                    Ok(m) => bounds.may_overlap(&m.id.bucket_key),
                    Err(_) => true,
                };
                futures::future::ready(keep)
            })
            .map(move |m| {
                let m = match m {
                    Ok(m) => m,
                    Err(e) => return stream::once(futures::future::ready(Err(e))).boxed(),
                };
                let left = remaining.load(Ordering::SeqCst);
                if left == 0 {
                    return stream::empty().boxed();
                }
                let route = match m.state {
                    BucketState::Archived { object_key, .. } => Some(object_key),
                    BucketState::Hot | BucketState::Archiving => None,
                };
                let req = BucketScan {
                    limit: (left != usize::MAX).then_some(left),
                    ..req.clone()
                };
                table.scan_bucket(m.id, route, req)
            })
            .flatten()
            .boxed()
    }

    /// One partition's buckets overlapping `interval`, in scan order, [`LIST_PAGE`] per
    /// statement, each listed only when the consumer asks for it and `wanted` (rows the
    /// scan still needs) is not zero: a scan that stops early (a LIMIT reached) never lists
    /// the rest of a long history.
    fn list_in_pages(
        &self,
        partition: PartitionKey,
        interval: (EventTime, EventTime),
        descending: bool,
        wanted: Arc<AtomicUsize>,
    ) -> BoxStream<'static, Result<Vec<BucketMeta>, TableError>> {
        let table = self.clone();
        stream::try_unfold(Some(interval), move |left| {
            let table = table.clone();
            let partition = partition.clone();
            let wanted = wanted.clone();
            async move {
                let Some((from, to)) = left else {
                    return Ok(None);
                };
                if wanted.load(Ordering::SeqCst) == 0 {
                    return Ok(None);
                }
                let filter = BucketFilter {
                    partitions: Some(vec![partition]),
                    from: Some(from),
                    to: Some(to),
                    descending,
                    limit: Some(LIST_PAGE),
                };
                let page = table.list_buckets(&filter).await?;
                let next = match page.last() {
                    Some(last) if page.len() >= LIST_PAGE => {
                        beyond(last.id.bucket_key, (from, to), descending)
                    }
                    _ => None,
                };
                Ok(Some((page, next)))
            }
        })
        .boxed()
    }

    fn scan_bucket_from(
        &self,
        bucket: BucketId,
        known_archived: Option<String>,
        req: BucketScan,
        first_of_bucket: bool,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let table = self.clone();
        let route = known_archived.or_else(|| table.cached_route(&bucket));
        enum St {
            Start(Option<String>),
            Hot(ScanBounds),
            Archive(BoxStream<'static, Result<RecordBatch, ArchiveError>>),
            Done,
        }
        let remaining = req.limit.unwrap_or(usize::MAX);
        let init = (St::Start(route), remaining, first_of_bucket);
        stream::unfold(init, move |(mut st, mut remaining, mut first_of_bucket)| {
            let table = table.clone();
            let bucket = bucket.clone();
            let req = req.clone();
            async move {
                loop {
                    if remaining == 0 {
                        return None;
                    }
                    match st {
                        St::Done => return None,
                        St::Start(Some(object_key)) => {
                            match table
                                .open_archive(&bucket, &object_key, &req, &req.bounds)
                                .await
                            {
                                Ok(s) => st = St::Archive(s),
                                Err(e) => return Some((Err(e), (St::Done, 0, false))),
                            }
                        }
                        St::Start(None) => st = St::Hot(req.bounds.clone()),
                        St::Hot(bounds) => {
                            let page = PageRequest {
                                bounds: bounds.clone(),
                                descending: req.descending,
                                limit: req.page_rows.min(remaining).max(1),
                                include_value: req.include_value,
                            };
                            let res = table.inner.store.read_page(&bucket, &page).await;
                            match res {
                                Err(e) => return Some((Err(e.into()), (St::Done, 0, false))),
                                Ok(HotPage::Missing) => return None,
                                Ok(HotPage::Archived { object_key }) => {
                                    match table
                                        .open_archive(&bucket, &object_key, &req, &bounds)
                                        .await
                                    {
                                        Ok(s) => st = St::Archive(s),
                                        Err(e) => return Some((Err(e), (St::Done, 0, false))),
                                    }
                                }
                                Ok(HotPage::Hot { rows: batch, .. }) => {
                                    let n = batch.num_rows();
                                    let full = n >= page.limit;
                                    let last = match last_clustering_key(&batch) {
                                        Ok(Some(last)) => last,
                                        Ok(None) => return None,
                                        Err(e) => {
                                            let e = TableError::Store(e.into());
                                            return Some((Err(e), (St::Done, 0, false)));
                                        }
                                    };
                                    let next = if req.descending {
                                        bounds.with_before(last)
                                    } else {
                                        bounds.with_after(last)
                                    };
                                    remaining -= n.min(remaining);
                                    let next_state = if full { St::Hot(next) } else { St::Done };
                                    let chunk = BucketChunk {
                                        tier: Tier::Hot,
                                        pages: 1,
                                        first_of_bucket: std::mem::take(&mut first_of_bucket),
                                        batch,
                                    };
                                    return Some((
                                        Ok(chunk),
                                        (next_state, remaining, first_of_bucket),
                                    ));
                                }
                            }
                        }
                        St::Archive(mut s) => match s.next().await {
                            None => return None,
                            Some(Err(source)) => {
                                return Some((
                                    Err(TableError::Archive {
                                        bucket,
                                        source: Box::new(source),
                                    }),
                                    (St::Done, 0, false),
                                ))
                            }
                            Some(Ok(batch)) => {
                                if batch.num_rows() == 0 {
                                    st = St::Archive(s);
                                    continue;
                                }
                                let batch = if batch.num_rows() > remaining {
                                    batch.slice(0, remaining)
                                } else {
                                    batch
                                };
                                remaining -= batch.num_rows();
                                let chunk = BucketChunk {
                                    tier: Tier::Archived,
                                    pages: 0,
                                    first_of_bucket: std::mem::take(&mut first_of_bucket),
                                    batch,
                                };
                                return Some((
                                    Ok(chunk),
                                    (St::Archive(s), remaining, first_of_bucket),
                                ));
                            }
                        },
                    }
                }
            }
        })
        .boxed()
    }

    async fn open_archive(
        &self,
        bucket: &BucketId,
        object_key: &str,
        req: &BucketScan,
        bounds: &ScanBounds,
    ) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, TableError> {
        let manifest = self.manifest_for(bucket, object_key).await?;
        let scan = ArchiveScan {
            bounds: bounds.clone(),
            descending: req.descending,
            include_value: req.include_value,
            // The exact bounds are applied on these two columns, so bounded reads need them.
            include_keys: req.include_keys || *bounds != ScanBounds::all(),
            batch_rows: req.page_rows.min(req.limit.unwrap_or(usize::MAX)).max(1),
        };
        self.inner
            .archive
            .scan(&manifest, &scan)
            .await
            .map_err(|source| TableError::Archive {
                bucket: bucket.clone(),
                source: Box::new(source),
            })
    }
}

/// The part of `[from, to]` past `edge` in scan order: strictly older than its start when
/// descending, else from its end on (a partition's buckets never overlap, so a bucket that
/// ends after `edge` ends starts there or later). `None` when nothing is left.
fn beyond(
    edge: BucketKey,
    (from, to): (EventTime, EventTime),
    descending: bool,
) -> Option<(EventTime, EventTime)> {
    if descending {
        let before = EventTime::from_micros(edge.start().as_micros() - 1).ok()?;
        (before >= from).then_some((from, to.min(before)))
    } else {
        (edge.end() <= to).then_some((from.max(edge.end()), to))
    }
}
