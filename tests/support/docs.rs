//! Shared by the doc tests (tests/docs.rs, tests/docs_reference.rs): the pages of README.md
//! and docs/, and a sandbox in which the built binaries run as a reader of the docs would run
//! them (a temp folder, the binaries first on `PATH`, nothing of this process's settings).
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::archiver_support;

/// The longest one block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);

/// README.md and every page under docs/, in a stable order.
pub fn pages() -> Vec<(String, String)> {
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

/// What a run block left: exit status, standard output, standard error.
pub struct Outcome {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A page's sandbox: a folder holding the embedded default store (`./pulpitum-data`), or
/// the URLs of a fresh PostgreSQL schema and S3 prefix, and a `bin/` with the built binaries.
pub struct Sandbox {
    _dir: tempfile::TempDir,
    pub cwd: PathBuf,
    path: String,
    /// `--database-url ... --archive-url ...` (empty: the embedded default).
    pub store_args: String,
    /// `--database-url ...` alone, for `migrate`, which refuses an archive URL.
    db_args: String,
    /// The S3 variables a PostgreSQL-and-S3 sandbox passes on.
    env: Vec<(String, String)>,
}

impl Sandbox {
    pub fn new() -> Self {
        Self::with_store(String::new(), String::new(), Vec::new())
    }

    /// A sandbox on the real PostgreSQL (a fresh schema) and S3 (a fresh prefix).
    pub fn postgres(rt: &tokio::runtime::Runtime) -> Self {
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
            format!("--database-url {}", quoted(&db)),
            format!("--archive-url {}", quoted(&archive)),
            env,
        )
    }

    /// A sandbox on the store `db_args` names (empty: the embedded default), with the archive
    /// `archive_args` names.
    fn with_store(db_args: String, archive_args: String, env: Vec<(String, String)>) -> Self {
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
            store_args: format!("{db_args} {archive_args}"),
            db_args,
            env,
        };
        // The state every page assumes: the store migrated, with the README's table.
        for script in [
            format!("pulpitum {} migrate", sandbox.db_args),
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
    pub fn bash(&self, script: &str, extra_env: &str) -> Outcome {
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

pub fn run_with_timeout(mut cmd: Command) -> Outcome {
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
pub fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
