//! Which buckets a scan reads, in which scan partition and in which order.
//!
//! A scan learns its buckets in one of two modes.
//!
//! # Listed at planning time
//!
//! [`DurableTable::plan_buckets`] lists the buckets the scan's partitions and time bounds
//! can match, prunes those its bounds exclude, and counts the rest by the state the listing
//! saw (which `EXPLAIN` shows). [`plan_groups`] then splits the buckets into scan
//! partitions, each sorted by (key, time), and [`scan_units`] turns one partition's share
//! into the [`ScanUnit`]s it reads in order, each bucket with its listed [`Route`].
//!
//! # Listed at execution time
//!
//! When the filters name the partition keys, the listing can wait until the scan runs: a
//! unit is then a whole key, and [`DurableTable::scan_key`] finds its buckets as it reaches
//! them. The first [`HEAD_READS`] buckets come from head reads (a bucket's route and first
//! page in one statement, so a "latest N" page costs one round trip); past them the key's
//! buckets are listed [`LIST_PAGE`] at a time. Nothing past a bucket is looked up once the
//! scan's [`RowLimit`] is spent, so a page that stops early never lists a long history.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};

use super::hot::Head;
use super::routes::Step;
use super::{BucketChunk, BucketScan, DurableTable, Route, RowLimit, TableError};
use crate::model::{BucketId, BucketKey, EventTime, PartitionKey, ScanBounds};
use crate::store::{BucketFilter, BucketMeta, BucketState};

/// Buckets a scan reads with head statements ([`crate::store::RoutedReads::read_head`]: the
/// next bucket's route and first rows together) before it lists the rest [`LIST_PAGE`] at a
/// time. A "latest N" page mostly ends in its first bucket or spills into the next (a quiet
/// day), and a head statement finds that next bucket and reads its rows in one round trip
/// where a listing and a read take two; past that, a scan is reading history, where one
/// listing per [`LIST_PAGE`] buckets is cheaper than one route lookup per bucket.
pub const HEAD_READS: usize = 2;

/// Buckets a scan lists per round trip once it reads past its head reads: enough that
/// a scan over years of daily buckets lists in a few statements, few enough that a listing
/// the scan never reaches costs little.
pub const LIST_PAGE: usize = 64;

/// Segment manifests read at once while listing across partitions (each is kept once read).
const SEGMENT_MANIFEST_READS: usize = 16;

/// The buckets of one partition key that a scan reads, oldest first.
#[derive(Debug, Clone)]
pub struct KeyBuckets {
    /// The partition key.
    pub partition_key: PartitionKey,
    /// Buckets in time order, each with the route the listing saw.
    pub buckets: Vec<(BucketId, Route)>,
}

/// Bucket counts of a plan, by the state the listing observed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketCounts {
    /// Buckets listed as Hot.
    pub hot: usize,
    /// Buckets listed as Archiving.
    pub archiving: usize,
    /// Buckets listed as Archived.
    pub archived: usize,
    /// Buckets listed but excluded by the scan bounds before any read.
    pub pruned: usize,
}

/// What a scan reads, as planned.
#[derive(Debug, Clone, Default)]
pub struct BucketPlan {
    /// Buckets to read, per partition key, in key order.
    pub keys: Vec<KeyBuckets>,
    /// What the listing saw.
    pub counts: BucketCounts,
    /// Buckets are listed when the scan runs, per key, with the first page; `keys` then hold
    /// no buckets.
    pub deferred: bool,
}

/// What one scan partition reads, one after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanUnit {
    /// A whole partition key, its buckets found as the scan reaches them.
    Key(PartitionKey),
    /// One bucket, with the route its listing saw.
    Bucket(BucketId, Route),
    /// Buckets of one partition key, adjacent in the plan and in time order, whose listing
    /// saw them all archived in the same segment (the route's object key and when the
    /// oldest of the routes was read): read as one ([`DurableTable::read_run`]).
    Run(Vec<BucketId>, String, Instant),
}

impl DurableTable {
    /// The buckets of `partitions` (`None`: every partition) that `bounds` can match, by
    /// key, and their counts by state. With `at_execution` and the partitions named, nothing
    /// is listed: the plan holds the keys alone, and each is listed when the scan runs
    /// ([`scan_key`](Self::scan_key)), in the same statement as its first page.
    pub async fn plan_buckets(
        &self,
        partitions: Option<&BTreeSet<PartitionKey>>,
        bounds: &ScanBounds,
        at_execution: bool,
    ) -> Result<BucketPlan, TableError> {
        let mut counts = BucketCounts::default();
        let mut by_key: BTreeMap<PartitionKey, KeyBuckets> = BTreeMap::new();
        let deferred = at_execution && partitions.is_some();
        if deferred {
            for pk in partitions.into_iter().flatten() {
                by_key.insert(
                    pk.clone(),
                    KeyBuckets {
                        partition_key: pk.clone(),
                        buckets: Vec::new(),
                    },
                );
            }
        } else {
            let interval = bounds.time_interval();
            let filter = BucketFilter {
                partitions: partitions.map(|p| p.iter().cloned().collect()),
                from: interval.map(|i| i.0),
                to: interval.map(|i| i.1),
                ..BucketFilter::default()
            };
            // Routes age from before the statement that read them (the cache's bound).
            let read_at = Instant::now();
            let mut listed = match (partitions, interval) {
                (None, Some((from, to))) => self.list_across(&filter, from, to).await?,
                _ => self
                    .list_buckets(&filter)
                    .await?
                    .into_iter()
                    .map(|m| (m.id, m.state))
                    .collect(),
            };
            listed.sort_by(|(a, _), (b, _)| {
                (&a.partition_key, a.bucket_key.start())
                    .cmp(&(&b.partition_key, b.bucket_key.start()))
            });
            for (id, state) in listed {
                let in_set = partitions.is_none_or(|p| p.contains(&id.partition_key));
                if !in_set || !bounds.may_overlap(&id.bucket_key) {
                    counts.pruned += 1;
                    continue;
                }
                match &state {
                    BucketState::Hot => counts.hot += 1,
                    BucketState::Archiving => counts.archiving += 1,
                    BucketState::Archived { .. } => counts.archived += 1,
                }
                by_key
                    .entry(id.partition_key.clone())
                    .or_insert_with(|| KeyBuckets {
                        partition_key: id.partition_key.clone(),
                        buckets: Vec::new(),
                    })
                    .buckets
                    .push((id, Route::of_state(&state, read_at)));
            }
        }
        Ok(BucketPlan {
            keys: by_key.into_values().collect(),
            counts,
            deferred,
        })
    }

    /// Every partition's buckets overlapping `[from, to]` with their states, unordered.
    ///
    /// The store names the segments whose every bucket is still routed to them
    /// ([`crate::store::RoutedReads::list_across`]); their buckets are read from the
    /// segments' manifests (kept once read: a warm query reads none), so the registry sends
    /// one row per segment instead of one per (partition, bucket). A manifest that cannot
    /// be opened, or that holds another table or another number of buckets than its route
    /// says, is not trusted: the whole listing is then made bucket by bucket, as for a
    /// store without segment routes, and the reads meet whatever is wrong with the object.
    async fn list_across(
        &self,
        filter: &BucketFilter,
        from: EventTime,
        to: EventTime,
    ) -> Result<Vec<(BucketId, BucketState)>, TableError> {
        let table = &self.inner.def.table_id;
        let one_by_one = || async {
            Ok::<_, TableError>(
                self.list_buckets(filter)
                    .await?
                    .into_iter()
                    .map(|m| (m.id, m.state))
                    .collect(),
            )
        };
        let Some(listing) = self.inner.store.list_across(table, from, to).await? else {
            return one_by_one().await;
        };
        let mut out: Vec<(BucketId, BucketState)> = listing
            .buckets
            .into_iter()
            .map(|m| (m.id, m.state))
            .collect();
        let archive = &self.inner.archive;
        let manifests: Vec<_> = stream::iter(listing.segments)
            .map(|(key, held)| async move {
                let manifest = archive.read_segment_manifest(&key).await;
                (key, held, manifest)
            })
            .buffer_unordered(SEGMENT_MANIFEST_READS)
            .collect()
            .await;
        for (key, held, manifest) in manifests {
            let Ok(manifest) = manifest else {
                return one_by_one().await;
            };
            if manifest.table_id != *table || manifest.buckets().count() as u64 != held {
                return one_by_one().await;
            }
            for (id, _) in manifest.buckets() {
                let (start, end) = id.bucket_key.bounds();
                if end > from && start <= to {
                    let state = BucketState::Archived {
                        object_key: key.clone(),
                        hot_deleted: true,
                    };
                    out.push((id, state));
                }
            }
        }
        Ok(out)
    }

    /// Streams one partition's matching rows across all its buckets in scan order, at most
    /// `req.limit` of them, finding the buckets at call time: one head read
    /// (`RoutedReads::read_head`) finds the first bucket and returns its route and first
    /// page together, so a "latest N" page that one hot bucket answers costs one round
    /// trip. A scan that reads past it finds the next bucket the same way (the first
    /// [`HEAD_READS`] buckets), then lists the rest [`LIST_PAGE`] at a time, reading each
    /// bucket as [`scan_bucket`](Self::scan_bucket) does (archived routes from the listing
    /// are used directly; Hot and Archiving ones are re-read with each page). Nothing past a
    /// bucket is looked up once `req.limit` rows have been produced.
    pub fn scan_key(
        &self,
        partition: PartitionKey,
        req: BucketScan,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let limit = RowLimit::new(req.limit);
        limit.count(self.read_key(partition, req, &limit))
    }

    /// [`scan_key`](Self::scan_key)'s rows, not counted: the caller counts them into `limit`.
    pub(super) fn read_key(
        &self,
        partition: PartitionKey,
        req: BucketScan,
        limit: &RowLimit,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let Some(interval) = req.bounds.time_interval() else {
            return stream::empty().boxed();
        };
        self.read_heads(partition, interval, req, limit.clone(), HEAD_READS)
    }

    /// The rows of `interval`: a head read of its first bucket, then (while `limit` is not
    /// spent) the interval beyond it, with `heads` more head reads before listing.
    fn read_heads(
        &self,
        partition: PartitionKey,
        (from, to): (EventTime, EventTime),
        req: BucketScan,
        limit: RowLimit,
        heads: usize,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let table = self.clone();
        stream::once(async move {
            let left = limit.left();
            if left == 0 {
                return Ok(stream::empty().boxed());
            }
            // What is left of the limit, not the scan's whole limit: a head read past the
            // first bucket reads only the rows still wanted, in either tier.
            let req = req.starting(&limit);
            let Some(Head {
                bucket,
                first,
                next,
            }) = table.read_head(&partition, (from, to), &req, left).await?
            else {
                return Ok(stream::empty().boxed());
            };
            let edge = bucket.bucket_key;
            let first: BoxStream<'static, Result<BucketChunk, TableError>> = match first {
                None => stream::empty().boxed(),
                Some(Step::Moved {
                    route,
                    bounds,
                    first_of_bucket,
                }) => table.read_bucket(
                    bucket,
                    Some(route),
                    bounds,
                    req.clone(),
                    limit.clone(),
                    first_of_bucket,
                ),
                Some(Step::Rows(chunk)) => {
                    let head = stream::once(async move { Ok(chunk) });
                    match next {
                        Some(bounds) => head
                            .chain(table.read_rest(bucket, bounds, &req, &limit))
                            .boxed(),
                        None => head.boxed(),
                    }
                }
            };
            // The buckets beyond this one in scan order, looked up only when the scan gets
            // there still wanting rows (both ways check the limit first), which a "latest
            // N" page that this bucket answers never does.
            let rest = stream::once(async move {
                match beyond(edge, (from, to), req.descending) {
                    None => stream::empty().boxed(),
                    Some(interval) if heads > 1 => {
                        table.read_heads(partition, interval, req, limit, heads - 1)
                    }
                    Some(interval) => table.read_listed(partition, interval, req, limit),
                }
            })
            .flatten();
            Ok::<_, TableError>(first.chain(rest).boxed())
        })
        .try_flatten()
        .boxed()
    }

    /// The rest of a bucket whose head page was full, from `bounds` (past that page): a read
    /// that starts once the head page is counted, so it wants only the rows still left.
    fn read_rest(
        &self,
        bucket: BucketId,
        bounds: ScanBounds,
        req: &BucketScan,
        limit: &RowLimit,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let table = self.clone();
        let req = req.clone();
        let limit = limit.clone();
        stream::once(async move {
            let req = req.starting(&limit);
            table.read_bucket(bucket, None, bounds, req, limit, false)
        })
        .flatten()
        .boxed()
    }

    /// The buckets of `interval` in scan order, listed [`LIST_PAGE`] at a time and read one
    /// after another while `limit` is not spent.
    fn read_listed(
        &self,
        partition: PartitionKey,
        interval: (EventTime, EventTime),
        req: BucketScan,
        limit: RowLimit,
    ) -> BoxStream<'static, Result<BucketChunk, TableError>> {
        let table = self.clone();
        let bounds = req.bounds.clone();
        self.list_in_pages(partition, interval, req.descending, limit.clone())
            .map_ok(|(read_at, page)| stream::iter(page.into_iter().map(move |m| Ok((read_at, m)))))
            .try_flatten()
            .filter(move |m| {
                let keep = match m {
                    Ok((_, m)) => bounds.may_overlap(&m.id.bucket_key),
                    Err(_) => true,
                };
                futures::future::ready(keep)
            })
            .map(move |m| {
                let (read_at, m) = match m {
                    Ok(m) => m,
                    Err(e) => return stream::once(futures::future::ready(Err(e))).boxed(),
                };
                if limit.is_spent() {
                    return stream::empty().boxed();
                }
                let req = req.starting(&limit);
                let bounds = req.bounds.clone();
                let route = Route::of_state(&m.state, read_at);
                table.read_bucket(m.id, Some(route), bounds, req, limit.clone(), true)
            })
            .flatten()
            .boxed()
    }

    /// One partition's buckets overlapping `interval`, in scan order, [`LIST_PAGE`] per
    /// statement, each listed only when the consumer asks for it and `wanted` is not spent:
    /// a scan that stops early (a LIMIT reached) never lists the rest of a long history.
    fn list_in_pages(
        &self,
        partition: PartitionKey,
        interval: (EventTime, EventTime),
        descending: bool,
        wanted: RowLimit,
    ) -> BoxStream<'static, Result<(Instant, Vec<BucketMeta>), TableError>> {
        let table = self.clone();
        stream::try_unfold(Some(interval), move |left| {
            let table = table.clone();
            let partition = partition.clone();
            let wanted = wanted.clone();
            async move {
                let Some((from, to)) = left else {
                    return Ok(None);
                };
                if wanted.is_spent() {
                    return Ok(None);
                }
                let filter = BucketFilter {
                    partitions: Some(vec![partition]),
                    from: Some(from),
                    to: Some(to),
                    descending,
                    limit: Some(LIST_PAGE),
                };
                let read_at = Instant::now();
                let page = table.list_buckets(&filter).await?;
                let next = match page.last() {
                    Some(last) if page.len() >= LIST_PAGE => {
                        beyond(last.id.bucket_key, (from, to), descending)
                    }
                    _ => None,
                };
                Ok(Some(((read_at, page), next)))
            }
        })
        .boxed()
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

/// Splits the keys into scan partitions. Every partition lists its keys in key order and
/// each key's buckets in time order, so every partition is sorted by (key, time, sort).
///
/// - With a row limit (a "latest N" or cursor page) or buckets listed at execution, keys
///   stay whole: each goes to one partition (contiguous runs when there are more keys than
///   partitions), so a limited scan stops after the newest (or oldest) buckets it needs
///   instead of reading the first rows of every time range.
/// - Otherwise, with more keys than partitions, the key-ordered sequence of buckets is cut
///   into equal runs, so every core reads the same number of buckets (whole keys would
///   leave one partition with twice the work of another for three keys on two cores); a
///   key may then continue in the next partition.
/// - With fewer keys than partitions, each key's buckets are split into contiguous time
///   ranges; a partition then holds one key, sorted by (time, sort), and a global ORDER BY
///   becomes a merge.
pub fn plan_groups(keys: &[KeyBuckets], target: usize, whole_keys: bool) -> Vec<Vec<KeyBuckets>> {
    let target = target.max(1);
    if keys.is_empty() {
        return vec![Vec::new()];
    }
    if whole_keys {
        let parts = target.min(keys.len());
        let mut out: Vec<Vec<KeyBuckets>> = (0..parts).map(|_| Vec::new()).collect();
        for (i, k) in keys.iter().enumerate() {
            out[i * parts / keys.len()].push(k.clone());
        }
        return out;
    }
    if keys.len() > target {
        let total: usize = keys.iter().map(|k| k.buckets.len()).sum();
        if total == 0 {
            return vec![Vec::new()];
        }
        let parts = target.min(total);
        let mut out: Vec<Vec<KeyBuckets>> = (0..parts).map(|_| Vec::new()).collect();
        let mut seen = 0usize;
        for k in keys {
            let n = k.buckets.len();
            let mut a = 0;
            while a < n {
                // The partition of the bucket at global position `seen + a`, and where it ends.
                let p = (seen + a) * parts / total;
                let end_global = ((p + 1) * total).div_ceil(parts);
                let b = n.min(end_global - seen).max(a + 1);
                out[p].push(KeyBuckets {
                    partition_key: k.partition_key.clone(),
                    buckets: k.buckets[a..b].to_vec(),
                });
                a = b;
            }
            seen += n;
        }
        return out;
    }
    let per_key = target / keys.len();
    let mut out = Vec::new();
    for k in keys {
        let pieces = per_key.min(k.buckets.len()).max(1);
        let n = k.buckets.len();
        for p in 0..pieces {
            let (a, b) = (p * n / pieces, (p + 1) * n / pieces);
            out.push(vec![KeyBuckets {
                partition_key: k.partition_key.clone(),
                buckets: k.buckets[a..b].to_vec(),
            }]);
        }
    }
    out
}

/// What one scan partition reads, in order: its whole keys when buckets are listed at
/// execution (`deferred`), else its planned buckets, newest first when `descending`.
/// Adjacent buckets of a key that the listing saw archived in the same object (a segment
/// holds a window of each of its partitions) become one [`ScanUnit::Run`]: one manifest,
/// one read of their masks, and rows that leave a row group at a time rather than a
/// bucket at a time.
pub fn scan_units(group: Vec<KeyBuckets>, deferred: bool, descending: bool) -> Vec<ScanUnit> {
    let mut units = Vec::new();
    for kb in group {
        if deferred {
            units.push(ScanUnit::Key(kb.partition_key));
            continue;
        }
        let mut runs = runs_of(kb.buckets);
        if descending {
            runs.reverse();
        }
        units.extend(runs);
    }
    units
}

/// One key's buckets (in time order) as units, runs of one object joined.
fn runs_of(buckets: Vec<(BucketId, Route)>) -> Vec<ScanUnit> {
    fn object(route: &Route) -> Option<&str> {
        match route {
            Route::Archived { object_key, .. } => Some(object_key),
            Route::Hot => None,
        }
    }
    fn flush(pending: &mut Vec<(BucketId, Route)>, out: &mut Vec<ScanUnit>) {
        match pending.len() {
            0 => {}
            1 => {
                let (bucket, route) = pending.pop().expect("one bucket");
                out.push(ScanUnit::Bucket(bucket, route));
            }
            _ => {
                let (mut key, mut at) = (String::new(), None::<Instant>);
                let mut run = Vec::with_capacity(pending.len());
                for (bucket, route) in pending.drain(..) {
                    if let Route::Archived {
                        object_key,
                        read_at,
                    } = route
                    {
                        key = object_key;
                        at = Some(at.map_or(read_at, |a| a.min(read_at)));
                    }
                    run.push(bucket);
                }
                out.push(ScanUnit::Run(run, key, at.expect("archived routes")));
            }
        }
    }
    let mut out = Vec::new();
    let mut pending: Vec<(BucketId, Route)> = Vec::new();
    for (bucket, route) in buckets {
        let joins = match (pending.last(), object(&route)) {
            (Some((_, last)), Some(key)) => object(last) == Some(key),
            _ => false,
        };
        if !joins {
            flush(&mut pending, &mut out);
        }
        pending.push((bucket, route));
    }
    flush(&mut pending, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BucketStrategy, TableId};

    fn keys(sizes: &[usize]) -> Vec<KeyBuckets> {
        let strategy = BucketStrategy::CalendarDayUtc;
        sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let pk = PartitionKey::new(vec![k as u8]).unwrap();
                let mut b = strategy.bucket_of(EventTime::from_micros(0).unwrap());
                let buckets = (0..n)
                    .map(|_| {
                        let id = BucketId {
                            table_id: TableId::new("t").unwrap(),
                            partition_key: pk.clone(),
                            bucket_key: b,
                        };
                        b = b.next().unwrap();
                        (id, Route::Hot)
                    })
                    .collect();
                KeyBuckets {
                    partition_key: pk,
                    buckets,
                }
            })
            .collect()
    }

    fn flat(groups: &[Vec<KeyBuckets>]) -> Vec<BucketId> {
        groups
            .iter()
            .flatten()
            .flat_map(|k| k.buckets.iter().map(|(b, _)| b.clone()))
            .collect()
    }

    /// Adjacent buckets of a key listed in one object become one run; a hot bucket, another
    /// object or another key ends it; a lone bucket stays a bucket; descending scans take
    /// the units newest first (a run keeps its buckets in time order, its reader reverses).
    #[test]
    fn adjacent_buckets_of_one_object_become_runs() {
        let at = Instant::now();
        let archived = |k: &str| Route::Archived {
            object_key: k.to_string(),
            read_at: at,
        };
        let mut ks = keys(&[6, 2]);
        let routes = [
            archived("seg/a"),
            archived("seg/a"),
            Route::Hot,
            archived("seg/a"),
            archived("seg/b"),
            archived("seg/b"),
        ];
        for ((_, r), want) in ks[0].buckets.iter_mut().zip(routes) {
            *r = want;
        }
        for (_, r) in ks[1].buckets.iter_mut() {
            *r = archived("seg/b");
        }
        let b = |k: usize, i: usize| ks[k].buckets[i].0.clone();
        let want = vec![
            ScanUnit::Run(vec![b(0, 0), b(0, 1)], "seg/a".into(), at),
            ScanUnit::Bucket(b(0, 2), Route::Hot),
            ScanUnit::Bucket(b(0, 3), archived("seg/a")),
            ScanUnit::Run(vec![b(0, 4), b(0, 5)], "seg/b".into(), at),
            // The same object under the next key: a run of its own.
            ScanUnit::Run(vec![b(1, 0), b(1, 1)], "seg/b".into(), at),
        ];
        assert_eq!(scan_units(ks.clone(), false, false), want);
        let mut newest_first: Vec<ScanUnit> = want[..4].iter().rev().cloned().collect();
        newest_first.push(want[4].clone());
        assert_eq!(scan_units(ks.clone(), false, true), newest_first);
        // Listed at execution: whole keys, no runs.
        assert!(scan_units(ks, true, false)
            .iter()
            .all(|u| matches!(u, ScanUnit::Key(_))));
    }

    #[test]
    fn groups_keep_key_and_time_order_and_balance_buckets() {
        for sizes in [
            vec![60, 60, 60],
            vec![1, 100, 3, 7],
            vec![5, 5, 5, 5, 5],
            vec![1, 1, 1],
            vec![0, 4, 0, 9],
            vec![30],
            vec![2, 40],
        ] {
            for target in 1..=6 {
                let ks = keys(&sizes);
                let want = flat(std::slice::from_ref(&ks));
                for whole in [false, true] {
                    let g = plan_groups(&ks, target, whole);
                    // Concatenated in partition order, the groups are the original sequence:
                    // every bucket once, each partition sorted by (key, time).
                    assert_eq!(flat(&g), want, "{sizes:?} target {target} whole {whole}");
                    assert!(!g.is_empty() && g.len() <= target);
                    if whole {
                        let names: Vec<_> = g
                            .iter()
                            .flatten()
                            .map(|k| k.partition_key.clone())
                            .collect();
                        let orig: Vec<_> = ks.iter().map(|k| k.partition_key.clone()).collect();
                        assert_eq!(names, orig, "whole keys stay whole");
                    } else if ks.len() > target {
                        let total: usize = sizes.iter().sum();
                        let loads: Vec<usize> = g
                            .iter()
                            .map(|p| p.iter().map(|k| k.buckets.len()).sum())
                            .collect();
                        let most = loads.iter().max().unwrap();
                        assert!(
                            *most <= total.div_ceil(g.len()),
                            "{sizes:?} target {target}: loads {loads:?}"
                        );
                        assert!(loads.iter().all(|l| *l > 0), "{loads:?}");
                    }
                }
            }
        }
    }
}
