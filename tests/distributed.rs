//! Queries over `pulpitum worker` processes: three real workers (the binary, each with its
//! own connections to the real PostgreSQL and radosgw), a coordinator session in this
//! process, and the same queries answered by a single-process session over the same tiers.
//! Archived scans must be split across the workers and answer row for row as one process
//! does; scans touching hot buckets stay on the coordinator; a worker that refuses the
//! coordinator, or is gone, fails the query naming it, never with partial rows.

mod archiver_support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use archiver_support::*;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use pulpitum::demo::{self, DemoScale};
use pulpitum::distributed::{DistributedSettings, StaticWorkers, WorkerSecret, WorkerTls};
use pulpitum::session::{self, SessionOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SECRET: &str = "test-secret-0123456789abcdef";

/// A `pulpitum worker` child, its URL and its metrics address.
struct Worker {
    child: Child,
    url: String,
    metrics: String,
}

impl Worker {
    /// One metric's value from the worker's exposition (0 when absent).
    async fn metric(&self, line_start: &str) -> f64 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.metrics).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: w\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

async fn spawn_worker(db: &str, archive: &str, secret: Option<&str>) -> Worker {
    spawn_worker_with(db, archive, secret, None, &[]).await
}

/// A CA, and one certificate it signs for 127.0.0.1 that every process of the deployment
/// presents (as server and as client), made with the openssl command.
struct Pki {
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl Pki {
    fn make(dir: &std::path::Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let f = |suffix: &str| dir.join(format!("{name}{suffix}"));
        std::fs::write(
            f(".ext"),
            "subjectAltName=IP:127.0.0.1,DNS:pulpitum-workers.test\n",
        )
        .unwrap();
        let s = |p: std::path::PathBuf| p.to_str().unwrap().to_string();
        for args in [
            vec![
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=pulpitum-test-ca",
            ],
            vec![
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
            ],
            vec!["x509", "-req", "-CAcreateserial", "-days", "2"],
        ]
        .into_iter()
        .zip([
            vec!["-keyout", ".ca.key", "-out", ".ca.pem"],
            vec!["-keyout", ".key", "-out", ".csr"],
            vec![
                "-in", ".csr", "-CA", ".ca.pem", "-CAkey", ".ca.key", "-extfile", ".ext", "-out",
                ".pem",
            ],
        ]) {
            let (args, files) = args;
            let mut c = std::process::Command::new("openssl");
            c.args(args);
            for pair in files.chunks(2) {
                c.arg(pair[0]).arg(s(f(pair[1])));
            }
            let ok = c
                .stderr(Stdio::null())
                .status()
                .expect("openssl runs")
                .success();
            assert!(ok, "openssl made {name}'s certificates");
        }
        Pki {
            ca: f(".ca.pem"),
            cert: f(".pem"),
            key: f(".key"),
        }
    }

    fn tls(&self) -> WorkerTls {
        WorkerTls::load(&self.ca, &self.cert, &self.key).unwrap()
    }
}

async fn spawn_worker_with(
    db: &str,
    archive: &str,
    secret: Option<&str>,
    tls: Option<&Pki>,
    extra: &[&str],
) -> Worker {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pulpitum"));
    c.args([
        "worker",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
    ])
    .args(extra)
    .env("PULPITUM_DATABASE_URL", db)
    .env("PULPITUM_ARCHIVE_URL", archive)
    .env("PULPITUM_LOG", "warn")
    .env_remove("PULPITUM_WORKERS")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    match (secret, tls) {
        (Some(s), _) => c.env("PULPITUM_WORKER_SECRET", s),
        (None, Some(_)) => c.env_remove("PULPITUM_WORKER_SECRET"),
        (None, None) => c
            .env_remove("PULPITUM_WORKER_SECRET")
            .arg("--insecure-no-auth"),
    };
    if let Some(pki) = tls {
        c.env("PULPITUM_WORKER_TLS_CA", &pki.ca)
            .env("PULPITUM_WORKER_TLS_CERT", &pki.cert)
            .env("PULPITUM_WORKER_TLS_KEY", &pki.key);
    }
    for (k, v) in S3_ENV {
        c.env(k, std::env::var(k).unwrap_or_else(|_| v.to_string()));
    }
    let mut child = c.spawn().expect("start pulpitum worker");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (metrics, addr) = tokio::time::timeout(Duration::from_secs(60), async {
        let mut metrics = None;
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(addr) = line.strip_prefix("pulpitum: worker metrics on ") {
                metrics = Some(addr.to_string());
            } else if let Some(addr) = line.strip_prefix("pulpitum: worker listening on ") {
                return (metrics.expect("metrics announced first"), addr.to_string());
            } else {
                eprintln!("worker: {line}");
            }
        }
        panic!("worker exited before listening");
    })
    .await
    .expect("worker listening within a minute");
    // Keep draining its stderr so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let scheme = if tls.is_some() { "https" } else { "http" };
    Worker {
        child,
        url: format!("{scheme}://{addr}"),
        metrics,
    }
}

struct Fixture {
    db: String,
    archive: String,
    workers: Vec<Worker>,
    single: SessionContext,
    cutoff: String,
}

const SCALE: DemoScale = DemoScale {
    channels: 8,
    days: 160,
    messages_per_day: 8,
};

fn opts() -> SessionOptions {
    SessionOptions {
        target_partitions: Some(4),
        ..Default::default()
    }
}

async fn fixture(label: &str) -> Fixture {
    let db = fresh_database(label).await;
    let archive = fresh_archive_url(label);
    let (store, arch) = open(&db, &archive).await;
    let report = demo::load_and_archive(store.clone(), arch.clone(), SCALE, &|_, _, _| {})
        .await
        .expect("demo history loaded, archived and compacted");
    assert!(report.archived_buckets > 100, "{report:?}");
    assert!(report.segments > 0, "{report:?}");
    let single = session::session(store, arch, opts()).await.unwrap();
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(spawn_worker(&db, &archive, Some(SECRET)).await);
    }
    Fixture {
        db,
        archive,
        workers,
        single,
        cutoff: report.cutoff.to_string(),
    }
}

impl Fixture {
    fn list(&self) -> String {
        self.workers
            .iter()
            .map(|w| w.url.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn coordinator(&self, list: &str, secret: Option<&str>) -> SessionContext {
        self.coordinator_with(list, secret, None).await
    }

    async fn coordinator_with(
        &self,
        list: &str,
        secret: Option<&str>,
        tls: Option<WorkerTls>,
    ) -> SessionContext {
        let (store, arch) = open(&self.db, &self.archive).await;
        let settings = DistributedSettings {
            workers: Arc::new(StaticWorkers::parse(list).unwrap()),
            secret: secret.map(|s| WorkerSecret::new(s).unwrap()),
            tls,
            buckets_per_task: 16,
        };
        session::distributed_session(store, arch, opts(), &settings)
            .await
            .unwrap()
    }
}

async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
    df.collect().await.map_err(|e| e.to_string())
}

fn pretty(b: &[RecordBatch]) -> String {
    datafusion::arrow::util::pretty::pretty_format_batches(b)
        .unwrap()
        .to_string()
}

/// The physical plan as datafusion-distributed draws it (stages and tasks).
async fn distributed_plan(ctx: &SessionContext, sql: &str) -> String {
    let plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    datafusion_distributed::display_plan_ascii(plan.as_ref(), false)
}

fn archived_queries(cutoff: &str) -> Vec<String> {
    let w = format!("timestamp < TIMESTAMP '{cutoff}'");
    vec![
        format!("SELECT count(*), sum(id), min(timestamp), max(timestamp) FROM chat WHERE {w}"),
        format!(
            "SELECT channel_id, count(*), min(id), max(id), sum(length(content)) FROM chat \
             WHERE {w} GROUP BY channel_id ORDER BY channel_id"
        ),
        format!(
            "SELECT date_trunc('month', timestamp) AS m, count(DISTINCT channel_id), count(*) \
             FROM chat WHERE {w} GROUP BY m ORDER BY m"
        ),
        format!("SELECT * FROM chat WHERE {w} ORDER BY timestamp, channel_id, id"),
        format!(
            "SELECT channel_id, id, row_number() OVER (PARTITION BY channel_id ORDER BY \
             timestamp, id) AS n FROM chat WHERE {w} ORDER BY channel_id, id"
        ),
        format!(
            "SELECT a.channel_id, count(*) FROM chat a JOIN chat b ON a.channel_id = \
             b.channel_id AND a.id = b.id WHERE a.{w} AND b.{w} GROUP BY a.channel_id \
             ORDER BY a.channel_id"
        ),
        format!(
            "SELECT channel_id, content FROM chat WHERE {w} AND content LIKE '%deploy%' \
             ORDER BY channel_id, timestamp, id"
        ),
        format!(
            "SELECT DISTINCT channel_id FROM chat WHERE {w} AND channel_id >= 2 \
             AND channel_id <= 3 ORDER BY channel_id"
        ),
        // Many groups in the scan's own key order: a plan that relied on the order each
        // task keeps would merge them wrongly across tasks.
        format!(
            "SELECT channel_id, date_trunc('day', timestamp) AS d, count(*), min(id) FROM chat \
             WHERE {w} GROUP BY channel_id, d ORDER BY channel_id, d"
        ),
        format!(
            "SELECT channel_id, timestamp, id FROM chat WHERE {w} ORDER BY channel_id DESC, \
             timestamp DESC, id DESC LIMIT 500"
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_scans_split_across_workers_answer_as_one_process() {
    let f = fixture("dist_eq").await;
    let coord = f.coordinator(&f.list(), Some(SECRET)).await;
    for sql in archived_queries(&f.cutoff) {
        let plan = distributed_plan(&coord, &sql).await;
        assert!(
            plan.contains("PulpitumTaskScanExec") && plan.contains("Stage"),
            "{sql}: the archived scan was not split over the workers:\n{plan}"
        );
        let want = run(&f.single, &sql).await.unwrap();
        let got = run(&coord, &sql).await.unwrap();
        assert!(!want.is_empty());
        assert_eq!(pretty(&got), pretty(&want), "{sql}\n{plan}");
    }
    // Each worker's metrics: the split tasks ran on more than one of them, produced rows,
    // and none is still running once the queries are answered; no request was refused.
    let mut ran_on = 0;
    let mut rows = 0.0;
    for w in &f.workers {
        let tasks = w.metric("pulpitum_worker_scan_tasks_total ").await;
        ran_on += usize::from(tasks > 0.0);
        rows += w.metric("pulpitum_worker_scan_rows_total ").await;
        assert_eq!(
            w.metric("pulpitum_worker_requests_refused_total ").await,
            0.0
        );
        assert!(
            w.metric("pulpitum_worker_requests_total{method=\"execute_task\"} ")
                .await
                >= tasks.min(1.0)
        );
        let mut active = w.metric("pulpitum_worker_scan_tasks_active ").await;
        for _ in 0..50 {
            if active == 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            active = w.metric("pulpitum_worker_scan_tasks_active ").await;
        }
        assert_eq!(
            active, 0.0,
            "{}: scan tasks still counted as running",
            w.url
        );
    }
    assert!(ran_on >= 2, "split tasks ran on {ran_on} worker(s)");
    assert!(rows > 0.0);
    // History joined with recent rows: the archived side split, the hot side one task
    // (break-it finding: the hot stage was placed on the coordinator, and the workers
    // consuming it dialed an address that does not exist).
    let w = format!("TIMESTAMP '{}'", f.cutoff);
    for sql in [
        format!(
            "SELECT count(*) FROM chat a JOIN chat b ON a.id = b.id - 1 \
             WHERE a.timestamp < {w} AND b.timestamp >= {w}"
        ),
        format!(
            "SELECT count(*) FROM chat WHERE timestamp < {w} AND channel_id IN \
             (SELECT channel_id FROM chat WHERE timestamp >= {w} AND channel_id < 4)"
        ),
        format!(
            "SELECT a.channel_id, count(*) FROM chat a JOIN chat b ON a.channel_id = \
             b.channel_id AND a.id = b.id WHERE a.timestamp < {w} AND b.channel_id = 2 \
             GROUP BY a.channel_id ORDER BY a.channel_id"
        ),
    ] {
        let want = run(&f.single, &sql).await.unwrap();
        let got = run(&coord, &sql).await.unwrap();
        assert_eq!(pretty(&got), pretty(&want), "{sql}");
    }
    // History and recent rows in one scan: the history split, the recent buckets one task.
    for sql in [
        "SELECT count(*), sum(id) FROM chat",
        "SELECT channel_id, max(timestamp), count(*) FROM chat GROUP BY channel_id \
         ORDER BY channel_id",
    ] {
        let plan = distributed_plan(&coord, sql).await;
        assert!(
            plan.contains("PulpitumTaskScanExec") && plan.contains("hot=0, archiving=0"),
            "{sql}: the history was not split:\n{plan}"
        );
        let want = run(&f.single, sql).await.unwrap();
        let got = run(&coord, sql).await.unwrap();
        assert_eq!(pretty(&got), pretty(&want), "{sql}\n{plan}");
    }
    // Scans of recent rows only, and scans naming their channels (one channel's history,
    // a page of it), stay on the coordinator, with the same answers.
    for sql in [
        format!("SELECT count(*), sum(id) FROM chat WHERE timestamp >= {w}"),
        "SELECT * FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC LIMIT 20".to_string(),
        format!(
            "SELECT * FROM chat WHERE channel_id IN (1, 2) AND timestamp < {w} \
             ORDER BY timestamp DESC, id DESC LIMIT 20"
        ),
        "SELECT count(*) FROM chat WHERE channel_id = 3".to_string(),
    ] {
        let sql = sql.as_str();
        let plan = distributed_plan(&coord, sql).await;
        assert!(
            !plan.contains("PulpitumTaskScanExec"),
            "{sql}: a scan of hot buckets was split:\n{plan}"
        );
        let want = run(&f.single, sql).await.unwrap();
        let got = run(&coord, sql).await.unwrap();
        assert_eq!(pretty(&got), pretty(&want), "{sql}");
    }
    // The shell as a coordinator: `--workers` and the secret from the environment.
    let sql = &archived_queries(&f.cutoff)[1];
    let mut shell = Command::new(env!("CARGO_BIN_EXE_pulpitum"));
    shell
        .args(["--format", "csv", "--workers", &f.list(), "-c", sql])
        .env("PULPITUM_DATABASE_URL", &f.db)
        .env("PULPITUM_ARCHIVE_URL", &f.archive)
        .env("PULPITUM_WORKER_SECRET", SECRET);
    for (k, v) in S3_ENV {
        shell.env(k, std::env::var(k).unwrap_or_else(|_| v.to_string()));
    }
    let out = shell.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let csv = String::from_utf8_lossy(&out.stdout);
    assert_eq!(csv.lines().count(), 1 + SCALE.channels as usize, "{csv}");
    assert!(!stderr.contains(SECRET), "{stderr}");
    // EXPLAIN through SQL shows the stages too.
    let sql = &archived_queries(&f.cutoff)[1];
    let explain = pretty(&run(&coord, &format!("EXPLAIN {sql}")).await.unwrap());
    assert!(
        explain.contains("PulpitumTaskScanExec") && explain.contains("Network"),
        "{explain}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_or_lost_worker_fails_the_query_naming_it() {
    let mut f = fixture("dist_fail").await;
    let sql = &archived_queries(&f.cutoff)[1];
    let want = pretty(&run(&f.single, sql).await.unwrap());

    // The wrong secret, and none: refused by every worker, no fallback to local reads.
    for secret in [Some("another-secret-0123456789"), None] {
        let coord = f.coordinator(&f.list(), secret).await;
        let e = run(&coord, sql).await.unwrap_err();
        assert!(
            f.workers.iter().any(|w| e.contains(&w.url)),
            "the error names no worker: {e}"
        );
        assert!(e.contains("PULPITUM_WORKER_SECRET"), "{e}");
    }
    let mut refused = 0.0;
    for w in &f.workers {
        refused += w.metric("pulpitum_worker_requests_refused_total ").await;
    }
    assert!(refused >= 2.0, "refusals counted: {refused}");

    // A worker holding its --max-connections closes the next connection on arrival, counts
    // it, and takes a new one once a slot is free.
    let small = spawn_worker_with(
        &f.db,
        &f.archive,
        Some(SECRET),
        None,
        &["--max-connections", "2"],
    )
    .await;
    let addr = small.url.trim_start_matches("http://").to_string();
    let held_a = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let held_b = tokio::net::TcpStream::connect(&addr).await.unwrap();
    async fn closed_at_once(addr: &str) -> bool {
        use tokio::io::AsyncReadExt;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
    assert!(closed_at_once(&addr).await, "a third connection was held");
    assert_eq!(
        small
            .metric("pulpitum_worker_connections_refused_total ")
            .await,
        1.0
    );
    assert_eq!(small.metric("pulpitum_worker_connections ").await, 2.0);
    drop(held_a);
    let mut freed = false;
    for _ in 0..50 {
        if small.metric("pulpitum_worker_connections ").await < 2.0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(freed, "a closed connection kept its slot");
    assert!(
        !closed_at_once(&addr).await,
        "a free slot was not given to a new connection"
    );
    // SIGTERM with a connection that never speaks still open: the worker exits after its
    // drain period instead of waiting for that connection forever (break-it finding).
    let mut small = small;
    // SAFETY: signals a child process this test started.
    unsafe { libc::kill(small.child.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(60), small.child.wait())
        .await
        .expect("a stopping worker exited within 60 s despite an idle connection")
        .unwrap();
    assert!(status.success(), "{status}");
    drop(held_b);

    // A worker that is gone before the query.
    let coord = f.coordinator(&f.list(), Some(SECRET)).await;
    assert_eq!(pretty(&run(&coord, sql).await.unwrap()), want);
    let mut dead = f.workers.pop().unwrap();
    dead.child.kill().await.unwrap();
    let coord_dead = f
        .coordinator(&format!("{},{}", f.list(), dead.url), Some(SECRET))
        .await;
    let mut failures = 0;
    for _ in 0..5 {
        match run(&coord_dead, sql).await {
            Err(e) => {
                assert!(
                    e.contains(&dead.url),
                    "the error does not name {}: {e}",
                    dead.url
                );
                failures += 1;
            }
            // Tasks placed on the live workers only: the whole answer.
            Ok(got) => assert_eq!(pretty(&got), want),
        }
    }
    assert!(
        failures > 0,
        "five queries never placed a task on the dead worker"
    );

    // A worker frozen in place (SIGSTOP: its connections stay open, nothing answers):
    // the pings find it, and the query fails naming it instead of waiting forever.
    let frozen = f.workers.last().unwrap();
    let frozen_pid = frozen.child.id().unwrap() as i32;
    // SAFETY: signals a child process this test started.
    unsafe { libc::kill(frozen_pid, libc::SIGSTOP) };
    let coord = f.coordinator(&f.list(), Some(SECRET)).await;
    let started = std::time::Instant::now();
    let mut frozen_failures = 0;
    for _ in 0..3 {
        match tokio::time::timeout(Duration::from_secs(90), run(&coord, sql)).await {
            Err(_) => panic!("a query waited 90 s on a frozen worker"),
            Ok(Err(e)) => {
                assert!(
                    e.contains(&frozen.url),
                    "the error does not name the frozen worker: {e}"
                );
                frozen_failures += 1;
            }
            Ok(Ok(got)) => assert_eq!(pretty(&got), want),
        }
    }
    // SAFETY: as above.
    unsafe { libc::kill(frozen_pid, libc::SIGCONT) };
    assert!(
        frozen_failures > 0,
        "three queries never placed a task on the frozen worker"
    );
    eprintln!(
        "frozen worker: {frozen_failures} of 3 queries failed, in {:.1?} in all",
        started.elapsed()
    );

    // A worker killed while the query streams: an error or the whole answer, never part.
    let all = &archived_queries(&f.cutoff)[3];
    let want_all = pretty(&run(&f.single, all).await.unwrap());
    let mut victim = f.workers.pop().unwrap();
    let coord = f
        .coordinator(&format!("{},{}", f.list(), victim.url), Some(SECRET))
        .await;
    let mut stream = coord
        .sql(all)
        .await
        .unwrap()
        .execute_stream()
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut outcome = Ok(());
    let mut killed = false;
    while let Some(item) = stream.next().await {
        match item {
            Ok(b) => got.push(b),
            Err(e) => {
                outcome = Err(e.to_string());
                break;
            }
        }
        if !killed {
            victim.child.kill().await.unwrap();
            killed = true;
        }
    }
    match outcome {
        Ok(()) => assert_eq!(pretty(&got), want_all, "partial rows after a worker died"),
        Err(e) => assert!(
            e.contains(&victim.url) || e.contains("worker"),
            "the error names no worker: {e}"
        ),
    }
}

/// Mutual TLS instead of the secret: workers serving TLS answer a coordinator holding a
/// certificate from their CA exactly as one process does; a coordinator from another CA,
/// one speaking plain HTTP/2 to them, one dialling http:// while TLS is configured, and a
/// client with no certificate at all are refused, naming the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_workers_answer_their_ca_and_refuse_everyone_else() {
    let f = fixture("dist_tls").await;
    let dir = std::env::temp_dir().join(format!("pulpitum-dist-tls-{}", std::process::id()));
    let ours = Pki::make(&dir, "ours");
    let theirs = Pki::make(&dir, "theirs");
    let mut tls_workers = Vec::new();
    for _ in 0..2 {
        tls_workers.push(spawn_worker_with(&f.db, &f.archive, None, Some(&ours), &[]).await);
    }
    let list = tls_workers
        .iter()
        .map(|w| w.url.clone())
        .collect::<Vec<_>>()
        .join(",");
    assert!(list.starts_with("https://"), "{list}");
    let sql = &archived_queries(&f.cutoff)[1];
    let want = pretty(&run(&f.single, sql).await.unwrap());

    let coord = f.coordinator_with(&list, None, Some(ours.tls())).await;
    let plan = distributed_plan(&coord, sql).await;
    assert!(plan.contains("PulpitumTaskScanExec"), "{plan}");
    assert_eq!(pretty(&run(&coord, sql).await.unwrap()), want);

    // One name for every worker, as for a list by address: the certificate names it; a
    // name it does not carry is refused.
    let named = ours
        .tls()
        .with_server_name("pulpitum-workers.test")
        .unwrap();
    let coord = f.coordinator_with(&list, None, Some(named)).await;
    assert_eq!(pretty(&run(&coord, sql).await.unwrap()), want);
    let misnamed = ours.tls().with_server_name("elsewhere.test").unwrap();
    let coord = f.coordinator_with(&list, None, Some(misnamed)).await;
    let e = run(&coord, sql).await.unwrap_err();
    assert!(tls_workers.iter().any(|w| e.contains(&w.url)), "{e}");

    // Another deployment's CA: neither side trusts the other.
    let coord = f.coordinator_with(&list, None, Some(theirs.tls())).await;
    let e = run(&coord, sql).await.unwrap_err();
    assert!(tls_workers.iter().any(|w| e.contains(&w.url)), "{e}");

    // Plain HTTP/2 to a TLS port (no TLS configured on this coordinator).
    let plain = list.replace("https://", "http://");
    let coord = f.coordinator_with(&plain, None, None).await;
    let e = run(&coord, sql).await.unwrap_err();
    assert!(
        tls_workers
            .iter()
            .any(|w| e.contains(&w.url.replace("https://", "http://"))),
        "{e}"
    );

    // TLS configured, but the directory lists http://: refused before dialling.
    let coord = f.coordinator_with(&plain, None, Some(ours.tls())).await;
    let e = run(&coord, sql).await.unwrap_err();
    assert!(e.contains("plain http://"), "{e}");
    let e = DistributedSettings::from_list(&plain, Some(ours.tls()))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("write https://"), "{e}");

    // A client that trusts the worker but presents no certificate gets no HTTP/2 answer.
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(&ours.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let addr = tls_workers[0]
        .url
        .trim_start_matches("https://")
        .to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let outcome = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        s.flush().await?;
        let mut buf = [0u8; 64];
        s.read(&mut buf).await
    };
    match tokio::time::timeout(Duration::from_secs(30), outcome).await {
        Err(_) => panic!("a client without a certificate was held open for 30 s"),
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("a client without a certificate was answered {n} bytes"),
    }

    // Half a TLS setup is refused at start, naming what is missing.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["worker", "--listen", "127.0.0.1:0", "--worker-tls-ca"])
        .arg(&ours.ca)
        .env("PULPITUM_DATABASE_URL", &f.db)
        .env("PULPITUM_ARCHIVE_URL", &f.archive)
        .env_remove("PULPITUM_WORKER_SECRET")
        .env_remove("PULPITUM_WORKER_TLS_CERT")
        .env_remove("PULPITUM_WORKER_TLS_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("missing --worker-tls-cert and --worker-tls-key"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
