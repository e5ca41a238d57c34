//! Queries running without pause while buckets are published and cleaned up (with no
//! cleanup delay, the harshest case for readers) never miss or duplicate a row. The full
//! archiver race belongs to the archiver's suite; this one drives the store steps directly.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::{Array, Int64Array};
use pulpitum::archive::PayloadFormat;
use pulpitum::model::{BucketId, Record, TableId};
use pulpitum::session::SessionOptions;
use pulpitum::store::{Appends, BucketFilter, RoutedReads};

use crate::common::*;
use crate::dataset::{self, Msg};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_during_publication_and_cleanup_see_every_row_once() {
    let opts = SessionOptions {
        page_rows: 3,
        target_partitions: Some(2),
        ..SessionOptions::default()
    };
    let env = Arc::new(Env::with_options("cutover", opts).await);
    env.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    let base = pulpitum::model::EventTime::parse_rfc3339("2024-01-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let mut records: Vec<Record> = Vec::new();
    for ch in [1i64, 2] {
        for i in 0..120i64 {
            records.push(dataset::record(&Msg {
                channel: ch,
                micros: base + (i / 4) * 86_400_000_000 / 2 + i,
                id: 1000 - i,
                content: format!("c{ch}-{i}"),
            }));
        }
    }
    let table = TableId::new("chat").unwrap();
    env.store.append_batch(&table, &records).await.unwrap();
    let buckets: Vec<BucketId> = env
        .store
        .list_buckets(&table, &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert!(buckets.len() > 20);

    let done = Arc::new(AtomicBool::new(false));
    // Paces the archiver to the readers (bucket i waits for round i / 4), so the cutovers
    // overlap many rounds however fast or slow this machine is.
    let rounds_done = Arc::new(AtomicUsize::new(0));
    let archiver = {
        let env = env.clone();
        let done = done.clone();
        let rounds_done = rounds_done.clone();
        tokio::spawn(async move {
            let mut loaded = dataset::Loaded::default();
            for (i, b) in buckets.iter().enumerate() {
                while rounds_done.load(Ordering::SeqCst) < i / 4 {
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
                let format = if i % 2 == 0 {
                    PayloadFormat::Parquet
                } else {
                    PayloadFormat::Json
                };
                dataset::archive(&env, b, format, true, &mut loaded).await;
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    // The same reads prepared: their scans list buckets at execution, with the first page.
    let prepared_count = pulpitum::prepared::prepare(
        &env.ctx,
        "SELECT count(*) AS n, sum(id) AS s FROM chat WHERE channel_id = $1",
    )
    .await
    .unwrap();
    let prepared_page = pulpitum::prepared::prepare(
        &env.ctx,
        "SELECT id FROM chat WHERE channel_id = $1 ORDER BY timestamp DESC, id DESC LIMIT 1000",
    )
    .await
    .unwrap();
    let mut rounds = 0;
    while !done.load(Ordering::SeqCst) || rounds < 3 {
        rounds += 1;
        for (sql, expect) in [
            (
                "SELECT count(*) AS n, sum(id) AS s FROM chat",
                (240i64, 2 * (120 * 1000 - (0..120).sum::<i64>())),
            ),
            (
                "SELECT count(*) AS n, sum(id) AS s FROM chat WHERE channel_id = 2",
                (120, 120 * 1000 - (0..120).sum::<i64>()),
            ),
        ] {
            let b = env.sql(sql).await;
            let n = b[0]
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0);
            let s = b[0]
                .column(1)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            assert!(!s.is_null(0));
            assert_eq!((n, s.value(0)), expect, "{sql} in round {rounds}");
        }
        let b = env
            .sql("SELECT id FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC, id DESC")
            .await;
        let ids = int_column(&b, 0);
        let expected: Vec<i64> = (0..120).rev().map(|i| 1000 - i).collect();
        assert_eq!(ids, expected, "round {rounds}");

        let one = datafusion::scalar::ScalarValue::Int64(Some(1));
        let b = prepared_count
            .execute(std::slice::from_ref(&one))
            .await
            .unwrap();
        assert_eq!(
            (int_column(&b, 0)[0], int_column(&b, 1)[0]),
            (120, 120 * 1000 - (0..120).sum::<i64>()),
            "prepared count in round {rounds}"
        );
        let b = prepared_page.execute(&[one]).await.unwrap();
        let ids = int_column(&b, 0);
        assert_eq!(ids, expected, "prepared page in round {rounds}");
        rounds_done.store(rounds, Ordering::SeqCst);
    }
    archiver.await.unwrap();
    assert!(
        rounds > 3,
        "the queries must overlap the cutovers ({rounds} rounds)"
    );
    Arc::try_unwrap(env).ok().unwrap().cleanup().await;
}

/// The values of a BIGINT column across batches.
fn int_column(batches: &[datafusion::arrow::record_batch::RecordBatch], col: usize) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(col)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}
