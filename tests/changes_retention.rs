//! Retention against PostgreSQL and the embedded store with the real S3: `ALTER TABLE ...
//! SET (retain_for = ...)`, then one archiver pass removes every bucket past it from both
//! tiers (hot buckets, per-bucket objects retired and then deleted by GC, buckets in
//! segments gone from reads at once), keeps every bucket inside it, and shows the removals
//! in `pulpitum_buckets` (before) and `pulpitum_jobs` (after).

mod archiver_support;
mod changes_support;

use std::time::Duration;

use changes_support::*;
use datafusion::arrow::array::{Array, StringArray};
use pulpitum::archive::PayloadFormat;
use pulpitum::archiver::{collect_garbage_with, ArchiverConfig, ArchiverMetrics, GcDelays, Runner};
use pulpitum::model::EventTime;
use pulpitum::store::BucketState;

fn strings(b: &[datafusion::arrow::record_batch::RecordBatch], col: usize) -> Vec<String> {
    b.iter()
        .flat_map(|b| {
            let a = b
                .column(col)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            (0..a.len())
                .map(|i| a.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

async fn retention(embedded: bool) {
    let env = Env::new(if embedded { "chg_ret_sq" } else { "chg_ret_pg" }, embedded).await;
    let t0 = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let now = env.store.now().await.unwrap().as_micros();
    let mut model = Model::new();
    let mut recs = Vec::new();
    let mut old = 0u64;
    // Old history: March and April (archived, then compacted into segments), May
    // (archived, per-bucket objects), June (left hot); two channels, one bucket a day, 3
    // messages each.
    for (ch, day) in (1..=2).flat_map(|ch| [0i64, 1, 31, 32, 62, 63, 93].map(move |d| (ch, d))) {
        for k in 0..3 {
            let id = ch * 10_000 + day * 10 + k;
            recs.push(record(ch, id, t0 + day * DAY_US + k));
        }
        old += 1;
    }
    // Recent rows, inside any retention: 400 and 700 days ago, and yesterday.
    for (i, ago) in [400i64, 700, 1].into_iter().enumerate() {
        let t = now - ago * DAY_US;
        let id = 90_000 + i as i64;
        recs.push(record(1, id, t));
        model.insert((1, id), (t, format!("m{id}")));
    }
    env.store.append_batch(&env.table, &recs).await.unwrap();
    env.archive_before("2021-05-01T00:00:00Z", PayloadFormat::Parquet, true)
        .await;
    env.archive_before("2021-06-01T00:00:00Z", PayloadFormat::Json, false)
        .await;
    let states = env.states().await;
    let per_bucket: Vec<String> = states
        .iter()
        .filter_map(|s| match s {
            BucketState::Archived { object_key, .. } if !object_key.contains("/segments/") => {
                Some(object_key.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(per_bucket.len(), 4, "{states:?}");
    let in_segments: Vec<&String> = states
        .iter()
        .filter_map(|s| match s {
            BucketState::Archived { object_key, .. } if object_key.contains("/segments/") => {
                Some(object_key)
            }
            _ => None,
        })
        .collect();
    assert_eq!(in_segments.len(), 8, "{states:?}");
    let segments: std::collections::BTreeSet<&String> = in_segments.into_iter().collect();
    // A mask on an archived row goes with its bucket.
    assert_eq!(
        env.change("DELETE FROM chat WHERE channel_id = 1 AND id = 10001")
            .await
            .unwrap(),
        1
    );

    // 730 days: the rows of 400 and 700 days ago stay, 2021 goes.
    pulpitum::control::sql(&env.ctx, "ALTER TABLE chat SET (retain_for = '2 years')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let b = env
        .sql("SELECT reason FROM pulpitum_buckets WHERE table_id = 'chat' ORDER BY bucket_start")
        .await
        .unwrap();
    let reasons = strings(&b, 0);
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.starts_with("past retention (retain_for 2 years)"))
            .count() as u64,
        old,
        "{reasons:?}"
    );
    let b = env
        .sql("SELECT retain_for FROM pulpitum_tables WHERE table_id = 'chat'")
        .await
        .unwrap();
    assert_eq!(strings(&b, 0), ["2 years"]);

    let mut c = ArchiverConfig::with_defaults();
    c.cleanup_delay = Duration::ZERO;
    let runner = Runner::new(env.store.clone(), env.archive.clone(), c).unwrap();
    let report = runner.retention_pass().await.unwrap();
    assert_eq!(
        (report.buckets, report.retired, report.failed),
        (old, 4 + segments.len() as u64 + 1, 0),
        "every archived bucket's object retired: 4 per-bucket, each of the {} segments by its \
         last bucket, and March's also by the first bucket to go (channel 1's first day, \
         which held the unrewritten delete): {report:?}",
        segments.len()
    );
    let mut want: Vec<String> = per_bucket
        .iter()
        .cloned()
        .chain(segments.iter().map(|k| k.to_string()))
        .collect();
    want.sort();
    let retired = env.store.retired_objects().await.unwrap();
    let retired: Vec<&String> = retired.iter().map(|r| &r.object_key).collect();
    // (The compaction before retired the per-bucket objects it replaced, too.)
    for k in &want {
        assert!(retired.contains(&k), "{k} not retired: {retired:?}");
    }
    assert_same(&env.dump().await, &model, "after retention");
    // A second pass finds nothing.
    assert_eq!(runner.retention_pass().await.unwrap().buckets, 0);
    let b = env
        .sql("SELECT kind, outcome FROM pulpitum_jobs WHERE kind = 'retention'")
        .await
        .unwrap();
    let outcomes = strings(&b, 1);
    assert_eq!(outcomes.len() as u64, old);
    assert!(outcomes.iter().all(|o| o == "expired"), "{outcomes:?}");

    // GC inside the retirement delay deletes nothing retention retired: a hot-store backup
    // from before it still finds every object it names, segments included (they were once
    // unreferenced orphans, deleted after the orphan delay alone).
    let before_gc: Vec<String> = env
        .archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert!(before_gc.iter().any(|k| k.contains("/segments/")));
    collect_garbage_with(
        &*env.store,
        &env.archive,
        GcDelays {
            orphans: Duration::ZERO,
            retired: Duration::from_secs(3600),
            erased: Duration::from_secs(3600),
        },
        &ArchiverMetrics::default(),
    )
    .await
    .unwrap();
    let kept: Vec<String> = env
        .archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(
        kept, before_gc,
        "GC inside the retirement delay deleted retired objects"
    );

    // GC with no delays deletes the retired per-bucket objects and the segments no route
    // references any more.
    collect_garbage_with(
        &*env.store,
        &env.archive,
        GcDelays {
            orphans: Duration::ZERO,
            retired: Duration::ZERO,
            erased: Duration::ZERO,
        },
        &ArchiverMetrics::default(),
    )
    .await
    .unwrap();
    let left: Vec<String> = env
        .archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert!(
        left.iter().all(|k| !k.contains("day:2021-")),
        "2021 objects left: {left:?}"
    );
    assert!(env.store.retired_objects().await.unwrap().is_empty());
}

/// Retention that takes the first days of a compacted window and leaves the rest: the
/// window's segment no longer holds a route for every bucket in it, so a query across
/// channels (which reads a segment whole from its manifest only while every bucket it holds
/// is routed there) must read the rest bucket by bucket and answer without the expired days.
async fn part_of_a_compacted_window(embedded: bool) {
    let env = Env::new(
        if embedded {
            "chg_part_sq"
        } else {
            "chg_part_pg"
        },
        embedded,
    )
    .await;
    let t0 = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let now = env.store.now().await.unwrap().as_micros();
    let mut model = Model::new();
    let mut recs = Vec::new();
    // Three channels, March 2021's first four days, 3 messages a day.
    for ch in 1..=3i64 {
        for day in 0..4i64 {
            for k in 0..3 {
                let (id, t) = (ch * 10_000 + day * 10 + k, t0 + day * DAY_US + k);
                recs.push(record(ch, id, t));
                model.insert((ch, id), (t, format!("m{id}")));
            }
        }
    }
    env.store.append_batch(&env.table, &recs).await.unwrap();
    env.archive_before("2021-04-01T00:00:00Z", PayloadFormat::Parquet, true)
        .await;
    let states = env.states().await;
    assert!(
        states.iter().all(|s| matches!(s,
            BucketState::Archived { object_key, .. } if object_key.contains("/segments/"))),
        "{states:?}"
    );
    let (from, to) = (
        EventTime::from_micros(t0).unwrap(),
        EventTime::from_micros(t0 + 31 * DAY_US - 1).unwrap(),
    );
    let listed = || async {
        let listing = env.store.list_across(&env.table, from, to).await.unwrap();
        let listing = listing.expect("segment routes");
        let n = (listing.segments.len(), listing.buckets.len());
        (n, format!("{listing:?}"))
    };
    let (n, listing) = listed().await;
    assert_eq!(
        n,
        (1, 0),
        "the compacted month is one whole segment: {listing}"
    );
    assert_same(&env.dump().await, &model, "compacted");

    // Retain whole days back to the end of March 1st, rounded down: the bound (now minus
    // that) falls inside March 2nd, so only the buckets of March 1st end before it.
    let first_end = t0 + DAY_US;
    let days = (now - first_end) / DAY_US;
    let sql = format!("ALTER TABLE chat SET (retain_for = '{days} days')");
    pulpitum::control::sql(&env.ctx, &sql)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut c = ArchiverConfig::with_defaults();
    c.cleanup_delay = Duration::ZERO;
    let runner = Runner::new(env.store.clone(), env.archive.clone(), c).unwrap();
    let report = runner.retention_pass().await.unwrap();
    assert_eq!(
        report.buckets, 3,
        "the first day of each channel: {report:?}"
    );
    model.retain(|(_, id), _| (id % 10_000) / 10 != 0);
    let (n, listing) = listed().await;
    assert_eq!(
        n,
        (0, 9),
        "the segment holds 12 buckets, 9 still routed: listed one by one: {listing}"
    );
    assert_same(&env.dump().await, &model, "after the first day expired");
    let b = env.sql("SELECT count(*) FROM chat").await.unwrap();
    let n = b[0]
        .column(0)
        .as_any()
        .downcast_ref::<datafusion::arrow::array::Int64Array>()
        .expect("count(*) is Int64")
        .value(0);
    assert_eq!(
        n, 27,
        "count(*) across channels after the first day expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_of_part_of_a_compacted_window_on_postgres() {
    part_of_a_compacted_window(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_of_part_of_a_compacted_window_embedded() {
    part_of_a_compacted_window(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_removes_whole_buckets_from_both_tiers_on_postgres() {
    retention(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_removes_whole_buckets_from_both_tiers_embedded() {
    retention(true).await;
}
