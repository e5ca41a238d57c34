//! Helpers the command-line tests share: the archiver binary run with a clean environment,
//! and an embedded store holding one row.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use pulpitum::model::{BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::embedded::SqliteStore;
use pulpitum::store::{Appends, Catalog, TableDefinition};

/// A database URL that answers nothing.
pub const NOWHERE: &str = "postgres://nobody@127.0.0.1:1/none";

/// The archiver binary with `args` and `env` over a clean environment: (status, stderr).
pub fn archiver(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    archiver_in(None, args, env)
}

/// [`archiver`] in a working directory of the test's choosing.
pub fn archiver_in(dir: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"));
    if let Some(d) = dir {
        c.current_dir(d);
    }
    c.args(args)
        .env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .env_remove("PULPITUM_LOG_FORMAT")
        .env_remove("ARCHIVER_KEEP_HOT_BUCKETS")
        .env_remove("ARCHIVER_ELIGIBLE_THROUGH_YEAR")
        .env("PULPITUM_LOG", "error");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An embedded store at `path` holding one row in the bucket of 2021-02-03.
pub fn seeded_store(path: &Path) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = SqliteStore::open(path).unwrap();
    let table = TableId::new("chat").unwrap();
    rt.block_on(async {
        store.migrate().await.unwrap();
        store
            .register_table(&TableDefinition::new(
                table.clone(),
                BucketStrategy::CalendarDayUtc,
                "chat",
            ))
            .await
            .unwrap();
        store
            .append(
                &table,
                &Record {
                    partition_key: PartitionKey::new(vec![1]).unwrap(),
                    event_time: EventTime::parse_rfc3339("2021-02-03T04:05:06Z").unwrap(),
                    sort_key: SortKey::new(vec![1]).unwrap(),
                    value: b"hi".to_vec(),
                },
            )
            .await
            .unwrap();
    });
    format!("sqlite://{}", path.display())
}
