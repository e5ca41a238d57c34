//! The runner's own promises against the real PostgreSQL and S3: leases renewed through long
//! uploads and counted from when the claim was sent, a worker that cannot renew stops and
//! another finishes, the default cutoff moves with the clock, `--once` drains everything
//! eligible without waiting for cleanup delays, and SIGTERM stops the daemon promptly.

mod archiver_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archiver_support::hooked::{Hooked, Renewal};
use archiver_support::*;
use chrono::{TimeZone, Utc};
use pulpitum::archive::faults::{FaultLayer, FaultPlan};
use pulpitum::archive::ArchiveStore;
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::{
    BucketId, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use pulpitum::store::{BucketState, HotStore, JobFilter, TableDefinition};
use tokio_util::sync::CancellationToken;

const DAY_US: i64 = 86_400_000_000;

/// `days` daily buckets of `rows` rows each, from `first_day`, in table `chat`.
async fn buckets(
    store: &dyn HotStore,
    first_day: &str,
    days: i64,
    rows: usize,
) -> Vec<(BucketId, Vec<Record>)> {
    let table = TableId::new("chat").unwrap();
    let strategy = BucketStrategy::CalendarDayUtc;
    store
        .register_table(&TableDefinition::new(table.clone(), strategy, "chat"))
        .await
        .unwrap();
    let base = EventTime::parse_rfc3339(&format!("{first_day}T00:00:00Z"))
        .unwrap()
        .as_micros();
    let mut out = Vec::new();
    for d in 0..days {
        let records: Vec<Record> = (0..rows)
            .map(|i| Record {
                partition_key: PartitionKey::new(vec![7]).unwrap(),
                event_time: EventTime::from_micros(base + d * DAY_US + i as i64 * 1_000_000)
                    .unwrap(),
                sort_key: SortKey::new((i as u64).to_be_bytes().to_vec()).unwrap(),
                value: format!("row {i} of day {d}").into_bytes(),
            })
            .collect();
        store.append_batch(&table, &records).await.unwrap();
        out.push((BucketId::of_record(&table, strategy, &records[0]), records));
    }
    out
}

fn config(cutoff: &str, lease: Duration) -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339(cutoff).unwrap());
    c.lease = lease;
    c.concurrency = 1;
    c.retry = Duration::ZERO;
    c
}

fn slowed(archive: &ArchiveStore, per_call: Duration) -> Arc<ArchiveStore> {
    Arc::new(archive.with_faults(FaultLayer::new(FaultPlan::new(1).latency(per_call))))
}

async fn state(store: &dyn HotStore, b: &BucketId) -> BucketState {
    store.bucket(b).await.unwrap().unwrap().state
}

/// Objects stored under one generation of a bucket.
async fn objects_of(archive: &ArchiveStore, b: &BucketId, generation: i64) -> Vec<String> {
    let dir = archive
        .manifest_key(b, generation)
        .rsplit_once('/')
        .unwrap()
        .0
        .to_string();
    archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .filter(|k| k.starts_with(&format!("{dir}/")))
        .collect()
}

/// An upload slowed to several lease periods publishes because the lease is renewed; the
/// same upload with renewals answered but never reaching the store (the renewal task as
/// good as disabled) must not publish. Removing the renewal loop fails the first half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_longer_than_several_leases_publishes_only_with_renewal() {
    let db = fresh_database("longlease").await;
    let (store, archive) = open(&db, &fresh_archive_url("longlease")).await;
    let made = buckets(&*store, "2021-01-01", 2, 10).await;
    let lease = Duration::from_secs(1);
    let slow = slowed(&archive, Duration::from_millis(1_200));
    let hooked = Hooked::new(store.clone());

    // Only the first day is eligible at this cutoff.
    let runner = Runner::new(
        hooked.clone(),
        slow.clone(),
        config("2021-01-02T00:00:00Z", lease),
    )
    .unwrap();
    let started = Instant::now();
    let report = runner
        .run_cycle(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= lease * 3,
        "the upload was not slow enough to mean anything ({took:?})"
    );
    assert_eq!((report.archived, report.failed), (1, 0), "{report:?}");
    assert!(matches!(
        state(&*store, &made[0].0).await,
        BucketState::Archived { .. }
    ));

    hooked.renewals(Renewal::Ignore);
    let runner = Runner::new(hooked.clone(), slow, config("2021-01-03T00:00:00Z", lease)).unwrap();
    let report = runner
        .run_cycle(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!((report.archived, report.failed), (0, 1), "{report:?}");
    assert_eq!(state(&*store, &made[1].0).await, BucketState::Archiving);
}

/// Renewals fail (the database connection is cut): the worker stops at the end of its lease
/// without publishing and without writing the archive, and a second worker finishes the
/// bucket once the lease has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_renew_stops_and_another_finishes() {
    let db = fresh_database("cutlease").await;
    let (store, archive) = open(&db, &fresh_archive_url("cutlease")).await;
    let made = buckets(&*store, "2021-02-01", 1, 10).await;
    let (bucket, rows) = &made[0];
    let lease = Duration::from_secs(1);
    let hooked = Hooked::new(store.clone());
    hooked.renewals(Renewal::Cut);
    let runner = Runner::new(
        hooked.clone(),
        slowed(&archive, Duration::from_millis(1_200)),
        config("2022-01-01T00:00:00Z", lease),
    )
    .unwrap();
    let started = Instant::now();
    let report = runner
        .run_cycle(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!((report.archived, report.failed), (0, 1), "{report:?}");
    assert!(report.errors[0].contains("lease lost"), "{report:?}");
    assert!(
        started.elapsed() < lease * 3,
        "the worker kept going long after its lease: {:?}",
        started.elapsed()
    );
    let generation = store.bucket(bucket).await.unwrap().unwrap().generation;
    assert_eq!(state(&*store, bucket).await, BucketState::Archiving);
    // Nothing of the stopped upload lands later either.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(
        objects_of(&archive, bucket, generation).await,
        Vec::<String>::new()
    );

    // The lease has expired: a healthy worker takes the bucket over and finishes it.
    let mut c = config("2022-01-01T00:00:00Z", lease);
    c.cleanup_delay = Duration::ZERO;
    let other = Runner::new(store.clone(), archive.clone(), c).unwrap();
    let drained = other
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!(
        (
            drained.totals.archived,
            drained.totals.cleaned,
            drained.totals.failed
        ),
        (1, 1, 0),
        "{drained:?}"
    );
    let meta = store.bucket(bucket).await.unwrap().unwrap();
    assert!(meta.generation > generation);
    assert!(matches!(
        meta.state,
        BucketState::Archived {
            hot_deleted: true,
            ..
        }
    ));
    assert_eq!(&read_bucket(&*store, &archive, bucket).await, rows);
}

/// A snapshot page the store refuses as stale (another worker's claim took the bucket) is a
/// lost lease: the worker stops, reports it and writes nothing. It must not defer, which would
/// hand back a bucket it no longer owns. The refusal reaches the runner as the writer's
/// `WriteError::Source`, unchanged; reading it as an upload failure defers the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_snapshot_is_a_lost_lease_not_a_failed_upload() {
    let db = fresh_database("stalesnap").await;
    let (store, archive) = open(&db, &fresh_archive_url("stalesnap")).await;
    let made = buckets(&*store, "2021-04-01", 1, 10).await;
    let (bucket, _) = &made[0];
    let hooked = Hooked::new(store.clone());
    hooked.refuse_snapshots_as_stale();
    let runner = Runner::new(
        hooked.clone(),
        archive.clone(),
        config("2022-01-01T00:00:00Z", Duration::from_secs(30)),
    )
    .unwrap();
    let report = runner
        .run_cycle(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!(
        (report.archived, report.deferred, report.failed),
        (0, 0, 1),
        "{report:?}"
    );
    assert!(report.errors[0].contains("lease lost"), "{report:?}");
    assert_eq!(runner.metrics().lease_losses.get(), 1);
    assert_eq!(runner.metrics().buckets_deferred.get(), 0);
    assert_eq!(state(&*store, bucket).await, BucketState::Archiving);
    let generation = store.bucket(bucket).await.unwrap().unwrap().generation;
    assert_eq!(
        objects_of(&archive, bucket, generation).await,
        Vec::<String>::new()
    );
}

/// The store starts a lease when the claim commits; this host only knows when it sent it. A
/// claim whose answer took most of the lease to arrive must be given up by the time the
/// lease counted from the sending runs out (counting from the answer, as before, kept the
/// worker going 1.9 leases after the sending: seen failing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_counted_from_when_the_claim_was_sent() {
    let db = fresh_database("leasesent").await;
    let (store, archive) = open(&db, &fresh_archive_url("leasesent")).await;
    buckets(&*store, "2021-03-01", 1, 10).await;
    // Long enough that the 1.5 s allowed for scheduling (a loaded 2-core CI machine once
    // took 0.93 s past a 2 s lease) stays far below the 0.9 lease the old counting added.
    let lease = Duration::from_secs(4);
    let hooked = Hooked::new(store.clone());
    hooked.delay_claim_replies(lease * 9 / 10);
    hooked.renewals(Renewal::Cut);
    let runner = Runner::new(
        hooked.clone(),
        slowed(&archive, Duration::from_secs(10)),
        config("2022-01-01T00:00:00Z", lease),
    )
    .unwrap();
    let report = runner
        .run_cycle(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let stopped = Instant::now();
    let sent = hooked.claim_sent.lock().unwrap().expect("a claim was sent");
    let held = stopped - sent;
    assert_eq!(report.failed, 1, "{report:?}");
    assert!(
        held <= lease + Duration::from_millis(1500),
        "the worker held on {held:?} after sending a claim with a {lease:?} lease"
    );
}

/// Without an explicit cutoff, each cycle computes January 1 of the previous UTC year from
/// the clock, so a runner that lives across New Year archives the year that just became
/// eligible (computing it once at start, as before, fails this: seen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_cutoff_moves_when_the_year_turns() {
    let db = fresh_database("cutoff").await;
    let (store, archive) = open(&db, &fresh_archive_url("cutoff")).await;
    let made = buckets(&*store, "2024-06-01", 1, 5).await;
    let now = Arc::new(Mutex::new(
        Utc.with_ymd_and_hms(2025, 12, 31, 23, 0, 0).unwrap(),
    ));
    let clock = now.clone();
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = None;
    let runner = Runner::new(store.clone(), archive.clone(), c)
        .unwrap()
        .with_clock(Arc::new(move || *clock.lock().unwrap()));
    let token = CancellationToken::new();
    assert_eq!(
        runner.cutoff(),
        EventTime::parse_rfc3339("2024-01-01T00:00:00Z").unwrap()
    );
    let report = runner.run_cycle(&token, &|_, _| {}).await.unwrap();
    assert_eq!(report.discovered, 0, "{report:?}");
    assert_eq!(state(&*store, &made[0].0).await, BucketState::Hot);

    *now.lock().unwrap() = Utc.with_ymd_and_hms(2026, 1, 1, 0, 30, 0).unwrap();
    assert_eq!(
        runner.cutoff(),
        EventTime::parse_rfc3339("2025-01-01T00:00:00Z").unwrap()
    );
    let report = runner.run_cycle(&token, &|_, _| {}).await.unwrap();
    assert_eq!(report.archived, 1, "{report:?}");
}

/// Job history older than the retention is pruned at the end of a cycle. (It never was:
/// the cutoff, taken from a clock with nanoseconds, was refused as an `EventTime`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_history_older_than_the_retention_is_pruned() {
    let db = fresh_database("prune").await;
    let (store, archive) = open(&db, &fresh_archive_url("prune")).await;
    buckets(&*store, "2024-06-01", 2, 3).await;
    let now = Arc::new(Mutex::new(Utc::now()));
    let clock = now.clone();
    let runner = Runner::new(
        store.clone(),
        archive,
        config("2025-01-01T00:00:00Z", Duration::from_secs(60)),
    )
    .unwrap()
    .with_clock(Arc::new(move || *clock.lock().unwrap()));
    let token = CancellationToken::new();
    let report = runner.run_cycle(&token, &|_, _| {}).await.unwrap();
    assert_eq!(report.archived, 2, "{report:?}");
    let all = JobFilter::default();
    assert_eq!(store.jobs(&all).await.unwrap().len(), 2);
    // A week (the default retention) and a day later, by the runner's clock.
    *now.lock().unwrap() = Utc::now() + chrono::Duration::days(8);
    runner.run_cycle(&token, &|_, _| {}).await.unwrap();
    assert_eq!(store.jobs(&all).await.unwrap(), vec![]);
}

fn once(db: &str, archive_url: &str, cleanup_delay: &str) -> tokio::process::Command {
    let mut c = archiver(db, archive_url);
    c.args([
        "--once",
        "--eligible-before",
        "2022-01-01T00:00:00Z",
        "--scan-limit",
        "3",
        "--cleanup-delay-seconds",
        cleanup_delay,
    ]);
    c
}

/// `--once` with more eligible buckets than the scan limit archives them all in one run,
/// without waiting for the cleanup delay, and says what it left; a later run past the delay
/// cleans them. (Before, one run handled one batch of 3 and slept out the delay.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_drains_more_than_the_scan_limit_and_leaves_cleanups_not_due() {
    let db = fresh_database("oncedrain").await;
    let archive_url = fresh_archive_url("oncedrain");
    let (store, archive) = open(&db, &archive_url).await;
    let made = buckets(&*store, "2021-04-01", 8, 20).await;

    let started = Instant::now();
    let out = once(&db, &archive_url, "600").output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "--once waited for something: {:?}",
        started.elapsed()
    );
    for (b, _) in &made {
        assert!(
            matches!(
                state(&*store, b).await,
                BucketState::Archived {
                    hot_deleted: false,
                    ..
                }
            ),
            "{b} not published by one --once run: {stderr}"
        );
    }
    assert!(
        stderr.contains("8 published buckets whose hot rows wait for the cleanup delay"),
        "{stderr}"
    );

    let out = once(&db, &archive_url, "0").output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("nothing remains"), "{stderr}");
    for (b, rows) in &made {
        assert!(
            pulpitum::archiver::is_fully_archived(&*store, b)
                .await
                .unwrap(),
            "{b}: {stderr}"
        );
        assert_eq!(&read_bucket(&*store, &archive, b).await, rows);
    }
}

/// SIGTERM while published buckets wait a long cleanup delay: the daemon exits at once
/// (before, it slept out the delay: 600 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_daemon_promptly() {
    let db = fresh_database("sigterm").await;
    let archive_url = fresh_archive_url("sigterm");
    let (store, _archive) = open(&db, &archive_url).await;
    let made = buckets(&*store, "2021-05-01", 3, 20).await;
    let mut daemon = archiver(&db, &archive_url)
        .args([
            "--eligible-before",
            "2022-01-01T00:00:00Z",
            "--interval-seconds",
            "0.5",
            "--cleanup-delay-seconds",
            "600",
        ])
        .spawn()
        .unwrap();
    let waited = Instant::now();
    loop {
        let mut published = 0;
        for (b, _) in &made {
            published += usize::from(matches!(
                state(&*store, b).await,
                BucketState::Archived { .. }
            ));
        }
        if published == made.len() {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the daemon did not publish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = daemon.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let signalled = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(30), daemon.wait())
        .await
        .expect("the daemon was still running 30 s after SIGTERM")
        .unwrap();
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(5), "exit took {took:?}");
    eprintln!("sigterm: exited {took:?} after the signal");
}
