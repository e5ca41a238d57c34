//! The archiver binary's contract with operators: bad or obsolete settings stop it before any
//! work (the database URL here points at nothing, so any attempted work would fail
//! differently), `--once` exits non-zero when a bucket fails, and zero when all succeed.

use std::process::Command;

use pulpitum::model::{BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::embedded::SqliteStore;
use pulpitum::store::{BucketFilter, BucketState, HotStore, TableDefinition};

const NOWHERE: &str = "postgres://nobody@127.0.0.1:1/none";

fn archiver(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"));
    c.args(args)
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

#[test]
fn bad_settings_are_refused_by_name_before_any_work() {
    let base = [
        "--once",
        "--database-url",
        NOWHERE,
        "--archive-url",
        "file:///tmp/none",
    ];
    let cases: &[(&[&str], &[(&str, &str)], &str)] = &[
        (
            &[],
            &[("ARCHIVER_KEEP_HOT_BUCKETS", "3")],
            "ARCHIVER_ELIGIBLE_BEFORE",
        ),
        (
            &[],
            &[("ARCHIVER_ELIGIBLE_THROUGH_YEAR", "2024")],
            "ARCHIVER_ELIGIBLE_THROUGH_YEAR",
        ),
        (
            &[],
            &[("ARCHIVER_LEASE_SECONDS", "soon")],
            "ARCHIVER_LEASE_SECONDS",
        ),
        (
            &["--eligible-before", "2025-13-01"],
            &[],
            "ARCHIVER_ELIGIBLE_BEFORE",
        ),
        (&["--format", "xml"], &[], "ARCHIVER_FORMAT"),
        (&["--scan-limit", "0"], &[], "ARCHIVER_SCAN_LIMIT"),
        (
            &["--gc-delay-seconds", "60"],
            &[],
            "ARCHIVER_GC_DELAY_SECONDS",
        ),
        (&["--metrics-addr", "port nine"], &[], "--metrics-addr"),
    ];
    for (args, env, named) in cases {
        let mut all: Vec<&str> = base.to_vec();
        all.extend_from_slice(args);
        let (code, err) = archiver(&all, env);
        assert_eq!(code, 2, "{args:?} {env:?}: {err}");
        assert!(
            err.contains(named),
            "{args:?} {env:?} should name {named}: {err}"
        );
        assert!(!err.contains("database error"), "work was attempted: {err}");
    }
    let (code, err) = archiver(&["--once", "--database-url", NOWHERE], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("go together"), "{err}");
}

#[test]
fn once_exits_non_zero_when_a_bucket_fails_and_zero_when_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hot.sqlite3");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = SqliteStore::open(&db).unwrap();
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
        let t = EventTime::parse_rfc3339("2021-02-03T04:05:06Z").unwrap();
        store
            .append(
                &table,
                &Record {
                    partition_key: PartitionKey::new(vec![1]).unwrap(),
                    event_time: t,
                    sort_key: SortKey::new(vec![1]).unwrap(),
                    value: b"hi".to_vec(),
                },
            )
            .await
            .unwrap();
    });
    let db_url = format!("sqlite://{}", db.display());
    // A file stands where the archive's `v4/` folder must go, so every upload fails and the
    // bucket is deferred.
    let root = dir.path().join("blocked");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("v4"), b"x").unwrap();
    let bad_archive = format!("file://{}", root.display());
    let common = [
        "--once",
        "--eligible-before",
        "2022-01-01T00:00:00Z",
        "--retry-seconds",
        "0",
        "--cleanup-delay-seconds",
        "0",
    ];
    let mut args = common.to_vec();
    args.extend([
        "--database-url",
        &db_url,
        "--archive-url",
        &bad_archive,
        "--no-gc",
    ]);
    let (code, err) = archiver(&args, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("deferred 1"), "{err}");

    let good_archive = format!("file://{}/archive", dir.path().display());
    let mut args = common.to_vec();
    args.extend(["--database-url", &db_url, "--archive-url", &good_archive]);
    let (code, err) = archiver(&args, &[]);
    assert_eq!(code, 0, "{err}");
    let metas = rt
        .block_on(store.list_buckets(&table, &BucketFilter::default()))
        .unwrap();
    assert!(
        matches!(
            metas[0].state,
            BucketState::Archived {
                hot_deleted: true,
                ..
            }
        ),
        "{:?}",
        metas[0].state
    );
}
