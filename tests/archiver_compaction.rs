//! Compaction with the real runner against PostgreSQL and S3: windows of published buckets
//! move into segments while SQL reads them, readers holding old routes keep reading until
//! the retirement delay, late buckets make work for their partitions only, windows are
//! worked a segment at a time across passes, and a
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
    let fresh = fresh_session(&s).await;
    check_queries(&fresh, channels, per_channel, rounds + 1).await;
    // After the retirement delay (zero here: no reader is left), GC leaves two segments
    // (payload and manifest each): 4 objects instead of 120.
    collect_garbage_with(
        &*s.store,
        &s.archive,
        GcDelays {
            orphans: Duration::ZERO,
            retired: Duration::ZERO,
            erased: Duration::ZERO,
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
        erased: Duration::from_secs(3600),
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
    gc_without_delays(&s).await;
    assert_eq!(s.archive.list_objects().await.unwrap().len(), 2);
    assert!(s.store.retired_objects().await.unwrap().is_empty());
    let fresh = fresh_session(&s).await;
    check_queries(&fresh, channels, per_channel, 2).await;
}

/// A compaction notes its window's segments directory before writing (a publication
/// leaves nothing noted), and an incremental GC pass past the delays deletes the replaced
/// per-bucket objects through the retired rows, keeps the routed segment and forgets the
/// noting: the archive and the registry end as a full pass would leave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn incremental_gc_follows_compactions_and_retired_objects() {
    use pulpitum::archiver::collect_garbage_incremental;

    let s = setup("compactnote").await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 3, 50))
        .await
        .unwrap();
    archive_only(&s).await;
    let noted = || async {
        s.store
            .gc_prefixes(Duration::ZERO, "", 100)
            .await
            .unwrap()
            .into_iter()
            .map(|g| g.prefix)
            .collect::<Vec<_>>()
    };
    assert!(noted().await.is_empty(), "published uploads stayed noted");
    let compactor = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    let report = compactor.compact_pass().await.unwrap();
    assert_eq!((report.windows, report.buckets), (1, 15));
    assert_eq!(
        noted().await,
        vec![s.archive.segments_prefix(&s.table, "month:2021-03")]
    );
    assert_eq!(object_keys(&s).await.len(), 32);
    let delays = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::ZERO,
        erased: Duration::ZERO,
    };
    let gc =
        collect_garbage_incremental(&*s.store, &s.archive, delays, &ArchiverMetrics::default())
            .await
            .unwrap();
    assert_eq!((gc.deleted, gc.prefixes_forgotten), (30, 1), "{gc:?}");
    assert_eq!(object_keys(&s).await.len(), 2);
    assert!(s.store.retired_objects().await.unwrap().is_empty());
    assert!(noted().await.is_empty());
    check_queries(&fresh_session(&s).await, 3, 50, 0).await;
}

/// The manifest key each bucket routes to, by (partition, bucket).
async fn route_keys(s: &Setup) -> Vec<(PartitionKey, String, String)> {
    s.store
        .list_buckets(&s.table, &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let key = match m.state {
                BucketState::Archived { object_key, .. } => object_key,
                other => panic!("{other:?}"),
            };
            (m.id.partition_key, m.id.bucket_key.to_string(), key)
        })
        .collect()
}

/// Late buckets make work for their partitions first: a new channel's bucket and an
/// existing channel's new day are rewritten (the existing channel with all its buckets of
/// the window, from the older segment), the untouched channel keeps its route to the older
/// segment, which GC therefore keeps even once it is retired; the next pass moves the
/// untouched channel out of the retired segment too, and GC then deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_bucket_rewrites_its_partition_then_the_rest_of_the_old_segment() {
    let s = setup("compactlate").await;
    let early = rows("2021-03-01T00:00:00Z", 2, 40);
    s.store.append_batch(&s.table, &early).await.unwrap();
    let runner = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let first = runner.compact_pass().await.unwrap();
    assert_eq!((first.windows, first.buckets), (1, 8), "{first:?}");
    let old_segment = route_keys(&s).await[0].2.clone();
    assert!(route_keys(&s).await.iter().all(|r| r.2 == old_segment));
    // Late appends into the same month: a new channel, and a new day of channel 2.
    let relabel = |rows: Vec<Record>, ch: i64, first_id: i64| {
        rows.into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                r.partition_key = PartitionKey::from_i64(ch);
                r.sort_key = SortKey::new(encode_i64(first_id + i as i64).to_vec()).unwrap();
                r
            })
            .collect::<Vec<_>>()
    };
    let late_new = relabel(rows("2021-03-20T00:00:00Z", 1, 5), 9, 900_000);
    let late_day = relabel(rows("2021-03-25T00:00:00Z", 1, 3), 2, 200_040);
    s.store.append_batch(&s.table, &late_new).await.unwrap();
    s.store.append_batch(&s.table, &late_day).await.unwrap();
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let second = runner.compact_pass().await.unwrap();
    assert_eq!(
        (second.windows, second.segments, second.buckets),
        (1, 1, 6),
        "channel 9's bucket, and channel 2's four early buckets with its late one: {second:?}"
    );
    let now = route_keys(&s).await;
    assert!(now.iter().all(|r| r.2.contains("/segments/")));
    for (pk, bucket, key) in &now {
        let untouched = *pk == PartitionKey::from_i64(1);
        assert_eq!(
            key == &old_segment,
            untouched,
            "{pk:?} {bucket} routes to {key}"
        );
    }
    let retired: Vec<String> = s
        .store
        .retired_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.object_key)
        .collect();
    assert!(retired.contains(&old_segment), "channel 2 moved off it");
    // Past every delay, GC keeps the older segment: channel 1 still routes to it.
    gc_without_delays(&s).await;
    let fresh = fresh_session(&s).await;
    let b = query(&fresh, "SELECT count(*), sum(id) FROM chat").await;
    let want: i64 = early
        .iter()
        .chain(&late_new)
        .chain(&late_day)
        .map(|r| pulpitum::model::decode_i64(r.sort_key.as_bytes()).unwrap())
        .sum();
    assert_eq!((ints(&b, 0), ints(&b, 1)), (vec![88], vec![want]));
    let b = query(
        &fresh,
        "SELECT id FROM chat WHERE channel_id = 2 ORDER BY timestamp, id",
    )
    .await;
    assert_eq!(
        ints(&b, 0),
        (200_000..200_043).collect::<Vec<_>>(),
        "channel 2 whole, from its new segment"
    );
    // Channel 1 routes to a retired segment, whose other rows are dead bytes now: the next
    // pass moves it (its four buckets) into a segment of its own, after which nothing
    // routes to the old one and GC deletes it.
    let third = runner.compact_pass().await.unwrap();
    assert_eq!(
        (third.windows, third.segments, third.buckets),
        (1, 1, 4),
        "{third:?}"
    );
    assert!(route_keys(&s).await.iter().all(|r| r.2 != old_segment));
    gc_without_delays(&s).await;
    let left = object_keys(&s).await;
    let old_dir = old_segment.trim_end_matches("manifest.json");
    assert!(
        !left.iter().any(|k| k.starts_with(old_dir)),
        "the old segment is deleted: {left:?}"
    );
    assert!(s.store.retired_objects().await.unwrap().is_empty());
    let b = query(&fresh, "SELECT count(*), sum(id) FROM chat").await;
    assert_eq!((ints(&b, 0), ints(&b, 1)), (vec![88], vec![want]));
    // Nothing left to do: the next pass finds no window.
    let fourth = runner.compact_pass().await.unwrap();
    assert_eq!((fourth.windows, fourth.buckets, fourth.skipped), (0, 0, 0));
}

/// A window is worked a page of partitions and a segment at a time, each segment switched
/// as soon as it is written: with a budget of zero every pass writes one segment and
/// stops, SQL reads every row between passes, the next pass resumes with the partitions
/// that still have work, and no bucket is rewritten twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_is_compacted_a_segment_at_a_time_across_passes() {
    let s = setup("compactpaged").await;
    let (channels, per_channel) = (11, 30);
    s.store
        .append_batch(
            &s.table,
            &rows("2021-03-01T00:00:00Z", channels, per_channel),
        )
        .await
        .unwrap();
    archive_only(&s).await;
    let mut c = config();
    c.compact_budget = Duration::ZERO;
    c.compact_page_partitions = 3;
    c.segment_max_partitions = 4;
    let runner = Runner::new(s.store.clone(), s.archive.clone(), c).unwrap();
    let metrics = runner.metrics();
    let in_segments = || async {
        route_keys(&s)
            .await
            .iter()
            .filter(|r| r.2.contains("/segments/"))
            .count()
    };
    let mut seen = Vec::new();
    for round in 0..4 {
        let r = runner.compact_pass().await.unwrap();
        assert_eq!(r.failed, 0, "{r:?}");
        seen.push((r.segments, r.buckets, r.budget_spent, in_segments().await));
        check_queries(&s.ctx, channels, per_channel, round).await;
    }
    assert_eq!(
        seen,
        vec![
            (1, 12, true, 12), // channels 1-4 (3 days each), then the budget
            (1, 12, true, 24), // channels 5-8: the switched ones have no work left
            (1, 9, false, 33), // channels 9-11 end the window
            (0, 0, false, 33), // nothing left
        ]
    );
    assert_eq!(metrics.buckets_compacted.get(), 33, "no bucket rewritten");
    let segments: std::collections::BTreeSet<String> =
        route_keys(&s).await.into_iter().map(|r| r.2).collect();
    assert_eq!(segments.len(), 3, "{segments:?}");
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
    gc_without_delays(&s).await;
    let keys: Vec<String> = object_keys(&s).await;
    assert!(
        keys.contains(&written.manifest_key),
        "a claimed window's segment was collected"
    );
    // Released without a switch, the segment is an orphan like any other.
    s.store.release_compaction(&claim).await.unwrap();
    gc_without_delays(&s).await;
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
                erased: Duration::ZERO,
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

/// The rows an archive object holds for one bucket, read raw (no masks applied).
async fn stored_rows(s: &Setup, key: &str, bucket: &pulpitum::model::BucketId) -> Vec<Record> {
    use futures::StreamExt;
    let route = s.archive.open_route(key, bucket).await.unwrap();
    let mut rows = s
        .archive
        .scan_route(
            &route,
            bucket,
            &pulpitum::archive::ArchiveScan::default(),
            Arc::default(),
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(b) = rows.next().await {
        out.extend(pulpitum::model::batch_to_records(&b.unwrap()).unwrap());
    }
    out
}

/// Deleted and edited archived rows leave the archive at the next compaction: the
/// partitions with masks are rewritten with the masks applied (a bucket whose every row was
/// deleted is dropped), the untouched partition keeps its route, a reader that planned on
/// the old routes still sees no deleted row, the masks the rewrite applied are forgotten by
/// GC after the retirement delay and a mask written after the rewrite is not; SQL answers
/// the same throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_and_edited_archived_rows_are_rewritten_out_of_the_archive() {
    let s = setup("compactpurge").await;
    let (channels, per_channel) = (3, 30);
    let all = rows("2021-03-01T00:00:00Z", channels, per_channel);
    s.store.append_batch(&s.table, &all).await.unwrap();
    archive_only(&s).await;
    let runner = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    assert_eq!(runner.compact_pass().await.unwrap().buckets, 9);
    let first = route_keys(&s).await[0].2.clone();
    check_queries(&s.ctx, channels, per_channel, 0).await;

    for sql in [
        "DELETE FROM chat WHERE channel_id = 2 AND id = 200005",
        // Every row of channel 2's second day.
        "DELETE FROM chat WHERE channel_id = 2 AND id >= 200010 AND id < 200020",
        "UPDATE chat SET content = 'edited' WHERE channel_id = 3 AND id = 300021",
    ] {
        query(&s.ctx, sql).await;
    }
    let gone = |id: i64| id == 200_005 || (200_010..200_020).contains(&id);
    let expect = |extra_gone: &dyn Fn(i64) -> bool| {
        let ids: Vec<i64> = all
            .iter()
            .map(|r| pulpitum::model::decode_i64(r.sort_key.as_bytes()).unwrap())
            .filter(|id| !gone(*id) && !extra_gone(*id))
            .collect();
        (vec![ids.len() as i64], vec![ids.iter().sum::<i64>()])
    };
    let answer = |ctx: SessionContext| async move {
        let b = query(&ctx, "SELECT count(*), sum(id) FROM chat").await;
        let edited = query(
            &ctx,
            "SELECT count(*) FROM chat WHERE channel_id = 3 AND content = 'edited'",
        )
        .await;
        ((ints(&b, 0), ints(&b, 1)), ints(&edited, 0))
    };
    assert_eq!(answer(s.ctx.clone()).await, (expect(&|_| false), vec![1]));

    let report = runner.compact_pass().await.unwrap();
    assert_eq!(
        (report.windows, report.buckets),
        (1, 5),
        "channel 2's first and third days and channel 3's three; the emptied day dropped: \
         {report:?}"
    );
    assert_eq!(runner.metrics().masks_purged.get(), 12);
    let now = route_keys(&s).await;
    assert_eq!(now.len(), 8, "channel 2's second day is gone: {now:?}");
    let rewritten = now
        .iter()
        .find(|r| r.0 == PartitionKey::from_i64(2))
        .unwrap()
        .2
        .clone();
    assert_ne!(rewritten, first);
    for (pk, bucket, key) in &now {
        let untouched = *pk == PartitionKey::from_i64(1);
        assert_eq!(key == &first, untouched, "{pk:?} {bucket}");
    }
    // The new segment holds neither the deleted rows nor the old body; the old one still
    // holds both (it is retired, and GC deletes it once no route names it).
    let bucket = |ch: i64, day: &str| pulpitum::model::BucketId {
        table_id: s.table.clone(),
        partition_key: PartitionKey::from_i64(ch),
        bucket_key: BucketKey::parse_any(&format!("day:2021-03-{day}")).unwrap(),
    };
    let ids = |rows: &[Record]| -> Vec<i64> {
        rows.iter()
            .map(|r| pulpitum::model::decode_i64(r.sort_key.as_bytes()).unwrap())
            .collect()
    };
    let new_day1 = stored_rows(&s, &rewritten, &bucket(2, "01")).await;
    assert_eq!(ids(&new_day1).len(), 9);
    assert!(!ids(&new_day1).contains(&200_005));
    assert!(ids(&stored_rows(&s, &first, &bucket(2, "01")).await).contains(&200_005));
    let new_day3 = stored_rows(&s, &rewritten, &bucket(3, "03")).await;
    let edited: Vec<&Record> = new_day3.iter().filter(|r| r.value == b"edited").collect();
    assert_eq!(edited.len(), 1);
    assert_eq!(
        pulpitum::model::decode_i64(edited[0].sort_key.as_bytes()),
        Some(300_021)
    );
    // The session planned on the old routes (inside its cache bound): the masks it reads
    // still hide the deleted rows in the old segment.
    assert_eq!(answer(s.ctx.clone()).await, (expect(&|_| false), vec![1]));

    // A delete after the rewrite: masked, not rewritten yet.
    query(
        &s.ctx,
        "DELETE FROM chat WHERE channel_id = 1 AND id = 100000",
    )
    .await;
    let later = |id: i64| id == 100_000;
    // GC inside the retirement delay forgets no mask.
    let inside = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::from_secs(3600),
        erased: Duration::from_secs(3600),
    };
    let r = collect_garbage_with(&*s.store, &s.archive, inside, &ArchiverMetrics::default())
        .await
        .unwrap();
    assert_eq!(r.masks_forgotten, 0);
    // Past it, the twelve rewritten masks go, the new one stays.
    let past = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::ZERO,
        erased: Duration::ZERO,
    };
    let r = collect_garbage_with(&*s.store, &s.archive, past, &ArchiverMetrics::default())
        .await
        .unwrap();
    assert_eq!(r.masks_forgotten, 12, "{r:?}");
    assert_eq!(s.store.row_masks(&bucket(1, "01")).await.unwrap().len(), 1);
    assert_eq!(
        answer(fresh_session(&s).await).await,
        (expect(&later), vec![1])
    );
    // The next pass rewrites channel 1; nothing is left to do after it.
    let r = runner.compact_pass().await.unwrap();
    assert_eq!((r.windows, r.buckets), (1, 3), "{r:?}");
    assert_eq!(runner.compact_pass().await.unwrap().windows, 0);
    let r = collect_garbage_with(&*s.store, &s.archive, past, &ArchiverMetrics::default())
        .await
        .unwrap();
    assert_eq!(r.masks_forgotten, 1, "{r:?}");
    assert_eq!(
        answer(fresh_session(&s).await).await,
        (expect(&later), vec![1])
    );
    // The first segment, which held the deleted rows beside channel 1's, is gone with its
    // last route, and no object left holds a deleted row or the old body.
    let first_dir = first.trim_end_matches("manifest.json");
    let left = object_keys(&s).await;
    assert!(!left.iter().any(|k| k.starts_with(first_dir)), "{left:?}");
    assert!(s.store.retired_objects().await.unwrap().is_empty());
    for (pk, b, key) in route_keys(&s).await {
        let id = pulpitum::model::BucketId {
            table_id: s.table.clone(),
            partition_key: pk,
            bucket_key: BucketKey::parse_any(&b).unwrap(),
        };
        for r in stored_rows(&s, &key, &id).await {
            let n = pulpitum::model::decode_i64(r.sort_key.as_bytes()).unwrap();
            assert!(!gone(n) && !later(n), "{n} still stored in {key}");
            assert_eq!(r.value == b"edited", n == 300_021, "{n} in {key}");
        }
    }
}

/// A channel still being written in its window (a hot bucket in the month) does not hold
/// its deletes back: the pass rewrites its archived buckets with the masks applied while
/// the hot bucket stays hot, GC then leaves no object holding the deleted row, and once
/// the late bucket is archived the next pass compacts the channel whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_channel_has_its_deletes_rewritten_before_its_window_completes() {
    let s = setup("compactbusy").await;
    let all = rows("2021-03-01T00:00:00Z", 2, 30);
    s.store.append_batch(&s.table, &all).await.unwrap();
    archive_only(&s).await;
    // Channel 2 is written again on the 25th: a hot bucket in the same month.
    let late = Record {
        partition_key: PartitionKey::from_i64(2),
        event_time: EventTime::parse_rfc3339("2021-03-25T12:00:00Z").unwrap(),
        sort_key: SortKey::new(encode_i64(200_900).to_vec()).unwrap(),
        value: b"late".to_vec(),
    };
    s.store.append_batch(&s.table, &[late]).await.unwrap();
    query(
        &s.ctx,
        "DELETE FROM chat WHERE channel_id = 2 AND id = 200005",
    )
    .await;
    let per_bucket_day1: String = s
        .store
        .list_buckets(&s.table, &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .find_map(|m| match m.state {
            BucketState::Archived { object_key, .. }
                if m.id.partition_key == PartitionKey::from_i64(2)
                    && m.id.bucket_key.to_string() == "day:2021-03-01" =>
            {
                Some(object_key)
            }
            _ => None,
        })
        .unwrap();

    let runner = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    let report = runner.compact_pass().await.unwrap();
    assert_eq!(
        (report.windows, report.buckets),
        (1, 6),
        "channel 1 (ready) and channel 2's three archived days (a delete waits in one): \
         {report:?}"
    );
    let buckets = s
        .store
        .list_buckets(&s.table, &BucketFilter::default())
        .await
        .unwrap();
    let mut hot = 0;
    for m in &buckets {
        match &m.state {
            BucketState::Archived { object_key, .. } => {
                assert!(object_key.contains("/segments/"), "{m:?}");
                for r in stored_rows(&s, object_key, &m.id).await {
                    let id = pulpitum::model::decode_i64(r.sort_key.as_bytes()).unwrap();
                    assert_ne!(id, 200_005, "the deleted row is rewritten out");
                }
            }
            _ => hot += 1,
        }
    }
    assert_eq!(hot, 1, "the 25th stays hot: {buckets:?}");
    gc_without_delays(&s).await;
    let old_dir = per_bucket_day1.trim_end_matches("manifest.json");
    let left = object_keys(&s).await;
    assert!(
        !left.iter().any(|k| k.starts_with(old_dir)),
        "the object that held the deleted row is gone: {left:?}"
    );
    let count = |ctx: SessionContext| async move {
        let b = query(&ctx, "SELECT count(*), sum(id) FROM chat").await;
        (ints(&b, 0), ints(&b, 1))
    };
    let ids: Vec<i64> = all
        .iter()
        .map(|r| pulpitum::model::decode_i64(r.sort_key.as_bytes()).unwrap())
        .filter(|id| *id != 200_005)
        .chain([200_900])
        .collect();
    let want = (vec![ids.len() as i64], vec![ids.iter().sum::<i64>()]);
    assert_eq!(count(s.ctx.clone()).await, want);

    // The late day archived: the channel is compacted whole, into one segment.
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let r = runner.compact_pass().await.unwrap();
    assert_eq!(r.buckets, 4, "channel 2's four days: {r:?}");
    let ch2: std::collections::BTreeSet<String> = route_keys(&s)
        .await
        .into_iter()
        .filter(|r| r.0 == PartitionKey::from_i64(2))
        .map(|r| r.2)
        .collect();
    assert_eq!(ch2.len(), 1, "one segment: {ch2:?}");
    // Channel 1 is left alone on the segment channel 2 left: the next pass moves it.
    let r = runner.compact_pass().await.unwrap();
    assert_eq!((r.windows, r.buckets), (1, 3), "{r:?}");
    assert_eq!(runner.compact_pass().await.unwrap().windows, 0);
    let fresh = fresh_session(&s).await;
    assert_eq!(count(fresh).await, want);
}

/// One full GC pass with no delays: every object no route or claim names is deleted.
async fn gc_without_delays(s: &Setup) -> pulpitum::archiver::GcReport {
    let delays = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::ZERO,
        erased: Duration::ZERO,
    };
    collect_garbage_with(&*s.store, &s.archive, delays, &ArchiverMetrics::default())
        .await
        .unwrap()
}

/// A session with nothing cached (no routes, no manifests).
async fn fresh_session(s: &Setup) -> SessionContext {
    session(
        s.store.clone(),
        s.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap()
}

/// Segments recorded with their bucket count not known (as migrations 31 and 34 record the
/// segments of older builds) are listed bucket by bucket until a full GC pass reads their
/// manifests and records the counts; from then on a listing across partitions names each
/// segment whole, and SQL reads every row once, warm and cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_gc_pass_records_the_counts_of_segments_recorded_without_one() {
    let db = fresh_database("recount").await;
    let s = setup_on(&db, &fresh_archive_url("recount")).await;
    s.store
        .append_batch(&s.table, &rows("2021-03-01T00:00:00Z", 3, 50))
        .await
        .unwrap();
    archive_only(&s).await;
    let compactor = Runner::new(s.store.clone(), s.archive.clone(), config()).unwrap();
    let report = compactor.compact_pass().await.unwrap();
    assert_eq!((report.windows, report.buckets), (1, 15));
    let (client, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let forgotten = client
        .execute("UPDATE pulpitum_v4_segment_routes SET buckets = -1", &[])
        .await
        .unwrap();
    assert!(forgotten >= 1);
    let march = (
        EventTime::parse_rfc3339("2021-03-01T00:00:00Z").unwrap(),
        EventTime::parse_rfc3339("2021-03-31T23:59:59Z").unwrap(),
    );
    let listing = || async {
        s.store
            .list_across(&s.table, march.0, march.1)
            .await
            .unwrap()
            .unwrap()
    };
    let before = listing().await;
    assert!(before.segments.is_empty());
    assert_eq!(before.buckets.len(), 15, "listed one by one");
    check_queries(&fresh_session(&s).await, 3, 50, 0).await;

    let gc = gc_without_delays(&s).await;
    assert_eq!(gc.segments_counted, forgotten, "{gc:?}");
    let after = listing().await;
    assert!(after.buckets.is_empty(), "{:?}", after.buckets);
    assert_eq!(after.segments.len() as u64, forgotten);
    assert_eq!(
        after.segments.iter().map(|(_, n)| n).sum::<u64>(),
        15,
        "the counts are the manifests'"
    );
    check_queries(&fresh_session(&s).await, 3, 50, 1).await;
    check_queries(&s.ctx, 3, 50, 2).await;
    // Counted once: the next full pass finds nothing to record.
    assert_eq!(gc_without_delays(&s).await.segments_counted, 0);

    // The count is the manifest's, never the routes': with one bucket routed elsewhere and
    // the counts forgotten again, recording them leaves every segment short of its count,
    // so none is named whole and the bucket that left is listed once, on its own.
    let moved = client
        .execute(
            "UPDATE pulpitum_v4_bucket_metadata SET object_key = 'chat/elsewhere/manifest.json' \
             WHERE (partition_key, bucket_key) IN (SELECT partition_key, bucket_key \
               FROM pulpitum_v4_bucket_metadata ORDER BY partition_key, bucket_key LIMIT 1)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(moved, 1);
    client
        .execute("UPDATE pulpitum_v4_segment_routes SET buckets = -1", &[])
        .await
        .unwrap();
    let counted = pulpitum::archiver::segment_counts::record_segment_counts(&*s.store, &s.archive)
        .await
        .unwrap();
    assert_eq!(counted.recorded, forgotten);
    let short = listing().await;
    assert_eq!(
        short.segments.len() as u64,
        forgotten - 1,
        "the segment a bucket left is not whole"
    );
    let mut one_by_one: Vec<String> = short
        .buckets
        .iter()
        .filter_map(|m| match &m.state {
            BucketState::Archived { object_key, .. } => Some(object_key.clone()),
            _ => None,
        })
        .collect();
    one_by_one.sort();
    assert!(
        one_by_one
            .iter()
            .filter(|k| *k == "chat/elsewhere/manifest.json")
            .count()
            == 1,
        "{one_by_one:?}"
    );
}
