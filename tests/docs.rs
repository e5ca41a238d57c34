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
//!   are its expected output (standard output and error together, any exit status).
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

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// The longest one block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);

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

/// README.md and every page under docs/, in a stable order.
fn pages() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut stack = vec![root.join("docs")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
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

/// What a run block left: exit status, standard output, standard error.
struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// A page's sandbox: a folder holding the embedded default store (`./pulpitum-data`), or
/// the URLs of a fresh PostgreSQL schema and S3 prefix, and a `bin/` with the built binaries.
struct Sandbox {
    _dir: tempfile::TempDir,
    cwd: PathBuf,
    path: String,
    /// `--database-url ... --archive-url ...` (empty: the embedded default).
    store_args: String,
    /// The S3 variables a PostgreSQL-and-S3 sandbox passes on.
    env: Vec<(String, String)>,
}

impl Sandbox {
    fn new() -> Self {
        Self::with_store(String::new(), Vec::new())
    }

    /// A sandbox on the real PostgreSQL (a fresh schema) and S3 (a fresh prefix).
    fn postgres(rt: &tokio::runtime::Runtime) -> Self {
        let db = rt.block_on(archiver_support::fresh_database("docs"));
        let archive = archiver_support::fresh_archive_url("docs");
        let env = archiver_support::S3_ENV
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    std::env::var(k).unwrap_or_else(|_| v.to_string()),
                )
            })
            .collect();
        Self::with_store(
            format!(
                "--database-url {} --archive-url {}",
                quoted(&db),
                quoted(&archive)
            ),
            env,
        )
    }

    fn with_store(store_args: String, env: Vec<(String, String)>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let cwd = dir.path().join("work");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(cwd.join("home")).unwrap();
        for (name, exe) in [
            ("pulpitum", env!("CARGO_BIN_EXE_pulpitum")),
            ("pulpitum-archiver", env!("CARGO_BIN_EXE_pulpitum-archiver")),
        ] {
            std::os::unix::fs::symlink(exe, bin.join(name)).unwrap();
        }
        let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display());
        let sandbox = Self {
            _dir: dir,
            cwd,
            path,
            store_args,
            env,
        };
        // The state every page assumes: the store migrated, with the README's table.
        for script in [
            format!("pulpitum {} migrate", sandbox.store_args),
            format!(
                "pulpitum {} -c \"CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
                 OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')\"",
                sandbox.store_args
            ),
        ] {
            let o = sandbox.bash(&script, "");
            assert!(o.ok, "sandbox setup `{script}` failed: {}", o.stderr);
        }
        sandbox
    }

    /// Runs `script` with bash in the page's folder, the binaries first on PATH, nothing of
    /// this process's Pulpitum settings inherited.
    fn bash(&self, script: &str, extra_env: &str) -> Outcome {
        let mut cmd = Command::new("bash");
        cmd.arg("-e")
            .arg("-o")
            .arg("pipefail")
            .arg("-c")
            .arg(format!("{extra_env}{script}"))
            .current_dir(&self.cwd)
            .env_clear()
            .env("PATH", &self.path)
            .env("HOME", self.cwd.join("home"))
            .env("PULPITUM_LOG", "warn")
            .env("LANG", "C.UTF-8")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        run_with_timeout(cmd)
    }
}

fn run_with_timeout(mut cmd: Command) -> Outcome {
    let mut child = cmd.spawn().expect("bash");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > BLOCK_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap()).into_owned();
    let mut stderr = String::from_utf8_lossy(&err_t.join().unwrap()).into_owned();
    if status.is_none() {
        stderr.push_str(&format!("\n(killed after {BLOCK_TIMEOUT:?})"));
    }
    Outcome {
        ok: status.is_some_and(|s| s.success()),
        stdout,
        stderr,
    }
}

/// Single-quotes `s` for bash.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
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
                        let o = sb.bash(
                            &format!(
                                "{{ {}\n}} 2>&1 || true",
                                b.text
                                    .lines()
                                    .map(|l| l
                                        .strip_prefix("$ ")
                                        .map_or_else(|| format!("# {l}"), str::to_string,))
                                    .collect::<Vec<_>>()
                                    .join("\n")
                            ),
                            "",
                        );
                        let expected: String = b
                            .text
                            .lines()
                            .map(|l| if l.starts_with("$ ") { "...\n" } else { l })
                            .collect::<Vec<_>>()
                            .join("\n");
                        if !matches(&expected, &o.stdout) {
                            fail!(format!(
                                "printed something else.\n--- docs:\n{}\n--- actual:\n{}",
                                b.text, o.stdout
                            ));
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
    assert!(matches("a ... c", "x a  b\n c"));
    assert!(!matches("a ... c", "c b a"));
}

/// A page of docs/, as text.
fn page(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs")
            .join(name),
    )
    .unwrap()
}

/// The text of a page's section, from `heading` to the next heading of that level.
fn section(text: &str, heading: &str) -> String {
    let level = heading.split(' ').next().unwrap();
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading}"));
    let body = &text[start + heading.len() + 2..];
    let end = body.find(&format!("\n{level} ")).unwrap_or(body.len());
    body[..end].to_string()
}

/// The backticked names in the first cell of a section's table rows (`` `a`, `b` ``).
fn first_cells(section: &str) -> Vec<String> {
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let cell = l.split('|').nth(1).unwrap_or("");
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.split('{').next().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn help(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).arg("--help").output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Every flag and environment variable the binaries' `--help` lists is on the settings
/// page, and every flag the page's tables name is one a binary has.
#[test]
fn the_settings_page_names_every_flag_and_variable_of_every_help() {
    let doc = page("settings.md");
    let shell = env!("CARGO_BIN_EXE_pulpitum");
    let archiver = env!("CARGO_BIN_EXE_pulpitum-archiver");
    let helps = [
        help(shell, &[]),
        help(shell, &["serve"]),
        help(shell, &["demo"]),
        help(shell, &["migrate"]),
        help(archiver, &[]),
        help(archiver, &["policy"]),
        help(archiver, &["migrate"]),
    ];
    let mut flags = std::collections::BTreeSet::new();
    let mut missing = Vec::new();
    for h in &helps {
        for word in h.split(|c: char| c.is_whitespace() || c == ',') {
            if let Some(flag) = word.strip_prefix("--").filter(|f| {
                f.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                    && f.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            }) {
                flags.insert(format!("--{flag}"));
            }
        }
        for env in h.split("[env: ").skip(1) {
            let name = env.split(['=', ']']).next().unwrap();
            if !doc.contains(&format!("`{name}`")) {
                missing.push(name.to_string());
            }
        }
    }
    for f in &flags {
        if !["--help", "--version"].contains(&f.as_str()) && !doc.contains(&format!("`{f}`")) {
            missing.push(f.clone());
        }
    }
    assert!(missing.is_empty(), "docs/settings.md lacks {missing:?}");
    assert!(
        flags.len() > 40,
        "too few flags read from --help: {flags:?}"
    );
    // Each default `--help` shows is in a row of the page naming that flag.
    let mut wrong_defaults = Vec::new();
    for h in &helps {
        let mut flag = None;
        for line in h.lines() {
            if line.trim_start().starts_with('-') {
                flag = line
                    .split_whitespace()
                    .find(|w| w.starts_with("--"))
                    .map(|f| f.trim_end_matches(',').to_string());
            }
            if let (Some(f), Some(d)) = (&flag, line.split("[default: ").nth(1)) {
                let default = d.split(']').next().unwrap();
                let row = format!("`{f}`");
                if !doc
                    .lines()
                    .filter(|l| l.starts_with('|') && l.contains(&row))
                    .any(|l| l.contains(default))
                {
                    wrong_defaults.push(format!("{f} (default {default})"));
                }
            }
        }
    }
    assert!(
        wrong_defaults.is_empty(),
        "docs/settings.md shows other defaults than --help for {wrong_defaults:?}"
    );
    let unknown: Vec<String> = first_cells(&doc)
        .into_iter()
        .filter(|c| c.starts_with("--") && !flags.contains(c))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/settings.md names flags no binary has: {unknown:?}"
    );
}

/// Every metric a running archiver exports is on the metrics page, and the page names no
/// other. The archiver runs as a daemon over a paused table with an eligible bucket, so the
/// per-table gauges have a series too.
#[test]
fn the_metrics_page_names_every_exported_metric() {
    let doc = page("metrics.md");
    let sandbox = Sandbox::new();
    let o = sandbox.bash(
        "pulpitum -c \"INSERT INTO chat VALUES (1, TIMESTAMP '2020-01-01T00:00:00Z', 1, 'old')\" \
         -c 'SYSTEM STOP MOVES chat'",
        "",
    );
    assert!(o.ok, "{}", o.stderr);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_pulpitum-archiver"))
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--interval-seconds", "0.2"])
        .current_dir(&sandbox.cwd)
        .env_clear()
        .env("PULPITUM_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let scrape = || -> Option<String> {
        use std::io::Write;
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut s = String::new();
        c.read_to_string(&mut s).ok()?;
        Some(s)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        match scrape() {
            Some(t) if t.contains("table_lag_seconds{") => break t,
            _ if Instant::now() > deadline => {
                let _ = daemon.kill();
                panic!("no per-table series within 60 s: {:?}", scrape());
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let _ = daemon.kill();
    let _ = daemon.wait();
    let exported: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE pulpitum_archiver_"))
        .map(|l| {
            let (name, kind) = l.split_once(' ').unwrap();
            if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            }
        })
        .collect();
    assert!(exported.len() >= 20, "{text}");
    let documented: std::collections::BTreeSet<String> = first_cells(&doc).into_iter().collect();
    assert_eq!(
        exported, documented,
        "docs/metrics.md against the exported metrics"
    );
}

/// Every column of each system table is described in its section of the system-tables
/// page, and the page describes no column a table lacks.
#[test]
fn the_system_tables_page_describes_every_column() {
    let doc = page("system-tables.md");
    let sandbox = Sandbox::new();
    for table in ["pulpitum_tables", "pulpitum_buckets", "pulpitum_jobs"] {
        let o = sandbox.bash(
            &format!("pulpitum --format csv -c 'SELECT * FROM {table} LIMIT 0'"),
            "",
        );
        assert!(o.ok, "{}", o.stderr);
        let columns: std::collections::BTreeSet<String> = o
            .stdout
            .lines()
            .next()
            .unwrap()
            .split(',')
            .map(str::to_string)
            .collect();
        // The section's first table, the one whose header is `| column |`.
        let sec = section(&doc, &format!("## `{table}`"));
        let columns_table: String = sec
            .lines()
            .skip_while(|l| !l.starts_with("| column |"))
            .take_while(|l| l.starts_with('|'))
            .map(|l| format!("{l}\n"))
            .collect();
        let documented: std::collections::BTreeSet<String> =
            first_cells(&columns_table).into_iter().collect();
        assert_eq!(columns, documented, "docs/system-tables.md, {table}");
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The text of a page outside its fenced blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every relative link of README.md and docs/ names a file that exists and, with a
/// `#fragment`, a heading of that page.
#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for (file, text) in pages() {
        let dir = Path::new(&file).parent().unwrap().to_path_buf();
        for link in prose(&text).split("](").skip(1) {
            let target = link.split(')').next().unwrap();
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if path.is_empty() {
                root.join(&file)
            } else {
                root.join(&dir).join(path)
            };
            let Ok(body) = std::fs::read_to_string(&resolved).or_else(|e| {
                if resolved.is_dir() {
                    Ok(String::new())
                } else {
                    Err(e)
                }
            }) else {
                broken.push(format!("{file}: {target}: no such file"));
                continue;
            };
            if !fragment.is_empty()
                && !prose(&body)
                    .lines()
                    .filter(|l| l.starts_with('#'))
                    .any(|l| slug(l.trim_start_matches('#')) == fragment)
            {
                broken.push(format!("{file}: {target}: no such heading"));
            }
        }
    }
    assert!(checked > 50, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
