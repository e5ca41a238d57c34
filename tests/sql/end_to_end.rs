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
    let out = env.sql("SELECT channel_id, count(*) AS n FROM chat GROUP BY channel_id ORDER BY channel_id").await;
    insta::assert_snapshot!("e2e_group_by", pretty(&out));
    // A new session finds the table in the registry.
    let ctx2 = env.reopen().await;
    let out = run(&ctx2, "SELECT id FROM chat WHERE channel_id = 2").await.unwrap();
    assert_eq!(rows(&out), 1);
    let out = env.sql("EXPLAIN SELECT id FROM chat WHERE channel_id = 1 AND timestamp >= TIMESTAMP '2024-05-02T00:00:00Z' ORDER BY timestamp DESC LIMIT 1").await;
    insta::assert_snapshot!("e2e_explain_desc_limit", pretty(&out));
    let out = env.sql("SELECT id FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC LIMIT 2").await;
    insta::assert_snapshot!("e2e_desc_limit_rows", pretty(&out));
    env.cleanup().await;
}

