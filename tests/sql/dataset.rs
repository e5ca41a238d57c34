//! A generated chat dataset spread over every tier: several channels, two years of sparse
//! daily buckets, some archived as Parquet and some as JSON (through the store's claim,
//! snapshot, `ArchiveStore::write_bucket`, publish and cleanup steps), some left Archiving,
//! the rest Hot. The same rows are loaded into a plain PostgreSQL table `chat_ref` for
//! reference answers.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::stream;
use pulpitum::archive::PayloadFormat;
use pulpitum::model::encode_i64;
use pulpitum::model::{BucketId, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::{Appends, BucketFilter, BucketState, Lifecycle, RoutedReads};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::Env;

/// One generated message.
#[derive(Debug, Clone)]
pub struct Msg {
    pub channel: i64,
    pub micros: i64,
    pub id: i64,
    pub content: String,
}

/// What the loader produced.
#[derive(Debug, Default)]
pub struct Loaded {
    pub msgs: Vec<Msg>,
    pub channels: Vec<i64>,
    pub parquet: usize,
    pub json: usize,
    pub archiving: usize,
    pub hot: usize,
    /// Archived buckets whose hot rows were deleted by cleanup.
    pub cleaned: usize,
}

pub const CHANNELS: [i64; 4] = [-7, 1, 42, 9_000_000_001];

const WORDS: [&str; 8] = ["hello", "world", "ünïcode", "a b", "x", "ok", "zzz", "42"];

/// Generates messages: for each channel ~90 random days in 2023-2024, 1..=6 messages per
/// day, some sharing a timestamp (ties broken by id), ids unique per channel and not
/// monotonic in time (negative ones included).
pub fn generate(seed: u64) -> Vec<Msg> {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = EventTime::parse_rfc3339("2023-01-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let day = 86_400_000_000i64;
    let mut out = Vec::new();
    for &ch in &CHANNELS {
        let mut days = BTreeSet::new();
        while days.len() < 90 {
            days.insert(rng.random_range(0..730i64));
        }
        let mut ids = BTreeSet::new();
        for d in days {
            let n = rng.random_range(1..=6);
            let mut t = start + d * day + rng.random_range(0..day / 2);
            for _ in 0..n {
                let id = loop {
                    let id = rng.random_range(-5_000i64..100_000);
                    if ids.insert(id) {
                        break id;
                    }
                };
                let content = format!(
                    "{} {}",
                    WORDS[rng.random_range(0..WORDS.len())],
                    rng.random_range(0..1000)
                );
                out.push(Msg {
                    channel: ch,
                    micros: t,
                    id,
                    content,
                });
                if rng.random_bool(0.7) {
                    t += rng.random_range(1..3_600_000_000i64);
                }
            }
        }
    }
    out
}

pub fn record(m: &Msg) -> Record {
    Record {
        partition_key: PartitionKey::new(encode_i64(m.channel).to_vec()).unwrap(),
        event_time: EventTime::from_micros(m.micros).unwrap(),
        sort_key: SortKey::new(encode_i64(m.id).to_vec()).unwrap(),
        value: m.content.as_bytes().to_vec(),
    }
}

/// Creates `chat` through SQL, appends the messages, moves buckets into their tiers and
/// loads `chat_ref`.
pub async fn load(env: &Env, seed: u64) -> Loaded {
    env.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    let msgs = generate(seed);
    let table = TableId::new("chat").unwrap();
    let records: Vec<Record> = msgs.iter().map(record).collect();
    for chunk in records.chunks(500) {
        env.store.append_batch(&table, chunk).await.expect("append");
    }

    // Tiers: decided per bucket by a seeded draw.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let metas = env
        .store
        .list_buckets(&table, &BucketFilter::default())
        .await
        .unwrap();
    let mut loaded = Loaded {
        channels: CHANNELS.to_vec(),
        ..Loaded::default()
    };
    let lease = Duration::from_secs(300);
    for m in metas {
        let roll: f64 = rng.random();
        if roll < 0.30 {
            archive(
                env,
                &m.id,
                PayloadFormat::Parquet,
                rng.random_bool(0.7),
                &mut loaded,
            )
            .await;
            loaded.parquet += 1;
        } else if roll < 0.55 {
            archive(
                env,
                &m.id,
                PayloadFormat::Json,
                rng.random_bool(0.7),
                &mut loaded,
            )
            .await;
            loaded.json += 1;
        } else if roll < 0.65 {
            env.store
                .claim(&m.id, lease)
                .await
                .unwrap()
                .expect("claimable");
            loaded.archiving += 1;
        } else {
            loaded.hot += 1;
        }
    }

    // The reference table.
    let client = env.store.raw_client().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE chat_ref (channel_id INT8 NOT NULL, \"timestamp\" TIMESTAMPTZ NOT NULL, \
             id INT8 NOT NULL, content TEXT NOT NULL, PRIMARY KEY (channel_id, \"timestamp\", id))",
        )
        .await
        .unwrap();
    for chunk in msgs.chunks(1000) {
        let ch: Vec<i64> = chunk.iter().map(|m| m.channel).collect();
        let ts: Vec<chrono::DateTime<chrono::Utc>> = chunk
            .iter()
            .map(|m| chrono::DateTime::from_timestamp_micros(m.micros).unwrap())
            .collect();
        let ids: Vec<i64> = chunk.iter().map(|m| m.id).collect();
        let content: Vec<&str> = chunk.iter().map(|m| m.content.as_str()).collect();
        client
            .execute(
                "INSERT INTO chat_ref SELECT * FROM UNNEST($1::INT8[], $2::TIMESTAMPTZ[], $3::INT8[], $4::TEXT[])",
                &[&ch, &ts, &ids, &content],
            )
            .await
            .unwrap();
    }
    loaded.msgs = msgs;
    loaded
}

/// Archives one bucket through the store's fenced steps and the archive writer.
pub async fn archive(
    env: &Env,
    bucket: &BucketId,
    format: PayloadFormat,
    clean: bool,
    loaded: &mut Loaded,
) {
    let lease = Duration::from_secs(300);
    let claim = env
        .store
        .claim(bucket, lease)
        .await
        .unwrap()
        .expect("claimable");
    let mut pages: Vec<Result<_, std::convert::Infallible>> = Vec::new();
    let mut after = None;
    loop {
        let page = env
            .store
            .snapshot_page(&claim, after.as_ref(), 3)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.clustering_key());
        pages.push(Ok(page));
    }
    let written = env
        .archive
        .write_bucket(bucket, claim.generation, format, stream::iter(pages))
        .await
        .expect("write archive");
    env.store
        .publish_archive(&claim, &written.manifest_key)
        .await
        .expect("publish");
    if clean {
        let c = env
            .store
            .claim_cleanup(bucket, lease)
            .await
            .unwrap()
            .expect("cleanup claimable");
        loop {
            let (_, done) = env
                .store
                .cleanup_step(&c, 100, Duration::ZERO)
                .await
                .unwrap();
            if done {
                break;
            }
        }
        loaded.cleaned += 1;
    }
    let meta = env.store.bucket(bucket).await.unwrap().unwrap();
    assert!(
        matches!(meta.state, BucketState::Archived { .. }),
        "{meta:?}"
    );
}
