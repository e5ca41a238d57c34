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
/// then counts per state; a name is a value, so a quote in it runs nothing, and a name that
/// is no table is an error, not an empty answer.
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
    assert!(
        !err.contains("queued buckets"),
        "a short queue is not cut: {err}"
    );

    for name in ["nosuch", "chat'; DROP TABLE chat"] {
        let (ok, out, err) = pulpitum(&url, &["-c", &format!("\\buckets {name}")], None);
        assert!(!ok, "{name}: {out}");
        let first = name.split_whitespace().next().unwrap();
        assert!(err.contains(&format!("no table named \"{first}")), "{err}");
        assert_eq!(out, "", "no empty tables for a missing table");
    }

    // A queue longer than the shortcut shows: the first 100, and a line that says so.
    let days: Vec<String> = (0..130)
        .map(|d| {
            let t = chrono::DateTime::parse_from_rfc3339("2023-01-01T12:00:00Z").unwrap()
                + chrono::Duration::days(d);
            format!("(8, TIMESTAMP '{}', {d}, 'x')", t.to_rfc3339())
        })
        .collect();
    let insert = format!("INSERT INTO chat VALUES {}", days.join(", "));
    let (ok, out, err) = pulpitum(
        &url,
        &["--format", "csv", "-c", &insert, "-c", "\\buckets"],
        None,
    );
    assert!(ok, "{err}");
    let queue_rows = out
        .lines()
        .skip_while(|l| !l.starts_with("table_id,partition"))
        .skip(1)
        .take_while(|l| !l.starts_with("table_id,state"))
        .count();
    assert_eq!(queue_rows, 100, "{out}");
    assert!(
        err.contains("(the oldest 100 of 132 queued buckets;"),
        "the cut is announced: {err}"
    );
    assert!(out.contains("chat,hot,false,132\n"), "{out}");
    env.cleanup().await;
}

/// `pulpitum -c ... | head -1`: the reader goes away and the shell ends as a writer to a
/// closed pipe conventionally does (SIGPIPE), without an error line or a panic.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_the_shell_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new("replpipe").await;
    let url = url_for(env.store.schema().unwrap());
    for format in ["table", "csv", "json"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
            .args([
                "--format",
                format,
                "-c",
                "SELECT * FROM generate_series(1, 200000)",
            ])
            .env("PULPITUM_DATABASE_URL", &url)
            .env("PULPITUM_ARCHIVE_URL", "memory://")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // `head -1`: read one line, then close the pipe.
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(!line.is_empty());
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{format}: {err}");
        assert!(
            !err.contains("Error") && !err.contains("panicked"),
            "{format}: {err}"
        );
    }
    env.cleanup().await;
}

/// What the shell says to statements it does not run, and to settings it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_statements_and_refused_settings_say_what_to_do() {
    let env = Env::new("replrefuse").await;
    let url = url_for(env.store.schema().unwrap());
    let (ok, _, err) = pulpitum(
        &url,
        &["-c", "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('bucket_strategy' 'calendar_day_utc')"],
        None,
    );
    assert!(ok, "{err}");
    // DELETE and UPDATE run (docs/sql.md); what they cannot do is refused in one line.
    let (ok, _, err) = pulpitum(&url, &["-c", "DELETE FROM chat WHERE id = 1"], None);
    assert!(ok, "{err}");
    let (ok, _, err) = pulpitum(&url, &["-c", "UPDATE chat SET id = 2"], None);
    assert!(!ok && err.contains("UPDATE may set only content"), "{err}");
    let (ok, _, err) = pulpitum(&url, &["-c", "TRUNCATE TABLE chat"], None);
    assert!(!ok);
    assert!(
        err.contains("TRUNCATE is not supported for Pulpitum tables yet")
            && err.contains("DELETE FROM")
            && !err.contains("Base table"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // A setting refused before start exits 2 (as the archiver does, and as clap does for
    // a flag); a statement that fails exits 1.
    let status = |args: &[&str], envs: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pulpitum"));
        c.args(args)
            .env("PULPITUM_DATABASE_URL", &url)
            .env("PULPITUM_ARCHIVE_URL", "memory://");
        for (k, v) in envs {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = status(&["-c", "SELECT 1"], &[("PULPITUM_LOG", "verbose")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("PULPITUM_LOG"), "{err}");
    let (code, err) = status(&["-c", "SELECT * FROM nothing_here"], &[]);
    assert_eq!(code, Some(1), "{err}");
    // --format prints results; serve and migrate print none, so it is refused there.
    for args in [
        &["--format", "csv", "serve"][..],
        &["--format", "csv", "migrate"],
    ] {
        let (code, err) = status(args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("--format"), "{err}");
    }
    let (code, err) = status(&["serve", "--format", "csv"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unexpected argument '--format'"), "{err}");
    // Global flags after the subcommand.
    let (code, err) = status(
        &[
            "shell",
            "--format",
            "csv",
            "--max-rows",
            "1",
            "-c",
            "SELECT 1",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "-c belongs before the subcommand: {err}");
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args(["shell", "--format", "csv", "--database-url", &url])
        .args(["--archive-url", "memory://"])
        .env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(b"SELECT 1 AS one;\n")?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\n1\n");
    env.cleanup().await;
}
