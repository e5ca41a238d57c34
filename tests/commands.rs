//! Both binaries' command lines, as an operator meets them: `policy` and `migrate`, flags
//! before or after a subcommand, output into a closed pipe, the exit status of a refused
//! setting, and errors and help that say what to do.

use std::path::Path;
use std::process::Command;

#[path = "support/cli.rs"]
mod cli;

use cli::{archiver, archiver_in, seeded_store, NOWHERE};

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
        out.contains("| chat     | 90 days       | json   |               |            | true   |"),
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
        out.contains("| chat     |               | json   |               |            | false  |"),
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
    // Retention is set from the command line as from SQL, and the answer shows it.
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"))
        .args([
            "policy",
            "set",
            "chat",
            "retain_for=5 years",
            "--database-url",
            &url,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| retain_for |") && stdout.contains("| 5 years    |"),
        "{stdout}"
    );
    let (code, err) = archiver(
        &[
            "policy",
            "set",
            "chat",
            "retain_for=soon",
            "--database-url",
            &url,
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("retain_for"), "{err}");
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

/// The help says what the program accepts: every database form, in both binaries; the
/// cleanup delay's real range.
#[test]
fn help_lists_what_is_accepted() {
    let help = |bin: &str, args: &[&str]| {
        let out = Command::new(bin).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).replace(char::is_whitespace, "")
    };
    for bin in [
        env!("CARGO_BIN_EXE_pulpitum-archiver"),
        env!("CARGO_BIN_EXE_pulpitum"),
    ] {
        let help = help(bin, &["--help"]);
        for form in [
            "postgres://",
            "postgresql://",
            "key=valuestring",
            "sqlite:PATH",
            "sqlite://PATH",
            "sqlite::memory:",
            ".db,.sqliteor.sqlite3",
        ] {
            assert!(
                help.contains(form),
                "{bin}: --database-url help lacks {form}"
            );
        }
        for form in ["s3://", "file:///", "memory://"] {
            assert!(
                help.contains(form),
                "{bin}: --archive-url help lacks {form}"
            );
        }
    }
    let archiver = help(env!("CARGO_BIN_EXE_pulpitum-archiver"), &["--help"]);
    assert!(archiver.contains("0to604800"), "cleanup delay range");
    assert!(!archiver.contains("route-cacheTTL") && !archiver.contains("atleastthereaders"));
}

/// A subcommand's help offers only the flags it takes: the global flags it refuses (the
/// query limits and the archive URL for `migrate`, the archive URL for `policy`) are not
/// listed, though the top-level help lists them.
#[test]
fn a_subcommands_help_leaves_out_the_flags_it_refuses() {
    let help = |bin: &str, args: &[&str]| {
        let out = Command::new(bin).args(args).output().unwrap();
        assert!(out.status.success(), "{bin} {args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shell = env!("CARGO_BIN_EXE_pulpitum");
    let archiver = env!("CARGO_BIN_EXE_pulpitum-archiver");
    let top = help(shell, &["--help"]);
    for flag in [
        "--max-rows",
        "--max-bytes",
        "--max-duration-ms",
        "--archive-url",
    ] {
        assert!(top.contains(flag), "pulpitum --help lacks {flag}");
    }
    for (bin, args, refused) in [
        (
            shell,
            &["migrate", "--help"][..],
            &[
                "--max-rows",
                "--max-bytes",
                "--max-duration-ms",
                "--archive-url",
            ][..],
        ),
        (archiver, &["migrate", "--help"], &["--archive-url"]),
        (archiver, &["policy", "show", "--help"], &["--archive-url"]),
        (archiver, &["policy", "--help"], &["--archive-url"]),
    ] {
        let text = help(bin, args);
        assert!(text.contains("--database-url"), "{args:?}: {text}");
        for flag in refused {
            assert!(!text.contains(flag), "{bin} {args:?} lists {flag}: {text}");
        }
    }
    assert!(help(shell, &["serve", "--help"]).contains("--max-rows"));
}

/// `--archive-url` with a subcommand that never opens the archive (`migrate` in both
/// binaries, `policy`) is refused, exit 2, with the same line wherever it is typed: before
/// or after the subcommand.
#[test]
fn an_archive_url_is_refused_where_it_would_be_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let url = seeded_store(&dir.path().join("p.db"));
    let run = |bin: &str, args: &[&str]| {
        let out = Command::new(bin)
            .args(args)
            .env_remove("PULPITUM_DATABASE_URL")
            .env_remove("PULPITUM_ARCHIVE_URL")
            .env("PULPITUM_LOG", "error")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let a = "--archive-url";
    let m = "memory://";
    let archiver_line = "--archive-url is for a run (without a subcommand)";
    let shell_line = "--archive-url names the archive; migrate touches only the hot store";
    for (bin, args, line) in [
        (
            env!("CARGO_BIN_EXE_pulpitum-archiver"),
            &[a, m, "policy", "show", "--database-url", &url][..],
            archiver_line,
        ),
        (
            env!("CARGO_BIN_EXE_pulpitum-archiver"),
            &["policy", "show", a, m, "--database-url", &url],
            archiver_line,
        ),
        (
            env!("CARGO_BIN_EXE_pulpitum-archiver"),
            &[a, m, "migrate", "--database-url", &url],
            archiver_line,
        ),
        (
            env!("CARGO_BIN_EXE_pulpitum-archiver"),
            &["migrate", a, m, "--database-url", &url],
            archiver_line,
        ),
        (
            env!("CARGO_BIN_EXE_pulpitum"),
            &[a, m, "migrate", "--database-url", &url],
            shell_line,
        ),
        (
            env!("CARGO_BIN_EXE_pulpitum"),
            &["migrate", a, m, "--database-url", &url],
            shell_line,
        ),
    ] {
        let (code, err) = run(bin, args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(line), "{args:?}: {err}");
    }
    // The query limits likewise, after `migrate` or before it.
    for args in [
        &["migrate", "--max-rows", "5", "--database-url", &url][..],
        &["--max-bytes", "5", "migrate", "--database-url", &url],
    ] {
        let (code, err) = run(env!("CARGO_BIN_EXE_pulpitum"), args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("queries; migrate runs none"),
            "{args:?}: {err}"
        );
    }
    let (code, err) = run(
        env!("CARGO_BIN_EXE_pulpitum"),
        &["migrate", "--database-url", &url],
    );
    assert_eq!(code, Some(0), "{err}");
}

/// A configuration the shell cannot start with (an archive "URL" that is a path, an embedded
/// store that does not exist, a refused connection) exits 2 before any work, as the
/// archiver does for the same refusals; a statement that fails exits 1.
#[test]
fn the_shell_and_the_archiver_exit_2_for_the_same_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let missing = missing.to_str().unwrap();
    for (db, archive, needle) in [
        (
            "sqlite::memory:",
            "/tmp/relative",
            "write file:///tmp/relative",
        ),
        (missing, "memory://", "no embedded store at"),
        (NOWHERE, "memory://", "Connection refused"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
            .current_dir(dir.path())
            .args(["--database-url", db, "--archive-url", archive])
            .args(["-c", "SELECT 1"])
            .env("PULPITUM_LOG", "error")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "pulpitum {db} {archive}: {err}");
        assert!(err.contains(needle), "{err}");
        let (code, err) = archiver_in(
            Some(dir.path()),
            &["--once", "--database-url", db, "--archive-url", archive],
            &[],
        );
        assert_eq!(code, 2, "pulpitum-archiver {db} {archive}: {err}");
        assert!(err.contains(needle), "{err}");
    }
    assert!(!Path::new(missing).exists(), "no start creates the store");
    let out = Command::new(env!("CARGO_BIN_EXE_pulpitum"))
        .args([
            "--database-url",
            "sqlite::memory:",
            "--archive-url",
            "memory://",
        ])
        .args(["-c", "SELECT * FROM nothing_here"])
        .env("PULPITUM_LOG", "error")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// The shell refuses a statement past the wire server's shape limits with the server's
/// message and carries on, where a 10,000-term expression used to overflow its main
/// thread's stack and abort the process; the deepest statement the limits allow runs.
#[test]
fn the_shell_refuses_statements_too_deep_to_plan_and_runs_the_deepest_it_allows() {
    let shell = |sql: &str| {
        Command::new(env!("CARGO_BIN_EXE_pulpitum"))
            .args([
                "--database-url",
                "sqlite::memory:",
                "--archive-url",
                "memory://",
            ])
            .args(["-c", sql])
            .env("PULPITUM_LOG", "error")
            .output()
            .unwrap()
    };
    let deep = format!("SELECT 1{}", "+1".repeat(10_000));
    let out = shell(&deep);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("statement too complex"), "{err}");
    // Just under the depth limit (1,000): planned and answered on the shell's threads.
    let allowed = format!("SELECT 1{}", "+1".repeat(990));
    let out = shell(&allowed);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("991"));
}
