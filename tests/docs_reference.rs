//! The reference pages checked against the program itself, so they cannot drift: the
//! settings page against every binary's `--help` (names and defaults), the metrics page
//! against what a running archiver exports, the system-tables page against the tables'
//! columns, and every relative link and anchor of README.md and docs/.

mod archiver_support;
#[path = "support/docs.rs"]
mod docs_support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docs_support::{pages, Sandbox};

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
        help(shell, &["worker"]),
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

/// Every range the archiver checks is the one the settings page's table of accepted ranges
/// shows for that flag.
#[test]
fn the_settings_page_shows_the_archivers_ranges() {
    use pulpitum::archiver::config as c;
    let doc = page("settings.md");
    let table = section(&doc, "### Accepted ranges of the archiver");
    let mut ranges: Vec<(&str, String)> = [
        c::INTERVAL,
        c::LEASE,
        c::RETRY,
        c::GC_DELAY,
        c::CLEANUP_DELAY,
        c::JOB_RETENTION,
        c::COMPACT_AFTER,
        c::READER_ROUTE_CACHE,
        c::READER_STATEMENT_TIMEOUT,
        c::BACKUP_RETENTION,
        c::UPLOAD_DEADLINE,
        c::OP_DEADLINE,
        c::HEALTH_MAX_AGE,
    ]
    .iter()
    .map(|r| {
        let range = format!("{} to {}", r.min.as_secs_f64(), r.max.as_secs_f64());
        (r.setting, range)
    })
    .collect();
    for r in [
        c::SEGMENT_TARGET_BYTES,
        c::SCAN_LIMIT,
        c::SNAPSHOT_PAGE_ROWS,
        c::CLEANUP_BATCH_ROWS,
        c::CONCURRENCY,
    ] {
        ranges.push((r.setting, format!("{} to {}", r.min, r.max)));
    }
    let mut wrong = Vec::new();
    for (setting, range) in ranges {
        let flag = setting
            .split(['(', ')'])
            .nth(1)
            .expect("a setting names its flag");
        let row = table.lines().find(|l| {
            l.starts_with('|')
                && l.split('|')
                    .nth(1)
                    .unwrap_or("")
                    .contains(&format!("`{flag}`"))
        });
        // Sizes may carry their unit between the numbers: `1048576 (1 MiB) to 4294967296`.
        let shown = row.map(|r| {
            r.split(" (")
                .map(|p| p.split_once(") ").map_or(p, |(_, rest)| rest))
                .collect::<Vec<_>>()
                .join(" ")
        });
        if !shown.is_some_and(|r| r.contains(&range)) {
            wrong.push(format!("{flag}: {range}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/settings.md's accepted ranges differ: {wrong:?}"
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
    // Every system table a session registers, so a new one cannot go undocumented.
    for table in pulpitum::control::system::SYSTEM_TABLES {
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
