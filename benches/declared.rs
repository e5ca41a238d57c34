//! A declared table's columnar archive against the chat surface, in the same run (a plain
//! harness, `harness = false`).
//!
//! The same messages are stored twice: in `chat` (the value is the message body, one opaque
//! binary column in the archive) and in a declared table `messages (channel_id, ts, id,
//! author BIGINT, score DOUBLE PRECISION, content TEXT)` whose archive writes each value
//! column as a typed Parquet column. Every bucket of both is archived to per-bucket Parquet
//! on the local filesystem (embedded hot store). Then, best of 5 warm runs each, with the
//! bytes the scan fetched from the archive (`archived_object_bytes`):
//!
//! 1. the aggregate over the message body on chat today: `sum(length(content))`;
//! 2. the same aggregate on the declared table (the body is its own column);
//! 3. an aggregate over one small value column of the declared table: `sum(score)`, which
//!    reads that column only;
//! 4. a selective predicate on a value column, `count(*) WHERE author = 7`, which skips
//!    row groups and pages from statistics (authors are written in runs) and rows before
//!    the body is decoded; chat cannot express it without decoding every body.
//!
//! Both with day buckets (small objects, one verification block each: what a column not
//! read saves is decoding) and month buckets (objects of several blocks: also bytes not
//! fetched). Ratios are declared / chat. Run: `cargo bench --profile dev-bench --bench
//! declared`; env `PULPITUM_BENCH_ROWS_PER_DAY` (2000), `PULPITUM_BENCH_CHANNELS` (10),
//! `PULPITUM_BENCH_DAYS` (60).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int64Array, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion::prelude::SessionContext;
use pulpitum::archive::{ArchiveStore, PayloadFormat};
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::EventTime;
use pulpitum::session::{session, SessionOptions};
use tokio_util::sync::CancellationToken;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const START_US: i64 = 1_735_689_600_000_000; // 2025-01-01T00:00:00Z
const DAY_US: i64 = 86_400_000_000;

/// A message body of 60 to 260 characters that compresses like text.
fn body(i: usize) -> String {
    const WORDS: [&str; 12] = [
        "lunch", "deploy", "review", "meeting", "coffee", "ticket", "release", "merge", "standup",
        "rollback", "customer", "incident",
    ];
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut s = String::new();
    let n = 10 + (x % 40) as usize;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % 12) as usize]);
        s.push(' ');
    }
    s
}

struct Rows {
    channel: Vec<i64>,
    ts: Vec<i64>,
    id: Vec<i64>,
    author: Vec<i64>,
    score: Vec<f64>,
    content: Vec<String>,
}

fn generate(channels: usize, days: usize, per_day: usize) -> Rows {
    let mut r = Rows {
        channel: Vec::new(),
        ts: Vec::new(),
        id: Vec::new(),
        author: Vec::new(),
        score: Vec::new(),
        content: Vec::new(),
    };
    let mut i = 0usize;
    for c in 0..channels {
        for d in 0..days {
            for m in 0..per_day {
                r.channel.push(c as i64);
                r.ts.push(START_US + d as i64 * DAY_US + m as i64 * (DAY_US / per_day as i64));
                r.id.push(i as i64);
                // Authors in runs of 500 messages: what statistics can skip.
                r.author.push(((i / 500) % 50) as i64);
                r.score.push((i % 1000) as f64 / 10.0);
                r.content.push(body(i));
                i += 1;
            }
        }
    }
    r
}

fn ts_array(v: &[i64]) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from(v.to_vec()).with_timezone("UTC"))
}

async fn load(ctx: &SessionContext, table: &str, b: RecordBatch) {
    let names: Vec<String> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mem = MemTable::try_new(b.schema(), vec![vec![b]]).unwrap();
    let _ = ctx.deregister_table("src");
    ctx.register_table("src", Arc::new(mem)).unwrap();
    pulpitum::control::sql(
        ctx,
        &format!(
            "INSERT INTO {table} ({}) SELECT * FROM src",
            names.join(", ")
        ),
    )
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
}

fn sum_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let own = plan
        .metrics()
        .and_then(|m| m.sum_by_name(name))
        .map_or(0, |v| v.as_usize());
    own + plan
        .children()
        .into_iter()
        .map(|c| sum_metric(c, name))
        .sum::<usize>()
}

/// Best of `rounds` warm runs (after one warm-up), the bytes fetched in the last, and the
/// first column of the answer as text.
async fn measure(ctx: &SessionContext, sql: &str, rounds: usize) -> (Duration, usize, String) {
    let mut best = Duration::MAX;
    let mut bytes = 0;
    let mut answer = String::new();
    for round in 0..=rounds {
        let df = ctx.sql(sql).await.unwrap();
        let t = Instant::now();
        let plan = df.create_physical_plan().await.unwrap();
        let out = collect(plan.clone(), ctx.task_ctx()).await.unwrap();
        let took = t.elapsed();
        if round > 0 {
            best = best.min(took);
        }
        bytes = sum_metric(&plan, "archived_object_bytes");
        answer = datafusion::arrow::util::pretty::pretty_format_batches(&out)
            .unwrap()
            .to_string();
    }
    (best, bytes, answer)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let channels = env("PULPITUM_BENCH_CHANNELS", 10);
    let days = env("PULPITUM_BENCH_DAYS", 60);
    let per_day = env("PULPITUM_BENCH_ROWS_PER_DAY", 2000);
    rt.block_on(async {
        // Small objects (a day of a channel: one verification block each) and large ones (a
        // month: several blocks, so a column not read is bytes not fetched).
        case("calendar_day_utc", channels, days, per_day).await;
        case("calendar_month_utc", channels, days, per_day).await;
    });
}

async fn case(strategy: &str, channels: usize, days: usize, per_day: usize) {
    {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("hot.sqlite3").display());
        let url = format!("file://{}", dir.path().join("archive").display());
        std::fs::create_dir_all(dir.path().join("archive")).unwrap();
        let store = pulpitum::store::open(&db).await.unwrap();
        store.migrate().await.unwrap();
        let archive = Arc::new(ArchiveStore::from_url(&url).unwrap());
        let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
            .await
            .unwrap();
        for ddl in [
            format!(
                "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
                 OPTIONS ('surface' 'chat', 'bucket_strategy' '{strategy}')"
            ),
            format!(
                "CREATE EXTERNAL TABLE messages (channel_id BIGINT NOT NULL, \
                 ts TIMESTAMPTZ NOT NULL, id BIGINT NOT NULL, author BIGINT, \
                 score DOUBLE PRECISION, content TEXT) STORED AS PULPITUM LOCATION '' \
                 OPTIONS ('partition_by' 'channel_id', 'time' 'ts', 'order_by' 'id', \
                 'bucket_strategy' '{strategy}')"
            ),
        ] {
            pulpitum::control::sql(&ctx, &ddl)
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
        }
        let t = Instant::now();
        let rows = generate(channels, days, per_day);
        let n = rows.id.len();
        // In slices, so no one INSERT holds everything twice.
        let step = 50_000;
        for start in (0..n).step_by(step) {
            let end = (start + step).min(n);
            let ts = ts_array(&rows.ts[start..end]);
            let content: ArrayRef = Arc::new(StringArray::from(rows.content[start..end].to_vec()));
            let channel: ArrayRef = Arc::new(Int64Array::from(rows.channel[start..end].to_vec()));
            let id: ArrayRef = Arc::new(Int64Array::from(rows.id[start..end].to_vec()));
            let chat_schema = Arc::new(Schema::new(vec![
                Field::new("channel_id", DataType::Int64, false),
                Field::new(
                    "timestamp",
                    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                    false,
                ),
                Field::new("id", DataType::Int64, false),
                Field::new("content", DataType::Utf8, false),
            ]));
            let chat = RecordBatch::try_new(
                chat_schema,
                vec![channel.clone(), ts.clone(), id.clone(), content.clone()],
            )
            .unwrap();
            load(&ctx, "chat", chat).await;
            let msg_schema = Arc::new(Schema::new(vec![
                Field::new("channel_id", DataType::Int64, false),
                Field::new(
                    "ts",
                    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                    false,
                ),
                Field::new("id", DataType::Int64, false),
                Field::new("author", DataType::Int64, true),
                Field::new("score", DataType::Float64, true),
                Field::new("content", DataType::Utf8, true),
            ]));
            let msg = RecordBatch::try_new(
                msg_schema,
                vec![
                    channel,
                    ts,
                    id,
                    Arc::new(Int64Array::from(rows.author[start..end].to_vec())),
                    Arc::new(Float64Array::from(rows.score[start..end].to_vec())),
                    content,
                ],
            )
            .unwrap();
            load(&ctx, "messages", msg).await;
        }
        eprintln!(
            "loaded {n} messages twice in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let t = Instant::now();
        let mut c = ArchiverConfig::with_defaults();
        c.eligible_before =
            Some(EventTime::from_micros(START_US + (days as i64 + 1) * DAY_US).unwrap());
        c.cleanup_delay = Duration::ZERO;
        c.format = PayloadFormat::Parquet;
        c.compaction = false;
        let runner = Runner::new(store.clone(), archive.clone(), c).unwrap();
        runner
            .drain(&CancellationToken::new(), &|_, _| {})
            .await
            .unwrap();
        let buckets = store
            .list_buckets(
                &pulpitum::model::TableId::new("messages").unwrap(),
                &pulpitum::store::BucketFilter::default(),
            )
            .await
            .unwrap()
            .len();
        eprintln!(
            "archived {} buckets in {:.1} s",
            buckets * 2,
            t.elapsed().as_secs_f64()
        );
        let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
            .await
            .unwrap();
        let rounds = 5;
        let chat = measure(
            &ctx,
            "SELECT sum(length(content)) AS total FROM chat",
            rounds,
        )
        .await;
        let same = measure(
            &ctx,
            "SELECT sum(length(content)) AS total FROM messages",
            rounds,
        )
        .await;
        assert_eq!(chat.2, same.2, "the two tables hold the same bodies");
        let one = measure(&ctx, "SELECT sum(score) FROM messages", rounds).await;
        let sel = measure(
            &ctx,
            "SELECT count(*) FROM messages WHERE author = 7",
            rounds,
        )
        .await;
        let chat_sel = measure(
            &ctx,
            "SELECT count(*) FROM chat WHERE content LIKE 'lunch lunch%'",
            rounds,
        )
        .await;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        println!(
            "[{strategy}] {n} messages, {buckets} archived buckets per table, per-bucket \
             Parquet, best of {rounds}"
        );
        println!(
            "chat     sum(length(content))          {:8.1} ms {:8.2} MiB read (baseline)",
            ms(chat.0),
            mib(chat.1)
        );
        for (label, m) in [
            ("declared sum(length(content))", &same),
            ("declared sum(score)", &one),
            ("declared count(*) WHERE author = 7", &sel),
            ("chat     count(*) WHERE content LIKE", &chat_sel),
        ] {
            println!(
                "{label:<38} {:8.1} ms {:8.2} MiB read: {:.2}x the time, {:.2}x the bytes of the baseline",
                ms(m.0),
                mib(m.1),
                m.0.as_secs_f64() / chat.0.as_secs_f64(),
                m.1 as f64 / chat.1.max(1) as f64
            );
        }
    }
}
