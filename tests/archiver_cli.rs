//! The archiver binary's contract with operators: bad or obsolete settings stop it before any
//! work (the database URL here points at nothing, so any attempted work would fail
//! differently), `--once` exits non-zero when a bucket fails, and zero when all succeed.

use std::path::Path;
use std::process::Command;

use pulpitum::model::{BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::embedded::SqliteStore;
use pulpitum::store::{Appends, BucketFilter, BucketState, Catalog, RoutedReads, TableDefinition};

const NOWHERE: &str = "postgres://nobody@127.0.0.1:1/none";

/// Extra flags, extra environment, and the setting the error must name.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

fn archiver(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    archiver_in(None, args, env)
}

/// [`archiver`] in a working directory of the test's choosing.
fn archiver_in(dir: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
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

/// An embedded store at `path` holding one row in the bucket of 2021-02-03.
fn seeded_store(path: &Path) -> String {
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

/// `policy` changes what the store holds and what `policy show` prints; bad options, values
/// and tables fail with exit code 2 and a line naming what was wrong, and change nothing;
/// the archive URL is never needed.
#[test]
fn policy_commands_set_show_pause_and_refuse_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let url = seeded_store(&dir.path().join("p.db"));
    let policy = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"))
            .args(["--database-url", &url, "policy"])
            .args(args)
            .env_remove("PULPITUM_ARCHIVE_URL")
            .env("PULPITUM_LOG", "error")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = policy(&["set", "chat", "archive_after=90 days", "format=json"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("| chat     | 90 days       | json   |"),
        "{out}"
    );
    let (code, _, err) = policy(&["pause", "chat"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = policy(&["pause"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = policy(&["show"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("store: paused\n"), "{out}");
    assert!(
        out.contains("| chat     | 90 days       | json   |               | true   |"),
        "{out}"
    );
    for (args, needle) in [
        (
            &["set", "chat", "archive_after=3 months"][..],
            "archive_after: \"3 months\"",
        ),
        (&["set", "chat", "archive_after"][..], "is not OPTION=VALUE"),
        (
            &["set", "chat", "keep=1 day"][..],
            "unknown table option \"keep\"",
        ),
        (
            &["reset", "nope", "format"][..],
            "table nope is not registered",
        ),
        (&["pause", "Bad-Name"][..], "is not a table name"),
    ] {
        let (code, _, err) = policy(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let (code, _, _) = policy(&["resume"]);
    assert_eq!(code, 0);
    let (code, _, _) = policy(&["reset", "chat", "archive_after", "paused"]);
    assert_eq!(code, 0);
    let (_, out, _) = policy(&["show"]);
    assert!(out.starts_with("store: archiving\n"), "{out}");
    assert!(
        out.contains("| chat     |               | json   |               | false  |"),
        "{out}"
    );
}

/// Flags the subcommands use may follow them (`policy show --database-url X`), and output
/// into a closed pipe (`policy set ... | head -1`) ends the process by SIGPIPE, without a
/// panic or an error line.
#[cfg(unix)]
#[test]
fn subcommand_flags_go_anywhere_and_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let url = seeded_store(&dir.path().join("p.db"));
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"))
        .args([
            "policy",
            "show",
            "--database-url",
            &url,
            "--log-format",
            "json",
        ])
        .env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("store: archiving\n"), "{stdout}");
    // A run's flags typed with a subcommand would be ignored: they are refused, by name.
    let (code, err) = archiver(
        &[
            "--once",
            "--no-gc",
            "policy",
            "show",
            "--database-url",
            &url,
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--once, --no-gc are for a run"), "{err}");
    let (code, err) = archiver(
        &["policy", "show", "--database-url", &url],
        &[("ARCHIVER_SCAN_LIMIT", "9")],
    );
    assert_eq!(
        code, 0,
        "a run's setting from the environment is no error: {err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["migrate", "--max-rows", "5", "--database-url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-rows limits queries"));
    for args in [
        &[
            "policy",
            "set",
            "chat",
            "archive_after=90 days",
            "--database-url",
            &url,
        ][..],
        &["--database-url", &url, "policy", "show"],
        &["migrate", "--database-url", &url],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"))
            .args(args)
            .env_remove("PULPITUM_DATABASE_URL")
            .env_remove("PULPITUM_ARCHIVE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the first line is written.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

/// Both binaries refuse an invalid PULPITUM_LOG with the same status, 2, before any work.
#[test]
fn an_invalid_log_filter_exits_2_in_both_binaries() {
    for bin in [
        env!("CARGO_BIN_EXE_pulpitum-archiver"),
        env!("CARGO_BIN_EXE_pulpitum"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(bin)
            .current_dir(dir.path())
            .args(["--database-url", NOWHERE, "--archive-url", "memory://"])
            .env("PULPITUM_LOG", "infoo")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin}: {err}");
        assert!(err.contains("PULPITUM_LOG=\"infoo\""), "{bin}: {err}");
        assert!(!err.contains("database error"), "work was attempted: {err}");
    }
}

/// A refused connection names where it went; an archive "URL" that is a path names the URL
/// it probably meant.
#[test]
fn connection_and_archive_errors_name_what_to_fix() {
    let (code, err) = archiver(
        &[
            "--once",
            "--database-url",
            NOWHERE,
            "--archive-url",
            "file:///tmp/none",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot connect to 127.0.0.1:1 (database none, user nobody)")
            && err.contains("Connection refused"),
        "{err}"
    );
    assert!(!err.contains("creating a new object"), "{err}");
    let (code, err) = archiver(
        &[
            "--once",
            "--database-url",
            NOWHERE,
            "--archive-url",
            "/tmp/relative",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("write file:///tmp/relative"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args([
            "--database-url",
            NOWHERE,
            "--archive-url",
            "/tmp/relative",
            "-c",
            "SELECT 1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("write file:///tmp/relative"), "{err}");
}

/// The help says what the program accepts: every database form, the cleanup delay's real
/// range.
#[test]
fn help_lists_what_is_accepted() {
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout).replace(char::is_whitespace, "");
    for form in [
        "postgres://",
        "postgresql://",
        "key=valuestring",
        "sqlite:PATH",
        "sqlite://PATH",
        "sqlite::memory:",
        ".db,.sqliteor.sqlite3",
    ] {
        assert!(help.contains(form), "--database-url help lacks {form}");
    }
    assert!(help.contains("0to604800"), "cleanup delay range");
    assert!(!help.contains("route-cacheTTL") && !help.contains("atleastthereaders"));
}
