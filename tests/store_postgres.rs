//! The hot-store conformance suite and the PostgreSQL-only checks (migrations, the v3 rule,
//! strict decoding) against a real PostgreSQL. Each test runs in its own fresh schema, so
//! the tests run in parallel. Server: `PULPITUM_TEST_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`.

#[macro_use]
mod conformance;

use std::sync::Arc;

use pulpitum::model::{
    BucketId, BucketStrategy, EventTime, PartitionKey, Record, ScanBounds, SortKey, TableId,
};
use pulpitum::store::migrate::{self, Migration, MIGRATIONS};
use pulpitum::store::postgres::{PgStore, PgStoreConfig};
use pulpitum::store::{
    BucketFilter, FirstPage, HotStore, PageRequest, StoreError, TableDefinition,
};

fn url() -> String {
    std::env::var("PULPITUM_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

fn fresh_schema() -> String {
    format!("pulpitum_test_{:016x}", rand::random::<u64>())
}

/// A store in a new, empty schema of its own.
async fn fresh_store() -> Arc<PgStore> {
    let config = PgStoreConfig::new(url())
        .with_schema(fresh_schema())
        .with_pool_size(12);
    Arc::new(
        PgStore::connect_with(config)
            .await
            .expect("PostgreSQL must be reachable"),
    )
}

macro_rules! conformance_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let store = fresh_store().await;
                conformance::$case(store.clone()).await;
                store.drop_schema().await.unwrap();
            }
        )*
    };
}

every_case!(conformance_cases);

async fn ledger(store: &PgStore) -> Vec<(i32, String)> {
    let client = store.raw_client().await.unwrap();
    client
        .query(
            "SELECT version, checksum FROM pulpitum_v4_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn expected_ledger() -> Vec<(i32, String)> {
    MIGRATIONS
        .iter()
        .map(|m| (m.version, m.checksum()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_run_twice_and_concurrently() {
    let schema = fresh_schema();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let schema = schema.clone();
        tasks.push(tokio::spawn(async move {
            let store = PgStore::connect_with_schema(&url(), &schema).await.unwrap();
            store.migrate().await.unwrap();
            store
        }));
    }
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(t.await.unwrap());
    }
    let store = &stores[0];
    assert_eq!(ledger(store).await, expected_ledger());
    let client = store.raw_client().await.unwrap();
    assert!(
        migrate::migrate(&client).await.unwrap().is_empty(),
        "nothing left to record"
    );
    store.migrate().await.unwrap();
    assert_eq!(ledger(store).await, expected_ledger());
    let tables: Vec<String> = client
        .query(
            "SELECT table_name::TEXT FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        tables,
        [
            "pulpitum_v4_bucket_metadata",
            "pulpitum_v4_records",
            "pulpitum_v4_schema_migrations",
            "pulpitum_v4_tables"
        ]
    );
    store.drop_schema().await.unwrap();
}

#[tokio::test]
async fn v3_tables_are_never_touched() {
    let store = fresh_store().await;
    let client = store.raw_client().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE pulpitum_v3_bucket_metadata (table_id TEXT, partition_key BYTEA, bucket_key TEXT, \
               state TEXT, generation INT8, PRIMARY KEY (table_id, partition_key, bucket_key)); \
             CREATE TABLE pulpitum_v3_records (table_id TEXT, partition_key BYTEA, bucket_key TEXT, \
               event_time TIMESTAMPTZ, sort_key BYTEA, value BYTEA, \
               PRIMARY KEY (table_id, partition_key, bucket_key, event_time, sort_key)); \
             INSERT INTO pulpitum_v3_bucket_metadata VALUES \
               ('chat', '\\x01', '2020', 'archived', 3), ('chat', '\\x02', '2021', 'hot', 0); \
             INSERT INTO pulpitum_v3_records VALUES \
               ('chat', '\\x02', '2021', '2021-01-01T00:00:00Z', '\\x0a', 'hello'), \
               ('chat', '\\x02', '2021', '2021-01-02T00:00:00Z', '\\x0b', 'world');",
        )
        .await
        .unwrap();
    let dump = || async {
        let meta: Vec<String> = client
            .query("SELECT row_to_json(m)::TEXT FROM pulpitum_v3_bucket_metadata m ORDER BY partition_key", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let recs: Vec<String> = client
            .query(
                "SELECT row_to_json(r)::TEXT FROM pulpitum_v3_records r ORDER BY event_time",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        (meta, recs)
    };
    let before = dump().await;
    assert_eq!((before.0.len(), before.1.len()), (2, 2));
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    // v4 writes do not leak into v3 either.
    let def = TableDefinition::new(
        TableId::new("chat").unwrap(),
        BucketStrategy::CalendarYearUtc,
        "chat",
    );
    store.register_table(&def).await.unwrap();
    let r = Record {
        partition_key: PartitionKey::new(vec![2]).unwrap(),
        event_time: EventTime::parse_rfc3339("2021-01-03T00:00:00Z").unwrap(),
        sort_key: SortKey::new(vec![0x0c]).unwrap(),
        value: b"v4".to_vec(),
    };
    store.append(&def.table_id, &r).await.unwrap();
    assert_eq!(dump().await, before);
    store.drop_schema().await.unwrap();
}

#[tokio::test]
async fn edited_or_unknown_migrations_are_refused() {
    let store = fresh_store().await;
    store.migrate().await.unwrap();
    let client = store.raw_client().await.unwrap();
    let mut edited: Vec<Migration> = MIGRATIONS.to_vec();
    edited[1].sql = "CREATE TABLE IF NOT EXISTS pulpitum_v4_bucket_metadata (table_id TEXT)";
    match migrate::apply(&client, &edited).await {
        Err(StoreError::Migration(msg)) => assert!(msg.contains("migration 2"), "{msg}"),
        x => panic!("expected a migration error, got {x:?}"),
    }
    // A version recorded without a compatibility rule (by hand, or by a build without the
    // rule) counts as breaking and is refused too.
    client
        .execute(
            "INSERT INTO pulpitum_v4_schema_migrations (version, name, checksum) VALUES (99, 'future', 'x')",
            &[],
        )
        .await
        .unwrap();
    assert!(matches!(
        store.migrate().await,
        Err(StoreError::Migration(_))
    ));
    store.drop_schema().await.unwrap();
}

/// An older build after an upgrade (simulated: today's code against a ledger where newer
/// builds recorded migrations it does not know): it keeps running past additive migrations
/// and past breaking ones it was written for, and stops at a breaking migration that
/// requires a later build, naming both versions. A ledger from before the compatibility
/// column gets the column.
#[tokio::test]
async fn an_older_build_runs_after_additive_migrations_and_stops_at_a_breaking_one() {
    let store = fresh_store().await;
    let client = store.raw_client().await.unwrap();
    // The ledger as the build before the compatibility rule left it.
    store.migrate().await.unwrap();
    client
        .batch_execute("ALTER TABLE pulpitum_v4_schema_migrations DROP COLUMN requires_version")
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let ours = migrate::schema_version();
    let requires: Vec<Option<i32>> = client
        .query(
            "SELECT requires_version FROM pulpitum_v4_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(requires.len(), ours as usize);
    let record = |version: i32, name: &'static str, requires: i32| {
        let client = &client;
        async move {
            client
                .execute(
                    "INSERT INTO pulpitum_v4_schema_migrations (version, name, checksum, requires_version) \
                     VALUES ($1, $2, 'newer', $3)",
                    &[&version, &name, &requires],
                )
                .await
                .unwrap();
        }
    };
    record(ours + 1, "newer_additive", 0).await;
    record(ours + 2, "newer_prepared_for", ours).await;
    store.migrate().await.unwrap();
    let def = TableDefinition::new(
        TableId::new("chat").unwrap(),
        BucketStrategy::CalendarYearUtc,
        "chat",
    );
    store.register_table(&def).await.unwrap();
    // A session opens too (it migrates first).
    let archive = Arc::new(pulpitum::archive::ArchiveStore::from_url("memory://").unwrap());
    pulpitum::session::session(store.clone(), archive.clone(), Default::default())
        .await
        .unwrap();

    record(ours + 3, "newer_breaking", ours + 3).await;
    match store.migrate().await {
        Err(StoreError::Migration(msg)) => assert!(
            msg.contains(&format!("migration {} (newer_breaking)", ours + 3))
                && msg.contains(&format!("schema version {} or later", ours + 3))
                && msg.contains(&format!("schema version is {ours}")),
            "{msg}"
        ),
        x => panic!("expected a migration error, got {x:?}"),
    }
    match pulpitum::session::session(store.clone(), archive, Default::default()).await {
        Err(e) => assert!(e.to_string().contains("newer_breaking"), "{e}"),
        Ok(_) => panic!("a session opened past a breaking migration"),
    }
    store.drop_schema().await.unwrap();
}

#[tokio::test]
async fn corrupt_rows_are_reported_not_guessed() {
    let store = fresh_store().await;
    store.migrate().await.unwrap();
    let tbl = TableId::new("events").unwrap();
    store
        .register_table(&TableDefinition::new(
            tbl.clone(),
            BucketStrategy::CalendarYearUtc,
            "raw",
        ))
        .await
        .unwrap();
    let r = Record {
        partition_key: PartitionKey::new(vec![1]).unwrap(),
        event_time: EventTime::parse_rfc3339("2021-01-03T00:00:00Z").unwrap(),
        sort_key: SortKey::new(vec![1]).unwrap(),
        value: b"v".to_vec(),
    };
    store.append(&tbl, &r).await.unwrap();
    let client = store.raw_client().await.unwrap();
    let head = PageRequest {
        bounds: ScanBounds::all(),
        descending: true,
        limit: 10,
        include_value: true,
    };
    let head_is_corrupt = || async {
        matches!(
            store
                .read_head(&tbl, &r.partition_key, None, None, &head)
                .await,
            Err(StoreError::Corrupt(_))
        )
    };
    assert!(store
        .read_head(&tbl, &r.partition_key, None, None, &head)
        .await
        .is_ok());
    for (column, bad) in [
        ("bucket_key", "year:21"),
        ("bucket_strategy", "calendar_week_utc"),
        ("bucket_key", "year:2022"),
    ] {
        client
            .execute(
                &format!("UPDATE pulpitum_v4_bucket_metadata SET {column} = $1"),
                &[&bad],
            )
            .await
            .unwrap();
        assert!(
            matches!(
                store.list_buckets(&tbl, &BucketFilter::default()).await,
                Err(StoreError::Corrupt(_))
            ),
            "{column} = {bad} must be reported as corrupt"
        );
        // The head statement lists keys and routes only; a key that does not parse or does
        // not match the stored start is corrupt there too (the strategy column it does not
        // read).
        if column == "bucket_key" {
            assert!(head_is_corrupt().await, "{column} = {bad}: read_head");
        }
        client
            .execute(
                "UPDATE pulpitum_v4_bucket_metadata SET bucket_key = 'year:2021', bucket_strategy = 'calendar_year_utc'",
                &[],
            )
            .await
            .unwrap();
    }
    assert_eq!(
        store
            .list_buckets(&tbl, &BucketFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );
    // A published route without its object key, or a state this build does not know.
    for (state, object_key) in [("archived", None), ("frozen", Some("k"))] {
        client
            .execute(
                "ALTER TABLE pulpitum_v4_bucket_metadata DROP CONSTRAINT IF EXISTS pulpitum_v4_bucket_metadata_state_check",
                &[],
            )
            .await
            .unwrap();
        client
            .execute(
                "UPDATE pulpitum_v4_bucket_metadata SET state = $1, object_key = $2",
                &[&state, &object_key],
            )
            .await
            .unwrap();
        assert!(matches!(
            store.list_buckets(&tbl, &BucketFilter::default()).await,
            Err(StoreError::Corrupt(_))
        ));
        assert!(
            head_is_corrupt().await,
            "state {state} with object key {object_key:?}"
        );
    }
    client
        .execute(
            "UPDATE pulpitum_v4_bucket_metadata SET state = 'hot', object_key = NULL",
            &[],
        )
        .await
        .unwrap();
    // A record with a sort key longer than any valid key, or an infinite time: corrupt in a
    // page and in the head's arrays alike, and fine again once repaired.
    let bucket = BucketId::of_record(&tbl, BucketStrategy::CalendarYearUtc, &r);
    let page_is_corrupt = || async {
        matches!(
            store.read_page(&bucket, &head).await,
            Err(StoreError::Corrupt(_))
        )
    };
    let long_key = vec![7u8; 600];
    let breaks: [(&str, &(dyn tokio_postgres::types::ToSql + Sync)); 2] = [
        ("UPDATE pulpitum_v4_records SET sort_key = $1", &long_key),
        (
            "UPDATE pulpitum_v4_records SET event_time = 'infinity'::TIMESTAMPTZ WHERE $1::INT8 = 0",
            &0i64,
        ),
    ];
    for (sql, param) in breaks {
        client.execute(sql, &[param]).await.unwrap();
        assert!(head_is_corrupt().await, "{sql}: read_head");
        assert!(page_is_corrupt().await, "{sql}: read_page");
        client
            .execute(
                "UPDATE pulpitum_v4_records SET sort_key = $1, event_time = $2",
                &[&r.sort_key.as_bytes(), &r.event_time.to_datetime()],
            )
            .await
            .unwrap();
        let page = store
            .read_head(&tbl, &r.partition_key, None, None, &head)
            .await
            .unwrap();
        assert!(
            matches!(page.first, FirstPage::Hot { ref rows, .. } if rows.num_rows() == 1),
            "repaired after {sql}"
        );
    }
    client
        .execute(
            "UPDATE pulpitum_v4_tables SET bucket_strategy = 'weekly'",
            &[],
        )
        .await
        .unwrap();
    assert!(matches!(store.tables().await, Err(StoreError::Corrupt(_))));
    store.drop_schema().await.unwrap();
}

#[tokio::test]
async fn bad_configuration_is_typed() {
    assert!(matches!(
        PgStore::connect_with_schema(&url(), "Robert'); DROP TABLE x;--").await,
        Err(StoreError::Config(_))
    ));
    assert!(matches!(
        PgStore::connect("not a url at all").await,
        Err(StoreError::Config(_))
    ));
    assert!(matches!(
        PgStore::connect("postgres://postgres@127.0.0.1:1/test").await,
        Err(StoreError::Backend { .. })
    ));
    // A store without a schema never drops one.
    let store = PgStore::connect(&url()).await.unwrap();
    assert!(matches!(
        store.drop_schema().await,
        Err(StoreError::Config(_))
    ));
}
