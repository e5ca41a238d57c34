//! The hot store on CockroachDB or PostgreSQL, over tokio-postgres with a deadpool pool.
//!
//! [`PgStore`] implements the six roles of the hot store's contract ([`Catalog`],
//! [`Appends`], [`RoutedReads`], [`Lifecycle`], [`Control`](crate::store::Control),
//! [`Compaction`](crate::store::Compaction); together [`HotStore`]) with the same SQL on
//! both databases. This module owns what every role shares: the connection settings
//! ([`PgStoreConfig`]), the pool and the session check of every new connection, the retry
//! loop each operation runs in, and the cache of table definitions.
//!
//! # Transactions and retries
//!
//! Every operation is one `SERIALIZABLE` transaction, retried whole on 40001/40P01 per
//! [`RetryPolicy`]: an explicit `BEGIN ISOLATION LEVEL SERIALIZABLE` transaction for the
//! archiver's steps, or a single statement for appends and reads. The pool's sessions
//! default to `SERIALIZABLE`, so a single statement is a serializable transaction too;
//! PostgreSQL only detects the fence anomaly (an append that read "hot" committing after a
//! snapshot that missed it) when every participant is serializable. The fence and the
//! claim checks live in the statements themselves: an append writes only if no bucket of
//! it is non-Hot, and every archiver step compares owner token, generation, state and
//! `lease_expires_at > now()` in the statement that reads or writes, against the
//! database's clock, never the worker's. A refused conditional write re-reads the row in
//! the same transaction to say precisely why. An error while a self-committing statement
//! or a `COMMIT` runs is reported as outcome-unknown unless the server says it aborted.
//! One attempt reports why it failed as a `TxError`; `PgStore::run` turns that into a
//! retry, a [`StoreError::RetriesExhausted`], an [`StoreError::OutcomeUnknown`] or a
//! plain error.
//!
//! # Sessions
//!
//! Sessions also use `plan_cache_mode=force_generic_plan` where the server knows it (chosen
//! per connection from its version, see [`session`]): the statements are written so that
//! their generic plans probe primary keys, and re-planning the array-based append on every
//! call cost more than the insert itself. Every new connection is checked before use: a
//! session whose default isolation is weaker than `SERIALIZABLE`, or whose schema is not the
//! configured one, is refused with [`StoreError::UnsafeSession`]. Client- and server-side
//! timeouts are set in `timeouts`.
//!
//! # Where each role lives
//!
//! - `catalog`: [`Catalog`] (migrations, the table registry, the store clock);
//!   [`migrate`] holds the migration runner, which embeds the `sql/` files.
//! - `append`: [`Appends`], the batch preparation and the one-statement append.
//! - `reads`: [`RoutedReads`], the page and head statements and their bound predicates.
//! - `lifecycle`: [`Lifecycle`], the archiver's steps; `claims` holds the compare-and-set
//!   plumbing they share (taking a claim, a conditional write, explaining a refusal).
//! - `control`: [`Control`](crate::store::Control), policies, pauses and job history.
//! - `compaction`: [`Compaction`](crate::store::Compaction), window claims, a window's
//!   sources, the one-transaction route switch and the retired objects.
//! - `decode`: turning rows into buckets, records and envelope batches; `sql`: the table
//!   names, the metadata column list and the parameter builders every statement uses.
//!
//! [`Appends`]: crate::store::Appends
//! [`RoutedReads`]: crate::store::RoutedReads
//! [`Lifecycle`]: crate::store::Lifecycle
//! [`HotStore`]: crate::store::HotStore

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, PoolError, QueueMode, RecyclingMethod,
};
use tokio_postgres::NoTls;

use super::retry::{Disposition, RetryPolicy};
use super::{Catalog, StoreError, StoreResult, TableDefinition};
use crate::model::{EventTime, TableId};

mod append;
mod catalog;
mod changes;
mod claims;
mod compaction;
#[doc(hidden)]
pub use work_list::{retired_work_statements, work_list_statements};
mod control;
mod decode;
mod explain;
mod lifecycle;
pub mod migrate;
mod reads;
pub mod session;
mod sql;
mod switch;
mod timeouts;
mod work_list;

/// The most grid buckets a listing across every partition may span and still be bounded
/// on `bucket_end` (see `short_grid_ceiling`).
const SHORT_LISTING_BUCKETS: usize = 7;

/// Default number of pooled connections.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Connection settings for [`PgStore`]. `Debug` shows the URL with its password redacted.
#[derive(Clone)]
pub struct PgStoreConfig {
    /// A `postgres://` URL (or key=value connection string).
    pub url: String,
    /// Schema to create (if absent) and put first on the `search_path`; `None` keeps the
    /// server's default. Tests use a fresh schema each to run in parallel.
    pub schema: Option<String>,
    /// Maximum pooled connections.
    pub pool_size: usize,
    /// Transaction retry policy.
    pub retry: RetryPolicy,
    /// Sets `plan_cache_mode=force_generic_plan` on every session of a server that knows it
    /// (PostgreSQL 12+, CockroachDB 24.2+; older servers are detected and left alone).
    pub generic_plans: bool,
}

impl std::fmt::Debug for PgStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStoreConfig")
            .field("url", &crate::locator::redact(&self.url))
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("retry", &self.retry)
            .field("generic_plans", &self.generic_plans)
            .finish()
    }
}

impl PgStoreConfig {
    /// Settings for `url` with the default pool size and retry policy.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            pool_size: DEFAULT_POOL_SIZE,
            retry: RetryPolicy::default(),
            generic_plans: true,
        }
    }

    /// Whether to force generic plans on every session (see the field).
    #[must_use]
    pub fn with_generic_plans(mut self, generic_plans: bool) -> Self {
        self.generic_plans = generic_plans;
        self
    }

    /// Uses (and creates if absent) the given schema: `[a-z_][a-z0-9_]*`, at most 63 chars.
    #[must_use]
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Sets the maximum number of pooled connections (at least 1).
    #[must_use]
    pub fn with_pool_size(mut self, pool_size: usize) -> Self {
        self.pool_size = pool_size.max(1);
        self
    }

    /// Sets the retry policy.
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
}

/// [`HotStore`](crate::store::HotStore) on CockroachDB or PostgreSQL.
pub struct PgStore {
    pool: Pool,
    retry: RetryPolicy,
    schema: Option<String>,
    /// Table definitions are immutable once registered, so they are cached forever.
    tables: RwLock<HashMap<TableId, TableDefinition>>,
    /// Why the pool's session check last refused a new connection: the pool reports a hook's
    /// failure as text, and this keeps it typed.
    refused: Arc<Mutex<Option<Refusal>>>,
}

/// The fields of a [`StoreError::UnsafeSession`], kept to rebuild it.
#[derive(Debug, Clone)]
struct Refusal {
    setting: &'static str,
    value: String,
    required: String,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// Why one attempt of an operation failed.
enum TxError {
    /// A domain outcome: returned as is, never retried.
    Store(StoreError),
    /// A database error before COMMIT (or in a read-only statement).
    Db(tokio_postgres::Error),
    /// A database error from COMMIT: the outcome may be unknown.
    Commit(tokio_postgres::Error),
    /// A state that a concurrent commit can explain: run the transaction again.
    Conflict(String),
    /// No connection could be obtained.
    Pool(String),
}

impl From<tokio_postgres::Error> for TxError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

type TxResult<T> = Result<T, TxError>;

impl PgStore {
    /// Connects to `url` with default settings (server's default schema).
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::connect_with(PgStoreConfig::new(url)).await
    }

    /// Connects with `schema` first on the search path, creating the schema if absent.
    pub async fn connect_with_schema(url: &str, schema: &str) -> StoreResult<Self> {
        Self::connect_with(PgStoreConfig::new(url).with_schema(schema)).await
    }

    /// Connects with explicit settings. Fails fast when the server is unreachable.
    pub async fn connect_with(config: PgStoreConfig) -> StoreResult<Self> {
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|e| StoreError::Config(format!("invalid PostgreSQL URL: {e}")))?;
        // A server or network that stops answering must not hang the caller forever.
        let create_timeout = timeouts::apply_socket(&mut pg);
        let target = target(&pg);
        if let Some(schema) = &config.schema {
            validate_schema_name(schema)?;
            create_schema(&pg, schema, &target).await?;
        }
        let mut options = pg.get_options().unwrap_or_default().to_string();
        if let Some(schema) = &config.schema {
            options.push_str(&format!(" -c search_path={schema}"));
        }
        // Single-statement reads must take part in serializable conflict detection too. Every
        // server knows this setting, so it may travel as a startup option; that it arrived is
        // checked on every new connection (`session::prepare`), as are the schema and the
        // settings only some servers know, which are set there.
        options.push_str(" -c default_transaction_isolation=serializable");
        // A statement or transaction its client abandoned must not run (and lock) forever.
        timeouts::apply_session(&mut options);
        pg.options(options.trim());
        let refused: Arc<Mutex<Option<Refusal>>> = Arc::default();
        let check = {
            let refused = refused.clone();
            let schema = config.schema.clone();
            let generic_plans = config.generic_plans;
            Hook::async_fn(move |client, _| {
                let refused = refused.clone();
                let schema = schema.clone();
                Box::pin(async move {
                    match session::prepare(client, schema.as_deref(), generic_plans).await {
                        Ok(_) => Ok(()),
                        Err(e) => {
                            if let Ok(mut slot) = refused.lock() {
                                *slot = match &e {
                                    StoreError::UnsafeSession {
                                        setting,
                                        value,
                                        required,
                                    } => Some(Refusal {
                                        setting,
                                        value: value.clone(),
                                        required: required.clone(),
                                    }),
                                    _ => None,
                                };
                            }
                            Err(HookError::message(e.to_string()))
                        }
                    }
                })
            })
        };
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(1))
            // The most recently used connection first: at low concurrency one or two
            // backends stay warm (their plan and catalog caches, their pages in the CPU
            // caches) instead of every call landing on the one idle the longest.
            .queue_mode(QueueMode::Lifo)
            // Connecting includes a startup handshake that the TCP connect timeout does not
            // cover; a peer that accepts and then stays silent must not block a caller.
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(create_timeout))
            .post_create(check)
            .build()
            .map_err(|e| StoreError::Config(format!("cannot build the connection pool: {e}")))?;
        let store = Self {
            pool,
            retry: config.retry,
            schema: config.schema,
            tables: RwLock::new(HashMap::new()),
            refused,
        };
        // Surface an unreachable server now rather than on the first operation, naming
        // where it was looked for (the URL may have come from an environment file).
        match store.pool.get().await {
            Ok(client) => drop(client),
            Err(PoolError::Backend(e)) => {
                return Err(StoreError::Backend {
                    operation: "connect",
                    detail: format!("cannot connect to {target}: {}", describe(&e)),
                })
            }
            Err(_) => drop(store.raw_client().await?),
        }
        Ok(store)
    }

    /// The schema this store was opened in, if one was given.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// A pooled connection, for tools and tests that need raw SQL next to the store (it has
    /// the store's search path and serializable default).
    pub async fn raw_client(&self) -> StoreResult<Object> {
        self.pooled().await.map_err(|e| match e {
            TxError::Store(e) => e,
            TxError::Pool(detail) => StoreError::Backend {
                operation: "raw_client",
                detail,
            },
            _ => StoreError::Backend {
                operation: "raw_client",
                detail: "unexpected error".into(),
            },
        })
    }

    /// Drops this store's schema with everything in it (test cleanup). Refuses without a
    /// schema, so it can never drop the default one.
    pub async fn drop_schema(&self) -> StoreResult<()> {
        let Some(schema) = &self.schema else {
            return Err(StoreError::Config(
                "drop_schema needs a store opened with a schema".into(),
            ));
        };
        let client = self.raw_client().await?;
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .map_err(|e| StoreError::Backend {
                operation: "drop_schema",
                detail: describe(&e),
            })
    }

    async fn pooled(&self) -> TxResult<Object> {
        self.pool.get().await.map_err(|e| {
            let refusal = match &e {
                PoolError::PostCreateHook(_) => self.refused.lock().ok().and_then(|r| r.clone()),
                _ => None,
            };
            match refusal {
                Some(r) => TxError::Store(StoreError::UnsafeSession {
                    setting: r.setting,
                    value: r.value,
                    required: r.required,
                }),
                None => TxError::Pool(error_chain(&e)),
            }
        })
    }

    /// Runs `attempt` until it succeeds, fails permanently or the retry budget is spent.
    async fn run<T, F, Fut>(&self, op: &'static str, attempt_fn: F) -> StoreResult<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = TxResult<T>>,
    {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let err = match attempt_fn().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let (disposition, detail) = match err {
                TxError::Store(e) => return Err(e),
                // A missing grant: no retry can help, and the operator must learn which.
                TxError::Db(e) | TxError::Commit(e) if denied(&e) => {
                    return Err(StoreError::PermissionDenied {
                        operation: op,
                        detail: describe(&e),
                    })
                }
                TxError::Pool(detail) => {
                    return Err(StoreError::Backend {
                        operation: op,
                        detail,
                    })
                }
                TxError::Db(e) => (
                    RetryPolicy::classify(e.code().map(|c| c.code()), connection_lost(&e), false),
                    describe(&e),
                ),
                TxError::Commit(e) => (
                    RetryPolicy::classify(e.code().map(|c| c.code()), connection_lost(&e), true),
                    describe(&e),
                ),
                TxError::Conflict(detail) => (Disposition::Retry, detail),
            };
            match disposition {
                Disposition::Retry if self.retry.may_retry(attempt) => {
                    tracing::debug!(operation = op, attempt, %detail, "retrying transaction");
                    tokio::time::sleep(self.retry.backoff(attempt)).await;
                }
                Disposition::Retry => {
                    return Err(StoreError::RetriesExhausted {
                        operation: op,
                        attempts: attempt,
                        detail,
                    })
                }
                Disposition::OutcomeUnknown => {
                    return Err(StoreError::OutcomeUnknown {
                        operation: op,
                        detail,
                    })
                }
                Disposition::Fail => {
                    return Err(StoreError::Backend {
                        operation: op,
                        detail,
                    })
                }
            }
        }
    }

    async fn definition(&self, table_id: &TableId) -> StoreResult<TableDefinition> {
        self.table(table_id)
            .await?
            .ok_or_else(|| StoreError::UnknownTable(table_id.clone()))
    }

    /// `bucket_start >= ..` implied by `bucket_end > from`: buckets lie on their table's grid,
    /// so none that ends after `from` starts before the bucket holding `from`. Stated
    /// explicitly, it bounds the index range from below (a listing of one day in a long
    /// history reads that day's entry, not every older one). Only from the cached
    /// definition (strategies never change); without it the filter is merely slower.
    fn grid_floor(&self, table_id: &TableId, from: EventTime) -> Option<EventTime> {
        let t = self.tables.read().ok()?;
        Some(t.get(table_id)?.strategy.bucket_of(from).start())
    }

    /// The end of the grid bucket holding `to`: no bucket of the table that starts at or
    /// before `to` ends after it (see [`Self::grid_floor`]). Stated explicitly, it bounds a
    /// range over an index on `bucket_end` from above; without the cached definition, the
    /// end of the supported time range (no bound).
    fn grid_ceiling(&self, table_id: &TableId, to: EventTime) -> EventTime {
        self.tables
            .read()
            .ok()
            .and_then(|t| Some(t.get(table_id)?.strategy.bucket_of(to).end()))
            .unwrap_or_else(EventTime::end_of_supported)
    }

    /// `bucket_end <= ..` implied by `bucket_start <= to`, by the same grid: no bucket that
    /// starts at or before `to` ends after the bucket holding `to` (see [`Self::grid_floor`]);
    /// only when `[from, to]` spans at most [`SHORT_LISTING_BUCKETS`] buckets of the grid.
    fn short_grid_ceiling(
        &self,
        table_id: &TableId,
        from: Option<EventTime>,
        to: EventTime,
    ) -> Option<EventTime> {
        let t = self.tables.read().ok()?;
        let strategy = t.get(table_id)?.strategy;
        let floor = strategy.bucket_of(from?).start();
        let ceiling = strategy.bucket_of(to).end();
        let mut key = strategy.bucket_of(floor);
        for _ in 0..SHORT_LISTING_BUCKETS {
            if key.end() >= ceiling {
                return Some(ceiling);
            }
            key = strategy.bucket_of(key.end());
        }
        None
    }

    fn cache(&self, def: &TableDefinition) {
        if let Ok(mut t) = self.tables.write() {
            t.insert(def.table_id.clone(), def.clone());
        }
    }
}

fn validate_schema_name(schema: &str) -> StoreResult<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Config(format!(
            "invalid schema name {schema:?}: use [a-z_][a-z0-9_]*, at most 63 characters"
        )))
    }
}

async fn create_schema(pg: &tokio_postgres::Config, schema: &str, target: &str) -> StoreResult<()> {
    let backend = |e: tokio_postgres::Error| StoreError::Backend {
        operation: "connect",
        detail: format!("cannot connect to {target}: {}", describe(&e)),
    };
    let (client, connection) = pg.connect(NoTls).await.map_err(backend)?;
    let task = tokio::spawn(connection);
    // The name was validated to be a plain identifier, so it can be spliced. Concurrent
    // first starts race to create it: the losers are retried like a migration's DDL
    // (23505/42P06 on PostgreSQL, 40001 on CockroachDB) and then find it present.
    let sql = format!("CREATE SCHEMA IF NOT EXISTS {schema}");
    let result = migrate::run_ddl(&client, &sql).await;
    drop(client);
    task.abort();
    result
}

/// Where a connection goes, for errors: every host with its port, the database and the
/// user (never the password).
fn target(pg: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = pg.get_ports();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(path) => format!("{} (port {port})", path.display()),
            }
        })
        .collect();
    let mut out = if hosts.is_empty() {
        "the default host".to_string()
    } else {
        hosts.join(", ")
    };
    let mut about = Vec::new();
    if let Some(db) = pg.get_dbname() {
        about.push(format!("database {db}"));
    }
    if let Some(user) = pg.get_user() {
        about.push(format!("user {user}"));
    }
    if !about.is_empty() {
        out.push_str(&format!(" ({})", about.join(", ")));
    }
    out
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => error_chain(e),
    }
}

/// An error with its causes: tokio-postgres and deadpool print "db error" or "error
/// connecting to server" and keep the server's reason (a missing database, a refused
/// connection) in `source()`, which a `to_string()` alone would drop.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = match c.downcast_ref::<tokio_postgres::error::DbError>() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => c.to_string(),
        };
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// SQLSTATE 42501: the role lacks a privilege (a read-only role writing, a missing grant).
fn denied(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
}

fn connection_lost(e: &tokio_postgres::Error) -> bool {
    use std::error::Error as _;
    e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>())
}
