//! Retired objects and the readers and backups that may still name them, on PostgreSQL and
//! radosgw: the retirement delay comes from the archiver's configuration (readers' bounds,
//! backup retention); a reader whose route's object is gone re-reads the route once and
//! follows it; and the restore procedure of docs/backup.md, run end to end: a hot-store
//! backup (`pg_dump`) taken before a compaction, restored (`pg_restore`) after the
//! compaction and GC, reads every row, and GC then deletes nothing the restored registry
//! names; the same on the embedded store, backed up and restored with SQLite's backup API
//! (`sqlite3 .backup` / `.restore`) beside a local archive. With a backup retention of 0 the same restore loses the per-bucket objects: the
//! retention is what keeps them.

mod archiver_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use archiver_support::*;
use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use pulpitum::archive::ArchiveStore;
use pulpitum::archiver::{collect_garbage_with, ArchiverConfig, ArchiverMetrics, GcDelays, Runner};
use pulpitum::model::{encode_i64, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{BucketFilter, BucketState, HotStore};
use tokio_util::sync::CancellationToken;

const DAY_US: i64 = 86_400_000_000;
const CHANNELS: i64 = 3;
const PER_CHANNEL: i64 = 50;

/// `CHANNELS` channels with `PER_CHANNEL` rows each, ten per day from March 1, 2021: 15 day
/// buckets in one month window.
fn rows() -> Vec<Record> {
    let base = EventTime::parse_rfc3339("2021-03-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let mut out = Vec::new();
    for ch in 1..=CHANNELS {
        for i in 0..PER_CHANNEL {
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

fn ints(b: &[RecordBatch], col: usize) -> Vec<i64> {
    b.iter()
        .flat_map(|b| {
            let a = b.column(col).as_any().downcast_ref::<Int64Array>().unwrap();
            assert_eq!(a.null_count(), 0);
            a.values().to_vec()
        })
        .collect()
}

async fn try_query(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
    df.collect().await.map_err(|e| e.to_string())
}

/// Every row once, whole and per channel, in both orders.
async fn check_rows(ctx: &SessionContext, what: &str) {
    let all: i64 = (1..=CHANNELS)
        .map(|ch| (0..PER_CHANNEL).map(|i| ch * 100_000 + i).sum::<i64>())
        .sum();
    let b = try_query(ctx, "SELECT count(*), sum(id) FROM chat")
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        (ints(&b, 0), ints(&b, 1)),
        (vec![CHANNELS * PER_CHANNEL], vec![all]),
        "{what}"
    );
    for ch in 1..=CHANNELS {
        let b = try_query(
            ctx,
            &format!("SELECT id FROM chat WHERE channel_id = {ch} ORDER BY timestamp, id"),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want: Vec<i64> = (0..PER_CHANNEL).map(|i| ch * 100_000 + i).collect();
        assert_eq!(ints(&b, 0), want, "{what}: channel {ch}");
        let b = try_query(
            ctx,
            &format!(
                "SELECT id FROM chat WHERE channel_id = {ch} ORDER BY timestamp DESC, id DESC LIMIT 7"
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want: Vec<i64> = want.iter().rev().take(7).copied().collect();
        assert_eq!(ints(&b, 0), want, "{what}: latest of channel {ch}");
    }
}

struct Setup {
    db: String,
    archive_url: String,
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    ctx: SessionContext,
}

async fn connect(
    db: &str,
    archive_url: &str,
) -> (Arc<dyn HotStore>, Arc<ArchiveStore>, SessionContext) {
    let (store, archive) = open(db, archive_url).await;
    let opts = SessionOptions {
        page_rows: 7,
        ..SessionOptions::default()
    };
    let ctx = session(store.clone(), archive.clone(), opts).await.unwrap();
    (store, archive, ctx)
}

/// A table holding [`rows`], archived (and cleaned) into per-bucket objects, not compacted,
/// on PostgreSQL and radosgw.
async fn archived(label: &str) -> Setup {
    archived_on(fresh_database(label).await, fresh_archive_url(label)).await
}

/// [`archived`] on these stores.
async fn archived_on(db: String, archive_url: String) -> Setup {
    let (store, archive, ctx) = connect(&db, &archive_url).await;
    try_query(&ctx, "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')").await.unwrap();
    let table = TableId::new("chat").unwrap();
    store.append_batch(&table, &rows()).await.unwrap();
    let mut c = config(Duration::ZERO);
    c.compaction = false;
    Runner::new(store.clone(), archive.clone(), c)
        .unwrap()
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    let s = Setup {
        db,
        archive_url,
        store,
        archive,
        ctx,
    };
    assert_eq!(
        per_bucket_keys(&s).await.len(),
        30,
        "a manifest and a payload per bucket"
    );
    s
}

/// The archiver's configuration: nothing left hot after publication, readers' bounds of
/// zero (no reader is left but the test's, whose routes are what is under test), and this
/// backup retention.
fn config(backup_retention: Duration) -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.interval = Duration::from_millis(50);
    c.reader_route_cache = Duration::ZERO;
    c.reader_statement_timeout = Duration::ZERO;
    c.backup_retention = backup_retention;
    c
}

/// One GC pass with the runner's own retirement delay (from its configuration) and no
/// orphan delay (no upload is in flight in these tests).
async fn gc(s: &Setup, runner: &Runner) -> pulpitum::archiver::GcReport {
    let delays = GcDelays {
        orphans: Duration::ZERO,
        ..runner.gc_delays()
    };
    collect_garbage_with(&*s.store, &s.archive, delays, &ArchiverMetrics::default())
        .await
        .unwrap()
}

async fn object_keys(archive: &ArchiveStore) -> BTreeSet<String> {
    archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

/// The objects of per-bucket archives (every key not under a `segments/` directory).
async fn per_bucket_keys(s: &Setup) -> BTreeSet<String> {
    object_keys(&s.archive)
        .await
        .into_iter()
        .filter(|k| !k.contains("/segments/"))
        .collect()
}

/// Every route of the store, by bucket.
async fn routes(store: &dyn HotStore) -> Vec<String> {
    store
        .list_buckets(&TableId::new("chat").unwrap(), &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| match m.state {
            BucketState::Archived { object_key, .. } => object_key,
            other => panic!("not archived: {other:?}"),
        })
        .collect()
}

/// Compacts the window: every route moves to the one segment.
async fn compact(s: &Setup, runner: &Runner) {
    let report = runner.compact_pass().await.unwrap();
    assert_eq!((report.windows, report.buckets), (1, 15), "{report:?}");
    assert!(routes(&*s.store)
        .await
        .iter()
        .all(|k| k.contains("/segments/")));
}

/// The retirement delay GC uses is the configuration's: with a backup retention of an hour
/// nothing retired goes; with every bound at zero (the delay is then the 5 s skew
/// allowance) the retired objects go once that has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_retired_objects_for_the_configured_retirement_delay() {
    let s = archived("retirecfg").await;
    let old = per_bucket_keys(&s).await;
    let hour = Runner::new(
        s.store.clone(),
        s.archive.clone(),
        config(Duration::from_secs(3600)),
    )
    .unwrap();
    assert_eq!(hour.gc_delays().retired, Duration::from_secs(3605));
    compact(&s, &hour).await;
    gc(&s, &hour).await;
    assert_eq!(
        per_bucket_keys(&s).await,
        old,
        "retired objects deleted inside the backup retention"
    );
    assert_eq!(s.store.retired_objects().await.unwrap().len(), 15);

    let zero = Runner::new(s.store.clone(), s.archive.clone(), config(Duration::ZERO)).unwrap();
    assert_eq!(zero.gc_delays().retired, Duration::from_secs(5));
    gc(&s, &zero).await;
    assert_eq!(
        per_bucket_keys(&s).await,
        old,
        "retired objects deleted inside the skew allowance"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let report = gc(&s, &zero).await;
    assert_eq!(report.deleted, 30, "{report:?}");
    assert!(per_bucket_keys(&s).await.is_empty());
    assert!(s.store.retired_objects().await.unwrap().is_empty());
    check_rows(&s.ctx, "after GC").await;
}

/// A reader that cached the per-bucket routes, and a scan planned (its buckets listed)
/// before the compaction, both read after GC deleted the old objects: each meets
/// `NotFound`, re-reads the route once and reads the segment, every row exactly once. A
/// route whose object is gone without a new route keeps its `NotFound`, naming the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_holding_replaced_routes_follow_the_new_route_after_gc() {
    let s = archived("retirereader").await;
    let old = per_bucket_keys(&s).await;
    // The session caches the per-bucket routes (60 s bound) ...
    check_rows(&s.ctx, "before compaction").await;
    // ... and this scan lists its buckets now, at planning.
    let planned = s
        .ctx
        .sql("SELECT count(*), sum(id) FROM chat")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    // Another process, with nothing cached, plans the same scan: its manifests are read
    // only when it runs.
    let (_, _, cold) = connect(&s.db, &s.archive_url).await;
    let cold_planned = cold
        .sql("SELECT count(*), sum(id) FROM chat")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let runner = Runner::new(s.store.clone(), s.archive.clone(), config(Duration::ZERO)).unwrap();
    compact(&s, &runner).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    gc(&s, &runner).await;
    assert!(
        per_bucket_keys(&s).await.is_disjoint(&old),
        "GC deleted the replaced objects"
    );

    let all: i64 = (1..=CHANNELS)
        .map(|ch| (0..PER_CHANNEL).map(|i| ch * 100_000 + i).sum::<i64>())
        .sum();
    for (plan, ctx) in [(planned, &s.ctx), (cold_planned, &cold)] {
        let b = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .expect("the scan planned before the switch follows the new routes");
        assert_eq!(
            (ints(&b, 0), ints(&b, 1)),
            (vec![CHANNELS * PER_CHANNEL], vec![all])
        );
    }
    check_rows(&s.ctx, "cached routes after GC").await;

    // A scan planned over the segment by a process with nothing cached (each channel's
    // buckets one run of that object), then a row deleted, the window rewritten into a
    // new segment and the first one deleted by GC: every run meets `NotFound` before any
    // row, and its buckets are read one by one from their new routes. (A process that had
    // the segment's row groups cached would read them from memory, past its bounds.)
    let (_, _, cold) = connect(&s.db, &s.archive_url).await;
    let planned = cold
        .sql("SELECT count(*), sum(id) FROM chat")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let first_segment = routes(&*s.store).await[0].clone();
    try_query(
        &s.ctx,
        "DELETE FROM chat WHERE channel_id = 1 AND id = 100000",
    )
    .await
    .unwrap();
    // The first pass rewrites channel 1 (masked), the next moves the others off the
    // segment it left.
    for _ in 0..3 {
        let report = runner.compact_pass().await.unwrap();
        assert_eq!(report.failed, 0, "{report:?}");
        if !routes(&*s.store).await.contains(&first_segment) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    gc(&s, &runner).await;
    assert!(
        !routes(&*s.store).await.contains(&first_segment)
            && !object_keys(&s.archive).await.contains(&first_segment),
        "the window was rewritten and its first segment deleted"
    );
    let b = datafusion::physical_plan::collect(planned, cold.task_ctx())
        .await
        .expect("runs planned over a deleted segment follow the new routes");
    assert_eq!(
        (ints(&b, 0), ints(&b, 1)),
        (vec![CHANNELS * PER_CHANNEL - 1], vec![all - 100_000])
    );

    // The segment deleted by hand: the route did not change, so the read fails, naming
    // the missing object.
    let segments = routes(&*s.store).await;
    for k in object_keys(&s.archive).await {
        s.archive.delete_object(&k).await.unwrap();
    }
    // A new process: nothing cached, neither routes nor manifests.
    let (_, _, fresh) = connect(&s.db, &s.archive_url).await;
    let err = try_query(&fresh, "SELECT sum(id) FROM chat")
        .await
        .unwrap_err();
    assert!(
        err.contains("not found") && segments.iter().any(|k| err.contains(k)),
        "{err}"
    );
}

/// docs/backup.md run end to end: backup, compaction, GC past the delays, restore of the
/// old backup with every process stopped, then the archivers started again. On
/// PostgreSQL (`pg_dump`/`pg_restore`) when `embedded` is `None`, else on the embedded
/// store in that folder (SQLite's backup API through `sqlite3 .backup` and `.restore`)
/// with a local archive.
async fn backup_compact_gc_restore(
    label: &str,
    retention: Duration,
    embedded: Option<&std::path::Path>,
) -> Setup {
    let s = match embedded {
        None => archived(label).await,
        Some(dir) => {
            let db = format!("sqlite:{}", dir.join("hot.sqlite3").display());
            let archive = format!("file://{}", dir.join("archive").display());
            archived_on(db, archive).await
        }
    };
    let dump = match sqlite_path(&s.db) {
        None => std::env::temp_dir().join(format!("{}.dump", schema_of(&s.db))),
        Some(path) => std::path::Path::new(path).with_extension("backup"),
    };
    match sqlite_path(&s.db) {
        None => pg_backup(&s.db, &dump),
        // Safe while the store has the file open (SQLite's online backup).
        Some(path) => run_tool(
            std::process::Command::new("sqlite3")
                .arg(path)
                .arg(format!(".backup {}", dump.display())),
        ),
    }
    let runner = Runner::new(s.store.clone(), s.archive.clone(), config(retention)).unwrap();
    compact(&s, &runner).await;
    check_rows(&s.ctx, "after compaction").await;
    // Past the skew allowance: with a retention of 0 the retired objects are due.
    tokio::time::sleep(Duration::from_secs(6)).await;
    gc(&s, &runner).await;
    // Every process stopped (their handles dropped), the old backup restored; the live
    // archive is kept.
    drop(runner);
    let Setup {
        db, archive_url, ..
    } = s;
    tokio::time::sleep(Duration::from_millis(200)).await;
    match sqlite_path(&db) {
        None => pg_restore(&db, &dump).await,
        Some(path) => run_tool(
            std::process::Command::new("sqlite3")
                .arg(path)
                .arg(format!(".restore {}", dump.display())),
        ),
    }
    let _ = std::fs::remove_file(&dump);
    let (store, archive, ctx) = connect(&db, &archive_url).await;
    Setup {
        db,
        archive_url,
        store,
        archive,
        ctx,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_backup_restores_after_compaction_and_gc() {
    restores_whole(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_backup_restores_after_compaction_and_gc_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    restores_whole(Some(dir.path())).await;
}

/// [`backup_compact_gc_restore`] with the default backup retention: every row readable,
/// GC deletes the segment and nothing the restored registry names, and the window is
/// compacted again.
async fn restores_whole(embedded: Option<&std::path::Path>) {
    let retention = ArchiverConfig::with_defaults().backup_retention;
    let r = backup_compact_gc_restore("restore", retention, embedded).await;
    // The restored registry names the per-bucket objects again, and they are all there.
    let named: BTreeSet<String> = routes(&*r.store).await.into_iter().collect();
    assert_eq!(named.len(), 15);
    assert!(named.iter().all(|k| !k.contains("/segments/")));
    let live = object_keys(&r.archive).await;
    assert!(named.is_subset(&live), "{named:?} not all in {live:?}");
    assert!(r.store.retired_objects().await.unwrap().is_empty());
    check_rows(&r.ctx, "restored").await;

    // The archivers started again: GC deletes the segment (nothing in the restored registry
    // names it) and nothing the registry names.
    let runner = Runner::new(
        r.store.clone(),
        r.archive.clone(),
        config(ArchiverConfig::with_defaults().backup_retention),
    )
    .unwrap();
    let report = gc(&r, &runner).await;
    let left = object_keys(&r.archive).await;
    assert!(
        left.iter().all(|k| !k.contains("/segments/")),
        "the orphaned segment is deleted: {left:?}"
    );
    assert_eq!(report.deleted, 2, "{report:?}");
    assert_eq!(
        per_bucket_keys(&r).await.len(),
        30,
        "manifests and payloads"
    );
    check_rows(&r.ctx, "restored, after GC").await;
    // And the window is compacted again, into a new segment.
    compact(&r, &runner).await;
    let fresh = session(
        r.store.clone(),
        r.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    check_rows(&fresh, "restored and compacted again").await;
}

/// The rule has teeth: with a backup retention of 0, GC deletes the retired per-bucket
/// objects once the (zero) reader bounds and the skew allowance have passed, and the same
/// restore then cannot read the rows: the query fails naming a missing object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_backup_retention_a_restore_loses_the_replaced_objects() {
    let r = backup_compact_gc_restore("restorenone", Duration::ZERO, None).await;
    let named: BTreeSet<String> = routes(&*r.store).await.into_iter().collect();
    let live = object_keys(&r.archive).await;
    assert!(
        named.is_disjoint(&live),
        "GC kept retired objects with no retention: {live:?}"
    );
    let err = try_query(&r.ctx, "SELECT sum(id) FROM chat")
        .await
        .unwrap_err();
    assert!(err.contains("not found"), "{err}");
    assert!(named.iter().any(|k| err.contains(k.as_str())), "{err}");
}
