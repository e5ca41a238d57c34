//! What an operator's monitoring sees from a real `pulpitum-archiver` process over
//! PostgreSQL and S3: `/metrics` gauges that follow the backlog down as buckets are archived,
//! a last-publish time, `/healthz` answering 200 while work succeeds and 503 with a reason
//! when every bucket fails, and no credential anywhere in the exposition.

mod archiver_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use archiver_support::*;
use pulpitum::model::{BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::TableDefinition;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port nothing listens on now (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Status code and body of `GET path`, or `None` while nothing listens.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// The unlabelled samples of an exposition, by name.
fn samples(text: &str) -> BTreeMap<String, i64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A table with one row in each of `days` daily buckets of 2021.
async fn seed(db: &str, archive_url: &str, days: u32) {
    let (store, _) = open(db, archive_url).await;
    let table = TableId::new("chat").unwrap();
    store
        .register_table(&TableDefinition::new(
            table.clone(),
            BucketStrategy::CalendarDayUtc,
            "chat",
        ))
        .await
        .unwrap();
    for d in 1..=days {
        let t = EventTime::parse_rfc3339(&format!("2021-03-{d:02}T12:00:00Z")).unwrap();
        let r = Record {
            partition_key: PartitionKey::new(vec![1]).unwrap(),
            event_time: t,
            sort_key: SortKey::new(vec![d as u8]).unwrap(),
            value: b"hello".to_vec(),
        };
        store.append(&table, &r).await.unwrap();
    }
}

/// Settings that make one cycle archive one bucket, a cycle a second.
const ONE_AT_A_TIME: &[&str] = &[
    "--eligible-before",
    "2022-01-01T00:00:00Z",
    "--interval-seconds",
    "1",
    "--scan-limit",
    "1",
    "--concurrency",
    "1",
    "--retry-seconds",
    "0",
    "--cleanup-delay-seconds",
    "0",
    "--no-gc",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_backlog_and_health_is_ok_while_buckets_publish() {
    // A password in the URL (trust authentication ignores it) must not reach the metrics.
    let db = fresh_database("monitor")
        .await
        .replace("postgres@", "postgres:hunter2monitor@");
    let archive_url = fresh_archive_url("monitor");
    seed(&db, &archive_url, 3).await;
    let port = free_port();
    let mut child = archiver(&db, &archive_url)
        .args(ONE_AT_A_TIME)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .spawn()
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    // The backlog gauge after each finished cycle (it is counted at the end of a cycle).
    let mut backlog: Vec<i64> = Vec::new();
    // The per-table lag beside each backlog value: the age of the oldest eligible end.
    let mut lags: BTreeMap<i64, Option<i64>> = BTreeMap::new();
    let lag_name = "pulpitum_archiver_table_lag_seconds{table=\"chat\"}";
    let last = loop {
        assert!(Instant::now() < deadline, "never drained: {backlog:?}");
        let Some((status, text)) = get(port, "/metrics").await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        assert_eq!(status, 200, "{text}");
        assert!(!text.contains("hunter2monitor"), "password in metrics");
        assert!(!text.contains("SKTESTSECRET"), "S3 secret in metrics");
        let s = samples(&text);
        let b = s["pulpitum_archiver_backlog_buckets"];
        if s["pulpitum_archiver_cycles_total"] >= 1 && backlog.last() != Some(&b) {
            backlog.push(b);
            lags.insert(b, s.get(lag_name).copied());
        }
        if b == 0
            && s["pulpitum_archiver_buckets_archived_total"] == 3
            && s["pulpitum_archiver_buckets_cleaned_total"] == 3
        {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // One bucket a cycle: the backlog was seen going down through every value.
    assert_eq!(backlog, vec![2, 1, 0], "backlog after each cycle");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // With two left, the oldest eligible bucket ends 2021-03-03; with one, 2021-03-04; with
    // none, the table has no lag series at all.
    for (left, end) in [(2, 1_614_729_600), (1, 1_614_816_000)] {
        let lag = lags[&left].unwrap_or_else(|| panic!("no lag with {left} left: {lags:?}"));
        assert!(
            (now - end - 120..=now - end).contains(&lag),
            "lag {lag} with {left} left"
        );
    }
    assert_eq!(lags[&0], None, "{lags:?}");
    for gauge in [
        "pulpitum_archiver_last_publish_timestamp_seconds",
        "pulpitum_archiver_last_success_timestamp_seconds",
        "pulpitum_archiver_last_cleanup_timestamp_seconds",
    ] {
        let t = last[gauge];
        assert!(
            (now - 120..=now + 1).contains(&t),
            "{gauge} = {t}, now {now}"
        );
    }
    assert_eq!(last["pulpitum_archiver_archiving_buckets"], 0);
    assert_eq!(last["pulpitum_archiver_rows_archived_total"], 3);
    let (status, body) = get(port, "/healthz").await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ok: "), "{body}");
    child.kill().await.unwrap();
}

// The fault layer exists only in `failpoints` builds (CI runs with it).
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_with_a_reason_when_every_bucket_fails() {
    let db = fresh_database("unhealthy").await;
    let good = fresh_archive_url("unhealthy");
    seed(&db, &good, 2).await;
    // Every object-store call after the start-up probe fails (the fault layer of the
    // `failpoints` build): every upload fails and its bucket is deferred. A broken archive
    // URL would not do: the create-once probe refuses it before the metrics server starts.
    let port = free_port();
    let mut child = archiver(&db, &good)
        .env("PULPITUM_FAULT_RATE", "1")
        .args(ONE_AT_A_TIME)
        .args([
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--health-max-age-seconds",
            "5",
        ])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first_healthy = None;
    let body = loop {
        assert!(Instant::now() < deadline, "health never turned 503");
        match get(port, "/healthz").await {
            Some((200, body)) => {
                first_healthy.get_or_insert(body);
            }
            Some((503, body)) => break body,
            Some((status, body)) => panic!("unexpected {status}: {body}"),
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Healthy during its first seconds (no verdict before the allowance has passed) ...
    assert!(first_healthy.is_some(), "never healthy at start");
    // ... then a one-line reason naming the allowance and the failing cycle.
    assert_eq!(body.trim_end().lines().count(), 1, "{body}");
    assert!(body.contains("limit 5 s"), "{body}");
    assert!(body.contains("1 of 1 work items failed"), "{body}");
    let (_, text) = get(port, "/metrics").await.unwrap();
    let s = samples(&text);
    assert_eq!(s["pulpitum_archiver_last_success_timestamp_seconds"], 0);
    assert_eq!(s["pulpitum_archiver_buckets_archived_total"], 0);
    assert!(s["pulpitum_archiver_buckets_deferred_total"] >= 1, "{text}");
    assert_eq!(s["pulpitum_archiver_backlog_buckets"], 2, "{text}");
    child.kill().await.unwrap();
}
