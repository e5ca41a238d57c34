//! End-to-end archival throughput against the real PostgreSQL and S3 (or the local
//! filesystem when `PULPITUM_BENCH_ARCHIVE=fs`), with baselines measured in the same run.
//!
//! 1. One 1M-row bucket: claim, fenced snapshot pages, Parquet upload, verification,
//!    publication and cleanup, against `COPY (SELECT ...) TO STDOUT` of the same rows.
//! 2. 1,000 ten-row buckets: the fixed per-bucket cost, in buckets per second.
//! 3. The same 1,000 buckets under the daemon's defaults (scan limit 64, cleanup delay 60 s,
//!    interval 15 s, concurrency 4): buckets published per second by `Runner::run`, the
//!    figure an operator sees, within a time budget (`PULPITUM_BENCH_BUDGET_SECONDS`, 180).
//!
//! `cargo bench --profile dev-bench --bench archiver` (rows: `PULPITUM_BENCH_ROWS`; parts:
//! `PULPITUM_BENCH_PARTS`, a comma list of `large`, `small`, `defaults`; all by default).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{pin_mut, TryStreamExt};
use pulpitum::archive::{ArchiveStore, PayloadFormat};
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::{BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::postgres::PgStore;
use pulpitum::store::{Appends, Catalog, RoutedReads, TableDefinition};
use tokio_util::sync::CancellationToken;

fn pg_url() -> String {
    std::env::var("PULPITUM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn archive_url(label: &str) -> (String, Option<tempfile::TempDir>) {
    if std::env::var("PULPITUM_BENCH_ARCHIVE").as_deref() == Ok("fs") {
        let dir = tempfile::tempdir().unwrap();
        return (format!("file://{}", dir.path().display()), Some(dir));
    }
    for (k, v) in [
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:7480"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "AKTEST"),
        ("AWS_SECRET_ACCESS_KEY", "SKTESTSECRET"),
    ] {
        if std::env::var(k).is_err() {
            std::env::set_var(k, v);
        }
    }
    (
        format!(
            "s3://pulpitum-test/bench_{label}_{:08x}",
            rand::random::<u32>()
        ),
        None,
    )
}

async fn setup(
    label: &str,
) -> (
    Arc<PgStore>,
    Arc<ArchiveStore>,
    String,
    Option<tempfile::TempDir>,
) {
    let schema = format!("bench_{label}_{:08x}", rand::random::<u32>());
    let store = Arc::new(
        PgStore::connect_with_schema(&pg_url(), &schema)
            .await
            .expect("PostgreSQL"),
    );
    store.migrate().await.unwrap();
    let (url, dir) = archive_url(label);
    let archive = Arc::new(ArchiveStore::from_url(&url).unwrap());
    (store, archive, schema, dir)
}

fn config() -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.format = PayloadFormat::Parquet;
    c.concurrency = 8;
    c.scan_limit = 10_000;
    c
}

async fn load(store: &PgStore, table: &TableId, channels: u64, rows_per: u64, day_spread: bool) {
    let base = EventTime::parse_rfc3339("2021-01-01T00:00:00Z")
        .unwrap()
        .as_micros();
    for c in 0..channels {
        let mut batch = Vec::with_capacity(5_000);
        for i in 0..rows_per {
            let t = if day_spread {
                base + (i as i64 % 365) * 86_400_000_000 + i as i64
            } else {
                base + i as i64 * 1_000
            };
            batch.push(Record {
                partition_key: PartitionKey::new((c + 1).to_be_bytes().to_vec()).unwrap(),
                event_time: EventTime::from_micros(t).unwrap(),
                sort_key: SortKey::new(i.to_be_bytes().to_vec()).unwrap(),
                value: format!(
                    "message {i} in channel {c}: the quick brown fox jumps over the lazy dog"
                )
                .into_bytes(),
            });
            if batch.len() == 5_000 {
                store.append_batch(table, &batch).await.unwrap();
                batch.clear();
            }
        }
        if !batch.is_empty() {
            store.append_batch(table, &batch).await.unwrap();
        }
    }
}

async fn copy_out(store: &PgStore) -> (u64, Duration) {
    let client = store.raw_client().await.unwrap();
    let started = Instant::now();
    // COPY cannot take bind parameters; the statement names no values (the schema holds only
    // the benchmark's bucket).
    let stream = client
        .copy_out("COPY (SELECT partition_key, event_time, sort_key, value FROM pulpitum_v4_records ORDER BY event_time, sort_key) TO STDOUT (FORMAT binary)")
        .await
        .unwrap();
    pin_mut!(stream);
    let mut bytes = 0u64;
    while let Some(chunk) = stream.try_next().await.unwrap() {
        bytes += chunk.len() as u64;
    }
    (bytes, started.elapsed())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls).await.is_err() {
            eprintln!("archiver bench: PostgreSQL unreachable at {}; skipped", pg_url());
            return;
        }
        let parts = std::env::var("PULPITUM_BENCH_PARTS").unwrap_or_else(|_| "large,small,defaults".into());
        let part = |name: &str| parts.split(',').any(|p| p.trim() == name);
        let rows: u64 = std::env::var("PULPITUM_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        let table = TableId::new("bench").unwrap();

        if part("large") {
        // 1. One large bucket.
        let (store, archive, schema, _dir) = setup("large").await;
        store
            .register_table(&TableDefinition::new(table.clone(), BucketStrategy::CalendarYearUtc, "chat"))
            .await
            .unwrap();
        let t = Instant::now();
        load(&store, &table, 1, rows, false).await;
        eprintln!("archiver bench: loaded {rows} rows in {:.1} s (schema {schema})", t.elapsed().as_secs_f64());
        let (copy_bytes, copy_time) = copy_out(&store).await;
        // Phase timings of the large bucket come from the runner's own log lines.
        let _log = tracing::subscriber::set_default(
            tracing_subscriber::fmt().with_env_filter("pulpitum::archiver=info").with_writer(std::io::stderr).finish(),
        );
        let mut big = config();
        big.snapshot_page_rows = 20_000;
        big.cleanup_batch_rows = 50_000;
        let runner = Runner::new(store.clone(), archive.clone(), big).unwrap();
        let db_start = store.now().await.unwrap();
        let started = Instant::now();
        // Publication, then (cleanup delay zero) the cleanup as the drain's next item.
        let report = runner.drain(&CancellationToken::new(), &|_, _| {}).await.unwrap().totals;
        let archive_time = started.elapsed();
        drop(_log);
        assert_eq!((report.archived, report.cleaned, report.failed), (1, 1, 0), "{report:?}");
        let m = runner.metrics();
        let copy_rps = rows as f64 / copy_time.as_secs_f64();
        let arch_rps = rows as f64 / archive_time.as_secs_f64();
        println!(
            "archive one bucket: {rows} rows end to end (snapshot+parquet+upload+verify+publish+cleanup) in {:.2} s = {:.0} rows/s, {:.1} MB/s payload ({} bytes)",
            archive_time.as_secs_f64(),
            arch_rps,
            m.bytes_archived.get() as f64 / archive_time.as_secs_f64() / 1e6,
            m.bytes_archived.get()
        );
        println!(
            "baseline COPY (SELECT ...) TO STDOUT: {rows} rows in {:.2} s = {:.0} rows/s ({copy_bytes} bytes)",
            copy_time.as_secs_f64(),
            copy_rps
        );
        // The read cutover happens at publication; cleanup (deleting the hot rows) follows.
        let bucket = store
            .list_buckets(&table, &pulpitum::store::BucketFilter::default())
            .await
            .unwrap()
            .remove(0);
        let published = bucket.published_at.expect("published");
        let to_publish = Duration::from_micros((published.as_micros() - db_start.as_micros()) as u64);
        let pub_rps = rows as f64 / to_publish.as_secs_f64();
        println!(
            "to publication (claim, snapshot, encode, upload, verify, publish): {:.2} s = {:.0} rows/s; cleanup of the hot rows took the remaining {:.2} s",
            to_publish.as_secs_f64(),
            pub_rps,
            archive_time.as_secs_f64() - to_publish.as_secs_f64()
        );
        println!("ratio to publication / COPY rows/s: {:.2}x (target >= 0.5x)", pub_rps / copy_rps);
        println!("ratio end to end incl. cleanup / COPY rows/s: {:.2}x", arch_rps / copy_rps);
        let _ = store.drop_schema().await;
        }

        if part("small") {
        // 2. Many small buckets.
        let (store, archive, _schema, _dir2) = setup("small").await;
        store
            .register_table(&TableDefinition::new(table.clone(), BucketStrategy::CalendarDayUtc, "chat"))
            .await
            .unwrap();
        // 3 channels x 334 days x ~10 rows: about 1,000 buckets of 10 rows.
        load(&store, &table, 3, 3_340, true).await;
        let runner = Runner::new(store.clone(), archive.clone(), config()).unwrap();
        let started = Instant::now();
        let report = runner.drain(&CancellationToken::new(), &|_, _| {}).await.unwrap().totals;
        let took = started.elapsed();
        assert_eq!(report.failed, 0, "{report:?}");
        println!(
            "archive small buckets: {} buckets in {:.2} s = {:.1} buckets/s (concurrency 8, end to end incl. cleanup)",
            report.archived,
            took.as_secs_f64(),
            report.archived as f64 / took.as_secs_f64()
        );
        let _ = store.drop_schema().await;
        }

        if part("defaults") {
            small_buckets_with_defaults(&table).await;
        }
    });
}

/// Part 3: the daemon loop with its default pacing, stopped when every bucket is published
/// or the budget is spent.
async fn small_buckets_with_defaults(table: &TableId) {
    let budget = Duration::from_secs(
        std::env::var("PULPITUM_BENCH_BUDGET_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(180),
    );
    let (store, archive, _schema, _dir) = setup("defaults").await;
    store
        .register_table(&TableDefinition::new(
            table.clone(),
            BucketStrategy::CalendarDayUtc,
            "chat",
        ))
        .await
        .unwrap();
    load(&store, table, 3, 3_340, true).await;
    let total = store
        .list_buckets(table, &pulpitum::store::BucketFilter::default())
        .await
        .unwrap()
        .len();
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap());
    let runner = Arc::new(Runner::new(store.clone(), archive.clone(), c).unwrap());
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn({
        let (runner, shutdown) = (runner.clone(), shutdown.clone());
        async move { runner.run(shutdown).await }
    });
    let mut published = 0;
    while started.elapsed() < budget {
        tokio::time::sleep(Duration::from_millis(200)).await;
        published = store
            .list_buckets(table, &pulpitum::store::BucketFilter::default())
            .await
            .unwrap()
            .iter()
            .filter(|m| matches!(m.state, pulpitum::store::BucketState::Archived { .. }))
            .count();
        if published == total {
            break;
        }
    }
    let took = started.elapsed();
    shutdown.cancel();
    task.abort();
    println!(
        "archive small buckets, daemon defaults (scan limit 64, cleanup delay 60 s, interval 15 s, concurrency 4): {published} of {total} published in {:.1} s = {:.2} buckets/s",
        took.as_secs_f64(),
        published as f64 / took.as_secs_f64()
    );
    let _ = store.drop_schema().await;
}
