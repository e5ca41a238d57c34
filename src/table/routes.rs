//! Routes: where one bucket's rows are read from, and the cache of the routes that never
//! change.
//!
//! A [`Route`] is the one name every part of a read uses for a bucket's tier: a listing
//! turns a bucket's stored state into one, a hot page or head read that finds its bucket
//! published hands one over, and the cache keeps the archived ones. Hot (and Archiving)
//! routes can change at any moment, so a hot read re-reads its route with every page and
//! they are never cached. An Archived route is final in tier (a manifest never changes and
//! an archived bucket never becomes Hot again; compaction may move it to a segment holding
//! the same rows, and the object it replaced stays readable for longer than this cache's
//! bound), so it is kept, with its validated manifest, in a bounded process-local cache,
//! for at most [`ROUTE_CACHE_TTL`] from the moment it was read from the hot store: a route
//! carries that moment (`read_at` of [`Route::Archived`]), so a route a scan listed at planning
//! and reads minutes later is cached only for what is left of its bound, never for a fresh
//! one. A tier's reader hands a read over to another tier with the route it found
//! (`Step::Moved`). A reader that finds a route's object gone asks the hot store again
//! (`DurableTable::reresolve`, in `archived`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::BucketChunk;
use crate::archive::RouteManifest;
use crate::model::{BucketId, ScanBounds};
use crate::store::BucketState;

/// How long an archived route may be served from the cache before it is re-read from the
/// hot store. The archiver must wait at least this long after publication before deleting
/// hot rows (`HotStore::cleanup_step`'s `min_age`): a reader never trusts a cached route
/// older than this bound, so any reader that could still be acting on a pre-publication
/// observation has finished deciding by then.
pub const ROUTE_CACHE_TTL: Duration = Duration::from_secs(60);

/// Default number of archived routes kept per table.
pub const ROUTE_CACHE_CAPACITY: usize = 10_000;

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

/// Where one bucket's rows are read from, whichever statement observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The hot store: the bucket is Hot or Archiving. Such a route may be stale the moment
    /// it is seen, so every hot page reads the route again beside its rows.
    Hot,
    /// A published archive: the manifest at `object_key` (a bucket's own archive, or a
    /// segment holding it). Final in tier: an archived bucket never becomes Hot again; its
    /// object may be replaced by a segment holding the same rows (compaction), and the old
    /// object outlives its route by at least the archiver's retirement delay (its reader
    /// bounds: this cache's bound plus the statement timeout, plus skew).
    Archived {
        /// Key of the published manifest.
        object_key: String,
        /// When the route was read from the hot store (the statement's start, or earlier):
        /// the cache's bound runs from here, not from when a read cached it.
        read_at: Instant,
    },
}

impl Route {
    /// The route a bucket's stored state names, read from the hot store at `read_at`.
    pub fn of_state(state: &BucketState, read_at: Instant) -> Self {
        match state {
            BucketState::Hot | BucketState::Archiving => Self::Hot,
            BucketState::Archived { object_key, .. } => Self::Archived {
                object_key: object_key.clone(),
                read_at,
            },
        }
    }
}

/// What a tier's reader produces: rows, or, as its last item, the route the rest of the
/// bucket is read from.
pub(super) enum Step {
    /// A chunk of the bucket's rows.
    Rows(BucketChunk),
    /// The bucket moved on (a hot page found it published): continue on `route` from
    /// `bounds`, which carry the cursor past every row already returned.
    Moved {
        /// Where the rest is.
        route: Route,
        /// The bounds of the rest.
        bounds: ScanBounds,
        /// Whether no chunk of the bucket has been returned yet.
        first_of_bucket: bool,
    },
}

#[derive(Debug)]
struct CachedRoute {
    object_key: String,
    manifest: RouteManifest,
    /// When the route was read from the hot store (not when it was cached).
    read_at: Instant,
}

/// A bounded cache of archived routes: bucket -> validated manifest.
#[derive(Debug)]
pub(super) struct RouteCache {
    config: RouteCacheConfig,
    entries: Mutex<HashMap<BucketId, CachedRoute>>,
}

impl RouteCache {
    pub(super) fn new(config: RouteCacheConfig) -> Self {
        Self {
            config,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Where a read of `bucket` starts: a final route the caller saw (a listing's Archived
    /// state), else a fresh cached one, else the hot store, whose pages say where to go. A
    /// Hot route the caller saw is not trusted over the cache: it may be older.
    pub(super) fn resolve(&self, bucket: &BucketId, known: Option<Route>) -> Route {
        match known {
            Some(route @ Route::Archived { .. }) => route,
            Some(Route::Hot) | None => self.route(bucket).unwrap_or(Route::Hot),
        }
    }

    /// The cached route of a bucket, if any and fresh.
    pub(super) fn route(&self, bucket: &BucketId) -> Option<Route> {
        self.get(bucket)
            .map(|(object_key, _, read_at)| Route::Archived {
                object_key,
                read_at,
            })
    }

    /// The cached manifest of a bucket, if fresh and naming the same object.
    pub(super) fn manifest(&self, bucket: &BucketId, object_key: &str) -> Option<RouteManifest> {
        self.get(bucket)
            .and_then(|(key, m, _)| (key == object_key).then_some(m))
    }

    fn get(&self, bucket: &BucketId) -> Option<(String, RouteManifest, Instant)> {
        let mut entries = self.entries.lock().expect("route cache poisoned");
        match entries.get(bucket) {
            Some(e) if e.read_at.elapsed() < self.config.ttl => {
                Some((e.object_key.clone(), e.manifest.clone(), e.read_at))
            }
            Some(_) => {
                entries.remove(bucket);
                None
            }
            None => None,
        }
    }

    /// Keeps a validated manifest as the bucket's route, read from the hot store at
    /// `read_at`: not at all when that is already past the bound, nor over a route read
    /// later. Evicts expired entries, then the oldest eighth, when full.
    pub(super) fn insert(
        &self,
        bucket: BucketId,
        object_key: String,
        manifest: RouteManifest,
        read_at: Instant,
    ) {
        let ttl = self.config.ttl;
        if self.config.capacity == 0 || read_at.elapsed() >= ttl {
            return;
        }
        let mut entries = self.entries.lock().expect("route cache poisoned");
        if entries.get(&bucket).is_some_and(|e| e.read_at > read_at) {
            return;
        }
        if entries.len() >= self.config.capacity && !entries.contains_key(&bucket) {
            entries.retain(|_, e| e.read_at.elapsed() < ttl);
            if entries.len() >= self.config.capacity {
                // The oldest eighth goes at once: a scan that caches more routes than the
                // cache holds (every bucket of a window across many channels) then pays one
                // pass over the entries per `capacity / 8` inserts, not one per insert.
                let drop = (self.config.capacity / 8).clamp(1, entries.len());
                let mut ages: Vec<Instant> = entries.values().map(|e| e.read_at).collect();
                let cutoff = *ages.select_nth_unstable(drop - 1).1;
                let mut left = drop;
                entries.retain(|_, e| {
                    if left > 0 && e.read_at <= cutoff {
                        left -= 1;
                        false
                    } else {
                        true
                    }
                });
            }
        }
        entries.insert(
            bucket,
            CachedRoute {
                object_key,
                manifest,
                read_at,
            },
        );
    }

    /// Drops a bucket's entry if it still names `object_key` (an object found gone).
    pub(super) fn forget(&self, bucket: &BucketId, object_key: &str) {
        let mut entries = self.entries.lock().expect("route cache poisoned");
        if entries
            .get(bucket)
            .is_some_and(|e| e.object_key == object_key)
        {
            entries.remove(bucket);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.lock().expect("route cache poisoned").len()
    }
}
