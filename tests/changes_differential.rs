//! The differential check of DELETE and UPDATE: one random sequence of INSERT, DELETE and
//! UPDATE statements is applied to a plain PostgreSQL table and to a Pulpitum table, with
//! archiving runs (per-bucket objects, then segments) in between, and every statement's
//! row count and every round's answers must be identical. Real PostgreSQL and S3.

mod archiver_support;
mod changes_support;

use archiver_support::fresh_database;
use changes_support::*;
use chrono::{DateTime, SecondsFormat, Utc};
use datafusion::arrow::array::{Array, Int64Array};
use pulpitum::archive::PayloadFormat;
use pulpitum::model::EventTime;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One statement, as each side spells it.
struct Op {
    pulpitum: String,
    postgres: String,
}

fn ts_literal(micros: i64) -> String {
    EventTime::from_micros(micros)
        .unwrap()
        .to_datetime()
        .to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn random_change(rng: &mut StdRng, t0: i64, days: i64) -> Op {
    let ch = rng.random_range(1..=4);
    let m = rng.random_range(2..=5);
    let r = rng.random_range(0..m);
    let both = |s: String| Op {
        pulpitum: s.replace("{ts}", "timestamp").replace("{t}", "chat"),
        postgres: s.replace("{ts}", "ts").replace("{t}", "ref"),
    };
    match rng.random_range(0..6) {
        0 => both(format!(
            "DELETE FROM {{t}} WHERE channel_id = {ch} AND id % {m} = {r}"
        )),
        1 => both(format!(
            "UPDATE {{t}} SET content = content || 'u' WHERE channel_id = {ch} AND id % {m} = {r}"
        )),
        2 => {
            let from = t0 + rng.random_range(0..days) * DAY_US + rng.random_range(0..DAY_US);
            let to = from + rng.random_range(1..3) * DAY_US;
            both(format!(
                "DELETE FROM {{t}} WHERE channel_id = {ch} AND {{ts}} >= TIMESTAMPTZ '{}' AND {{ts}} < TIMESTAMPTZ '{}'",
                ts_literal(from),
                ts_literal(to)
            ))
        }
        3 => both(format!(
            "UPDATE {{t}} SET content = 'x' || content WHERE content LIKE '%{r}%'"
        )),
        4 => both("DELETE FROM {t} WHERE content LIKE 'xx%'".to_string()),
        _ => both(format!(
            "UPDATE {{t}} SET content = 'e{r}' WHERE id % {m} = {r} AND content LIKE '%u%'"
        )),
    }
}

async fn reference_rows(pg: &tokio_postgres::Client) -> Model {
    let rows = pg
        .query("SELECT channel_id, id, ts, content FROM ref", &[])
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let t: DateTime<Utc> = r.get(2);
            (
                (r.get::<_, i64>(0), r.get::<_, i64>(1)),
                (
                    EventTime::from_datetime(t).unwrap().as_micros(),
                    r.get::<_, String>(3),
                ),
            )
        })
        .collect()
}

/// The aggregate answers of one side, as text.
async fn aggregates_pulpitum(env: &Env) -> Vec<(i64, i64, i64)> {
    let b = env
        .sql("SELECT channel_id, count(*), sum(id) FROM chat GROUP BY channel_id ORDER BY channel_id")
        .await
        .unwrap();
    let mut out = Vec::new();
    for batch in &b {
        let col = |i: usize| {
            batch
                .column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone()
        };
        let (a, c, s) = (col(0), col(1), col(2));
        for i in 0..batch.num_rows() {
            out.push((a.value(i), c.value(i), s.value(i)));
        }
    }
    out
}

async fn aggregates_postgres(pg: &tokio_postgres::Client) -> Vec<(i64, i64, i64)> {
    pg.query(
        "SELECT channel_id, count(*)::INT8, sum(id)::INT8 FROM ref GROUP BY channel_id ORDER BY channel_id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

async fn differential(label: &str, embedded: bool, format: PayloadFormat, seed: u64) {
    let env = Env::new(label, embedded).await;
    let url = fresh_database(&format!("{label}_ref")).await;
    let (pg, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    pg.batch_execute(
        "CREATE TABLE ref (channel_id INT8 NOT NULL, ts TIMESTAMPTZ NOT NULL, id INT8 NOT NULL, \
         content TEXT NOT NULL, PRIMARY KEY (channel_id, ts, id))",
    )
    .await
    .unwrap();
    let insert = pg
        .prepare("INSERT INTO ref (channel_id, ts, id, content) VALUES ($1, $2, $3, $4)")
        .await
        .unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let t0 = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let days = 45;
    let mut next_id = 1i64;
    let mut statements = 0;
    let mut cut = 0i64;
    for round in 0..12 {
        // New rows go only into days not archived yet (archived buckets take no appends).
        let mut values = Vec::new();
        for _ in 0..25 {
            let ch: i64 = rng.random_range(1..=4);
            let day = rng.random_range(cut..(cut + 6).min(days));
            let t = t0 + day * DAY_US + rng.random_range(0..DAY_US);
            let id = next_id;
            next_id += 1;
            let content = format!("w{}", rng.random_range(0..1000));
            pg.execute(
                &insert,
                &[
                    &ch,
                    &EventTime::from_micros(t).unwrap().to_datetime(),
                    &id,
                    &content,
                ],
            )
            .await
            .unwrap();
            values.push(format!(
                "({ch}, TIMESTAMP '{}', {id}, '{content}')",
                ts_literal(t)
            ));
        }
        let n = env
            .change(&format!("INSERT INTO chat VALUES {}", values.join(", ")))
            .await
            .unwrap();
        assert_eq!(n, 25);
        for _ in 0..4 {
            let op = random_change(&mut rng, t0, days);
            let want = pg.execute(&op.postgres, &[]).await.unwrap();
            let got = env
                .change(&op.pulpitum)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", op.pulpitum));
            assert_eq!(got, want, "round {round}: {}", op.pulpitum);
            statements += 1;
        }
        let reference = reference_rows(&pg).await;
        assert_same(&env.dump().await, &reference, &format!("round {round}"));
        assert_eq!(
            aggregates_pulpitum(&env).await,
            aggregates_postgres(&pg).await,
            "round {round}"
        );
        // Archive what is old enough; from round 6 on, compact finished months into segments.
        cut = (cut + 3).min(days - 6);
        let before = EventTime::from_micros(t0 + cut * DAY_US).unwrap();
        env.archive_before(&before.to_datetime().to_rfc3339(), format, round >= 6)
            .await;
    }
    assert!(statements >= 48);
    let states = env.states().await;
    assert!(
        states
            .iter()
            .any(|s| matches!(s, pulpitum::store::BucketState::Archived { object_key, .. } if object_key.contains("/segments/"))),
        "segments were made: {states:?}"
    );
    assert_same(&env.dump().await, &reference_rows(&pg).await, "at the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_statements_answer_as_postgresql_does_on_postgres() {
    differential("chg_diff_pg", false, PayloadFormat::Parquet, 28).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_statements_answer_as_postgresql_does_embedded() {
    differential("chg_diff_sq", true, PayloadFormat::Json, 2028).await;
}
