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

async fn scenario(store: Arc<dyn HotStore>, archive: Arc<pulpitum::archive::ArchiveStore>) {
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

    // A server that reads no table schema format newer than 0 holds back column changes.
    store.announce_reader(&older("serve", 3, 0)).await.unwrap();
    let e = run(&ctx, "ALTER TABLE events ADD COLUMN n INTEGER")
        .await
        .unwrap_err();
    assert!(
        e.contains("ALTER TABLE events needs") && e.contains("serve-old (serve"),
        "{e}"
    );
    store.withdraw_reader("serve-old").await.unwrap();
    run(&ctx, "ALTER TABLE events ADD COLUMN n INTEGER")
        .await
        .unwrap();

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
    // is removed.
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
    drop(served);
    // Current readers hold nothing back.
    run(&ctx, "ALTER TABLE events ADD COLUMN m TEXT")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_readers_hold_back_newer_versions_on_postgres() {
    let (store, archive) = open(
        &fresh_database("readers").await,
        &fresh_archive_url("readers"),
    )
    .await;
    scenario(store, archive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_readers_hold_back_newer_versions_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("hot.db").display());
    let (store, archive) = open(&db, &fresh_archive_url("readers_sq")).await;
    scenario(store, archive).await;
}
