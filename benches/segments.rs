//! Segments against today's per-bucket layout, on the same demo history in the same run
//! (embedded store, filesystem archive; the latest-50 part also on radosgw when
//! `PULPITUM_S3_ENDPOINT` or the default `http://127.0.0.1:7480` answers):
//!
//! 1. objects per 1,000 archived day buckets, before and after compaction;
//! 2. `SELECT channel_id, count(*), sum(length(content)) ... GROUP BY channel_id` over every
//!    compacted month, through SQL, per-bucket against segments, and DuckDB's
//!    `read_parquet` over the same segment files when the `duckdb` Python module is there;
//! 3. the latest 50 messages of one channel in an archived month: object reads and p50,
//!    with nothing cached (a fresh archive store per query) and warm (one session);
//! 4. archival throughput of 10,000 small buckets (100 channels x 100 days): archiving
//!    alone against archiving followed by compaction, in buckets per second;
//! 5. `queries`: issue 30's query set over every compacted month (count, group by channel
//!    with the sum of lengths, a content `LIKE`, per-day counts, the latest 50 across
//!    channels, a week across channels), each through SQL warm (p50 of 5 in one session)
//!    and first in a fresh session and archive store, against DuckDB's `read_parquet` over
//!    the same segment payloads with 2 threads, in the same run.
//!
//! Run: `cargo bench --bench segments` (release). `PULPITUM_BENCH_SCALE=small` uses a short
//! history for a quick look; `SEGMENTS_BENCH=objects,latest,throughput,queries` picks parts
//! (`objects` covers parts 1 to 3).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Datelike, NaiveDate, Utc};
use datafusion::prelude::SessionContext;
use pulpitum::archive::{ArchiveStore, FaultLayer, FaultOp, FaultPlan};
use pulpitum::archiver::{collect_garbage_with, ArchiverConfig, ArchiverMetrics, GcDelays, Runner};
use pulpitum::demo::{self, DemoScale};
use pulpitum::model::{
    encode_i64, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{BucketFilter, BucketState, HotStore, TableDefinition};
use tokio_util::sync::CancellationToken;

fn wanted(part: &str) -> bool {
    std::env::var("SEGMENTS_BENCH")
        .map(|v| v.split(',').any(|p| p.trim() == part))
        .unwrap_or(true)
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run(ctx: &SessionContext, sql: &str) -> usize {
    let b = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    b.iter().map(|b| b.num_rows()).sum()
}

async fn timed(ctx: &SessionContext, sql: &str, rounds: usize) -> (Duration, usize) {
    let rows = run(ctx, sql).await; // warm-up
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        assert_eq!(run(ctx, sql).await, rows);
        times.push(t.elapsed());
    }
    (p50(times), rows)
}

/// An archive URL's store with a counting layer (no faults) for read counts.
fn counted(url: &str) -> (ArchiveStore, FaultLayer) {
    let layer = FaultLayer::new(FaultPlan::new(0));
    (
        ArchiveStore::from_url(url)
            .unwrap()
            .with_faults(layer.clone()),
        layer,
    )
}

fn reads(layer: &FaultLayer) -> u64 {
    layer.stats().calls[FaultOp::Read as usize]
}

struct Latest {
    cold_p50: Duration,
    cold_reads: f64,
    warm_p50: Duration,
}

/// Latest 50 of one channel: cold (fresh archive store and session per query, so nothing
/// is cached but the hot store's listing) and warm (one session, repeated).
async fn latest(store: &Arc<dyn HotStore>, url: &str, sql: &str, rounds: usize) -> Latest {
    let mut cold = Vec::new();
    let mut total_reads = 0u64;
    for _ in 0..rounds {
        let (archive, layer) = counted(url);
        let ctx = session(store.clone(), Arc::new(archive), SessionOptions::default())
            .await
            .unwrap();
        let before = reads(&layer);
        let t = Instant::now();
        assert_eq!(run(&ctx, sql).await, 50);
        cold.push(t.elapsed());
        total_reads += reads(&layer) - before;
    }
    let (archive, _) = counted(url);
    let ctx = session(store.clone(), Arc::new(archive), SessionOptions::default())
        .await
        .unwrap();
    let (warm, rows) = timed(&ctx, sql, rounds).await;
    assert_eq!(rows, 50);
    Latest {
        cold_p50: p50(cold),
        cold_reads: total_reads as f64 / rounds as f64,
        warm_p50: warm,
    }
}

fn first_of_month(d: NaiveDate) -> NaiveDate {
    NaiveDate::from_ymd_opt(d.year(), d.month(), 1).unwrap()
}

async fn archived_buckets(store: &dyn HotStore) -> usize {
    let t = TableId::new(demo::TABLE).unwrap();
    store
        .list_buckets(&t, &BucketFilter::default())
        .await
        .unwrap()
        .iter()
        .filter(|m| matches!(m.state, BucketState::Archived { .. }))
        .count()
}

async fn compact_and_collect(store: &Arc<dyn HotStore>, url: &str) -> (Duration, usize) {
    let archive = Arc::new(ArchiveStore::from_url(url).unwrap());
    let mut c = ArchiverConfig::with_defaults();
    c.cleanup_delay = Duration::ZERO;
    let runner = Runner::new(store.clone(), archive.clone(), c).unwrap();
    let t = Instant::now();
    let r = runner.compact_pass().await.unwrap();
    let took = t.elapsed();
    assert_eq!(r.failed, 0, "{:?}", r.errors);
    // No reader is left: retired objects may go at once.
    let delays = GcDelays {
        orphans: Duration::ZERO,
        retired: Duration::ZERO,
        erased: Duration::ZERO,
    };
    collect_garbage_with(&**store, &archive, delays, &ArchiverMetrics::default())
        .await
        .unwrap();
    (took, r.segments)
}

/// Parts 1 to 3 on one archive (a `file://` or `s3://` URL). `full` adds the aggregate.
async fn layouts(label: &str, url: &str, scale: DemoScale, full: bool) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("hot.sqlite3").display());
    let store = pulpitum::store::open(&db).await.unwrap();
    store.migrate().await.unwrap();
    let archive = Arc::new(ArchiveStore::from_url(url).unwrap());
    let t = Instant::now();
    let report =
        demo::load_and_archive_with(store.clone(), archive.clone(), scale, false, &|_, _, _| {})
            .await
            .unwrap();
    let buckets = archived_buckets(&*store).await;
    let objects_before = archive.list_objects().await.unwrap().len();
    eprintln!(
        "[{label}] demo: {} rows, {} buckets archived per bucket in {:.1} s",
        report.archived_rows,
        buckets,
        t.elapsed().as_secs_f64()
    );
    // Every month entirely before the cutoff's month is compacted: the queries stay in it.
    let cutoff_day = report.cutoff.to_datetime().date_naive();
    let end = first_of_month(cutoff_day);
    let month = first_of_month(end - chrono::Duration::days(40));
    let agg = format!(
        "SELECT channel_id, count(*), sum(length(content)) FROM chat WHERE timestamp < '{end}T00:00:00Z' GROUP BY channel_id"
    );
    let latest_sql = format!(
        "SELECT id, timestamp, content FROM chat WHERE channel_id = 5 AND timestamp < '{}T00:00:00Z' ORDER BY timestamp DESC LIMIT 50",
        month + chrono::Duration::days(20)
    );
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    let agg_before = if full {
        Some(timed(&ctx, &agg, 5).await)
    } else {
        None
    };
    let rounds = if full { 40 } else { 20 };
    let lat_before = latest(&store, url, &latest_sql, rounds).await;

    let (compact_time, segments) = compact_and_collect(&store, url).await;
    let objects_after = archive.list_objects().await.unwrap().len();
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    let agg_after = if full {
        Some(timed(&ctx, &agg, 5).await)
    } else {
        None
    };
    let lat_after = latest(&store, url, &latest_sql, rounds).await;

    println!(
        "[{label}] {} archived day buckets, {} rows",
        buckets, report.archived_rows
    );
    println!(
        "[{label}] objects: {objects_before} per bucket -> {objects_after} with {segments} segments; per 1,000 buckets: {:.1} -> {:.1}",
        objects_before as f64 * 1000.0 / buckets as f64,
        objects_after as f64 * 1000.0 / buckets as f64
    );
    println!(
        "[{label}] compaction of every due month: {:.2} s ({:.0} buckets/s)",
        compact_time.as_secs_f64(),
        buckets as f64 / compact_time.as_secs_f64()
    );
    if let (Some((a, ra)), Some((b, rb))) = (agg_before, agg_after) {
        assert_eq!(ra, rb);
        println!(
            "[{label}] aggregate over every compacted month (p50 of 5): per bucket {:.1} ms, segments {:.1} ms: {:.1}x faster",
            ms(a),
            ms(b),
            a.as_secs_f64() / b.as_secs_f64()
        );
        if let Some(duck) = duckdb(url, end) {
            println!(
                "[{label}] DuckDB read_parquet over the same segment files (p50 of 5, in process): {:.1} ms; Pulpitum/DuckDB = {:.2}",
                ms(duck),
                b.as_secs_f64() / duck.as_secs_f64()
            );
        }
    }
    println!(
        "[{label}] latest 50 of a channel, nothing cached (p50 of {rounds}): per bucket {:.2} ms / {:.1} reads, segment {:.2} ms / {:.1} reads: {:.2}x",
        ms(lat_before.cold_p50),
        lat_before.cold_reads,
        ms(lat_after.cold_p50),
        lat_after.cold_reads,
        lat_after.cold_p50.as_secs_f64() / lat_before.cold_p50.as_secs_f64()
    );
    println!(
        "[{label}] latest 50 of a channel, warm session (p50 of {rounds}): per bucket {:.2} ms, segment {:.2} ms: {:.2}x",
        ms(lat_before.warm_p50),
        ms(lat_after.warm_p50),
        lat_after.warm_p50.as_secs_f64() / lat_before.warm_p50.as_secs_f64()
    );
}

/// DuckDB's p50 over the segment payloads of every compacted month, if the Python module
/// is installed (time inside the process, so its start-up is not counted).
fn duckdb(url: &str, end: NaiveDate) -> Option<Duration> {
    let root = url.strip_prefix("file://")?;
    let script = format!(
        r#"
import duckdb, time, statistics
con = duckdb.connect()
q = """SELECT partition_key, count(*), sum(octet_length(value)) FROM read_parquet('{root}/v4/*/segments/*/*/payload.parquet')
WHERE event_time < TIMESTAMPTZ '{end} 00:00:00+00' GROUP BY partition_key"""
con.execute(q).fetchall()
ts = []
for _ in range(5):
    t = time.perf_counter(); con.execute(q).fetchall(); ts.append(time.perf_counter() - t)
print(statistics.median(ts))
"#
    );
    let out = python(&script)?;
    let secs: f64 = out.trim().parse().ok()?;
    Some(Duration::from_secs_f64(secs))
}

/// What a DuckDB script run by `python3 -c` printed, or `None` (with the reason on standard
/// error) when it failed, most often because the `duckdb` module is not installed.
fn python(script: &str) -> Option<String> {
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "DuckDB comparison skipped (is the duckdb Python module installed?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Part 5: the query set over every compacted month, Pulpitum (warm, and first in a fresh
/// session) against DuckDB on the same files.
async fn queries(scale: DemoScale) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let db = format!("sqlite://{}", dir.path().join("hot.sqlite3").display());
    let store = pulpitum::store::open(&db).await.unwrap();
    store.migrate().await.unwrap();
    let archive = Arc::new(ArchiveStore::from_url(&url).unwrap());
    let report =
        demo::load_and_archive_with(store.clone(), archive.clone(), scale, false, &|_, _, _| {})
            .await
            .unwrap();
    let (_, segments) = compact_and_collect(&store, &url).await;
    let end = first_of_month(report.cutoff.to_datetime().date_naive());
    let week = end - chrono::Duration::days(7);
    let w = format!("timestamp < '{end}T00:00:00Z'");
    let set: Vec<(&str, String)> = vec![
        ("count", format!("SELECT count(*) FROM chat WHERE {w}")),
        (
            "group by channel, sum of lengths",
            format!("SELECT channel_id, count(*), sum(length(content)) FROM chat WHERE {w} GROUP BY channel_id"),
        ),
        (
            "content LIKE",
            format!("SELECT count(*) FROM chat WHERE {w} AND content LIKE '%lunch%'"),
        ),
        (
            "per-day counts",
            format!("SELECT date_trunc('day', timestamp) AS d, count(*) FROM chat WHERE {w} GROUP BY d"),
        ),
        (
            "latest 50 across channels",
            format!("SELECT channel_id, timestamp, id, content FROM chat WHERE {w} ORDER BY timestamp DESC LIMIT 50"),
        ),
        (
            "one week across channels",
            format!("SELECT channel_id, count(*) FROM chat WHERE timestamp >= '{week}T00:00:00Z' AND {w} GROUP BY channel_id"),
        ),
    ];
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    let duck = duck_queries(dir.path(), end, week);
    println!(
        "[queries] {} archived rows, {segments} segments, every month before {end}",
        report.archived_rows
    );
    for (i, (name, sql)) in set.iter().enumerate() {
        // First in a fresh session over a fresh archive store: manifests, footers and row
        // groups all read cold (the hot store's pages are the operating system's).
        let fresh = session(
            store.clone(),
            Arc::new(ArchiveStore::from_url(&url).unwrap()),
            SessionOptions::default(),
        )
        .await
        .unwrap();
        let t = Instant::now();
        let first_rows = run(&fresh, sql).await;
        let first = t.elapsed();
        let (warm, rows) = timed(&ctx, sql, 5).await;
        assert_eq!(rows, first_rows, "{name}");
        let line = format!(
            "[queries] {name}: warm {:.1} ms, first {:.1} ms ({:.2}x warm), {rows} rows",
            ms(warm),
            ms(first),
            first.as_secs_f64() / warm.as_secs_f64()
        );
        match duck.as_ref().and_then(|d| d.get(i)) {
            Some(&(d, drows)) => {
                assert_eq!(drows, rows, "{name}: DuckDB's row count");
                println!(
                    "{line}; DuckDB {:.1} ms: Pulpitum/DuckDB = {:.2}",
                    ms(d),
                    warm.as_secs_f64() / d.as_secs_f64()
                )
            }
            None => println!("{line}"),
        }
    }
}

/// DuckDB's p50 (of 5, after a warm-up, 2 threads) and row count for each query of the set,
/// over the segment payloads under `root`, if the Python module is installed.
fn duck_queries(
    root: &std::path::Path,
    end: NaiveDate,
    week: NaiveDate,
) -> Option<Vec<(Duration, usize)>> {
    let root = root.display();
    let script = format!(
        r#"
import duckdb, time, statistics
con = duckdb.connect()
con.execute("SET threads = 2")
con.execute("SET TimeZone = 'UTC'")
con.execute("CREATE VIEW p AS SELECT * FROM read_parquet('{root}/v4/*/segments/*/*/payload.parquet')")
w = "event_time < TIMESTAMPTZ '{end} 00:00:00+00'"
qs = [
  f"SELECT count(*) FROM p WHERE {{w}}",
  f"SELECT partition_key, count(*), sum(length(decode(value))) FROM p WHERE {{w}} GROUP BY partition_key",
  f"SELECT count(*) FROM p WHERE {{w}} AND decode(value) LIKE '%lunch%'",
  f"SELECT date_trunc('day', event_time) AS d, count(*) FROM p WHERE {{w}} GROUP BY d",
  f"SELECT partition_key, event_time, sort_key, decode(value) FROM p WHERE {{w}} ORDER BY event_time DESC LIMIT 50",
  f"SELECT partition_key, count(*) FROM p WHERE event_time >= TIMESTAMPTZ '{week} 00:00:00+00' AND {{w}} GROUP BY partition_key",
]
for q in qs:
    rows = len(con.execute(q).fetchall())
    ts = []
    for _ in range(5):
        t = time.perf_counter(); con.execute(q).fetchall(); ts.append(time.perf_counter() - t)
    print(statistics.median(ts), rows)
"#
    );
    let out = python(&script)?;
    Some(
        out.lines()
            .filter_map(|l| {
                let (t, n) = l.split_once(' ')?;
                Some((Duration::from_secs_f64(t.parse().ok()?), n.parse().ok()?))
            })
            .collect(),
    )
}

/// 10,000 small buckets archived by `Runner::drain`, then (when `compact`) compacted.
async fn throughput(compact: bool) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("hot.sqlite3").display());
    let url = format!("file://{}", dir.path().join("archive").display());
    std::fs::create_dir_all(dir.path().join("archive")).unwrap();
    let store = pulpitum::store::open(&db).await.unwrap();
    store.migrate().await.unwrap();
    let table = TableId::new("chat").unwrap();
    store
        .register_table(&TableDefinition::new(
            table.clone(),
            BucketStrategy::CalendarDayUtc,
            "chat",
        ))
        .await
        .unwrap();
    let base = EventTime::parse_rfc3339("2023-01-01T00:00:00Z")
        .unwrap()
        .as_micros();
    for ch in 1..=100i64 {
        let rows: Vec<Record> = (0..100i64)
            .flat_map(|day| {
                (0..3i64).map(move |i| Record {
                    partition_key: PartitionKey::from_i64(ch),
                    event_time: EventTime::from_micros(base + day * 86_400_000_000 + i).unwrap(),
                    sort_key: SortKey::new(encode_i64(ch * 1_000_000 + day * 10 + i).to_vec())
                        .unwrap(),
                    value: format!("message {i} of day {day} in {ch}").into_bytes(),
                })
            })
            .collect();
        store.append_batch(&table, &rows).await.unwrap();
    }
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2024-01-01T00:00:00Z").unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.scan_limit = 1_000;
    c.concurrency = 8;
    let archive = Arc::new(ArchiveStore::from_url(&url).unwrap());
    let runner = Runner::new(store.clone(), archive, c).unwrap();
    let t = Instant::now();
    let drained = runner
        .drain(&CancellationToken::new(), &|_, _| {})
        .await
        .unwrap();
    assert_eq!(drained.totals.archived, 10_000);
    if compact {
        let r = runner.compact_pass().await.unwrap();
        assert_eq!(r.buckets, 10_000, "{:?}", r.errors);
    }
    10_000.0 / t.elapsed().as_secs_f64()
}

fn s3_url() -> Option<String> {
    let endpoint =
        std::env::var("PULPITUM_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:7480".into());
    let reachable = std::net::TcpStream::connect_timeout(
        &endpoint.trim_start_matches("http://").parse().ok()?,
        Duration::from_millis(500),
    )
    .is_ok();
    if !reachable {
        eprintln!("radosgw not reachable at {endpoint}: the S3 part is skipped");
        return None;
    }
    for (k, v) in [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "AKTEST"),
        ("AWS_SECRET_ACCESS_KEY", "SKTESTSECRET"),
    ] {
        if std::env::var(k).is_err() {
            std::env::set_var(k, v);
        }
    }
    pulpitum::archive::install_http_transport();
    Some(format!(
        "s3://pulpitum-test/bench_segments_{:08x}",
        Utc::now().timestamp_subsec_nanos()
    ))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let small = std::env::var("PULPITUM_BENCH_SCALE").as_deref() == Ok("small");
        let scale = if small {
            DemoScale {
                channels: 10,
                days: 240,
                messages_per_day: 40,
            }
        } else {
            DemoScale::FULL
        };
        if wanted("objects") {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}", dir.path().display());
            layouts("fs", &url, scale, true).await;
        }
        if wanted("latest") {
            if let Some(url) = s3_url() {
                // A shorter history on radosgw: the latest-50 figures need a few months.
                let s3_scale = DemoScale {
                    channels: 10,
                    days: 240,
                    messages_per_day: 137,
                };
                layouts("s3", &url, s3_scale, false).await;
            }
        }
        if wanted("queries") {
            queries(scale).await;
        }
        if wanted("throughput") {
            let plain = throughput(false).await;
            let with = throughput(true).await;
            println!(
                "[fs] archival of 10,000 small buckets: {plain:.0} buckets/s archiving alone, {with:.0} buckets/s archiving then compacting ({:.2}x)",
                with / plain
            );
        }
    });
}
