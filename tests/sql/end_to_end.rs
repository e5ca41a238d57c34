//! The basic path: CREATE EXTERNAL TABLE, INSERT, SELECT with pushdown, EXPLAIN.

use crate::common::*;

const CREATE: &str = "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
    OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_insert_select_and_reopen() {
    let env = Env::new("e2e").await;
    env.sql(CREATE).await;
    let n = env
        .sql(
            "INSERT INTO chat VALUES \
             (1, TIMESTAMP '2024-05-01T10:00:00Z', 1, 'a'), \
             (1, TIMESTAMP '2024-05-01T11:00:00Z', 2, 'b'), \
             (1, TIMESTAMP '2024-05-02T09:00:00Z', 3, 'c'), \
             (2, TIMESTAMP '2024-05-01T10:00:00Z', -5, 'x')",
        )
        .await;
    insta::assert_snapshot!("e2e_insert_count", pretty(&n));
    let out = env
        .sql("SELECT channel_id, timestamp, id, content FROM chat WHERE channel_id = 1 ORDER BY timestamp, id")
        .await;
    insta::assert_snapshot!("e2e_channel_rows", pretty(&out));
    let out = env
        .sql("SELECT channel_id, count(*) AS n FROM chat GROUP BY channel_id ORDER BY channel_id")
        .await;
    insta::assert_snapshot!("e2e_group_by", pretty(&out));
    // A new session finds the table in the registry.
    let ctx2 = env.reopen().await;
    let out = run(&ctx2, "SELECT id FROM chat WHERE channel_id = 2")
        .await
        .unwrap();
    assert_eq!(rows(&out), 1);
    let out = env.sql("EXPLAIN SELECT id FROM chat WHERE channel_id = 1 AND timestamp >= TIMESTAMP '2024-05-02T00:00:00Z' ORDER BY timestamp DESC LIMIT 1").await;
    insta::assert_snapshot!("e2e_explain_desc_limit", pretty(&out));
    let out = env
        .sql("SELECT id FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC LIMIT 2")
        .await;
    insta::assert_snapshot!("e2e_desc_limit_rows", pretty(&out));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_surface_round_trips_bytes_and_pushes_filters() {
    let env = Env::new("raw").await;
    env.sql("CREATE EXTERNAL TABLE audit STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'raw')")
        .await;
    env.sql(
        "INSERT INTO audit VALUES \
         (X'0a0b', TIMESTAMP '2024-05-01T00:00:00Z', X'', X'7b7d'), \
         (X'0a0b', TIMESTAMP '2024-05-01T00:00:00Z', X'01', X''), \
         (X'ff', TIMESTAMP '2023-05-01T00:00:00.000001Z', X'02', X'00ff')",
    )
    .await;
    let q = "SELECT partition_key, event_time, sort_key, value FROM audit \
             WHERE partition_key = X'0a0b' AND sort_key >= X'' ORDER BY event_time, sort_key";
    insta::assert_snapshot!("raw_rows", pretty(&env.sql(q).await));
    let plan = pretty(&env.sql(&format!("EXPLAIN {q}")).await);
    assert!(
        plan.contains("filters=[partition_key IN (0x0a0b), sort_key >= 0x]"),
        "{plan}"
    );
    assert!(
        !plan.contains("SortExec") && !plan.contains("FilterExec"),
        "{plan}"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_spellings_of_time_predicates_are_pushed_down() {
    let env = Env::new("spell").await;
    env.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await;
    for (q, expect) in [
        ("SELECT * FROM chat WHERE channel_id = 1 AND timestamp >= '2024-01-01T00:00:00Z'", "timestamp >= 2024-01-01T00:00:00Z"),
        ("SELECT * FROM chat WHERE channel_id = 1 AND timestamp < '2024-01-02'", "timestamp <= 2024-01-01T23:59:59.999999Z"),
        ("SELECT * FROM chat WHERE channel_id = 1 AND timestamp > now() - INTERVAL '1 day'", "timestamp >= "),
        ("SELECT * FROM chat WHERE channel_id = 1 AND timestamp = to_timestamp_micros(1704067200000000)", "timestamp <= 2024-01-01T00:00:00Z"),
    ] {
        let plan = pretty(&env.sql(&format!("EXPLAIN {q}")).await);
        assert!(plan.contains(expect) && !plan.contains("FilterExec"), "{q}\n{plan}");
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_opens_the_embedded_store_from_a_path() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let url = format!("sqlite://{}", db.display());
    let archive = format!("file://{}", dir.path().join("archive").display());
    std::fs::create_dir_all(dir.path().join("archive")).unwrap();
    // An ordinary connection neither creates the file nor migrates it: it says which step
    // is missing, and leaves nothing behind.
    let Err(e) = pulpitum::session::connect(&url, &archive).await else {
        panic!("a missing embedded file must not be created by connect")
    };
    assert!(e.to_string().contains("pulpitum migrate"), "{e}");
    assert!(!db.exists());
    // The owner's step: `migrate` (here through the session options) creates and migrates.
    let owner = pulpitum::session::SessionOptions {
        migrate: true,
        ..Default::default()
    };
    pulpitum::session::connect_with(&url, &archive, owner)
        .await
        .unwrap();
    let ctx = pulpitum::session::connect(&url, &archive).await.unwrap();
    run(
        &ctx,
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('bucket_strategy' 'calendar_month_utc')",
    )
    .await
    .unwrap();
    run(&ctx, "INSERT INTO chat VALUES (1, TIMESTAMP '2024-01-01T00:00:00Z', 1, 'a'), (1, TIMESTAMP '2024-02-01T00:00:00Z', 2, 'b')")
        .await
        .unwrap();
    // A second connection (a plain path this time) finds the table and its rows.
    let ctx = pulpitum::session::connect(db.to_str().unwrap(), &archive)
        .await
        .unwrap();
    let out = run(
        &ctx,
        "SELECT id FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC LIMIT 1",
    )
    .await
    .unwrap();
    insta::assert_snapshot!("embedded_latest", pretty(&out));
    let Err(e) = pulpitum::session::connect("mysql://x", "memory://").await else {
        panic!("mysql:// must be refused")
    };
    assert!(e.to_string().contains("scheme is not supported"), "{e}");
}
