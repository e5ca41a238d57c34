//! The reader registry on PostgreSQL and the embedded store: a statement that would store a
//! record schema or table schema format some running process cannot read is refused,
//! naming that process, until it stops; a process whose build cannot read a table in the
//! store refuses to start, naming the upgrade; the binaries record themselves while they
//! run and remove themselves when they stop.

mod archiver_support;

use std::sync::Arc;

use archiver_support::{fresh_archive_url, fresh_database, open};
use datafusion::prelude::SessionContext;
use pulpitum::control::readers::{this_build, ReaderError, ReaderLease, READER_TTL};
use pulpitum::model::EventTime;
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{HotStore, ReaderInfo};

const CREATE: &str = "CREATE EXTERNAL TABLE events (tenant BIGINT NOT NULL, \
    at TIMESTAMPTZ NOT NULL, seq BIGINT NOT NULL, note TEXT) STORED AS PULPITUM LOCATION '' \
    OPTIONS ('partition_by' 'tenant', 'time' 'at', 'order_by' 'seq')";

fn older(role: &str, record_schema: u32, schema_format: u32) -> ReaderInfo {
    ReaderInfo {
        reader_id: format!("{role}-old"),
        build: "0.1.0".into(),
        record_schema,
        schema_format,
        ..this_build(role)
    }
}

async fn run(ctx: &SessionContext, sql: &str) -> Result<(), String> {
    pulpitum::control::sql(ctx, sql)
        .await
        .map_err(|e| e.to_string())?
        .collect()
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn live(store: &dyn HotStore) -> Vec<ReaderInfo> {
    let now = store.now().await.unwrap().as_micros();
    let since = EventTime::from_micros(now - READER_TTL.as_micros() as i64).unwrap();
    store.readers_since(since).await.unwrap()
}

/// Direct SQL on the store's own database, for rows no running process would write.
enum Raw {
    Pg(String),
    Sqlite(std::path::PathBuf),
}

impl Raw {
    async fn exec(&self, pg: &str, sqlite: &str) {
        match self {
            Raw::Pg(url) => {
                let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                c.batch_execute(pg).await.unwrap();
            }
            Raw::Sqlite(path) => {
                rusqlite::Connection::open(path)
                    .unwrap()
                    .execute_batch(sqlite)
                    .unwrap();
            }
        }
    }
}

async fn scenario(
    store: Arc<dyn HotStore>,
    archive: Arc<pulpitum::archive::ArchiveStore>,
    raw: Raw,
) {
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    // An archiver of a build that reads record schema 2 only is running: no declared table.
    store
        .announce_reader(&older("archiver", 2, 1))
        .await
        .unwrap();
    let e = run(&ctx, CREATE).await.unwrap_err();
    assert!(
        e.contains("CREATE EXTERNAL TABLE events needs record schema 3")
            && e.contains("archiver-old (archiver, build 0.1.0, reads record schema 2")
            && e.contains("upgrade them first"),
        "{e}"
    );
    let id = pulpitum::model::TableId::new("events").unwrap();
    assert!(store.table(&id).await.unwrap().is_none());
    // Once it has stopped, the table is created.
    store.withdraw_reader("archiver-old").await.unwrap();
    run(&ctx, CREATE).await.unwrap();
    // The same CREATE again stores nothing: a start-up script runs it whatever is running.
    store
        .announce_reader(&older("archiver", 2, 1))
        .await
        .unwrap();
    run(&ctx, CREATE).await.unwrap();
    // A column change keeps the rows' record schema: only the schema format counts.
    run(&ctx, "ALTER TABLE events RENAME COLUMN note TO memo")
        .await
        .unwrap();
    store.withdraw_reader("archiver-old").await.unwrap();

    // A server that reads no table schema format newer than 0 holds back column changes.
    store.announce_reader(&older("serve", 3, 0)).await.unwrap();
    let e = run(&ctx, "ALTER TABLE events ADD COLUMN n INTEGER")
        .await
        .unwrap_err();
    assert!(
        e.contains("ALTER TABLE events needs table schema format 1")
            && e.contains("serve-old (serve"),
        "{e}"
    );
    store.withdraw_reader("serve-old").await.unwrap();
    run(&ctx, "ALTER TABLE events ADD COLUMN n INTEGER")
        .await
        .unwrap();

    // A row dated in the future was written by no running process: it holds nothing back,
    // and the next start deletes it.
    raw.exec(
        "INSERT INTO pulpitum_v4_readers VALUES ('future', 'shell', '0.1.0', 2, 0, now() + interval '10 days')",
        "INSERT INTO pulpitum_v4_readers VALUES ('future', 'shell', '0.1.0', 2, 0, 9000000000000000)",
    )
    .await;
    run(&ctx, "ALTER TABLE events ADD COLUMN x INTEGER")
        .await
        .unwrap();
    ReaderLease::start(store.clone(), "shell")
        .await
        .unwrap()
        .stop()
        .await;
    let all = store
        .readers_since(EventTime::min_supported())
        .await
        .unwrap();
    assert!(all.is_empty(), "{all:?}");

    // A build that reads record schema 2 refuses to start on this store, naming the table
    // and the upgrade, and leaves no record behind.
    match ReaderLease::start_as(store.clone(), older("shell", 2, 1)).await {
        Err(ReaderError::TooOld { table, what, .. }) => {
            assert_eq!((table.as_str(), what), ("events", "record schema"))
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("an older build started"),
    }
    // So does one that reads the record schema but not the table schema's format.
    let e = ReaderLease::start_as(store.clone(), older("shell", 3, 0))
        .await
        .err()
        .expect("refused");
    assert!(
        e.to_string()
            .contains("table events is stored with table schema format 1")
            && e.to_string().contains("upgrade Pulpitum"),
        "{e}"
    );
    assert!(live(&*store).await.is_empty());

    // This build: a session with a reader role is recorded while it lives; a lease stopped
    // and a session released are removed.
    let served = session(
        store.clone(),
        archive.clone(),
        SessionOptions {
            reader: Some("serve"),
            ..SessionOptions::default()
        },
    )
    .await
    .unwrap();
    let lease = ReaderLease::start(store.clone(), "archiver").await.unwrap();
    let now = live(&*store).await;
    let roles: Vec<&str> = now.iter().map(|r| r.role.as_str()).collect();
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(
        roles.contains(&"serve") && roles.contains(&"archiver"),
        "{now:?}"
    );
    assert!(now
        .iter()
        .all(|r| r.record_schema == 3 && r.build == env!("CARGO_PKG_VERSION")));
    lease.stop().await;
    assert_eq!(live(&*store).await.len(), 1);
    pulpitum::control::readers::release(&served).await;
    assert!(live(&*store).await.is_empty());
    // Current readers hold nothing back.
    run(&ctx, "ALTER TABLE events ADD COLUMN m TEXT")
        .await
        .unwrap();

    // A damaged schema is not a newer version: this build starts (a session leaves that
    // table out and says why), and asks for no upgrade.
    raw.exec(
        "UPDATE pulpitum_v4_table_schemas SET definition = '{\"format\": 1, \"version\": 1'",
        "UPDATE pulpitum_v4_table_schemas SET definition = '{\"format\": 1, \"version\": 1'",
    )
    .await;
    ReaderLease::start(store.clone(), "shell")
        .await
        .unwrap()
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_readers_hold_back_newer_versions_on_postgres() {
    let db = fresh_database("readers").await;
    let (store, archive) = open(&db, &fresh_archive_url("readers")).await;
    scenario(store, archive, Raw::Pg(db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_readers_hold_back_newer_versions_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hot.db");
    let db = format!("sqlite://{}", path.display());
    let archive_url = fresh_archive_url("readers_sq");
    let (store, archive) = open(&db, &archive_url).await;
    scenario(store.clone(), archive, Raw::Sqlite(path)).await;
    // The shell records itself while it runs and removes itself as it stops.
    for _ in 0..2 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pulpitum"))
            .args(["--database-url", &db, "--archive-url", &archive_url])
            .args(["--format", "csv", "-c", "SELECT 1 AS one"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let all = store
        .readers_since(EventTime::min_supported())
        .await
        .unwrap();
    assert!(all.is_empty(), "{all:?}");
}
