//! The newcomer's path, as a new user runs it: `pulpitum demo --small` on the embedded
//! default in an empty folder, then plain SQL through the `pulpitum` binary. Counts must
//! agree across tiers: archived days plus hot days equal everything loaded.

use std::process::Command;

fn pulpitum(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .current_dir(dir)
        .args(args)
        .env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .output()
        .expect("run pulpitum");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `pulpitum` with `stdin` piped in (not a terminal).
fn pulpitum_with_stdin(
    dir: &std::path::Path,
    args: &[&str],
    stdin: &str,
) -> (bool, String, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .current_dir(dir)
        .args(args)
        .env_remove("PULPITUM_DATABASE_URL")
        .env_remove("PULPITUM_ARCHIVE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pulpitum");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn single_number(csv: &str) -> u64 {
    let line = csv
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no value in {csv:?}"));
    line.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {line:?}"))
}

fn number_after(text: &str, before: &str, after: &str) -> u64 {
    let start = text
        .find(before)
        .unwrap_or_else(|| panic!("{before:?} not in {text}"))
        + before.len();
    let rest = &text[start..];
    rest[..rest.find(after).unwrap()].trim().parse().unwrap()
}

#[test]
fn demo_runs_on_the_embedded_default_and_both_tiers_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = pulpitum(dir.path(), &["demo", "--small", "--no-shell"]);
    assert!(ok, "demo failed: {err}");
    assert!(
        err.contains("keeping data in ./pulpitum-data"),
        "the default is not announced: {err}"
    );
    assert!(dir.path().join("pulpitum-data/hot.sqlite3").exists());
    let loaded = number_after(&out, "Loaded ", " messages");
    let archived_rows = number_after(&out, "buckets (", " rows)");
    assert!(loaded > 1_000, "{out}");
    assert!(archived_rows > 0 && archived_rows < loaded, "{out}");
    // The EXPLAIN the demo prints shows hot and archived buckets in one scan.
    let hot = number_after(&out, "buckets=[hot=", ",");
    let archived = number_after(&out, "archived=", ",");
    assert!(hot > 0 && archived > 0, "{out}");

    let cutoff = out
        .split("that ended by ")
        .nth(1)
        .and_then(|s| s.split('.').next())
        .unwrap()
        .trim()
        .to_string();
    let count = |sql: &str| {
        let (ok, out, err) = pulpitum(dir.path(), &["--format", "csv", "-c", sql]);
        assert!(ok, "{sql}: {err}");
        single_number(&out)
    };
    let total = count("SELECT count(*) FROM chat");
    let cold = count(&format!(
        "SELECT count(*) FROM chat WHERE timestamp < '{cutoff}'"
    ));
    let hot_rows = count(&format!(
        "SELECT count(*) FROM chat WHERE timestamp >= '{cutoff}'"
    ));
    assert_eq!(
        total, loaded,
        "every loaded message is visible exactly once"
    );
    assert_eq!(cold, archived_rows, "archived rows answer from the archive");
    assert_eq!(cold + hot_rows, total);
    let per_channel = count("SELECT count(DISTINCT channel_id) FROM chat");
    assert_eq!(per_channel, 3);

    // Running the demo again reuses the data: nothing loaded, nothing archived twice. With
    // standard input not a terminal, the demo runs it as a script after its examples, as
    // the shell does, and the script's first error fails the run.
    let (ok, out, err) = pulpitum_with_stdin(
        dir.path(),
        &["demo", "--small", "--format", "csv"],
        "SELECT count(*) AS from_stdin FROM chat;\n",
    );
    assert!(ok, "{err}");
    assert_eq!(number_after(&out, "Loaded ", " messages"), 0);
    assert!(
        out.ends_with(&format!("from_stdin\n{total}\n")),
        "the script did not run last: {out}"
    );
    assert_eq!(count("SELECT count(*) FROM chat"), total);
    let (ok, _, err) = pulpitum_with_stdin(
        dir.path(),
        &["demo", "--small"],
        "SELECT 1;\nSELECT nope FROM chat;\n",
    );
    assert!(!ok, "a failing script must fail the demo");
    assert!(err.contains("nope"), "{err}");

    // A bad statement fails the script with a clear error and a non-zero exit.
    let (ok, _, err) = pulpitum(dir.path(), &["-c", "SELECT nope FROM chat"]);
    assert!(!ok);
    assert!(err.contains("nope"), "{err}");
}
