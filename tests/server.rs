//! `pulpitum serve` with real clients: psql (scripted), tokio-postgres over the extended
//! protocol with binary results and SCRAM, TLS with a self-signed certificate; and the
//! server's refusals: wrong password, plaintext when TLS is required, too many connections,
//! a statement past its timeout, a cancelled query, a client gone mid-result, DDL and file
//! access. Each refusal leaves the server serving others. The tables live in the embedded
//! store and a local archive, seeded by the shell and archived by the real archiver.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_postgres::{Client, NoTls};

const PASSWORD: &str = "correct horse";

struct Served {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// `pulpitum migrate`: a named embedded file is created by the owner's step, never by a
/// start.
async fn migrate(db: &str) {
    let status = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["migrate", "--database-url", db])
        .stdout(Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

fn urls(dir: &Path) -> (String, String) {
    (
        format!("sqlite:{}", dir.join("hot.sqlite3").display()),
        format!("file://{}", dir.join("archive").display()),
    )
}

/// A data folder with `chat`: channels 1 and 2, one message a day through 2024-01 (all of it
/// archived to Parquet except the last five days), plus extreme ids and a UTF-8 message.
async fn seeded() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (db, archive) = urls(dir.path());
    migrate(&db).await;
    let mut values = Vec::new();
    for day in 1..=31 {
        for ch in [1, 2] {
            values.push(format!(
                "({ch}, TIMESTAMP '2024-01-{day:02}T12:00:00.123456Z', {day}, 'day {day}')"
            ));
        }
    }
    values.push(format!(
        "(3, TIMESTAMP '2024-01-31T23:59:59.999999Z', {}, 'größte ✓')",
        i64::MAX
    ));
    values.push(format!(
        "(3, TIMESTAMP '2024-01-31T00:00:00.000001Z', {}, 'kleinste')",
        i64::MIN
    ));
    let status = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["--database-url", &db, "--archive-url", &archive])
        .args([
            "-c",
            "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
             OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
            "-c",
            &format!("INSERT INTO chat VALUES {}", values.join(", ")),
        ])
        .env("PULPITUM_LOG", "error")
        .stdout(Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let status = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"))
        .args(["--database-url", &db, "--archive-url", &archive])
        .args([
            "--once",
            "--no-gc",
            "--eligible-before",
            "2024-01-27T00:00:00Z",
        ])
        .args(["--cleanup-delay-seconds", "0"])
        .env("PULPITUM_LOG", "error")
        .stdout(Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success());
    dir
}

/// Starts `pulpitum serve` on a free port with `extra` flags and environment.
async fn serve(dir: tempfile::TempDir, extra: &[&str], env: &[(&str, &str)]) -> Served {
    let (db, archive) = urls(dir.path());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pulpitum"));
    cmd.args(["--database-url", &db, "--archive-url", &archive, "serve"])
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("PULPITUM_SERVER_USERS_FILE")
        .env_remove("PULPITUM_SERVER_USER")
        .env("PULPITUM_LOG", "warn")
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("server started in time")
            .unwrap()
            .unwrap_or_else(|| panic!("server exited before listening"));
        if let Some(addr) = line.strip_prefix("pulpitum: serving PostgreSQL clients on ") {
            break addr.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Served {
        child,
        port,
        _dir: dir,
    }
}

async fn with_user(extra: &[&str]) -> Served {
    serve(
        seeded().await,
        &[&["--user", "alice", "--role", "admin"], extra].concat(),
        &[("PULPITUM_SERVER_PASSWORD", PASSWORD)],
    )
    .await
}

/// Runs `statements` with the shell (`pulpitum -c ...`) on the stores `s` serves.
async fn shell(s: &Served, statements: &[&str]) {
    let (db, archive) = urls(s._dir.path());
    let status = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["--database-url", &db, "--archive-url", &archive])
        .args(statements.iter().flat_map(|sql| ["-c", sql]))
        .env("PULPITUM_LOG", "error")
        .stdout(Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success(), "{statements:?}");
}

fn conninfo(s: &Served, user: &str, password: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} password='{password}' dbname=pulpitum sslmode=disable",
        s.port
    )
}

async fn connect(s: &Served) -> Client {
    let (client, conn) = tokio_postgres::connect(&conninfo(s, "alice", PASSWORD), NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

fn code(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| format!("{}: {}", d.code().code(), d.message()))
        .unwrap_or_else(|| format!("{e:?}"))
}

fn psql(s: &Served, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("psql")
        .arg(format!(
            "host=127.0.0.1 port={} user=alice dbname=pulpitum sslmode=disable",
            s.port
        ))
        .args(["-X", "-v", "VERBOSITY=verbose", "-v", "ON_ERROR_STOP=0"])
        .args(args)
        .env("PGPASSWORD", PASSWORD)
        .output()
        .expect("psql (the postgresql-client package) is installed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// psql as a person uses it: the meta-commands list and describe with SQL types, queries
/// read hot and archived buckets, INSERT, EXPLAIN, the control plane, errors with SQLSTATEs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_meta_commands_queries_and_errors() {
    let s = with_user(&[]).await;
    let target = s._dir.path().join("copied.csv");
    let copy = format!("COPY chat TO '{}'", target.display());
    let (ok, out, err) = psql(
        &s,
        &[
            "-c", "\\dt",
            "-c", "\\dv",
            "-c", "\\d chat",
            "-c", "SELECT channel_id, count(*) AS n, min(id), max(id) FROM chat GROUP BY channel_id ORDER BY channel_id",
            "-c", "SELECT state, count(*) FROM pulpitum_buckets GROUP BY state ORDER BY state",
            "-c", "INSERT INTO chat VALUES (1, TIMESTAMP '2024-02-01T00:00:00Z', 99, 'new')",
            "-c", "INSERT INTO chat VALUES (1, TIMESTAMP '2024-02-01T00:00:01Z', 98, 'gone')",
            "-c", "UPDATE chat SET content = 'edited' WHERE channel_id = 1 AND id IN (1, 98)",
            "-c", "DELETE FROM chat WHERE channel_id = 1 AND id = 98",
            "-c", "SELECT id, content FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC, id DESC LIMIT 2",
            "-c", "EXPLAIN SELECT * FROM chat WHERE channel_id = 1",
            "-c", "ALTER TABLE chat SET (archive_after = '30 days')",
            "-c", "SELECT * FROM nope",
            "-c", "SELEC 1",
            "-c", &copy,
            "-c", "SET datafusion.execution.target_partitions = 1",
            "-c", "SET statement_timeout = '5s'",
            "-c", "SHOW statement_timeout",
            "-c", "ALTER TABLE chat SET (archive_after = '3 months')",
        ],
    );
    // psql's status reflects the last command only (an error here, on purpose).
    let _ = ok;
    for needle in [
        " public | chat | table |",
        " public | pulpitum_buckets         | view |",
        " public | pulpitum_retired_objects | view |",
        "channel_id | bigint                   |           | not null |",
        "timestamp  | timestamp with time zone |           | not null |",
        "content    | text                     |           | not null |",
        "          1 | 31 |                    1 |                  31",
        "          3 |  2 | -9223372036854775808 | 9223372036854775807",
        " archived |       52",
        " hot      |       11",
        "INSERT 0 1",
        // Each change answers with its own tag, as PostgreSQL does.
        "UPDATE 2",
        "DELETE 1",
        " 99 | new",
        " 31 | day 31",
        "PulpitumScanExec: table=chat",
        "archived=26",
        " chat     | 30 days       |",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    for needle in [
        "ERROR:  42P01: Error during planning: table 'datafusion.public.nope' not found",
        "ERROR:  42601: sql parser error",
        "ERROR:  42501: COPY chat TO",
        "ERROR:  22023: table option archive_after: \"3 months\"",
        "ERROR:  42501: parameter \"datafusion.execution.target_partitions\" cannot be set over the wire",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
    assert!(!target.exists(), "COPY wrote a file for a remote client");
}

/// The extended protocol with binary results: a prepared latest-N page pages across the
/// hot/archive seam by keyset, parameters of every column type bind, BIGINT extremes,
/// microsecond TIMESTAMPTZ and UTF-8 text round-trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_pages_cross_the_seam_and_types_round_trip() {
    let s = with_user(&[]).await;
    let c = connect(&s).await;
    let page = c
        .prepare(
            "SELECT timestamp, id, content FROM chat WHERE channel_id = $1 \
             AND (timestamp < $2 OR (timestamp = $2 AND id < $3)) \
             ORDER BY timestamp DESC, id DESC LIMIT 4",
        )
        .await
        .unwrap();
    let mut cursor: (DateTime<Utc>, i64) = ("2100-01-01T00:00:00Z".parse().unwrap(), 0);
    let mut seen = Vec::new();
    loop {
        let rows = c
            .query(&page, &[&1i64, &cursor.0, &cursor.1])
            .await
            .unwrap();
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let t: DateTime<Utc> = r.get(0);
            let id: i64 = r.get(1);
            let content: String = r.get(2);
            assert_eq!(content, format!("day {id}"));
            assert_eq!(t.timestamp_subsec_micros(), 123_456);
            seen.push(id);
            cursor = (t, id);
        }
    }
    assert_eq!(
        seen,
        (1..=31).rev().collect::<Vec<i64>>(),
        "every day once, newest first"
    );

    let extremes = c
        .query(
            "SELECT id, timestamp, content FROM chat WHERE channel_id = $1 ORDER BY id",
            &[&3i64],
        )
        .await
        .unwrap();
    let got: Vec<(i64, String, String)> = extremes
        .iter()
        .map(|r| {
            let t: DateTime<Utc> = r.get(1);
            (r.get(0), t.to_rfc3339(), r.get(2))
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                i64::MIN,
                "2024-01-31T00:00:00.000001+00:00".into(),
                "kleinste".into()
            ),
            (
                i64::MAX,
                "2024-01-31T23:59:59.999999+00:00".into(),
                "größte ✓".into()
            ),
        ]
    );
    // Text and id as parameters too.
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM chat WHERE content = $1 AND id = $2",
            &[&"größte ✓", &i64::MAX],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // A prepared INSERT goes through the general path and reports its count.
    let t: DateTime<Utc> = "2024-02-02T00:00:00.5Z".parse().unwrap();
    let inserted = c
        .execute(
            "INSERT INTO chat VALUES ($1, $2, $3, $4)",
            &[&4i64, &t, &7i64, &"via the wire"],
        )
        .await
        .unwrap();
    assert_eq!(inserted, 1);
    let back: String = c
        .query_one("SELECT content FROM chat WHERE channel_id = $1", &[&4i64])
        .await
        .unwrap()
        .get(0);
    assert_eq!(back, "via the wire");
}

/// Refusals: a wrong password or unknown user, no configured user, too many connections, a
/// statement past its timeout, a cancelled query, a client gone mid-result. After each the
/// server still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_clean_and_the_server_keeps_serving() {
    let s = with_user(&["--max-connections", "2", "--statement-timeout-ms", "1500"]).await;
    for (user, password) in [("alice", "wrong"), ("mallory", PASSWORD)] {
        let e = tokio_postgres::connect(&conninfo(&s, user, password), NoTls)
            .await
            .err()
            .expect("refused");
        assert!(
            code(&e)
                .to_lowercase()
                .starts_with("28p01: password authentication failed"),
            "{}",
            code(&e)
        );
    }
    let a = connect(&s).await;
    let b = connect(&s).await;
    let e = tokio_postgres::connect(&conninfo(&s, "alice", PASSWORD), NoTls)
        .await
        .err()
        .expect("over the limit");
    assert!(code(&e).starts_with("53300"), "{}", code(&e));
    drop(b);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Long enough to outlast the timeout on any machine.
    let slow = "SELECT count(*) FROM generate_series(1, 20000000000)";
    let e = a.simple_query(slow).await.expect_err("timed out");
    assert!(code(&e).starts_with("57014"), "{}", code(&e));
    let e = a.query(slow, &[]).await.expect_err("timed out");
    assert!(code(&e).starts_with("57014"), "{}", code(&e));

    // A client's own, shorter statement_timeout applies to its connection only.
    a.simple_query("SET statement_timeout = '200ms'")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let e = a.simple_query(slow).await.expect_err("timed out");
    assert!(code(&e).starts_with("57014"), "{}", code(&e));
    assert!(
        started.elapsed() < Duration::from_millis(1_200),
        "{:?}",
        started.elapsed()
    );
    a.simple_query("SET statement_timeout = 0").await.unwrap();

    // Cancel from another task while the query runs.
    let token = a.cancel_token();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        token.cancel_query(NoTls).await.unwrap();
    });
    let started = std::time::Instant::now();
    let e = a.simple_query(slow).await.expect_err("cancelled");
    canceller.await.unwrap();
    assert!(code(&e).starts_with("57014"), "{}", code(&e));
    assert!(
        started.elapsed() < Duration::from_millis(1_400),
        "cancelled, not timed out"
    );

    // A client that disconnects mid-statement.
    let c = connect(&s).await;
    let gone = tokio::spawn(async move { c.simple_query(slow).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gone.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let n: i64 = a
        .query_one("SELECT count(*) FROM chat", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 64);
    // The abandoned statement holds its connection slot until its timeout ends it.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let fresh = connect(&s).await;
    fresh.simple_query("SELECT 1").await.unwrap();
}

/// Misconfigurations stop the start with a message, and never fall back to something
/// weaker: no users, no-auth on a public address, TLS files that do not load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_or_broken_configurations_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let (db, archive) = urls(dir.path());
    // The store exists: what is refused below is the server's configuration.
    migrate(&db).await;
    let start = |extra: Vec<String>| {
        let db = db.clone();
        let archive = archive.clone();
        async move {
            let run = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
                .args(["--database-url", &db, "--archive-url", &archive, "serve"])
                .args(&extra)
                .env_remove("PULPITUM_SERVER_USERS_FILE")
                .env_remove("PULPITUM_SERVER_USER")
                .env("PULPITUM_SERVER_PASSWORD", "hunter2-secret")
                .kill_on_drop(true)
                .output();
            // A server that starts would serve forever: that is the failure.
            let out = tokio::time::timeout(Duration::from_secs(30), run)
                .await
                .unwrap_or_else(|_| panic!("{extra:?} started and kept serving"))
                .unwrap();
            assert!(!out.status.success(), "{extra:?} started");
            String::from_utf8_lossy(&out.stderr).into_owned()
        }
    };
    // A users file without roles (the format before roles), and one owned by someone else.
    let old_format = dir.path().join("users-old");
    std::fs::write(&old_format, "alice:hunter2-secret\n").unwrap();
    let foreign = dir.path().join("users-foreign");
    std::fs::write(&foreign, "alice:hunter2-secret:read\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for f in [&old_format, &foreign] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        // As root the file is given away; as anyone else a root-owned file stands in.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        }
    }
    let foreign = if unsafe { libc::geteuid() } == 0 {
        foreign.display().to_string()
    } else {
        "/etc/hostname".to_string()
    };
    let bogus = dir.path().join("bogus.pem");
    std::fs::write(&bogus, "not a certificate").unwrap();
    let bogus = bogus.display().to_string();
    let local = || vec!["--listen".to_string(), "127.0.0.1:0".to_string()];
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    // On loopback, as one user with a role, plus `extra`.
    let reader = |extra: &[&str]| {
        [
            local(),
            strings(&["--user", "alice", "--role", "read"]),
            strings(extra),
        ]
        .concat()
    };
    for (extra, needle) in [
        (local(), "no user is configured"),
        (
            [local(), strings(&["--user", "alice"])].concat(),
            "needs a role: add --role read, write or admin",
        ),
        (
            [
                local(),
                vec!["--users-file".into(), old_format.display().to_string()],
            ]
            .concat(),
            "line 1: no role; add one after a last colon",
        ),
        (
            [local(), vec!["--users-file".into(), foreign.clone()]].concat(),
            "not to the server's user",
        ),
        (
            reader(&["--query-memory-limit", "lots"]),
            "--query-memory-limit: \"lots\" is not a size",
        ),
        (
            strings(&["--insecure-no-auth", "--listen", "0.0.0.0:0"]),
            "is not a loopback address",
        ),
        (
            reader(&["--tls-cert", &bogus, "--tls-key", &bogus]),
            "--tls-cert / --tls-key",
        ),
        (
            reader(&["--tls-cert", &bogus]),
            "--tls-cert and --tls-key go together",
        ),
    ] {
        let err = start(extra).await;
        assert!(err.contains(needle), "{err}");
        assert!(!err.contains("hunter2-secret"), "{err}");
    }
}

fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let ok = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl made a certificate");
    (cert, key)
}

/// With TLS configured, psql over TLS works and a plaintext client is refused (28000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_required_once_configured() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path());
    let s = with_user(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ])
    .await;
    let run = |sslmode: &str| {
        std::process::Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={} user=alice dbname=pulpitum sslmode={sslmode}",
                s.port
            ))
            .args(["-X", "-At", "-c", "SELECT count(*) FROM chat"])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .unwrap()
    };
    let secure = run("require");
    assert!(
        secure.status.success(),
        "{}",
        String::from_utf8_lossy(&secure.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&secure.stdout).trim(), "64");
    let plain = run("disable");
    assert!(!plain.status.success());
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(err.contains("this server requires TLS"), "{err}");
}

/// SIGTERM: the listener closes, a running statement finishes within the grace period, and
/// the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_running_statements_finish() {
    let mut s = with_user(&["--shutdown-grace-seconds", "20"]).await;
    let c = connect(&s).await;
    let running = tokio::spawn(async move {
        c.query_one("SELECT count(*) FROM generate_series(1, 30000000)", &[])
            .await
            .map(|r| r.get::<_, i64>(0))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = s.child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let n = running
        .await
        .unwrap()
        .expect("the running statement finished");
    assert_eq!(n, 30_000_000);
    let status = tokio::time::timeout(Duration::from_secs(30), s.child.wait())
        .await
        .expect("exited within the grace period")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        tokio_postgres::connect(&conninfo(&s, "alice", PASSWORD), NoTls)
            .await
            .is_err(),
        "the listener is closed"
    );
}

/// Runs a driver script against the server; the drivers are installed by
/// scripts/clients-up.sh (which scripts/test.sh runs), so a missing one fails the test.
async fn driver(s: &Served, program: &str, script: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let out = Command::new(program)
        .arg(&path)
        .arg(s.port.to_string())
        .env("PGPASSWORD", PASSWORD)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients"))
        .output()
        .await
        .unwrap_or_else(|e| panic!("{program}: {e} (run scripts/clients-up.sh)"));
    assert!(
        out.status.success(),
        "{script} failed (run scripts/clients-up.sh if a module is missing):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// psycopg 3 (server-side prepared statements, binary results) and node-postgres (named
/// prepared statements) page, round-trip types and see SQLSTATEs as with PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg_and_node_postgres_drivers() {
    let s = with_user(&[]).await;
    driver(&s, "python3", "psycopg_client.py").await;
    driver(&s, "node", "node_client.js").await;
}

/// A table another process registers while the server runs is served at its first use,
/// with no restart; an unknown name is still 42P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_created_after_start_is_served() {
    let s = with_user(&[]).await;
    let c = connect(&s).await;
    let e = c
        .simple_query("SELECT count(*) FROM later")
        .await
        .expect_err("not yet");
    assert!(code(&e).starts_with("42P01"), "{}", code(&e));
    shell(
        &s,
        &[
            "CREATE EXTERNAL TABLE later STORED AS PULPITUM LOCATION '' \
             OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_month_utc')",
            "INSERT INTO later VALUES (5, TIMESTAMP '2024-06-01T00:00:00Z', 1, 'late')",
        ],
    )
    .await;
    let row = c
        .query_one("SELECT channel_id, content FROM later", &[])
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, String>(1)),
        (5, "late".to_string())
    );
}

/// psql's default sslmode (prefer) asks for TLS first; over the connection limit it still
/// gets PostgreSQL's "too many clients" answer, not a failed SSL exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_clients_is_said_whatever_the_sslmode() {
    let s = with_user(&["--max-connections", "1"]).await;
    let _held = connect(&s).await;
    for mode in ["prefer", "disable", "allow"] {
        let out = std::process::Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={} user=alice dbname=pulpitum sslmode={mode}",
                s.port
            ))
            .args(["-X", "-c", "SELECT 1"])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("sorry, too many clients already"),
            "{mode}: {err}"
        );
    }
}

/// Out of file descriptors, accept fails; the server waits longer each time instead of
/// retrying in a tight loop, and serves again once descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_errors_back_off() {
    let dir = seeded().await;
    let (db, archive) = urls(dir.path());
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 64 && exec {} --database-url '{db}' --archive-url '{archive}' serve \
             --listen 127.0.0.1:0 --user alice --role read",
            env!("CARGO_BIN_EXE_pulpitum")
        ))
        .env("PULPITUM_SERVER_PASSWORD", PASSWORD)
        .env("PULPITUM_LOG", "warn")
        .env_remove("PULPITUM_SERVER_USERS_FILE")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port: u16 = loop {
        let line = lines.next_line().await.unwrap().expect("a start line");
        if let Some(addr) = line.strip_prefix("pulpitum: serving PostgreSQL clients on ") {
            break addr.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    let failures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = failures.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("accept failed") {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    // Far more sockets than descriptors: the server runs out while they stay open.
    let mut held = Vec::new();
    for _ in 0..120 {
        if let Ok(Ok(c)) = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        {
            held.push(c);
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = failures.load(std::sync::atomic::Ordering::SeqCst);
    assert!(seen >= 1, "descriptors ran out: {seen}");
    assert!(seen <= 25, "{seen} accept failures in 3 s: no back-off");
    drop(held);
    let served = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let info = format!(
                "host=127.0.0.1 port={port} user=alice password='{PASSWORD}' dbname=pulpitum sslmode=disable"
            );
            if let Ok((c, conn)) = tokio_postgres::connect(&info, NoTls).await {
                tokio::spawn(conn);
                if c.simple_query("SELECT 1").await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "serves again once descriptors are free");
    let _ = child.start_kill();
}

/// A declared table through the wire: its columns and types, an admin's `ALTER TABLE`, and
/// a statement prepared before the change, which is refused once with 0A000 (its columns
/// changed) and works when prepared again, as PostgreSQL does it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_table_is_served_and_prepared_statements_follow_its_changes() {
    let dir = seeded().await;
    let (db, archive) = urls(dir.path());
    let status = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["--database-url", &db, "--archive-url", &archive, "-c"])
        .arg(
            "CREATE EXTERNAL TABLE ev (p BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL, s INTEGER NOT NULL, \
             kind TEXT NOT NULL, amount DOUBLE PRECISION, payload JSON) STORED AS PULPITUM LOCATION '' \
             OPTIONS ('partition_by' 'p', 'time' 'at', 'order_by' 's'); \
             INSERT INTO ev (p, at, s, kind, amount, payload) VALUES \
             (1, TIMESTAMP '2024-02-01T00:00:00Z', 7, 'sale', 2.5, '{\"a\": 1}')",
        )
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let s = serve(
        dir,
        &["--user", "alice", "--role", "admin"],
        &[("PULPITUM_SERVER_PASSWORD", PASSWORD)],
    )
    .await;
    let a = connect(&s).await;
    let b = connect(&s).await;
    // The ad-hoc form of the same shape (its literal lifted to `$1`) shares its cache entry.
    assert_eq!(
        simple_rows(&a, "SELECT * FROM ev WHERE p = 1")
            .await
            .unwrap()[0]
            .len(),
        6
    );
    let stmt = a.prepare("SELECT * FROM ev WHERE p = $1").await.unwrap();
    let rows = a.query(&stmt, &[&1i64]).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].columns().len(), 6);
    assert_eq!(rows[0].get::<_, i32>("s"), 7);
    assert_eq!(rows[0].get::<_, String>("payload"), "{\"a\": 1}");
    b.simple_query("ALTER TABLE ev ADD COLUMN region TEXT NOT NULL DEFAULT 'eu'")
        .await
        .unwrap();
    tokio::time::sleep(pulpitum::provider::factory::SCHEMA_RECHECK).await;
    // The ad-hoc query sees the new column at once (its shape is prepared again), and the
    // statement prepared before the change is still refused, though the shape brought the
    // cache entry of its text up to date first.
    let rows = simple_rows(&a, "SELECT * FROM ev WHERE p = 1")
        .await
        .unwrap();
    assert_eq!(rows[0].len(), 7);
    assert_eq!(rows[0][6].as_deref(), Some("eu"));
    let e = a.query(&stmt, &[&1i64]).await.unwrap_err();
    assert!(code(&e).starts_with("0A000"), "{}", code(&e));
    let again = a.prepare("SELECT * FROM ev WHERE p = $1").await.unwrap();
    let rows = a.query(&again, &[&1i64]).await.unwrap();
    assert_eq!(rows[0].columns().len(), 7);
    assert_eq!(rows[0].get::<_, String>("region"), "eu");
}

/// The rows of a simple-protocol query, as text; an error as its SQLSTATE.
async fn simple_rows(c: &Client, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
    let msgs = c.simple_query(sql).await.map_err(|e| code(&e))?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect())
}

/// Ad-hoc queries run as their prepared shape (literals of the WHERE lifted into
/// parameters) and answer exactly as written: each is compared with a twin whose predicate
/// is wrapped in `(...) IS TRUE`, which filters the same rows and is never lifted, for
/// values that hit the shape's cache, values that do not bind as their literal would
/// (a string for a number, an instant finer than a microsecond), and errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ad_hoc_queries_answer_as_written_through_their_shape() {
    let s = with_user(&[]).await;
    let c = connect(&s).await;
    let shapes: [(&str, &str, &[&str]); 8] = [
        // A number compared with text: SQL casts the text to a number (and fails on `day
        // 1`); bound as a parameter of the column's type it would compare as text.
        (
            "SELECT id FROM chat WHERE ",
            "content = {} ORDER BY id",
            &["5", "7"],
        ),
        (
            "SELECT id, content FROM chat WHERE ",
            "channel_id = {} ORDER BY timestamp DESC, id DESC LIMIT 5",
            &["1", "2", "3", "4", "1"],
        ),
        (
            "SELECT id FROM chat WHERE ",
            "channel_id = '{}' ORDER BY id",
            &["1", "01", "x", " 2"],
        ),
        (
            "SELECT count(*) FROM chat WHERE ",
            "timestamp >= '{}'",
            &[
                "2024-01-20",
                "2024-01-20T12:00:00.1234565Z",
                "2024-01-31T23:59:59.999999Z",
                "not a time",
                "1500-01-01T00:00:00.0000001Z",
            ],
        ),
        (
            "SELECT id FROM chat WHERE ",
            "content LIKE '{}' ORDER BY id",
            &["day 1%", "%✓", "day 3_"],
        ),
        (
            "SELECT id FROM chat WHERE ",
            "id BETWEEN {} ORDER BY id",
            &["3 AND 5", "30 AND 9223372036854775807", "5 AND 3"],
        ),
        (
            "SELECT channel_id, id FROM chat WHERE ",
            "channel_id IN ({}) AND id > 20 ORDER BY 1, 2",
            &["1, 3", "2, 2", "9, 8"],
        ),
        (
            "SELECT id FROM chat WHERE ",
            "id = {} ORDER BY id",
            &["99999999999999999999", "7", "9223372036854775807"],
        ),
    ];
    let mut answered = 0;
    for (head, pred, values) in shapes {
        for v in values {
            let p = pred.replacen("{}", v, 1);
            let (cond, tail) = match p.find(" ORDER BY") {
                Some(i) => p.split_at(i),
                None => (p.as_str(), ""),
            };
            let shaped = format!("{head}{cond}{tail}");
            let twin = format!("{head}({cond}) IS TRUE{tail}");
            let (got, want) = (simple_rows(&c, &shaped).await, simple_rows(&c, &twin).await);
            match (&got, &want) {
                // The same error; the row it names first depends on the scan's order.
                (Err(a), Err(b)) => assert_eq!(
                    a.split('\'').next(),
                    b.split('\'').next(),
                    "{shaped}: {a} / {b}"
                ),
                _ => assert_eq!(got, want, "{shaped}"),
            }
            answered += usize::from(got.as_ref().is_ok_and(|r| !r.is_empty()));
        }
    }
    assert!(answered >= 15, "{answered} answered with rows");
    // A NULL into a NOT NULL column is PostgreSQL's not_null_violation, naming the column.
    let e = simple_rows(
        &c,
        "INSERT INTO chat VALUES (NULL, TIMESTAMP '2024-01-01T00:00:00Z', 1, 'x')",
    )
    .await
    .unwrap_err();
    assert!(e.starts_with("23502") && e.contains("channel_id"), "{e}");
}

/// `DEFAULT` as a value of `INSERT ... VALUES` over the wire, in a simple Query and in a
/// prepared statement beside parameters: each row reads back the column's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_values_in_insert_rows_over_the_wire() {
    let s = with_user(&[]).await;
    shell(
        &s,
        &[
            "CREATE EXTERNAL TABLE ev (k BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL, \
           s BIGINT NOT NULL, note TEXT DEFAULT 'none', n INTEGER DEFAULT 7) \
           STORED AS PULPITUM LOCATION '' OPTIONS ('partition_by' 'k', 'time' 'at', \
           'order_by' 's', 'bucket_strategy' 'calendar_day_utc')",
        ],
    )
    .await;
    let c = connect(&s).await;
    c.simple_query(
        "INSERT INTO ev VALUES (1, TIMESTAMPTZ '2026-11-01T10:00:00Z', 1, DEFAULT, DEFAULT)",
    )
    .await
    .unwrap();
    let n = c
        .execute(
            "INSERT INTO ev (k, at, s, note, n) VALUES ($1, TIMESTAMPTZ '2026-11-01T11:00:00Z', \
             $2, DEFAULT, $3)",
            &[&2i64, &2i64, &3i32],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let rows: Vec<(i64, String, i32)> = c
        .query("SELECT k, note, n FROM ev ORDER BY s", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        [(1, "none".to_string(), 7), (2, "none".to_string(), 3)]
    );
}
