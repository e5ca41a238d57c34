//! Compaction with the real runner against PostgreSQL and S3: windows of published buckets
//! move into segments while SQL reads them, readers holding old routes keep reading until
//! the retirement delay, late buckets are folded into a window's next generation, and a
//! window with unfinished buckets is left alone.

mod archiver_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use archiver_support::*;
use datafusion::arrow::array::{Array, Int64Array};
use datafusion::prelude::SessionContext;
use pulpitum::archive::ArchiveStore;
use pulpitum::archiver::{
    collect_garbage_with, ArchiverConfig, ArchiverMetrics, GcDelays, Runner, WindowOutcome,
};
use pulpitum::model::{encode_i64, BucketKey, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{BucketFilter, BucketState, HotStore};
use tokio_util::sync::CancellationToken;

const DAY_US: i64 = 86_400_000_000;

fn ints(b: &[datafusion::arrow::record_batch::RecordBatch], col: usize) -> Vec<i64> {
    b.iter()
        .flat_map(|b| {
            let a = b.column(col).as_any().downcast_ref::<Int64Array>().unwrap();
            assert_eq!(a.null_count(), 0);
            a.values().to_vec()
        })
        .collect()
}

async fn query(
    ctx: &SessionContext,
    sql: &str,
) -> Vec<datafusion::arrow::record_batch::RecordBatch> {
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

/// `channels` channels with `per_channel` rows each, ten per day from `start`.
fn rows(start: &str, channels: i64, per_channel: i64) -> Vec<Record> {
    let base = EventTime::parse_rfc3339(start).unwrap().as_micros();
    let mut out = Vec::new();
    for ch in 1..=channels {
        for i in 0..per_channel {
            let id = ch * 100_000 + i;
            out.push(Record {
                partition_key: PartitionKey::from_i64(ch),
                event_time: EventTime::from_micros(base + (i / 10) * DAY_US + i).unwrap(),
                sort_key: SortKey::new(encode_i64(id).to_vec()).unwrap(),
                value: format!("c{ch} m{i}").into_bytes(),
            });
        }
    }
    out
}

struct Setup {
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    ctx: SessionContext,
    table: TableId,
}

async fn setup(label: &str) -> Setup {
    let db = fresh_database(label).await;
    let archive_url = fresh_archive_url(label);
    setup_on(&db, &archive_url).await
}

/// [`setup`] on given stores (PostgreSQL and S3, or the embedded store and a local archive).
async fn setup_on(db: &str, archive_url: &str) -> Setup {
    let (store, archive) = open(db, archive_url).await;
    let opts = SessionOptions {
        page_rows: 7,
        ..SessionOptions::default()
    };
    let ctx = session(store.clone(), archive.clone(), opts).await.unwrap();
    query(&ctx, "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')").await;
    Setup {
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
    c.scan_limit = 16;
    c.concurrency = 2;
    c
}

async fn routes(s: &Setup) -> Vec<(String, BucketState)> {
    s.store
        .list_buckets(&s.table, &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.id.bucket_key.to_string(), m.state))
        .collect()
}

/// Archives (and cleans) everything eligible with compaction off: per-bucket objects only.
async fn archive_only(s: &Setup) {
    let mut c = config();
    c.compaction = false;
    Runner::new(s.store.clone(), s.archive.clone(), c)
        .unwrap()
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
}

/// Every object key in the archive.
async fn object_keys(s: &Setup) -> Vec<String> {
    s.archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

fn in_segment(state: &BucketState) -> bool {
    matches!(state, BucketState::Archived { object_key, hot_deleted: true, .. } if object_key.contains("/segments/"))
}

/// Every query's answer is checked against the rows written, whatever tier or layout each
/// bucket is in at that moment.
async fn check_queries(ctx: &SessionContext, channels: i64, per_channel: i64, round: usize) {
    let n = channels * per_channel;
    let id_sum: i64 = (1..=channels)
        .map(|ch| (0..per_channel).map(|i| ch * 100_000 + i).sum::<i64>())
        .sum();
    let b = query(ctx, "SELECT count(*), sum(id) FROM chat").await;
    assert_eq!(
        (ints(&b, 0), ints(&b, 1)),
        (vec![n], vec![id_sum]),
        "round {round}"
    );
    let b = query(
        ctx,
        "SELECT id FROM chat WHERE channel_id = 2 ORDER BY timestamp, id",
    )
    .await;
    assert_eq!(
        ints(&b, 0),
        (0..per_channel).map(|i| 200_000 + i).collect::<Vec<_>>(),
        "round {round}"
    );
    let b = query(
        ctx,
        "SELECT id FROM chat WHERE channel_id = 3 ORDER BY timestamp DESC, id DESC LIMIT 25",
    )
    .await;
    assert_eq!(
        ints(&b, 0),
        (per_channel - 25..per_channel)
            .rev()
            .map(|i| 300_000 + i)
            .collect::<Vec<_>>(),
        "round {round}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_sees_every_row_once_while_windows_move_into_segments() {
    let s = setup("compactrace").await;
    // Three channels over June and July 2021: 60 day buckets in two windows.
    let (channels, per_channel) = (3, 600);
    s.store
        .append_batch(
            &s.table,
            &rows("2021-06-01T00:00:00Z", channels, per_channel),
        )
        .await
        .unwrap();
    let runner = Arc::new(Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap());
    let shutdown = CancellationToken::new();
    let worker = {
        let (runner, shutdown) = (runner.clone(), shutdown.clone());
        tokio::spawn(async move { runner.run(shutdown).await })
    };
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (store, table, done) = (s.store.clone(), s.table.clone(), done.clone());
        tokio::spawn(async move {
            loop {
                let all = store
                    .list_buckets(&table, &BucketFilter::default())
                    .await
                    .unwrap();
                if all.iter().all(|m| in_segment(&m.state)) {
                    done.store(true, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut rounds = 0;
    while !done.load(Ordering::SeqCst) || rounds < 2 {
        rounds += 1;
        check_queries(&s.ctx, channels, per_channel, rounds).await;
        assert!(rounds < 3_000, "compaction never finished");
    }
    watcher.await.unwrap();
    shutdown.cancel();
    worker.await.unwrap().unwrap();
    // A fresh session (no cached routes) reads only segments, and gives the same answers.
    let fresh = session(
        s.store.clone(),
        s.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    check_queries(&fresh, channels, per_channel, rounds + 1).await;
    // After the retirement delay (zero here: no reader is left), GC leaves two segments
    // (payload and manifest each): 4 objects instead of 120.
    collect_garbage_with(
        &*s.store,
        &s.archive,
        GcDelays {
            orphans: Duration::ZERO,
            retired: Duration::ZERO,
        },
        &ArchiverMetrics::default(),
    )
    .await
    .unwrap();
    let objects = s.archive.list_objects().await.unwrap();
    assert_eq!(
        objects.len(),
        4,
        "{:?}",
        objects.iter().map(|o| &o.key).collect::<Vec<_>>()
    );
    check_queries(&fresh, channels, per_channel, rounds + 2).await;
    eprintln!("compaction race: {rounds} query rounds while 180 buckets moved into 2 segments");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaced_objects_outlive_the_switch_by_the_retirement_delay() {
    let s = setup("compactretire").await;
    let (channels, per_channel) = (3, 50);
    s.store
        .append_batch(
            &s.table,
            &rows("2021-03-01T00:00:00Z", channels, per_channel),
        )
        .await
        .unwrap();
    archive_only(&s).await;
    // This session caches the per-bucket routes.
    check_queries(&s.ctx, channels, per_channel, 0).await;
    let before: Vec<String> = object_keys(&s).await;
    let compactor = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    let report = compactor.compact_pass().await.unwrap();
    assert_eq!(
        (report.windows, report.segments, report.buckets),
        (1, 1, 15)
    );
    assert!(routes(&s).await.iter().all(|(_, st)| in_segment(st)));
    let retired = s.store.retired_objects().await.unwrap();
    assert_eq!(retired.len(), 15, "every per-bucket manifest is retired");
    // GC inside the retirement delay deletes nothing a cached route may name.
    let delays = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::from_secs(3600),
    };
    collect_garbage_with(&*s.store, &s.archive, delays, &ArchiverMetrics::default())
        .await
        .unwrap();
    let kept: Vec<String> = object_keys(&s).await;
    for k in &before {
        assert!(
            kept.contains(k),
            "{k} was deleted inside the retirement delay"
        );
    }
    // The session still holds the old routes (inside its cache bound) and reads them.
    check_queries(&s.ctx, channels, per_channel, 1).await;
    // Past the delay, the old objects go and their retired rows with them.
    let delays = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::ZERO,
    };
    collect_garbage_with(&*s.store, &s.archive, delays, &ArchiverMetrics::default())
        .await
        .unwrap();
    assert_eq!(s.archive.list_objects().await.unwrap().len(), 2);
    assert!(s.store.retired_objects().await.unwrap().is_empty());
    let fresh = session(
        s.store.clone(),
        s.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    check_queries(&fresh, channels, per_channel, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_bucket_is_folded_into_the_next_generation_of_its_window() {
    let s = setup("compactlate").await;
    let early = rows("2021-03-01T00:00:00Z", 2, 40);
    s.store.append_batch(&s.table, &early).await.unwrap();
    let runner = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let first = runner.compact_pass().await.unwrap();
    assert_eq!(first.windows, 1);
    let old_segment = match &routes(&s).await[0].1 {
        BucketState::Archived { object_key, .. } => object_key.clone(),
        other => panic!("{other:?}"),
    };
    // A late append into the same month (a new channel), archived afterwards.
    let late = rows("2021-03-20T00:00:00Z", 1, 5)
        .into_iter()
        .map(|mut r| {
            r.partition_key = PartitionKey::from_i64(9);
            r
        })
        .collect::<Vec<_>>();
    s.store.append_batch(&s.table, &late).await.unwrap();
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let second = runner.compact_pass().await.unwrap();
    assert_eq!(
        (second.windows, second.buckets),
        (1, 9),
        "8 early buckets and the late one"
    );
    let now = routes(&s).await;
    assert!(now.iter().all(|(_, st)| in_segment(st)));
    assert!(now.iter().all(|(_, st)| !matches!(st, BucketState::Archived { object_key, .. } if *object_key == old_segment)));
    let retired: Vec<String> = s
        .store
        .retired_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.object_key)
        .collect();
    assert!(
        retired.contains(&old_segment),
        "the first generation's segment is retired"
    );
    let b = query(&s.ctx, "SELECT count(*) FROM chat").await;
    assert_eq!(ints(&b, 0), vec![85]);
    // Nothing left to do: the next pass finds no window.
    assert_eq!(runner.compact_pass().await.unwrap().windows, 0);
}

/// The text cells of every row of a query, for checks on what a system table shows.
async fn text_cells(ctx: &SessionContext, sql: &str) -> Vec<Vec<String>> {
    let batches = query(ctx, sql).await;
    let mut out = Vec::new();
    for b in &batches {
        for r in 0..b.num_rows() {
            out.push(
                (0..b.num_columns())
                    .map(|c| {
                        datafusion::arrow::util::display::array_value_to_string(b.column(c), r)
                            .unwrap()
                    })
                    .collect(),
            );
        }
    }
    out
}

/// `pulpitum_compactions` shows a held window claim (never its owner token) and
/// `pulpitum_retired_objects` every object a switch replaced, as the store records them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn window_claims_and_retired_objects_show_in_the_system_tables() {
    let s = setup("compactsys").await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 2, 30))
        .await
        .unwrap();
    archive_only(&s).await;
    let window = BucketKey::parse_any("month:2021-03").unwrap();
    let (start, end) = window.bounds();
    let claim = s
        .store
        .claim_compaction(
            &s.table,
            &window.to_string(),
            start,
            end,
            Duration::from_secs(600),
        )
        .await
        .unwrap()
        .expect("the window is free");
    let shown = text_cells(
        &s.ctx,
        "SELECT table_id, window_key, generation, lease_expired, window_start, lease_expires_at \
         FROM pulpitum_compactions WHERE table_id = 'chat'",
    )
    .await;
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(
        shown[0][..4],
        ["chat", window.to_string().as_str(), "1", "false"],
        "{shown:?}"
    );
    assert!(shown[0][4].starts_with("2021-03-01T00:00:00"), "{shown:?}");
    let all = text_cells(&s.ctx, "SELECT * FROM pulpitum_compactions").await;
    assert!(
        all.iter()
            .flatten()
            .all(|c| !c.contains(&claim.owner_token)),
        "the owner token is shown: {all:?}"
    );
    assert!(text_cells(
        &s.ctx,
        "SELECT * FROM pulpitum_compactions WHERE table_id = 'other'"
    )
    .await
    .is_empty());
    s.store.release_compaction(&claim).await.unwrap();
    assert!(text_cells(&s.ctx, "SELECT * FROM pulpitum_compactions")
        .await
        .is_empty());

    let compactor = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    let report = compactor.compact_pass().await.unwrap();
    assert_eq!(report.windows, 1, "{report:?}");
    let mut expected: Vec<String> = s
        .store
        .retired_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.object_key)
        .collect();
    expected.sort();
    assert_eq!(expected.len(), report.buckets as usize);
    let shown: Vec<String> = text_cells(
        &s.ctx,
        "SELECT object_key FROM pulpitum_retired_objects WHERE retired_at <= now() ORDER BY object_key",
    )
    .await
    .into_iter()
    .map(|r| r[0].clone())
    .collect();
    assert_eq!(shown, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_with_unfinished_buckets_is_left_alone() {
    let s = setup("compactwait").await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 1, 30))
        .await
        .unwrap();
    // Only the first two days are eligible: the window's third bucket stays hot.
    let mut c = config();
    c.eligible_before = Some(EventTime::parse_rfc3339("2021-03-03T00:00:00Z").unwrap());
    let runner = Runner::new(s.store.clone(), s.archive.clone(), c).unwrap();
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let window = BucketKey::parse_any("month:2021-03").unwrap();
    let table = s.store.table(&s.table).await.unwrap().unwrap();
    assert_eq!(
        runner.compact_window(&table, window).await.unwrap(),
        WindowOutcome::NotReady
    );
    assert_eq!(runner.compact_pass().await.unwrap().windows, 0);
    assert!(routes(&s).await.iter().all(|(_, st)| !in_segment(st)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_rides_out_transient_object_store_failures() {
    let s = setup("compactfaults").await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 3, 100))
        .await
        .unwrap();
    archive_only(&s).await;
    // 15% of read and write calls fail (transiently) above the store's own retries, as in
    // the chaos test.
    let layer = pulpitum::archive::FaultLayer::new(
        pulpitum::archive::FaultPlan::new(7)
            .fail_ratio(pulpitum::archive::FaultOp::Read, 0.15)
            .fail_ratio(pulpitum::archive::FaultOp::Write, 0.15),
    );
    let faulty = Arc::new(s.archive.with_faults(layer.clone()));
    let compactor = Runner::new(s.store.clone(), faulty, config()).unwrap();
    let report = compactor.compact_pass().await.unwrap();
    assert!(layer.stats().failures > 0);
    assert_eq!(
        (report.windows, report.failed),
        (1, 0),
        "{:?}",
        report.errors
    );
    assert!(routes(&s).await.iter().all(|(_, st)| in_segment(st)));
    check_queries(&s.ctx, 3, 100, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_keeps_the_segments_of_a_window_being_compacted() {
    let s = setup("compactgc").await;
    let rs = rows("2021-03-01T00:00:00Z", 3, 30);
    s.store.append_batch(&s.table, &rs).await.unwrap();
    archive_only(&s).await;
    // A compactor that has claimed the window and written its segment, not yet switched.
    let window = BucketKey::parse_any("month:2021-03").unwrap();
    let (start, end) = window.bounds();
    let claim = s
        .store
        .claim_compaction(
            &s.table,
            &window.to_string(),
            start,
            end,
            Duration::from_secs(60),
        )
        .await
        .unwrap()
        .unwrap();
    let mut sorted = rs.clone();
    sorted.sort_by(|a, b| {
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
    let spec = pulpitum::archive::SegmentSpec {
        table_id: s.table.clone(),
        strategy: pulpitum::model::BucketStrategy::CalendarDayUtc,
        window,
        generation: claim.generation,
        ordinal: 0,
    };
    let written = s.archive.write_segment(&spec, &sorted).await.unwrap();
    let zero = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::ZERO,
    };
    collect_garbage_with(&*s.store, &s.archive, zero, &ArchiverMetrics::default())
        .await
        .unwrap();
    let keys: Vec<String> = object_keys(&s).await;
    assert!(
        keys.contains(&written.manifest_key),
        "a claimed window's segment was collected"
    );
    // Released without a switch, the segment is an orphan like any other.
    s.store.release_compaction(&claim).await.unwrap();
    collect_garbage_with(&*s.store, &s.archive, zero, &ArchiverMetrics::default())
        .await
        .unwrap();
    let keys: Vec<String> = object_keys(&s).await;
    assert!(!keys.iter().any(|k| k.contains("/segments/")), "{keys:?}");
    check_queries(&s.ctx, 3, 30, 0).await;
}

/// Channels 1 and 2 with 100,000 and 200,000 messages in one day: after compaction each
/// partition spans several row groups of one segment (a partition with more than 65,536
/// rows could not be read back once), and SQL still counts every row and pages the latest
/// 50, on PostgreSQL with S3 and on the embedded store with a local archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_of_several_row_groups_read_back_through_sql() {
    let dir = tempfile::tempdir().unwrap();
    let stacks = [
        (
            "postgres+s3",
            fresh_database("compactbig").await,
            fresh_archive_url("compactbig"),
        ),
        (
            "embedded+fs",
            format!("sqlite://{}", dir.path().join("hot.db").display()),
            format!("file://{}", dir.path().join("archive").display()),
        ),
    ];
    for (name, db, archive_url) in stacks {
        let s = setup_on(&db, &archive_url).await;
        let base = EventTime::parse_rfc3339("2021-05-10T00:00:00Z")
            .unwrap()
            .as_micros();
        let sizes = [(1i64, 100_000i64), (2, 200_000)];
        for (ch, n) in sizes {
            let rows: Vec<Record> = (0..n)
                .map(|i| Record {
                    partition_key: PartitionKey::from_i64(ch),
                    event_time: EventTime::from_micros(base + i * 400).unwrap(),
                    sort_key: SortKey::new(encode_i64(ch * 1_000_000 + i).to_vec()).unwrap(),
                    value: format!("c{ch} m{i}").into_bytes(),
                })
                .collect();
            for chunk in rows.chunks(20_000) {
                s.store.append_batch(&s.table, chunk).await.unwrap();
            }
        }
        archive_only(&s).await;
        let runner = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
        let report = runner.compact_pass().await.unwrap();
        assert_eq!(
            (report.windows, report.failed),
            (1, 0),
            "{name}: {report:?}"
        );
        assert!(
            routes(&s).await.iter().all(|(_, st)| in_segment(st)),
            "{name}"
        );
        // The per-bucket objects are gone: only the segment holds the rows.
        collect_garbage_with(
            &*s.store,
            &s.archive,
            GcDelays {
                orphans: Duration::ZERO,
                retired: Duration::ZERO,
            },
            &ArchiverMetrics::default(),
        )
        .await
        .unwrap();
        assert!(
            object_keys(&s)
                .await
                .iter()
                .all(|k| k.contains("/segments/")),
            "{name}"
        );
        let fresh = session(
            s.store.clone(),
            s.archive.clone(),
            SessionOptions::default(),
        )
        .await
        .unwrap();
        for (ch, n) in sizes {
            let b = query(
                &fresh,
                &format!("SELECT count(*), sum(id) FROM chat WHERE channel_id = {ch}"),
            )
            .await;
            let ids = (0..n).map(|i| ch * 1_000_000 + i);
            assert_eq!(
                (ints(&b, 0), ints(&b, 1)),
                (vec![n], vec![ids.sum::<i64>()]),
                "{name}: channel {ch}"
            );
            let b = query(
                &fresh,
                &format!(
                    "SELECT id FROM chat WHERE channel_id = {ch} \
                     ORDER BY timestamp DESC, id DESC LIMIT 50"
                ),
            )
            .await;
            assert_eq!(
                ints(&b, 0),
                (n - 50..n)
                    .rev()
                    .map(|i| ch * 1_000_000 + i)
                    .collect::<Vec<_>>(),
                "{name}: channel {ch} latest 50"
            );
        }
    }
}
