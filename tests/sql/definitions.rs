//! Table definitions from SQL, on both stores: repeating a definition is a no-op with or
//! without `IF NOT EXISTS` (in the session that created it and in a new one), a different
//! definition is refused naming what differs, a column list is accepted in the spellings a
//! PostgreSQL user writes and refused naming the column otherwise, and `DROP TABLE` is
//! refused with the table still there in the next session.

use std::sync::Arc;

use datafusion::prelude::SessionContext;
use pulpitum::archive::ArchiveStore;
use pulpitum::store::embedded::SqliteStore;
use pulpitum::store::{Catalog, HotStore};

use crate::common::*;

/// The README's statement.
const README: &str = "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION ''
  OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')";

async fn ok(ctx: &SessionContext, sql: &str) {
    run(ctx, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn refused(ctx: &SessionContext, sql: &str) -> String {
    match run(ctx, sql).await {
        Ok(b) => panic!("{sql} should fail, returned {}", pretty(&b)),
        Err(e) => e,
    }
}

async fn count(ctx: &SessionContext, table: &str) -> usize {
    let b = run(ctx, &format!("SELECT * FROM {table}")).await.unwrap();
    rows(&b)
}

/// The whole behaviour against one store; `reopen` builds a fresh session over it.
async fn definitions_behave(store: Arc<dyn HotStore>) {
    let archive = Arc::new(ArchiveStore::from_url("memory://").unwrap());
    let open = || pulpitum::session::session(store.clone(), archive.clone(), Default::default());
    let ctx = open().await.unwrap();
    ok(&ctx, README).await;
    ok(
        &ctx,
        "INSERT INTO chat VALUES (7, TIMESTAMP '2026-11-30T12:00:00Z', 1, 'hello')",
    )
    .await;
    // The identical definition again: a no-op, with or without IF NOT EXISTS, in this
    // session and in a new one; the data is still there.
    ok(&ctx, README).await;
    ok(
        &ctx,
        &README.replace(
            "CREATE EXTERNAL TABLE",
            "CREATE EXTERNAL TABLE IF NOT EXISTS",
        ),
    )
    .await;
    let again = open().await.unwrap();
    ok(&again, README).await;
    assert_eq!(count(&again, "chat").await, 1);
    assert_eq!(count(&ctx, "chat").await, 1);

    // A different definition is refused naming each difference, IF NOT EXISTS or not.
    for prefix in [
        "CREATE EXTERNAL TABLE",
        "CREATE EXTERNAL TABLE IF NOT EXISTS",
    ] {
        let e = refused(
            &again,
            &format!(
                "{prefix} chat STORED AS PULPITUM LOCATION '' \
                 OPTIONS ('surface' 'raw', 'bucket_strategy' 'calendar_month_utc')"
            ),
        )
        .await;
        assert!(
            e.contains("table chat already exists with another definition")
                && e.contains("surface is chat, not raw")
                && e.contains("bucket_strategy is calendar_day_utc, not calendar_month_utc"),
            "{e}"
        );
        assert!(!e.contains("writable_buckets"), "only what differs: {e}");
        let e = refused(
            &ctx,
            &format!(
                "{prefix} chat STORED AS PULPITUM LOCATION '' \
                 OPTIONS ('bucket_strategy' 'calendar_day_utc', 'writable_buckets' '3')"
            ),
        )
        .await;
        assert!(e.contains("writable_buckets is unset, not 3"), "{e}");
    }
    let stored = store
        .table(&pulpitum::model::TableId::new("chat").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.surface, "chat");
    assert_eq!(stored.writable_buckets, None);

    // Column lists in PostgreSQL spellings.
    for (name, columns) in [
        (
            "c1",
            "(channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT)",
        ),
        (
            "c2",
            "(channel_id INT8 NOT NULL, timestamp TIMESTAMP WITH TIME ZONE NOT NULL, id INT8, content VARCHAR)",
        ),
        (
            "chat",
            "(channel_id BIGINT, \"timestamp\" TIMESTAMPTZ, id BIGINT, content TEXT)",
        ),
    ] {
        ok(
            &ctx,
            &format!(
                "CREATE EXTERNAL TABLE {name} {columns} STORED AS PULPITUM LOCATION '' \
                 OPTIONS ('bucket_strategy' 'calendar_day_utc')"
            ),
        )
        .await;
    }
    ok(
        &ctx,
        "CREATE EXTERNAL TABLE r1 (partition_key BYTEA, event_time TIMESTAMPTZ, sort_key BYTEA, value BYTEA) \
         STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'raw')",
    )
    .await;
    for (columns, names) in [
        (
            "(channel_id INT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT)",
            "column channel_id is declared INT, but the chat surface stores it as BIGINT",
        ),
        (
            "(channel_id BIGINT, timestamp DATE, id BIGINT, content TEXT)",
            "column timestamp is declared DATE",
        ),
        (
            "(channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, body TEXT)",
            "column 4 is named \"body\", but the chat surface's column 4 is \"content\"",
        ),
        (
            "(channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content BYTEA)",
            "column content is declared BYTEA, but the chat surface stores it as TEXT",
        ),
        ("(channel_id BIGINT)", "the column list has 1 column"),
    ] {
        let e = refused(
            &ctx,
            &format!(
                "CREATE EXTERNAL TABLE bad {columns} STORED AS PULPITUM LOCATION '' \
                 OPTIONS ('surface' 'chat')"
            ),
        )
        .await;
        assert!(e.contains(names), "{columns}: {e}");
    }

    // DROP TABLE is refused, and the table stays, in this session and the next. Through
    // plain `ctx.sql` DataFusion replaces the schema's refusal with its own "doesn't exist"
    // (and swallows it under IF EXISTS); `check_statement`, which the shell runs before
    // every statement, gives the reason for both.
    refused(&ctx, "DROP TABLE chat").await;
    ok(&ctx, "DROP TABLE IF EXISTS chat").await;
    assert_eq!(count(&ctx, "chat").await, 1);
    assert_eq!(count(&open().await.unwrap(), "chat").await, 1);
    for drop in ["DROP TABLE chat", "DROP TABLE IF EXISTS chat"] {
        let plan = ctx.state().create_logical_plan(drop).await.unwrap();
        let e = pulpitum::provider::factory::check_statement(&ctx, &plan)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("DROP TABLE is not supported"), "{e}");
    }
    let e = ctx.deregister_table("chat").unwrap_err().to_string();
    assert!(e.contains("DROP TABLE is not supported"), "{e}");
    // Other tables of the session are still DataFusion's to drop.
    ok(&ctx, "CREATE TABLE scratch AS SELECT 1 AS x").await;
    ok(&ctx, "DROP TABLE scratch").await;
    let e = refused(&ctx, "CREATE TABLE chat AS SELECT 1 AS x").await;
    assert!(e.contains("already exists"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_on_postgres() {
    let env = Env::new("defs").await;
    definitions_behave(env.store.clone() as Arc<dyn HotStore>).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("hot.sqlite")).unwrap();
    store.migrate().await.unwrap();
    definitions_behave(Arc::new(store)).await;
}
