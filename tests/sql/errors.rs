//! Refusals with clear errors: fenced inserts name the bucket, bad definitions name the
//! option, limits stop a query, and an archive failure after publication is returned rather
//! than answered from the retained hot rows.

use std::time::Duration;

use pulpitum::model::encode_i64;
use pulpitum::model::{BucketId, BucketStrategy, EventTime, PartitionKey, TableId};
use pulpitum::provider::QueryLimits;
use pulpitum::session::SessionOptions;
use pulpitum::store::{HotStore, Lifecycle, RoutedReads};

use crate::common::*;

const CREATE: &str = "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
    OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')";

fn bucket(channel: i64, day: &str) -> BucketId {
    BucketId {
        table_id: TableId::new("chat").unwrap(),
        partition_key: PartitionKey::new(encode_i64(channel).to_vec()).unwrap(),
        bucket_key: BucketStrategy::CalendarDayUtc
            .bucket_of(EventTime::parse_rfc3339(&format!("{day}T00:00:00Z")).unwrap()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_and_statements_are_refused_clearly() {
    let env = Env::new("errs").await;
    env.sql(CREATE).await;
    // The same definition again is a no-op (tests/sql/definitions.rs has the details).
    env.sql(&CREATE.replace(
        "CREATE EXTERNAL TABLE chat",
        "CREATE EXTERNAL TABLE IF NOT EXISTS chat",
    ))
    .await;
    let e = run(
        &env.reopen().await,
        "CREATE EXTERNAL TABLE other STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'raw', 'bucket_strategy' 'calendar_month_utc')",
    )
    .await;
    assert!(e.is_ok(), "{e:?}");
    let ctx = env.reopen().await;
    let e = run(
        &ctx,
        "CREATE EXTERNAL TABLE IF NOT EXISTS chat2 STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'colour' 'red')",
    )
    .await
    .unwrap_err();
    assert!(e.contains("unknown option \"colour\""), "{e}");
    let e = env
        .sql_err(
            "CREATE EXTERNAL TABLE t3 STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'graph')",
        )
        .await;
    assert!(e.contains("unknown surface \"graph\""), "{e}");
    let e = env
        .sql_err("CREATE EXTERNAL TABLE t4 STORED AS PULPITUM LOCATION '' OPTIONS ('bucket_strategy' 'weekly')")
        .await;
    assert!(e.contains("unknown bucket strategy \"weekly\""), "{e}");
    let e = env
        .sql_err("CREATE EXTERNAL TABLE t5 STORED AS PULPITUM LOCATION 's3://x/y' OPTIONS ('surface' 'chat')")
        .await;
    assert!(e.contains("LOCATION must be ''"), "{e}");
    let e = env
        .sql_err("CREATE EXTERNAL TABLE t6 (a INT) STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat')")
        .await;
    assert!(e.contains("the chat surface has the columns"), "{e}");
    // Redefining a registered table with another strategy, from another session, is
    // refused and names the difference.
    let fresh = Env::new("errs2").await;
    fresh.sql(CREATE).await;
    let store2 = fresh.store.clone();
    let other_ctx = pulpitum::session::session(
        store2 as std::sync::Arc<dyn HotStore>,
        fresh.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    let e = run(
        &other_ctx,
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_year_utc')",
    )
    .await
    .unwrap_err();
    assert!(
        e.contains("bucket_strategy is calendar_day_utc, not calendar_year_utc"),
        "{e}"
    );
    fresh.cleanup().await;

    let e = env.sql_err("SELECT * FROM nope").await;
    assert!(e.contains("nope") && e.contains("not found"), "{e}");
    let e = env.sql_err("SELEKT 1").await;
    assert!(e.to_lowercase().contains("sql"), "{e}");
    let e = env
        .sql_err("INSERT INTO chat VALUES (1, TIMESTAMP '2024-01-01T00:00:00Z', 1, NULL)")
        .await;
    assert!(e.to_lowercase().contains("null"), "{e}");
    let e = env
        .sql_err("INSERT OVERWRITE chat VALUES (1, TIMESTAMP '2024-01-01T00:00:00Z', 1, 'x')")
        .await;
    assert!(e.contains("append-only"), "{e}");
    let e = env
        .sql_err("INSERT INTO chat VALUES (1, TIMESTAMP '1800-01-01T00:00:00Z', 1, 'x')")
        .await;
    assert!(e.contains("outside the supported range"), "{e}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_into_a_fenced_bucket_fails_naming_it() {
    let env = Env::new("fence").await;
    env.sql(CREATE).await;
    env.sql("INSERT INTO chat VALUES (5, TIMESTAMP '2024-02-03T10:00:00Z', 1, 'a')")
        .await;
    let b = bucket(5, "2024-02-03");
    env.store
        .claim(&b, Duration::from_secs(300))
        .await
        .unwrap()
        .expect("claim");
    let e = env
        .sql_err(
            "INSERT INTO chat VALUES (5, TIMESTAMP '2024-02-04T10:00:00Z', 2, 'ok'), \
             (5, TIMESTAMP '2024-02-03T11:00:00Z', 3, 'fenced')",
        )
        .await;
    assert!(e.contains(&b.to_string()) && e.contains("archiving"), "{e}");
    // The statement's batch was atomic: the row for the open bucket did not commit either.
    let n = env
        .sql("SELECT count(*) FROM chat WHERE channel_id = 5")
        .await;
    insta::assert_snapshot!("fenced_insert_count", pretty(&n));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_limits_stop_queries_with_clear_errors() {
    let opts = SessionOptions {
        limits: QueryLimits {
            max_rows: Some(5),
            max_bytes: None,
            max_duration: None,
        },
        ..SessionOptions::default()
    };
    let env = Env::with_options("limits", opts).await;
    env.sql(CREATE).await;
    let values: Vec<String> = (0..10)
        .map(|i| format!("(1, TIMESTAMP '2024-02-03T10:00:0{i}Z', {i}, 'm{i}')"))
        .collect();
    env.sql(&format!("INSERT INTO chat VALUES {}", values.join(", ")))
        .await;
    // Within the limit.
    assert_eq!(
        rows(
            &env.sql("SELECT * FROM chat WHERE channel_id = 1 LIMIT 5")
                .await
        ),
        5
    );
    let e = env.sql_err("SELECT * FROM chat WHERE channel_id = 1").await;
    assert!(e.contains("max_rows = 5"), "{e}");

    let opts = SessionOptions {
        limits: QueryLimits {
            max_rows: None,
            max_bytes: Some(100),
            max_duration: None,
        },
        ..SessionOptions::default()
    };
    let ctx = pulpitum::session::session(
        env.store.clone() as std::sync::Arc<dyn HotStore>,
        env.archive.clone(),
        opts,
    )
    .await
    .unwrap();
    let e = run(&ctx, "SELECT * FROM chat").await.unwrap_err();
    assert!(e.contains("max_bytes = 100"), "{e}");

    let opts = SessionOptions {
        limits: QueryLimits {
            max_rows: None,
            max_bytes: None,
            max_duration: Some(Duration::from_nanos(1)),
        },
        ..SessionOptions::default()
    };
    let ctx = pulpitum::session::session(
        env.store.clone() as std::sync::Arc<dyn HotStore>,
        env.archive.clone(),
        opts,
    )
    .await
    .unwrap();
    let e = run(&ctx, "SELECT * FROM chat").await.unwrap_err();
    assert!(e.contains("max_duration"), "{e}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_errors_after_publication_are_returned_not_papered_over() {
    let env = Env::new("arcerr").await;
    env.sql(CREATE).await;
    env.sql("INSERT INTO chat VALUES (9, TIMESTAMP '2024-02-03T10:00:00Z', 1, 'a'), (9, TIMESTAMP '2024-02-03T11:00:00Z', 2, 'b')")
        .await;
    let b = bucket(9, "2024-02-03");
    let mut loaded = crate::dataset::Loaded::default();
    // Published, hot rows retained (no cleanup).
    crate::dataset::archive(
        &env,
        &b,
        pulpitum::archive::PayloadFormat::Parquet,
        false,
        &mut loaded,
    )
    .await;
    assert_eq!(
        rows(&env.sql("SELECT * FROM chat WHERE channel_id = 9").await),
        2
    );
    // Remove the payload: the query must fail, although the hot rows still exist.
    let meta = env.store.bucket(&b).await.unwrap().unwrap();
    let pulpitum::store::BucketState::Archived { object_key, .. } = meta.state else {
        panic!("not archived: {meta:?}")
    };
    let manifest = env.archive.read_manifest(&object_key, &b).await.unwrap();
    env.archive
        .delete_object(&manifest.payload_key)
        .await
        .unwrap();
    let ctx = env.reopen().await;
    let e = run(&ctx, "SELECT * FROM chat WHERE channel_id = 9")
        .await
        .unwrap_err();
    assert!(e.contains(&b.to_string()), "{e}");
    env.cleanup().await;
}
