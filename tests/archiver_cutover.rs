//! The cutover race with the real runner: SQL queries run without pause over PostgreSQL and
//! S3 while the archiver claims, publishes and cleans up (no cleanup delay: the harshest
//! case for readers). Every query must see every row exactly once.

mod archiver_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use archiver_support::*;
use datafusion::arrow::array::{Array, Int64Array};
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::{encode_i64, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{BucketFilter, BucketState};
use tokio_util::sync::CancellationToken;

fn first_i64(b: &[datafusion::arrow::record_batch::RecordBatch], col: usize) -> i64 {
    let a = b[0]
        .column(col)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert!(!a.is_null(0));
    a.value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_during_real_archiving_sees_every_row_once() {
    let db = fresh_database("cutover").await;
    let archive_url = fresh_archive_url("cutover");
    let (store, archive) = open(&db, &archive_url).await;
    let opts = SessionOptions {
        page_rows: 7,
        ..SessionOptions::default()
    };
    let ctx = session(store.clone(), archive.clone(), opts).await.unwrap();
    ctx.sql("CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let table = TableId::new("chat").unwrap();
    let base = EventTime::parse_rfc3339("2021-06-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let mut records = Vec::new();
    let mut id_sum = 0i64;
    for ch in 1..=3i64 {
        for i in 0..400i64 {
            let id = ch * 100_000 + i;
            id_sum += id;
            records.push(Record {
                partition_key: PartitionKey::from_i64(ch),
                event_time: EventTime::from_micros(base + (i / 10) * 86_400_000_000 + i).unwrap(),
                sort_key: SortKey::new(encode_i64(id).to_vec()).unwrap(),
                value: format!("c{ch} m{i}").into_bytes(),
            });
        }
    }
    store.append_batch(&table, &records).await.unwrap();

    let mut config = ArchiverConfig::with_defaults();
    config.eligible_before = Some(EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap());
    config.cleanup_delay = Duration::ZERO;
    config.interval = Duration::from_millis(50);
    config.scan_limit = 8;
    config.concurrency = 2;
    let runner = Arc::new(Runner::new(store.clone(), archive.clone(), config).unwrap());
    let shutdown = CancellationToken::new();
    let done = Arc::new(AtomicBool::new(false));
    let worker = {
        let (runner, shutdown) = (runner.clone(), shutdown.clone());
        tokio::spawn(async move { runner.run(shutdown).await })
    };
    let watcher = {
        let (store, table, done) = (store.clone(), table.clone(), done.clone());
        tokio::spawn(async move {
            loop {
                let all = store
                    .list_buckets(&table, &BucketFilter::default())
                    .await
                    .unwrap();
                if all.iter().all(|m| {
                    matches!(
                        m.state,
                        BucketState::Archived {
                            hot_deleted: true,
                            ..
                        }
                    )
                }) {
                    done.store(true, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let mut rounds = 0;
    while !done.load(Ordering::SeqCst) || rounds < 2 {
        rounds += 1;
        let b = ctx
            .sql("SELECT count(*), sum(id) FROM chat")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(
            (first_i64(&b, 0), first_i64(&b, 1)),
            (1200, id_sum),
            "round {rounds}"
        );
        let b = ctx
            .sql("SELECT id FROM chat WHERE channel_id = 2 ORDER BY timestamp, id")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let ids: Vec<i64> = b
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(
            ids,
            (0..400).map(|i| 200_000 + i).collect::<Vec<_>>(),
            "round {rounds}"
        );
        assert!(rounds < 2_000, "archiving never finished");
    }
    watcher.await.unwrap();
    shutdown.cancel();
    worker.await.unwrap().unwrap();
    assert!(
        rounds > 3,
        "the queries must overlap the cutovers ({rounds} rounds)"
    );
    eprintln!("cutover race: {rounds} query rounds while 120 buckets were archived");
}
