//! Stores written by earlier builds, read by this one: each directory under
//! `tests/fixtures/` is an embedded hot store (`hot.sqlite3`) and its archive (`archive/`)
//! as one build left them, with a `chat` table and a declared table (`events`, one column
//! added after its first rows) in every tier: rows compacted into a segment, per-bucket
//! JSON and Parquet payloads, hot buckets, a deleted and an edited archived row. This build
//! migrates a copy, reads every row back as the generator below says it must be, archives
//! what is left and reads them again.
//!
//! A build that changes a format adds its own directory (`PULPITUM_WRITE_FIXTURES=1 cargo
//! test --test fixtures write_this_builds_fixture`, then commit it): every later build must
//! read it. The rows are not stored in the test; they are generated, so a fixture can only
//! pass by holding exactly what the generator wrote through the real stores.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use pulpitum::archive::{ArchiveStore, PayloadFormat};
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::EventTime;
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::HotStore;
use tokio_util::sync::CancellationToken;

/// 2021-01-04T00:00:00Z: January's days end up in a segment, February's per bucket.
const JAN: i64 = 1_609_718_400_000_000;
const FEB: i64 = 1_612_137_600_000_000;
const DAY: i64 = 86_400_000_000;

/// The days rows are written on: three in January (compacted into a segment), four in
/// February (per-bucket JSON, per-bucket Parquet, then hot).
fn days() -> impl Iterator<Item = (i64, i64)> {
    (0..3)
        .map(|d| (d, JAN + d * DAY))
        .chain((0..4).map(|d| (3 + d, FEB + d * DAY)))
}

/// `(channel, micros, id, content)` of every chat row the generator writes.
fn chat_rows() -> Vec<(i64, i64, i64, String)> {
    let mut out = Vec::new();
    for channel in [1, 2] {
        for (d, start) in days() {
            for m in 0..5 {
                let id = channel * 100_000 + d * 100 + m;
                out.push((
                    channel,
                    start + m * 1_000_000,
                    id,
                    format!("message {id} in channel {channel}"),
                ));
            }
        }
    }
    out
}

/// `(tenant, micros, seq, kind, amount, note)` of every events row; `note` is the column
/// added after the first rows (NULL before), `amount` NULL every seventh row.
type Event = (i64, i64, i64, String, Option<f64>, Option<String>);

fn event_rows(with_note: bool) -> Vec<Event> {
    let mut out = Vec::new();
    for tenant in [7, 8] {
        for (d, start) in days() {
            for m in 0..4 {
                let seq = tenant * 1_000 + d * 10 + m;
                out.push((
                    tenant,
                    start + m * 1_000_000,
                    seq,
                    format!("k{}", seq % 3),
                    (seq % 7 != 0).then(|| seq as f64 / 4.0),
                    with_note.then(|| format!("n{seq}")),
                ));
            }
        }
    }
    out
}

fn ts(micros: i64) -> String {
    EventTime::from_micros(micros).unwrap().to_string()
}

async fn run(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    pulpitum::control::sql(ctx, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Channel 1, January 5 (in the segment), message 2.
const DELETED_CHAT: i64 = 100_000 + 100 + 2;
/// Channel 2, February 1 (per-bucket JSON), message 3.
const EDITED_CHAT: i64 = 200_000 + 300 + 3;

async fn archive_to(
    store: &Arc<dyn HotStore>,
    archive: &Arc<ArchiveStore>,
    before: i64,
    format: PayloadFormat,
    compact: bool,
) {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::from_micros(before).unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.format = format;
    c.compaction = compact;
    c.compact_after = Duration::ZERO;
    let runner = Runner::new(store.clone(), archive.clone(), c).unwrap();
    runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    if compact {
        let r = runner.compact_pass().await.unwrap();
        assert_eq!(r.failed, 0, "{r:?}");
    }
}

async fn write(dir: &Path) {
    std::fs::create_dir_all(dir.join("archive")).unwrap();
    let db = format!("sqlite://{}", dir.join("hot.sqlite3").display());
    let store = pulpitum::store::open(&db).await.unwrap();
    store.migrate().await.unwrap();
    let archive = Arc::new(
        ArchiveStore::from_url(&format!("file://{}", dir.join("archive").display())).unwrap(),
    );
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    run(&ctx, "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')").await;
    run(&ctx, "CREATE EXTERNAL TABLE events (tenant BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL, seq BIGINT NOT NULL, kind TEXT NOT NULL, amount DOUBLE PRECISION) STORED AS PULPITUM LOCATION '' OPTIONS ('partition_by' 'tenant', 'time' 'at', 'order_by' 'seq', 'bucket_strategy' 'calendar_day_utc')").await;
    for (c, t, id, content) in chat_rows() {
        run(
            &ctx,
            &format!(
                "INSERT INTO chat VALUES ({c}, TIMESTAMP '{}', {id}, '{content}')",
                ts(t)
            ),
        )
        .await;
    }
    for (tenant, t, seq, kind, amount, _) in
        event_rows(false).into_iter().filter(|e| e.1 < FEB + DAY)
    {
        let amount = amount.map_or("NULL".into(), |a| a.to_string());
        run(
            &ctx,
            &format!(
                "INSERT INTO events VALUES ({tenant}, TIMESTAMPTZ '{}', {seq}, '{kind}', {amount})",
                ts(t)
            ),
        )
        .await;
    }
    // January into a segment, February 1 to JSON, February 2 to Parquet (both tables).
    archive_to(&store, &archive, FEB, PayloadFormat::Parquet, true).await;
    archive_to(&store, &archive, FEB + DAY, PayloadFormat::Json, false).await;
    run(&ctx, "ALTER TABLE events ADD COLUMN note TEXT").await;
    for (tenant, t, seq, kind, amount, note) in
        event_rows(true).into_iter().filter(|e| e.1 >= FEB + DAY)
    {
        let amount = amount.map_or("NULL".into(), |a| a.to_string());
        run(&ctx, &format!("INSERT INTO events VALUES ({tenant}, TIMESTAMPTZ '{}', {seq}, '{kind}', {amount}, '{}')", ts(t), note.unwrap())).await;
    }
    archive_to(
        &store,
        &archive,
        FEB + 2 * DAY,
        PayloadFormat::Parquet,
        false,
    )
    .await;
    run(&ctx, &format!("DELETE FROM chat WHERE id = {DELETED_CHAT}")).await;
    run(
        &ctx,
        &format!("UPDATE chat SET content = 'edited' WHERE id = {EDITED_CHAT}"),
    )
    .await;
    run(&ctx, "UPDATE events SET amount = -1 WHERE seq % 5 = 0").await;
}

/// Every fixture directory, oldest build first.
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|r| {
            r.filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

async fn check(ctx: &SessionContext, what: &str) {
    // chat: every row, as generated, without the deleted one and with the edit.
    let want: Vec<(i64, i64, i64, String)> = chat_rows()
        .into_iter()
        .filter(|r| r.2 != DELETED_CHAT)
        .map(|(c, t, id, content)| {
            (
                c,
                t,
                id,
                if id == EDITED_CHAT {
                    "edited".into()
                } else {
                    content
                },
            )
        })
        .collect();
    let got: Vec<(i64, i64, i64, String)> = run(
        ctx,
        "SELECT channel_id, timestamp, id, content FROM chat ORDER BY channel_id, timestamp, id",
    )
    .await
    .iter()
    .flat_map(|b| {
        let c = b.column(0).as_primitive::<Int64Type>().clone();
        let t = b
            .column(1)
            .as_primitive::<TimestampMicrosecondType>()
            .clone();
        let id = b.column(2).as_primitive::<Int64Type>().clone();
        let s = b.column(3).as_string::<i32>().clone();
        (0..b.num_rows())
            .map(move |i| (c.value(i), t.value(i), id.value(i), s.value(i).to_string()))
            .collect::<Vec<_>>()
    })
    .collect();
    assert_eq!(got, want, "{what}: chat");

    let mut want: Vec<Event> = event_rows(false)
        .into_iter()
        .filter(|e| e.1 < FEB + DAY)
        .chain(event_rows(true).into_iter().filter(|e| e.1 >= FEB + DAY))
        .map(|mut e| {
            if e.2 % 5 == 0 {
                e.4 = Some(-1.0);
            }
            e
        })
        .collect();
    want.sort_by_key(|e| (e.0, e.1, e.2));
    let got: Vec<Event> = run(
        ctx,
        "SELECT tenant, at, seq, kind, amount, note FROM events ORDER BY tenant, at, seq",
    )
    .await
    .iter()
    .flat_map(|b| {
        let b = b.clone();
        (0..b.num_rows())
            .map(move |i| {
                let a = b
                    .column(4)
                    .as_primitive::<datafusion::arrow::datatypes::Float64Type>();
                let n = b.column(5).as_string::<i32>();
                (
                    b.column(0).as_primitive::<Int64Type>().value(i),
                    b.column(1)
                        .as_primitive::<TimestampMicrosecondType>()
                        .value(i),
                    b.column(2).as_primitive::<Int64Type>().value(i),
                    b.column(3).as_string::<i32>().value(i).to_string(),
                    a.is_valid(i).then(|| a.value(i)),
                    n.is_valid(i).then(|| n.value(i).to_string()),
                )
            })
            .collect::<Vec<_>>()
    })
    .collect();
    assert_eq!(got, want, "{what}: events");
    // And with a value predicate applied inside the columnar reads.
    let n = run(ctx, "SELECT count(*) FROM events WHERE amount < 0").await;
    assert_eq!(
        n[0].column(0).as_primitive::<Int64Type>().value(0),
        want.iter().filter(|e| e.4 == Some(-1.0)).count() as i64,
        "{what}: events, filtered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_reads_back_with_this_build() {
    let dirs = fixtures();
    assert!(!dirs.is_empty(), "no fixture under tests/fixtures");
    for dir in dirs {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&dir, tmp.path());
        let db = format!("sqlite://{}", tmp.path().join("hot.sqlite3").display());
        let store = pulpitum::store::open_existing(&db).await.unwrap();
        // The newer build's migrations, then its reads.
        store.migrate().await.unwrap();
        let archive = Arc::new(
            ArchiveStore::from_url(&format!("file://{}", tmp.path().join("archive").display()))
                .unwrap(),
        );
        let what = dir.file_name().unwrap().to_string_lossy().to_string();
        let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
            .await
            .unwrap();
        // Every tier is there to be read: hot buckets, segments, per-bucket payloads of
        // both formats.
        for (tier, sql) in [
            ("hot", "SELECT count(*) FROM pulpitum_buckets WHERE state = 'hot'"),
            ("segment", "SELECT count(*) FROM pulpitum_buckets WHERE archive_object LIKE '%/segments/%'"),
            ("json", "SELECT count(*) FROM pulpitum_buckets WHERE bucket_key = 'day:2021-02-01' AND state = 'archived'"),
            ("parquet", "SELECT count(*) FROM pulpitum_buckets WHERE bucket_key = 'day:2021-02-02' AND state = 'archived'"),
        ] {
            let n = run(&ctx, sql).await;
            assert!(
                n[0].column(0).as_primitive::<Int64Type>().value(0) > 0,
                "{what}: no {tier} bucket"
            );
        }
        check(&ctx, &what).await;
        // This build archives and compacts what the older one left, and reads it all again.
        archive_rest(&store, &archive).await;
        let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
            .await
            .unwrap();
        let tiers = run(
            &ctx,
            "SELECT count(*) FROM pulpitum_buckets WHERE state = 'hot'",
        )
        .await;
        assert_eq!(
            tiers[0].column(0).as_primitive::<Int64Type>().value(0),
            0,
            "{what}"
        );
        check(&ctx, &format!("{what}, archived by this build")).await;
    }
}

async fn archive_rest(store: &Arc<dyn HotStore>, archive: &Arc<ArchiveStore>) {
    archive_to(
        store,
        archive,
        FEB + 400 * DAY,
        PayloadFormat::Parquet,
        true,
    )
    .await;
}

/// Writes this build's fixture when `PULPITUM_WRITE_FIXTURES=1` (a no-op otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_this_builds_fixture() {
    if std::env::var("PULPITUM_WRITE_FIXTURES").as_deref() != Ok("1") {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("v{}", env!("CARGO_PKG_VERSION")));
    assert!(
        !dir.exists(),
        "{} exists: a fixture is never rewritten",
        dir.display()
    );
    write(&dir).await;
}
