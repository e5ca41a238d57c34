//! Segment routes against a model, through a whole lifecycle (docs/segments.md, 7a): 6
//! channels over 70 days, archived and compacted three segments a window, then masks and
//! their rewrite, a bucket emptied and dropped, a channel moved into another grouping,
//! late rows compacted into another segment of the same windows, retention ending inside a
//! compacted month, GC. After every step, queries that name no channel (the listing across
//! partitions: whole dump, `count(*)`, group by, the latest rows, ten time ranges cutting
//! days and windows) must answer the model, in the warm session and a fresh one, on both
//! stores and both payload formats. Written by the break-it review of the change.
mod archiver_support;
mod changes_support;

use std::sync::Arc;
use std::time::Duration;

use changes_support::*;
use datafusion::arrow::array::{Array, Int64Array};
use datafusion::prelude::SessionContext;
use pulpitum::archive::{ArchiveStore, PayloadFormat};
use pulpitum::archiver::{collect_garbage_with, ArchiverConfig, ArchiverMetrics, GcDelays, Runner};
use pulpitum::model::EventTime;
use pulpitum::session::{session, SessionOptions};
use tokio_util::sync::CancellationToken;

fn us(rfc: &str) -> i64 {
    EventTime::parse_rfc3339(rfc).unwrap().as_micros()
}

fn rfc(t: i64) -> String {
    EventTime::from_micros(t)
        .unwrap()
        .to_datetime()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn config(before: Option<&str>, format: PayloadFormat, max_parts: usize) -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = before.map(|b| EventTime::parse_rfc3339(b).unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.format = format;
    c.compaction = true;
    c.compact_after = Duration::ZERO;
    c.concurrency = 2;
    c.segment_max_partitions = max_parts;
    c
}

async fn archive_and_compact(env: &Env, before: &str, format: PayloadFormat, max_parts: usize) {
    let runner = Runner::new(
        env.store.clone(),
        env.archive.clone(),
        config(Some(before), format, max_parts),
    )
    .unwrap();
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let r = runner.compact_pass().await.unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
}

async fn compact(env: &Env, max_parts: usize) {
    let runner = Runner::new(
        env.store.clone(),
        env.archive.clone(),
        config(None, PayloadFormat::Parquet, max_parts),
    )
    .unwrap();
    let r = runner.compact_pass().await.unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
}

async fn gc(env: &Env) {
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
}

async fn cold_ctx(env: &Env) -> SessionContext {
    let archive = Arc::new(ArchiveStore::from_url(&env.archive_url).unwrap());
    session(
        env.store.clone(),
        archive,
        SessionOptions {
            page_rows: 7,
            ..SessionOptions::default()
        },
    )
    .await
    .unwrap()
}

fn count_any(b: &[datafusion::arrow::record_batch::RecordBatch]) -> u64 {
    let c = b[0].column(0);
    if let Some(x) = c.as_any().downcast_ref::<Int64Array>() {
        return x.value(0) as u64;
    }
    c.as_any()
        .downcast_ref::<datafusion::arrow::array::UInt64Array>()
        .unwrap()
        .value(0)
}

fn rows_of(b: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for batch in b {
        let a = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let c = batch.column(1);
        for i in 0..batch.num_rows() {
            let v = if let Some(x) = c.as_any().downcast_ref::<Int64Array>() {
                x.value(i)
            } else {
                c.as_any()
                    .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                    .unwrap()
                    .value(i) as i64
            };
            out.push((a.value(i), v));
        }
    }
    out
}

/// Compares every cross-channel query shape with the model; panics naming the first
/// difference.
async fn check_ctx(ctx: &SessionContext, model: &Model, ranges: &[(i64, i64)], what: &str) {
    assert_same(&dump(ctx).await, model, &format!("{what}: dump"));
    let b = run(ctx, "SELECT count(*) FROM chat").await.unwrap();
    assert_eq!(count_any(&b), model.len() as u64, "{what}: count(*)");
    // Group by channel.
    let b = run(
        ctx,
        "SELECT channel_id, count(*) FROM chat GROUP BY channel_id ORDER BY channel_id",
    )
    .await
    .unwrap();
    let mut want: std::collections::BTreeMap<i64, i64> = Default::default();
    for (ch, _) in model.keys() {
        *want.entry(*ch).or_default() += 1;
    }
    let got: std::collections::BTreeMap<i64, i64> = rows_of(&b).into_iter().collect();
    assert_eq!(got, want, "{what}: group by");
    // Latest rows across channels.
    let b = run(
        ctx,
        "SELECT channel_id, id FROM chat ORDER BY timestamp DESC, channel_id DESC, id DESC LIMIT 5",
    )
    .await
    .unwrap();
    let mut all: Vec<(i64, i64, i64)> = model.iter().map(|((c, i), (t, _))| (*t, *c, *i)).collect();
    all.sort();
    all.reverse();
    let want: Vec<(i64, i64)> = all.iter().take(5).map(|(_, c, i)| (*c, *i)).collect();
    assert_eq!(rows_of(&b), want, "{what}: top 5");
    // Time ranges.
    for &(a, z) in ranges {
        let sql = format!(
            "SELECT channel_id, id, CAST(timestamp AS BIGINT), content FROM chat \
             WHERE timestamp >= '{}' AND timestamp < '{}' ORDER BY channel_id, id",
            rfc(a),
            rfc(z)
        );
        let b = run(ctx, &sql).await.unwrap();
        // (Panics on a row read twice.)
        let got = model_of(&b);
        let want: Model = model
            .iter()
            .filter(|(_, (t, _))| *t >= a && *t < z)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_same(&got, &want, &format!("{what}: {sql}"));
        let sql = format!(
            "SELECT count(*) FROM chat WHERE timestamp >= '{}' AND timestamp < '{}'",
            rfc(a),
            rfc(z)
        );
        let b = run(ctx, &sql).await.unwrap();
        assert_eq!(count_any(&b), want.len() as u64, "{what}: {sql}");
    }
}

async fn check(env: &Env, model: &Model, ranges: &[(i64, i64)], what: &str) {
    check_ctx(&env.ctx, model, ranges, &format!("{what} (warm)")).await;
    let cold = cold_ctx(env).await;
    check_ctx(&cold, model, ranges, &format!("{what} (cold)")).await;
}

fn ranges() -> Vec<(i64, i64)> {
    let h = 3_600_000_000i64;
    let d = DAY_US;
    let mar = us("2021-03-01T00:00:00Z");
    let apr = us("2021-04-01T00:00:00Z");
    let may = us("2021-05-01T00:00:00Z");
    vec![
        (mar, mar + d),
        (mar + 4 * d + 5 * h, mar + 4 * d + 20 * h),
        (mar + 10 * d, mar + 11 * d),
        (mar + 30 * d + 12 * h, apr + 12 * h),
        (apr - 1, apr + 1),
        (apr + 3 * d, apr + 20 * d),
        (mar + 15 * d, may + 5 * d),
        (may - 2 * d, may + 10 * d),
        (mar - 10 * d, mar + 2 * d),
        (us("2020-01-01T00:00:00Z"), us("2030-01-01T00:00:00Z")),
    ]
}

fn id_of(ch: i64, day: i64, k: i64) -> i64 {
    ch * 100_000 + day * 10 + k
}

/// 6 channels, every day from March 1st to May 9th 2021, two rows a day.
fn seed(
    env_model: &mut Model,
    channels: std::ops::RangeInclusive<i64>,
) -> Vec<pulpitum::model::Record> {
    let mar = us("2021-03-01T00:00:00Z");
    let mut recs = Vec::new();
    for ch in channels {
        for day in 0..70i64 {
            for (k, hour) in [(0i64, 1i64), (1, 13)] {
                let id = id_of(ch, day, k);
                let t = mar + day * DAY_US + hour * 3_600_000_000;
                recs.push(record(ch, id, t));
                env_model.insert((ch, id), (t, format!("m{id}")));
            }
        }
    }
    recs
}

async fn lifecycle(embedded: bool, format: PayloadFormat) {
    let label = if embedded {
        "brk_life_sq"
    } else {
        "brk_life_pg"
    };
    let env = Env::new(label, embedded).await;
    let ranges = ranges();
    let mut model = Model::new();
    let recs = seed(&mut model, 1..=6);
    env.store.append_batch(&env.table, &recs).await.unwrap();
    check(&env, &model, &ranges, "hot").await;

    archive_and_compact(&env, "2021-05-05T00:00:00Z", format, 2).await;
    check(&env, &model, &ranges, "compacted, 3 segments a window").await;

    // Deletes in segments (masks), then updates; then the rewrite.
    let mar = us("2021-03-01T00:00:00Z");
    let n = env
        .change(&format!(
            "DELETE FROM chat WHERE channel_id = 1 AND timestamp >= '{}' AND timestamp < '{}'",
            rfc(mar + 3 * DAY_US),
            rfc(mar + 6 * DAY_US)
        ))
        .await
        .unwrap();
    assert_eq!(n, 6);
    model.retain(|(ch, id), _| !(*ch == 1 && (3..6).contains(&((id % 100_000) / 10))));
    let n = env
        .change("UPDATE chat SET content = 'edited' WHERE channel_id = 3 AND id % 7 = 0")
        .await
        .unwrap();
    let mut edited = 0;
    for ((ch, id), v) in model.iter_mut() {
        if *ch == 3 && id % 7 == 0 {
            v.1 = "edited".into();
            edited += 1;
        }
    }
    assert_eq!(n, edited);
    check(&env, &model, &ranges, "masked").await;
    compact(&env, 2).await;
    check(&env, &model, &ranges, "rewritten").await;

    // Every row of one bucket of channel 2 (2021-03-10) deleted: the rewrite drops it.
    let d = mar + 9 * DAY_US;
    let n = env
        .change(&format!(
            "DELETE FROM chat WHERE channel_id = 2 AND timestamp >= '{}' AND timestamp < '{}'",
            rfc(d),
            rfc(d + DAY_US)
        ))
        .await
        .unwrap();
    assert_eq!(n, 2);
    model.retain(|(ch, id), _| !(*ch == 2 && (id % 100_000) / 10 == 9));
    compact(&env, 2).await;
    check(&env, &model, &ranges, "empty bucket dropped").await;

    // Partition moved into a different segment grouping: compaction with 4 partitions.
    let n = env
        .change("DELETE FROM chat WHERE channel_id = 5 AND id % 11 = 0")
        .await
        .unwrap();
    model.retain(|(ch, id), _| !(*ch == 5 && id % 11 == 0));
    assert!(n > 0);
    compact(&env, 4).await;
    check(
        &env,
        &model,
        &ranges,
        "channel 5 rewritten with max 4 partitions",
    )
    .await;

    // Late rows: a new channel inside the compacted windows (hot), then archived and
    // compacted into another segment of the same windows.
    let mut late = Model::new();
    let recs = seed(&mut late, 7..=7);
    let recs: Vec<_> = recs
        .into_iter()
        .filter(|r| r.event_time.as_micros() < us("2021-05-05T00:00:00Z"))
        .collect();
    late.retain(|_, (t, _)| *t < us("2021-05-05T00:00:00Z"));
    env.store.append_batch(&env.table, &recs).await.unwrap();
    model.extend(late);
    check(&env, &model, &ranges, "late channel hot").await;
    archive_and_compact(&env, "2021-05-05T00:00:00Z", format, 2).await;
    check(&env, &model, &ranges, "late channel compacted").await;

    // Retention in the middle of March (bound inside March 8th).
    let now = env.store.now().await.unwrap().as_micros();
    let bound_target = mar + 7 * DAY_US + 12 * 3_600_000_000;
    let days = (now - bound_target) / DAY_US + 1;
    let bound = now - days * DAY_US;
    pulpitum::control::sql(
        &env.ctx,
        &format!("ALTER TABLE chat SET (retain_for = '{days} days')"),
    )
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    let mut c = ArchiverConfig::with_defaults();
    c.cleanup_delay = Duration::ZERO;
    let runner = Runner::new(env.store.clone(), env.archive.clone(), c).unwrap();
    let report = runner.retention_pass().await.unwrap();
    assert_eq!(report.failed, 0, "{report:?}");
    // Buckets (days) ending at or before the bound are gone.
    model.retain(|_, (t, _)| {
        let day_end = (*t - mar).div_euclid(DAY_US) * DAY_US + mar + DAY_US;
        day_end > bound
    });
    check(&env, &model, &ranges, "after retention").await;
    compact(&env, 2).await;
    check(&env, &model, &ranges, "compaction after retention").await;
    gc(&env).await;
    check(&env, &model, &ranges, "after gc").await;
    pulpitum::control::sql(&env.ctx, "ALTER TABLE chat SET (retain_for = '36500 days')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    check(&env, &model, &ranges, "retention lifted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle_pg_parquet() {
    lifecycle(false, PayloadFormat::Parquet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle_sqlite_json() {
    lifecycle(true, PayloadFormat::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle_pg_json() {
    lifecycle(false, PayloadFormat::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle_sqlite_parquet() {
    lifecycle(true, PayloadFormat::Parquet).await;
}
