//! Shared helpers for the archiver's integration tests: an isolated PostgreSQL schema and S3
//! prefix per test (real services, no mocks), the archiver binary, and a routed read that
//! returns one bucket's rows from whichever tier the route names.
#![allow(dead_code)]

pub mod hooked;

use std::sync::Arc;

use pulpitum::archive::ArchiveStore;
use pulpitum::model::{BucketId, Record, ScanBounds};
use pulpitum::store::{HotPage, HotStore, PageRequest};

/// Base URL of the test database.
pub fn pg_base_url() -> String {
    std::env::var("PULPITUM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// S3 settings for radosgw started by `scripts/s3-up.sh`.
pub const S3_ENV: &[(&str, &str)] = &[
    ("AWS_ENDPOINT_URL", "http://127.0.0.1:7480"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_ACCESS_KEY_ID", "AKTEST"),
    ("AWS_SECRET_ACCESS_KEY", "SKTESTSECRET"),
];

/// Test bucket created by `scripts/s3-up.sh`.
pub fn s3_bucket() -> String {
    std::env::var("PULPITUM_TEST_S3_BUCKET").unwrap_or_else(|_| "pulpitum-test".into())
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// A fresh schema; returns a database URL whose connections use it.
pub async fn fresh_database(label: &str) -> String {
    let schema = unique(&format!("arch_{label}"));
    let (client, conn) = tokio_postgres::connect(&pg_base_url(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL reachable");
    tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("create schema");
    format!(
        "{}?options=-c%20search_path%3D{schema}&application_name=pulpitum-test",
        pg_base_url()
    )
}

/// A fresh S3 prefix URL (and sets the S3 variables for this process).
pub fn fresh_archive_url(label: &str) -> String {
    for (k, v) in S3_ENV {
        if std::env::var(k).is_err() {
            // SAFETY-free in edition 2021; the values are the same for every test.
            std::env::set_var(k, v);
        }
    }
    format!("s3://{}/{}", s3_bucket(), unique(label))
}

/// Opens both tiers.
pub async fn open(db_url: &str, archive_url: &str) -> (Arc<dyn HotStore>, Arc<ArchiveStore>) {
    let store = pulpitum::store::open(db_url).await.expect("open store");
    store.migrate().await.expect("migrate");
    let archive = Arc::new(ArchiveStore::from_url(archive_url).expect("archive url"));
    (store, archive)
}

/// The archiver binary with both URLs and the S3 variables set.
pub fn archiver(db_url: &str, archive_url: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"));
    c.env(
        "PULPITUM_DATABASE_URL",
        db_url.replace(
            "application_name=pulpitum-test",
            "application_name=pulpitum-archiver",
        ),
    )
    .env("PULPITUM_ARCHIVE_URL", archive_url)
    .env("PULPITUM_LOG", "warn")
    .env_remove("PULPITUM_FAILPOINT")
    .env_remove("PULPITUM_FAULT_RATE")
    .kill_on_drop(true);
    for (k, v) in S3_ENV {
        c.env(k, std::env::var(k).unwrap_or_else(|_| v.to_string()));
    }
    c
}

/// Every row of a bucket, read through the route the store names at each page (hot pages
/// by keyset, or the whole verified archive).
pub async fn read_bucket(
    store: &dyn HotStore,
    archive: &ArchiveStore,
    bucket: &BucketId,
) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    let mut bounds = ScanBounds::all();
    loop {
        let req = PageRequest {
            bounds: bounds.clone(),
            descending: false,
            limit: 500,
            include_value: true,
        };
        match store.read_page(bucket, &req).await.expect("read page") {
            HotPage::Missing => return out,
            HotPage::Hot { rows, .. } => {
                let rows = pulpitum::model::batch_to_records(&rows).expect("envelope rows");
                let Some(last) = rows.last() else { return out };
                bounds = bounds.with_after(last.clustering_key());
                out.extend(rows);
            }
            HotPage::Archived { object_key } => {
                // A bucket's own archive or a segment holding it.
                let route = archive
                    .open_route(&object_key, bucket)
                    .await
                    .expect("manifest");
                let all = archive
                    .read_bucket(&route, bucket)
                    .await
                    .expect("archive rows");
                out.extend(all.into_iter().filter(|r| bounds.matches(r)));
                return out;
            }
        }
    }
}

/// The schema a test database URL selects (`search_path`).
pub fn schema_of(db: &str) -> String {
    db.split("search_path%3D")
        .nth(1)
        .and_then(|r| r.split('&').next())
        .expect("a test database URL names its schema")
        .to_string()
}

pub fn run_tool(cmd: &mut std::process::Command) {
    let out = cmd
        .output()
        .expect("the PostgreSQL client tools are installed");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// docs/backup.md's PostgreSQL backup: `pg_dump -n SCHEMA -Fc` of the schema holding the
/// `pulpitum_v4_*` tables.
pub fn pg_backup(db: &str, file: &std::path::Path) {
    run_tool(
        std::process::Command::new("pg_dump")
            .arg(format!("--dbname={}", pg_base_url()))
            .args(["-n", &schema_of(db), "-Fc", "-f"])
            .arg(file),
    );
}

/// docs/backup.md's restore of it: the schema dropped, then `pg_restore`.
pub async fn pg_restore(db: &str, file: &std::path::Path) {
    let (client, conn) = tokio_postgres::connect(&pg_base_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("DROP SCHEMA {} CASCADE", schema_of(db)))
        .await
        .unwrap();
    run_tool(
        std::process::Command::new("pg_restore")
            .arg(format!("--dbname={}", pg_base_url()))
            .arg(file),
    );
}

/// The embedded store's file in a `sqlite:PATH` URL.
pub fn sqlite_path(db: &str) -> Option<&str> {
    db.strip_prefix("sqlite:")
}
