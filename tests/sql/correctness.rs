//! Correctness against a reference: the generated dataset spread over every tier, and
//! hundreds of generated queries compared row for row with the same SQL run on a plain
//! PostgreSQL table holding the same rows: in process, as prepared statements, and through
//! the PostgreSQL wire server with a driver.

use datafusion::arrow::array::{
    Array, Float64Array, Int32Array, Int64Array, StringArray, StringViewArray,
    TimestampMicrosecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::types::Type;

use crate::common::*;
use crate::dataset::{self, Msg};

/// A normalised cell.
#[derive(Debug, Clone, PartialEq)]
enum V {
    I(i64),
    S(String),
    T(i64),
    F(String),
    Null,
}

fn df_rows(batches: &[RecordBatch]) -> Vec<Vec<V>> {
    let mut out = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let mut row = Vec::new();
            for c in b.columns() {
                if c.is_null(r) {
                    row.push(V::Null);
                    continue;
                }
                let any = c.as_any();
                row.push(match c.data_type() {
                    DataType::Int64 => V::I(any.downcast_ref::<Int64Array>().unwrap().value(r)),
                    DataType::Int32 => V::I(i64::from(
                        any.downcast_ref::<Int32Array>().unwrap().value(r),
                    )),
                    DataType::UInt64 => {
                        V::I(any.downcast_ref::<UInt64Array>().unwrap().value(r) as i64)
                    }
                    DataType::Utf8 => V::S(
                        any.downcast_ref::<StringArray>()
                            .unwrap()
                            .value(r)
                            .to_string(),
                    ),
                    DataType::Utf8View => V::S(
                        any.downcast_ref::<StringViewArray>()
                            .unwrap()
                            .value(r)
                            .to_string(),
                    ),
                    DataType::Float64 => V::F(format!(
                        "{:.6}",
                        any.downcast_ref::<Float64Array>().unwrap().value(r)
                    )),
                    DataType::Timestamp(TimeUnit::Microsecond, _) => V::T(
                        any.downcast_ref::<TimestampMicrosecondArray>()
                            .unwrap()
                            .value(r),
                    ),
                    other => panic!("unexpected result type {other}"),
                });
            }
            out.push(row);
        }
    }
    out
}

fn pg_rows(rows: &[tokio_postgres::Row]) -> Vec<Vec<V>> {
    rows.iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    let t = row.columns()[i].type_().clone();
                    match t {
                        Type::INT8 => row.get::<_, Option<i64>>(i).map_or(V::Null, V::I),
                        Type::INT4 => row
                            .get::<_, Option<i32>>(i)
                            .map_or(V::Null, |v| V::I(v.into())),
                        Type::TEXT | Type::VARCHAR => {
                            row.get::<_, Option<String>>(i).map_or(V::Null, V::S)
                        }
                        Type::FLOAT8 => row
                            .get::<_, Option<f64>>(i)
                            .map_or(V::Null, |v| V::F(format!("{v:.6}"))),
                        Type::TIMESTAMPTZ => row
                            .get::<_, Option<chrono::DateTime<chrono::Utc>>>(i)
                            .map_or(V::Null, |v| V::T(v.timestamp_micros())),
                        other => panic!("unexpected reference type {other}"),
                    }
                })
                .collect()
        })
        .collect()
}

fn ts(micros: i64) -> String {
    let dt = chrono::DateTime::from_timestamp_micros(micros).unwrap();
    format!(
        "TIMESTAMP '{}'",
        dt.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    )
}

/// Generates one query of each family in turn, with parameters drawn from the data.
fn queries(msgs: &[Msg], channels: &[i64], n: usize, seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let cols = "channel_id, \"timestamp\", id, content";
    let order_asc = "ORDER BY channel_id, \"timestamp\", id";
    for i in 0..n {
        let m = &msgs[rng.random_range(0..msgs.len())];
        let m2 = &msgs[rng.random_range(0..msgs.len())];
        let (lo, hi) = if m.micros <= m2.micros {
            (m.micros, m2.micros)
        } else {
            (m2.micros, m.micros)
        };
        let ch = if rng.random_bool(0.8) {
            m.channel
        } else {
            channels[rng.random_range(0..channels.len())]
        };
        let limit = rng.random_range(1..40);
        let offset = rng.random_range(0..10);
        let span =
            rng.random_range(0..40i64) * 86_400_000_000 + rng.random_range(0..86_400_000_000i64);
        // Whole days around the drawn times: a count over them may be answered from the
        // manifests when every bucket in it is archived.
        let day = 86_400_000_000i64;
        let (day_lo, day_hi) = (lo.div_euclid(day) * day, (hi.div_euclid(day) + 1) * day);
        let q = match i % 20 {
            16 => format!(
                "SELECT {cols} FROM chat WHERE \"timestamp\" < {} ORDER BY \"timestamp\" DESC, id DESC, channel_id DESC LIMIT {limit}",
                ts(hi)
            ),
            17 => format!(
                "SELECT channel_id, \"timestamp\", id FROM chat WHERE \"timestamp\" > {} ORDER BY \"timestamp\", id, channel_id LIMIT {limit}",
                ts(lo)
            ),
            18 => {
                let only = if rng.random_bool(0.5) {
                    format!("channel_id = {ch} AND ")
                } else {
                    String::new()
                };
                format!(
                    "SELECT count(*) AS n FROM chat WHERE {only}\"timestamp\" >= {} AND \"timestamp\" < {}",
                    ts(day_lo),
                    ts(day_hi)
                )
            }
            0 => format!("SELECT {cols} FROM chat WHERE channel_id = {ch} ORDER BY \"timestamp\", id"),
            1 => format!(
                "SELECT {cols} FROM chat WHERE channel_id = {ch} AND \"timestamp\" >= {} AND \"timestamp\" < {} ORDER BY \"timestamp\", id",
                ts(m.micros - span / 2),
                ts(m.micros + span / 2)
            ),
            2 => format!(
                "SELECT {cols} FROM chat WHERE channel_id = {ch} AND \"timestamp\" BETWEEN {} AND {} ORDER BY \"timestamp\" DESC, id DESC",
                ts(lo),
                ts(hi)
            ),
            3 => format!(
                "SELECT {cols} FROM chat WHERE channel_id = {} AND (\"timestamp\" > {t} OR (\"timestamp\" = {t} AND id > {})) ORDER BY \"timestamp\", id LIMIT {limit}",
                m.channel,
                m.id,
                t = ts(m.micros)
            ),
            4 => format!(
                "SELECT {cols} FROM chat WHERE channel_id = {} AND (\"timestamp\" < {t} OR (\"timestamp\" = {t} AND id < {})) ORDER BY \"timestamp\" DESC, id DESC LIMIT {limit}",
                m.channel,
                m.id,
                t = ts(m.micros)
            ),
            5 => format!(
                "SELECT {cols} FROM chat WHERE channel_id = {ch} ORDER BY \"timestamp\" DESC, id DESC LIMIT {limit} OFFSET {offset}"
            ),
            6 => format!(
                "SELECT {cols} FROM chat WHERE \"timestamp\" >= {} {order_asc} LIMIT {limit} OFFSET {offset}",
                ts(lo)
            ),
            7 => format!(
                "SELECT count(*) AS n, min(id) AS a, max(id) AS b, min(\"timestamp\") AS t0, max(\"timestamp\") AS t1 FROM chat WHERE channel_id = {ch} AND \"timestamp\" <= {}",
                ts(hi)
            ),
            8 => format!(
                "SELECT channel_id, count(*) AS n, max(length(content)) AS l FROM chat WHERE \"timestamp\" > {} GROUP BY channel_id ORDER BY channel_id",
                ts(lo)
            ),
            9 => {
                let a = rng.random_range(-5_000..100_000i64);
                let b = a + rng.random_range(0..20_000i64);
                format!("SELECT {cols} FROM chat WHERE id > {a} AND id <= {b} AND channel_id IN ({ch}, {}) {order_asc}", channels[i % channels.len()])
            }
            10 => format!(
                "SELECT channel_id, id FROM chat WHERE content LIKE '%{}%' AND \"timestamp\" < {} {order_asc}",
                ["o", "ü", " ", "z"][i % 4],
                ts(hi)
            ),
            11 => format!("SELECT count(*) AS n FROM chat WHERE channel_id = {ch} AND id = {}", m.id),
            12 => format!(
                "SELECT {cols} FROM chat WHERE channel_id = {ch} AND \"timestamp\" = {} ORDER BY id",
                ts(m.micros)
            ),
            13 => format!(
                "SELECT id, \"timestamp\" FROM chat WHERE channel_id = {ch} AND \"timestamp\" > {} ORDER BY \"timestamp\", id LIMIT {limit}",
                ts(lo)
            ),
            14 => format!(
                "SELECT channel_id, min(\"timestamp\") AS t0, count(*) AS n FROM chat WHERE channel_id <> {ch} GROUP BY channel_id ORDER BY channel_id"
            ),
            // Truncated times (UTC, as the reference session's zone), at every granularity.
            19 => format!(
                "SELECT date_trunc('{}', \"timestamp\") AS d, count(*) AS n, min(id) AS a FROM chat WHERE channel_id = {ch} AND \"timestamp\" >= {} GROUP BY d ORDER BY d",
                ["hour", "day", "week", "month", "quarter", "year"][(i / 20) % 6],
                ts(lo)
            ),
            _ => format!(
                "SELECT {cols} FROM chat WHERE channel_id = {ch} AND id >= {} AND \"timestamp\" < {} ORDER BY \"timestamp\" DESC, id DESC LIMIT {limit}",
                m.id.min(m2.id),
                ts(hi)
            ),
        };
        out.push(q);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_queries_match_postgresql() {
    let env = Env::new("corr").await;
    let loaded = dataset::load(&env, 7).await;
    assert!(loaded.parquet > 0 && loaded.json > 0 && loaded.archiving > 0 && loaded.hot > 0);
    assert!(loaded.cleaned > 0 && loaded.cleaned < loaded.parquet + loaded.json);
    let client = env.store.raw_client().await.unwrap();
    client.batch_execute("SET TIME ZONE 'UTC'").await.unwrap();

    // The same session's tables over the PostgreSQL wire, in process: every query also runs
    // through a driver (extended protocol, binary results).
    let server = pulpitum::server::Server::bind(
        env.reopen().await,
        pulpitum::server::ServerConfig {
            listen: "127.0.0.1:0".into(),
            insecure_no_auth: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let port = server.local_addr().unwrap().port();
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(server.run(stop.clone()));
    let (wire, conn) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=any dbname=pulpitum"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);

    let qs = queries(&loaded.msgs, &loaded.channels, 240, 11);
    let mut nonempty = 0;
    for q in &qs {
        let ours = df_rows(&env.sql(q).await);
        let reference = pg_rows(
            &client
                .query(&q.replace("FROM chat ", "FROM chat_ref "), &[])
                .await
                .unwrap_or_else(|e| panic!("{q}: {e}")),
        );
        if ours != reference {
            panic!(
                "mismatch for {q}\n pulpitum ({} rows): {:?}\n reference ({} rows): {:?}",
                ours.len(),
                &ours[..ours.len().min(5)],
                reference.len(),
                &reference[..reference.len().min(5)]
            );
        }
        // The same statement prepared: its scans list buckets at execution, together with
        // each channel's first page.
        let prepared = pulpitum::prepared::prepare(&env.ctx, q)
            .await
            .unwrap_or_else(|e| panic!("prepare {q}: {e}"));
        let again = df_rows(
            &prepared
                .execute(&[])
                .await
                .unwrap_or_else(|e| panic!("prepared {q}: {e}")),
        );
        assert_eq!(again, reference, "prepared statement differs for {q}");
        let through_wire = pg_rows(
            &wire
                .query(q.as_str(), &[])
                .await
                .unwrap_or_else(|e| panic!("wire {q}: {e}")),
        );
        assert_eq!(through_wire, reference, "the wire answer differs for {q}");
        if !ours.is_empty() && ours[0] != vec![V::I(0)] {
            nonempty += 1;
        }
    }
    // The generator aims at real rows: most queries must return something.
    assert!(
        nonempty > qs.len() / 2,
        "only {nonempty} of {} queries returned rows",
        qs.len()
    );
    drop(wire);
    stop.cancel();
    serving.await.unwrap();
    env.cleanup().await;
}

/// Pages with bound parameters (channel, cursor time and id, both directions) through
/// prepared statements, against the same pages with literals on the reference table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_pages_with_parameters_match_postgresql() {
    use datafusion::scalar::ScalarValue;
    // Pages of 3 rows: a first page that does not finish its bucket is continued.
    let opts = pulpitum::session::SessionOptions {
        page_rows: 3,
        ..Default::default()
    };
    let env = Env::with_options("prep", opts).await;
    let loaded = dataset::load(&env, 5).await;
    let client = env.store.raw_client().await.unwrap();
    client.batch_execute("SET TIME ZONE 'UTC'").await.unwrap();
    let cols = "channel_id, \"timestamp\", id, content";
    let latest = pulpitum::prepared::prepare(
        &env.ctx,
        &format!("SELECT {cols} FROM chat WHERE channel_id = $1 ORDER BY \"timestamp\" DESC, id DESC LIMIT 25"),
    )
    .await
    .unwrap();
    let forward = pulpitum::prepared::prepare(
        &env.ctx,
        &format!("SELECT {cols} FROM chat WHERE channel_id = $1 AND (\"timestamp\" > $2 OR (\"timestamp\" = $2 AND id > $3)) ORDER BY \"timestamp\", id LIMIT 30"),
    )
    .await
    .unwrap();
    let backward = pulpitum::prepared::prepare(
        &env.ctx,
        &format!("SELECT {cols} FROM chat WHERE channel_id = $1 AND (\"timestamp\" < $2 OR (\"timestamp\" = $2 AND id < $3)) ORDER BY \"timestamp\" DESC, id DESC LIMIT 30"),
    )
    .await
    .unwrap();
    let ref_latest = client
        .prepare(&format!("SELECT {cols} FROM chat_ref WHERE channel_id = $1 ORDER BY \"timestamp\" DESC, id DESC LIMIT 25"))
        .await
        .unwrap();
    let ref_forward = client
        .prepare(&format!("SELECT {cols} FROM chat_ref WHERE channel_id = $1 AND (\"timestamp\" > $2 OR (\"timestamp\" = $2 AND id > $3)) ORDER BY \"timestamp\", id LIMIT 30"))
        .await
        .unwrap();
    let ref_backward = client
        .prepare(&format!("SELECT {cols} FROM chat_ref WHERE channel_id = $1 AND (\"timestamp\" < $2 OR (\"timestamp\" = $2 AND id < $3)) ORDER BY \"timestamp\" DESC, id DESC LIMIT 30"))
        .await
        .unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let mut nonempty = 0;
    for ch in &loaded.channels {
        let ours = df_rows(
            &latest
                .execute(&[ScalarValue::Int64(Some(*ch))])
                .await
                .unwrap(),
        );
        let reference = pg_rows(&client.query(&ref_latest, &[ch]).await.unwrap());
        assert_eq!(ours, reference, "latest page of channel {ch}");
    }
    for _ in 0..60 {
        let m = &loaded.msgs[rng.random_range(0..loaded.msgs.len())];
        let t = chrono::DateTime::from_timestamp_micros(m.micros).unwrap();
        // An Int32 channel is converted to the parameter's BIGINT.
        let params = [
            i32::try_from(m.channel).map_or(ScalarValue::Int64(Some(m.channel)), |c| {
                ScalarValue::Int32(Some(c))
            }),
            ScalarValue::TimestampMicrosecond(Some(m.micros), Some("UTC".into())),
            ScalarValue::Int64(Some(m.id)),
        ];
        for (ours, reference) in [(&forward, &ref_forward), (&backward, &ref_backward)] {
            let got = df_rows(&ours.execute(&params).await.unwrap());
            let want = pg_rows(
                &client
                    .query(reference, &[&m.channel, &t, &m.id])
                    .await
                    .unwrap(),
            );
            assert_eq!(
                got, want,
                "cursor page after ({}, {}, {})",
                m.channel, m.micros, m.id
            );
            nonempty += usize::from(!got.is_empty());
        }
    }
    assert!(
        nonempty > 60,
        "only {nonempty} of 120 cursor pages returned rows"
    );
    env.cleanup().await;
}
