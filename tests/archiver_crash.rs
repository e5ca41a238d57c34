//! Crash and pause recovery of the archiver binary against the real PostgreSQL and S3.
//!
//! Each test arms a fail point in a first archiver process, which aborts (or freezes) there;
//! a second process then finishes the work, and the test checks the invariants: every row
//! readable exactly once from exactly one tier, buckets `Archived { hot_deleted: true }`,
//! and no orphaned objects after GC.

mod archiver_support;

use std::collections::BTreeMap;
use std::time::Duration;

use archiver_support::*;
use pulpitum::archive::ArchiveStore;
use pulpitum::archiver::{collect_garbage_with, ArchiverMetrics, GcDelays};
use pulpitum::failpoint;
use pulpitum::model::{
    BucketId, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use pulpitum::store::{BucketState, HotStore, TableDefinition};

const ROWS_PER_BUCKET: usize = 250;

struct Fixture {
    db: String,
    archive_url: String,
    store: std::sync::Arc<dyn HotStore>,
    archive: std::sync::Arc<ArchiveStore>,
    expected: BTreeMap<BucketId, Vec<Record>>,
}

/// Three eligible daily buckets of 250 rows (several snapshot pages each) and one
/// current bucket that must stay hot.
async fn fixture(label: &str) -> Fixture {
    let db = fresh_database(label).await;
    let archive_url = fresh_archive_url(label);
    let (store, archive) = open(&db, &archive_url).await;
    let table = TableId::new("chat").unwrap();
    let strategy = BucketStrategy::CalendarDayUtc;
    store
        .register_table(&TableDefinition::new(table.clone(), strategy, "chat"))
        .await
        .unwrap();
    let mut expected: BTreeMap<BucketId, Vec<Record>> = BTreeMap::new();
    let days = ["2021-03-01", "2021-03-02", "2021-03-03"];
    for (c, day) in days.iter().enumerate() {
        let base = EventTime::parse_rfc3339(&format!("{day}T00:00:00Z"))
            .unwrap()
            .as_micros();
        let records: Vec<Record> = (0..ROWS_PER_BUCKET)
            .map(|i| Record {
                partition_key: PartitionKey::new(vec![c as u8 + 1]).unwrap(),
                event_time: EventTime::from_micros(base + (i as i64) * 1_000_000).unwrap(),
                sort_key: SortKey::new((i as u64).to_be_bytes().to_vec()).unwrap(),
                value: format!("message {i} on {day}").into_bytes(),
            })
            .collect();
        store.append_batch(&table, &records).await.unwrap();
        let id = BucketId::of_record(&table, strategy, &records[0]);
        expected.insert(id, records);
    }
    Fixture {
        db,
        archive_url,
        store,
        archive,
        expected,
    }
}

fn configured(mut c: tokio::process::Command) -> tokio::process::Command {
    c.args([
        "--once",
        "--eligible-before",
        "2022-01-01T00:00:00Z",
        "--lease-seconds",
        "1",
        "--cleanup-delay-seconds",
        "0",
        // GC runs in the checks below, at zero delay once no worker is left (a zero delay is
        // no legal setting for a running archiver).
        "--no-gc",
        "--snapshot-page-rows",
        "100",
        "--retry-seconds",
        "0",
    ]);
    c
}

async fn check_everything_archived(f: &Fixture) {
    for (bucket, rows) in &f.expected {
        let meta = f.store.bucket(bucket).await.unwrap().unwrap();
        assert!(
            matches!(
                meta.state,
                BucketState::Archived {
                    hot_deleted: true,
                    ..
                }
            ),
            "{bucket} ended as {:?}",
            meta.state
        );
        let got = read_bucket(&*f.store, &f.archive, bucket).await;
        assert_eq!(&got, rows, "rows of {bucket} differ after recovery");
    }
    // GC with no delays (every worker has exited, no reader holds a route): only referenced
    // generations remain, whether orphaned by a crash or retired by a compaction.
    collect_garbage_with(
        &*f.store,
        &f.archive,
        GcDelays {
            orphans: Duration::ZERO,
            retired: Duration::ZERO,
            erased: Duration::ZERO,
        },
        &ArchiverMetrics::default(),
    )
    .await
    .unwrap();
    // The window was compacted: every bucket now routes to a segment.
    for bucket in f.expected.keys() {
        let meta = f.store.bucket(bucket).await.unwrap().unwrap();
        let BucketState::Archived { object_key, .. } = meta.state else {
            unreachable!("checked above")
        };
        assert!(
            object_key.contains("/segments/"),
            "{bucket} routes to {object_key}"
        );
    }
    assert!(f.store.retired_objects().await.unwrap().is_empty());
    let refs: Vec<String> = f.store.referenced_object_keys().await.unwrap();
    let dirs: Vec<&str> = refs.iter().map(|k| k.rsplit_once('/').unwrap().0).collect();
    for obj in f.archive.list_objects().await.unwrap() {
        let dir = obj.key.rsplit_once('/').unwrap().0;
        assert!(dirs.contains(&dir), "orphan left behind: {}", obj.key);
    }
}

async fn check_readable_exactly_once(f: &Fixture) {
    for (bucket, rows) in &f.expected {
        let got = read_bucket(&*f.store, &f.archive, bucket).await;
        assert_eq!(
            &got, rows,
            "rows of {bucket} not readable exactly once mid-protocol"
        );
    }
}

/// A fault-free worker finishes whatever is left; then every invariant is checked.
async fn recover(f: &Fixture, after: &str) {
    let out = configured(archiver(&f.db, &f.archive_url))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "recovery after {after} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_everything_archived(f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_worker_finishes_after_a_crash_at_every_step() {
    for point in failpoint::ALL {
        let f = fixture(&point.replace('_', "")).await;
        let status = configured(archiver(&f.db, &f.archive_url))
            .env("PULPITUM_FAILPOINT", point)
            .status()
            .await
            .unwrap();
        assert!(
            !status.success(),
            "the first worker should have crashed at {point}"
        );
        // Between the crash and the recovery, reads still see every row exactly once.
        check_readable_exactly_once(&f).await;
        // Let the dead worker's lease expire, then recover.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        recover(&f, point).await;
        eprintln!("fail point {point}: recovered");
    }
}

fn process_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

async fn wait_until_stopped(pid: u32) {
    for _ in 0..200 {
        if process_state(pid) == 'T' {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("archiver {pid} never reached its stop point");
}

fn signal(pid: u32, sig: &str) {
    std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_paused_past_its_lease_cannot_publish() {
    let f = fixture("pausepub").await;
    let mut paused = configured(archiver(&f.db, &f.archive_url))
        .args(["--concurrency", "1"])
        .env("PULPITUM_FAILPOINT", "after_verify:stop")
        .spawn()
        .unwrap();
    let pid = paused.id().unwrap();
    wait_until_stopped(pid).await;
    // Frozen with a verified upload in hand; its lease (1 s) runs out.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // A second worker takes over and finishes everything.
    let out = configured(archiver(&f.db, &f.archive_url))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let routes_before: Vec<_> =
        futures::future::join_all(f.expected.keys().map(|b| f.store.bucket(b)))
            .await
            .into_iter()
            .map(|m| m.unwrap().unwrap().state)
            .collect();
    signal(pid, "-CONT");
    let status = paused.wait().await.unwrap();
    assert!(
        !status.success(),
        "the stale worker must report its lost lease"
    );
    let routes_after: Vec<_> =
        futures::future::join_all(f.expected.keys().map(|b| f.store.bucket(b)))
            .await
            .into_iter()
            .map(|m| m.unwrap().unwrap().state)
            .collect();
    assert_eq!(
        routes_before, routes_after,
        "the stale worker changed a route"
    );
    check_everything_archived(&f).await;
}

/// Hot rows of one bucket as physically stored, whatever the route says.
async fn hot_row_count(db: &str, bucket: &BucketId) -> i64 {
    let (client, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .query_one(
            "SELECT count(*) FROM pulpitum_v4_records WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3",
            &[&bucket.table_id.as_str(), &bucket.partition_key.as_bytes(), &bucket.bucket_key.to_string()],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_paused_past_its_lease_cannot_delete_hot_rows() {
    let f = fixture("pausedel").await;
    let mut paused = configured(archiver(&f.db, &f.archive_url))
        .args(["--concurrency", "1", "--cleanup-batch-rows", "100"])
        .env("PULPITUM_FAILPOINT", "mid_cleanup:stop")
        .spawn()
        .unwrap();
    let pid = paused.id().unwrap();
    wait_until_stopped(pid).await;
    // Frozen after its first cleanup batch (100 of 250 rows); its cleanup lease runs out and
    // nobody else touches the bucket, so only the store's lease check can stop it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Others may be published and waiting for cleanup; one is half cleaned.
    let mut stalled = Vec::new();
    for b in f.expected.keys() {
        if let Some(BucketState::Archived {
            hot_deleted: false, ..
        }) = f.store.bucket(b).await.unwrap().map(|m| m.state)
        {
            if hot_row_count(&f.db, b).await == (ROWS_PER_BUCKET - 100) as i64 {
                stalled.push(b.clone());
            }
        }
    }
    assert_eq!(
        stalled.len(),
        1,
        "exactly one bucket was mid-cleanup at the pause"
    );
    let before = hot_row_count(&f.db, &stalled[0]).await;
    signal(pid, "-CONT");
    let status = paused.wait().await.unwrap();
    assert!(
        !status.success(),
        "the stale worker must report its lost lease"
    );
    assert_eq!(
        hot_row_count(&f.db, &stalled[0]).await,
        before,
        "the stale worker deleted hot rows after its lease expired"
    );
    // Reads were served by the archive all along; a fresh worker finishes the cleanup.
    check_readable_exactly_once(&f).await;
    recover(&f, "the stale worker").await;
}

/// A crash between a window's (last) switch and the release of its claim, on the window's
/// second generation: the claim is never released (nobody claims a window whose every bucket is
/// in a segment), yet once its lease has expired GC no longer protects the window, so the
/// first generation's segment (retired by the switch) is deleted and its retired row
/// forgotten: nothing is kept forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_after_the_switch_leaves_nothing_kept_forever() {
    let mut f = fixture("crashafterswitch").await;
    // Generation 1 of the window, released normally.
    recover(&f, "the first compaction").await;
    let first_segments: Vec<String> = f
        .archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .filter(|k| k.contains("/segments/"))
        .collect();
    assert!(!first_segments.is_empty());
    // A late bucket of the same window in every partition (a late bucket gives work to its
    // partition only, so every partition moves off generation 1), then generation 2
    // crashes right after its switch.
    let table = TableId::new("chat").unwrap();
    let base = EventTime::parse_rfc3339("2021-03-20T00:00:00Z")
        .unwrap()
        .as_micros();
    for p in 1..=3u8 {
        let late: Vec<Record> = (0..20)
            .map(|i| Record {
                partition_key: PartitionKey::new(vec![p]).unwrap(),
                event_time: EventTime::from_micros(base + i * 1_000_000).unwrap(),
                sort_key: SortKey::new((i as u64).to_be_bytes().to_vec()).unwrap(),
                value: format!("late {i}").into_bytes(),
            })
            .collect();
        f.store.append_batch(&table, &late).await.unwrap();
        f.expected.insert(
            BucketId::of_record(&table, BucketStrategy::CalendarDayUtc, &late[0]),
            late,
        );
    }
    let status = configured(archiver(&f.db, &f.archive_url))
        .env("PULPITUM_FAILPOINT", "compact_after_switch")
        .status()
        .await
        .unwrap();
    assert!(
        !status.success(),
        "the worker should have crashed after the switch"
    );
    let claims = f.store.compaction_claims().await.unwrap();
    assert_eq!(claims.len(), 1, "the crashed claim is left: {claims:?}");
    assert_eq!(claims[0].generation, 2);
    // Past the lease, a fault-free run has nothing to compact; GC (zero delays in the
    // check) must collect generation 1 and forget its retired row.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    recover(&f, "a crash after the switch").await;
    let left: Vec<String> = f
        .archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    for k in &first_segments {
        assert!(!left.contains(k), "generation 1 kept: {k}");
    }
}
