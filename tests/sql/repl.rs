//! The `pulpitum` binary: scripts through -c, -f and stdin, output formats, exit codes.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::common::*;

fn url_for(schema: &str) -> String {
    format!("{PG_URL}?options=-c%20search_path%3D{schema}")
}

fn pulpitum(env_url: &str, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(args)
        .env("PULPITUM_DATABASE_URL", env_url)
        .env("PULPITUM_ARCHIVE_URL", "memory://")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pulpitum");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_formats_and_exit_codes() {
    let env = Env::new("repl").await;
    let schema = env.store.schema().unwrap().to_string();
    let url = url_for(&schema);
    let (ok, out, err) = pulpitum(
        &url,
        &[
            "-c",
            "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('bucket_strategy' 'calendar_day_utc');",
            "-c",
            "INSERT INTO chat VALUES (1, TIMESTAMP '2024-01-01T00:00:00Z', 1, 'a,b'), (1, TIMESTAMP '2024-01-01T00:00:01Z', 2, 'c');",
            "--format",
            "csv",
            "-c",
            "SELECT id, content FROM chat WHERE channel_id = 1 ORDER BY timestamp, id",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.ends_with("id,content\n1,\"a,b\"\n2,c\n"), "{out}");

    let (ok, out, err) = pulpitum(
        &url,
        &["--format", "json"],
        Some(
            "SELECT id\n  FROM chat\n  WHERE channel_id = 1\n  ORDER BY id DESC\n  LIMIT 1;\n\\d\n",
        ),
    );
    assert!(ok, "{err}");
    assert!(out.starts_with("{\"id\":2}\n"), "{out}");
    assert!(out.contains("\"table_name\":\"chat\""), "{out}");

    // Limits from the command line.
    let (ok, _, err) = pulpitum(&url, &["--max-rows", "1", "-c", "SELECT * FROM chat"], None);
    assert!(!ok && err.contains("max_rows = 1"), "{err}");

    // A script stops at the first error and exits non-zero.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.sql");
    std::fs::write(&file, "SELECT 1;\nSELECT * FROM missing;\nSELECT 2;\n").unwrap();
    let (ok, out, err) = pulpitum(&url, &["-f", file.to_str().unwrap()], None);
    assert!(!ok);
    assert!(err.contains("missing"), "{err}");
    assert!(!out.contains("Int64(2)") && !out.contains("| 2 "), "{out}");

    // Without URLs the shell uses the embedded default in the working folder and says so;
    // half a configuration is refused.
    let here = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .current_dir(here.path())
        .args(["-c", "SELECT 1"])
        .env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("./pulpitum-data"));
    assert!(here.path().join("pulpitum-data/hot.sqlite3").exists());
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .current_dir(here.path())
        .args(["--database-url", &url, "-c", "SELECT 1"])
        .env_remove("PULPITUM_ARCHIVE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("go together"));
    env.cleanup().await;
}

/// An empty result prints its header (and `(0 rows)` in table format), a statement without
/// a result prints nothing, the README's CREATE can be run again, and `DROP TABLE` is
/// refused, `IF EXISTS` or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_results_and_table_statements() {
    let env = Env::new("repl_empty").await;
    let schema = env.store.schema().unwrap().to_string();
    let url = url_for(&schema);
    let create = "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
                  OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc');";
    for _ in 0..2 {
        let (ok, out, err) = pulpitum(&url, &["-c", create], None);
        assert!(ok, "{err}");
        assert_eq!(out, "", "DDL prints nothing");
    }
    let empty = "SELECT id, content FROM chat WHERE channel_id = 99";
    let (ok, out, err) = pulpitum(&url, &["-c", empty], None);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "+----+---------+\n| id | content |\n+----+---------+\n+----+---------+\n(0 rows)\n"
    );
    let (ok, out, err) = pulpitum(
        &url,
        &["--format", "csv"],
        Some(format!("{empty};\n").as_str()),
    );
    assert!(ok, "{err}");
    assert_eq!(out, "id,content\n");
    let (ok, out, err) = pulpitum(&url, &["--format", "json", "-c", empty], None);
    assert!(ok, "{err}");
    assert_eq!(out, "", "JSON lines: no object for no row");
    for drop in ["DROP TABLE chat", "DROP TABLE IF EXISTS chat"] {
        let (ok, _, err) = pulpitum(&url, &["-c", drop], None);
        assert!(!ok, "{drop} succeeded");
        assert!(err.contains("DROP TABLE is not supported"), "{err}");
    }
    let (ok, out, err) = pulpitum(
        &url,
        &["--format", "csv", "-c", "SELECT count(*) AS n FROM chat"],
        None,
    );
    assert!(ok && out == "n\n0\n", "{out} {err}");
    env.cleanup().await;
}

/// `\buckets [NAME]` lists the tiering queue (not fully archived buckets) with the reason,
/// then counts per state; a name is a value, so a quote in it finds nothing and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_shortcut_shows_the_queue() {
    let env = Env::new("replbuckets").await;
    let schema = env.store.schema().unwrap().to_string();
    let url = url_for(&schema);
    let (ok, out, err) = pulpitum(
        &url,
        &[
            "-c",
            "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('bucket_strategy' 'calendar_day_utc');",
            "-c",
            "INSERT INTO chat VALUES (7, TIMESTAMP '2024-01-01T00:00:00Z', 1, 'a'), (7, TIMESTAMP '2024-01-02T00:00:01Z', 2, 'c');",
            "-c",
            "ALTER TABLE chat SET (paused = true)",
            "--format",
            "csv",
            "-c",
            "\\buckets chat",
            "-c",
            "\\buckets chat'; DROP TABLE chat",
            "-c",
            "\\d chat",
            "-c",
            "SELECT count(*) AS n FROM chat",
        ],
        None,
    );
    assert!(ok, "{err}");
    // \d NAME names SQL types, as psql does through the wire server.
    assert!(
        out.contains(
            "column_name,type,nullable\nchannel_id,bigint,no\ntimestamp,timestamp with time zone,no\nid,bigint,no\ncontent,text,no\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "table_id,partition,bucket_key,state,eligible,reason\n\
             chat,7,day:2024-01-01,hot,false,paused: this table (SYSTEM START MOVES <table> resumes)\n\
             chat,7,day:2024-01-02,hot,false,paused: this table (SYSTEM START MOVES <table> resumes)\n\
             table_id,state,eligible,buckets\nchat,hot,false,2\n"
        ),
        "{out}"
    );
    assert!(out.ends_with("n\n2\n"), "{out}");
    env.cleanup().await;
}
