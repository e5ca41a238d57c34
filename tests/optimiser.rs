//! What the scan tells DataFusion's optimiser, against PostgreSQL and the embedded store
//! with the real S3, over segments and per-bucket objects:
//!
//! - `count(*)` answered from manifests: a scan of whole archived buckets without delete
//!   records states its exact row count, DataFusion answers the aggregate without reading a
//!   payload, and every scan that is not certain (a bucket cut by the time bounds, a bound
//!   on `id`, a hot bucket, a filter on the body, a delete) reads its rows instead;
//! - a TopK across channels skips the buckets its filter rejects, and still returns the
//!   rows of buckets that straddle its threshold (several channels with rows on the same
//!   day, at the same instants).
//!
//! Each answer is compared with the rows the test wrote.

mod archiver_support;
mod changes_support;

use changes_support::*;
use datafusion::arrow::array::{Array, Int64Array, TimestampMicrosecondArray};
use datafusion::arrow::util::pretty::pretty_format_batches;
use std::sync::Arc;

use datafusion::physical_plan::{displayable, ExecutionPlan};
use pulpitum::archive::PayloadFormat;
use pulpitum::model::{EventTime, Record};
use pulpitum::provider::PulpitumScanExec;
use pulpitum::store::BucketState;

/// Ten messages a day per channel: days 0 to 3 in March 2021 (a window complete once they
/// are archived), days 4 and 5 in April (left hot). Message `i` of a day is `i` seconds
/// after midnight.
fn rows(channels: i64) -> (Vec<Record>, Model) {
    let base = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let mut out = Vec::new();
    let mut model = Model::new();
    for ch in 1..=channels {
        for d in 0..6i64 {
            let day = if d >= 4 { d + 31 } else { d };
            for i in 0..10i64 {
                let id = ch * 1_000 + d * 10 + i;
                let t = base + day * DAY_US + i * 1_000_000;
                let content = format!("c{ch} d{d} m{i}");
                out.push(message(ch, id, t, &content));
                model.insert((ch, id), (t, content));
            }
        }
    }
    (out, model)
}

/// The count `sql` answers, and whether its plan still reads rows (a Pulpitum scan left
/// under the aggregate) or was answered from the scan's stated count.
async fn answer(env: &Env, sql: &str) -> (i64, bool) {
    let df = env.ctx.sql(sql).await.unwrap();
    let plan = df.clone().create_physical_plan().await.unwrap();
    let text = displayable(plan.as_ref()).indent(true).to_string();
    let batches = df.collect().await.unwrap();
    let c = batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("count(*) is Int64");
    assert_eq!(c.len(), 1, "{sql}");
    (c.value(0), text.contains("PulpitumScanExec"))
}

/// The stated row count of every Pulpitum scan in `plan`.
fn scans_of(plan: &Arc<dyn ExecutionPlan>) -> Vec<Option<u64>> {
    let mut out: Vec<Option<u64>> = plan
        .downcast_ref::<PulpitumScanExec>()
        .map(|s| s.exact_rows())
        .into_iter()
        .collect();
    for child in plan.children() {
        out.extend(scans_of(child));
    }
    out
}

/// Rows of the model that `keep` selects, by (channel, id, time in µs since the start).
fn expected(model: &Model, keep: impl Fn(i64, i64, i64) -> bool) -> i64 {
    let base = EventTime::parse_rfc3339(START).unwrap().as_micros();
    model
        .iter()
        .filter(|((ch, id), (t, _))| keep(*ch, *id, t - base))
        .count() as i64
}

async fn optimised(label: &str, embedded: bool, format: PayloadFormat, segments: bool) {
    let env = Env::new(label, embedded).await;
    let (records, mut model) = rows(3);
    env.store.append_batch(&env.table, &records).await.unwrap();
    env.archive_before("2021-03-05T00:00:00Z", format, segments)
        .await;
    let states = env.states().await;
    let archived = states
        .iter()
        .filter(|s| matches!(s, BucketState::Archived { .. }))
        .count();
    assert_eq!(archived, 12, "{states:?}");
    assert_eq!(
        states.iter().any(|s| matches!(s, BucketState::Archived { object_key, .. } if object_key.contains("/segments/"))),
        segments,
        "{states:?}"
    );
    let march = "timestamp < '2021-03-05T00:00:00Z'";
    let days_1_2 = "timestamp >= '2021-03-02T00:00:00Z' AND timestamp < '2021-03-04T00:00:00Z'";

    // Whole archived buckets: from the manifests, and right.
    let q = format!("SELECT count(*) FROM chat WHERE {march}");
    let (n, scans) = answer(&env, &q).await;
    assert_eq!(n, expected(&model, |_, _, t| t < 4 * DAY_US), "{q}");
    assert_eq!(n, 120);
    assert!(
        !scans,
        "whole archived buckets are counted from manifests: {q}"
    );
    let q = format!("SELECT count(*) FROM chat WHERE channel_id = 2 AND {days_1_2}");
    let (n, scans) = answer(&env, &q).await;
    assert_eq!(n, 20, "{q}");
    assert!(!scans, "{q}");
    // The channel column is a key: its aggregates need no value either.
    let q = format!("SELECT count(*), count(channel_id) FROM chat WHERE {march}");
    assert_eq!(answer(&env, &q).await.0, 120, "{q}");

    // A scan that takes any column states nothing: a page or a TopK without the body, a
    // group by, would otherwise pay the check (and every per-bucket manifest) for a count
    // nothing uses.
    for q in [
        format!("SELECT channel_id, timestamp, id FROM chat WHERE {march}"),
        format!("SELECT channel_id, count(*) FROM chat WHERE {march} GROUP BY channel_id"),
    ] {
        let plan = env
            .ctx
            .sql(&q)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let scans = scans_of(&plan);
        assert!(!scans.is_empty(), "{q}");
        assert!(scans.iter().all(|r| r.is_none()), "{q}: {scans:?}");
    }

    // Not certain, so read: a bucket cut by the bounds (day 1 up to 00:00:05), ...
    let q = "SELECT count(*) FROM chat WHERE timestamp < '2021-03-02T00:00:05Z'";
    let (n, scans) = answer(&env, q).await;
    assert_eq!(n, expected(&model, |_, _, t| t < DAY_US + 5_000_000), "{q}");
    assert!(scans, "{q}");
    // ... a bound on `id` (a row filter), ...
    let q = format!("SELECT count(*) FROM chat WHERE {march} AND id >= 1015");
    let (n, scans) = answer(&env, &q).await;
    assert_eq!(
        n,
        expected(&model, |_, id, t| t < 4 * DAY_US && id >= 1015),
        "{q}"
    );
    assert!(scans, "{q}");
    // ... hot buckets, ...
    let (n, scans) = answer(&env, "SELECT count(*) FROM chat").await;
    assert_eq!(n, 180);
    assert!(scans);
    // ... and a filter on the body.
    let q = format!("SELECT count(*) FROM chat WHERE {march} AND content LIKE '%m1'");
    let (n, scans) = answer(&env, &q).await;
    assert_eq!(n, 12, "{q}");
    assert!(scans, "{q}");

    // A delete of an archived row in channel 1's day 0: scans of that bucket read again
    // (and see it); channel 2's buckets have no delete and are still counted from
    // manifests, as they are after an edit, which keeps its row.
    assert_eq!(
        env.change("DELETE FROM chat WHERE channel_id = 1 AND id = 1003")
            .await
            .unwrap(),
        1
    );
    model.remove(&(1, 1003));
    assert_eq!(
        env.change("UPDATE chat SET content = 'edited' WHERE channel_id = 2 AND id = 2011")
            .await
            .unwrap(),
        1
    );
    let q = format!("SELECT count(*) FROM chat WHERE {march}");
    let (n, scans) = answer(&env, &q).await;
    assert_eq!(n, 119, "{q}");
    assert_eq!(n, expected(&model, |_, _, t| t < 4 * DAY_US), "{q}");
    assert!(scans, "a bucket with a delete is read: {q}");
    let q = format!("SELECT count(*) FROM chat WHERE channel_id = 2 AND {march}");
    let (n, scans) = answer(&env, &q).await;
    assert_eq!(n, 40, "{q}");
    assert!(!scans, "an edit keeps the count: {q}");
    let q = format!("SELECT count(*) FROM chat WHERE channel_id = 1 AND {days_1_2}");
    let (n, scans) = answer(&env, &q).await;
    assert_eq!(n, 20, "{q}");
    assert!(!scans, "channel 1's other days have no delete: {q}");

    // A group by states nothing for its groups; it still reads and answers right.
    let b = env
        .sql(&format!(
            "SELECT channel_id, count(*) AS n FROM chat WHERE {march} GROUP BY channel_id ORDER BY channel_id"
        ))
        .await
        .unwrap();
    assert_eq!(
        pretty_format_batches(&b).unwrap().to_string(),
        [
            "+------------+----+",
            "| channel_id | n  |",
            "+------------+----+",
            "| 1          | 39 |",
            "| 2          | 40 |",
            "| 3          | 40 |",
            "+------------+----+",
        ]
        .join("\n")
    );

    // The newest and oldest rows across channels, on one scan partition (its rows in no
    // time order, so only the TopK's filter skips anything). Every channel has rows at the
    // same instants of the same days, so the buckets of the channels read after the first
    // straddle the TopK's threshold and must be read.
    env.sql("SET datafusion.execution.target_partitions = 1")
        .await
        .unwrap();
    let base = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let mut by_time: Vec<(i64, i64, i64)> = model
        .iter()
        .map(|((ch, id), (t, _))| (t - base, *id, *ch))
        .collect();
    by_time.sort();
    for (sql, want) in [
        (
            format!("SELECT channel_id, timestamp, id FROM chat WHERE {march} ORDER BY timestamp DESC, id DESC LIMIT 5"),
            by_time.iter().rev().filter(|(t, ..)| *t < 4 * DAY_US).take(5).copied().collect::<Vec<_>>(),
        ),
        (
            "SELECT channel_id, timestamp, id FROM chat ORDER BY timestamp DESC, id DESC LIMIT 5".to_string(),
            by_time.iter().rev().take(5).copied().collect(),
        ),
        (
            "SELECT channel_id, timestamp, id FROM chat WHERE timestamp >= '2021-03-02T00:00:03Z' ORDER BY timestamp, id LIMIT 5".to_string(),
            by_time.iter().filter(|(t, ..)| *t >= DAY_US + 3_000_000).take(5).copied().collect(),
        ),
    ] {
        let got: Vec<(i64, i64, i64)> = env
            .sql(&sql)
            .await
            .unwrap()
            .iter()
            .flat_map(|b| {
                let ch = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().clone();
                let t = b
                    .column(1)
                    .as_any()
                    .downcast_ref::<TimestampMicrosecondArray>()
                    .unwrap()
                    .clone();
                let id = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap().clone();
                (0..b.num_rows())
                    .map(move |i| (t.value(i) - base, id.value(i), ch.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(got, want, "{sql}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_segments() {
    optimised("opt_pg_seg", false, PayloadFormat::Parquet, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_parquet_objects() {
    optimised("opt_pg_parquet", false, PayloadFormat::Parquet, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_json_segments() {
    optimised("opt_sq_seg", true, PayloadFormat::Json, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_json_objects() {
    optimised("opt_sq_json", true, PayloadFormat::Json, false).await;
}
