//! Exact row counts of a planned scan from the archive's manifests, for the optimiser.
//!
//! Every archived object states how many rows each bucket it holds has (a per-bucket
//! manifest its `row_count`, a segment manifest each bucket's count), and every read checks
//! the rows it decodes against that number. So when a scan's listing saw only archived
//! buckets, each lying wholly inside the scan's time bounds, with no other bound on its
//! rows and no delete record on any of them, the scan returns exactly the sum of those
//! counts: DataFusion can then answer `count(*)` without reading a payload. Anything less
//! certain states no count, and the scan reads as before.
//!
//! The manifests are read through the route cache the scan's own reads use, so a count
//! that is not stated (a delete record found afterwards, a query that needs the rows)
//! leaves them warm for the read. An object that cannot be opened states no count: the
//! read reports the error. The count is the listing's snapshot, like the routes the scan
//! reads: a delete committed after planning is seen by a query planned after it.

use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};

use super::plan::KeyBuckets;
use super::{DurableTable, Route, TableError};
use crate::archive::RouteManifest;
use crate::model::{BucketId, ScanBounds};

/// Most distinct buckets with delete records asked for; a table with more in the scanned
/// key range states no count rather than reading them all at planning.
const DELETED_BUCKETS_LIMIT: usize = 4_096;

/// Most partitions named to the delete-record check (each read by the primary key's
/// prefix); a scan of more asks over the key range alone.
const NAMED_PARTITIONS: usize = 1_000;

/// Manifests opened at once while counting (most are cached: a segment's is read once).
const MANIFEST_READS: usize = 16;

impl DurableTable {
    /// The exact number of rows a scan of `keys` (as listed when planned) within `bounds`
    /// returns, when the manifests alone can tell (see the module comment); `None`
    /// otherwise. Errors only when the hot store cannot be asked.
    pub async fn exact_rows(
        &self,
        keys: &[KeyBuckets],
        bounds: &ScanBounds,
    ) -> Result<Option<u64>, TableError> {
        // Bounds on the sort key or a keyset cursor cut buckets at rows no count tells.
        if bounds.sort_lower != Bound::Unbounded
            || bounds.sort_upper != Bound::Unbounded
            || bounds.after.is_some()
            || bounds.before.is_some()
        {
            return Ok(None);
        }
        let Some((lo, hi)) = bounds.time_interval() else {
            return Ok(keys.iter().all(|k| k.buckets.is_empty()).then_some(0));
        };
        // Each bucket archived and wholly inside the interval, grouped by the object its
        // route names (a segment's buckets share one manifest).
        let mut by_object: BTreeMap<&str, Vec<(&BucketId, Instant)>> = BTreeMap::new();
        for key in keys {
            for (bucket, route) in &key.buckets {
                let Route::Archived {
                    object_key,
                    read_at,
                } = route
                else {
                    return Ok(None);
                };
                let (start, end) = bucket.bucket_key.bounds();
                if start < lo || end.as_micros() - 1 > hi.as_micros() {
                    return Ok(None);
                }
                by_object
                    .entry(object_key.as_str())
                    .or_default()
                    .push((bucket, *read_at));
            }
        }
        let buckets: Vec<&BucketId> = by_object.values().flatten().map(|(b, _)| *b).collect();
        let (Some(first), Some(last)) = (
            buckets.iter().map(|b| b.bucket_key.to_string()).min(),
            buckets.iter().map(|b| b.bucket_key.to_string()).max(),
        ) else {
            return Ok(Some(0));
        };
        let partitions: Vec<_> = keys
            .iter()
            .filter(|k| !k.buckets.is_empty())
            .map(|k| k.partition_key.clone())
            .collect();
        let named = (partitions.len() <= NAMED_PARTITIONS).then_some(partitions.as_slice());
        if self.any_deleted(&buckets, named, (&first, &last)).await? {
            return Ok(None);
        }
        // Owned, so the futures borrow nothing from this one's locals.
        let work: Vec<(String, Vec<(BucketId, Instant)>)> = by_object
            .into_iter()
            .map(|(k, b)| {
                (
                    k.to_string(),
                    b.into_iter().map(|(b, t)| (b.clone(), t)).collect(),
                )
            })
            .collect();
        let counts: Vec<Option<u64>> = futures::stream::iter(work)
            .map(|(object_key, buckets)| {
                let table = self.clone();
                async move { table.object_rows(&object_key, &buckets).await }
            })
            .buffer_unordered(MANIFEST_READS)
            .try_collect()
            .await?;
        Ok(counts.into_iter().sum())
    }

    /// Whether any of `buckets` (keys `first..=last` as text) holds a delete record, or the
    /// store cannot tell.
    async fn any_deleted(
        &self,
        buckets: &[&BucketId],
        partitions: Option<&[crate::model::PartitionKey]>,
        (first, last): (&str, &str),
    ) -> Result<bool, TableError> {
        let Some(b) = buckets.first() else {
            return Ok(false);
        };
        let parse = |k: &str| crate::model::BucketKey::parse_any(k).ok();
        let (Some(first), Some(last)) = (parse(first), parse(last)) else {
            return Ok(true);
        };
        let Some(deleted) = self
            .inner
            .store
            .buckets_with_deletes(
                &b.table_id,
                partitions,
                (&first, &last),
                DELETED_BUCKETS_LIMIT,
            )
            .await?
        else {
            return Ok(true);
        };
        if deleted.len() >= DELETED_BUCKETS_LIMIT {
            return Ok(true);
        }
        let deleted: HashSet<_> = deleted.into_iter().collect();
        Ok(buckets
            .iter()
            .any(|b| deleted.contains(&(b.partition_key.clone(), b.bucket_key))))
    }

    /// The rows `buckets` hold in the object they route to, from its manifest; `None` when
    /// it cannot be opened or does not hold one of them.
    async fn object_rows(
        &self,
        object_key: &str,
        buckets: &[(BucketId, Instant)],
    ) -> Result<Option<u64>, TableError> {
        let mut rows = 0u64;
        for (bucket, read_at) in buckets {
            let Ok(manifest) = self.manifest_for(bucket, object_key, *read_at).await else {
                return Ok(None);
            };
            let n = match &manifest {
                RouteManifest::Bucket(m) => m.row_count,
                RouteManifest::Segment(m) => match m.entry_for(object_key, bucket) {
                    Ok((_, n)) => n,
                    Err(_) => return Ok(None),
                },
            };
            rows = rows.saturating_add(n);
        }
        Ok(Some(rows))
    }
}
