//! No secret leaves a process: both binaries run with credentials in every place they accept
//! (URL userinfo, URL query, key=value `password`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`; as flags and as environment variables), in failing and succeeding
//! invocations against the real PostgreSQL and S3 services (help, an unreachable host, a
//! refused connection string, a refused archive URL, queries with EXPLAIN, an archiver pass
//! with metrics served and scraped), and every byte they print is searched for the secrets.

mod archiver_support;

use std::io::{Read, Write};
use std::process::{Command, Output};
use std::time::Duration;

use archiver_support::*;

const PG_SECRET: &str = "PgPassw0rdLeak";
const QUERY_SECRET: &str = "QueryPassLeak";
const KV_SECRET: &str = "KvPassLeak";
const TOKEN_SECRET: &str = "SessTokenLeak";
const S3_URL_SECRET: &str = "UrlS3KeyLeak";

/// Every secret of this test, including the real S3 secret key.
fn secrets() -> Vec<String> {
    let real = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "SKTESTSECRET".into());
    [
        PG_SECRET,
        QUERY_SECRET,
        KV_SECRET,
        TOKEN_SECRET,
        S3_URL_SECRET,
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([real])
    .collect()
}

fn bin(name: &str) -> Command {
    let path = match name {
        "pulpitum" => env!("CARGO_BIN_EXE_pulpitum"),
        _ => env!("CARGO_BIN_EXE_pulpitum-archiver"),
    };
    let mut c = Command::new(path);
    c.env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .env_remove("PULPITUM_FAILPOINT")
        .env_remove("PULPITUM_FAULT_RATE")
        .env("PULPITUM_LOG", "debug");
    for (k, v) in S3_ENV {
        c.env(k, std::env::var(k).unwrap_or_else(|_| v.to_string()));
    }
    c
}

/// Runs the command and fails the test if any secret is in its output; returns the output.
fn run_clean(what: &str, c: &mut Command) -> Output {
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for s in secrets() {
        assert!(!text.contains(&s), "{what} printed the secret {s}:\n{text}");
    }
    out
}

/// The database URL of `schema` with a password in the userinfo (trust auth ignores it).
fn with_password(db_url: &str) -> String {
    db_url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{PG_SECRET}@"),
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_help_errors_logs_metrics_or_plans() {
    let db = fresh_database("secrets").await;
    let db_pw = with_password(&db);
    let db_query = format!("{db}&password={QUERY_SECRET}");
    let schema = db
        .split("search_path%3D")
        .nth(1)
        .and_then(|s| s.split('&').next())
        .unwrap()
        .to_string();
    let db_kv =
        format!("host=127.0.0.1 port=5432 user=postgres password={KV_SECRET} dbname=test options='-c search_path={schema}'");
    let archive = fresh_archive_url("secrets");

    // Help shows which variables exist, never their values.
    for name in ["pulpitum", "pulpitum-archiver"] {
        let out = run_clean(
            &format!("{name} --help"),
            bin(name)
                .arg("--help")
                .env("PULPITUM_DATABASE_URL", &db_pw)
                .env("PULPITUM_ARCHIVE_URL", &archive)
                .env("AWS_SESSION_TOKEN", TOKEN_SECRET),
        );
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("PULPITUM_DATABASE_URL"));
    }

    // Failures: an unreachable host (flag and environment), a connection string that is
    // refused, an unreachable key=value string, archive URLs carrying credentials.
    let unreachable = format!("postgres://postgres:{PG_SECRET}@127.0.0.1:1/test");
    let unreachable_kv = format!("host=127.0.0.1 port=1 user=postgres password={KV_SECRET}");
    let refused_kv = format!("host=127.0.0.1 password={KV_SECRET} frobnicate=1");
    let unknown_scheme = format!("mysql://root:{PG_SECRET}@127.0.0.1/x");
    let s3_userinfo = format!("s3://AKTEST:{S3_URL_SECRET}@pulpitum-test/p");
    let s3_query = format!("s3://pulpitum-test/p?secret_access_key={S3_URL_SECRET}");
    let failing: Vec<(&str, &str)> = vec![
        (unreachable.as_str(), archive.as_str()),
        (unreachable_kv.as_str(), archive.as_str()),
        (refused_kv.as_str(), archive.as_str()),
        (unknown_scheme.as_str(), archive.as_str()),
        (db_pw.as_str(), s3_userinfo.as_str()),
        (db_pw.as_str(), s3_query.as_str()),
    ];
    for (d, a) in &failing {
        for name in ["pulpitum", "pulpitum-archiver"] {
            let mut by_flag = bin(name);
            by_flag.args(["--database-url", d, "--archive-url", a]);
            let mut by_env = bin(name);
            by_env
                .env("PULPITUM_DATABASE_URL", d)
                .env("PULPITUM_ARCHIVE_URL", a);
            for (how, c) in [("flags", &mut by_flag), ("env", &mut by_env)] {
                if name == "pulpitum" {
                    c.args(["-c", "SELECT 1"]);
                } else {
                    c.arg("--once");
                }
                c.env("AWS_SESSION_TOKEN", TOKEN_SECRET);
                let out = run_clean(&format!("{name} ({how}) with {d} / {a}"), c);
                assert!(!out.status.success(), "{name} {d} {a} should fail");
            }
        }
    }

    // The owner's step, with the password in the URL: it prints the URL it migrated,
    // redacted.
    let out = run_clean(
        "pulpitum migrate",
        bin("pulpitum").args(["migrate", "--database-url", &db_pw]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("postgres:***@"));

    // Successes against the real services: DDL, INSERT, SELECT and EXPLAIN through every
    // accepted form of the database credentials.
    let script = "CREATE EXTERNAL TABLE IF NOT EXISTS chat STORED AS PULPITUM LOCATION '' \
                  OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc'); \
                  INSERT INTO chat VALUES (7, TIMESTAMP '2021-03-01T12:00:00Z', 1, 'hi'); \
                  SELECT count(*) FROM chat; \
                  EXPLAIN SELECT * FROM chat WHERE channel_id = 7 ORDER BY timestamp DESC LIMIT 5; \
                  EXPLAIN ANALYZE SELECT count(*) FROM chat;";
    for (i, d) in [db_pw.as_str(), db_query.as_str(), db_kv.as_str()]
        .into_iter()
        .enumerate()
    {
        let script = script.replace("1, 'hi'", &format!("{}, 'hi'", i + 1));
        let out = run_clean(
            &format!("pulpitum with {d}"),
            bin("pulpitum").args([
                "--database-url",
                d,
                "--archive-url",
                &archive,
                "-c",
                &script,
            ]),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{d}: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("PulpitumScan") || stdout.contains("Pulpitum"),
            "{stdout}"
        );
    }

    // An archiver pass serving metrics, scraped while it runs; then `--once` with metrics.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut daemon = bin("pulpitum-archiver")
        .env("PULPITUM_DATABASE_URL", &db_pw)
        .env("PULPITUM_ARCHIVE_URL", &archive)
        .args([
            "--eligible-before",
            "2022-01-01T00:00:00Z",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--cleanup-delay-seconds",
            "0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut scraped = String::new();
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s.read_to_string(&mut scraped).unwrap();
            if scraped.contains("buckets_archived_total 1") {
                break;
            }
        }
        scraped.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon.kill().unwrap();
    let out = daemon.wait_with_output().unwrap();
    let daemon_text = format!(
        "{scraped}{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(scraped.contains("pulpitum_archiver"), "{daemon_text}");
    for s in secrets() {
        assert!(
            !daemon_text.contains(&s),
            "the archiver printed {s}:\n{daemon_text}"
        );
    }
    let out = run_clean(
        "pulpitum-archiver --once",
        bin("pulpitum-archiver")
            .env("PULPITUM_DATABASE_URL", &db_kv)
            .env("PULPITUM_ARCHIVE_URL", &archive)
            .args([
                "--once",
                "--eligible-before",
                "2022-01-01T00:00:00Z",
                "--metrics-addr",
                "localhost:0",
                "--cleanup-delay-seconds",
                "0",
            ]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `Debug` of the store settings and of a locator shows no password.
#[test]
fn debug_output_hides_passwords() {
    let url = format!("postgres://app:{PG_SECRET}@db/x?password={QUERY_SECRET}");
    let config = pulpitum::store::postgres::PgStoreConfig::new(&url);
    let kv = format!("host=db password={KV_SECRET}");
    let shown = format!(
        "{config:?} {:?} {:?}",
        pulpitum::locator::parse_database_url(&url).unwrap(),
        pulpitum::locator::parse_database_url(&kv).unwrap()
    );
    for s in [PG_SECRET, QUERY_SECRET, KV_SECRET] {
        assert!(!shown.contains(s), "{shown}");
    }
    assert!(shown.contains("app:***@db"), "{shown}");
}
