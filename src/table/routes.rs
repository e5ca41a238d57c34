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
//! for at most [`ROUTE_CACHE_TTL`]. A tier's reader hands a
//! read over to another tier with the route it found (`Step::Moved`).

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
    /// object outlives its route by at least [`ROUTE_CACHE_TTL`] plus skew.
    Archived {
        /// Key of the published manifest.
        object_key: String,
    },
}

impl From<&BucketState> for Route {
    fn from(state: &BucketState) -> Self {
        match state {
            BucketState::Hot | BucketState::Archiving => Self::Hot,
            BucketState::Archived { object_key, .. } => Self::Archived {
                object_key: object_key.clone(),
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
    inserted: Instant,
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
            .map(|(object_key, _)| Route::Archived { object_key })
    }

    /// The cached manifest of a bucket, if fresh and naming the same object.
    pub(super) fn manifest(&self, bucket: &BucketId, object_key: &str) -> Option<RouteManifest> {
        self.get(bucket)
            .and_then(|(key, m)| (key == object_key).then_some(m))
    }

    fn get(&self, bucket: &BucketId) -> Option<(String, RouteManifest)> {
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

    /// Keeps a validated manifest as the bucket's route, evicting expired entries, then the
    /// oldest, when full.
    pub(super) fn insert(&self, bucket: BucketId, object_key: String, manifest: RouteManifest) {
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

    pub(super) fn len(&self) -> usize {
        self.entries.lock().expect("route cache poisoned").len()
    }
}
