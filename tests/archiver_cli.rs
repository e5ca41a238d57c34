//! The archiver binary's contract with operators: bad or obsolete settings stop it before any
//! work (the database URL here points at nothing, so any attempted work would fail
//! differently), `--once` exits non-zero when a bucket fails, and zero when all succeed.

use std::path::Path;
use std::process::Command;

use pulpitum::model::TableId;
use pulpitum::store::embedded::SqliteStore;
use pulpitum::store::{BucketFilter, BucketState, RoutedReads};

#[path = "support/cli.rs"]
mod cli;

use cli::{archiver, archiver_in, seeded_store, NOWHERE};

/// Extra flags, extra environment, and the setting the error must name.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn bad_settings_are_refused_by_name_before_any_work() {
    let base = [
        "--once",
        "--database-url",
        NOWHERE,
        "--archive-url",
        "file:///tmp/none",
    ];
    let cases: &[Case] = &[
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
        (
            &["--gc-delay-seconds", "0"],
            &[],
            "ARCHIVER_GC_DELAY_SECONDS",
        ),
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
    let db_url = seeded_store(&db);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = SqliteStore::open(&db).unwrap();
    let table = TableId::new("chat").unwrap();
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

/// Each bad value gets one line naming the setting, the value and what is accepted, before
/// any work (the database points at nothing).
#[test]
fn every_bad_setting_is_one_line_naming_setting_value_and_accepted_range() {
    let base = [
        "--once",
        "--database-url",
        NOWHERE,
        "--archive-url",
        "file:///tmp/none",
    ];
    // (flags, environment, setting named, value shown, what is accepted)
    type Named<'a> = (
        &'a [&'a str],
        &'a [(&'a str, &'a str)],
        &'a str,
        &'a str,
        &'a str,
    );
    let cases: &[Named] = &[
        (
            &["--snapshot-page-rows", "0"],
            &[],
            "ARCHIVER_SNAPSHOT_PAGE_ROWS",
            "\"0\"",
            "from 1 to 1000000",
        ),
        (
            &["--cleanup-batch-rows", "0"],
            &[],
            "ARCHIVER_CLEANUP_BATCH_ROWS",
            "\"0\"",
            "from 1 to 1000000",
        ),
        (
            &["--interval-seconds", "-1"],
            &[],
            "ARCHIVER_INTERVAL_SECONDS",
            "\"-1\"",
            "from 0.01 to 86400",
        ),
        (
            &["--eligible-before", "2024-13-01"],
            &[],
            "ARCHIVER_ELIGIBLE_BEFORE",
            "\"2024-13-01\"",
            "not an RFC 3339 instant",
        ),
        (
            &["--eligible-before", "2500-01-01T00:00:00Z"],
            &[],
            "ARCHIVER_ELIGIBLE_BEFORE",
            "out of range",
            "1900 to 2199",
        ),
        (
            &["--upload-deadline-seconds", "0"],
            &[],
            "ARCHIVER_UPLOAD_DEADLINE_SECONDS",
            "\"0\"",
            "from 1 to 86400",
        ),
        (
            &["--gc-delay-seconds", "0"],
            &[],
            "ARCHIVER_GC_DELAY_SECONDS",
            "\"0\"",
            "from 1 to 2592000",
        ),
        (
            &["--lease-seconds", "1e30"],
            &[],
            "ARCHIVER_LEASE_SECONDS",
            "\"1e30\"",
            "from 0.3 to 86400",
        ),
        (
            &[],
            &[("ARCHIVER_LEASE_SECONDS", "86401")],
            "ARCHIVER_LEASE_SECONDS",
            "\"86401\"",
            "from 0.3 to 86400",
        ),
        (
            &["--retry-seconds", "NaN"],
            &[],
            "ARCHIVER_RETRY_SECONDS",
            "\"NaN\"",
            "from 0 to 604800",
        ),
        (
            &["--cleanup-delay-seconds", "inf"],
            &[],
            "ARCHIVER_CLEANUP_DELAY_SECONDS",
            "\"inf\"",
            "from 0 to 604800",
        ),
        (
            &["--backup-retention-seconds", "-1"],
            &[],
            "ARCHIVER_BACKUP_RETENTION_SECONDS",
            "\"-1\"",
            "from 0 to 315360000",
        ),
        (
            &[],
            &[("ARCHIVER_READER_STATEMENT_TIMEOUT_SECONDS", "604801")],
            "ARCHIVER_READER_STATEMENT_TIMEOUT_SECONDS",
            "\"604801\"",
            "from 0 to 604800",
        ),
        (
            &["--reader-route-cache-seconds", "soon"],
            &[],
            "ARCHIVER_READER_ROUTE_CACHE_SECONDS",
            "\"soon\"",
            "from 0 to 86400",
        ),
        (
            &["--scan-limit", "-5"],
            &[],
            "ARCHIVER_SCAN_LIMIT",
            "\"-5\"",
            "from 1 to 100000",
        ),
        (
            &["--concurrency", "99999999999999999999999"],
            &[],
            "ARCHIVER_CONCURRENCY",
            "\"99999999999999999999999\"",
            "from 1 to 1024",
        ),
        (
            &["--format", "xml"],
            &[],
            "ARCHIVER_FORMAT",
            "\"xml\"",
            "parquet or json",
        ),
        (
            &["--metrics-addr", "port nine"],
            &[],
            "ARCHIVER_METRICS_ADDR",
            "\"port nine\"",
            "localhost:9187",
        ),
        (
            &["--metrics-addr", "no-such-host.invalid:9187"],
            &[],
            "ARCHIVER_METRICS_ADDR",
            "no-such-host.invalid",
            "HOST:PORT",
        ),
        (
            &["--log-format", "xml"],
            &[],
            "--log-format",
            "\"xml\"",
            "text or json",
        ),
        (
            &[],
            &[("PULPITUM_LOG", "verbose")],
            "PULPITUM_LOG",
            "\"verbose\"",
            "info,pulpitum=debug",
        ),
        (
            &[],
            &[("PULPITUM_LOG", "info,pulpitum=loud")],
            "PULPITUM_LOG",
            "loud",
            "a level",
        ),
    ];
    for (args, env, setting, value, accepted) in cases {
        let mut all: Vec<&str> = base.to_vec();
        all.extend_from_slice(args);
        let (code, err) = archiver(&all, env);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(code, 2, "{args:?} {env:?}: {err}");
        assert_eq!(lines.len(), 1, "{args:?} {env:?}: one line expected: {err}");
        for want in [setting, value, accepted] {
            assert!(
                err.contains(want),
                "{args:?} {env:?} should say {want}: {err}"
            );
        }
    }
}

/// A database that does not exist: the server's reason reaches the operator.
#[test]
fn a_missing_database_is_reported_with_its_cause() {
    let (code, err) = archiver(
        &[
            "--once",
            "--database-url",
            "postgres://postgres@127.0.0.1:5432/pulpitum_no_such_database",
            "--archive-url",
            "file:///tmp/none",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pulpitum_no_such_database") && err.contains("does not exist"),
        "{err}"
    );
}

/// A metrics port in use is named; a host name is accepted.
#[test]
fn metrics_address_in_use_is_named_and_host_names_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(&dir.path().join("hot.sqlite3"));
    let archive = format!("file://{}/archive", dir.path().display());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let common = [
        "--once",
        "--no-gc",
        "--database-url",
        &db,
        "--archive-url",
        &archive,
    ];
    let mut args = common.to_vec();
    args.extend(["--metrics-addr", &addr]);
    let (code, err) = archiver(&args, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&addr) && err.contains("--metrics-addr"),
        "{err}"
    );
    let mut args = common.to_vec();
    args.extend(["--metrics-addr", "localhost:0"]);
    let (code, err) = archiver(&args, &[]);
    assert_eq!(code, 0, "{err}");
}

/// Piped logs carry no colour codes; `--log-format json` writes JSON lines.
#[test]
fn logs_are_plain_when_piped_and_json_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(&dir.path().join("hot.sqlite3"));
    let archive = format!("file://{}/archive", dir.path().display());
    let common = [
        "--once",
        "--no-gc",
        "--database-url",
        &db,
        "--archive-url",
        &archive,
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let (code, err) = archiver(&common, &[("PULPITUM_LOG", "info")]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("serving metrics"), "{err}");
    assert!(!err.contains('\x1b'), "colour codes in piped logs: {err:?}");

    let mut args = common.to_vec();
    args.extend(["--log-format", "json"]);
    let (code, err) = archiver(&args, &[("PULPITUM_LOG", "info")]);
    assert_eq!(code, 0, "{err}");
    let json: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(
        json.iter()
            .any(|v| v["fields"]["message"] == "serving metrics" && v["level"] == "INFO"),
        "{err}"
    );
}

/// Strings that are neither a URL nor a clear file path are refused, and nothing is created
/// in the working directory; a clear path to a file that does not exist is refused too
/// (naming `migrate`), and accepted once `migrate` has created the store.
#[test]
fn unclear_locators_are_refused_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (db, archive, named) in [
        (
            "hot",
            "file:///tmp/none",
            "neither a URL nor a clear file path",
        ),
        (
            "host=db user=app frobnicate=1",
            "file:///tmp/none",
            "not PostgreSQL key=value",
        ),
        (
            "mysql://db/app",
            "file:///tmp/none",
            "scheme is not supported",
        ),
        ("sqlite:", "file:///tmp/none", "names no file"),
        ("hot.db", "archive", "archive URL"),
        ("hot.db", "./archive", "archive URL"),
        ("hot.db", "file:///tmp/none", "no embedded store at hot.db"),
        (
            "./typo.db",
            "file:///tmp/none",
            "pulpitum migrate --database-url ./typo.db",
        ),
    ] {
        let (code, err) = archiver_in(
            Some(dir.path()),
            &["--once", "--database-url", db, "--archive-url", archive],
            &[],
        );
        assert_eq!(code, 2, "{db} {archive}: {err}");
        assert!(err.contains(named), "{db} {archive}: {err}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{db} {archive} left {left:?}");
    }
    // `policy` and the other commands refuse a missing file the same way, flags before or
    // after the subcommand.
    let (code, err) = archiver_in(
        Some(dir.path()),
        &["--database-url", "./typo.db", "policy", "show"],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no embedded store at ./typo.db"), "{err}");
    let (code, err) = archiver_in(
        Some(dir.path()),
        &["policy", "show", "--database-url", "./typo.db"],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no embedded store at ./typo.db"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left {left:?}");
    let archive = format!("file://{}/archive", dir.path().display());
    for db in ["hot.db", "./hot", "data/hot.sqlite3", "sqlite:x.sqlite"] {
        let (code, err) = archiver_in(Some(dir.path()), &["migrate", "--database-url", db], &[]);
        assert_eq!(code, 0, "{db}: {err}");
        let (code, err) = archiver_in(
            Some(dir.path()),
            &["--once", "--database-url", db, "--archive-url", &archive],
            &[],
        );
        assert_eq!(code, 0, "{db}: {err}");
    }
    for f in ["hot.db", "hot", "data/hot.sqlite3", "x.sqlite"] {
        assert!(dir.path().join(f).is_file(), "{f} not created");
    }
}

/// What the binaries create (the embedded store with its WAL files, the local archive
/// with its objects) is readable by the owner only.
#[cfg(unix)]
#[test]
fn created_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    fn check_tree(root: &Path, files: &mut usize) {
        for e in std::fs::read_dir(root).unwrap() {
            let e = e.unwrap();
            let mode = e.metadata().unwrap().permissions().mode() & 0o777;
            if e.file_type().unwrap().is_dir() {
                assert_eq!(mode, 0o700, "{}", e.path().display());
                check_tree(&e.path(), files);
            } else {
                assert_eq!(mode, 0o600, "{}", e.path().display());
                *files += 1;
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = seeded_store(&data.join("hot.sqlite3"));
    let archive = format!("file://{}/archive", data.display());
    let (code, err) = archiver(
        &[
            "--once",
            "--database-url",
            &db,
            "--archive-url",
            &archive,
            "--eligible-before",
            "2022-01-01T00:00:00Z",
            "--cleanup-delay-seconds",
            "0",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("archived 1"), "{err}");
    let mut files = 0;
    check_tree(&data, &mut files);
    assert!(data.join("archive").is_dir());
    assert!(
        files >= 3,
        "store, WAL and archive objects expected, found {files}"
    );

    // The shell's embedded default, created from nothing.
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .current_dir(dir.path())
        .env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .args(["-c", "SELECT 1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = 0;
    check_tree(&dir.path().join("pulpitum-data"), &mut files);
    assert!(files >= 1);
}

/// PostgreSQL notices ("relation ... already exists, skipping" from a second `migrate`) are
/// logged only when debug output is asked for.
#[test]
fn postgres_notices_are_logged_only_at_debug() {
    let schema = format!(
        "cfg_notice_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(
            "postgres://postgres@127.0.0.1:5432/test",
            tokio_postgres::NoTls,
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        c.batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
    });
    let db = format!("postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D{schema}");
    let dir = tempfile::tempdir().unwrap();
    let archive = format!("file://{}/archive", dir.path().display());
    let args = [
        "--once",
        "--no-gc",
        "--database-url",
        &db,
        "--archive-url",
        &archive,
    ];
    // The first `migrate` creates the tables; the later ones make the server send notices.
    for (filter, shown) in [("info", false), ("info", false), ("debug", true)] {
        let (code, err) = archiver(
            &["migrate", "--database-url", &db],
            &[("PULPITUM_LOG", filter)],
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            err.contains("already exists, skipping"),
            shown,
            "PULPITUM_LOG={filter}: {err}"
        );
    }
    // An ordinary start runs no DDL, so it draws no notice even at debug.
    let (code, err) = archiver(&args, &[("PULPITUM_LOG", "debug")]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("already exists, skipping"), "{err}");
}
