//! The PostgreSQL wire server against PostgreSQL itself, same client, same run.
//!
//! A chat table in the hot store (127.0.0.1:5432, database `test`) whose channel 1 has 2,000
//! messages in a hot day and a year of older daily buckets; the same rows in a plain
//! PostgreSQL table with a primary key on `(channel_id, ts, id)`. One tokio-postgres client
//! asks each for the latest 50 messages of channel 1:
//!
//! 1. `wire prepared`: `pulpitum serve` (its own process by default, loopback), a prepared statement
//!    (extended protocol, binary results): the driver's usual path;
//! 2. `direct`: PostgreSQL, the same prepared shape on the plain table: the baseline;
//! 3. `wire ad hoc`: the page as a simple-protocol query with a literal, run as its prepared
//!    shape (the literal lifted to a parameter); target at most 3.0x direct. Its text is the
//!    same every round, as a dashboard's refresh sends it: remembered by the connection,
//!    it is not parsed again;
//!    `ad hoc, new text` (`adhocnew`): the same page with a comment that differs each round,
//!    so it is checked, parsed and lifted every time, as a page with a new literal is (its
//!    plan still cached);
//! 4. `as written`: the same page with its literal written so that it is never lifted
//!    (`channel_id = CAST(1 AS BIGINT)`): parsed and planned per call, the cost before
//!    shapes.
//!
//! The variants run once per round, in a fresh random order each round. Then 32 clients at
//! once run the prepared page against each server: throughput and p99.
//!
//! Last, the big read (issue 25): one client reads `WIRE_BENCH_BIG_GB` (default 5) GB of
//! results (`repeat('x', 1000)` per row) through the server while another asks for the hot
//! page over and over; the process's resident memory is sampled every 20 ms (its peak
//! against its size before the read) and the hot page's p50 during the read is compared with
//! its p50 on the idle server just before.
//!
//! Targets (issue 18): wire prepared p50 at most 2.0x direct, p99 at most 15 ms; (issue 25)
//! the server's memory does not grow with the result, the hot page stays usable beside it.
//! Run: `cargo bench --bench wire` (release: DataFusion optimised; about 25 minutes cold);
//! `WIRE_BENCH_ROUNDS` (default 500), `WIRE_BENCH_CLIENTS` (32), `WIRE_BENCH_PAGES` (pages
//! per client, 100), `WIRE_BENCH_BIG_GB` (5; 0 skips the big read), `WIRE_BENCH_SERVER`
//! (`process`, the default: `pulpitum serve` in a process of its own, as deployed, so the
//! client's tasks do not share the server's threads; `caller`: the server in this process,
//! its connections on this runtime as the binary runs them; `own`: in this process, on a
//! runtime of the server's own, the library's default and the shape of every figure before
//! 2026-12-06), `WIRE_BENCH_PULPITUM` (the `pulpitum` binary the `process` shape starts;
//! default: this build's), `WIRE_BENCH_SERVER_THREADS` (that process's worker threads;
//! default: one per core).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rand::seq::SliceRandom;
use tokio_postgres::{Client, NoTls};

use pulpitum::archive::ArchiveStore;
use pulpitum::model::{encode_i64, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::server::{ConnectionRuntime, Server, ServerConfig};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::postgres::PgStore;
use pulpitum::store::{Appends, HotStore};

/// mimalloc for this binary (the `mimalloc` feature, on by default; see Cargo.toml).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const DAY: i64 = 86_400_000_000;
const PAGE: &str =
    "SELECT timestamp, id, content FROM chat WHERE channel_id = $1 ORDER BY timestamp DESC, id DESC LIMIT 50";
const DIRECT: &str =
    "SELECT ts, id, content FROM wire_ref WHERE channel_id = $1 ORDER BY ts DESC, id DESC LIMIT 50";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// p50 and p99; zeros for a variant that did not run (its ratios then read 0 or inf).
fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    if v.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn client(conninfo: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(conninfo, NoTls).await.unwrap();
    tokio::spawn(conn);
    c
}

/// `clients` connections each running `pages` prepared pages at once: (pages per second,
/// p99 of one page).
async fn concurrent(
    conninfo: &str,
    sql: &'static str,
    clients: usize,
    pages: usize,
) -> (f64, Duration) {
    let mut tasks = Vec::new();
    let started = Instant::now();
    for _ in 0..clients {
        let conninfo = conninfo.to_string();
        tasks.push(tokio::spawn(async move {
            let c = client(&conninfo).await;
            let stmt = c.prepare(sql).await.unwrap();
            let mut times = Vec::with_capacity(pages);
            for _ in 0..pages {
                let t = Instant::now();
                let rows = c.query(&stmt, &[&1i64]).await.unwrap();
                assert_eq!(rows.len(), 50);
                times.push(t.elapsed());
            }
            times
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    let n = all.len();
    (n as f64 / elapsed.as_secs_f64(), percentiles(all).1)
}

/// The server's resident set, in bytes (Linux): this process's, or the `pulpitum serve`
/// process's when the server runs in one.
fn rss() -> u64 {
    let pid = SERVER_PID.load(std::sync::atomic::Ordering::Relaxed);
    let path = if pid == 0 {
        "/proc/self/status".to_string()
    } else {
        format!("/proc/{pid}/status")
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// One client reads `gb` GB of rows while another asks for the hot page: the peak resident
/// memory, and the page's p50 during the read against the idle p50 just before.
async fn big_read(wire_info: &str, hot: &Client, page: &tokio_postgres::Statement, gb: usize) {
    use futures::{pin_mut, StreamExt};
    let time_page = || async {
        let t = Instant::now();
        assert_eq!(hot.query(page, &[&1i64]).await.unwrap().len(), 50);
        t.elapsed()
    };
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(time_page().await);
    }
    let before = rss();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let rows = gb as u64 * 1_000_000;
    let reader = {
        let info = wire_info.to_string();
        tokio::spawn(async move {
            let c = client(&info).await;
            let started = Instant::now();
            let stream = c
                .query_raw(
                    &format!("SELECT repeat('x', 1000) AS v FROM generate_series(1, {rows})"),
                    Vec::<i64>::new(),
                )
                .await
                .unwrap();
            pin_mut!(stream);
            let (mut n, mut bytes) = (0u64, 0u64);
            while let Some(row) = stream.next().await {
                let row = row.unwrap();
                let v: &str = row.get(0);
                bytes += v.len() as u64;
                n += 1;
            }
            (n, bytes, started.elapsed())
        })
    };
    let mut during = Vec::new();
    while !reader.is_finished() {
        during.push(time_page().await);
    }
    let (n, bytes, took) = reader.await.unwrap();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();
    assert_eq!(n, rows);
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let (idle50, _) = percentiles(idle);
    let (during50, during99) = percentiles(during.clone());
    println!(
        "  big read: {n} rows, {:.2} GB of values in {:.1} s ({:.0} MB/s)",
        bytes as f64 / 1e9,
        took.as_secs_f64(),
        bytes as f64 / 1e6 / took.as_secs_f64()
    );
    println!(
        "    resident memory: {:.0} MB before, peak {:.0} MB during (+{:.0} MB)",
        before as f64 / 1e6,
        peak as f64 / 1e6,
        (peak.saturating_sub(before)) as f64 / 1e6
    );
    println!(
        "    hot page beside it: p50 {:.3} ms = {:.2}x idle ({:.3} ms), p99 {:.3} ms, {} pages",
        ms(during50),
        during50.as_secs_f64() / idle50.as_secs_f64(),
        ms(idle50),
        ms(during99),
        during.len()
    );
}

/// Where the server runs.
enum Serving {
    /// In this process, on its runtime (`WIRE_BENCH_SERVER=caller` or `own`).
    Task(tokio::task::JoinHandle<()>),
    /// `pulpitum serve` (the default).
    Process(std::process::Child),
}

/// The `pulpitum serve` process's id (0: the server runs in this process).
static SERVER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// `pulpitum serve` in a process of its own, over this run's schema and an archive in
/// memory (the page reads only the hot store): the deployment's shape, with the client in
/// another process than the server. Returns the child and its port.
fn serve_process(schema: &str) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let url = format!(
        "host=127.0.0.1 port=5432 user=postgres dbname=test options='-c search_path={schema}'"
    );
    // Another build of the binary may be measured against this one, run after run
    // (`WIRE_BENCH_PULPITUM=/path/to/pulpitum`); each run still has its own baseline.
    let program = std::env::var_os("WIRE_BENCH_PULPITUM").map_or_else(
        || env!("CARGO_BIN_EXE_pulpitum").into(),
        std::path::PathBuf::from,
    );
    let mut command = std::process::Command::new(program);
    // The server process's worker threads (tokio reads `TOKIO_WORKER_THREADS`; default: one
    // per core), set apart from this process's own.
    if let Ok(n) = std::env::var("WIRE_BENCH_SERVER_THREADS") {
        command.env("TOKIO_WORKER_THREADS", n);
    }
    let mut child = command
        .args(["serve", "--insecure-no-auth", "--listen", "127.0.0.1:0"])
        .args(["--statement-timeout-ms", "0"])
        .env("PULPITUM_DATABASE_URL", url)
        .env("PULPITUM_ARCHIVE_URL", "memory://")
        .env("PULPITUM_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("pulpitum serve starts");
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("serve announces its address").unwrap();
        if let Some(a) = line.split("serving PostgreSQL clients on ").nth(1) {
            break a.trim().to_string();
        }
    };
    // Its later lines (warnings) go on to this process's standard error.
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            eprintln!("serve: {line}");
        }
    });
    let port = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    SERVER_PID.store(child.id(), std::sync::atomic::Ordering::Relaxed);
    (child, port)
}

/// The server in this process: `WIRE_BENCH_SERVER=caller` runs its connections on the
/// runtime that drives its store connections too, as `pulpitum serve` does; `own` on a
/// runtime of the server's own, the library's default.
fn server_config() -> ServerConfig {
    let runtime = match std::env::var("WIRE_BENCH_SERVER").as_deref() {
        Ok("own") => ConnectionRuntime::Own,
        _ => ConnectionRuntime::Caller,
    };
    ServerConfig {
        listen: "127.0.0.1:0".into(),
        insecure_no_auth: true,
        statement_timeout: None,
        runtime,
        ..ServerConfig::default()
    }
}

/// On the runtime the `pulpitum` binary builds (its workers have the server's stack).
fn main() {
    pulpitum::server::runtime_builder()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let schema = format!("bench_wire_{}", rand::random::<u32>());
    let store = Arc::new(PgStore::connect_with_schema(PG_URL, &schema).await.unwrap());
    let archive = Arc::new(ArchiveStore::from_url("memory://").unwrap());
    let ctx = session(
        store.clone() as Arc<dyn HotStore>,
        archive.clone(),
        SessionOptions {
            migrate: true,
            ..SessionOptions::default()
        },
    )
    .await
    .unwrap();
    ctx.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('bucket_strategy' 'calendar_day_utc')",
    )
    .await
    .unwrap();
    let table = TableId::new("chat").unwrap();
    let day0 = EventTime::parse_rfc3339("2025-03-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let mut rows: Vec<(i64, i64, String)> = (0..2000)
        .map(|i| {
            (
                day0 + i * 30_000_000,
                i,
                format!("message {i} of an ordinary length"),
            )
        })
        .collect();
    rows.extend((1..=365).map(|d| (day0 - d * DAY, -d, format!("quiet day {d}"))));
    let records: Vec<Record> = rows
        .iter()
        .map(|(t, id, content)| Record {
            partition_key: PartitionKey::new(encode_i64(1).to_vec()).unwrap(),
            event_time: EventTime::from_micros(*t).unwrap(),
            sort_key: SortKey::new(encode_i64(*id).to_vec()).unwrap(),
            value: content.clone().into_bytes(),
        })
        .collect();
    for c in records.chunks(500) {
        store.append_batch(&table, c).await.unwrap();
    }
    // The reference: the same rows in a plain table, in the same database and schema.
    let raw = store.raw_client().await.unwrap();
    raw.batch_execute(
        "CREATE TABLE wire_ref (channel_id INT8, ts TIMESTAMPTZ, id INT8, content TEXT, \
         PRIMARY KEY (channel_id, ts, id))",
    )
    .await
    .unwrap();
    let insert = raw
        .prepare("INSERT INTO wire_ref VALUES (1, $1, $2, $3)")
        .await
        .unwrap();
    for (t, id, content) in &rows {
        let ts: DateTime<Utc> = DateTime::from_timestamp_micros(*t).unwrap();
        raw.execute(&insert, &[&ts, id, content]).await.unwrap();
    }
    raw.batch_execute("ANALYZE wire_ref").await.unwrap();

    // The same prepared page in this process, without the wire (variant `inproc`).
    let inproc = pulpitum::prepared::prepare(&ctx, PAGE).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let (port, mut serving) = match std::env::var("WIRE_BENCH_SERVER").as_deref() {
        Ok("caller") | Ok("own") => {
            let server = Server::bind(ctx, server_config()).await.unwrap();
            let port = server.local_addr().unwrap().port();
            (port, Serving::Task(tokio::spawn(server.run(stop.clone()))))
        }
        _ => {
            let (child, port) = serve_process(&schema);
            (port, Serving::Process(child))
        }
    };
    let wire_info = format!("host=127.0.0.1 port={port} user=bench dbname=pulpitum");
    let direct_info = format!(
        "host=127.0.0.1 port=5432 user=postgres dbname=test options='-c search_path={schema}'"
    );
    let wire = client(&wire_info).await;
    let direct = client(&direct_info).await;
    let wire_page = wire.prepare(PAGE).await.unwrap();
    let direct_page = direct.prepare(DIRECT).await.unwrap();
    let adhoc = "SELECT timestamp, id, content FROM chat WHERE channel_id = 1 \
                 ORDER BY timestamp DESC, id DESC LIMIT 50";
    // The same page in a form whose literal is never lifted (it sits in a CAST, which the
    // optimizer folds, so the scan is pushed down alike), and whose text differs in every
    // round (a column alias), so no shape of it is cached: planned as written every time,
    // what every ad-hoc page cost before statement shapes. (Until 2026-12-07 its text was
    // the same each round, and its shape, with no parameter, was cached like any other.)
    // The ad-hoc page with a text of its own each round (a trailing comment): the same
    // shape and values, so its plan is cached, but the text is new to the connection's
    // remembered texts, so it is checked, parsed and lifted each time, as a page with a new
    // literal is.
    let adhoc_new = |round: usize| format!("{adhoc} -- round {round}");
    let as_written = |round: usize| {
        format!(
            "SELECT timestamp, id, content AS content_{round} FROM chat \
             WHERE channel_id = CAST(1 AS BIGINT) ORDER BY timestamp DESC, id DESC LIMIT 50"
        )
    };
    // The answers agree before anything is timed.
    let a: Vec<i64> = wire
        .query(&wire_page, &[&1i64])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(1))
        .collect();
    let b: Vec<i64> = direct
        .query(&direct_page, &[&1i64])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(1))
        .collect();
    assert_eq!(a, b);
    assert_eq!(a.len(), 50);

    let rounds = env_usize("WIRE_BENCH_ROUNDS", 500);
    let mut times: [Vec<Duration>; 8] = Default::default();
    let wire_floor = wire.prepare("SELECT $1::BIGINT").await.unwrap();
    let direct_floor = direct.prepare("SELECT $1::BIGINT").await.unwrap();
    // `WIRE_BENCH_VARIANTS=prepared,direct` (say) runs a subset, to profile: the ad-hoc
    // variant's planning shares the server's cores and caches with the others.
    // `floor` and `pgfloor` (a prepared `SELECT $1::BIGINT` through the server and to
    // PostgreSQL) and `inproc` (the page prepared in this process, no wire) run only when
    // named: they split the wire's cost into its round trip and its query. `floor` is
    // planned physically at every execution (a plan without a Pulpitum scan is not cached,
    // see `prepared::reusable`), so it is an upper bound on the server's round trip.
    let names = [
        "prepared", "direct", "adhoc", "written", "floor", "pgfloor", "inproc", "adhocnew",
    ];
    let mut order: Vec<usize> = match std::env::var("WIRE_BENCH_VARIANTS") {
        Ok(v) => v
            .split(',')
            .filter_map(|n| names.iter().position(|x| *x == n.trim()))
            .collect(),
        Err(_) => vec![0, 1, 2, 3, 7],
    };
    for round in 0..rounds + rounds / 10 {
        order.shuffle(&mut rand::rng());
        for &v in &order {
            let t = Instant::now();
            match v {
                0 => assert_eq!(wire.query(&wire_page, &[&1i64]).await.unwrap().len(), 50),
                1 => assert_eq!(
                    direct.query(&direct_page, &[&1i64]).await.unwrap().len(),
                    50
                ),
                2 => {
                    let msgs = wire.simple_query(adhoc).await.unwrap();
                    assert!(msgs.len() >= 50);
                }
                4 => assert_eq!(wire.query(&wire_floor, &[&1i64]).await.unwrap().len(), 1),
                5 => assert_eq!(
                    direct.query(&direct_floor, &[&1i64]).await.unwrap().len(),
                    1
                ),
                7 => {
                    let msgs = wire.simple_query(&adhoc_new(round)).await.unwrap();
                    assert!(msgs.len() >= 50);
                }
                6 => {
                    let one = datafusion::scalar::ScalarValue::Int64(Some(1));
                    let batches = inproc.execute(&[one]).await.unwrap();
                    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 50);
                }
                _ => {
                    let msgs = wire.simple_query(&as_written(round)).await.unwrap();
                    assert!(msgs.len() >= 50);
                }
            }
            // The first tenth warms caches and is not counted.
            if round >= rounds / 10 {
                times[v].push(t.elapsed());
            }
        }
    }
    let [w, d, s, x, f, pf, ip, sn] = times.map(percentiles);
    for (name, (p50, p99)) in [("floor", f), ("pgfloor", pf), ("inproc", ip)] {
        if p50 > Duration::ZERO {
            println!(
                "  {name:<15} p50 {:.3} ms  p99 {:.3} ms  = {:.2}x direct",
                ms(p50),
                ms(p99),
                p50.as_secs_f64() / d.0.as_secs_f64()
            );
        }
    }
    println!(
        "wire bench: latest 50 of a hot channel with a year of daily buckets, {rounds} rounds"
    );
    println!(
        "  wire prepared   p50 {:.3} ms  p99 {:.3} ms  = {:.2}x direct (target <= 2.0x, p99 <= 15 ms)",
        ms(w.0),
        ms(w.1),
        w.0.as_secs_f64() / d.0.as_secs_f64()
    );
    println!(
        "  direct          p50 {:.3} ms  p99 {:.3} ms",
        ms(d.0),
        ms(d.1)
    );
    println!(
        "  wire ad hoc     p50 {:.3} ms  p99 {:.3} ms  = {:.2}x direct (target <= 3.0x; its shape prepared)",
        ms(s.0),
        ms(s.1),
        s.0.as_secs_f64() / d.0.as_secs_f64()
    );
    if sn.0 > Duration::ZERO {
        println!(
            "  ad hoc, new text p50 {:.3} ms  p99 {:.3} ms  = {:.2}x direct (the same shape, its text not remembered)",
            ms(sn.0),
            ms(sn.1),
            sn.0.as_secs_f64() / d.0.as_secs_f64()
        );
    }
    println!(
        "  as written      p50 {:.3} ms  p99 {:.3} ms  = {:.2}x direct (the same page planned each time)",
        ms(x.0),
        ms(x.1),
        x.0.as_secs_f64() / d.0.as_secs_f64()
    );
    let clients = env_usize("WIRE_BENCH_CLIENTS", 32);
    let pages = env_usize("WIRE_BENCH_PAGES", 100);
    let (wt, wp99) = concurrent(&wire_info, PAGE, clients, pages).await;
    let (dt, dp99) = concurrent(&direct_info, DIRECT, clients, pages).await;
    println!("  {clients} clients x {pages} pages:");
    println!(
        "    wire    {:.0} pages/s  p99 {:.2} ms  = {:.2}x direct throughput",
        wt,
        ms(wp99),
        wt / dt
    );
    println!("    direct  {:.0} pages/s  p99 {:.2} ms", dt, ms(dp99));
    let gb = env_usize("WIRE_BENCH_BIG_GB", 5);
    if gb > 0 {
        big_read(&wire_info, &wire, &wire_page, gb).await;
    }
    drop(wire);
    stop.cancel();
    match &mut serving {
        Serving::Task(t) => t.await.unwrap(),
        Serving::Process(child) => {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    store.drop_schema().await.unwrap();
}
