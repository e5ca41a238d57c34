//! `DurableTable` routing: the archived-route cache holds only Archived observations, and a
//! bucket read that starts on hot pages continues from the archive at the same cursor when
//! the bucket is published (and its hot rows deleted) between two pages.

use std::sync::Arc;

use futures::StreamExt;
use pulpitum::archive::PayloadFormat;
use pulpitum::model::batch_to_records;
use pulpitum::model::{BucketId, BucketStrategy, Record, ScanBounds, TableId};
use pulpitum::store::{Catalog, HotStore, TableDefinition};
use pulpitum::table::{BucketScan, DurableTable, RouteCacheConfig, Tier};

use crate::common::*;
use crate::dataset::{self, Msg};

fn msgs(channel: i64, n: i64) -> Vec<Record> {
    let base = pulpitum::model::EventTime::parse_rfc3339("2024-02-03T00:00:00Z")
        .unwrap()
        .as_micros();
    (0..n)
        .map(|i| {
            dataset::record(&Msg {
                channel,
                // Pairs share a timestamp so the cursor must use the id.
                micros: base + (i / 2) * 1_000_000,
                id: 100 - i,
                content: format!("m{i}"),
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_switches_tiers_between_pages_without_loss_or_duplicates() {
    let env = Env::new("routes").await;
    let def = TableDefinition::new(
        TableId::new("chat").unwrap(),
        BucketStrategy::CalendarDayUtc,
        "chat",
    );
    env.store.register_table(&def).await.unwrap();
    let table = DurableTable::with_cache(
        env.store.clone() as Arc<dyn HotStore>,
        env.archive.clone(),
        def.clone(),
        RouteCacheConfig::default(),
    );
    let records = msgs(3, 9);
    table.append_batch(&records).await.unwrap();
    let bucket = BucketId::of_record(&def.table_id, def.strategy, &records[0]);

    for descending in [false, true] {
        let req = BucketScan {
            bounds: ScanBounds::all(),
            descending,
            include_value: true,
            include_keys: true,
            page_rows: 2,
            limit: None,
            archive_metrics: None,
            value: Default::default(),
        };
        let mut s = table.scan_bucket(bucket.clone(), None, req);
        let first = s.next().await.unwrap().unwrap();
        let mut seen = batch_to_records(&first.batch).unwrap();
        if !descending {
            assert_eq!(first.tier, Tier::Hot);
            assert_eq!(
                table.cached_routes(),
                0,
                "a Hot observation is never cached"
            );
            // Publish and clean up between two pages of the same read.
            let mut loaded = dataset::Loaded::default();
            dataset::archive(&env, &bucket, PayloadFormat::Json, true, &mut loaded).await;
        }
        let mut tiers = vec![first.tier];
        while let Some(chunk) = s.next().await {
            let chunk = chunk.unwrap();
            tiers.push(chunk.tier);
            seen.extend(batch_to_records(&chunk.batch).unwrap());
        }
        let mut expected = records.clone();
        expected.sort_by_key(Record::clustering_key);
        if descending {
            expected.reverse();
            // Published by now: the route is cached and the hot store is not asked.
            assert!(tiers.iter().all(|t| *t == Tier::Archived), "{tiers:?}");
        } else {
            assert_eq!(tiers.first(), Some(&Tier::Hot));
            assert_eq!(tiers.last(), Some(&Tier::Archived));
        }
        assert_eq!(seen, expected, "descending={descending}");
        assert_eq!(
            table.cached_routes(),
            1,
            "the Archived observation is cached"
        );
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_cache_is_bounded() {
    let env = Env::new("cache").await;
    let def = TableDefinition::new(
        TableId::new("chat").unwrap(),
        BucketStrategy::CalendarDayUtc,
        "chat",
    );
    env.store.register_table(&def).await.unwrap();
    let table = DurableTable::with_cache(
        env.store.clone() as Arc<dyn HotStore>,
        env.archive.clone(),
        def.clone(),
        RouteCacheConfig {
            capacity: 2,
            ttl: std::time::Duration::from_secs(60),
        },
    );
    let mut loaded = dataset::Loaded::default();
    for ch in 0..3 {
        let records = msgs(ch, 2);
        table.append_batch(&records).await.unwrap();
        let bucket = BucketId::of_record(&def.table_id, def.strategy, &records[0]);
        dataset::archive(&env, &bucket, PayloadFormat::Parquet, false, &mut loaded).await;
        let req = BucketScan {
            bounds: ScanBounds::all(),
            descending: false,
            include_value: false,
            include_keys: true,
            page_rows: 100,
            limit: None,
            archive_metrics: None,
            value: Default::default(),
        };
        let chunks: Vec<_> = table.scan_bucket(bucket.clone(), None, req).collect().await;
        let n: usize = chunks
            .into_iter()
            .map(|c| c.unwrap().batch.num_rows())
            .sum();
        assert_eq!(n, 2);
        assert!(table.cached_route(&bucket).is_some());
    }
    assert_eq!(table.cached_routes(), 2);

    // A zero TTL serves nothing from the cache: every read asks the hot store again.
    let uncached = DurableTable::with_cache(
        env.store.clone() as Arc<dyn HotStore>,
        env.archive.clone(),
        def.clone(),
        RouteCacheConfig {
            capacity: 10,
            ttl: std::time::Duration::ZERO,
        },
    );
    let records = msgs(0, 2);
    let bucket = BucketId::of_record(&def.table_id, def.strategy, &records[0]);
    let req = BucketScan {
        bounds: ScanBounds::all(),
        descending: true,
        include_value: true,
        include_keys: true,
        page_rows: 1,
        limit: Some(1),
        archive_metrics: None,
        value: Default::default(),
    };
    let chunks: Vec<_> = uncached
        .scan_bucket(bucket.clone(), None, req)
        .collect()
        .await;
    assert_eq!(chunks.len(), 1);
    let chunk = chunks.into_iter().next().unwrap().unwrap();
    assert_eq!(chunk.tier, Tier::Archived);
    assert_eq!(
        batch_to_records(&chunk.batch).unwrap(),
        vec![records[0].clone()],
        "same time: the larger id is newest"
    );
    assert!(uncached.cached_route(&bucket).is_none());
    env.cleanup().await;
}

/// A route's cache bound runs from when the route was read from the hot store, not from when
/// a read cached it: a route a scan listed at planning and read later is cached only for
/// what is left of the bound, and not at all once the bound has passed (a stale route never
/// gets a fresh TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_route_ages_from_when_it_was_read_from_the_store() {
    let env = Env::new("routeage").await;
    let def = TableDefinition::new(
        TableId::new("chat").unwrap(),
        BucketStrategy::CalendarDayUtc,
        "chat",
    );
    env.store.register_table(&def).await.unwrap();
    let ttl = std::time::Duration::from_millis(1500);
    let table = DurableTable::with_cache(
        env.store.clone() as Arc<dyn HotStore>,
        env.archive.clone(),
        def.clone(),
        RouteCacheConfig { capacity: 10, ttl },
    );
    let records = msgs(5, 4);
    table.append_batch(&records).await.unwrap();
    let bucket = BucketId::of_record(&def.table_id, def.strategy, &records[0]);
    let mut loaded = dataset::Loaded::default();
    dataset::archive(&env, &bucket, PayloadFormat::Parquet, true, &mut loaded).await;
    let req = BucketScan {
        bounds: ScanBounds::all(),
        descending: false,
        include_value: true,
        include_keys: true,
        page_rows: 100,
        limit: None,
        archive_metrics: None,
        value: Default::default(),
    };
    let listed_route = || async {
        let plan = table
            .plan_buckets(None, &ScanBounds::all(), false)
            .await
            .unwrap();
        let (id, route) = plan.keys[0].buckets[0].clone();
        assert_eq!(id, bucket);
        route
    };
    let read = |route| {
        let table = table.clone();
        let (bucket, req) = (bucket.clone(), req.clone());
        async move {
            let chunks: Vec<_> = table.scan_bucket(bucket, Some(route), req).collect().await;
            chunks
                .into_iter()
                .map(|c| c.unwrap().batch.num_rows())
                .sum::<usize>()
        }
    };

    // Listed, read two thirds of the bound later: cached, but only until the bound from
    // the listing ends.
    let route = listed_route().await;
    let listed = std::time::Instant::now();
    tokio::time::sleep(ttl * 2 / 3).await;
    assert_eq!(read(route).await, 4);
    assert!(table.cached_route(&bucket).is_some(), "inside its bound");
    tokio::time::sleep(
        (listed + ttl + ttl / 6).saturating_duration_since(std::time::Instant::now()),
    )
    .await;
    assert!(
        table.cached_route(&bucket).is_none(),
        "a route read from the store more than the bound ago is still cached"
    );

    // Listed and read after the bound: read (the object is still there), never cached.
    let route = listed_route().await;
    tokio::time::sleep(ttl + ttl / 6).await;
    assert_eq!(read(route).await, 4);
    assert!(
        table.cached_route(&bucket).is_none(),
        "a route older than the bound was cached afresh"
    );
    env.cleanup().await;
}
