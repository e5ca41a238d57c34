//! Network faults between the archiver and its two services, through a TCP proxy in front
//! of the real PostgreSQL and S3 (tests/support/proxy.rs).
//!
//! Ambiguous commits: the connection is cut right after `COMMIT` reaches the server and
//! before its answer reaches the worker (publish and cleanup), or before it reaches the
//! server at all; the runner settles the outcome by re-reading and every invariant holds.
//! Partitions: a worker's database and object-store connections are black-holed (nothing
//! forwarded, nothing closed) past its lease; it gives up within a bounded time, another
//! worker finishes the bucket, and when the network returns the first worker writes nothing.

mod archiver_support;
#[path = "support/proxy.rs"]
mod proxy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use archiver_support::*;
use proxy::{Action, Partition, Proxy, Rule};
use pulpitum::archive::ArchiveStore;
use pulpitum::archiver::{
    collect_garbage, is_fully_archived, ArchiverConfig, ArchiverMetrics, Runner,
};
use pulpitum::model::{
    BucketId, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use pulpitum::store::{BucketMeta, BucketState, HotStore, TableDefinition};
use tokio_util::sync::CancellationToken;

/// Text of the publish statement (it alone sets the state to archived).
const PUBLISH_SQL: &str = "SET state = 'archived'";
/// Text of a cleanup step's delete, and of its last step's flag update.
// The cleanup's delete, not the job-history prune that a cycle also sends.
const CLEANUP_DELETE_SQL: &str = "DELETE FROM pulpitum_v4_records";
const CLEANUP_DONE_SQL: &str = "SET hot_deleted = true";

struct Setup {
    db: String,
    archive_url: String,
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    bucket: BucketId,
    rows: Vec<Record>,
}

/// One eligible daily bucket of `n` rows in a fresh schema and S3 prefix.
async fn setup(label: &str, n: usize) -> Setup {
    let db = fresh_database(label).await;
    let archive_url = fresh_archive_url(label);
    let (store, archive) = open(&db, &archive_url).await;
    let table = TableId::new("chat").unwrap();
    let strategy = BucketStrategy::CalendarDayUtc;
    store
        .register_table(&TableDefinition::new(table.clone(), strategy, "chat"))
        .await
        .unwrap();
    let base = EventTime::parse_rfc3339("2021-04-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let rows: Vec<Record> = (0..n)
        .map(|i| Record {
            partition_key: PartitionKey::new(vec![7]).unwrap(),
            event_time: EventTime::from_micros(base + i as i64 * 1_000_000).unwrap(),
            sort_key: SortKey::new((i as u32).to_be_bytes().to_vec()).unwrap(),
            value: format!("row {i}").into_bytes(),
        })
        .collect();
    store.append_batch(&table, &rows).await.unwrap();
    let bucket = BucketId::of_record(&table, strategy, &rows[0]);
    Setup {
        db,
        archive_url,
        store,
        archive,
        bucket,
        rows,
    }
}

fn config(lease: Duration, op_deadline: Duration) -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap());
    c.lease = lease;
    c.op_deadline = op_deadline;
    c.cleanup_delay = Duration::ZERO;
    c.retry = Duration::ZERO;
    c.concurrency = 1;
    c.cleanup_batch_rows = 10;
    c.snapshot_page_rows = 10;
    c
}

/// `db` with its host and port replaced by the proxy's, and extra `-c` session options.
fn via(db: &str, proxy: &Proxy, app: &str, session: &str) -> String {
    let mut url = url::Url::parse(db).unwrap();
    let (host, port) = proxy
        .addr()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.parse().unwrap()))
        .unwrap();
    url.set_host(Some(&host)).unwrap();
    url.set_port(Some(port)).unwrap();
    // Built by hand: tokio-postgres percent-decodes the query but reads '+' literally.
    let enc = |v: &str| {
        v.replace('%', "%25")
            .replace(' ', "%20")
            .replace('=', "%3D")
    };
    let query: Vec<String> = url
        .query_pairs()
        .map(|(k, v)| match &*k {
            "options" => format!("options={}", enc(format!("{v} {session}").trim())),
            "application_name" => format!("application_name={}", enc(app)),
            _ => format!("{k}={}", enc(&v)),
        })
        .collect();
    url.set_query(Some(&query.join("&")));
    url.to_string()
}

/// The S3 endpoint of the test service, as `host:port`.
fn s3_target() -> String {
    let ep = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let url = url::Url::parse(&ep).unwrap();
    format!(
        "{}:{}",
        url.host_str().unwrap(),
        url.port_or_known_default().unwrap()
    )
}

/// An archive store whose S3 traffic goes through `proxy`, with short S3 timeouts.
fn archive_via(archive_url: &str, proxy: &Proxy) -> Arc<ArchiveStore> {
    let endpoint = format!("http://{}", proxy.addr());
    Arc::new(
        ArchiveStore::from_url_with_env(archive_url, |name| match name {
            "AWS_ENDPOINT_URL" => Some(endpoint.clone()),
            "PULPITUM_S3_TIMEOUT_SECONDS" => Some("2".into()),
            "PULPITUM_S3_IO_TIMEOUT_SECONDS" => Some("1".into()),
            other => std::env::var(other).ok(),
        })
        .unwrap(),
    )
}

async fn hot_row_count(db: &str) -> i64 {
    let (client, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .query_one("SELECT count(*) FROM pulpitum_v4_records", &[])
        .await
        .unwrap()
        .get(0)
}

async fn meta(s: &Setup) -> BucketMeta {
    s.store
        .bucket(&s.bucket)
        .await
        .unwrap()
        .expect("bucket row")
}

/// The end state every scenario must reach: published to the verified manifest of
/// `generation` (the claim that uploaded it), hot rows gone, every row readable exactly
/// once.
async fn assert_fully_archived_from(s: &Setup, generation: i64) {
    let m = meta(s).await;
    assert_eq!(
        m.state,
        BucketState::Archived {
            object_key: s.archive.manifest_key(&s.bucket, generation),
            hot_deleted: true
        },
        "{m:?}"
    );
    assert_eq!(hot_row_count(&s.db).await, 0, "hot rows left behind");
    assert_eq!(
        read_bucket(&*s.store, &s.archive, &s.bucket).await,
        s.rows,
        "rows lost or duplicated"
    );
}

/// The generation of the manifest the route names.
fn published_generation(m: &BucketMeta) -> i64 {
    let BucketState::Archived { object_key, .. } = &m.state else {
        panic!("not published: {m:?}");
    };
    let dir = object_key.rsplit('/').nth(1).unwrap();
    dir.strip_prefix('g').unwrap().parse().unwrap()
}

/// One `--once` pass: publication, then (cleanup being its own work item, due at once with
/// the zero cleanup delay) the cleanup in a later batch of the same drain.
async fn run_once(runner: &Runner) -> pulpitum::archiver::CycleReport {
    let drained = tokio::time::timeout(
        Duration::from_secs(45),
        runner.drain(&CancellationToken::new(), &|_, _| {}),
    )
    .await
    .expect("the pass finished in time")
    .expect("the pass ran");
    drained.totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_an_ambiguous_commit_is_settled_by_rereading() {
    // CutAfterReply: the publication committed and the worker saw the connection die.
    // CutBefore: the COMMIT never arrived; the server rolled the transaction back.
    for action in [Action::CutAfterReply, Action::CutBefore] {
        let s = setup("amb_pub", 25).await;
        let proxy = Proxy::postgres(&pg_target(), Partition::default()).await;
        let store = pulpitum::store::open(&via(&s.db, &proxy, "pulpitum-amb", ""))
            .await
            .unwrap();
        proxy.add_rule(Rule {
            arm: PUBLISH_SQL.into(),
            query: "COMMIT".into(),
            action,
        });
        let runner = Runner::new(
            store,
            s.archive.clone(),
            config(Duration::from_secs(10), Duration::from_secs(5)),
        )
        .unwrap();
        let report = run_once(&runner).await;
        assert_eq!(proxy.fired(), 1, "{action:?}: the cut never happened");
        assert_eq!(
            (report.archived, report.cleaned, report.failed),
            (1, 1, 0),
            "{action:?}: {report:?}"
        );
        assert_eq!(runner.metrics().buckets_archived.get(), 1, "{action:?}");
        // One claim and one publication (generation 1), then one cleanup claim (2).
        assert_fully_archived_from(&s, 1).await;
        assert_eq!(meta(&s).await.generation, 2, "{action:?}");
        // The cut connection was replaced: the store still works through the proxy.
        assert!(
            proxy.accepted() >= 2,
            "{action:?}: no new connection was made"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_with_ambiguous_commits_deletes_every_row_exactly_once() {
    let s = setup("amb_clean", 35).await;
    let proxy = Proxy::postgres(&pg_target(), Partition::default()).await;
    let store = pulpitum::store::open(&via(&s.db, &proxy, "pulpitum-amb", ""))
        .await
        .unwrap();
    // The first delete batch commits unseen, and so does the step that marks the end.
    for arm in [CLEANUP_DELETE_SQL, CLEANUP_DONE_SQL] {
        proxy.add_rule(Rule {
            arm: arm.into(),
            query: "COMMIT".into(),
            action: Action::CutAfterReply,
        });
    }
    let runner = Runner::new(
        store,
        s.archive.clone(),
        config(Duration::from_secs(10), Duration::from_secs(5)),
    )
    .unwrap();
    let report = run_once(&runner).await;
    assert_eq!(proxy.fired(), 2, "the cuts never happened");
    assert_eq!(
        (report.archived, report.cleaned, report.failed),
        (1, 1, 0),
        "{report:?}"
    );
    assert_fully_archived_from(&s, 1).await;
    assert_eq!(meta(&s).await.generation, 2);
}

fn pg_target() -> String {
    let url = url::Url::parse(&pg_base_url()).unwrap();
    format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432))
}

/// Waits until nothing is held by the partition and no session of `app` is doing anything
/// (what the healed network delivered has been executed), twice in a row.
async fn wait_drained(db: &str, partition: &Partition, app: &str) {
    let (client, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut quiet = 0;
    while quiet < 2 {
        let busy: Vec<String> = client
            .query(
                "SELECT state || ': ' || query FROM pg_stat_activity \
                 WHERE application_name = $1 AND state <> 'idle'",
                &[&app],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            Instant::now() < deadline,
            "the healed connections never settled: {} held, busy: {busy:?}",
            partition.held()
        );
        quiet = if busy.is_empty() && partition.held() == 0 {
            quiet + 1
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_worker_gives_up_in_bounded_time_and_writes_nothing_later() {
    let s = setup("partition", 30).await;
    let partition = Partition::default();
    let db_proxy = Proxy::postgres(&pg_target(), partition.clone()).await;
    let s3_proxy = Proxy::raw(&s3_target(), partition.clone()).await;
    const APP: &str = "pulpitum-partitioned";
    // The server closes a session whose transaction waits for its client longer than this,
    // releasing its row locks (the production default is 60 s; shortened to keep the test
    // short).
    let store_a = pulpitum::store::open(&via(
        &s.db,
        &db_proxy,
        APP,
        "-c idle_in_transaction_session_timeout=3000",
    ))
    .await
    .unwrap();
    let archive_a = archive_via(&s.archive_url, &s3_proxy);
    // Worker A loses its network when it sends the COMMIT of its publication: the UPDATE
    // ran (its row lock is held), the COMMIT is held back.
    db_proxy.add_rule(Rule {
        arm: PUBLISH_SQL.into(),
        query: "COMMIT".into(),
        action: Action::BlackHole,
    });
    let lease = Duration::from_secs(2);
    let runner_a = Arc::new(
        Runner::new(
            store_a.clone(),
            archive_a.clone(),
            config(lease, Duration::from_secs(1)),
        )
        .unwrap(),
    );
    let started = Instant::now();
    let worker_a = {
        let runner_a = runner_a.clone();
        tokio::spawn(async move {
            let report = runner_a
                .run_cycle(&CancellationToken::new(), &|_, _| {})
                .await;
            (report, started.elapsed())
        })
    };
    db_proxy.wait_fired(1, Duration::from_secs(30)).await;
    assert!(partition.is_on());

    // While A is cut off, its orphan GC must fail in bounded time too (S3 list timeouts).
    let gc_a = {
        let (store_a, archive_a) = (store_a.clone(), archive_a.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let metrics = ArchiverMetrics::default();
            let r =
                collect_garbage(&*store_a, &archive_a, Duration::from_secs(86_400), &metrics).await;
            (r.map(|_| ()), t.elapsed())
        })
    };

    // Worker B, with a working network, finishes the bucket once A's lease has expired
    // and the server has closed A's abandoned transaction.
    let runner_b = Runner::new(
        s.store.clone(),
        s.archive.clone(),
        config(lease, Duration::from_secs(5)),
    )
    .unwrap();
    let b_deadline = Instant::now() + Duration::from_secs(40);
    while !is_fully_archived(&*s.store, &s.bucket).await.unwrap() {
        assert!(
            Instant::now() < b_deadline,
            "the healthy worker could not finish the bucket: {:?}",
            meta(&s).await
        );
        let _ = run_once(&runner_b).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A must have given up on its own, without the network coming back.
    let (report_a, took_a) = tokio::time::timeout(Duration::from_secs(45), worker_a)
        .await
        .expect("the partitioned worker hung")
        .unwrap();
    let report_a = report_a.expect("the cycle itself ran");
    assert_eq!((report_a.archived, report_a.failed), (0, 1), "{report_a:?}");
    assert!(took_a < Duration::from_secs(40), "A took {took_a:?}");
    eprintln!("partitioned at publish: worker gave up after {took_a:?}");
    let (gc_result, gc_took) = tokio::time::timeout(Duration::from_secs(45), gc_a)
        .await
        .expect("GC over a black-holed network hung")
        .unwrap();
    assert!(gc_result.is_err(), "GC succeeded without a network");
    assert!(gc_took < Duration::from_secs(40), "GC took {gc_took:?}");
    eprintln!("partitioned GC failed after {gc_took:?}");
    assert!(
        partition.is_on(),
        "the network came back too early for this test"
    );

    let before_heal = meta(&s).await;
    let generation_b = published_generation(&before_heal);
    assert!(
        generation_b > 1,
        "A's upload was published: {before_heal:?}"
    );

    // The network returns: everything A had in flight is delivered now.
    partition.heal();
    wait_drained(&s.db, &partition, APP).await;
    assert_eq!(
        meta(&s).await,
        before_heal,
        "A wrote after the network returned"
    );
    assert_fully_archived_from(&s, generation_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_partitioned_mid_upload_stops_and_its_late_writes_change_nothing() {
    let s = setup("partition_up", 30).await;
    let partition = Partition::default();
    let db_proxy = Proxy::postgres(&pg_target(), partition.clone()).await;
    let s3_proxy = Proxy::raw(&s3_target(), partition.clone()).await;
    const APP: &str = "pulpitum-partitioned-upload";
    let store_a = pulpitum::store::open(&via(
        &s.db,
        &db_proxy,
        APP,
        "-c idle_in_transaction_session_timeout=3000",
    ))
    .await
    .unwrap();
    let archive_a = archive_via(&s.archive_url, &s3_proxy);
    // The payload is uploaded and verified; the network goes as the manifest is sent.
    s3_proxy.black_hole_on(&["PUT ", "manifest.json"]);
    let lease = Duration::from_secs(2);
    let runner_a = Runner::new(store_a, archive_a, config(lease, Duration::from_secs(1))).unwrap();
    let started = Instant::now();
    let report_a = tokio::time::timeout(Duration::from_secs(45), async {
        runner_a
            .run_cycle(&CancellationToken::new(), &|_, _| {})
            .await
    })
    .await
    .expect("the partitioned worker hung")
    .expect("the cycle itself ran");
    let took_a = started.elapsed();
    assert_eq!(s3_proxy.fired(), 1, "the partition never happened");
    assert!(partition.is_on());
    // The lease keeper notices that renewals go unanswered and stops the upload.
    assert_eq!((report_a.archived, report_a.failed), (0, 1), "{report_a:?}");
    assert!(
        report_a.errors.iter().any(|e| e.contains("lease lost")),
        "{report_a:?}"
    );
    assert!(took_a < Duration::from_secs(30), "A took {took_a:?}");
    eprintln!("partitioned mid-upload: worker gave up after {took_a:?}");
    assert_eq!(runner_a.metrics().lease_losses.get(), 1);

    let runner_b = Runner::new(
        s.store.clone(),
        s.archive.clone(),
        config(lease, Duration::from_secs(5)),
    )
    .unwrap();
    let b_deadline = Instant::now() + Duration::from_secs(40);
    while !is_fully_archived(&*s.store, &s.bucket).await.unwrap() {
        assert!(
            Instant::now() < b_deadline,
            "the healthy worker could not finish the bucket: {:?}",
            meta(&s).await
        );
        let _ = run_once(&runner_b).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before_heal = meta(&s).await;
    let generation_b = published_generation(&before_heal);
    assert!(
        generation_b > 1,
        "A's upload was published: {before_heal:?}"
    );

    // A's held manifest PUT and renewals are delivered now: an orphan object at most.
    partition.heal();
    wait_drained(&s.db, &partition, APP).await;
    assert_eq!(
        meta(&s).await,
        before_heal,
        "A wrote after the network returned"
    );
    assert_fully_archived_from(&s, generation_b).await;
}
