//! `pulpitum-archiver`: the sidecar that archives eligible buckets, cleans up published ones
//! and collects orphaned objects. Flags fall back to environment variables; every value is
//! validated before any work starts.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Parser};
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use pulpitum::archive::{ArchiveStore, PayloadFormat};
use pulpitum::archiver::config::{self, parse_eligible_before, reject_obsolete};
use pulpitum::archiver::{collect_garbage_with, ArchiverConfig, ArchiverError, Runner};
use pulpitum::defaults;

/// mimalloc for this binary (the `mimalloc` feature, on by default; see Cargo.toml).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "pulpitum-archiver",
    version,
    about = "Archives eligible Pulpitum buckets to object storage"
)]
struct Args {
    #[arg(
        long,
        env = "PULPITUM_DATABASE_URL",
        hide_env_values = true,
        global = true,
        help = pulpitum::cli::DATABASE_URL_HELP
    )]
    database_url: Option<String>,
    // Global, like in `pulpitum`, so that typed after a subcommand it is parsed and refused
    // by the same check as before it (`policy` and `migrate` never open the archive).
    #[arg(
        long,
        env = "PULPITUM_ARCHIVE_URL",
        hide_env_values = true,
        global = true,
        help = pulpitum::cli::ARCHIVE_URL_HELP
    )]
    archive_url: Option<String>,
    /// RFC 3339 cutoff: a bucket is eligible when bucket_end <= this. Default: January 1 of the previous UTC year, recomputed every cycle.
    #[arg(long, env = "ARCHIVER_ELIGIBLE_BEFORE", allow_hyphen_values = true)]
    eligible_before: Option<String>,
    /// Seconds between discovery cycles.
    #[arg(
        long,
        env = "ARCHIVER_INTERVAL_SECONDS",
        default_value = "15",
        allow_hyphen_values = true
    )]
    interval_seconds: String,
    /// Owner-lease duration in seconds.
    #[arg(
        long,
        env = "ARCHIVER_LEASE_SECONDS",
        default_value = "60",
        allow_hyphen_values = true
    )]
    lease_seconds: String,
    /// Seconds before a deferred bucket is retried.
    #[arg(
        long,
        env = "ARCHIVER_RETRY_SECONDS",
        default_value = "15",
        allow_hyphen_values = true
    )]
    retry_seconds: String,
    /// Maximum work items per cycle.
    #[arg(
        long,
        env = "ARCHIVER_SCAN_LIMIT",
        default_value = "64",
        allow_hyphen_values = true
    )]
    scan_limit: String,
    /// Payload format of new archives: parquet or json.
    #[arg(
        long,
        env = "ARCHIVER_FORMAT",
        default_value = "parquet",
        allow_hyphen_values = true
    )]
    format: String,
    /// Seconds an unreferenced object must age before GC deletes it.
    #[arg(
        long,
        env = "ARCHIVER_GC_DELAY_SECONDS",
        default_value = "86400",
        allow_hyphen_values = true
    )]
    gc_delay_seconds: String,
    /// Seconds hot rows are kept after publication, 0 to 604800: a margin for readers in the middle of a hot page (routed reads need none; see docs/archiver.md).
    #[arg(
        long,
        env = "ARCHIVER_CLEANUP_DELAY_SECONDS",
        default_value = "60",
        allow_hyphen_values = true
    )]
    cleanup_delay_seconds: String,
    /// Seconds the readers may serve an archived route from their cache (60 in pulpitum and pulpitum serve). Objects replaced by compaction or retention are kept at least this plus --reader-statement-timeout-seconds plus 5 s.
    #[arg(
        long,
        env = "ARCHIVER_READER_ROUTE_CACHE_SECONDS",
        default_value = "60",
        allow_hyphen_values = true
    )]
    reader_route_cache_seconds: String,
    /// Seconds the longest reader statement may run: at least every server's --statement-timeout-ms (a scan reads with the routes it found for its whole run).
    #[arg(
        long,
        env = "ARCHIVER_READER_STATEMENT_TIMEOUT_SECONDS",
        default_value = "300",
        allow_hyphen_values = true
    )]
    reader_statement_timeout_seconds: String,
    /// Seconds a hot-store backup stays restorable against the live archive: objects replaced by compaction or retention are kept at least this long (docs/backup.md).
    #[arg(
        long,
        env = "ARCHIVER_BACKUP_RETENTION_SECONDS",
        default_value = "604800",
        allow_hyphen_values = true
    )]
    backup_retention_seconds: String,
    /// Seconds of job history kept (pulpitum_jobs); older rows are pruned each cycle.
    #[arg(
        long,
        env = "ARCHIVER_JOB_RETENTION_SECONDS",
        default_value = "604800",
        allow_hyphen_values = true
    )]
    job_retention_seconds: String,
    /// Compact published buckets into segments: on or off.
    #[arg(
        long,
        env = "ARCHIVER_COMPACTION",
        default_value = "on",
        allow_hyphen_values = true
    )]
    compaction: String,
    /// Seconds after a window's end before its buckets are compacted into segments.
    #[arg(
        long,
        env = "ARCHIVER_COMPACT_AFTER_SECONDS",
        default_value = "86400",
        allow_hyphen_values = true
    )]
    compact_after_seconds: String,
    /// Seconds a compaction pass may run before it writes no new segment (the segment in progress is finished and switched; the rest waits for the next pass); 0: one segment per pass.
    #[arg(
        long,
        env = "ARCHIVER_COMPACT_BUDGET_SECONDS",
        default_value = "300",
        allow_hyphen_values = true
    )]
    compact_budget_seconds: String,
    /// Segment size target: a segment is closed at the partition where its rows reach it.
    #[arg(
        long,
        env = "ARCHIVER_SEGMENT_TARGET_BYTES",
        default_value = "134217728",
        allow_hyphen_values = true
    )]
    segment_target_bytes: String,
    /// Directory a segment's payload is encoded into before its upload (default: the
    /// system's temporary directory).
    #[arg(long, env = "ARCHIVER_SPILL_DIR")]
    spill_dir: Option<std::path::PathBuf>,
    /// Segment payloads up to this size are one create-once PUT; larger ones a multipart
    /// upload under a unique key.
    #[arg(
        long,
        env = "ARCHIVER_SEGMENT_PUT_MAX_BYTES",
        default_value = "16777216",
        allow_hyphen_values = true
    )]
    segment_put_max_bytes: String,
    /// Part size of a segment's multipart upload (and of the ranged reads verifying it).
    #[arg(
        long,
        env = "ARCHIVER_SEGMENT_PART_BYTES",
        default_value = "16777216",
        allow_hyphen_values = true
    )]
    segment_part_bytes: String,
    /// Buckets processed at once.
    #[arg(
        long,
        env = "ARCHIVER_CONCURRENCY",
        default_value = "4",
        allow_hyphen_values = true
    )]
    concurrency: String,
    /// Rows per snapshot page.
    #[arg(
        long,
        env = "ARCHIVER_SNAPSHOT_PAGE_ROWS",
        default_value = "10000",
        allow_hyphen_values = true
    )]
    snapshot_page_rows: String,
    /// Hot rows deleted per cleanup transaction.
    #[arg(
        long,
        env = "ARCHIVER_CLEANUP_BATCH_ROWS",
        default_value = "10000",
        allow_hyphen_values = true
    )]
    cleanup_batch_rows: String,
    /// Deadline in seconds for one bucket's snapshot, upload and verification (below the GC delay).
    #[arg(
        long,
        env = "ARCHIVER_UPLOAD_DEADLINE_SECONDS",
        default_value = "3600",
        allow_hyphen_values = true
    )]
    upload_deadline_seconds: String,
    /// Deadline in seconds of any single database operation (also sets the publication retry window).
    #[arg(
        long,
        env = "ARCHIVER_OP_DEADLINE_SECONDS",
        default_value = "30",
        allow_hyphen_values = true
    )]
    op_deadline_seconds: String,
    /// Archive everything eligible now and every cleanup already due (in batches of the scan limit), compact the windows that are due, run a GC pass, then exit; non-zero if any bucket or window failed.
    #[arg(long)]
    once: bool,
    /// Skip orphan GC.
    #[arg(long)]
    no_gc: bool,
    /// Serve Prometheus metrics and /healthz on this address: HOST:PORT, where HOST is an IP address or a name (127.0.0.1:9187, localhost:9187, [::1]:9187).
    #[arg(long, env = "ARCHIVER_METRICS_ADDR")]
    metrics_addr: Option<String>,
    /// Seconds without progress (a cycle without failures, a published or cleaned bucket) before /healthz answers 503.
    #[arg(
        long,
        env = "ARCHIVER_HEALTH_MAX_AGE_SECONDS",
        default_value = "300",
        allow_hyphen_values = true
    )]
    health_max_age_seconds: String,
    /// Log line format on standard error: text or json (one JSON object per line). The filter is PULPITUM_LOG (default info).
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

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Applies the hot store's schema migrations, as the role that owns the schema, then
    /// exits (creates an embedded store's file if absent). Every other start only checks the
    /// schema version and needs no DDL right. The same step as `pulpitum migrate`.
    Migrate,
    /// Shows or changes the tables' tiering policies and pauses; every running archiver
    /// applies a change at its next discovery cycle.
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
}

#[derive(clap::Subcommand, Debug)]
enum PolicyAction {
    /// Every table's policy, and whether the whole store is paused.
    Show,
    /// Sets options of a table: TABLE OPTION=VALUE... (archive_after='90 days', format=json, cleanup_delay='2 hours', retain_for='5 years', paused=true).
    Set {
        /// The table.
        table: String,
        /// OPTION=VALUE pairs.
        #[arg(required = true)]
        options: Vec<String>,
    },
    /// Resets options of a table to the archiver's settings: TABLE OPTION...
    Reset {
        /// The table.
        table: String,
        /// Option names.
        #[arg(required = true)]
        options: Vec<String>,
    },
    /// Stops new archive claims on TABLE, or on every table when none is named (cleanup goes on).
    Pause {
        /// The table; none for the whole store.
        table: Option<String>,
    },
    /// Resumes archiving of TABLE, or of the whole store when none is named.
    Resume {
        /// The table; none for the whole store.
        table: Option<String>,
    },
}

/// `policy ...`: one control statement against the store, and its answer on stdout.
async fn policy(args: &Args, action: &PolicyAction) -> Result<(), Box<dyn std::error::Error>> {
    use pulpitum::control::{self, ControlStatement};
    use pulpitum::model::TableId;

    // Policies live in the hot store alone: no archive URL is needed.
    let db_url = match &args.database_url {
        Some(u) => u.clone(),
        None => defaults::resolve_urls(None, None)?.0,
    };
    let migrate = defaults::start_migrates(args.database_url.as_deref());
    let table =
        |name: &str| TableId::new(name).map_err(|e| format!("{name:?} is not a table name: {e}"));
    let stmt = match action {
        PolicyAction::Show => None,
        PolicyAction::Set { table: t, options } => {
            let mut pairs = Vec::new();
            for o in options {
                let (k, v) = o.split_once('=').ok_or_else(|| {
                    format!("{o:?} is not OPTION=VALUE (for example archive_after='90 days')")
                })?;
                pairs.push((k.trim().to_string(), v.trim().to_string()));
            }
            Some(ControlStatement::Set {
                table: table(t)?,
                options: pairs,
            })
        }
        PolicyAction::Reset { table: t, options } => Some(ControlStatement::Reset {
            table: table(t)?,
            options: options.clone(),
        }),
        PolicyAction::Pause { table: t } | PolicyAction::Resume { table: t } => {
            Some(ControlStatement::Moves {
                table: t.as_deref().map(table).transpose()?,
                paused: matches!(action, PolicyAction::Pause { .. }),
            })
        }
    };
    let (store, _) = pulpitum::store::open_started(&db_url, migrate).await?;
    let mut out = pulpitum::cli::stdout();
    let batches = match stmt {
        Some(stmt) => vec![control::run(&*store, &stmt).await?],
        None => {
            let set: std::collections::HashMap<_, _> = store
                .policies()
                .await?
                .into_iter()
                .map(|p| (p.table_id.clone(), p))
                .collect();
            let mut batches = Vec::new();
            for def in store.tables().await? {
                let p = set
                    .get(&def.table_id)
                    .cloned()
                    .unwrap_or_else(|| pulpitum::store::TablePolicy::none(def.table_id.clone()));
                batches.push(control::policy_batch(&p)?);
            }
            let state = if store.store_paused().await? {
                "paused"
            } else {
                "archiving"
            };
            writeln!(out, "store: {state}")?;
            batches
        }
    };
    if !batches.is_empty() {
        let table = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?;
        writeln!(out, "{table}")?;
    }
    out.flush()?;
    Ok(())
}

fn build_config(args: &Args) -> Result<ArchiverConfig, ArchiverError> {
    reject_obsolete(|k| std::env::var(k).ok())?;
    let mut c = ArchiverConfig::with_defaults();
    if let Some(raw) = &args.eligible_before {
        c.eligible_before = Some(parse_eligible_before(raw)?);
    }
    c.interval = config::INTERVAL.parse(&args.interval_seconds)?;
    c.lease = config::LEASE.parse(&args.lease_seconds)?;
    c.retry = config::RETRY.parse(&args.retry_seconds)?;
    c.scan_limit = config::SCAN_LIMIT.parse(&args.scan_limit)?;
    c.format = args
        .format
        .parse::<PayloadFormat>()
        .map_err(|_| ArchiverError::Config {
            setting: "ARCHIVER_FORMAT (--format)",
            reason: format!(
                "{:?} is not a payload format; accepted: parquet or json",
                args.format
            ),
        })?;
    c.gc_delay = config::GC_DELAY.parse(&args.gc_delay_seconds)?;
    c.cleanup_delay = config::CLEANUP_DELAY.parse(&args.cleanup_delay_seconds)?;
    c.job_retention = config::JOB_RETENTION.parse(&args.job_retention_seconds)?;
    c.reader_route_cache = config::READER_ROUTE_CACHE.parse(&args.reader_route_cache_seconds)?;
    c.reader_statement_timeout =
        config::READER_STATEMENT_TIMEOUT.parse(&args.reader_statement_timeout_seconds)?;
    c.backup_retention = config::BACKUP_RETENTION.parse(&args.backup_retention_seconds)?;
    c.compaction = match args.compaction.as_str() {
        "on" => true,
        "off" => false,
        other => {
            return Err(ArchiverError::Config {
                setting: "ARCHIVER_COMPACTION (--compaction)",
                reason: format!("{other:?} is not a switch; accepted: on or off"),
            })
        }
    };
    c.compact_after = config::COMPACT_AFTER.parse(&args.compact_after_seconds)?;
    c.compact_budget = config::COMPACT_BUDGET.parse(&args.compact_budget_seconds)?;
    c.segment_target_bytes = config::SEGMENT_TARGET_BYTES.parse(&args.segment_target_bytes)?;
    c.spill_dir = args.spill_dir.clone();
    c.segment_put_max_bytes = config::SEGMENT_PUT_MAX_BYTES.parse(&args.segment_put_max_bytes)?;
    c.segment_part_bytes = config::SEGMENT_PART_BYTES.parse(&args.segment_part_bytes)?;
    c.concurrency = config::CONCURRENCY.parse(&args.concurrency)?;
    c.cleanup_batch_rows = config::CLEANUP_BATCH_ROWS.parse(&args.cleanup_batch_rows)?;
    c.snapshot_page_rows = config::SNAPSHOT_PAGE_ROWS.parse(&args.snapshot_page_rows)?;
    c.upload_deadline = config::UPLOAD_DEADLINE.parse(&args.upload_deadline_seconds)?;
    c.op_deadline = config::OP_DEADLINE.parse(&args.op_deadline_seconds)?;
    c.validate()?;
    Ok(c)
}

/// The metrics address: `HOST:PORT` with an IP address or a host name, resolved now so a
/// name that does not resolve is a setting error, not a late bind failure.
async fn metrics_addr(raw: &str) -> Result<SocketAddr, ArchiverError> {
    const SETTING: &str = "ARCHIVER_METRICS_ADDR (--metrics-addr)";
    const ACCEPTED: &str = "HOST:PORT with an IP address or host name, such as 127.0.0.1:9187, localhost:9187 or [::1]:9187";
    let t = raw.trim();
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    let refuse = |what: String| ArchiverError::Config {
        setting: SETTING,
        reason: format!("{raw:?} {what}; accepted: {ACCEPTED}"),
    };
    let port_ok = t
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if !port_ok {
        return Err(refuse("is not HOST:PORT".into()));
    }
    let mut found = tokio::net::lookup_host(t)
        .await
        .map_err(|e| refuse(format!("does not resolve ({e})")))?;
    found
        .next()
        .ok_or_else(|| refuse("resolves to no address".into()))
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    match &args.command {
        Some(Command::Policy { action }) => {
            policy(&args, action).await?;
            return Ok(true);
        }
        Some(Command::Migrate) => {
            let line =
                pulpitum::cli::migrate(args.database_url.as_deref(), args.archive_url.as_deref())
                    .await?;
            let mut out = pulpitum::cli::stdout();
            writeln!(out, "{line}")?;
            out.flush()?;
            return Ok(true);
        }
        None => {}
    }
    let config = build_config(&args)?;
    let health_max_age = health_max_age(&args, &config)?;
    let metrics_addr = match &args.metrics_addr {
        Some(a) => Some(metrics_addr(a).await?),
        None => None,
    };
    let (db_url, archive_url) =
        defaults::resolve_urls(args.database_url.as_deref(), args.archive_url.as_deref())?;
    if args.database_url.is_none() {
        eprintln!("pulpitum-archiver: using the embedded store at {db_url} and the archive at {archive_url}");
    }
    // The archive URL first: a refused one must not leave a new database file behind.
    let mut archive = ArchiveStore::from_url(&archive_url)?;
    // Only the embedded default (or sqlite::memory:) is migrated here: any other store is
    // checked, and `pulpitum-archiver migrate` migrates it as the schema's owner.
    let migrate = defaults::start_migrates(args.database_url.as_deref());
    let (store, _) = pulpitum::store::open_started(&db_url, migrate).await?;
    // Recorded as a reader, after checking that this build reads every table: a newer
    // record schema is not stored while this process runs (docs/tables.md).
    let reader = pulpitum::control::readers::ReaderLease::start(store.clone(), "archiver").await?;
    // Refuse a store that would let a late writer overwrite an archive (before any fault
    // layer: the probe tests the store itself).
    archive.check_create_once().await?;
    if let Some(layer) = fault_layer_from_env()? {
        archive = archive.with_faults(layer);
    }
    let archive = Arc::new(archive);
    let runner = Runner::new(store.clone(), archive.clone(), config.clone())?;
    let _metrics_task = match metrics_addr {
        Some(addr) => {
            let (bound, task) =
                pulpitum::archiver::metrics::serve(addr, runner.metrics(), health_max_age)
                    .await
                    .map_err(|e| format!("cannot serve metrics on {addr} (--metrics-addr): {e}"))?;
            tracing::info!(%bound, "serving metrics");
            Some(task)
        }
        None => None,
    };
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            eprintln!(
                "pulpitum-archiver: stopping after the buckets in progress (signal again to abort)"
            );
            shutdown.cancel();
            wait_for_signal().await;
            std::process::exit(130);
        });
    }
    if !args.once {
        runner.run(shutdown).await?;
        reader.stop().await;
        return Ok(true);
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{spinner} {pos}/{len} buckets {wide_bar} {elapsed}")
                .expect("valid template"),
        );
        b
    });
    let drained = runner
        .drain(&shutdown, &|done, total| {
            if let Some(b) = &bar {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
        })
        .await?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let report = &drained.totals;
    let mut ok = report.failed == 0 && !drained.interrupted && !drained.erasures_failed;
    eprintln!(
        "pulpitum-archiver: {} batches: discovered {}, archived {}, cleaned {}, deferred {}, skipped {}, interrupted {}, failed {}",
        drained.batches, report.discovered, report.archived, report.cleaned, report.deferred, report.skipped, report.interrupted, report.failed
    );
    for e in &report.errors {
        eprintln!("  {e}");
    }
    eprintln!("{}", once_outcome(&drained));
    if config.compaction && !drained.interrupted {
        match runner.compact_pass_until(&shutdown).await {
            Ok(c) => {
                eprintln!(
                    "pulpitum-archiver: compaction: {} windows into {} segments ({} buckets, {} rows), {} skipped, {} failed",
                    c.windows, c.segments, c.buckets, c.rows, c.skipped, c.failed
                );
                for e in &c.errors {
                    eprintln!("  {e}");
                }
                if c.interrupted {
                    eprintln!("pulpitum-archiver: compaction stopped by the shutdown signal; the segment in progress was abandoned (its claim released; segments switched before stay switched)");
                } else if c.budget_spent {
                    eprintln!("pulpitum-archiver: compaction budget (--compact-budget-seconds) spent; the work left is compacted by the next run");
                }
                ok &= c.failed == 0 && !c.interrupted;
            }
            Err(e) => {
                eprintln!("pulpitum-archiver: compaction failed: {e}");
                ok = false;
            }
        }
    }
    if drained.erasures_failed && !args.no_gc {
        // After a hot-store restore, the objects the erasure log's route repair switches to
        // are orphans until it has run: GC waits for it.
        eprintln!("pulpitum-archiver: GC skipped: the erasure log is not fully re-applied");
    } else if !args.no_gc {
        match collect_garbage_with(&*store, &archive, runner.gc_delays(), &runner.metrics()).await {
            Ok(gc) => eprintln!(
                "pulpitum-archiver: GC listed {}, deleted {}, kept {} referenced and {} young",
                gc.listed, gc.deleted, gc.referenced, gc.young
            ),
            Err(e) => {
                eprintln!("pulpitum-archiver: GC failed: {e}");
                ok = false;
            }
        }
    }
    reader.stop().await;
    Ok(ok)
}

/// The `--once` summary's last line: what is left, and when it will be done.
fn once_outcome(d: &pulpitum::archiver::DrainReport) -> String {
    let cap = pulpitum::archiver::REMAINING_COUNT_CAP;
    let count = |n: usize| {
        if n >= cap {
            format!("at least {n}")
        } else {
            n.to_string()
        }
    };
    let mut parts = Vec::new();
    if d.totals.denied > 0 {
        // Running again cannot help these: say what will.
        parts.push(format!(
            "{} buckets refused by the database role's grants (fix the grants: docs/permissions.md, \"Database\")",
            d.totals.denied
        ));
    }
    if d.erasures_failed {
        parts.push(
            "the erasure log was not fully re-applied (see the warning above; run again)".into(),
        );
    }
    if d.remaining > 0 {
        parts.push(format!(
            "{} buckets still to archive or clean (failed, busy or interrupted; run again)",
            count(d.remaining)
        ));
    }
    if d.cleanups_waiting > 0 {
        parts.push(format!(
            "{} published buckets whose hot rows wait for the cleanup delay (a later run deletes them)",
            count(d.cleanups_waiting)
        ));
    }
    if parts.is_empty() {
        "pulpitum-archiver: nothing remains".into()
    } else {
        format!("pulpitum-archiver: remaining: {}", parts.join("; "))
    }
}

/// The health endpoint's allowance without progress: longer than a cycle's pause, or a
/// healthy idle archiver would flap between cycles.
fn health_max_age(
    args: &Args,
    config: &ArchiverConfig,
) -> Result<std::time::Duration, ArchiverError> {
    const SETTING: &str = "ARCHIVER_HEALTH_MAX_AGE_SECONDS (--health-max-age-seconds)";
    let max_age = config::HEALTH_MAX_AGE.parse(&args.health_max_age_seconds)?;
    if max_age <= config.interval {
        return Err(ArchiverError::Config {
            setting: SETTING,
            reason: format!(
                "{:?} must exceed the cycle interval ({} s)",
                args.health_max_age_seconds,
                config.interval.as_secs_f64()
            ),
        });
    }
    Ok(max_age)
}

/// Chaos-test hook: `PULPITUM_FAULT_RATE` (0..1) fails that share of every object-store
/// operation, seeded by `PULPITUM_FAULT_SEED`; `PULPITUM_FAULT_STATS_FILE` receives the
/// injected counts every 200 ms (a SIGKILLed process cannot report at exit). Only compiled
/// with the `failpoints` feature.
#[cfg(feature = "failpoints")]
fn fault_layer_from_env() -> Result<Option<pulpitum::archive::faults::FaultLayer>, ArchiverError> {
    use pulpitum::archive::faults::{FaultLayer, FaultOp, FaultPlan};
    let Ok(raw) = std::env::var("PULPITUM_FAULT_RATE") else {
        return Ok(None);
    };
    let rate: f64 =
        raw.parse()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or(ArchiverError::Config {
                setting: "PULPITUM_FAULT_RATE",
                reason: format!("{raw:?} is not a fraction between 0 and 1"),
            })?;
    let seed = std::env::var("PULPITUM_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut plan = FaultPlan::new(seed);
    for op in [
        FaultOp::Write,
        FaultOp::Read,
        FaultOp::Stat,
        FaultOp::List,
        FaultOp::Delete,
    ] {
        plan = plan.fail_ratio(op, rate);
    }
    let layer = FaultLayer::new(plan);
    eprintln!("pulpitum-archiver: failing {rate} of object-store calls (seed {seed})");
    if let Ok(path) = std::env::var("PULPITUM_FAULT_STATS_FILE") {
        let layer = layer.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                let s = layer.stats();
                let calls: u64 = s.calls.iter().sum();
                let _ = std::fs::write(&path, format!("{calls} {}\n", s.failures));
            }
        });
    }
    Ok(Some(layer))
}

#[cfg(not(feature = "failpoints"))]
fn fault_layer_from_env() -> Result<Option<pulpitum::archive::faults::FaultLayer>, ArchiverError> {
    Ok(None)
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[tokio::main]
async fn main() -> ExitCode {
    let command = Args::command();
    // `--archive-url` is global (see `Args`) but refused by both subcommands: not in their help.
    let matches =
        pulpitum::cli::hide_globals_in(command.clone(), &["migrate", "policy"], &["archive_url"])
            .get_matches();
    let args = match Args::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    pulpitum::cli::quiet_broken_pipes();
    // `policy` and `migrate` use the database URL and the log format; a run's flags (and the
    // archive URL, which neither opens) typed with them would be ignored, so they are
    // refused, before or after the subcommand.
    if args.command.is_some() {
        let stray = pulpitum::cli::flags_given(&command, &matches, &["database_url", "log_format"]);
        if !stray.is_empty() {
            eprintln!(
                "pulpitum-archiver: {} {} for a run (without a subcommand); `policy` and `migrate` take --database-url and --log-format",
                stray.join(", "),
                if stray.len() == 1 { "is" } else { "are" }
            );
            return ExitCode::from(pulpitum::cli::EXIT_SETTING);
        }
    }
    // Everything this process creates (the embedded store, a local archive) is owner-only.
    #[cfg(unix)]
    // SAFETY: umask only sets the process's file-creation mask; it cannot fail and touches
    // no memory. It runs before any thread that creates files.
    unsafe {
        libc::umask(0o077);
    }
    let logging = args
        .log_format
        .parse()
        .and_then(|format| pulpitum::logging::init("info", format));
    if let Err(e) = logging {
        eprintln!("pulpitum-archiver: {e}");
        return ExitCode::from(pulpitum::cli::EXIT_SETTING);
    }
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("pulpitum-archiver: {e}");
            ExitCode::from(2)
        }
    }
}
