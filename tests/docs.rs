//! The doc-test harness: every fenced block of README.md and docs/**/*.md is classified by
//! its info string and, where it is a command, run as written, so the docs cannot drift
//! from the program.
//!
//! - ` ```sql `: run by the built `pulpitum` shell (`pulpitum -f`) twice: on the page's own
//!   embedded store in a temp folder, and on the real PostgreSQL (a fresh schema) with the
//!   real S3 (a fresh prefix); each migrated and holding the README's `chat` table. The
//!   blocks of a page share those stores, in page order, and an expectation after a block
//!   must hold on both.
//! - ` ```sql hot-store `: statements an operator sends to the hot store itself (psql), run on
//!   the real PostgreSQL in a fresh schema migrated by `pulpitum migrate`.
//! - ` ```sh `: run by bash (`-e -o pipefail`) in the page's folder, with the built
//!   `pulpitum` and `pulpitum-archiver` first on `PATH`; each command must be one the harness
//!   can run (the binaries and a few shell tools), so a block calling `psql`, `curl` or
//!   `kubectl` must be marked. ` ```console `: `$ ` lines are commands, the lines after each
//!   are its expected output (standard output and error together), and a last line
//!   `(exit N)` is its exit status; a command without one must exit 0.
//! - ` ```text output ` / ` ```text error ` right after a run block: what that block prints
//!   on standard output, or the error it must fail with (standard error, non-zero exit).
//!   Whitespace is collapsed before comparing, and `...` stands for any text (times,
//!   generated keys).
//! - `no-run` in the info string (` ```sh no-run `): a block that cannot run in a test
//!   (deploy units, another machine's URLs, a daemon); counted. `run-by=tests/NAME.rs`: a
//!   block another test runs (that file must name this page).
//! - Illustrations (` ```text `, `mermaid`, `json`, `xml`, `ini`) are not commands.
//!
//! A block without an info string, or with a language this harness does not know, fails
//! the test: every block is either run, compared, or explicitly marked.
mod archiver_support;
#[path = "support/docs.rs"]
mod docs_support;

use std::path::Path;
use std::time::Instant;

use docs_support::{pages, quoted, Outcome, Sandbox};

/// Languages that describe rather than command: never run, counted as illustrations.
const ILLUSTRATIONS: &[&str] = &["text", "mermaid", "json", "xml", "ini", "promql", "yaml"];

/// Programs a run `sh`/`console` block may call (the binaries and harmless shell tools).
const RUNNABLE: &[&str] = &[
    "pulpitum",
    "pulpitum-archiver",
    "echo",
    "printf",
    "cat",
    "export",
    "cd",
    "ls",
    "head",
    "tail",
    "grep",
    "wc",
    "sort",
    "test",
    "true",
    "mkdir",
    "rm",
];

/// One fenced block.
#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    lang: String,
    flags: Vec<String>,
    text: String,
}

impl Block {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn run_by(&self) -> Option<&str> {
        self.flags.iter().find_map(|f| f.strip_prefix("run-by="))
    }

    fn at(&self) -> String {
        format!(
            "{}:{} (```{} {})",
            self.file,
            self.line,
            self.lang,
            self.flags.join(" ")
        )
    }
}

/// The fenced blocks of a Markdown text (``` fences at any indentation; `~~~` is not used).
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, Vec<String>, String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let mut words = info
                        .split(|c: char| c.is_whitespace() || c == ',')
                        .filter(|w| !w.is_empty())
                        .map(str::to_string);
                    let lang = words.next().unwrap_or_default();
                    open = Some((i + 1, lang, words.collect(), String::new(), indent));
                }
            }
            Some((start, lang, flags, body, ind)) => {
                if trimmed.starts_with("```") {
                    out.push(Block {
                        file: file.to_string(),
                        line: *start,
                        lang: std::mem::take(lang),
                        flags: std::mem::take(flags),
                        text: std::mem::take(body),
                    });
                    open = None;
                } else {
                    let cut = line.len().min(*ind);
                    body.push_str(if line[..cut].trim().is_empty() {
                        &line[cut..]
                    } else {
                        line
                    });
                    body.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "{file}: a fenced block is never closed");
    out
}

/// Shell text as logical lines: `\`-continuations joined, comments and blank lines dropped.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for raw in text.lines() {
        let line = strip_comment(raw);
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(&line);
        if !cur.trim().is_empty() {
            out.push(cur.trim().to_string());
        }
        cur.clear();
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// A shell line without its `#` comment (a `#` at a word start, outside quotes).
fn strip_comment(line: &str) -> String {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '#' && prev.is_whitespace() => return line[..i].to_string(),
            None => {}
        }
        prev = c;
    }
    line.to_string()
}

/// The programs a logical shell line calls (after `VAR=value` prefixes, at each `|`, `;`,
/// `&&`, `||`), ignoring quoted text.
fn programs(line: &str) -> Vec<String> {
    let mut segments = vec![String::new()];
    let mut quote = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '|' || c == ';' || c == '&' => {
                segments.push(String::new());
                continue;
            }
            None => {}
        }
        if quote.is_none() || c == '\'' || c == '"' {
            segments.last_mut().unwrap().push(c);
        } else {
            // Quoted text cannot name a program; keep a placeholder word.
            segments.last_mut().unwrap().push('x');
        }
    }
    segments
        .iter()
        .filter_map(|s| {
            s.split_whitespace()
                .find(|w| !w.contains('=') || w.starts_with('-'))
                .map(str::to_string)
        })
        .collect()
}

/// Whitespace-collapsed `actual` contains `expected`'s pieces (split at `...`) in order.
fn matches(expected: &str, actual: &str) -> bool {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let actual = norm(actual);
    let mut at = 0;
    for piece in expected.split("...").map(norm).filter(|p| !p.is_empty()) {
        match actual[at..].find(&piece) {
            Some(i) => at += i + piece.len(),
            None => return false,
        }
    }
    true
}

/// One `$ ` command of a `console` block: what the docs show it printing and its exit
/// status (a last line `(exit N)`; none: 0).
#[derive(Debug, PartialEq)]
struct ConsoleStep {
    command: String,
    output: String,
    status: i32,
}

/// The commands of a `console` block, each with its documented output and exit status.
fn console_steps(text: &str) -> Vec<ConsoleStep> {
    let mut steps: Vec<ConsoleStep> = Vec::new();
    for line in text.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(ConsoleStep {
                command: command.to_string(),
                output: String::new(),
                status: 0,
            });
        } else if let Some(step) = steps.last_mut() {
            let status = line
                .trim()
                .strip_prefix("(exit ")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|n| n.parse().ok());
            match status {
                Some(n) => step.status = n,
                None => {
                    step.output.push_str(line);
                    step.output.push('\n');
                }
            }
        }
    }
    steps
}

/// The marker the console script prints after each command, followed by its exit status.
const EXIT_MARKER: &str = "@@pulpitum-docs-exit ";

/// A bash script running each command in order (in the same shell, so `cd` and `export`
/// carry over), its standard error into its standard output, and printing after each the
/// marker and the command's exit status; a failing command does not stop the script (`-e`
/// does not apply to the left of `&&`).
fn console_script(steps: &[ConsoleStep]) -> String {
    steps
        .iter()
        .map(|s| {
            format!(
                "{{ {}\n}} 2>&1 && status=0 || status=$?; echo \"{EXIT_MARKER}$status\"\n",
                s.command
            )
        })
        .collect()
}

/// What each command of a console script printed, and its exit status.
fn console_outcomes(stdout: &str) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    let mut printed = String::new();
    for line in stdout.lines() {
        match line.strip_prefix(EXIT_MARKER) {
            Some(n) => out.push((std::mem::take(&mut printed), n.parse().unwrap_or(-1))),
            None => {
                printed.push_str(line);
                printed.push('\n');
            }
        }
    }
    out
}

/// Counts of what the harness did, printed at the end.
#[derive(Default, Debug)]
struct Counts {
    sql: usize,
    sql_on_postgres: usize,
    hot_store: usize,
    sh: usize,
    console: usize,
    compared: usize,
    run_elsewhere: usize,
    no_run: usize,
    illustrations: usize,
}

/// Runs the page's `hot-store` block on the real PostgreSQL, in a fresh schema migrated by
/// the built `pulpitum migrate`.
fn run_hot_store(rt: &tokio::runtime::Runtime, sandbox: &Sandbox, sql: &str) -> Outcome {
    rt.block_on(async {
        let url = archiver_support::fresh_database("docs").await;
        let m = sandbox.bash(
            &format!("pulpitum migrate --database-url {}", quoted(&url)),
            "",
        );
        if !m.ok {
            return m;
        }
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL reachable");
        tokio::spawn(conn);
        match client.batch_execute(sql).await {
            Ok(()) => Outcome {
                ok: true,
                stdout: String::new(),
                stderr: String::new(),
            },
            Err(e) => Outcome {
                ok: false,
                stdout: String::new(),
                stderr: format!("{e}: {:?}", e.as_db_error().map(|d| d.message())),
            },
        }
    })
}

#[test]
fn every_fenced_block_of_the_docs_runs_or_is_marked() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut counts = Counts::default();
    let mut failures: Vec<String> = Vec::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let started = Instant::now();
    for (file, text) in pages() {
        let page = blocks(&file, &text);
        let mut sandbox: Option<Sandbox> = None;
        let mut on_postgres: Option<Sandbox> = None;
        // The outcomes of the previous block, when it ran (an expectation compares with
        // each): a SQL block runs on the embedded store and on PostgreSQL with S3.
        let mut last: Vec<(String, Outcome)> = Vec::new();
        for b in &page {
            macro_rules! fail {
                ($why:expr $(,)?) => {
                    failures.push(format!("{}: {}", b.at(), $why))
                };
            }
            if b.has("no-run") || b.has("no_run") {
                counts.no_run += 1;
                last.clear();
                continue;
            }
            if let Some(test) = b.run_by() {
                match std::fs::read_to_string(root.join(test)) {
                    Ok(src) if src.contains(&file) => counts.run_elsewhere += 1,
                    Ok(_) => fail!(format!("{test} does not name {file}")),
                    Err(e) => fail!(format!("run-by names {test}: {e}")),
                }
                last.clear();
                continue;
            }
            let expect_output = b.has("output");
            let expect_error = b.has("error");
            if expect_output || expect_error {
                if last.is_empty() {
                    fail!("an expected output or error follows no block that ran");
                    continue;
                }
                counts.compared += 1;
                for (what, o) in std::mem::take(&mut last) {
                    let actual = if expect_error { &o.stderr } else { &o.stdout };
                    if expect_error && o.ok {
                        fail!(format!("{what} succeeded, but the docs show it failing"));
                    } else if !expect_error && !o.ok {
                        fail!(format!("{what} failed: {}", o.stderr));
                    } else if !matches(&b.text, actual) {
                        fail!(format!(
                            "{what} printed something else.\n--- docs:\n{}--- actual:\n{actual}",
                            b.text
                        ));
                    }
                }
                continue;
            }
            // A run block whose outcome no expectation checks must succeed.
            for (what, o) in std::mem::take(&mut last) {
                if !o.ok {
                    failures.push(format!("{what} failed: {}{}", o.stdout, o.stderr));
                }
            }
            let what = b.at();
            match b.lang.as_str() {
                "sql" if b.has("hot-store") => {
                    counts.hot_store += 1;
                    let sb = sandbox.get_or_insert_with(Sandbox::new);
                    last.push((what, run_hot_store(&rt, sb, &b.text)));
                }
                "sql" if b.flags.is_empty() => {
                    counts.sql += 1;
                    counts.sql_on_postgres += 1;
                    let sb = sandbox.get_or_insert_with(Sandbox::new);
                    std::fs::write(sb.cwd.join("block.sql"), &b.text).unwrap();
                    last.push((
                        format!("{what} on the embedded store"),
                        sb.bash("pulpitum -f block.sql", ""),
                    ));
                    let pg = on_postgres.get_or_insert_with(|| Sandbox::postgres(&rt));
                    std::fs::write(pg.cwd.join("block.sql"), &b.text).unwrap();
                    last.push((
                        format!("{what} on PostgreSQL and S3"),
                        pg.bash(&format!("pulpitum {} -f block.sql", pg.store_args), ""),
                    ));
                }
                "sh" | "console" if b.flags.is_empty() => {
                    let console = b.lang == "console";
                    let commands: Vec<String> = if console {
                        b.text
                            .lines()
                            .filter_map(|l| l.strip_prefix("$ "))
                            .map(str::to_string)
                            .collect()
                    } else {
                        logical_lines(&b.text)
                    };
                    let refused: Vec<String> = commands
                        .iter()
                        .flat_map(|l| programs(l))
                        .filter(|p| !RUNNABLE.contains(&p.as_str()))
                        .collect();
                    if !refused.is_empty() || commands.is_empty() {
                        fail!(format!(
                            "calls {refused:?}, which the harness cannot run: make it runnable \
                             or mark it `no-run`"
                        ));
                        continue;
                    }
                    let sb = sandbox.get_or_insert_with(Sandbox::new);
                    if console {
                        counts.console += 1;
                        let steps = console_steps(&b.text);
                        let o = sb.bash(&console_script(&steps), "");
                        let ran = console_outcomes(&o.stdout);
                        if ran.len() != steps.len() {
                            fail!(format!(
                                "ran {} of {} commands: {}{}",
                                ran.len(),
                                steps.len(),
                                o.stdout,
                                o.stderr
                            ));
                            continue;
                        }
                        for (step, (printed, status)) in steps.iter().zip(&ran) {
                            if *status != step.status {
                                fail!(format!(
                                    "`{}` exited {status}, the docs show {}:\n{printed}",
                                    step.command, step.status
                                ));
                            } else if !matches(&step.output, printed) {
                                fail!(format!(
                                    "`{}` printed something else.\n--- docs:\n{}\n--- actual:\n{printed}",
                                    step.command, step.output
                                ));
                            }
                        }
                    } else {
                        counts.sh += 1;
                        last.push((what, sb.bash(&b.text, "")));
                    }
                }
                lang if ILLUSTRATIONS.contains(&lang) && b.flags.is_empty() => {
                    counts.illustrations += 1;
                }
                _ => fail!(
                    "a block the harness cannot classify: give it a language it runs (sql, sh, \
                     console), an illustration's (text, json, ...), or mark it `no-run`",
                ),
            }
        }
        for (what, o) in std::mem::take(&mut last) {
            if !o.ok {
                failures.push(format!("{what} failed: {}{}", o.stdout, o.stderr));
            }
        }
    }
    eprintln!(
        "doc blocks: {counts:?} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} doc block(s) drifted from the program:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    // A harness that finds nothing proves nothing.
    assert!(
        counts.sql >= 5 && counts.sh >= 5 && counts.compared >= 3,
        "too few blocks ran: {counts:?}"
    );
}

#[test]
fn the_parser_reads_info_strings_continuations_and_programs() {
    let b = blocks(
        "x.md",
        "a\n```sh no-run\nfoo\n```\n  ```sql\n  SELECT 1;\n  ```\n```\nbare\n```\n",
    );
    assert_eq!(b.len(), 3);
    assert_eq!(
        (b[0].lang.as_str(), b[0].flags.clone()),
        ("sh", vec!["no-run".to_string()])
    );
    assert_eq!(b[1].text, "SELECT 1;\n");
    assert_eq!(b[2].lang, "");
    let lines =
        logical_lines("# c\nA=1 \\\n  pulpitum -c 'x # y' # z\n\necho a | head -1 && curl x\n");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].ends_with("pulpitum -c 'x # y'"), "{lines:?}");
    assert_eq!(programs(&lines[0]), vec!["pulpitum"]);
    assert_eq!(programs(&lines[1]), vec!["echo", "head", "curl"]);
    assert_eq!(programs("pulpitum -c 'SELECT 1 | psql'"), vec!["pulpitum"]);
    let steps = console_steps("$ a\nx\n(exit 2)\n$ b\n");
    assert_eq!(
        steps,
        vec![
            ConsoleStep {
                command: "a".into(),
                output: "x\n".into(),
                status: 2
            },
            ConsoleStep {
                command: "b".into(),
                output: String::new(),
                status: 0
            }
        ]
    );
    assert_eq!(
        console_outcomes(&format!("x\n{EXIT_MARKER}2\n{EXIT_MARKER}0\n")),
        vec![("x\n".to_string(), 2), (String::new(), 0)]
    );
    assert!(matches("a ... c", "x a  b\n c"));
    assert!(!matches("a ... c", "c b a"));
}
