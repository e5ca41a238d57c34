//! The control plane end to end, against the real PostgreSQL and S3: a policy set from SQL
//! decides exactly which buckets the archiver takes (and in which format), with no restart;
//! a pause set from SQL mid-run with several workers stops new claims at once while claimed
//! buckets finish; a worker killed after its claim leaves an `abandoned` attempt and the
//! takeover is a new row; job history that cannot be written changes nothing else.

mod archiver_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use archiver_support::hooked::Hooked;
use archiver_support::*;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use pulpitum::archive::faults::{FaultLayer, FaultPlan};
use pulpitum::archive::{ArchiveStore, PayloadFormat};
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::TableId;
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{BucketState, HotStore, JobFilter, JobOutcome};
use tokio_util::sync::CancellationToken;

const DAY_US: i64 = 86_400_000_000;

async fn ctx(store: &Arc<dyn HotStore>, archive: &Arc<ArchiveStore>) -> SessionContext {
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    run(
        &ctx,
        "CREATE EXTERNAL TABLE IF NOT EXISTS chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    ctx
}

async fn run(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    pulpitum::control::sql(ctx, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// One message at noon on each of the `days` days before today (UTC) in `channels`
/// channels, by SQL; returns the store's now.
async fn fill(ctx: &SessionContext, store: &dyn HotStore, days: i64, channels: i64) -> i64 {
    let now = store.now().await.unwrap().as_micros();
    let today = now.div_euclid(DAY_US);
    let mut values = Vec::new();
    for back in 1..=days {
        let noon = (today - back) * DAY_US + DAY_US / 2;
        for ch in 1..=channels {
            values.push(format!(
                "({ch}, to_timestamp_micros({noon}), {back}, 'day {back}')"
            ));
        }
    }
    run(
        ctx,
        &format!("INSERT INTO chat VALUES {}", values.join(", ")),
    )
    .await;
    now
}

/// `(bucket_end in µs, state)` of every bucket of `chat`, from the system table.
async fn bucket_states(ctx: &SessionContext) -> BTreeMap<(i64, String), String> {
    let batches = run(
        ctx,
        "SELECT bucket_end, partition, state FROM pulpitum_buckets WHERE table_id = 'chat'",
    )
    .await;
    let mut out = BTreeMap::new();
    for b in &batches {
        let ends = b.column(0).as_primitive::<TimestampMicrosecondType>();
        let parts = b.column(1).as_string::<i32>();
        let states = b.column(2).as_string::<i32>();
        for i in 0..b.num_rows() {
            out.insert(
                (ends.value(i), parts.value(i).to_string()),
                states.value(i).to_string(),
            );
        }
    }
    out
}

fn config() -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    // No ARCHIVER_ELIGIBLE_BEFORE: the default cutoff (January 1 of last year) would hold
    // back every bucket of this test; only the table's policy admits any.
    c.eligible_before = None;
    c.cleanup_delay = Duration::ZERO;
    c.retry = Duration::ZERO;
    c.interval = Duration::from_millis(200);
    c
}

/// `ALTER TABLE chat SET (archive_after = ...)` from SQL: a running archiver takes exactly the
/// buckets the policy names at its next cycle, in the policy's format, and a longer policy
/// set later takes nothing more; the history has one published and one cleaned row per
/// archived bucket, and every row still reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_set_from_sql_archives_exactly_the_buckets_it_names() {
    let db = fresh_database("policy_e2e").await;
    let (store, archive) = open(&db, &fresh_archive_url("policy_e2e")).await;
    let ctx = ctx(&store, &archive).await;
    let now = fill(&ctx, &*store, 10, 2).await;
    let runner = Runner::new(store.clone(), archive.clone(), config())
        .unwrap()
        .with_worker("policy-test");
    let shutdown = CancellationToken::new();

    // No policy: nothing is eligible under the default cutoff.
    let r = runner.drain(&shutdown, &|_, _| {}).await.unwrap();
    assert_eq!(r.totals.archived, 0, "{r:?}");

    let answer = run(
        &ctx,
        "ALTER TABLE chat SET (archive_after = '7 days', format = 'json')",
    )
    .await;
    assert_eq!(answer[0].num_rows(), 1);
    let r = runner.drain(&shutdown, &|_, _| {}).await.unwrap();
    let expect = |after_days: i64| -> usize {
        (1..=10i64)
            .filter(|back| {
                (now.div_euclid(DAY_US) - back + 1) * DAY_US <= now - after_days * DAY_US
            })
            .count()
            * 2
    };
    assert_eq!(r.totals.archived, expect(7), "{r:?}");
    for ((end, _), state) in bucket_states(&ctx).await {
        let should = end <= now - 7 * DAY_US;
        assert_eq!(state == "archived", should, "bucket ending {end}: {state}");
    }
    // The policy's format, not the archiver's (parquet).
    for m in store
        .list_buckets(&TableId::new("chat").unwrap(), &Default::default())
        .await
        .unwrap()
    {
        if let BucketState::Archived { object_key, .. } = &m.state {
            let manifest = archive.read_manifest(object_key, &m.id).await.unwrap();
            assert_eq!(manifest.format, PayloadFormat::Json);
        }
    }

    // A shorter policy, the same runner: the next cycle takes the difference.
    run(&ctx, "ALTER TABLE chat SET (archive_after = '3 days')").await;
    let r = runner.drain(&shutdown, &|_, _| {}).await.unwrap();
    assert_eq!(r.totals.archived, expect(3) - expect(7), "{r:?}");
    // Reset: the default cutoff again, nothing more.
    run(&ctx, "ALTER TABLE chat RESET (archive_after)").await;
    let r = runner.drain(&shutdown, &|_, _| {}).await.unwrap();
    assert_eq!(r.totals.archived, 0, "{r:?}");

    let jobs = store.jobs(&JobFilter::default()).await.unwrap();
    let count = |o: JobOutcome| jobs.iter().filter(|j| j.outcome == o).count();
    assert_eq!(count(JobOutcome::Published), expect(3));
    assert_eq!(count(JobOutcome::Cleaned), expect(3));
    assert_eq!(jobs.len(), 2 * expect(3), "{jobs:?}");
    assert!(jobs.iter().all(|j| j.worker == "policy-test"));
    let published_rows: u64 = jobs
        .iter()
        .filter(|j| j.outcome == JobOutcome::Published)
        .map(|j| j.rows.unwrap())
        .sum();
    assert_eq!(published_rows as usize, expect(3));
    let n = run(&ctx, "SELECT count(*) FROM chat").await;
    assert_eq!(n[0].column(0).as_primitive::<Int64Type>().value(0), 20);
    let joined = run(
        &ctx,
        "SELECT j.outcome, count(*) FROM pulpitum_jobs j JOIN pulpitum_tables t \
         ON j.table_id = t.table_id WHERE t.format = 'json' GROUP BY j.outcome ORDER BY 1",
    )
    .await;
    assert_eq!(joined[0].num_rows(), 2);
}

/// `SYSTEM STOP MOVES chat` mid-run with three workers: from the pause on, no bucket is
/// claimed (the claiming statement reads the pause), buckets already claimed finish, and the
/// rest are reported paused; `SYSTEM START MOVES chat` lets the workers finish, no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_mid_run_stops_new_claims_at_once() {
    let db = fresh_database("pause_e2e").await;
    let (store, archive) = open(&db, &fresh_archive_url("pause_e2e")).await;
    let ctx = ctx(&store, &archive).await;
    fill(&ctx, &*store, 30, 1).await;
    run(&ctx, "ALTER TABLE chat SET (archive_after = '0 days')").await;
    // Every object-store call slowed, so the run is long enough to pause in the middle.
    let slow = Arc::new(archive.with_faults(FaultLayer::new(
        FaultPlan::new(1).latency(Duration::from_millis(150)),
    )));
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..3 {
        let mut c = config();
        c.concurrency = 1;
        c.scan_limit = 4;
        let runner = Runner::new(store.clone(), slow.clone(), c)
            .unwrap()
            .with_worker(format!("w{w}"));
        let stop = shutdown.clone();
        workers.push(tokio::spawn(async move { runner.run(stop).await }));
    }
    let archived = |states: &BTreeMap<(i64, String), String>| {
        states.values().filter(|s| *s == "archived").count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while archived(&bucket_states(&ctx).await) < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers made no progress"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    run(&ctx, "SYSTEM STOP MOVES chat").await;
    let paused_at = store.now().await.unwrap();
    // A worker writes its job's start row in a statement of its own after its claim
    // commits, so a claim committed just before the pause can carry a start time after it
    // (seen in CI). Such a bucket was no longer hot when the pause returned.
    let claimed_before: std::collections::BTreeSet<pulpitum::model::BucketId> = store
        .list_buckets(
            &TableId::new("chat").unwrap(),
            &pulpitum::store::BucketFilter::default(),
        )
        .await
        .unwrap()
        .into_iter()
        .filter(|m| !matches!(m.state, BucketState::Hot))
        .map(|m| m.id)
        .collect();
    // Claims committed before the pause finish (or defer) within a few slowed uploads.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let settled = bucket_states(&ctx).await;
    assert!(
        settled.values().all(|s| s != "archiving"),
        "a claimed bucket neither finished nor deferred: {settled:?}"
    );
    let hot = settled.values().filter(|s| *s == "hot").count();
    assert!(hot > 0, "the run finished before the pause: {settled:?}");
    // Several more cycles: nothing new is claimed, and no job started after the pause.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(bucket_states(&ctx).await, settled);
    let late = store
        .jobs(&JobFilter {
            since: Some(paused_at),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        late.iter()
            .all(|j| j.kind != pulpitum::store::JobKind::Archive
                || claimed_before.contains(&j.bucket)),
        "archive jobs of buckets claimed after the pause: {late:?}"
    );
    let reasons = run(
        &ctx,
        "SELECT DISTINCT reason FROM pulpitum_buckets WHERE table_id = 'chat' AND state = 'hot'",
    )
    .await;
    let reasons: Vec<String> = reasons
        .iter()
        .flat_map(|b| {
            let c = b.column(0).as_string::<i32>();
            (0..b.num_rows())
                .map(|i| c.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].starts_with("paused: this table"), "{reasons:?}");
    let paused = run(
        &ctx,
        "SELECT paused FROM pulpitum_tables WHERE table_id = 'chat'",
    )
    .await;
    assert!(paused[0].column(0).as_boolean().value(0));

    run(&ctx, "SYSTEM START MOVES chat").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while archived(&bucket_states(&ctx).await) < 30 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers did not resume"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    let jobs = store.jobs(&JobFilter::default()).await.unwrap();
    let workers: std::collections::BTreeSet<&str> =
        jobs.iter().map(|j| j.worker.as_str()).collect();
    assert!(workers.len() > 1, "one worker did everything: {workers:?}");
}

/// A worker killed right after its claim (the process aborts) leaves its attempt `running`;
/// the worker that takes the bucket over after the lease records it `abandoned` and its own
/// attempt as a new row that ends `published`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_attempt_is_recorded_abandoned_and_the_takeover_is_a_new_row() {
    let db = fresh_database("abandon_e2e").await;
    let url = fresh_archive_url("abandon_e2e");
    let (store, archive) = open(&db, &url).await;
    let ctx = ctx(&store, &archive).await;
    fill(&ctx, &*store, 3, 1).await;
    run(&ctx, "ALTER TABLE chat SET (archive_after = '0 days')").await;
    let status = archiver(&db, &url)
        .args([
            "--once",
            "--lease-seconds",
            "1",
            "--concurrency",
            "1",
            "--no-gc",
        ])
        .args(["--scan-limit", "1"])
        .env("PULPITUM_FAILPOINT", "after_claim")
        .status()
        .await
        .unwrap();
    assert!(
        !status.success(),
        "the fail point should have aborted the worker"
    );
    let first = store.jobs(&JobFilter::default()).await.unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].outcome, JobOutcome::Running);
    let crashed = first[0].bucket.clone();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let runner = Runner::new(store.clone(), archive.clone(), config())
        .unwrap()
        .with_worker("taker");
    let r = runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!(r.totals.archived, 3, "{r:?}");
    let mut mine: Vec<_> = store
        .jobs(&JobFilter::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.bucket == crashed && j.kind == pulpitum::store::JobKind::Archive)
        .collect();
    mine.sort_by_key(|j| j.generation);
    let summary: Vec<(i64, JobOutcome, bool)> = mine
        .iter()
        .map(|j| (j.generation, j.outcome, j.worker == "taker"))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, JobOutcome::Abandoned, false),
            (2, JobOutcome::Published, true)
        ]
    );
    let shown = run(
        &ctx,
        "SELECT generation, outcome FROM pulpitum_jobs \
         WHERE table_id = 'chat' AND kind = 'archive' AND outcome = 'abandoned'",
    )
    .await;
    assert_eq!(shown.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
}

/// Job history that cannot be written (every write fails) changes nothing else: the bucket is
/// published and cleaned, and the failures are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_history_writes_never_fail_the_archiving() {
    let db = fresh_database("history_fail").await;
    let (store, archive) = open(&db, &fresh_archive_url("history_fail")).await;
    let ctx = ctx(&store, &archive).await;
    fill(&ctx, &*store, 2, 1).await;
    run(&ctx, "ALTER TABLE chat SET (archive_after = '0 days')").await;
    let hooked = Hooked::new(store.clone());
    hooked.fail_history_writes();
    let runner = Runner::new(hooked.clone(), archive.clone(), config()).unwrap();
    let r = runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!(
        (r.totals.archived, r.totals.cleaned, r.totals.failed),
        (2, 2, 0),
        "{r:?}"
    );
    for m in store
        .list_buckets(&TableId::new("chat").unwrap(), &Default::default())
        .await
        .unwrap()
    {
        assert!(matches!(
            m.state,
            BucketState::Archived {
                hot_deleted: true,
                ..
            }
        ));
    }
    assert!(store.jobs(&JobFilter::default()).await.unwrap().is_empty());
    assert_eq!(runner.metrics().history_write_failures.get(), 8);
}
