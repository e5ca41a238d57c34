//! Literals finer than a column: a nanosecond instant compared with the microsecond
//! `timestamp` (ad hoc, as a string, as a prepared parameter; after and before 1970, where
//! truncation and rounding down differ) and a fractional number compared with a BIGINT.
//!
//! The reference is PostgreSQL on the same rows, asked the mathematically exact question:
//! PostgreSQL rounds a nanosecond timestamp literal to microseconds on input, so the
//! reference compares `extract(epoch FROM "timestamp") * 1e9` (an exact numeric) with the
//! literal's nanoseconds. The same answer is also computed here, in integers, as a check
//! of the reference itself.

use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::scalar::ScalarValue;

use crate::common::*;

/// 2025-06-01T00:00:00.123456Z and 1969-12-31T23:59:59.876543Z, in microseconds.
const AFTER: i64 = 1_748_736_000_123_456;
const BEFORE: i64 = -123_457;

/// `(id, micros)` of the stored rows: five neighbours of each instant, one far away.
fn rows() -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for (base, first) in [(AFTER, 1), (BEFORE, 11)] {
        for d in -2..=2 {
            out.push((first + d + 2, base + d));
        }
    }
    out.push((99, 0));
    out
}

/// Nanosecond literals around both instants: exact microseconds and finer ones, below and
/// above, halfway included.
fn literals() -> Vec<i128> {
    let mut out = Vec::new();
    for base in [AFTER, BEFORE] {
        for off in [-999, -500, 0, 1, 789] {
            out.push(i128::from(base) * 1_000 + off);
        }
    }
    out
}

fn rfc3339(ns: i128) -> String {
    let secs = i64::try_from(ns.div_euclid(1_000_000_000)).unwrap();
    let frac = u32::try_from(ns.rem_euclid(1_000_000_000)).unwrap();
    chrono::DateTime::from_timestamp(secs, frac)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

fn sql_ts(ns: i128) -> String {
    format!("TIMESTAMP '{}'", rfc3339(ns))
}

/// One predicate family: its SQL with `{0}`, `{1}` for the literals, the PostgreSQL form
/// over the exact nanoseconds `x`, and the exact answer.
struct Case {
    name: &'static str,
    ours: &'static str,
    reference: &'static str,
    args: usize,
    holds: fn(i128, &[i128]) -> bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "=",
            ours: "\"timestamp\" = {0}",
            reference: "x = {0}",
            args: 1,
            holds: |t, a| t == a[0],
        },
        Case {
            name: "<>",
            ours: "\"timestamp\" <> {0}",
            reference: "x <> {0}",
            args: 1,
            holds: |t, a| t != a[0],
        },
        Case {
            name: "<",
            ours: "\"timestamp\" < {0}",
            reference: "x < {0}",
            args: 1,
            holds: |t, a| t < a[0],
        },
        Case {
            name: "<=",
            ours: "\"timestamp\" <= {0}",
            reference: "x <= {0}",
            args: 1,
            holds: |t, a| t <= a[0],
        },
        Case {
            name: ">",
            ours: "\"timestamp\" > {0}",
            reference: "x > {0}",
            args: 1,
            holds: |t, a| t > a[0],
        },
        Case {
            name: ">=",
            ours: "\"timestamp\" >= {0}",
            reference: "x >= {0}",
            args: 1,
            holds: |t, a| t >= a[0],
        },
        Case {
            name: "literal <",
            ours: "{0} < \"timestamp\"",
            reference: "{0} < x",
            args: 1,
            holds: |t, a| a[0] < t,
        },
        Case {
            name: "literal >=",
            ours: "{0} >= \"timestamp\"",
            reference: "{0} >= x",
            args: 1,
            holds: |t, a| a[0] >= t,
        },
        Case {
            name: "BETWEEN",
            ours: "\"timestamp\" BETWEEN {0} AND {1}",
            reference: "x BETWEEN {0} AND {1}",
            args: 2,
            holds: |t, a| a[0] <= t && t <= a[1],
        },
        Case {
            name: "NOT BETWEEN",
            ours: "\"timestamp\" NOT BETWEEN {0} AND {1}",
            reference: "x NOT BETWEEN {0} AND {1}",
            args: 2,
            holds: |t, a| !(a[0] <= t && t <= a[1]),
        },
        Case {
            name: "IN",
            ours: "\"timestamp\" IN ({0}, {1})",
            reference: "x IN ({0}, {1})",
            args: 2,
            holds: |t, a| t == a[0] || t == a[1],
        },
        Case {
            name: "NOT IN",
            ours: "\"timestamp\" NOT IN ({0}, {1})",
            reference: "x NOT IN ({0}, {1})",
            args: 2,
            holds: |t, a| t != a[0] && t != a[1],
        },
        Case {
            name: "IS DISTINCT FROM",
            ours: "\"timestamp\" IS DISTINCT FROM {0}",
            reference: "x IS DISTINCT FROM {0}",
            args: 1,
            holds: |t, a| t != a[0],
        },
    ]
}

/// The literal sets a case is asked with: each literal alone, or pairs of neighbours.
fn argument_sets(args: usize) -> Vec<Vec<i128>> {
    let lits = literals();
    if args == 1 {
        return lits.into_iter().map(|l| vec![l]).collect();
    }
    let mut out = Vec::new();
    for (i, a) in lits.iter().enumerate() {
        for b in lits.iter().skip(i).take(2) {
            out.push(vec![*a, *b]);
        }
    }
    out
}

fn fill(template: &str, args: &[String]) -> String {
    args.iter()
        .enumerate()
        .fold(template.to_string(), |s, (i, a)| {
            s.replace(&format!("{{{i}}}"), a)
        })
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut out: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
        })
        .collect();
    out.sort_unstable();
    out
}

async fn setup(name: &str) -> (Env, deadpool_postgres::Object) {
    let env = Env::new(name).await;
    env.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    env.sql(
        "CREATE EXTERNAL TABLE audit STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'raw', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    let chat: Vec<String> = rows()
        .iter()
        .map(|(id, us)| {
            format!(
                "({}, {}, {id}, 'm{id}')",
                id % 2,
                sql_ts(i128::from(*us) * 1_000)
            )
        })
        .collect();
    env.sql(&format!("INSERT INTO chat VALUES {}", chat.join(", ")))
        .await;
    let raw: Vec<String> = rows()
        .iter()
        .map(|(id, us)| {
            format!(
                "(X'01', {}, X'{id:02x}', X'')",
                sql_ts(i128::from(*us) * 1_000)
            )
        })
        .collect();
    env.sql(&format!("INSERT INTO audit VALUES {}", raw.join(", ")))
        .await;
    let client = env.store.raw_client().await.unwrap();
    client
        .batch_execute(
            "SET TIME ZONE 'UTC'; \
             CREATE TABLE lit_ref (id INT8 NOT NULL, \"timestamp\" TIMESTAMPTZ NOT NULL)",
        )
        .await
        .unwrap();
    for (id, us) in rows() {
        let t = chrono::DateTime::from_timestamp_micros(us).unwrap();
        client
            .execute("INSERT INTO lit_ref VALUES ($1, $2)", &[&id, &t])
            .await
            .unwrap();
    }
    (env, client)
}

/// PostgreSQL's exact answer: the stored instant as exact nanoseconds.
async fn reference(client: &tokio_postgres::Client, case: &Case, args: &[i128]) -> Vec<i64> {
    let pred = fill(
        case.reference,
        &args.iter().map(i128::to_string).collect::<Vec<_>>(),
    )
    .replace('x', "(extract(epoch FROM \"timestamp\") * 1000000000)");
    let q = format!("SELECT id FROM lit_ref WHERE {pred} ORDER BY id");
    let got: Vec<i64> = client
        .query(&q, &[])
        .await
        .unwrap_or_else(|e| panic!("{q}: {e}"))
        .iter()
        .map(|r| r.get(0))
        .collect();
    let exact: Vec<i64> = rows()
        .into_iter()
        .filter(|(_, us)| (case.holds)(i128::from(*us) * 1_000, args))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(got, exact, "the reference itself for {q}");
    got
}

/// Every comparison operator with nanosecond literals, as SQL literals and as strings, on
/// both surfaces, with and without a channel predicate: the exact rows, never a row that
/// fails the predicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nanosecond_literals_are_compared_exactly() {
    let (env, client) = setup("lits").await;
    let mut checked = 0;
    for case in cases() {
        for args in argument_sets(case.args) {
            let want = reference(&client, &case, &args).await;
            let typed: Vec<String> = args.iter().map(|a| sql_ts(*a)).collect();
            let strings: Vec<String> = args.iter().map(|a| format!("'{}'", rfc3339(*a))).collect();
            // A string with nine fractional digits is narrowed by the same cast.
            let pred = fill(case.ours, &strings);
            let q = format!("SELECT id FROM chat WHERE channel_id IN (0, 1) AND {pred}");
            assert_eq!(ids(&env.sql(&q).await), want, "{} : {q}", case.name);
            {
                let pred = fill(case.ours, &typed);
                let q = format!("SELECT id FROM chat WHERE {pred}");
                assert_eq!(ids(&env.sql(&q).await), want, "{} : {q}", case.name);
                // With the channels named, the predicate meets the pushed-down scan bounds.
                let q = format!("SELECT id FROM chat WHERE channel_id IN (0, 1) AND {pred}");
                assert_eq!(ids(&env.sql(&q).await), want, "{} : {q}", case.name);
                // The raw surface's event_time is the same microsecond column.
                let q = format!(
                    "SELECT * FROM audit WHERE {}",
                    pred.replace("\"timestamp\"", "event_time")
                );
                let n = crate::common::rows(&env.sql(&q).await);
                assert_eq!(n, want.len(), "{} : {q}", case.name);
                checked += 1;
            }
        }
    }
    assert!(checked > 130, "{checked}");
    env.cleanup().await;
}

/// The same comparisons with the literal as a prepared statement's parameter: a
/// nanosecond instant (or a string naming one) bound to a microsecond `timestamp`
/// parameter must not be truncated into a different instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nanosecond_parameters_are_compared_exactly() {
    let (env, client) = setup("litp").await;
    let utc = Some(std::sync::Arc::<str>::from("UTC"));
    for case in cases() {
        let params: Vec<String> = (1..=case.args).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT id FROM chat WHERE channel_id IN (0, 1) AND {}",
            fill(case.ours, &params)
        );
        let prepared = pulpitum::prepared::prepare(&env.ctx, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        for args in argument_sets(case.args) {
            let want = reference(&client, &case, &args).await;
            let nanos: Vec<ScalarValue> = args
                .iter()
                .map(|a| {
                    ScalarValue::TimestampNanosecond(Some(i64::try_from(*a).unwrap()), utc.clone())
                })
                .collect();
            let strings: Vec<ScalarValue> = args
                .iter()
                .map(|a| ScalarValue::Utf8(Some(rfc3339(*a))))
                .collect();
            for values in [nanos, strings] {
                let got = ids(&prepared
                    .execute(&values)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}")));
                assert_eq!(got, want, "{} : {sql} with {values:?}", case.name);
            }
        }
    }
    env.cleanup().await;
}

/// A BIGINT compared with a fractional literal or parameter is compared as a number, never
/// narrowed to an integer; PostgreSQL (`bigint` against `numeric`) answers the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fractional_literals_against_bigint_are_exact() {
    let (env, client) = setup("litf").await;
    let preds = [
        "id = 12.5",
        "id = 12.0",
        "id <> 12.5",
        "id < 12.5",
        "id <= 12.5",
        "id > 12.5",
        "id >= 12.5",
        "id BETWEEN 11.5 AND 13.5",
        "id IN (12.5, 13)",
        "id NOT IN (12.5, 13)",
        "id > -0.5",
    ];
    for pred in preds {
        let want: Vec<i64> = client
            .query(
                &format!("SELECT id FROM lit_ref WHERE {pred} ORDER BY id"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let q = format!("SELECT id FROM chat WHERE channel_id IN (0, 1) AND {pred}");
        assert_eq!(ids(&env.sql(&q).await), want, "{q}");
    }
    for (op, v) in [
        ("=", 12.5),
        ("<", 12.5),
        ("<=", 12.5),
        (">", 12.5),
        (">=", 12.5),
        ("=", 12.0),
    ] {
        let sql = format!("SELECT id FROM chat WHERE channel_id IN (0, 1) AND id {op} $1");
        let prepared = pulpitum::prepared::prepare(&env.ctx, &sql).await.unwrap();
        let want: Vec<i64> = client
            .query(
                &format!("SELECT id FROM lit_ref WHERE id {op} {v} ORDER BY id"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let got = ids(&prepared
            .execute(&[ScalarValue::Float64(Some(v))])
            .await
            .unwrap());
        assert_eq!(got, want, "{sql} with {v}");
    }
    env.cleanup().await;
}

/// An equality with a finer literal is pushed down as a contradiction: the scan reads
/// nothing (and the plan says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finer_equality_reads_nothing() {
    let (env, _client) = setup("lite").await;
    let lit = sql_ts(i128::from(AFTER) * 1_000 + 789);
    let plan = pretty(
        &env.sql(&format!(
            "EXPLAIN SELECT id FROM chat WHERE channel_id = 1 AND \"timestamp\" = {lit}"
        ))
        .await,
    );
    assert!(plan.contains("PulpitumScanExec"), "{plan}");
    assert!(
        plan.contains("false]"),
        "the scan must know it reads nothing:\n{plan}"
    );
    env.cleanup().await;
}
