//! Fenced appends against plain INSERTs of the same rows, in the same run.
//!
//! `fenced_single` is `PgStore::append` (one serializable transaction: ensure the bucket,
//! check the fence, insert-if-absent); `raw_single` is one autocommitted `INSERT` per row
//! into a plain table with the same columns and primary key. `fenced_batch_100` is
//! `append_batch` of 100 rows; `raw_batch_100` is one multi-row `INSERT` of 100 rows. The
//! ratios printed at the end are raw time / fenced time (1.0 = as fast as raw; targets:
//! single >= 0.7, batch >= 0.8). Without a reachable PostgreSQL the bench prints why and
//! exits cleanly. Server: `PULPITUM_TEST_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::Criterion;
use pulpitum::model::{BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::postgres::{PgStore, PgStoreConfig};
use pulpitum::store::{Appends, Catalog, TableDefinition};
use tokio::runtime::Runtime;

static SEQ: AtomicI64 = AtomicI64::new(0);

type Totals = Arc<Mutex<HashMap<&'static str, (Duration, u64)>>>;

fn next_record(partition: &PartitionKey) -> Record {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let base = EventTime::parse_rfc3339("2021-01-01T00:00:00Z")
        .unwrap()
        .as_micros();
    Record {
        partition_key: partition.clone(),
        event_time: EventTime::from_micros(base + n).unwrap(),
        sort_key: SortKey::new(n.to_be_bytes().to_vec()).unwrap(),
        value: vec![b'x'; 100],
    }
}

fn record(totals: &Totals, name: &'static str, elapsed: Duration, iters: u64) {
    let mut t = totals.lock().unwrap();
    let e = t.entry(name).or_default();
    e.0 += elapsed;
    e.1 += iters;
}

const RAW_COLUMNS: &str = "(table_id, partition_key, bucket_key, event_time, sort_key, value)";

fn raw_batch_sql(n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let b = i * 6;
            format!(
                "(${}, ${}, ${}, ${}, ${}, ${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6
            )
        })
        .collect();
    format!(
        "INSERT INTO raw_records {RAW_COLUMNS} VALUES {}",
        rows.join(", ")
    )
}

const WORKLOADS: [&str; 4] = [
    "fenced_single",
    "raw_single",
    "fenced_batch_100",
    "raw_batch_100",
];

struct Workloads {
    store: Arc<PgStore>,
    table: TableId,
    partition: PartitionKey,
}

impl Workloads {
    /// Runs `iters` operations of the named workload; returns the time spent in them.
    async fn run(&self, name: &str, iters: u64) -> Duration {
        let (table, partition) = (&self.table, &self.partition);
        match name {
            "fenced_single" => {
                let start = Instant::now();
                for _ in 0..iters {
                    self.store
                        .append(table, &next_record(partition))
                        .await
                        .unwrap();
                }
                start.elapsed()
            }
            "raw_single" => {
                let client = self.store.raw_client().await.unwrap();
                let stmt = client
                    .prepare_cached(&format!(
                        "INSERT INTO raw_records {RAW_COLUMNS} VALUES ($1, $2, $3, $4, $5, $6)"
                    ))
                    .await
                    .unwrap();
                let start = Instant::now();
                for _ in 0..iters {
                    let r = next_record(partition);
                    client
                        .execute(
                            &stmt,
                            &[
                                &table.as_str(),
                                &r.partition_key.as_bytes(),
                                &"year:2021",
                                &r.event_time.to_datetime(),
                                &r.sort_key.as_bytes(),
                                &r.value,
                            ],
                        )
                        .await
                        .unwrap();
                }
                start.elapsed()
            }
            "fenced_batch_100" => {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let batch: Vec<Record> = (0..100).map(|_| next_record(partition)).collect();
                    let start = Instant::now();
                    self.store.append_batch(table, &batch).await.unwrap();
                    total += start.elapsed();
                }
                total
            }
            "raw_batch_100" => {
                let client = self.store.raw_client().await.unwrap();
                let stmt = client.prepare_cached(&raw_batch_sql(100)).await.unwrap();
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let batch: Vec<Record> = (0..100).map(|_| next_record(partition)).collect();
                    let start = Instant::now();
                    // Building the parameters is part of a raw INSERT's cost, as the
                    // store's own array building is part of append_batch.
                    let times: Vec<_> = batch.iter().map(|r| r.event_time.to_datetime()).collect();
                    let pks: Vec<&[u8]> =
                        batch.iter().map(|r| r.partition_key.as_bytes()).collect();
                    let sorts: Vec<&[u8]> = batch.iter().map(|r| r.sort_key.as_bytes()).collect();
                    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
                    let table_id = table.as_str();
                    let bucket = "year:2021";
                    for (i, r) in batch.iter().enumerate() {
                        params.push(&table_id);
                        params.push(&pks[i]);
                        params.push(&bucket);
                        params.push(&times[i]);
                        params.push(&sorts[i]);
                        params.push(&r.value);
                    }
                    client.execute(&stmt, &params).await.unwrap();
                    total += start.elapsed();
                }
                total
            }
            other => unreachable!("unknown workload {other}"),
        }
    }
}

fn report(title: &str, totals: &Totals) {
    let t = totals.lock().unwrap();
    let mean = |name: &str| {
        t.get(name)
            .map(|(d, n)| d.as_secs_f64() / (*n).max(1) as f64)
    };
    println!("\n{title}:");
    for (fenced, raw, target) in [
        ("fenced_single", "raw_single", 0.7),
        ("fenced_batch_100", "raw_batch_100", 0.8),
    ] {
        if let (Some(f), Some(r)) = (mean(fenced), mean(raw)) {
            let ratio = r / f;
            println!(
                "  {fenced}: {:.1} us/op, {raw}: {:.1} us/op, ratio raw/fenced = {ratio:.2} (target >= {target}) {}",
                f * 1e6,
                r * 1e6,
                if ratio >= target { "MET" } else { "MISSED" }
            );
        }
    }
}

fn main() {
    let rt = Runtime::new().expect("tokio runtime");
    let url = std::env::var("PULPITUM_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let schema = format!("pulpitum_bench_{:08x}", rand::random::<u32>());
    let store = match rt.block_on(PgStore::connect_with(
        PgStoreConfig::new(&url)
            .with_schema(&schema)
            .with_pool_size(2),
    )) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("append bench skipped: PostgreSQL at {url} is unreachable ({e})");
            return;
        }
    };
    let table = TableId::new("bench").unwrap();
    let partition = PartitionKey::new(b"channel".to_vec()).unwrap();
    rt.block_on(async {
        store.migrate().await.unwrap();
        store
            .register_table(&TableDefinition::new(table.clone(), BucketStrategy::CalendarYearUtc, "raw"))
            .await
            .unwrap();
        let client = store.raw_client().await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE raw_records (table_id TEXT NOT NULL, partition_key BYTEA NOT NULL, \
                 bucket_key TEXT NOT NULL, event_time TIMESTAMPTZ NOT NULL, sort_key BYTEA NOT NULL, \
                 value BYTEA NOT NULL, \
                 PRIMARY KEY (table_id, partition_key, bucket_key, event_time, sort_key))",
            )
            .await
            .unwrap();
        // Create the bucket once so both sides measure the steady state.
        store.append(&table, &next_record(&partition)).await.unwrap();
    });

    let w = Workloads {
        store: store.clone(),
        table: table.clone(),
        partition: partition.clone(),
    };
    let totals: Totals = Arc::default();
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let mut group = c.benchmark_group("append");
    for name in WORKLOADS {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let elapsed = rt.block_on(w.run(name, iters));
                record(&totals, name, elapsed, iters);
                elapsed
            })
        });
    }
    group.finish();
    report("criterion runs (one workload after the other)", &totals);

    // The machine is shared, so load drifts between the criterion phases above. The
    // interleaved pass runs fenced and raw in adjacent short slices and reports the median
    // of the per-round ratios, so each ratio compares the two under the same load.
    let interleaved: Totals = Arc::default();
    let mut single_ratios = Vec::new();
    let mut batch_ratios = Vec::new();
    rt.block_on(async {
        for round in 0..60u32 {
            for (fenced, raw, iters, ratios) in [
                ("fenced_single", "raw_single", 30, &mut single_ratios),
                ("fenced_batch_100", "raw_batch_100", 3, &mut batch_ratios),
            ] {
                // Alternate which side goes first.
                let order = if round % 2 == 0 {
                    [fenced, raw]
                } else {
                    [raw, fenced]
                };
                let mut times = HashMap::new();
                for name in order {
                    let elapsed = w.run(name, iters).await;
                    record(&interleaved, name, elapsed, iters);
                    times.insert(name, elapsed);
                }
                ratios.push(times[raw].as_secs_f64() / times[fenced].as_secs_f64());
            }
        }
    });
    report(
        "interleaved pass (60 rounds, mean of all slices)",
        &interleaved,
    );
    for (name, ratios, target) in [
        ("single", &mut single_ratios, 0.7),
        ("batch_100", &mut batch_ratios, 0.8),
    ] {
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        println!(
            "  median per-round ratio raw/fenced, {name}: {median:.2} (target >= {target}) {} [p25 {:.2}, p75 {:.2}]",
            if median >= target { "MET" } else { "MISSED" },
            ratios[ratios.len() / 4],
            ratios[ratios.len() * 3 / 4]
        );
    }
    rt.block_on(async {
        store.drop_schema().await.unwrap();
    });
}
