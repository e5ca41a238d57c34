//! The embedded entry point: a DataFusion `SessionContext` with every registered Pulpitum
//! table, the system tables (`pulpitum_tables`, `pulpitum_buckets`, `pulpitum_jobs`,
//! `pulpitum_compactions`, `pulpitum_retired_objects`), and
//! `CREATE EXTERNAL TABLE ... STORED AS PULPITUM` enabled. Statements DataFusion cannot plan
//! (`ALTER TABLE ... SET (archive_after = ...)`, `SYSTEM STOP MOVES`) run through
//! [`crate::control::sql`], which every front end uses.
//!
//! [`connect`] needs a database at this build's schema version, migrated by its owner with
//! `pulpitum migrate`: a session only checks the version (and needs no DDL right) unless
//! [`SessionOptions::migrate`] says this process owns the schema.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = pulpitum::session::connect(
//!     "postgres://postgres@127.0.0.1:5432/test",
//!     "file:///var/lib/pulpitum/archive",
//! )
//! .await?;
//! ctx.sql(
//!     "CREATE EXTERNAL TABLE IF NOT EXISTS chat STORED AS PULPITUM LOCATION '' \
//!      OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
//! )
//! .await?;
//! ctx.sql("INSERT INTO chat VALUES (1, TIMESTAMP '2024-05-01T12:00:00Z', 1, 'hello')")
//!     .await?
//!     .collect()
//!     .await?;
//! let page = ctx
//!     .sql("SELECT * FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC LIMIT 50")
//!     .await?
//!     .collect()
//!     .await?;
//! # let _ = page;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::archive::{ArchiveError, ArchiveStore};
use crate::control::ControlHandle;
use crate::distributed::{DistributedSettings, Tiers};
use crate::provider::factory::{PulpitumSchema, FORMAT_NAME};
use crate::provider::{
    ExactTimeLiterals, ProviderError, ProviderOptions, PulpitumTableFactory, QueryLimits,
};
use crate::store::{HotStore, StoreError};
use crate::table::{RouteCacheConfig, DEFAULT_PAGE_ROWS};

/// Options of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// Per-query scan limits (rows, bytes, wall time).
    pub limits: QueryLimits,
    /// Archived-route cache bounds (shared by all tables of the session).
    pub route_cache: RouteCacheConfig,
    /// Rows per hot page and archive batch.
    pub page_rows: usize,
    /// Most rows one `INSERT` statement may write; larger statements fail before writing
    /// anything (see [`crate::provider::sink`]).
    pub max_insert_rows: usize,
    /// DataFusion target partitions (scan parallelism); `None` keeps DataFusion's default
    /// (the number of cores).
    pub target_partitions: Option<usize>,
    /// Apply pending migrations before listing tables (only for a process that owns the
    /// schema: it needs the rights to create tables). Off by default: the session then only
    /// checks the schema version ([`crate::store::Catalog::check_schema`]) and refuses a
    /// database that `pulpitum migrate` has not brought to this build's version.
    pub migrate: bool,
    /// Record this process as a reader of the store under this role while the session
    /// lives ([`crate::control::readers`]), after checking that this build reads every
    /// table; the binaries set it (`shell`, `serve`). `None` (the default) records nothing;
    /// an embedding application that reads the store for long should set it too.
    pub reader: Option<&'static str>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            limits: QueryLimits::default(),
            route_cache: RouteCacheConfig::default(),
            page_rows: DEFAULT_PAGE_ROWS,
            max_insert_rows: crate::provider::sink::DEFAULT_MAX_INSERT_ROWS,
            target_partitions: None,
            migrate: false,
            reader: None,
        }
    }
}

/// Every way building a session can fail.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The hot store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The archive URL is invalid.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// A registered table cannot be exposed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// DataFusion refused a registration.
    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),
    /// This build cannot read a table in the store, or could not record itself as a reader.
    #[error(transparent)]
    Reader(#[from] crate::control::readers::ReaderError),
}

/// Builds a session over a store and an archive, registering every table in the store's
/// registry and the `PULPITUM` table factory.
pub async fn session(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    opts: SessionOptions,
) -> Result<SessionContext, SessionError> {
    build(store, archive, opts, None).await
}

/// [`session`] as a coordinator: plans whose archived scans are large run their scan
/// stages on the workers `workers` names ([`crate::distributed`]); everything else runs
/// here as in [`session`].
pub async fn distributed_session(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    opts: SessionOptions,
    workers: &DistributedSettings,
) -> Result<SessionContext, SessionError> {
    build(store, archive, opts, Some(workers)).await
}

async fn build(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    opts: SessionOptions,
    workers: Option<&DistributedSettings>,
) -> Result<SessionContext, SessionError> {
    let tiers = Tiers {
        store: store.clone(),
        archive: archive.clone(),
        route_cache: opts.route_cache,
    };
    if opts.migrate {
        store.migrate().await?;
    } else {
        store.check_schema().await?;
    }
    let factory = PulpitumTableFactory::new(
        store.clone(),
        archive,
        ProviderOptions {
            limits: opts.limits,
            page_rows: opts.page_rows,
            max_insert_rows: opts.max_insert_rows,
        },
        opts.route_cache,
    );
    let mut config = SessionConfig::new()
        .with_information_schema(true)
        .with_extension(Arc::new(ControlHandle {
            store: store.clone(),
        }));
    if let Some(n) = opts.target_partitions {
        config = config.with_target_partitions(n.max(1));
    }
    if let Some(role) = opts.reader {
        // Held by the session's configuration: the record is refreshed while the session
        // lives, and ages out once it is dropped.
        let lease = crate::control::readers::ReaderLease::start(store.clone(), role).await?;
        config = config.with_extension(Arc::new(lease));
    }
    if let Some(w) = workers {
        config = config
            .with_extension(Arc::new(w.clone()))
            .with_extension(Arc::new(crate::provider::SplitScans {
                buckets_per_task: w.buckets_per_task.max(1),
            }));
    }
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_table_factory(FORMAT_NAME.to_string(), Arc::new(factory.clone()));
    if let Some(w) = workers {
        builder = crate::distributed::install(builder, w, tiers);
    }
    let state = builder.build();
    let ctx = SessionContext::new_with_state(state);
    // After DataFusion's type coercion, before the exact comparisons below read them: a
    // string naming a local time is read in the session's zone (see `provider::zoned`).
    ctx.add_analyzer_rule(Arc::new(crate::provider::SessionZoneStrings));
    // After DataFusion's type coercion: comparisons with literals finer than a column
    // must not be truncated by its optimizer (see `provider::literals`).
    ctx.add_analyzer_rule(Arc::new(ExactTimeLiterals));
    // An INSERT's NULL into a NOT NULL column reaches the sink, which names the column.
    ctx.add_analyzer_rule(Arc::new(crate::provider::sink::InsertNullsByName));
    // After type coercion too: a literal with a decimal point cast to a NUMERIC or an
    // integer takes the value as written (`1.005`), not its double's.
    ctx.add_analyzer_rule(Arc::new(crate::provider::ExactDecimalLiterals));
    // Before the optimizer turns a DELETE's subquery into a join it would lose.
    ctx.add_analyzer_rule(Arc::new(crate::provider::ChangeShape));
    // Every table's times are in UTC: `date_trunc` of them takes arithmetic, not a time
    // zone library per row (see `provider::utc_trunc`).
    crate::provider::utc_trunc::install(&ctx);
    PulpitumSchema::install(&ctx, Some(factory.clone()))?;
    crate::control::system::register(&ctx, store.clone())?;
    for def in store.tables().await? {
        let name = def.table_id.to_string();
        // One table that cannot be shown (a declared table whose schema cannot be read)
        // does not take the session down: it is left out here, and its first use resolves
        // it again and fails with the reason.
        match factory.provider(def).await {
            Ok(provider) => {
                ctx.register_table(name.as_str(), Arc::new(provider))?;
            }
            Err(e) => tracing::warn!(table = %name, error = %e, "table left out of the session"),
        }
    }
    Ok(ctx)
}

/// Opens the hot store named by a locator (see [`crate::locator`] and
/// [`crate::store::open`]): `postgres://` / `postgresql://` or a key=value string
/// (CockroachDB or PostgreSQL), `sqlite://PATH`, `sqlite:PATH`, a file path containing `/`
/// or ending in `.db`, `.sqlite` or `.sqlite3` (embedded, created if absent),
/// `sqlite::memory:`. Anything else is refused; errors never show a password.
pub async fn open_store(database_url: &str) -> Result<Arc<dyn HotStore>, SessionError> {
    Ok(crate::store::open(database_url).await?)
}

/// Builds a session from a database URL and an archive URL with default options: the
/// database must exist and be migrated to this build's schema (`pulpitum migrate`).
pub async fn connect(
    database_url: &str,
    archive_url: &str,
) -> Result<SessionContext, SessionError> {
    connect_with(database_url, archive_url, SessionOptions::default()).await
}

/// [`connect`] with explicit options (limits, route cache, page size, parallelism).
pub async fn connect_with(
    database_url: &str,
    archive_url: &str,
    opts: SessionOptions,
) -> Result<SessionContext, SessionError> {
    connect_with_workers(database_url, archive_url, opts, None).await
}

/// [`connect_with`], as a coordinator of `workers` when given
/// ([`distributed_session`]).
pub async fn connect_with_workers(
    database_url: &str,
    archive_url: &str,
    opts: SessionOptions,
    workers: Option<&DistributedSettings>,
) -> Result<SessionContext, SessionError> {
    // The archive URL first: a refused one must not leave a new database file behind.
    let archive = Arc::new(ArchiveStore::from_url(archive_url)?);
    // Only the schema's owner creates an embedded file; anyone else needs it to exist.
    let store = if opts.migrate {
        crate::store::open(database_url).await?
    } else {
        crate::store::open_existing(database_url).await?
    };
    build(store, archive, opts, workers).await
}
