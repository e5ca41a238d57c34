//! Registry scale harness (issue 32, docs/registry-scale.md and docs/sizing.md): fills a
//! PostgreSQL registry with N partitions x D day buckets in every state, then times the
//! store statements whose cost should follow the work, not the registry, and reports each
//! as a ratio to the smallest registry of the same run.
//!
//! The registry is filled by one parameterised `INSERT ... SELECT` per size (no objects: the
//! statements measured here read the registry only). Days, oldest first:
//! - before the last 30: archived and cleaned, routed to a month segment (16,384 partitions
//!   per segment manifest key), as compaction leaves them;
//! - then up to the day before yesterday: archived and cleaned, per-bucket routes;
//! - the day before yesterday: 1% Hot (archive work once the cutoff passes it), 0.1% in an
//!   Archiving claim, 1% published and awaiting cleanup, the rest archived and cleaned;
//! - yesterday: Hot.
//!
//! Measured per size, `SCALE_BENCH_ROUNDS` rounds each (p50 and p99):
//! - `head`: the latest-page head read of one partition (the registry part of the hot page);
//! - `one channel 30 days`: the listing of one partition over 30 days;
//! - `one day, all channels`: the listing of one day across every partition (its answer
//!   is N buckets: reported per bucket listed as well);
//! - `month, all: one by one` and `month, all: segment routes`: four weeks of compacted
//!   history across every partition, listed a row per (partition, day) and through the
//!   segment routes (a row per segment, its routed buckets counted by the database);
//! - `one day, all: list_across`: the same day as `one day, all channels`, listed as a query
//!   across channels lists it (through `list_across`);
//! - the archiver's idle cycle reads: `discover` (cutoff before the due day, cleanups not yet
//!   due), `backlog`, `expired_buckets` (nothing expired), `archiving_claims`;
//! - `discover, 1% due`: discovery with the cutoff past the due day (a page of 64);
//! - `gc incremental (idle)`: an incremental GC pass with nothing noted or retired (an
//!   empty in-memory archive: its registry reads);
//! - `gc routes (full)`: the read of every route a full GC pass makes (one round: it grows
//!   with the registry, see docs/registry-scale.md);
//! - registry bytes per bucket (table and indexes).
//!
//! Then, in the same run, the indexes of migrations 26 and 27 are dropped and the idle cycle reads
//! are timed again: the before-and-after of that change on the same registry.
//!
//! Knobs: `SCALE_BENCH_N` (partition counts, default `1000,10000`; the sizes are
//! `1000,10000,100000`: 6 million buckets take about 4 minutes to fill here),
//! `SCALE_BENCH_DAYS` (60), `SCALE_BENCH_ROUNDS` (30), `SCALE_BENCH_KEEP=1` keeps the
//! schemas (`bench_scale_<n>`) for inspection.
//!
//! Run: `cargo bench --profile dev-bench --bench scale`; the statements run in PostgreSQL,
//! so the dev build `cargo test --all-targets --no-run` leaves in `target/debug/deps/scale-*`
//! measures the same.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulpitum::archive::ArchiveStore;
use pulpitum::archiver::{collect_garbage_incremental, ArchiverMetrics, GcDelays};
use pulpitum::model::{encode_i64, BucketStrategy, EventTime, PartitionKey, ScanBounds, TableId};
use pulpitum::store::postgres::PgStore;
use pulpitum::store::{
    BucketFilter, Catalog, Changes, Eligibility, Lifecycle, PageRequest, RoutedReads,
    TableDefinition,
};

const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const DAY: i64 = 86_400_000_000;

/// Fills the registry of table `chat`: `$1` partitions, `$2` days ending with `$3` (the
/// start of yesterday). Partition keys are `encode_i64(p)`, as the chat surface writes them.
const FILL: &str = "INSERT INTO pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_key, \
       bucket_strategy, bucket_start, bucket_end, state, owner_token, generation, \
       lease_expires_at, object_key, hot_deleted, published_at) \
     SELECT 'chat', int8send(p # (-9223372036854775807 - 1)), \
       'day:' || to_char(d AT TIME ZONE 'UTC', 'YYYY-MM-DD'), 'calendar_day_utc', \
       d, d + INTERVAL '1 day', \
       CASE WHEN d = $3::TIMESTAMPTZ THEN 'hot' \
            WHEN d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND p % 100 = 0 THEN 'hot' \
            WHEN d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND p % 1000 = 1 THEN 'archiving' \
            ELSE 'archived' END, \
       CASE WHEN d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND p % 1000 = 1 THEN 'bench-owner' END, \
       CASE WHEN d = $3::TIMESTAMPTZ OR (d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND p % 100 = 0) THEN 0 ELSE 1 END, \
       CASE WHEN d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND p % 1000 = 1 THEN now() + INTERVAL '1 day' END, \
       CASE WHEN d = $3::TIMESTAMPTZ OR (d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND (p % 100 = 0 OR p % 1000 = 1)) THEN NULL \
            WHEN d < $3::TIMESTAMPTZ - INTERVAL '30 days' THEN 'bench/v4/chat/segments/month:' \
              || to_char(d AT TIME ZONE 'UTC', 'YYYY-MM') || '/s' || lpad((p / 16384)::TEXT, 5, '0') \
              || '-g1/manifest.json' \
            ELSE 'bench/v4/chat/' || encode(int8send(p # (-9223372036854775807 - 1)), 'hex') \
              || '/day:' || to_char(d AT TIME ZONE 'UTC', 'YYYY-MM-DD') || '/g1/manifest.json' END, \
       NOT (d = $3::TIMESTAMPTZ OR (d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND (p % 100 = 0 OR p % 1000 = 1 OR p % 100 = 50))), \
       CASE WHEN d = $3::TIMESTAMPTZ OR (d = $3::TIMESTAMPTZ - INTERVAL '1 day' AND (p % 100 = 0 OR p % 1000 = 1)) THEN NULL \
            ELSE now() END \
     FROM generate_series(0::INT8, $1::INT8 - 1) AS p \
     CROSS JOIN generate_series($3::TIMESTAMPTZ - ($2::INT8 - 1) * INTERVAL '1 day', $3::TIMESTAMPTZ, INTERVAL '1 day') AS d \
     ORDER BY p, d";

fn env_list(name: &str, default: &str) -> Vec<i64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("a comma-separated list of integers")
        })
        .collect()
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

async fn time_it<F, Fut>(n: usize, mut f: F) -> (Duration, Duration)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f(0).await;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        f(i).await;
        v.push(t.elapsed());
    }
    percentiles(v)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One segment route per segment key of the fill, with its count (migration 29's table).
const SEGMENT_ROUTES: &str = "INSERT INTO pulpitum_v4_segment_routes \
       (table_id, object_key, window_start, window_end, buckets) \
     SELECT table_id, object_key, min(bucket_start), max(bucket_end), count(*) \
     FROM pulpitum_v4_bucket_metadata \
     WHERE object_key LIKE '%/segments/%/s_____-g%/manifest.json' \
     GROUP BY table_id, object_key";

struct Registry {
    n: i64,
    store: Arc<PgStore>,
    bytes_per_bucket: f64,
    fill: Duration,
}

async fn fill(n: i64, days: i64, yesterday: EventTime) -> Registry {
    let schema = format!("bench_scale_{n}");
    let admin = PgStore::connect_with_schema(PG_URL, &schema).await.unwrap();
    // A schema left by a kept earlier run is replaced.
    admin.drop_schema().await.unwrap();
    let store = Arc::new(PgStore::connect_with_schema(PG_URL, &schema).await.unwrap());
    store.migrate().await.unwrap();
    store
        .register_table(&TableDefinition::new(
            TableId::new("chat").unwrap(),
            BucketStrategy::CalendarDayUtc,
            "chat",
        ))
        .await
        .unwrap();
    let client = store.raw_client().await.unwrap();
    // The store's sessions bound statements (30 s); a fill of millions of rows takes longer.
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .unwrap();
    let started = Instant::now();
    client
        .execute(FILL, &[&n, &days, &yesterday.to_datetime()])
        .await
        .unwrap();
    // The segments' routes, as the switches that made them record them (each with its
    // manifest's bucket count: every bucket of the fill's segments is routed to it).
    client.execute(SEGMENT_ROUTES, &[]).await.unwrap();
    // One statement per call: several in one text run as one transaction, where VACUUM
    // is refused.
    for table in ["pulpitum_v4_bucket_metadata", "pulpitum_v4_segment_routes"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .unwrap();
    }
    let fill = started.elapsed();
    let row = client
        .query_one(
            "SELECT pg_total_relation_size('pulpitum_v4_bucket_metadata')::FLOAT8 \
               / GREATEST(count(*), 1) FROM pulpitum_v4_bucket_metadata",
            &[],
        )
        .await
        .unwrap();
    Registry {
        n,
        store,
        bytes_per_bucket: row.get(0),
        fill,
    }
}

type Figures = Vec<(&'static str, (Duration, Duration))>;

async fn measure(
    r: &Registry,
    rounds: usize,
    days: i64,
    yesterday: EventTime,
    full_gc: bool,
) -> Figures {
    let store = &r.store;
    let table = TableId::new("chat").unwrap();
    let due_day = EventTime::from_micros(yesterday.as_micros() - DAY).unwrap();
    // As an archiver without `ARCHIVER_ELIGIBLE_BEFORE` runs (the default): no ceiling.
    let idle = Eligibility {
        cutoff: due_day,
        ceiling: false,
    };
    let due = Eligibility {
        cutoff: yesterday,
        ceiling: false,
    };
    let hour = Duration::from_secs(3600);
    let partition = |i: usize| {
        // Spread over the registry, never the same twice in a row.
        let p = (i as i64 * 7_919) % r.n;
        PartitionKey::new(encode_i64(p).to_vec()).unwrap()
    };
    let mut out: Figures = Vec::new();
    let page = PageRequest {
        bounds: ScanBounds::all(),
        descending: true,
        limit: 50,
        include_value: true,
    };
    out.push((
        "head",
        time_it(rounds, |i| {
            let (t, p, page) = (&table, partition(i), &page);
            async move {
                store
                    .read_head(t, &p, None, Some(yesterday), page)
                    .await
                    .unwrap();
            }
        })
        .await,
    ));
    out.push((
        "one channel 30 days",
        time_it(rounds, |i| {
            let f = BucketFilter {
                partitions: Some(vec![partition(i)]),
                from: Some(EventTime::from_micros(yesterday.as_micros() - 30 * DAY).unwrap()),
                to: Some(yesterday),
                ..BucketFilter::default()
            };
            let t = &table;
            async move {
                assert_eq!(store.list_buckets(t, &f).await.unwrap().len(), 31);
            }
        })
        .await,
    ));
    let one_day = BucketFilter {
        from: Some(EventTime::from_micros(yesterday.as_micros() - 10 * DAY).unwrap()),
        to: Some(EventTime::from_micros(yesterday.as_micros() - 9 * DAY - 1).unwrap()),
        ..BucketFilter::default()
    };
    out.push((
        "one day, all channels",
        time_it(rounds.min(10), |_| async {
            let listed = store.list_buckets(&table, &one_day).await.unwrap();
            assert_eq!(listed.len() as i64, r.n);
        })
        .await,
    ));
    // Four weeks wholly inside the compacted history, across every partition: listed one
    // row per (partition, day) as before segment routes, and through them (a row per
    // segment; the buckets routed to each counted by the database).
    let month = (
        EventTime::from_micros(yesterday.as_micros() - 59.min(days - 1) * DAY).unwrap(),
        EventTime::from_micros(yesterday.as_micros() - 31 * DAY - 1).unwrap(),
    );
    let month_buckets = (month.1.as_micros() + 1 - month.0.as_micros()) / DAY * r.n;
    let month_filter = BucketFilter {
        from: Some(month.0),
        to: Some(month.1),
        ..BucketFilter::default()
    };
    out.push((
        "month, all: one by one",
        time_it(rounds.min(3), |_| async {
            let listed = store.list_buckets(&table, &month_filter).await.unwrap();
            assert_eq!(listed.len() as i64, month_buckets);
        })
        .await,
    ));
    out.push((
        "month, all: segment routes",
        time_it(rounds, |_| async {
            let listed = store
                .list_across(&table, month.0, month.1)
                .await
                .unwrap()
                .unwrap();
            assert!(
                listed.buckets.is_empty(),
                "{} buckets",
                listed.buckets.len()
            );
            let held: u64 = listed.segments.iter().map(|(_, n)| n).sum();
            assert!(held as i64 >= month_buckets, "{held} < {month_buckets}");
        })
        .await,
    ));
    // The same day (per-bucket routes, ten days back) through `list_across`, as a query
    // across channels now lists it: the buckets outside segments by the partial index,
    // bounded above by the grid.
    out.push((
        "one day, all: list_across",
        time_it(rounds.min(10), |_| async {
            let (from, to) = (one_day.from.unwrap(), one_day.to.unwrap());
            let listed = store.list_across(&table, from, to).await.unwrap().unwrap();
            assert_eq!(listed.buckets.len() as i64, r.n);
        })
        .await,
    ));
    out.extend(idle_cycle(store, &table, &idle, hour, rounds).await);
    out.push((
        "discover, 1% due",
        time_it(rounds, |_| async {
            let w = store.discover_ready(&due, 64, hour).await.unwrap();
            assert_eq!(w.len(), (r.n as usize / 100).min(64));
        })
        .await,
    ));
    // An incremental GC pass with nothing noted and nothing retired: what an idle archiver
    // pays every ten minutes between its daily full passes (the archive is empty; the
    // registry reads are the point).
    let archive = ArchiveStore::from_operator(
        opendal::Operator::new(opendal::services::Memory::default()).unwrap(),
        "bench",
    );
    let delays = GcDelays {
        orphans: hour,
        retired: hour,
        erased: hour,
    };
    let metrics = ArchiverMetrics::default();
    out.push((
        "gc incremental (idle)",
        time_it(rounds, |_| async {
            let r = collect_garbage_incremental(&**store, &archive, delays, &metrics)
                .await
                .unwrap();
            assert_eq!(r.listed, 0);
        })
        .await,
    ));
    if full_gc {
        out.push((
            "gc routes (full)",
            time_it(1, |_| async {
                store.referenced_object_keys().await.unwrap();
            })
            .await,
        ));
    }
    out
}

/// The reads of an archiver cycle with nothing to do.
async fn idle_cycle(
    store: &PgStore,
    table: &TableId,
    idle: &Eligibility,
    hour: Duration,
    rounds: usize,
) -> Figures {
    let first = EventTime::from_micros(0).unwrap();
    vec![
        (
            "idle: discover",
            time_it(rounds, |_| async {
                assert!(store
                    .discover_ready(idle, 64, hour)
                    .await
                    .unwrap()
                    .is_empty());
            })
            .await,
        ),
        (
            "idle: backlog",
            time_it(rounds, |_| async {
                assert_eq!(store.backlog(idle).await.unwrap().eligible, 0);
            })
            .await,
        ),
        (
            "idle: expired_buckets",
            time_it(rounds, |_| async {
                assert!(store
                    .expired_buckets(table, first, 64)
                    .await
                    .unwrap()
                    .is_empty());
            })
            .await,
        ),
        (
            "idle: archiving_claims",
            time_it(rounds, |_| async {
                store.archiving_claims().await.unwrap();
            })
            .await,
        ),
    ]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let sizes = env_list("SCALE_BENCH_N", "1000,10000");
    let days = env_num("SCALE_BENCH_DAYS", 60) as i64;
    let rounds = env_num("SCALE_BENCH_ROUNDS", 30);
    let keep = std::env::var("SCALE_BENCH_KEEP").is_ok();
    assert!(
        days > 32,
        "SCALE_BENCH_DAYS must exceed 32 (segments, then 30 days)"
    );
    let now = EventTime::from_micros(chrono::Utc::now().timestamp_micros()).unwrap();
    let today = BucketStrategy::CalendarDayUtc.bucket_of(now).start();
    let yesterday = EventTime::from_micros(today.as_micros() - DAY).unwrap();

    let mut registries = Vec::new();
    for &n in &sizes {
        let r = fill(n, days, yesterday).await;
        println!(
            "filled {n} partitions x {days} days = {} buckets in {:.1} s; {:.0} bytes per bucket",
            n * days,
            r.fill.as_secs_f64(),
            r.bytes_per_bucket
        );
        registries.push(r);
    }
    let mut results: Vec<Figures> = Vec::new();
    for r in &registries {
        results.push(measure(r, rounds, days, yesterday, true).await);
    }
    // The same idle reads without the indexes of migrations 26 and 27 (the state before it).
    let mut without: Vec<Figures> = Vec::new();
    for r in &registries {
        let client = r.store.raw_client().await.unwrap();
        client
            .batch_execute(
                "DROP INDEX pulpitum_v4_bucket_metadata_cleanup; \
                 DROP INDEX pulpitum_v4_bucket_metadata_by_end; \
                 ANALYZE pulpitum_v4_bucket_metadata",
            )
            .await
            .unwrap();
        let table = TableId::new("chat").unwrap();
        let idle = Eligibility {
            cutoff: EventTime::from_micros(yesterday.as_micros() - DAY).unwrap(),
            ceiling: false,
        };
        without.push(idle_cycle(&r.store, &table, &idle, Duration::from_secs(3600), rounds).await);
    }

    println!(
        "\n{:<26} {}",
        "p50 ms (p99) [x smallest]",
        sizes
            .iter()
            .map(|n| format!("{:>28}", format!("N={n}")))
            .collect::<String>()
    );
    let line = |name: &str, all: &[Figures]| {
        let base = all[0].iter().find(|(k, _)| *k == name).map(|(_, v)| v.0);
        let cells: String = all
            .iter()
            .map(|f| {
                let (p50, p99) = f.iter().find(|(k, _)| *k == name).unwrap().1;
                let ratio = base.map_or(1.0, |b| p50.as_secs_f64() / b.as_secs_f64());
                format!(
                    "{:>28}",
                    format!("{:.3} ({:.3}) [{ratio:.2}x]", ms(p50), ms(p99))
                )
            })
            .collect();
        println!("{name:<26} {cells}");
    };
    for (name, _) in &results[0] {
        line(name, &results);
    }
    println!("without migrations 26 and 27:");
    for (name, _) in &without[0] {
        line(name, &without);
    }
    println!(
        "bytes per bucket: {}",
        registries
            .iter()
            .map(|r| format!("N={}: {:.0}", r.n, r.bytes_per_bucket))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !keep {
        for r in &registries {
            r.store.drop_schema().await.unwrap();
        }
    }
}
