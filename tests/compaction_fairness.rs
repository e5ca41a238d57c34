//! Compaction sharing the archiver, and the mechanisms of its safety proven by removal, with
//! the real runner against PostgreSQL and S3: a pass stops at its time budget and the next
//! resumes; shutdown abandons the window in progress, releases its claim and writes
//! nothing more; an archived bucket without rows no longer holds its window back; a
//! compaction longer than one lease succeeds because the lease is renewed; and a segment's
//! payload and manifest are each created once, never overwritten.

mod archiver_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use archiver_support::*;
use datafusion::arrow::array::{Array, Int64Array};
use datafusion::prelude::SessionContext;
use pulpitum::archive::{ArchiveError, ArchiveStore, FaultLayer, FaultPlan, SegmentSpec};
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::{
    encode_i64, BucketKey, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{BucketFilter, BucketState, HotStore};
use tokio_util::sync::CancellationToken;

const DAY_US: i64 = 86_400_000_000;

/// `channels` channels with `per_channel` rows each, ten per day from `start`.
fn rows(start: &str, channels: i64, per_channel: i64) -> Vec<Record> {
    let base = EventTime::parse_rfc3339(start).unwrap().as_micros();
    let mut out = Vec::new();
    for ch in 1..=channels {
        for i in 0..per_channel {
            out.push(Record {
                partition_key: PartitionKey::from_i64(ch),
                event_time: EventTime::from_micros(base + (i / 10) * DAY_US + i).unwrap(),
                sort_key: SortKey::new(encode_i64(ch * 100_000 + i).to_vec()).unwrap(),
                value: format!("c{ch} m{i}").into_bytes(),
            });
        }
    }
    out
}

struct Setup {
    db: String,
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    ctx: SessionContext,
    table: TableId,
}

async fn setup(label: &str) -> Setup {
    let db = fresh_database(label).await;
    let (store, archive) = open(&db, &fresh_archive_url(label)).await;
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    ctx.sql("CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    Setup {
        db,
        store,
        archive,
        ctx,
        table: TableId::new("chat").unwrap(),
    }
}

fn config() -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.interval = Duration::from_millis(50);
    c.concurrency = 2;
    c
}

/// Archives (and cleans) everything eligible with compaction off: per-bucket objects only.
async fn archive_only(s: &Setup) {
    let mut c = config();
    c.compaction = false;
    let r = Runner::new(s.store.clone(), s.archive.clone(), c)
        .unwrap()
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!(r.totals.failed, 0, "{:?}", r.totals.errors);
}

async fn count(s: &Setup) -> i64 {
    let b = s
        .ctx
        .sql("SELECT count(*) FROM chat")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    b[0].column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0)
}

/// Bucket key and route of every bucket.
async fn routes(s: &Setup) -> Vec<(String, String)> {
    s.store
        .list_buckets(&s.table, &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let key = match m.state {
                BucketState::Archived { object_key, .. } => object_key,
                other => format!("{other:?}"),
            };
            (m.id.bucket_key.to_string(), key)
        })
        .collect()
}

async fn object_keys(s: &Setup) -> Vec<String> {
    let mut keys: Vec<String> = s
        .archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    keys.sort();
    keys
}

/// Three monthly windows, the first held by another compactor; a budget of zero looks at
/// one window per pass, and each pass resumes after the last window looked at, so the
/// held window does not keep the others waiting: they are compacted by the next passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_stops_at_its_budget_and_the_next_resumes_after_it() {
    let s = setup("budget").await;
    for month in [
        "2021-03-01T00:00:00Z",
        "2021-04-01T00:00:00Z",
        "2021-05-01T00:00:00Z",
    ] {
        s.store
            .append_batch(&s.table, &rows(month, 2, 20))
            .await
            .unwrap();
    }
    archive_only(&s).await;
    let march = BucketKey::parse_any("month:2021-03").unwrap();
    let (start, end) = march.bounds();
    let held = s
        .store
        .claim_compaction(
            &s.table,
            &march.to_string(),
            start,
            end,
            Duration::from_secs(600),
        )
        .await
        .unwrap()
        .unwrap();
    let mut c = config();
    c.compact_budget = Duration::ZERO;
    let runner = Runner::new(s.store.clone(), s.archive.clone(), c).unwrap();
    let in_segments = || async {
        routes(&s)
            .await
            .iter()
            .filter(|(_, k)| k.contains("/segments/"))
            .count()
    };
    // (windows compacted, windows skipped, budget spent, buckets in segments after it)
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = runner.compact_pass().await.unwrap();
        assert_eq!(r.failed, 0, "{r:?}");
        seen.push((r.windows, r.skipped, r.budget_spent, in_segments().await));
    }
    assert_eq!(
        seen,
        vec![
            (0, 1, true, 0),  // March is held; the budget stops the pass there
            (1, 0, true, 4),  // April, where the last pass stopped
            (1, 0, false, 8), // May, the end of the list
            (0, 1, false, 8), // from the start again: March still held
        ]
    );
    s.store.release_compaction(&held).await.unwrap();
    let r = runner.compact_pass().await.unwrap();
    assert_eq!((r.windows, r.budget_spent), (1, false), "{r:?}");
    assert_eq!(in_segments().await, 12);
    assert_eq!(count(&s).await, 120);
}

/// Shutdown while a window is being read: the pass returns promptly, the claim is
/// released (the window is claimable at once), no route moved, and nothing is written
/// after the return.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_abandons_the_window_in_progress_and_releases_its_claim() {
    let s = setup("shutdown").await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 4, 100))
        .await
        .unwrap();
    archive_only(&s).await;
    let before = routes(&s).await;
    // Every object-store call takes 300 ms: reading 40 sources takes seconds.
    let slow = Arc::new(s.archive.with_faults(FaultLayer::new(
        FaultPlan::new(1).latency(Duration::from_millis(300)),
    )));
    let runner = Runner::new(s.store.clone(), slow, config()).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(900)).await;
        stop.cancel();
    });
    let t0 = Instant::now();
    let r = runner.compact_pass_until(&shutdown).await.unwrap();
    let took = t0.elapsed();
    assert!(r.interrupted, "{r:?}");
    assert_eq!((r.windows, r.failed), (0, 0), "{r:?}");
    assert!(
        took < Duration::from_millis(2_500),
        "the pass took {took:?} to stop"
    );
    assert!(
        s.store.compaction_claims().await.unwrap().is_empty(),
        "the claim was not released"
    );
    assert_eq!(routes(&s).await, before, "a route moved");
    // Nothing more is written: a second look later finds the same objects.
    let at_return = object_keys(&s).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(object_keys(&s).await, at_return, "written after the return");
    // The window is claimable at once and compacts.
    let r = Runner::new(s.store.clone(), s.archive.clone(), config())
        .unwrap()
        .compact_pass()
        .await
        .unwrap();
    assert_eq!((r.windows, r.failed), (1, 0), "{r:?}");
    assert_eq!(count(&s).await, 400);
}

/// An archived bucket without rows (here: a bucket emptied behind the store's back before
/// it was archived) is removed with its window's compaction instead of failing it on every
/// pass; its rows (none) read as before, and the window stays compacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_archived_bucket_does_not_hold_its_window_back() {
    let s = setup("emptybucket").await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 2, 30))
        .await
        .unwrap();
    // Channel 2's first day loses its rows (its metadata stays): an archived bucket of 0 rows.
    let (client, conn) = tokio_postgres::connect(&s.db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let emptied = client
        .execute(
            "DELETE FROM pulpitum_v4_records WHERE table_id = 'chat' AND partition_key = $1 \
             AND bucket_key = 'day:2021-03-01'",
            &[&PartitionKey::from_i64(2).as_bytes()],
        )
        .await
        .unwrap();
    assert_eq!(emptied, 10);
    archive_only(&s).await;
    assert_eq!(routes(&s).await.len(), 6);
    assert_eq!(count(&s).await, 50);
    let runner = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    let r = runner.compact_pass().await.unwrap();
    assert_eq!((r.windows, r.buckets, r.failed), (1, 5, 0), "{r:?}");
    let after = routes(&s).await;
    assert_eq!(after.len(), 5, "the empty bucket is gone: {after:?}");
    assert!(
        after.iter().all(|(_, k)| k.contains("/segments/")),
        "{after:?}"
    );
    assert_eq!(count(&s).await, 50);
    // Its per-bucket object is retired (for GC), and the window stays compacted.
    assert_eq!(s.store.retired_objects().await.unwrap().len(), 6);
    let again = runner.compact_pass().await.unwrap();
    assert_eq!(
        (again.windows, again.skipped, again.failed),
        (0, 0, 0),
        "{again:?}"
    );
}

/// A compaction that takes several leases (every object-store call is slowed down) still
/// switches: the window lease is renewed in the background. Without the renewal the claim
/// expires mid-way and the switch is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compaction_longer_than_one_lease_succeeds_by_renewing_it() {
    let s = setup("leaserenew").await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 3, 50))
        .await
        .unwrap();
    archive_only(&s).await;
    let slow = Arc::new(s.archive.with_faults(FaultLayer::new(
        FaultPlan::new(2).latency(Duration::from_millis(200)),
    )));
    let mut c = config();
    c.lease = Duration::from_millis(600);
    let runner = Runner::new(s.store.clone(), slow, c).unwrap();
    let t0 = Instant::now();
    let r = runner.compact_pass().await.unwrap();
    let took = t0.elapsed();
    assert!(
        took > Duration::from_millis(1_800),
        "the compaction took {took:?}, not several leases: the test proves nothing"
    );
    assert_eq!((r.windows, r.failed), (1, 0), "{:?}", r.errors);
    assert!(routes(&s)
        .await
        .iter()
        .all(|(_, k)| k.contains("/segments/")));
    assert_eq!(count(&s).await, 150);
}

fn spec(table: &TableId, generation: i64) -> SegmentSpec {
    SegmentSpec {
        table_id: table.clone(),
        strategy: BucketStrategy::CalendarDayUtc,
        window: BucketKey::parse_any("month:2021-03").unwrap(),
        generation,
        ordinal: 0,
    }
}

fn sorted(mut rs: Vec<Record>) -> Vec<Record> {
    rs.sort_by(|a, b| {
        (
            a.partition_key.as_bytes(),
            a.event_time,
            a.sort_key.as_bytes(),
        )
            .cmp(&(
                b.partition_key.as_bytes(),
                b.event_time,
                b.sort_key.as_bytes(),
            ))
    });
    rs
}

/// Two writers of one segment key with different rows: the second is refused, and the
/// payload and manifest stay the first writer's, byte for byte (the payload's create-once
/// condition is what keeps the first payload: without it the second writer replaces it
/// before its manifest is refused, and the first manifest names bytes that are gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_writer_of_a_segment_key_overwrites_nothing() {
    let s = setup("segcreateonce").await;
    let first = sorted(rows("2021-03-01T00:00:00Z", 2, 30));
    let mut second = first.clone();
    second[0].value = b"another writer".to_vec();
    let spec = spec(&s.table, 7);
    let written = s.archive.write_segment(&spec, &first).await.unwrap();
    let op = s.archive.operator();
    let payload_key = written.manifest.payload_key.clone();
    let payload = op.read(&payload_key).await.unwrap().to_bytes();
    let manifest = op.read(&written.manifest_key).await.unwrap().to_bytes();
    let Err(err) = s.archive.write_segment(&spec, &second).await else {
        panic!("the second writer's write succeeded");
    };
    assert!(
        matches!(err, ArchiveError::AlreadyExistsDifferent { .. }),
        "{err}"
    );
    assert!(
        op.read(&payload_key).await.unwrap().to_bytes() == payload,
        "the first writer's payload was overwritten"
    );
    assert!(
        op.read(&written.manifest_key).await.unwrap().to_bytes() == manifest,
        "the first writer's manifest was overwritten"
    );
    // The same rows again (a retry of the first writer) succeed and name the same segment.
    let retry = s.archive.write_segment(&spec, &first).await.unwrap();
    assert_eq!(retry.manifest_key, written.manifest_key);
}

/// An object already at a segment's manifest key that is not this segment's manifest (a
/// foreign or damaged document) is never overwritten: the write is refused after the
/// payload, and the object is left as found. Without the manifest's create-once condition
/// the writer replaces it and reports success.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_manifest_key_already_taken_is_never_overwritten() {
    let s = setup("segmanifestonce").await;
    let records = sorted(rows("2021-03-01T00:00:00Z", 2, 30));
    let spec = spec(&s.table, 3);
    // Where the manifest goes: learn the key from a write of another generation.
    let probe = s
        .archive
        .write_segment(
            &SegmentSpec {
                generation: 4,
                ..spec.clone()
            },
            &records,
        )
        .await
        .unwrap();
    let manifest_key = probe.manifest_key.replace("-g4/", "-g3/");
    assert_ne!(manifest_key, probe.manifest_key);
    let op = s.archive.operator();
    let foreign = b"{\"not\": \"this segment's manifest\"}\n".to_vec();
    op.write(&manifest_key, foreign.clone()).await.unwrap();
    let Err(err) = s.archive.write_segment(&spec, &records).await else {
        panic!("the write over a foreign manifest succeeded");
    };
    assert!(
        matches!(
            err,
            ArchiveError::AlreadyExistsDifferent { .. } | ArchiveError::InvalidManifest { .. }
        ),
        "refused for the wrong reason: {err}"
    );
    assert!(
        op.read(&manifest_key).await.unwrap().to_bytes().to_vec() == foreign,
        "the object at the manifest key was overwritten"
    );
}

/// A payload key already taken by other bytes: the write is refused before any manifest,
/// and the bytes stay. Without the payload's create-once condition the writer replaces
/// them, verifies its own bytes and creates a manifest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_payload_key_already_taken_is_never_overwritten() {
    let s = setup("segpayloadonce").await;
    let records = sorted(rows("2021-03-01T00:00:00Z", 2, 30));
    let spec = spec(&s.table, 5);
    let probe = s
        .archive
        .write_segment(
            &SegmentSpec {
                generation: 6,
                ..spec.clone()
            },
            &records,
        )
        .await
        .unwrap();
    let payload_key = probe.manifest.payload_key.replace("-g6/", "-g5/");
    let manifest_key = probe.manifest_key.replace("-g6/", "-g5/");
    assert_ne!(payload_key, probe.manifest.payload_key);
    let op = s.archive.operator();
    let foreign = b"bytes of another writer".to_vec();
    op.write(&payload_key, foreign.clone()).await.unwrap();
    let Err(err) = s.archive.write_segment(&spec, &records).await else {
        panic!("the write over a foreign payload succeeded");
    };
    assert!(
        matches!(err, ArchiveError::AlreadyExistsDifferent { .. }),
        "{err}"
    );
    assert!(
        op.read(&payload_key).await.unwrap().to_bytes().to_vec() == foreign,
        "the payload was overwritten"
    );
    assert!(
        !op.exists(&manifest_key).await.unwrap(),
        "a manifest was created over someone else's payload"
    );
}

/// A window claim whose lease expired (its holder died, maybe between its switch and its
/// release) protects the window's segments for one orphan delay after the expiry (a switch
/// that began before it may still commit), and nothing after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_window_claim_protects_its_segments_for_one_orphan_delay() {
    let s = setup("claimgrace").await;
    let records = sorted(rows("2021-03-01T00:00:00Z", 2, 30));
    let window = BucketKey::parse_any("month:2021-03").unwrap();
    let (start, end) = window.bounds();
    let claim = s
        .store
        .claim_compaction(
            &s.table,
            &window.to_string(),
            start,
            end,
            Duration::from_secs(3),
        )
        .await
        .unwrap()
        .unwrap();
    let t0 = Instant::now();
    let written = s
        .archive
        .write_segment(&spec(&s.table, claim.generation), &records)
        .await
        .unwrap();
    let delays = pulpitum::archiver::GcDelays {
        orphans: Duration::from_secs(1),
        retired: Duration::ZERO,
        erased: Duration::ZERO,
    };
    let metrics = pulpitum::archiver::ArchiverMetrics::default();
    let gc = || pulpitum::archiver::collect_garbage_with(&*s.store, &s.archive, delays, &metrics);
    // Expired 0.3 s ago, the segment older than the orphan delay: still protected.
    tokio::time::sleep(Duration::from_millis(3_300).saturating_sub(t0.elapsed())).await;
    gc().await.unwrap();
    assert!(
        object_keys(&s).await.contains(&written.manifest_key),
        "collected inside the grace after the claim's expiry"
    );
    // Past the expiry plus the orphan delay: an orphan like any other.
    tokio::time::sleep(Duration::from_millis(4_300).saturating_sub(t0.elapsed())).await;
    gc().await.unwrap();
    assert!(
        !object_keys(&s)
            .await
            .iter()
            .any(|k| k.contains("/segments/")),
        "an expired claim still protects its window"
    );
    assert_eq!(
        s.store.compaction_claims().await.unwrap().len(),
        1,
        "never released"
    );
}
