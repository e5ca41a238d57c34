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
use pulpitum::store::postgres::migrate::{self, Migration, MIGRATIONS};
use pulpitum::store::postgres::{PgStore, PgStoreConfig};
use pulpitum::store::{
    Appends, BucketFilter, Catalog, HotPage, Lifecycle, PageRequest, RoutedReads, StoreError,
    TableDefinition,
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

/// The tables of `schema`, by name.
async fn tables_of(client: &tokio_postgres::Client, schema: &str) -> Vec<String> {
    client
        .query(
            "SELECT table_name::TEXT FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
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
    assert_eq!(
        tables_of(&client, &schema).await,
        [
            "pulpitum_v4_bucket_metadata",
            "pulpitum_v4_compaction_claims",
            "pulpitum_v4_gc_prefixes",
            "pulpitum_v4_jobs",
            "pulpitum_v4_policies",
            "pulpitum_v4_readers",
            "pulpitum_v4_records",
            "pulpitum_v4_retired_objects",
            "pulpitum_v4_row_masks",
            "pulpitum_v4_schema_migrations",
            "pulpitum_v4_segment_routes",
            "pulpitum_v4_store_control",
            "pulpitum_v4_table_schemas",
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
            matches!(page.first, HotPage::Hot { ref rows, .. } if rows.num_rows() == 1),
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

// ---------------------------------------------------------------------------------------
// Session checks, version-chosen settings and first-start races (issue 15, items 10, 14, 15)

/// Migrates, registers a daily table `events` and appends one record to it.
async fn one_appended_record(store: &PgStore) -> (TableId, Record) {
    store.migrate().await.unwrap();
    let tbl = TableId::new("events").unwrap();
    let def = TableDefinition::new(tbl.clone(), BucketStrategy::CalendarDayUtc, "raw");
    store.register_table(&def).await.unwrap();
    let rec = Record {
        partition_key: PartitionKey::new(b"p".to_vec()).unwrap(),
        event_time: EventTime::parse_rfc3339("2024-05-01T00:00:00Z").unwrap(),
        sort_key: SortKey::new(b"a".to_vec()).unwrap(),
        value: b"v".to_vec(),
    };
    store.append(&tbl, &rec).await.unwrap();
    (tbl, rec)
}

/// A stand-in for a connection pooler that drops the startup `options` parameter (as
/// pgbouncer does with `ignore_startup_parameters = options`): it rewrites the startup
/// packet without it and then forwards bytes both ways. Returns a URL that connects through
/// it as `user`.
async fn options_dropping_proxy(user: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    let pg: tokio_postgres::Config = url().parse().unwrap();
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let host = match pg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_string(),
    };
    let dbname = pg.get_dbname().unwrap_or("test").to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = format!("{host}:{port}");
            tokio::spawn(async move {
                let mut server = TcpStream::connect(upstream).await?;
                loop {
                    let len = client.read_i32().await? as usize;
                    let mut body = vec![0u8; len - 4];
                    client.read_exact(&mut body).await?;
                    // SSLRequest: refuse TLS and wait for the real startup packet.
                    if body[..4] == 80_877_103i32.to_be_bytes() {
                        client.write_all(b"N").await?;
                        continue;
                    }
                    let mut out = body[..4].to_vec();
                    let fields: Vec<&[u8]> = body[4..].split(|b| *b == 0).collect();
                    for pair in fields.chunks(2) {
                        if let [key, value] = pair {
                            if !key.is_empty() && *key != b"options" {
                                out.extend_from_slice(key);
                                out.push(0);
                                out.extend_from_slice(value);
                                out.push(0);
                            }
                        }
                    }
                    out.push(0);
                    server
                        .write_all(&((out.len() + 4) as i32).to_be_bytes())
                        .await?;
                    server.write_all(&out).await?;
                    break;
                }
                tokio::io::copy_bidirectional(&mut client, &mut server)
                    .await
                    .map(|_| ())
            });
        }
    });
    format!("postgres://{user}@{local}/{dbname}")
}

/// The fence needs every session to default to SERIALIZABLE. When the startup option that
/// says so is dropped on the way (a pooler), the server's default (READ COMMITTED here) is
/// refused with a typed error naming the setting and its value, and so is a session whose
/// schema is not the configured one; a role whose own defaults are right works through the
/// same pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_weaker_than_serializable_is_refused() {
    // A plain connection, without the store's startup options.
    let (admin, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let server_default: String = admin
        .query_one("SHOW default_transaction_isolation", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(server_default, "read committed", "the server's own default");

    let schema = fresh_schema();
    let through_pooler = options_dropping_proxy("postgres").await;
    // Without a schema: the isolation is what the check finds wrong.
    match PgStore::connect(&through_pooler).await {
        Err(StoreError::UnsafeSession { setting, value, .. }) => {
            assert_eq!(setting, "default_transaction_isolation");
            assert_eq!(value, "read committed");
        }
        other => panic!("a READ COMMITTED session must be refused, got {other:?}"),
    }
    // The error says what to do and never echoes the URL.
    let err = PgStore::connect(&through_pooler)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("default_transaction_isolation") && err.contains("read committed"),
        "{err}"
    );

    // A role whose defaults are serializable and the store's schema works through it.
    let role = format!("pulpitum_role_{:08x}", rand::random::<u32>());
    let db: String = admin
        .query_one("SELECT current_database()::TEXT", &[])
        .await
        .unwrap()
        .get(0);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT CREATE ON DATABASE {db} TO {role}; \
             ALTER ROLE {role} SET default_transaction_isolation = 'serializable'"
        ))
        .await
        .unwrap();
    let as_role = options_dropping_proxy(&role).await;
    // Serializable, but the search path (also a startup option) was dropped too.
    match PgStore::connect_with_schema(&as_role, &schema).await {
        Err(StoreError::UnsafeSession {
            setting, required, ..
        }) => {
            assert_eq!(setting, "search_path");
            assert_eq!(required, schema);
        }
        other => panic!("a session in another schema must be refused, got {other:?}"),
    }
    admin
        .batch_execute(&format!("ALTER ROLE {role} SET search_path = {schema}"))
        .await
        .unwrap();
    let store = PgStore::connect_with_schema(&as_role, &schema)
        .await
        .unwrap();
    one_appended_record(&store).await;
    let isolation: String = store
        .raw_client()
        .await
        .unwrap()
        .query_one("SHOW default_transaction_isolation", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(isolation, "serializable");
    store.drop_schema().await.unwrap();
    drop(store);
    admin
        .batch_execute(&format!(
            "REVOKE CREATE ON DATABASE {db} FROM {role}; DROP OWNED BY {role}; DROP ROLE {role}"
        ))
        .await
        .unwrap();
}

/// `plan_cache_mode` is no longer a startup option (an older CockroachDB refuses the whole
/// connection for it): it is set after connecting, by version, and only when asked for; so
/// is `jit = off` (PostgreSQL only).
#[tokio::test]
async fn generic_plans_are_set_after_connecting_by_version() {
    for (generic, want) in [(true, "force_generic_plan"), (false, "auto")] {
        let schema = fresh_schema();
        let config = PgStoreConfig::new(url())
            .with_schema(schema)
            .with_generic_plans(generic);
        let store = PgStore::connect_with(config).await.unwrap();
        let client = store.raw_client().await.unwrap();
        let mode: String = client
            .query_one("SHOW plan_cache_mode", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(mode, want, "generic_plans {generic}");
        // JIT off either way: a generic plan of a short statement on a large registry
        // passes jit_above_cost, and compiling cost several times the statement.
        let jit: String = client.query_one("SHOW jit", &[]).await.unwrap().get(0);
        assert_eq!(jit, "off", "generic_plans {generic}");
        drop(client);
        store.drop_schema().await.unwrap();
    }
}

/// Many processes starting at once on a schema that does not exist yet all connect: the
/// losers of the `CREATE SCHEMA` race retry and find it present.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_starts_share_one_new_schema() {
    for _ in 0..4 {
        let schema = fresh_schema();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let schema = schema.clone();
                tokio::spawn(async move {
                    let config = PgStoreConfig::new(url())
                        .with_schema(schema)
                        .with_pool_size(1);
                    PgStore::connect_with(config).await
                })
            })
            .collect();
        let mut stores = Vec::new();
        for t in tasks {
            stores.push(t.await.unwrap().expect("every concurrent start connects"));
        }
        stores[0].drop_schema().await.unwrap();
    }
}

/// The hot-path reads send no correlated LATERAL ... LIMIT (CockroachDB decorrelates it into a
/// scan of the whole partition): the statements a session prepared for `read_page`,
/// `read_head` and `snapshot_page` are read back from the server.
#[tokio::test]
async fn hot_path_reads_send_no_correlated_limit() {
    let config = PgStoreConfig::new(url())
        .with_schema(fresh_schema())
        .with_pool_size(1);
    let store = PgStore::connect_with(config).await.unwrap();
    let (tbl, rec) = one_appended_record(&store).await;
    let p = rec.partition_key.clone();
    let bucket = BucketId::of_record(&tbl, BucketStrategy::CalendarDayUtc, &rec);
    let page = PageRequest {
        bounds: ScanBounds::all(),
        descending: true,
        limit: 10,
        include_value: true,
    };
    store.read_page(&bucket, &page).await.unwrap();
    store.read_head(&tbl, &p, None, None, &page).await.unwrap();
    let claim = store
        .claim(&bucket, std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.snapshot_page(&claim, None, 10).await.unwrap(), [rec]);
    let prepared: Vec<String> = store
        .raw_client()
        .await
        .unwrap()
        .query("SELECT statement FROM pg_prepared_statements", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let reads: Vec<&String> = prepared
        .iter()
        .filter(|s| s.contains("pulpitum_v4_records") && s.contains("ORDER BY"))
        .collect();
    assert!(
        reads.len() >= 3,
        "the three reads were prepared: {prepared:#?}"
    );
    for sql in reads {
        assert!(!sql.to_uppercase().contains("LATERAL"), "{sql}");
    }
    store.drop_schema().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Compaction: a switch larger than one statement (docs/segments.md, section 6)

/// Buckets in the large switch tests: more than two of the store's 5,000-bucket statements.
/// A migrated store with one daily table `name` and a raw connection to fill its registry
/// with SQL (what lets a test afford hundreds of thousands of buckets).
async fn registry_of(name: &str) -> (Arc<PgStore>, TableId, deadpool_postgres::Object) {
    let store = fresh_store().await;
    store.migrate().await.unwrap();
    let tbl = TableId::new(name).unwrap();
    let def = TableDefinition::new(tbl.clone(), BucketStrategy::CalendarDayUtc, "raw");
    store.register_table(&def).await.unwrap();
    let client = store.raw_client().await.unwrap();
    (store, tbl, client)
}

const MANY: usize = 12_000;

/// A switch of thousands of buckets spans several statements in one transaction: a refusal
/// names a bucket deep in a later statement's share and writes nothing; the full switch
/// moves every route and retires every source at once. The buckets are written with SQL
/// (archived and cleaned, as the lifecycle would leave them), which is what lets this test
/// afford thousands of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_of_thousands_of_buckets_is_one_transaction() {
    use pulpitum::model::BucketKey;
    use pulpitum::store::{Compaction, RouteSwitch};

    let (store, tbl, client) = registry_of("big").await;
    client
        .execute(
            "INSERT INTO pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_key, \
               bucket_strategy, bucket_start, bucket_end, state, generation, object_key, \
               hot_deleted, published_at) \
             SELECT 'big', convert_to('p' || lpad(i::TEXT, 6, '0'), 'UTF8'), 'day:2024-03-01', \
               'calendar_day_utc', '2024-03-01T00:00:00Z', '2024-03-02T00:00:00Z', 'archived', 2, \
               'src/' || i::TEXT || '/manifest.json', true, now() \
             FROM generate_series(1, $1::INT8) AS i",
            &[&(MANY as i64)],
        )
        .await
        .unwrap();
    let key = BucketKey::parse(BucketStrategy::CalendarDayUtc, "day:2024-03-01").unwrap();
    let mut switches: Vec<RouteSwitch> = (1..=MANY)
        .map(|i| RouteSwitch {
            bucket: BucketId {
                table_id: tbl.clone(),
                partition_key: PartitionKey::new(format!("p{i:06}").into_bytes()).unwrap(),
                bucket_key: key,
            },
            from_object_key: format!("src/{i}/manifest.json"),
            to_object_key: format!(
                "big/segments/month:2024-03/s{:05}-g1/manifest.json",
                i / 1000
            ),
            to_buckets: Some(1000),
        })
        .collect();
    let start = EventTime::parse_rfc3339("2024-03-01T00:00:00Z").unwrap();
    let end = EventTime::parse_rfc3339("2024-04-01T00:00:00Z").unwrap();
    let claim = store
        .claim_compaction(
            &tbl,
            "month:2024-03",
            start,
            end,
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap()
        .unwrap();
    let counts = || async {
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM pulpitum_v4_bucket_metadata \
                   WHERE object_key LIKE '%/segments/%'), \
                 (SELECT count(*) FROM pulpitum_v4_retired_objects)",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(0), row.get::<_, i64>(1))
    };

    let deep = 11_000;
    let good = std::mem::replace(
        &mut switches[deep].from_object_key,
        "src/elsewhere".to_string(),
    );
    match store.switch_routes(&claim, &switches).await {
        Err(StoreError::RouteChanged { bucket, .. }) => {
            assert_eq!(
                bucket, switches[deep].bucket,
                "the first bucket that differs"
            )
        }
        other => panic!("expected RouteChanged, got {other:?}"),
    }
    assert_eq!(counts().await, (0, 0), "a refused switch writes nothing");
    switches[deep].from_object_key = good;

    let started = std::time::Instant::now();
    let n = store.switch_routes(&claim, &switches).await.unwrap();
    let took = started.elapsed();
    assert_eq!(n, MANY as u64);
    assert_eq!(counts().await, (MANY as i64, MANY as i64));
    eprintln!("switched {MANY} buckets in one transaction in {took:?}");
    // About 0.3 s here; a plan that joins the array to the table quadratically took 36 s.
    assert!(
        took < std::time::Duration::from_secs(10),
        "a switch of {MANY} buckets took {took:?}"
    );
    store.drop_schema().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Compaction's work list at scale (docs/segments.md, "Finding work")

/// Partitions per month in the work-list test.
const WIDE: i64 = 200_000;

/// In a registry of 400,000 archived buckets (a month of 200,000 partitions already in
/// segments, then a month of 200,000 still per-bucket), finding the next due window and a
/// page of a window's partitions with work read the partial indexes of migrations 18 and
/// 19, never the table: their plans (`EXPLAIN`, with the statement's own text and
/// parameters) name a work-list index and no sequential scan, and the answers skip the
/// month already in segments. (Without the indexes PostgreSQL scans the table, or the
/// whole primary key, for both.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_list_reads_the_partial_indexes_in_a_registry_of_many_partitions() {
    use pulpitum::model::BucketKey;
    use pulpitum::store::postgres::work_list_statements;
    use pulpitum::store::Compaction;

    let (store, tbl, client) = registry_of("wide").await;
    for (day, key) in [
        ("2024-02-01", "'wide/segments/month:2024-02/s' || lpad((i / 16384)::TEXT, 5, '0') || '-g1/manifest.json'"),
        ("2024-03-01", "'wide/p' || i::TEXT || '/day:2024-03-01/g1/manifest.json'"),
    ] {
        let sql = format!(
            "INSERT INTO pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_key, \
               bucket_strategy, bucket_start, bucket_end, state, generation, object_key, \
               hot_deleted, published_at) \
             SELECT 'wide', convert_to('p' || lpad(i::TEXT, 7, '0'), 'UTF8'), 'day:' || $2::TEXT, \
               'calendar_day_utc', $2::TEXT::TIMESTAMPTZ, $2::TEXT::TIMESTAMPTZ + INTERVAL '1 day', \
               'archived', 1, {key}, true, now() \
             FROM generate_series(1, $1::INT8) AS i"
        );
        client.execute(&sql, &[&WIDE, &day]).await.unwrap();
    }
    client
        .batch_execute("ANALYZE pulpitum_v4_bucket_metadata")
        .await
        .unwrap();
    let t = |s: &str| EventTime::parse_rfc3339(s).unwrap();
    let (mar, apr) = (t("2024-03-01T00:00:00Z"), t("2024-04-01T00:00:00Z"));

    // The answers: February is in segments, March is the work.
    assert_eq!(
        store
            .next_compaction_start(&tbl, EventTime::min_supported(), t("2025-01-01T00:00:00Z"))
            .await
            .unwrap(),
        Some(mar)
    );
    let page = store
        .partitions_to_compact(&tbl, mar, apr, None, 1_024, true)
        .await
        .unwrap();
    assert_eq!(page.len(), 1_024);
    assert_eq!(page[0].as_bytes(), b"p0000001");
    let feb = BucketKey::parse_any("month:2024-02").unwrap().bounds();
    assert!(store
        .partitions_to_compact(&tbl, feb.0, feb.1, None, 10, true)
        .await
        .unwrap()
        .is_empty());

    // The plans.
    let min = EventTime::min_supported().to_datetime();
    let plans = work_list_plans(&client, work_list_statements(), min, (mar, apr)).await;
    for (name, plan) in plans {
        let text = plan.to_string();
        assert!(
            text.contains("pulpitum_v4_bucket_metadata_to_compact"),
            "{name} does not use a work-list index: {text}"
        );
        assert!(!text.contains("Seq Scan"), "{name} scans the table: {text}");
    }

    // A February segment retired while its 16,384 buckets still route to it: they are work,
    // due at once, and found from the retired segments' index through the object-key index,
    // not a scan of the registry; beside as many retired per-bucket objects as the registry
    // has buckets (every switch retires those, and they are kept for the retirement delay).
    let retired = "wide/segments/month:2024-02/s00000-g1/manifest.json";
    client
        .execute(
            "INSERT INTO pulpitum_v4_retired_objects (object_key, retired_at) \
             SELECT 'wide/p' || i::TEXT || '/day:2024-02-01/g0/manifest.json', now() \
             FROM generate_series(1, $1::INT8) AS i",
            &[&WIDE],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO pulpitum_v4_retired_objects (object_key, retired_at) VALUES ($1, now())",
            &[&retired],
        )
        .await
        .unwrap();
    client
        .batch_execute("ANALYZE pulpitum_v4_retired_objects")
        .await
        .unwrap();
    let min_t = EventTime::min_supported();
    assert_eq!(
        store
            .next_compaction_start(&tbl, min_t, min_t)
            .await
            .unwrap(),
        Some(feb.0)
    );
    let page = store
        .partitions_to_compact(&tbl, feb.0, feb.1, None, 10, false)
        .await
        .unwrap();
    assert_eq!(page.len(), 10);
    assert_eq!(page[0].as_bytes(), b"p0000001");
    let plans = work_list_plans(
        &client,
        pulpitum::store::postgres::retired_work_statements(),
        min,
        feb,
    )
    .await;
    for (name, plan) in plans {
        let text = plan.to_string();
        assert!(
            text.contains("pulpitum_v4_bucket_metadata_by_object")
                && text.contains("pulpitum_v4_retired_objects_segments"),
            "{name} does not start from the retired segments and the object-key index: {text}"
        );
        assert!(seq_scans(&plan).is_empty(), "{name} scans a table: {text}");
    }
    store.drop_schema().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// The archiver's per-cycle registry reads at scale (docs/registry-scale.md)

/// Partitions of the registry-reads test: with 20 days each, 400,000 buckets.
const REGISTRY_PARTITIONS: i64 = 20_000;

/// In a registry of 400,000 buckets (20,000 partitions x 20 days: 17 archived and cleaned,
/// one published awaiting cleanup, two hot, a few claims in flight), the reads an idle
/// archiver cycle makes (discovery, the backlog, retention's expired buckets), orphan GC's
/// reads (claims, routes among candidates) and a one-day listing across every partition
/// take their generic plans (as the store's sessions run them) from indexes that hold their
/// working set, never the archived history: cleanup discovery from the partial index of
/// migration 26, Hot discovery bounded on `bucket_end`, retention and the listing from the
/// `(table_id, bucket_end)` index of migration 27, and no plan scans the table. The answers
/// are checked too.
/// (Without migrations 26 and 27 and the implied bounds, cleanup discovery reads every archived
/// bucket's entry and the listing and retention scan the table.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archivers_cycle_reads_indexes_of_its_working_set_in_a_large_registry() {
    use pulpitum::store::{Changes, Eligibility};

    let (store, tbl, client) = registry_of("wide").await;
    client
        .execute(
            "INSERT INTO pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_key, \
               bucket_strategy, bucket_start, bucket_end, state, owner_token, generation, \
               lease_expires_at, object_key, hot_deleted, published_at) \
             SELECT 'wide', convert_to('p' || lpad(i::TEXT, 7, '0'), 'UTF8'), \
               'day:' || to_char(d, 'YYYY-MM-DD'), 'calendar_day_utc', d, d + INTERVAL '1 day', \
               CASE WHEN d >= '2024-03-19' THEN 'hot' \
                    WHEN d = '2024-03-18' AND i % 2000 = 0 THEN 'archiving' ELSE 'archived' END, \
               CASE WHEN d = '2024-03-18' AND i % 2000 = 0 THEN 'owner' END, \
               CASE WHEN d >= '2024-03-19' THEN 0 ELSE 1 END, \
               CASE WHEN d = '2024-03-18' AND i % 2000 = 0 THEN now() + INTERVAL '1 hour' END, \
               CASE WHEN d < '2024-03-18' OR (d = '2024-03-18' AND i % 2000 <> 0) \
                    THEN 'wide/p' || i::TEXT || '/day:' || to_char(d, 'YYYY-MM-DD') || '/g1/manifest.json' END, \
               d < '2024-03-18', \
               CASE WHEN d <= '2024-03-18' AND NOT (d = '2024-03-18' AND i % 2000 = 0) THEN now() END \
             FROM generate_series(1, $1::INT8) AS i \
             CROSS JOIN generate_series(TIMESTAMPTZ '2024-03-01', TIMESTAMPTZ '2024-03-20', INTERVAL '1 day') AS d",
            &[&REGISTRY_PARTITIONS],
        )
        .await
        .unwrap();
    client
        .batch_execute("VACUUM ANALYZE pulpitum_v4_bucket_metadata")
        .await
        .unwrap();
    let t = |s: &str| EventTime::parse_rfc3339(s).unwrap();

    // The answers: an idle cycle (cutoff at the start of the history) finds the published
    // buckets awaiting cleanup and nothing else; a cutoff after the hot days makes both of
    // them eligible.
    let idle = Eligibility::before(t("2024-03-01T00:00:00Z"));
    let work = store
        .discover_ready(&idle, 10, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(work.len(), 10);
    assert!(
        work.iter()
            .all(|w| w.kind == pulpitum::store::WorkKind::CleanupPending
                && w.bucket.bucket_key.to_string() == "day:2024-03-18"),
        "{work:?}"
    );
    let backlog = store.backlog(&idle).await.unwrap();
    assert_eq!((backlog.eligible, backlog.archiving), (0, 10));
    let due = Eligibility::before(t("2024-03-21T00:00:00Z"));
    assert_eq!(
        store.backlog(&due).await.unwrap().eligible,
        2 * REGISTRY_PARTITIONS as u64
    );
    assert_eq!(store.archiving_claims().await.unwrap().len(), 10);
    assert!(store
        .expired_buckets(&tbl, t("2024-03-01T00:00:00Z"), 10)
        .await
        .unwrap()
        .is_empty());
    let keys = vec![
        "wide/p7/day:2024-03-05/g1/manifest.json".to_string(),
        "wide/p7/day:2024-03-05/g2/manifest.json".to_string(),
    ];
    assert_eq!(
        store.routed_among(&keys).await.unwrap(),
        vec![keys[0].clone()]
    );
    let one_day = BucketFilter {
        from: Some(t("2024-03-10T00:00:00Z")),
        to: Some(t("2024-03-10T23:59:59Z")),
        ..BucketFilter::default()
    };
    let listed = store.list_buckets(&tbl, &one_day).await.unwrap();
    assert_eq!(listed.len(), REGISTRY_PARTITIONS as usize);
    assert!(listed
        .iter()
        .all(|m| m.id.bucket_key.to_string() == "day:2024-03-10"));

    // Without `ARCHIVER_ELIGIBLE_BEFORE` the policy bound is the end of the supported range
    // (the default deployment): the same answers, and the same bounded plans below.
    let default_rule = Eligibility {
        cutoff: idle.cutoff,
        ceiling: false,
    };
    assert_eq!(
        store
            .discover_ready(&default_rule, 10, std::time::Duration::ZERO)
            .await
            .unwrap(),
        work
    );
    assert_eq!(store.backlog(&default_rule).await.unwrap().eligible, 0);

    // The plans.
    for rule in [&idle, &default_rule] {
        let plans: std::collections::HashMap<&str, String> = store
            .explain_registry_reads(&tbl, rule, &one_day)
            .await
            .unwrap()
            .into_iter()
            .collect();
        for (name, plan) in &plans {
            // The one-row store switches and the policies are small tables, read whole.
            assert!(
                !plan.contains("Seq Scan on pulpitum_v4_bucket_metadata"),
                "{name} scans the registry:\n{plan}"
            );
        }
        let uses = |name: &str, what: &str| {
            let plan = &plans[name];
            assert!(plan.contains(what), "{name} does not read {what}:\n{plan}");
        };
        uses("discover", "pulpitum_v4_bucket_metadata_cleanup");
        uses("discover", "bucket_end <= GREATEST(");
        uses("backlog", "bucket_end <= GREATEST(");
        uses("archiving_claims", "pulpitum_v4_bucket_metadata_discovery");
        uses("routed_among", "pulpitum_v4_bucket_metadata_by_object");
        uses("expired_buckets", "pulpitum_v4_bucket_metadata_by_end");
        uses("list_buckets", "pulpitum_v4_bucket_metadata_by_end");
    }
    store.drop_schema().await.unwrap();
}

/// The JSON plans of a pair of work-list statements (the next start from `min`, the first
/// page of partitions of `window`), by name.
async fn work_list_plans(
    client: &tokio_postgres::Client,
    [(name_next, next_sql), (name_parts, parts_sql)]: [(&'static str, String); 2],
    min: chrono::DateTime<chrono::Utc>,
    window: (EventTime, EventTime),
) -> [(&'static str, serde_json::Value); 2] {
    let explain = |sql: String| format!("EXPLAIN (FORMAT JSON) {sql}");
    let empty: &[u8] = &[];
    let next = client
        .query_one(&explain(next_sql), &[&"wide", &min])
        .await
        .unwrap();
    let parts = client
        .query_one(
            &explain(parts_sql),
            &[
                &"wide",
                &empty,
                &window.0.to_datetime(),
                &window.1.to_datetime(),
                &1_024_i64,
            ],
        )
        .await
        .unwrap();
    [(name_next, next.get(0)), (name_parts, parts.get(0))]
}

/// The relations an `EXPLAIN (FORMAT JSON)` plan reads by sequential scan.
fn seq_scans(plan: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    match plan {
        serde_json::Value::Object(o) => {
            if o.get("Node Type").and_then(|v| v.as_str()) == Some("Seq Scan") {
                if let Some(r) = o.get("Relation Name").and_then(|v| v.as_str()) {
                    out.push(r.to_string());
                }
            }
            for v in o.values() {
                out.extend(seq_scans(v));
            }
        }
        serde_json::Value::Array(a) => {
            for v in a {
                out.extend(seq_scans(v));
            }
        }
        _ => {}
    }
    out
}

/// Migration 33 fences a build from before segment routes out of compaction, and 34 records
/// what such a build switched before the fence. The older build is played by its claim,
/// verbatim, and its switch's write (a route moved, no segment route recorded), against
/// a schema migrated to 32 as `pulpitum migrate` would leave it while that build still ran:
/// its switch leaves a bucket no listing across partitions names. After the remaining
/// migrations its claim fails with 42P01 before any route can move, the listing names every
/// bucket again, and this build's compaction claims the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_builds_compaction_is_fenced_and_what_it_switched_is_recorded() {
    use pulpitum::store::Compaction;

    let store = fresh_store().await;
    let client = store.raw_client().await.unwrap();
    let before_fence = MIGRATIONS.iter().position(|m| m.version == 33).unwrap();
    migrate::apply(&client, &MIGRATIONS[..before_fence])
        .await
        .unwrap();
    let tbl = TableId::new("events").unwrap();
    let def = TableDefinition::new(tbl.clone(), BucketStrategy::CalendarDayUtc, "raw");
    store.register_table(&def).await.unwrap();
    // Two channels' days, archived to objects of their own and cleaned; then the older
    // build's claim, and its switch of one of them, which records no segment route.
    client
        .execute(
            "INSERT INTO pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_key, \
               bucket_strategy, bucket_start, bucket_end, state, generation, object_key, \
               hot_deleted, published_at) \
             SELECT 'events', convert_to(p, 'UTF8'), 'day:2024-03-01', 'calendar_day_utc', \
               '2024-03-01T00:00:00Z', '2024-03-02T00:00:00Z', 'archived', 2, \
               'events/' || p || '/manifest.json', true, now() \
             FROM unnest(ARRAY['a', 'b']) AS p",
            &[],
        )
        .await
        .unwrap();
    older_builds_claim(&client, "old-build").await.unwrap();
    // Its switch of bucket a to a segment, and of bucket b to a segment recorded (by
    // migration 31) with a window that b's day lies outside: an erasure repair of such a
    // build routes to the newest object holding a bucket, which may be a segment the
    // backfill saw holding other days.
    let segment = "events/segments/month:2024-03/s00001-g1/manifest.json";
    let recorded_segment = "events/segments/month:2024-03/s00002-g1/manifest.json";
    client
        .execute(
            "INSERT INTO pulpitum_v4_segment_routes \
               (table_id, object_key, window_start, window_end, buckets) \
             VALUES ('events', $1, '2024-03-05T00:00:00Z', '2024-03-06T00:00:00Z', -1)",
            &[&recorded_segment],
        )
        .await
        .unwrap();
    for (channel, to) in [("a", segment), ("b", recorded_segment)] {
        let switched = client
            .execute(
                "UPDATE pulpitum_v4_bucket_metadata SET object_key = $1, updated_at = now() \
                 WHERE table_id = 'events' AND partition_key = convert_to($2, 'UTF8') \
                   AND bucket_key = 'day:2024-03-01' AND object_key = 'events/' || $2 || '/manifest.json'",
                &[&to, &channel],
            )
            .await
            .unwrap();
        assert_eq!(switched, 1);
    }
    client
        .execute(
            "UPDATE pulpitum_v4_compactions SET owner_token = NULL, lease_expires_at = NULL \
             WHERE table_id = 'events'",
            &[],
        )
        .await
        .unwrap();
    let march = (
        EventTime::parse_rfc3339("2024-03-01T00:00:00Z").unwrap(),
        EventTime::parse_rfc3339("2024-03-31T23:59:59Z").unwrap(),
    );
    let first_day = (
        march.0,
        EventTime::parse_rfc3339("2024-03-01T23:59:59Z").unwrap(),
    );
    let across = |store: Arc<PgStore>, interval: (EventTime, EventTime)| {
        let tbl = tbl.clone();
        async move {
            let listing = store
                .list_across(&tbl, interval.0, interval.1)
                .await
                .unwrap()
                .unwrap();
            assert!(listing.segments.is_empty(), "{:?}", listing.segments);
            let mut named: Vec<String> = listing
                .buckets
                .iter()
                .map(|m| String::from_utf8(m.id.partition_key.as_bytes().to_vec()).unwrap())
                .collect();
            named.sort();
            named
        }
    };
    assert_eq!(
        across(store.clone(), march).await,
        ["b"],
        "the damage the fence prevents: a bucket switched by the older build is listed nowhere"
    );
    assert!(
        across(store.clone(), first_day).await.is_empty(),
        "nor b on its own day, outside its segment's recorded window"
    );

    let recorded = migrate::migrate(&client).await.unwrap();
    assert_eq!(recorded, [33, 34]);
    let refused = older_builds_claim(&client, "old-build-again")
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE),
        "an older build's claim must fail once migration 33 is applied: {refused}"
    );
    assert_eq!(
        across(store.clone(), march).await,
        ["a", "b"],
        "migration 34 records the segment the older build switched to"
    );
    assert_eq!(
        across(store.clone(), first_day).await,
        ["a", "b"],
        "migration 34 widens a recorded segment's window to the buckets routed to it"
    );
    let routes: Vec<(String, i64)> = client
        .query(
            "SELECT object_key, buckets FROM pulpitum_v4_segment_routes \
             WHERE table_id = 'events' ORDER BY object_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        routes,
        [
            (segment.to_string(), -1),
            (recorded_segment.to_string(), -1)
        ]
    );
    let claim = store
        .claim_compaction(
            &tbl,
            "month:2024-03",
            march.0,
            EventTime::parse_rfc3339("2024-04-01T00:00:00Z").unwrap(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap()
        .expect("this build claims the window the older build released");
    assert_eq!(claim.generation, 2, "the claim row kept its generation");
    store.drop_schema().await.unwrap();
}

/// The window claim of the build before migration 29 (c3bb186), verbatim: the first
/// statement of its every compaction and erasure repair.
async fn older_builds_claim(
    client: &tokio_postgres::Client,
    token: &str,
) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
    let at = |s: &str| -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339(s).unwrap().into()
    };
    client
        .query_one(
            "INSERT INTO pulpitum_v4_compactions AS c \
               (table_id, window_key, window_start, window_end, owner_token, generation, \
                lease_expires_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 1, now() + $6::INT8 * INTERVAL '1 microsecond', now()) \
             ON CONFLICT (table_id, window_key) DO UPDATE SET \
               window_start = excluded.window_start, window_end = excluded.window_end, \
               owner_token = excluded.owner_token, generation = c.generation + 1, \
               lease_expires_at = excluded.lease_expires_at, updated_at = now() \
             WHERE c.lease_expires_at IS NULL OR c.lease_expires_at <= now() \
             RETURNING generation",
            &[
                &"events",
                &"month:2024-03",
                &at("2024-03-01T00:00:00Z"),
                &at("2024-04-01T00:00:00Z"),
                &token,
                &60_000_000i64,
            ],
        )
        .await
}

/// A migrator whose reading of the ledger went stale (it stalled after reading it while
/// another applied every migration) runs none of the migrations recorded since: re-run
/// after the fence's rename, migration 10 would bring the old claims table back under its
/// old name, and the stalled run's own 33 would then fail on the name taken (a break-it
/// review reproduced both through a slow link). The stall is real: `pulpitum migrate` is
/// stopped (SIGSTOP) by a fail point right after its ledger read, and resumed after this
/// process migrated the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrator_with_a_stale_ledger_reading_reruns_nothing_recorded_since() {
    let schema = fresh_schema();
    {
        let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
    }
    let schema_url = format!("{}?options=-c%20search_path%3D{schema}", url());
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["migrate", "--database-url", &schema_url])
        .env("PULPITUM_FAILPOINT", "migrate_after_ledger:stop")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    };
    let waited = std::time::Instant::now();
    while !stopped() {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "the migrator never reached its fail point"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let store = PgStore::connect_with_schema(&url(), &schema).await.unwrap();
    store.migrate().await.unwrap();
    std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the resumed migrator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = store.raw_client().await.unwrap();
    let claims: Vec<String> = tables_of(&client, &schema)
        .await
        .into_iter()
        .filter(|t| t.starts_with("pulpitum_v4_compaction"))
        .collect();
    assert_eq!(claims, ["pulpitum_v4_compaction_claims"]);
    assert_eq!(ledger(&store).await, expected_ledger());
    store.drop_schema().await.unwrap();
}
