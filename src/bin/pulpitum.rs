//! `pulpitum`: the SQL shell ([`pulpitum::cli::shell`]), and its subcommands: `demo`,
//! `migrate`, `serve`, `worker` and `erasure`, whose machinery lives in [`pulpitum::cli`].
//!
//! Scripts come from `-c SQL` (repeatable), `-f FILE` or piped stdin; a script stops at the
//! first error and the process exits non-zero.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use pulpitum::cli::serve::ServeArgs;
use pulpitum::cli::shell::{Format, Shell};

/// mimalloc for this binary (the `mimalloc` feature, on by default; see Cargo.toml).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// SQL over a Pulpitum database: hot buckets in CockroachDB/PostgreSQL (or SQLite), history
/// in object storage.
#[derive(Debug, Parser)]
#[command(name = "pulpitum", version, about)]
struct Cli {
    #[arg(
        long,
        env = "PULPITUM_DATABASE_URL",
        global = true,
        hide_env_values = true,
        help = pulpitum::cli::DATABASE_URL_HELP
    )]
    database_url: Option<String>,
    #[arg(
        long,
        env = "PULPITUM_ARCHIVE_URL",
        global = true,
        hide_env_values = true,
        help = pulpitum::cli::ARCHIVE_URL_HELP
    )]
    archive_url: Option<String>,
    /// Output format of query results [default: table].
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Run this SQL and exit (repeatable; runs in order).
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    commands: Vec<String>,
    /// Run the statements of this file and exit.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: Option<PathBuf>,
    /// Stop a query whose scans produce more rows than this.
    #[arg(long, env = "PULPITUM_MAX_ROWS", global = true)]
    max_rows: Option<u64>,
    /// Stop a query whose scans read more bytes than this.
    #[arg(long, env = "PULPITUM_MAX_BYTES", global = true)]
    max_bytes: Option<u64>,
    /// Stop a query that runs longer than this many milliseconds.
    #[arg(long, env = "PULPITUM_MAX_DURATION_MS", global = true)]
    max_duration_ms: Option<u64>,
    /// Run large archived scans on these workers (`pulpitum worker`): http://HOST:PORT,...,
    /// or dns+http://NAME:PORT for every address NAME resolves to. The shared secret is read
    /// from PULPITUM_WORKER_SECRET.
    #[arg(long, env = "PULPITUM_WORKERS", global = true, value_name = "URLS")]
    workers: Option<String>,
    /// Mutual TLS with workers (coordinators and workers alike): the CA, PEM, that signs
    /// every coordinator's and worker's certificate. Worker URLs are then https://.
    #[arg(
        long,
        env = "PULPITUM_WORKER_TLS_CA",
        global = true,
        value_name = "PATH"
    )]
    worker_tls_ca: Option<PathBuf>,
    /// Mutual TLS: this process's certificate chain, PEM (with --worker-tls-ca).
    #[arg(
        long,
        env = "PULPITUM_WORKER_TLS_CERT",
        global = true,
        value_name = "PATH"
    )]
    worker_tls_cert: Option<PathBuf>,
    /// Mutual TLS: this process's private key, PEM (with --worker-tls-ca).
    #[arg(
        long,
        env = "PULPITUM_WORKER_TLS_KEY",
        global = true,
        value_name = "PATH"
    )]
    worker_tls_key: Option<PathBuf>,
    /// Mutual TLS: check every worker's certificate against this name instead of the host
    /// dialled (for dns+https:// lists, whose resolved URLs are addresses).
    #[arg(
        long,
        env = "PULPITUM_WORKER_TLS_SERVER_NAME",
        global = true,
        value_name = "NAME"
    )]
    worker_tls_server_name: Option<String>,
    /// Archived buckets one worker task reads (with --workers); a scan of fewer is not split.
    #[arg(
        long,
        env = "PULPITUM_BUCKETS_PER_TASK",
        global = true,
        default_value_t = pulpitum::distributed::DEFAULT_BUCKETS_PER_TASK as u32,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    buckets_per_task: u32,
    /// Log line format on standard error: text or json. The filter is PULPITUM_LOG (default warn).
    #[arg(
        long,
        env = "PULPITUM_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: String,
    #[command(subcommand)]
    command: Option<Command>,
}

/// `pulpitum worker`'s own flags.
#[derive(Debug, Clone, Copy, clap::Args)]
struct WorkerArgs {
    /// Address to listen on.
    #[arg(long, env = "PULPITUM_WORKER_LISTEN", default_value = "127.0.0.1:7600")]
    listen: std::net::SocketAddr,
    /// Accept coordinators that present no PULPITUM_WORKER_SECRET (loopback addresses
    /// only; for local tests).
    #[arg(long)]
    insecure_no_auth: bool,
    /// Connections held at once; one more is closed on arrival.
    #[arg(
        long,
        env = "PULPITUM_WORKER_MAX_CONNECTIONS",
        default_value_t = pulpitum::distributed::worker::DEFAULT_MAX_CONNECTIONS as u32,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_connections: u32,
    /// Serve Prometheus metrics and /healthz on this address (off unless given).
    #[arg(long, env = "PULPITUM_WORKER_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The interactive shell (what `pulpitum` runs without a subcommand).
    Shell(FormatArg),
    /// Load a synthetic chat history (about a million messages over two years), archive
    /// everything older than 90 days with the real archiver, then open the shell (or, when
    /// standard input is not a terminal, run it as a script).
    Demo {
        /// A few thousand messages instead of a million (for CI and a quick look).
        #[arg(long)]
        small: bool,
        /// Print the example queries and exit instead of opening the shell.
        #[arg(long)]
        no_shell: bool,
        #[command(flatten)]
        output: FormatArg,
    },
    /// Apply the hot store's schema migrations, as the role that owns the schema, then exit
    /// (creates an embedded store's file if absent). Every other start only checks the
    /// schema version and needs no DDL right; the archive is not touched.
    Migrate,
    /// Serve the tables over the PostgreSQL wire protocol (psql, drivers, BI tools).
    Serve(Box<ServeArgs>),
    /// Run plan fragments for coordinators (`--workers` of the shell, `serve` or an
    /// application): a stateless process with the same store and archive settings.
    Worker(WorkerArgs),
    /// Erase rows with proof: request one, show whether it is gone, list them.
    Erasure {
        #[command(subcommand)]
        action: ErasureAction,
    },
}

#[derive(Debug, Subcommand)]
enum ErasureAction {
    /// Run one DELETE as an erasure: its row keys are logged in the archive bucket first, then
    /// the rows are deleted from every tier; prints the erasure's id.
    Request {
        /// The DELETE statement, e.g. "DELETE FROM chat WHERE channel_id = 4242".
        sql: String,
        /// Your reference for the request (a ticket number; not personal data: it is kept).
        #[arg(long)]
        reference: Option<String>,
    },
    /// Whether an erasure is complete: every check of its proof; exits 0 when gone, 1 while
    /// pending, 2 on an error (an unknown id, an unreadable log).
    Show {
        /// The erasure's id (e-YYYYMMDDTHHMMSSZ-xxxxxxxx); none: every erasure in the log
        /// (exits 0 when all are gone).
        id: Option<String>,
    },
    /// Every erasure in the log.
    List,
}

/// `--format` where results are printed (the shell and the demo; not `serve`, whose clients
/// choose their own).
#[derive(Debug, clap::Args)]
struct FormatArg {
    /// Output format of query results [default: table].
    #[arg(long, value_enum)]
    format: Option<Format>,
}

/// The URLs to use: the given ones or the embedded default (announced on stderr).
fn urls(cli: &Cli) -> Result<(String, String), String> {
    let (db, archive) =
        pulpitum::defaults::resolve_urls(cli.database_url.as_deref(), cli.archive_url.as_deref())
            .map_err(|e| e.to_string())?;
    if cli.database_url.is_none() {
        eprintln!(
            "pulpitum: no --database-url given; keeping data in ./{} (embedded SQLite hot store, local archive)",
            pulpitum::defaults::DATA_DIR
        );
    }
    Ok((db, archive))
}

fn session_options(cli: &Cli) -> pulpitum::session::SessionOptions {
    pulpitum::session::SessionOptions {
        limits: pulpitum::provider::QueryLimits {
            max_rows: cli.max_rows,
            max_bytes: cli.max_bytes,
            max_duration: cli.max_duration_ms.map(std::time::Duration::from_millis),
        },
        // Only a store this process creates and owns is migrated here (the embedded
        // default, sqlite::memory:); any other is checked, and `pulpitum migrate` migrates it.
        migrate: pulpitum::defaults::start_migrates(cli.database_url.as_deref()),
        reader: Some("shell"),
        ..Default::default()
    }
}

/// The hot store and the archive the URLs name, the store started as every start but
/// `migrate` starts it (the embedded default migrated, any other checked).
async fn open_tiers(
    cli: &Cli,
) -> Result<
    (
        std::sync::Arc<dyn pulpitum::store::HotStore>,
        std::sync::Arc<pulpitum::archive::ArchiveStore>,
    ),
    Failure,
> {
    let (database_url, archive_url) = setting(urls(cli))?;
    // The archive URL first: a refused one must not leave a new database file behind.
    let archive = std::sync::Arc::new(setting(pulpitum::archive::ArchiveStore::from_url(
        &archive_url,
    ))?);
    let migrate = pulpitum::defaults::start_migrates(cli.database_url.as_deref());
    let (store, _) = setting(pulpitum::store::open_started(&database_url, migrate).await)?;
    Ok((store, archive))
}

async fn demo(cli: Cli, small: bool, no_shell: bool, format: Format) -> Result<(), Failure> {
    use indicatif::{ProgressBar, ProgressStyle};
    use pulpitum::demo::{self, DemoScale};
    let (store, archive) = open_tiers(&cli).await?;
    let scale = if small {
        DemoScale::SMALL
    } else {
        DemoScale::FULL
    };
    let tty = std::io::stderr().is_terminal();
    let bar = ProgressBar::hidden();
    if tty {
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg:>10} {wide_bar} {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
    }
    let phase = std::sync::Mutex::new("");
    let report = demo::load_and_archive(
        store.clone(),
        archive.clone(),
        scale,
        &|name, done, total| {
            let mut current = phase.lock().expect("progress lock");
            if *current != name {
                *current = name;
                bar.reset();
                bar.set_message(match name {
                    "load" => "loading",
                    _ => "archiving",
                });
            }
            bar.set_length(total);
            bar.set_position(done);
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    let mut out = pulpitum::cli::stdout();
    let say = |out: &mut pulpitum::cli::Stdout, text: String| {
        writeln!(out, "{text}")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())
    };
    say(
        &mut out,
        format!(
        "Loaded {} messages since {}; archived {} buckets ({} rows) that ended by {}. Compacted {} months into {} segments.",
        report.loaded,
        report.first_day,
        report.archived_buckets,
        report.archived_rows,
        report.cutoff,
        report.compacted_windows,
        report.segments
    ),
    )?;
    let ctx = match workers(&cli).await? {
        Some(w) => {
            pulpitum::session::distributed_session(store, archive, session_options(&cli), &w).await
        }
        None => pulpitum::session::session(store, archive, session_options(&cli)).await,
    }
    .map_err(|e| e.to_string())?;
    let mut shell = Shell::new(ctx, format);
    say(
        &mut out,
        "\nTry these (the shell keeps history; \\d lists tables, \\q quits):\n".into(),
    )?;
    let examples = demo::example_queries(&report);
    for (what, sql) in &examples {
        say(&mut out, format!("-- {what}\n{sql}\n"))?;
    }
    if let Some((_, explain)) = examples.iter().find(|(_, sql)| sql.starts_with("EXPLAIN")) {
        say(&mut out, explain.to_string())?;
        drop(out);
        shell.run_statement(explain).await?;
    }
    let outcome = if no_shell {
        Ok(())
    } else {
        shell.interactive_or_stdin().await.map_err(Failure::from)
    };
    pulpitum::control::readers::release(shell.ctx()).await;
    outcome
}

/// `pulpitum serve` ([`pulpitum::cli::serve`]) with this command line's URLs and limits.
async fn serve(cli: &Cli, args: &ServeArgs) -> Result<(), String> {
    let (database_url, archive_url) = urls(cli)?;
    let workers = workers(cli).await?;
    pulpitum::cli::serve::run(
        args,
        &database_url,
        &archive_url,
        session_options(cli),
        workers.as_ref(),
    )
    .await
}

/// The workers `--workers` (PULPITUM_WORKERS) names, if any.
async fn workers(cli: &Cli) -> Result<Option<pulpitum::distributed::DistributedSettings>, String> {
    pulpitum::cli::worker::settings(
        cli.workers.as_deref(),
        cli.buckets_per_task as usize,
        &tls_files(cli),
    )
    .await
}

fn tls_files(cli: &Cli) -> pulpitum::cli::worker::TlsFiles {
    pulpitum::cli::worker::TlsFiles {
        ca: cli.worker_tls_ca.clone(),
        cert: cli.worker_tls_cert.clone(),
        key: cli.worker_tls_key.clone(),
        server_name: cli.worker_tls_server_name.clone(),
    }
}

/// `pulpitum worker`: serves plan fragments until SIGTERM or SIGINT.
async fn worker(cli: &Cli, args: &WorkerArgs) -> Result<(), Failure> {
    let WorkerArgs {
        listen,
        insecure_no_auth,
        max_connections,
        metrics_addr,
    } = *args;
    use pulpitum::distributed::{worker, Tiers, WorkerOptions, WorkerSecret};
    let opts = WorkerOptions {
        listen,
        secret: setting(WorkerSecret::from_env())?,
        tls: setting(tls_files(cli).load())?,
        insecure_no_auth,
        max_connections: max_connections as usize,
    };
    let listener = setting(worker::bind(&opts).await)?;
    let (store, archive) = open_tiers(cli).await?;
    let tiers = Tiers {
        store,
        archive,
        route_cache: session_options(cli).route_cache,
    };
    Ok(pulpitum::cli::worker::serve(listener, &opts, tiers, metrics_addr).await?)
}

async fn run(cli: Cli, format: Format) -> Result<(), Failure> {
    let (database_url, archive_url) = setting(urls(&cli))?;
    let opts = session_options(&cli);
    let workers = setting(workers(&cli).await)?;
    let ctx = setting(
        pulpitum::session::connect_with_workers(
            &database_url,
            &archive_url,
            opts,
            workers.as_ref(),
        )
        .await,
    )?;
    let mut shell = Shell::new(ctx, format);
    let outcome = shell_session(&cli, &mut shell).await;
    // Stopping: this process no longer holds newer table versions back.
    pulpitum::control::readers::release(shell.ctx()).await;
    outcome
}

async fn shell_session(cli: &Cli, shell: &mut Shell) -> Result<(), Failure> {
    let scripted = !cli.commands.is_empty() || cli.file.is_some();
    for c in &cli.commands {
        shell.run_script(c).await?;
    }
    if let Some(f) = &cli.file {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        shell.run_script(&text).await?;
    }
    if scripted {
        return Ok(());
    }
    Ok(shell.interactive_or_stdin().await?)
}

/// `pulpitum migrate`: the same step as `pulpitum-archiver migrate` ([`pulpitum::cli::migrate`]).
async fn migrate(cli: &Cli) -> Result<(), String> {
    let line = pulpitum::cli::migrate(cli.database_url.as_deref(), cli.archive_url.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = pulpitum::cli::stdout();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())
}

/// `pulpitum erasure ...` ([`pulpitum::cli::erasure`]); `false` when `show` finds the
/// erasure still pending.
async fn erasure(cli: &Cli, action: &ErasureAction) -> Result<bool, Failure> {
    let (store, archive) = open_tiers(cli).await?;
    let (text, ok) = match action {
        ErasureAction::Request { sql, reference } => {
            let mut opts = session_options(cli);
            opts.migrate = false;
            // One statement and out: nothing to hold back while it runs.
            opts.reader = None;
            let ctx = pulpitum::session::session(store, archive, opts)
                .await
                .map_err(|e| e.to_string())?;
            let text = pulpitum::cli::erasure::request(&ctx, sql, reference.as_deref())
                .await
                .map_err(|e| e.to_string())?;
            (text, true)
        }
        ErasureAction::Show { id } => pulpitum::cli::erasure::show(store, archive, id.as_deref())
            .await
            .map_err(|e| e.to_string())?,
        ErasureAction::List => (
            pulpitum::cli::erasure::list(&archive)
                .await
                .map_err(|e| e.to_string())?,
            true,
        ),
    };
    let mut out = pulpitum::cli::stdout();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())?;
    Ok(ok)
}

/// Why a command failed: before any work (a store or archive that cannot be opened, a
/// server setting), exiting [`pulpitum::cli::EXIT_SETTING`] as the archiver does, or in the
/// work itself (a statement), exiting 1.
enum Failure {
    Setting(String),
    Work(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Work(e)
    }
}

/// Marks an error met before any work as a refused setting.
fn setting<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, Failure> {
    r.map_err(|e| Failure::Setting(e.to_string()))
}

/// The global flags `migrate` refuses (it runs no query and never opens the archive), so its
/// help does not list them.
const NOT_FOR_MIGRATE: [&str; 4] = ["max_rows", "max_bytes", "max_duration_ms", "archive_url"];

fn main() -> ExitCode {
    let matches = pulpitum::cli::hide_globals_in(Cli::command(), &["migrate"], &NOT_FOR_MIGRATE)
        .get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    pulpitum::cli::quiet_broken_pipes();
    // Everything this process creates (the embedded store, a local archive, the history
    // file) is owner-only.
    #[cfg(unix)]
    // SAFETY: umask only sets the process's file-creation mask; it cannot fail and touches
    // no memory. It runs before any thread that creates files.
    unsafe {
        libc::umask(0o077);
    }
    let logging = cli
        .log_format
        .parse()
        .and_then(|format| pulpitum::logging::init("warn", format));
    if let Err(e) = logging {
        eprintln!("Error: {e}");
        return ExitCode::from(pulpitum::cli::EXIT_SETTING);
    }
    // -c and -f are the shell's: with another subcommand they would be ignored.
    let scripted = !cli.commands.is_empty() || cli.file.is_some();
    if scripted && !matches!(cli.command, None | Some(Command::Shell(_))) {
        eprintln!("Error: -c/--command and -f/--file run statements in the shell; they do not combine with a subcommand");
        return ExitCode::from(pulpitum::cli::EXIT_SETTING);
    }
    if cli.format.is_some()
        && matches!(
            cli.command,
            Some(
                Command::Serve(_) | Command::Migrate | Command::Erasure { .. } | Command::Worker(_)
            )
        )
    {
        eprintln!("Error: --format is for results the shell prints; serve, migrate, erasure and worker print none");
        return ExitCode::from(pulpitum::cli::EXIT_SETTING);
    }
    // The query limits and the archive URL would be ignored by `migrate`, which runs no query
    // and touches only the hot store: refused, typed before or after it.
    if let Some(("migrate", sub)) = matches.subcommand() {
        let limits = pulpitum::cli::typed_flags(&matches, sub, &NOT_FOR_MIGRATE[..3]);
        if !limits.is_empty() {
            let verb = if limits.len() == 1 { "limits" } else { "limit" };
            eprintln!(
                "Error: {} {verb} queries; migrate runs none",
                limits.join(", ")
            );
            return ExitCode::from(pulpitum::cli::EXIT_SETTING);
        }
        if !pulpitum::cli::typed_flags(&matches, sub, &["archive_url"]).is_empty() {
            eprintln!("Error: --archive-url names the archive; migrate touches only the hot store");
            return ExitCode::from(pulpitum::cli::EXIT_SETTING);
        }
    }
    // A worker takes limits and task sizes from each plan it is sent.
    if let Some(("worker", sub)) = matches.subcommand() {
        let typed =
            pulpitum::cli::typed_flags(&matches, sub, &pulpitum::cli::worker::COORDINATOR_FLAGS);
        if !typed.is_empty() {
            eprintln!(
                "Error: {} belong to the coordinator (the shell or serve); a worker takes limits and tasks from each plan it is sent",
                typed.join(", ")
            );
            return ExitCode::from(pulpitum::cli::EXIT_SETTING);
        }
    }
    // TLS on ring (rustls is a direct dependency): install the provider and OpenDAL's HTTP
    // transport once, before anything opens a connection.
    pulpitum::archive::install_http_transport();
    // Statements are parsed and planned on the thread that blocks on the runtime (the
    // shell) and on its workers: both get the stack the server's shape limits assume.
    let rt = match pulpitum::server::runtime_builder().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let main = std::thread::Builder::new()
        .name("pulpitum-main".into())
        .stack_size(pulpitum::server::CONNECTION_STACK_BYTES)
        .spawn(move || commands(cli, rt));
    match main.map(|t| t.join()) {
        Ok(Ok(code)) => code,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command `cli` names, run on `rt`.
fn commands(cli: Cli, rt: tokio::runtime::Runtime) -> ExitCode {
    let result = match cli.command {
        None => {
            let format = cli.format.unwrap_or(Format::Table);
            rt.block_on(run(cli, format))
        }
        Some(Command::Shell(FormatArg { format })) => {
            let format = format.or(cli.format).unwrap_or(Format::Table);
            rt.block_on(run(cli, format))
        }
        Some(Command::Demo {
            small,
            no_shell,
            output: FormatArg { format },
        }) => {
            let format = format.or(cli.format).unwrap_or(Format::Table);
            rt.block_on(demo(cli, small, no_shell, format))
        }
        // Everything `serve` can fail at comes before it serves; `migrate` is the archiver's
        // function, and exits as `pulpitum-archiver migrate` does.
        Some(Command::Serve(ref args)) => setting(rt.block_on(serve(&cli, args))),
        Some(Command::Worker(ref args)) => rt.block_on(worker(&cli, args)),
        Some(Command::Migrate) => setting(rt.block_on(migrate(&cli))),
        // 0 gone (or done), 1 pending, 2 anything that failed: a script waiting for `show`
        // must not loop on a typo.
        Some(Command::Erasure { ref action }) => match rt.block_on(erasure(&cli, action)) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(Failure::Setting(e) | Failure::Work(e)) => Err(Failure::Setting(e)),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Setting(e)) => {
            eprintln!("Error: {e}");
            ExitCode::from(pulpitum::cli::EXIT_SETTING)
        }
        Err(Failure::Work(e)) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}
