//! The system tables and control statements through SQL: plans that show the filters pushed
//! into the store's query, answers that equal a full scan's whatever the pushed bounds (at and
//! around bucket boundaries), and control statements whose bad input names what was wrong.

use datafusion::arrow::record_batch::RecordBatch;
use pulpitum::session::SessionOptions;

use crate::common::*;

async fn control(env: &Env, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let df = pulpitum::control::sql(&env.ctx, sql)
        .await
        .map_err(|e| e.to_string())?;
    df.collect().await.map_err(|e| e.to_string())
}

async fn env(name: &str) -> Env {
    let env = Env::with_options(
        name,
        SessionOptions {
            target_partitions: Some(4),
            ..SessionOptions::default()
        },
    )
    .await;
    env.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    env.sql(
        "INSERT INTO chat VALUES \
         (1, TIMESTAMP '2024-03-01T12:00:00Z', 1, 'a'), (1, TIMESTAMP '2024-03-02T12:00:00Z', 2, 'b'), \
         (2, TIMESTAMP '2024-03-02T23:59:59Z', 3, 'c'), (2, TIMESTAMP '2024-03-04T00:00:00Z', 4, 'd'), \
         (-5, TIMESTAMP '2024-03-03T00:00:00Z', 5, 'e')",
    )
    .await;
    env
}

const PLANS: [(&str, &str); 4] = [
    (
        "system_buckets_table_and_state",
        "SELECT partition, bucket_key, reason FROM pulpitum_buckets WHERE table_id = 'chat' AND state = 'hot'",
    ),
    (
        "system_buckets_time_range",
        "SELECT bucket_key FROM pulpitum_buckets WHERE bucket_end > TIMESTAMP '2024-03-02T00:00:00Z' AND bucket_start <= TIMESTAMP '2024-03-03T00:00:00Z'",
    ),
    (
        "system_tables_join_buckets",
        "SELECT t.table_id, t.archive_after, count(*) FROM pulpitum_tables t JOIN pulpitum_buckets b ON b.table_id = t.table_id GROUP BY t.table_id, t.archive_after",
    ),
    (
        "system_jobs_since",
        "SELECT outcome, count(*) FROM pulpitum_jobs WHERE table_id = 'chat' AND started_at >= TIMESTAMP '2026-01-01T00:00:00Z' GROUP BY outcome",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_table_plans() {
    let env = env("sysplans").await;
    for (name, sql) in PLANS {
        let batches = env.sql(&format!("EXPLAIN {sql}")).await;
        let text = pretty(&batches);
        insta::assert_snapshot!(name, text, sql);
    }
    env.cleanup().await;
}

/// A pushed bound only narrows the store's query; DataFusion re-applies the predicate, so the
/// answer equals the one over an unfiltered scan (a subquery with a LIMIT is never pushed
/// into), at bucket boundaries and between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_filters_never_change_answers() {
    let env = env("syspush").await;
    let cols = "table_id, partition, bucket_key, state, eligible";
    for filter in [
        "table_id = 'chat'",
        "table_id = 'none'",
        "state = 'hot'",
        "state = 'archived'",
        "bucket_end > TIMESTAMP '2024-03-03T00:00:00Z'",
        "bucket_end >= TIMESTAMP '2024-03-03T00:00:00Z'",
        "bucket_end < TIMESTAMP '2024-03-03T00:00:00Z'",
        "bucket_end <= TIMESTAMP '2024-03-03T00:00:00Z'",
        "bucket_start > TIMESTAMP '2024-03-02T00:00:00Z'",
        "bucket_start >= TIMESTAMP '2024-03-02T00:00:00Z'",
        "bucket_start < TIMESTAMP '2024-03-02T00:00:00Z'",
        "bucket_start <= TIMESTAMP '2024-03-02T00:00:00Z'",
        "TIMESTAMP '2024-03-02T12:00:00Z' < bucket_end",
        "bucket_start >= TIMESTAMP '2024-03-02T00:00:00Z' AND bucket_end <= TIMESTAMP '2024-03-04T00:00:00Z'",
        "bucket_end > TIMESTAMP '2024-03-02T06:00:00Z' AND bucket_start <= TIMESTAMP '2024-03-02T06:00:00Z'",
    ] {
        let pushed = env
            .sql(&format!(
                "SELECT {cols} FROM pulpitum_buckets WHERE {filter} ORDER BY bucket_key, partition"
            ))
            .await;
        let full = env
            .sql(&format!(
                "SELECT {cols} FROM (SELECT * FROM pulpitum_buckets LIMIT 1000000) \
                 WHERE {filter} ORDER BY bucket_key, partition"
            ))
            .await;
        assert_eq!(pretty(&pushed), pretty(&full), "{filter}");
    }
    // Five buckets: (1, 03-01), (1, 03-02), (2, 03-02), (2, 03-04), (-5, 03-03).
    let all = env
        .sql("SELECT count(*) AS n FROM pulpitum_buckets WHERE table_id = 'chat'")
        .await;
    assert!(pretty(&all).contains("| 5 "), "{}", pretty(&all));
    // The partition column is the surface's channel id.
    let parts = env
        .sql("SELECT DISTINCT partition FROM pulpitum_buckets ORDER BY partition")
        .await;
    assert_eq!(
        pretty(&parts),
        "+-----------+\n| partition |\n+-----------+\n| -5        |\n| 1         |\n| 2         |\n+-----------+"
    );
    env.cleanup().await;
}

/// Policies through SQL: the answer and `pulpitum_tables` show what was set; bad statements,
/// options, values and tables are refused with what was wrong, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_statements_and_their_errors() {
    let env = env("syspolicy").await;
    let set = control(
        &env,
        "ALTER TABLE chat SET (archive_after = '90 days', cleanup_delay = '2 hours', format = 'json')",
    )
    .await
    .unwrap();
    let text = pretty(&set);
    assert!(
        text.contains(
            "| chat     | 90 days       | json   | 2 hours       |            | false  |"
        ),
        "{text}"
    );
    for (sql, needle) in [
        (
            "ALTER TABLE chat SET (archive_after = '3 months')",
            "archive_after: \"3 months\" \"months\" has no fixed length",
        ),
        ("ALTER TABLE chat SET (archive_after = 90)", "needs a unit"),
        (
            "ALTER TABLE chat SET (retention = '1 day')",
            "unknown table option \"retention\"",
        ),
        (
            "ALTER TABLE chat SET (format = 'csv')",
            "table option format: \"csv\" is not a payload format",
        ),
        (
            "ALTER TABLE chat SET (paused = 'sometimes')",
            "table option paused",
        ),
        (
            "ALTER TABLE chat SET (paused = true, paused = false)",
            "more than once",
        ),
        (
            "ALTER TABLE nope SET (paused = true)",
            "table nope is not registered",
        ),
        (
            "ALTER TABLE chat SET archive_after = '1 day'",
            "expected '(' after SET or RESET",
        ),
        ("SYSTEM STOP MERGES", "expected MOVES"),
    ] {
        let e = control(&env, sql).await.unwrap_err();
        assert!(e.contains(needle), "{sql}: {e}");
    }
    let t = env
        .sql("SELECT table_id, archive_after, format, cleanup_delay, paused, store_paused FROM pulpitum_tables")
        .await;
    assert_eq!(
        pretty(&t),
        "+----------+---------------+--------+---------------+--------+--------------+\n\
         | table_id | archive_after | format | cleanup_delay | paused | store_paused |\n\
         +----------+---------------+--------+---------------+--------+--------------+\n\
         | chat     | 90 days       | json   | 2 hours       | false  | false        |\n\
         +----------+---------------+--------+---------------+--------+--------------+"
    );
    control(&env, "SYSTEM STOP MOVES").await.unwrap();
    control(&env, "ALTER TABLE chat RESET (format, cleanup_delay)")
        .await
        .unwrap();
    let t = env
        .sql("SELECT archive_after, format, cleanup_delay, store_paused FROM pulpitum_tables")
        .await;
    assert!(
        pretty(&t).contains("| 90 days       |        |               | true         |"),
        "{}",
        pretty(&t)
    );
    // Every bucket of 2024 is held by the 90-day policy? No: they are long past 90 days, so
    // the store-wide pause is what holds them.
    let reasons = env
        .sql("SELECT DISTINCT eligible, reason FROM pulpitum_buckets")
        .await;
    assert!(
        pretty(&reasons)
            .contains("| false    | paused: the whole store (SYSTEM START MOVES resumes) |"),
        "{}",
        pretty(&reasons)
    );
    control(&env, "SYSTEM START MOVES").await.unwrap();
    let reasons = env
        .sql("SELECT DISTINCT eligible, reason FROM pulpitum_buckets")
        .await;
    assert!(
        pretty(&reasons).contains("| true     | eligible by archive_after 90 days |"),
        "{}",
        pretty(&reasons)
    );
    // Plain DataFusion refuses what only control::sql runs, rather than doing anything else.
    let e = env.sql_err("ALTER TABLE chat SET (paused = true)").await;
    assert!(!e.is_empty());
    // A system table's name cannot be taken.
    let e = env
        .sql_err(
            "CREATE EXTERNAL TABLE pulpitum_jobs STORED AS PULPITUM LOCATION '' \
             OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
        )
        .await;
    // DataFusion finds the system table first; the factory refuses the name as well.
    assert!(e.contains("'pulpitum_jobs' already exists"), "{e}");
    env.cleanup().await;
}

/// A held bucket's "eligible from" time, checked against the documented rules rather than
/// the code's formula: the default cutoff (January 1 of the previous UTC year) reaches a
/// bucket at the first January 1 whose previous January 1 is at or after the bucket's end;
/// `archive_after` reaches it at its end plus the duration. The time does not move between
/// two queries a second apart (it used to shift with the query's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eligible_from_times_follow_the_documented_rules() {
    use chrono::{Datelike, TimeZone, Utc};
    let env = Env::new("sysreason").await;
    for (name, strategy) in [
        ("byday", "calendar_day_utc"),
        ("bymonth", "calendar_month_utc"),
    ] {
        env.sql(&format!(
            "CREATE EXTERNAL TABLE {name} STORED AS PULPITUM LOCATION '' \
             OPTIONS ('surface' 'chat', 'bucket_strategy' '{strategy}')"
        ))
        .await;
    }
    // Yesterday: hot, and held by both rules whatever the date the test runs on.
    let at = Utc::now() - chrono::Duration::days(1);
    let stamp = at.format("%Y-%m-%dT12:00:00Z").to_string();
    for table in ["byday", "bymonth"] {
        env.sql(&format!(
            "INSERT INTO {table} VALUES (1, TIMESTAMP '{stamp}', 1, 'x')"
        ))
        .await;
    }
    control(&env, "ALTER TABLE bymonth SET (archive_after = '90 days')")
        .await
        .unwrap();
    let read = || async {
        let b = env
            .sql("SELECT table_id, bucket_end, reason FROM pulpitum_buckets ORDER BY table_id")
            .await;
        let rows: Vec<(String, i64, String)> = (0..b[0].num_rows())
            .map(|i| {
                use datafusion::arrow::array::{Array, StringArray, TimestampMicrosecondArray};
                let s = |c: usize| {
                    b[0].column(c)
                        .as_any()
                        .downcast_ref::<StringArray>()
                        .unwrap()
                        .value(i)
                        .to_string()
                };
                let end = b[0]
                    .column(1)
                    .as_any()
                    .downcast_ref::<TimestampMicrosecondArray>()
                    .unwrap();
                assert!(!end.is_null(i));
                (s(0), end.value(i), s(2))
            })
            .collect();
        rows
    };
    let first = read().await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(read().await, first, "reasons moved between two queries");
    assert_eq!(first.len(), 2, "{first:?}");
    let jan1 = |y: i32| Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap();
    for (table, end, reason) in &first {
        let end = Utc.timestamp_micros(*end).unwrap();
        let from = if table == "byday" {
            // The rule as documented: eligible once January 1 of the previous year >= end.
            let year = (end.year()..).find(|y| jan1(y - 1) >= end).unwrap();
            jan1(year)
        } else {
            end + chrono::Duration::days(90)
        };
        let want = format!("eligible from {}", from.format("%Y-%m-%dT%H:%M:%SZ"));
        assert!(reason.starts_with("not yet: held by"), "{table}: {reason}");
        assert!(
            reason.ends_with(&want),
            "{table}: {reason} should end with {want}"
        );
    }
    env.cleanup().await;
}

/// Every query of the runbook in docs/archiver.md runs (the docs quote these texts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runbook_queries_run() {
    let env = env("sysrunbook").await;
    for sql in RUNBOOK {
        env.sql(sql).await;
    }
    env.cleanup().await;
}

const RUNBOOK: [&str; 7] = [
    "SELECT table_id, partition, bucket_key, state, eligible, reason
FROM pulpitum_buckets
WHERE NOT (state = 'archived' AND hot_rows_deleted)
ORDER BY bucket_end LIMIT 50",
    "SELECT table_id, state, eligible, count(*) AS buckets, min(bucket_end) AS oldest_end
FROM pulpitum_buckets GROUP BY table_id, state, eligible ORDER BY table_id, state",
    "SELECT table_id, partition, bucket_key, generation, outcome, error, started_at
FROM pulpitum_jobs
WHERE outcome IN ('deferred', 'failed', 'lease_lost')
  AND started_at >= now() - INTERVAL '1 day'
ORDER BY started_at DESC LIMIT 20",
    "SELECT table_id, partition, bucket_key, generation, lease_expires_at
FROM pulpitum_buckets WHERE state = 'archiving' AND lease_expires_at < now()",
    "SELECT * FROM pulpitum_jobs WHERE outcome = 'abandoned' ORDER BY started_at DESC LIMIT 20",
    "SELECT table_id, kind, outcome, count(*), sum(rows), sum(bytes)
FROM pulpitum_jobs WHERE started_at >= now() - INTERVAL '1 hour'
GROUP BY table_id, kind, outcome",
    "SELECT table_id, archive_after, format, cleanup_delay, paused, store_paused FROM pulpitum_tables",
];
