//! SQL-surface benchmarks against a real PostgreSQL (127.0.0.1:5432, database `test`), with
//! same-run ratios and percentiles:
//!
//! 1. the latest 50 messages of a channel from a hot bucket, through SQL (planning included)
//!    against a direct tokio-postgres prepared query of the same rows;
//! 2. the same page from an archived (Parquet) bucket, and its object-store requests;
//! 3. planning time of a one-day query on a table with 10,000 buckets.
//!
//! Run: `cargo bench --bench sql` (release) or `cargo bench --profile dev --bench sql` for a
//! quick look (DataFusion is far slower unoptimised, so only release ratios count).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulpitum::archive::{ArchiveStore, FaultLayer, FaultPlan, PayloadFormat};
use pulpitum::model::{
    BucketId, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use pulpitum::provider::surface::encode_i64;
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::postgres::PgStore;
use pulpitum::store::HotStore;

const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const DAY: i64 = 86_400_000_000;

fn record(channel: i64, micros: i64, id: i64) -> Record {
    Record {
        partition_key: PartitionKey::new(encode_i64(channel).to_vec()).unwrap(),
        event_time: EventTime::from_micros(micros).unwrap(),
        sort_key: SortKey::new(encode_i64(id).to_vec()).unwrap(),
        value: format!("message {id} with a body of ordinary length for a chat line").into_bytes(),
    }
}

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

async fn time_it<F, Fut>(n: usize, mut f: F) -> (Duration, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..n / 10 {
        f().await;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        v.push(t.elapsed());
    }
    percentiles(v)
}

async fn archive_bucket(store: &PgStore, archive: &ArchiveStore, bucket: &BucketId) {
    let lease = Duration::from_secs(300);
    let claim = store.claim(bucket, lease).await.unwrap().unwrap();
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .snapshot_page(&claim, after.as_ref(), 1000)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.clustering_key());
        pages.push(Ok(page));
    }
    let written = archive
        .write_bucket(
            bucket,
            claim.generation,
            PayloadFormat::Parquet,
            futures::stream::iter(pages),
        )
        .await
        .unwrap();
    store
        .publish_archive(&claim, &written.manifest_key)
        .await
        .unwrap();
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let schema = format!("bench_sql_{}", rand::random::<u32>());
    let store = Arc::new(PgStore::connect_with_schema(PG_URL, &schema).await.unwrap());
    let counter = FaultLayer::new(FaultPlan::new(1));
    let op = opendal::Operator::new(opendal::services::Memory::default())
        .unwrap()
        .layer(counter.clone());
    let archive = Arc::new(ArchiveStore::from_operator(op, "bench"));
    let ctx = session(
        store.clone() as Arc<dyn HotStore>,
        archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    ctx.sql("CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('bucket_strategy' 'calendar_day_utc')")
        .await
        .unwrap();
    let table = TableId::new("chat").unwrap();
    let day0 = EventTime::parse_rfc3339("2025-03-01T00:00:00Z")
        .unwrap()
        .as_micros();
    // Channel 1: 2,000 messages in one hot day. Channel 2: the same in a day to archive.
    for ch in [1i64, 2] {
        let recs: Vec<Record> = (0..2000)
            .map(|i| record(ch, day0 + i * 30_000_000, i))
            .collect();
        for c in recs.chunks(500) {
            store.append_batch(&table, c).await.unwrap();
        }
    }
    let archived = BucketId {
        table_id: table.clone(),
        partition_key: PartitionKey::new(encode_i64(2).to_vec()).unwrap(),
        bucket_key: BucketStrategy::CalendarDayUtc.bucket_of(EventTime::from_micros(day0).unwrap()),
    };
    archive_bucket(&store, &archive, &archived).await;

    let n = 300;
    let sql = |ch: i64| {
        format!(
            "SELECT * FROM chat WHERE channel_id = {ch} ORDER BY timestamp DESC, id DESC LIMIT 50"
        )
    };
    let q1 = sql(1);
    let (sql_p50, sql_p99) = time_it(n, || async {
        let b = ctx.sql(&q1).await.unwrap().collect().await.unwrap();
        assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 50);
    })
    .await;

    let client = store.raw_client().await.unwrap();
    let stmt = client
        .prepare(
            "SELECT event_time, sort_key, value FROM pulpitum_v4_records \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
             ORDER BY event_time DESC, sort_key DESC LIMIT 50",
        )
        .await
        .unwrap();
    let pk = encode_i64(1).to_vec();
    let bk = archived.bucket_key.to_string();
    let (pg_p50, pg_p99) = time_it(n, || async {
        let rows = client.query(&stmt, &[&"chat", &pk, &bk]).await.unwrap();
        assert_eq!(rows.len(), 50);
    })
    .await;

    let q2 = sql(2);
    let before = counter.stats();
    let (arc_p50, arc_p99) = time_it(n, || async {
        let b = ctx.sql(&q2).await.unwrap().collect().await.unwrap();
        assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 50);
    })
    .await;
    let after = counter.stats();
    let runs = (n + n / 10) as f64;
    let per_query: Vec<f64> = before
        .calls
        .iter()
        .zip(after.calls.iter())
        .map(|(a, b)| (b - a) as f64 / runs)
        .collect();

    // 10,000 buckets: 10 channels x 1,000 days, one message each.
    ctx.sql("CREATE EXTERNAL TABLE big STORED AS PULPITUM LOCATION '' OPTIONS ('bucket_strategy' 'calendar_day_utc')")
        .await
        .unwrap();
    let big = TableId::new("big").unwrap();
    let recs: Vec<Record> = (0..10_000i64)
        .map(|i| record(i % 10, day0 - (i / 10) * DAY + 1_000, i))
        .collect();
    for c in recs.chunks(500) {
        store.append_batch(&big, c).await.unwrap();
    }
    let ctx2 = session(
        store.clone() as Arc<dyn HotStore>,
        archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    let one_day = format!(
        "SELECT * FROM big WHERE channel_id = 3 AND timestamp >= to_timestamp_micros({}) AND timestamp < to_timestamp_micros({})",
        day0 - 500 * DAY,
        day0 - 499 * DAY
    );
    let (plan_p50, plan_p99) = time_it(n, || async {
        let df = ctx2.sql(&one_day).await.unwrap();
        df.create_physical_plan().await.unwrap();
    })
    .await;

    println!("latest 50 from a hot bucket: SQL p50 {sql_p50:?} p99 {sql_p99:?}; direct prepared query p50 {pg_p50:?} p99 {pg_p99:?}; ratio p50 {:.2}x",
        sql_p50.as_secs_f64() / pg_p50.as_secs_f64());
    println!("latest 50 from an archived bucket: p50 {arc_p50:?} p99 {arc_p99:?}; object-store calls per query [write, read, stat, list, delete] = {per_query:?}");
    println!("planning a one-day query on a table with 10,000 buckets: p50 {plan_p50:?} p99 {plan_p99:?}");
    store.drop_schema().await.unwrap();
}
