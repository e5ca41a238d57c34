//! Distributed harness (issue 31, docs/distributed.md): the demo's history on the embedded
//! store and a local archive, three `pulpitum worker` processes over the same tiers, and
//! archived aggregates answered by one process and by a coordinator with the workers, in
//! the same run.
//!
//! Reported per query and mode: wall time (median of `DIST_BENCH_ROUNDS`), CPU seconds of
//! the coordinator (this process, `getrusage`) and of each worker (`/proc/PID/stat`), and,
//! from one `EXPLAIN ANALYZE`, the network boundaries' metrics (rows and bytes moved between
//! stages). On a 2-core machine four processes share two cores, so wall time cannot show
//! a speed-up; the CPU split and the bytes moved are the figures to reason from.
//!
//! Knobs: `DIST_BENCH_SCALE` (`full`, the default: about a million messages; `small`; or
//! `CHANNELS,DAYS,PER_DAY`), `DIST_BENCH_ROUNDS` (5).
//!
//! Run: `cargo bench --profile dev-bench --bench distributed` (the dev build
//! `cargo test --all-targets --no-run` leaves one in `target/debug/deps/distributed-*`,
//! slower throughout).

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use pulpitum::archive::ArchiveStore;
use pulpitum::demo::{self, DemoScale};
use pulpitum::distributed::{DistributedSettings, StaticWorkers, WorkerSecret};
use pulpitum::session::{self, SessionOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SECRET: &str = "bench-secret-0123456789abcdef";

fn scale() -> DemoScale {
    match std::env::var("DIST_BENCH_SCALE").as_deref() {
        Err(_) | Ok("full") => DemoScale::FULL,
        Ok("small") => DemoScale::SMALL,
        Ok(custom) => {
            let n: Vec<u32> = custom
                .split(',')
                .map(|v| {
                    v.trim()
                        .parse()
                        .expect("DIST_BENCH_SCALE: CHANNELS,DAYS,PER_DAY")
                })
                .collect();
            DemoScale {
                channels: n[0],
                days: n[1],
                messages_per_day: n[2],
            }
        }
    }
}

/// CPU seconds (user + system) of a process, from `/proc/PID/stat`.
fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after its ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}

fn self_cpu() -> f64 {
    cpu_of(std::process::id())
}

async fn spawn_worker(db: &str, archive: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["worker", "--listen", "127.0.0.1:0"])
        .env("PULPITUM_DATABASE_URL", db)
        .env("PULPITUM_ARCHIVE_URL", archive)
        .env("PULPITUM_WORKER_SECRET", SECRET)
        .env("PULPITUM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start pulpitum worker");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut addr = None;
    while let Some(line) = lines.next_line().await.unwrap() {
        if let Some(a) = line.strip_prefix("pulpitum: worker listening on ") {
            addr = Some(a.to_string());
            break;
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let addr = addr.expect("worker started");
    WORKER_URLS.lock().unwrap().push(format!("http://{addr}"));
    child
}

static WORKER_URLS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

fn pretty(b: &[RecordBatch]) -> String {
    datafusion::arrow::util::pretty::pretty_format_batches(b)
        .unwrap()
        .to_string()
}

struct Figures {
    wall: Duration,
    coordinator_cpu: f64,
    worker_cpu: Vec<f64>,
}

async fn measure(ctx: &SessionContext, sql: &str, workers: &[u32], rounds: usize) -> Figures {
    let _ = collect(ctx, sql).await; // warm: manifests, connections
    let cpu0 = self_cpu();
    let w0: Vec<f64> = workers.iter().map(|&p| cpu_of(p)).collect();
    let mut walls = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let _ = collect(ctx, sql).await;
        walls.push(t.elapsed());
    }
    walls.sort();
    Figures {
        wall: walls[walls.len() / 2],
        coordinator_cpu: (self_cpu() - cpu0) / rounds as f64,
        worker_cpu: workers
            .iter()
            .zip(w0)
            .map(|(&p, c)| (cpu_of(p) - c) / rounds as f64)
            .collect(),
    }
}

fn main() {
    pulpitum::archive::install_http_transport();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let rounds: usize = std::env::var("DIST_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("hot.sqlite3").display());
    let archive_url = format!("file://{}", dir.path().join("archive").display());
    std::fs::create_dir_all(dir.path().join("archive")).unwrap();
    let store = pulpitum::store::open(&db).await.unwrap();
    store.migrate().await.unwrap();
    let archive = Arc::new(ArchiveStore::from_url(&archive_url).unwrap());
    let scale = scale();
    let t = Instant::now();
    let report = demo::load_and_archive(store.clone(), archive.clone(), scale, &|_, _, _| {})
        .await
        .unwrap();
    println!(
        "demo {}x{}x{}: {} messages, {} archived buckets ({} rows) in {} segments, loaded in {:.0?}",
        scale.channels,
        scale.days,
        scale.messages_per_day,
        report.loaded,
        report.archived_buckets,
        report.archived_rows,
        report.segments,
        t.elapsed()
    );
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(spawn_worker(&db, &archive_url).await);
    }
    let pids: Vec<u32> = children.iter().filter_map(|c| c.id()).collect();
    let list = WORKER_URLS.lock().unwrap().join(",");
    let opts = SessionOptions::default();
    let single = session::session(store.clone(), archive.clone(), opts)
        .await
        .unwrap();
    let settings = DistributedSettings {
        workers: Arc::new(StaticWorkers::parse(&list).unwrap()),
        secret: Some(WorkerSecret::new(SECRET).unwrap()),
        tls: None,
        buckets_per_task: 64,
    };
    let coord = session::distributed_session(store, archive, opts, &settings)
        .await
        .unwrap();
    let w = format!("timestamp < TIMESTAMP '{}'", report.cutoff);
    let queries = [
        (
            "aggregate per channel",
            format!(
                "SELECT channel_id, count(*), sum(length(content)), min(timestamp), \
                 max(timestamp) FROM chat WHERE {w} GROUP BY channel_id ORDER BY channel_id"
            ),
        ),
        (
            "whole table (history split, recent buckets one task)",
            "SELECT count(*), sum(length(content)), count(DISTINCT channel_id) FROM chat"
                .to_string(),
        ),
        (
            "aggregate per month",
            format!(
                "SELECT date_trunc('month', timestamp) AS m, count(*), count(DISTINCT \
                 channel_id) FROM chat WHERE {w} GROUP BY m ORDER BY m"
            ),
        ),
    ];
    for (name, sql) in &queries {
        assert_eq!(
            pretty(&collect(&coord, sql).await),
            pretty(&collect(&single, sql).await),
            "{name}: answers differ"
        );
        let one = measure(&single, sql, &pids, rounds).await;
        let dist = measure(&coord, sql, &pids, rounds).await;
        let workers_total: f64 = dist.worker_cpu.iter().sum();
        println!(
            "{name}: one process {:.0?} wall, {:.2} s CPU | coordinator + 3 workers {:.0?} wall \
             ({:.2}x), coordinator {:.2} s CPU, workers {} = {:.2} s CPU ({:.2}x of one process)",
            one.wall,
            one.coordinator_cpu,
            dist.wall,
            dist.wall.as_secs_f64() / one.wall.as_secs_f64(),
            dist.coordinator_cpu,
            dist.worker_cpu
                .iter()
                .map(|c| format!("{c:.2}"))
                .collect::<Vec<_>>()
                .join(" + "),
            workers_total,
            (workers_total + dist.coordinator_cpu) / one.coordinator_cpu.max(1e-9),
        );
        let analyzed = pretty(&collect(&coord, &format!("EXPLAIN ANALYZE {sql}")).await);
        for line in analyzed.lines() {
            if line.contains("Network")
                || line.contains("Stage")
                || line.contains("PulpitumTaskScanExec")
            {
                println!("  {}", line.trim_matches(|c| c == '|' || c == ' '));
            }
        }
    }
    drop(children);
}
