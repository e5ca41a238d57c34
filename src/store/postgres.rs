//! The hot store on CockroachDB or PostgreSQL, over tokio-postgres with a deadpool pool.
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
//!
//! Sessions also use `plan_cache_mode=force_generic_plan` where the server knows it (chosen
//! per connection from its version, see [`session`]): the statements are written so that
//! their generic plans probe primary keys, and re-planning the array-based append on every
//! call cost more than the insert itself. Every new connection is checked before use: a
//! session whose default isolation is weaker than `SERIALIZABLE`, or whose schema is not the
//! configured one, is refused with [`StoreError::UnsafeSession`].

use std::collections::HashMap;
use std::future::Future;
use std::ops::Bound;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, PoolError, QueueMode, RecyclingMethod,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, NoTls, Row};

use super::retry::{Disposition, RetryPolicy};
use super::{
    bucket_for_append, migrate, AppendOutcome, Appends, Backlog, BatchOutcome, BucketFilter,
    BucketMeta, BucketState, Catalog, Claim, HeadPage, HotPage, Lifecycle, PageRequest,
    RoutedBucket, RoutedReads, StoreError, StoreResult, TableDefinition, WorkItem, WorkKind,
};
use crate::model::{
    BucketId, BucketKey, BucketStrategy, ClusteringKey, EnvelopeBuilder, EventTime, PartitionKey,
    Record, SortKey, TableId,
};
use datafusion::arrow::record_batch::RecordBatch;

pub mod session;

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

/// [`HotStore`] on CockroachDB or PostgreSQL.
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

const META: &str = "pulpitum_v4_bucket_metadata";
const RECORDS: &str = "pulpitum_v4_records";

const META_COLS: &str = "table_id, partition_key, bucket_key, bucket_strategy, bucket_start, \
     bucket_end, state, owner_token, generation, lease_expires_at, retry_at, object_key, \
     hot_deleted, published_at";

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
        let create_timeout = super::pg_timeouts::apply_socket(&mut pg);
        if let Some(schema) = &config.schema {
            validate_schema_name(schema)?;
            create_schema(&pg, schema).await?;
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
        super::pg_timeouts::apply_session(&mut options);
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
        // Surface an unreachable server now rather than on the first operation.
        drop(store.raw_client().await?);
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

    fn cache(&self, def: &TableDefinition) {
        if let Ok(mut t) = self.tables.write() {
            t.insert(def.table_id.clone(), def.clone());
        }
    }

    /// The shared append path: one record is a batch of one. The whole append is ONE
    /// statement, run as its own (serializable, by the session default) transaction: the
    /// fence check, the bucket creation and the insert cannot be separated, and a single
    /// round trip keeps it close to a plain INSERT.
    async fn append_records(
        &self,
        op: &'static str,
        table_id: &TableId,
        records: &[Record],
    ) -> StoreResult<BatchOutcome> {
        if records.is_empty() {
            return Ok(BatchOutcome::default());
        }
        let def = self.definition(table_id).await?;
        // The guard is an ingestion policy on the store's clock, not a safety check, so a
        // clock read just before the statement is as good as one inside it.
        let now = if def.writable_buckets.is_some() {
            self.now().await?
        } else {
            EventTime::min_supported()
        };
        let batch = prepare_batch(&def, records, now)?;
        let mut outcome = self
            .run(op, || async {
                let client = self.pooled().await?;
                append_statement(&client, &def, &batch).await
            })
            .await?;
        outcome.already_present += batch.duplicates_in_batch;
        Ok(outcome)
    }

    /// Re-reads a bucket inside the transaction of a refused conditional write and turns
    /// what it finds into the precise error.
    async fn refusal(
        tx: &deadpool_postgres::Transaction<'_>,
        claim: &Claim,
        op: &'static str,
        allowed: &[&str],
        min_age: Option<Duration>,
    ) -> TxError {
        let b = &claim.bucket;
        let sql = format!(
            "SELECT state, owner_token, generation, lease_expires_at, published_at, now() \
             FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3"
        );
        let key = b.bucket_key.to_string();
        let row = match tx
            .query_opt(
                &sql,
                &[&b.table_id.as_str(), &b.partition_key.as_bytes(), &key],
            )
            .await
        {
            Ok(r) => r,
            Err(e) => return TxError::Db(e),
        };
        let stale = |reason: String| {
            TxError::Store(StoreError::StaleClaim {
                bucket: b.clone(),
                generation: claim.generation,
                reason,
            })
        };
        let Some(row) = row else {
            return stale("the bucket has no metadata".into());
        };
        let parsed: Result<_, tokio_postgres::Error> = (|| {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, Option<String>>(1)?,
                row.try_get::<_, i64>(2)?,
                row.try_get::<_, Option<DateTime<Utc>>>(3)?,
                row.try_get::<_, Option<DateTime<Utc>>>(4)?,
                row.try_get::<_, DateTime<Utc>>(5)?,
            ))
        })();
        let (state, token, generation, lease, published, now) = match parsed {
            Ok(v) => v,
            Err(e) => return TxError::Store(corrupt("bucket metadata", e)),
        };
        if generation != claim.generation {
            return stale(format!("the bucket's generation is now {generation}"));
        }
        if !allowed.contains(&state.as_str()) {
            return TxError::Store(StoreError::InvalidTransition {
                bucket: b.clone(),
                operation: op,
                state,
            });
        }
        if token.as_deref() != Some(claim.token.as_str()) {
            return stale("another owner token holds the bucket".into());
        }
        match lease {
            Some(l) if l > now => {}
            Some(l) => return stale(format!("the lease expired at {l} (store time {now})")),
            None => return stale("the claim holds no lease".into()),
        }
        if let (Some(min_age), Some(published)) = (min_age, published) {
            let age = now - published;
            if age < chrono::Duration::from_std(min_age).unwrap_or(chrono::Duration::MAX) {
                return TxError::Store(StoreError::InvalidTransition {
                    bucket: b.clone(),
                    operation: "clean up before the minimum age since publication",
                    state: format!(
                        "archived {} ms ago, minimum {} ms",
                        age.num_milliseconds(),
                        min_age.as_millis()
                    ),
                });
            }
        }
        TxError::Conflict(format!("{op}: the bucket changed while it was checked"))
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

async fn create_schema(pg: &tokio_postgres::Config, schema: &str) -> StoreResult<()> {
    let backend = |e: tokio_postgres::Error| StoreError::Backend {
        operation: "connect",
        detail: describe(&e),
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

fn connection_lost(e: &tokio_postgres::Error) -> bool {
    use std::error::Error as _;
    e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>())
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn event_time(dt: DateTime<Utc>, what: &str) -> StoreResult<EventTime> {
    EventTime::from_datetime(dt).map_err(|e| corrupt(what, e))
}

fn state_name(s: &str) -> StoreResult<&'static str> {
    match s {
        "hot" => Ok("hot"),
        "archiving" => Ok("archiving"),
        "archived" => Ok("archived"),
        other => Err(StoreError::Corrupt(format!(
            "unknown bucket state {other:?}"
        ))),
    }
}

/// A batch validated, deduplicated and laid out as the column arrays the append statement
/// takes, borrowing the records' bytes.
struct PreparedBatch<'a> {
    buckets: Vec<(&'a PartitionKey, BucketKey)>,
    b_partition: Vec<&'a [u8]>,
    b_key: Vec<String>,
    b_start: Vec<DateTime<Utc>>,
    b_end: Vec<DateTime<Utc>>,
    r_partition: Vec<&'a [u8]>,
    r_bucket: Vec<String>,
    r_time: Vec<DateTime<Utc>>,
    r_sort: Vec<&'a [u8]>,
    r_value: Vec<&'a [u8]>,
    kept: Vec<&'a Record>,
    /// Identical copies of a record inside the batch itself (counted as already present).
    duplicates_in_batch: u64,
}

/// `(partition_key, event_time, sort_key)`: a record's identity within its table.
type PhysicalKey<'a> = (&'a [u8], EventTime, &'a [u8]);

fn prepare_batch<'a>(
    def: &TableDefinition,
    records: &'a [Record],
    now: EventTime,
) -> StoreResult<PreparedBatch<'a>> {
    let n = records.len();
    // Batches usually arrive in clustering order; then no key can repeat and the hash set
    // below is not needed (it costs more than the rest of the preparation).
    let ordered = records.windows(2).all(|w| {
        (
            w[0].partition_key.as_bytes(),
            w[0].event_time,
            w[0].sort_key.as_bytes(),
        ) < (
            w[1].partition_key.as_bytes(),
            w[1].event_time,
            w[1].sort_key.as_bytes(),
        )
    });
    let mut seen: HashMap<PhysicalKey<'a>, &'a [u8]> = HashMap::new();
    let mut b = PreparedBatch {
        buckets: Vec::new(),
        b_partition: Vec::new(),
        b_key: Vec::new(),
        b_start: Vec::new(),
        b_end: Vec::new(),
        r_partition: Vec::with_capacity(n),
        r_bucket: Vec::with_capacity(n),
        r_time: Vec::with_capacity(n),
        r_sort: Vec::with_capacity(n),
        r_value: Vec::with_capacity(n),
        kept: Vec::with_capacity(n),
        duplicates_in_batch: 0,
    };
    // The bucket of the previous record, with its bounds: consecutive records mostly share it.
    let mut last: Option<(&'a [u8], BucketKey, EventTime, EventTime, String)> = None;
    for r in records {
        if def.writable_buckets.is_some() {
            bucket_for_append(def, r, now)?;
        }
        if !ordered {
            let key = (
                r.partition_key.as_bytes(),
                r.event_time,
                r.sort_key.as_bytes(),
            );
            match seen.get(&key) {
                Some(v) if *v == r.value.as_slice() => {
                    b.duplicates_in_batch += 1;
                    continue;
                }
                // Two values for one key in the same batch: refused before any I/O.
                Some(_) => {
                    return Err(StoreError::DuplicateKey {
                        bucket: BucketId::of_record(&def.table_id, def.strategy, r),
                        event_time: r.event_time,
                        sort_key: hex::encode(r.sort_key.as_bytes()),
                    })
                }
                None => {
                    seen.insert(key, &r.value);
                }
            }
        }
        let pk = r.partition_key.as_bytes();
        let reuse = matches!(&last, Some((p, _, s, e, _)) if *p == pk && *s <= r.event_time && r.event_time < *e);
        if !reuse {
            let bucket_key = def.strategy.bucket_of(r.event_time);
            let (start, end) = bucket_key.bounds();
            let text = bucket_key.to_string();
            if !b
                .buckets
                .iter()
                .any(|(p, k)| p.as_bytes() == pk && *k == bucket_key)
            {
                b.buckets.push((&r.partition_key, bucket_key));
                b.b_partition.push(pk);
                b.b_key.push(text.clone());
                b.b_start.push(start.to_datetime());
                b.b_end.push(end.to_datetime());
            }
            last = Some((pk, bucket_key, start, end, text));
        }
        let text = last.as_ref().map(|l| l.4.clone()).unwrap_or_default();
        b.r_partition.push(pk);
        b.r_bucket.push(text);
        b.r_time.push(r.event_time.to_datetime());
        b.r_sort.push(r.sort_key.as_bytes());
        b.r_value.push(&r.value);
        b.kept.push(r);
    }
    Ok(b)
}

/// The whole append as one statement. `fenced` reads the existing metadata of the batch's
/// buckets (a bucket created by this statement is Hot by construction); `old` compares
/// the records with rows already stored. New bucket metadata and the records are written
/// only when no bucket is fenced and no key holds another value, so a refused batch writes
/// nothing at all. Records already present (identical) are skipped by the probe, so the
/// insert needs no ON CONFLICT (a plain insert is cheaper than a speculative one): a key
/// inserted concurrently after the statement's snapshot fails with 23505 (or 40001), and
/// the statement, which then committed nothing, runs again and finds it. The lookups are LATERAL ... LIMIT 1 so that even a plan cached while
/// the tables were empty probes the primary key per row instead of hashing a whole table.
const APPEND_SQL: &str = "WITH b AS ( \
       SELECT * FROM unnest($2::BYTEA[], $3::TEXT[], $4::TIMESTAMPTZ[], $5::TIMESTAMPTZ[]) \
         AS b(partition_key, bucket_key, bucket_start, bucket_end) \
     ), fenced AS ( \
       SELECT b.partition_key, b.bucket_key, x.state FROM b CROSS JOIN LATERAL ( \
         SELECT m.state FROM pulpitum_v4_bucket_metadata m WHERE m.table_id = $1 \
           AND m.partition_key = b.partition_key AND m.bucket_key = b.bucket_key LIMIT 1) x \
       WHERE x.state <> 'hot' ORDER BY b.partition_key, b.bucket_key LIMIT 1 \
     ), u AS ( \
       SELECT * FROM unnest($7::BYTEA[], $8::TEXT[], $9::TIMESTAMPTZ[], $10::BYTEA[], $11::BYTEA[]) \
         WITH ORDINALITY AS u(partition_key, bucket_key, event_time, sort_key, value, i) \
     ), old AS ( \
       SELECT u.i, x.value = u.value AS same FROM u CROSS JOIN LATERAL ( \
         SELECT r.value FROM pulpitum_v4_records r WHERE r.table_id = $1 \
           AND r.partition_key = u.partition_key AND r.bucket_key = u.bucket_key \
           AND r.event_time = u.event_time AND r.sort_key = u.sort_key LIMIT 1) x \
     ), ok AS ( \
       SELECT NOT EXISTS (SELECT 1 FROM fenced) AND NOT EXISTS (SELECT 1 FROM old WHERE NOT same) AS go \
     ), ins_meta AS ( \
       INSERT INTO pulpitum_v4_bucket_metadata \
         (table_id, partition_key, bucket_key, bucket_strategy, bucket_start, bucket_end, state) \
       SELECT $1, b.partition_key, b.bucket_key, $6, b.bucket_start, b.bucket_end, 'hot' FROM b \
       WHERE (SELECT go FROM ok) \
       ON CONFLICT (table_id, partition_key, bucket_key) DO NOTHING \
       RETURNING 1 \
     ), ins AS ( \
       INSERT INTO pulpitum_v4_records (table_id, partition_key, bucket_key, event_time, sort_key, value) \
       SELECT $1, u.partition_key, u.bucket_key, u.event_time, u.sort_key, u.value FROM u \
       WHERE (SELECT go FROM ok) AND NOT EXISTS (SELECT 1 FROM old WHERE old.i = u.i) \
       RETURNING 1 \
     ) \
     SELECT (SELECT count(*) FROM ins)::INT8, (SELECT count(*) FROM old WHERE same)::INT8, \
       (SELECT min(i) FROM old WHERE NOT same)::INT8, f.partition_key, f.bucket_key, f.state \
     FROM (SELECT 1) AS one LEFT JOIN fenced f ON true";

/// [`APPEND_SQL`] for one record, without arrays: the common single-row path.
const APPEND_ONE_SQL: &str = "WITH fenced AS ( \
       SELECT m.state FROM pulpitum_v4_bucket_metadata m \
       WHERE m.table_id = $1 AND m.partition_key = $2 AND m.bucket_key = $3 AND m.state <> 'hot' \
     ), old AS ( \
       SELECT r.value = $9 AS same FROM pulpitum_v4_records r \
       WHERE r.table_id = $1 AND r.partition_key = $2 AND r.bucket_key = $3 \
         AND r.event_time = $7 AND r.sort_key = $8 \
     ), ok AS ( \
       SELECT NOT EXISTS (SELECT 1 FROM fenced) AND NOT EXISTS (SELECT 1 FROM old) AS go \
     ), ins_meta AS ( \
       INSERT INTO pulpitum_v4_bucket_metadata \
         (table_id, partition_key, bucket_key, bucket_strategy, bucket_start, bucket_end, state) \
       SELECT $1, $2, $3, $4, $5, $6, 'hot' WHERE (SELECT go FROM ok) \
       ON CONFLICT (table_id, partition_key, bucket_key) DO NOTHING \
       RETURNING 1 \
     ), ins AS ( \
       INSERT INTO pulpitum_v4_records (table_id, partition_key, bucket_key, event_time, sort_key, value) \
       SELECT $1, $2, $3, $7, $8, $9 WHERE (SELECT go FROM ok) \
       RETURNING 1 \
     ) \
     SELECT (SELECT count(*) FROM ins)::INT8, (SELECT count(*) FROM old WHERE same)::INT8, \
       (SELECT count(*) FROM old WHERE NOT same)::INT8, (SELECT state FROM fenced LIMIT 1)";

/// Classifies an error of a self-committing append statement: a unique violation means a
/// concurrent append of the same key won (nothing of this statement committed, so running
/// it again is safe and then sees that row); anything else may hide a commit.
fn append_error(e: tokio_postgres::Error) -> TxError {
    if e.code().is_some_and(|c| c.code() == "23505") {
        TxError::Conflict(describe(&e))
    } else {
        TxError::Commit(e)
    }
}

async fn append_statement(
    client: &Object,
    def: &TableDefinition,
    b: &PreparedBatch<'_>,
) -> TxResult<BatchOutcome> {
    let stmt = client.prepare_cached(APPEND_SQL).await?;
    let strategy = def.strategy.as_str();
    // The statement commits by itself: an error while it runs may hide a commit.
    let row = client
        .query_one(
            &stmt,
            &[
                &def.table_id.as_str(),
                &b.b_partition,
                &b.b_key,
                &b.b_start,
                &b.b_end,
                &strategy,
                &b.r_partition,
                &b.r_bucket,
                &b.r_time,
                &b.r_sort,
                &b.r_value,
            ],
        )
        .await
        .map_err(append_error)?;
    let inserted: i64 = row.try_get(0)?;
    let present: i64 = row.try_get(1)?;
    let clash: Option<i64> = row.try_get(2)?;
    if let Some(state) = row.try_get::<_, Option<String>>(5)? {
        let pk: Vec<u8> = row.try_get(3)?;
        let key: String = row.try_get(4)?;
        let bucket = b
            .buckets
            .iter()
            .find(|(p, k)| p.as_bytes() == pk.as_slice() && k.to_string() == key)
            .map(|(p, k)| BucketId {
                table_id: def.table_id.clone(),
                partition_key: (*p).clone(),
                bucket_key: *k,
            })
            .ok_or_else(|| {
                StoreError::Corrupt(format!("fenced bucket {key} is not in the batch"))
            })?;
        return Err(TxError::Store(StoreError::Fenced {
            bucket,
            state: state_name(&state)?,
        }));
    }
    if let Some(i) = clash {
        let i = usize::try_from(i - 1).map_err(|_| StoreError::Corrupt("bad ordinality".into()))?;
        let r = b.kept[i];
        return Err(TxError::Store(StoreError::DuplicateKey {
            bucket: BucketId::of_record(&def.table_id, def.strategy, r),
            event_time: r.event_time,
            sort_key: hex::encode(r.sort_key.as_bytes()),
        }));
    }
    let total = b.r_time.len() as u64;
    let inserted = u64::try_from(inserted).unwrap_or(0);
    let present = u64::try_from(present).unwrap_or(0);
    if inserted + present != total {
        // A row skipped by ON CONFLICT that the statement's snapshot did not show: a
        // concurrent commit. Appends are idempotent, so running again is safe.
        return Err(TxError::Conflict(
            "a conflicting row committed concurrently".into(),
        ));
    }
    Ok(BatchOutcome {
        inserted,
        already_present: present,
    })
}

fn decode_table(row: &Row) -> StoreResult<TableDefinition> {
    let get = |e: tokio_postgres::Error| corrupt("table registry row", e);
    let id: String = row.try_get(0).map_err(get)?;
    let strategy: String = row.try_get(1).map_err(get)?;
    let writable: Option<i32> = row.try_get(2).map_err(get)?;
    let version: i32 = row.try_get(3).map_err(get)?;
    let surface: String = row.try_get(4).map_err(get)?;
    let writable_buckets = match writable {
        None => None,
        Some(n) => Some(u32::try_from(n).map_err(|_| corrupt("writable_buckets", n))?),
    };
    Ok(TableDefinition {
        table_id: TableId::new(id).map_err(|e| corrupt("table id", e))?,
        strategy: strategy
            .parse::<BucketStrategy>()
            .map_err(|e| corrupt("bucket strategy", e))?,
        writable_buckets,
        record_schema_version: version,
        surface,
    })
}

/// A `TIMESTAMPTZ` (or `TIMESTAMP`) read as microseconds since the Unix epoch, straight from
/// the binary wire format (an i64 of microseconds since 2000-01-01, on PostgreSQL and on
/// CockroachDB alike). The row decoders of the read paths use it instead of chrono's calendar
/// arithmetic, which took a measurable share of a hot page's client time; the range check is
/// [`EventTime::from_micros`]'s, as before.
struct PgMicros(i64);

/// 2000-01-01T00:00:00Z, PostgreSQL's timestamp epoch, in Unix microseconds.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl<'a> tokio_postgres::types::FromSql<'a> for PgMicros {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 8] = raw
            .try_into()
            .map_err(|_| format!("a timestamp of {} bytes, not 8", raw.len()))?;
        // Infinity is i64::MAX/MIN on the wire: out of range here, then refused by the
        // event time's range check.
        i64::from_be_bytes(bytes)
            .checked_add(PG_EPOCH_MICROS)
            .map(PgMicros)
            .ok_or_else(|| "an infinite timestamp".into())
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        use tokio_postgres::types::Type;
        *ty == Type::TIMESTAMPTZ || *ty == Type::TIMESTAMP
    }
}

fn micros_time(t: PgMicros, what: &str) -> StoreResult<EventTime> {
    EventTime::from_micros(t.0).map_err(|e| corrupt(what, e))
}

/// Column positions of [`META_COLS`]; every statement decoded by [`decode_meta`] selects
/// them first, in this order (read by position: a name lookup per column per row cost more
/// than the decoding).
mod meta_col {
    pub const TABLE_ID: usize = 0;
    pub const PARTITION_KEY: usize = 1;
    pub const BUCKET_KEY: usize = 2;
    pub const STRATEGY: usize = 3;
    pub const START: usize = 4;
    pub const END: usize = 5;
    pub const STATE: usize = 6;
    pub const OWNER: usize = 7;
    pub const GENERATION: usize = 8;
    pub const LEASE: usize = 9;
    pub const RETRY: usize = 10;
    pub const OBJECT_KEY: usize = 11;
    pub const HOT_DELETED: usize = 12;
    pub const PUBLISHED: usize = 13;
}

/// One bucket metadata row's fields, however the statement delivered them.
struct MetaParts<'a> {
    table_id: &'a str,
    partition_key: &'a [u8],
    key: &'a str,
    strategy: &'a str,
    start: PgMicros,
    end: PgMicros,
    state: &'a str,
    owner_token: Option<&'a str>,
    generation: i64,
    lease: Option<PgMicros>,
    retry: Option<PgMicros>,
    object_key: Option<&'a str>,
    hot_deleted: bool,
    published: Option<PgMicros>,
}

fn decode_meta(row: &Row) -> StoreResult<BucketMeta> {
    use meta_col as c;
    let get = |e: tokio_postgres::Error| corrupt("bucket metadata row", e);
    MetaParts {
        table_id: row.try_get(c::TABLE_ID).map_err(get)?,
        partition_key: row.try_get(c::PARTITION_KEY).map_err(get)?,
        key: row.try_get(c::BUCKET_KEY).map_err(get)?,
        strategy: row.try_get(c::STRATEGY).map_err(get)?,
        start: row.try_get(c::START).map_err(get)?,
        end: row.try_get(c::END).map_err(get)?,
        state: row.try_get(c::STATE).map_err(get)?,
        owner_token: row.try_get(c::OWNER).map_err(get)?,
        generation: row.try_get(c::GENERATION).map_err(get)?,
        lease: row.try_get(c::LEASE).map_err(get)?,
        retry: row.try_get(c::RETRY).map_err(get)?,
        object_key: row.try_get(c::OBJECT_KEY).map_err(get)?,
        hot_deleted: row.try_get(c::HOT_DELETED).map_err(get)?,
        published: row.try_get(c::PUBLISHED).map_err(get)?,
    }
    .decode()
}

/// The bucket of the head statement ([`HotStore::read_head`]) from its first row: key, state,
/// object key, cleanup flag and start (checked against the key); the table and partition are
/// the ones the statement filtered on.
fn decode_routed(
    row: &Row,
    table_id: &TableId,
    partition: &PartitionKey,
) -> StoreResult<RoutedBucket> {
    let get = |e: tokio_postgres::Error| corrupt("bucket metadata row", e);
    let key: &str = row.try_get(0).map_err(get)?;
    let bucket_key = BucketKey::parse_any(key).map_err(|e| corrupt("bucket key", e))?;
    let start: PgMicros = row.try_get(4).map_err(get)?;
    if bucket_key.start().as_micros() != start.0 {
        return Err(StoreError::Corrupt(format!(
            "bucket {key} is stored with a start ({} µs) that does not match its key",
            start.0
        )));
    }
    let id = BucketId {
        table_id: table_id.clone(),
        partition_key: partition.clone(),
        bucket_key,
    };
    let state = decode_state(
        &id,
        row.try_get(1).map_err(get)?,
        row.try_get(2).map_err(get)?,
        row.try_get(3).map_err(get)?,
    )?;
    Ok(RoutedBucket { id, state })
}

/// A bucket's state from its stored columns.
fn decode_state(
    id: &BucketId,
    state: &str,
    object_key: Option<&str>,
    hot_deleted: bool,
) -> StoreResult<BucketState> {
    Ok(match state {
        "hot" => BucketState::Hot,
        "archiving" => BucketState::Archiving,
        "archived" => BucketState::Archived {
            object_key: object_key
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("archived bucket {id} has no object key"))
                })?
                .to_string(),
            hot_deleted,
        },
        other => {
            return Err(StoreError::Corrupt(format!(
                "bucket {id} has unknown state {other:?}"
            )))
        }
    })
}

impl MetaParts<'_> {
    fn decode(self) -> StoreResult<BucketMeta> {
        let (start, end, key) = (self.start.0, self.end.0, self.key);
        let strategy: BucketStrategy = self
            .strategy
            .parse()
            .map_err(|e| corrupt("bucket strategy", e))?;
        let bucket_key = BucketKey::parse(strategy, key).map_err(|e| corrupt("bucket key", e))?;
        if (bucket_key.start().as_micros(), bucket_key.end().as_micros()) != (start, end) {
            let show = |t: i64| {
                EventTime::from_micros(t).map_or_else(|_| format!("{t} µs"), |t| t.to_string())
            };
            return Err(StoreError::Corrupt(format!(
                "bucket {key} is stored with bounds [{}, {}) that do not match its key",
                show(start),
                show(end)
            )));
        }
        let id = BucketId {
            table_id: TableId::new(self.table_id).map_err(|e| corrupt("table id", e))?,
            partition_key: PartitionKey::new(self.partition_key.to_vec())
                .map_err(|e| corrupt("partition key", e))?,
            bucket_key,
        };
        let state = decode_state(&id, self.state, self.object_key, self.hot_deleted)?;
        let opt_time =
            |t: Option<PgMicros>, what: &str| t.map(|t| micros_time(t, what)).transpose();
        Ok(BucketMeta {
            state,
            generation: self.generation,
            owner_token: self.owner_token.map(str::to_string),
            lease_expires_at: opt_time(self.lease, "lease_expires_at")?,
            retry_at: opt_time(self.retry, "retry_at")?,
            published_at: opt_time(self.published, "published_at")?,
            id,
        })
    }
}

/// A record row's fields, borrowed from the row.
struct Borrowed<'a> {
    time: EventTime,
    sort: &'a [u8],
    value: &'a [u8],
}

/// Decodes and validates `(event_time, sort_key, value)` at columns `at..at+3` without
/// copying; `None` for a row whose `event_time` is NULL (the NULL row of a LEFT JOIN that
/// matched nothing). `value` is empty unless `with_value`.
fn borrow_record(row: &Row, at: usize, with_value: bool) -> StoreResult<Option<Borrowed<'_>>> {
    let get = |e: tokio_postgres::Error| corrupt("record row", e);
    let Some(t) = row.try_get::<_, Option<PgMicros>>(at).map_err(get)? else {
        return Ok(None);
    };
    let sort: Option<&[u8]> = row.try_get(at + 1).map_err(get)?;
    let sort = sort.ok_or_else(|| StoreError::Corrupt("record without sort key".into()))?;
    SortKey::check(sort).map_err(|e| corrupt("sort key", e))?;
    let value: &[u8] = if with_value {
        let value: Option<&[u8]> = row.try_get(at + 2).map_err(get)?;
        value.ok_or_else(|| StoreError::Corrupt("record without value".into()))?
    } else {
        &[]
    };
    Ok(Some(Borrowed {
        time: micros_time(t, "event_time")?,
        sort,
        value,
    }))
}

/// Decodes `(event_time, sort_key, value)` at columns `at..at+3` into a record; `None` for
/// the NULL row of a LEFT JOIN that matched nothing.
fn decode_record(
    row: &Row,
    at: usize,
    partition_key: &PartitionKey,
    with_value: bool,
) -> StoreResult<Option<Record>> {
    let Some(r) = borrow_record(row, at, with_value)? else {
        return Ok(None);
    };
    Ok(Some(Record {
        partition_key: partition_key.clone(),
        event_time: r.time,
        sort_key: SortKey::new(r.sort.to_vec()).map_err(|e| corrupt("sort key", e))?,
        value: r.value.to_vec(),
    }))
}

/// Puts rows in clustering order (reversed when `descending`). The statement reads them in
/// index order, so this is a check in one pass; a statement is not promised to keep a
/// branch's order, so the fallback sorts.
fn in_page_order(rows: &mut [Borrowed<'_>], descending: bool) {
    fn key<'a>(r: &Borrowed<'a>) -> (EventTime, &'a [u8]) {
        (r.time, r.sort)
    }
    let ordered = if descending {
        rows.is_sorted_by(|a, b| key(a) >= key(b))
    } else {
        rows.is_sorted_by(|a, b| key(a) <= key(b))
    };
    if !ordered {
        rows.sort_by(|a, b| key(a).cmp(&key(b)));
        if descending {
            rows.reverse();
        }
    }
}

/// Decodes a page aggregated into arrays (`event_time`, `sort_key` and `value` at columns
/// `at..at+3`, all NULL when no row matched; `value` read only when the page includes it)
/// straight into one envelope batch in the page's order, borrowing the bytes from the row:
/// no record is built on the way. Arrays of different lengths, NULL elements, sort keys
/// that are not valid keys and times out of range are reported as corrupt.
fn decode_envelope(
    row: &Row,
    at: usize,
    partition: &PartitionKey,
    page: &PageRequest,
) -> StoreResult<RecordBatch> {
    let get = |e: tokio_postgres::Error| corrupt("record arrays", e);
    let times: Option<Vec<PgMicros>> = row.try_get(at).map_err(get)?;
    let sorts: Option<Vec<&[u8]>> = row.try_get(at + 1).map_err(get)?;
    let values: Option<Vec<&[u8]>> = if page.include_value {
        row.try_get(at + 2).map_err(get)?
    } else {
        None
    };
    let (times, sorts) = (times.unwrap_or_default(), sorts.unwrap_or_default());
    let lengths_agree = sorts.len() == times.len()
        && values
            .as_ref()
            .map_or(!page.include_value || times.is_empty(), |v| {
                v.len() == times.len()
            });
    if !lengths_agree {
        return Err(StoreError::Corrupt(format!(
            "record arrays of different lengths: {} times, {} sort keys, {} values",
            times.len(),
            sorts.len(),
            values.as_ref().map_or(0, Vec::len)
        )));
    }
    let mut out: Vec<Borrowed<'_>> = Vec::with_capacity(times.len());
    let mut bytes = 0;
    for (i, (time, sort)) in times.into_iter().zip(sorts).enumerate() {
        SortKey::check(sort).map_err(|e| corrupt("sort key", e))?;
        let value = values.as_ref().map_or(&[][..], |v| v[i]);
        bytes += value.len();
        out.push(Borrowed {
            time: micros_time(time, "event_time")?,
            sort,
            value,
        });
    }
    in_page_order(&mut out, page.descending);
    let mut batch = EnvelopeBuilder::with_capacity(out.len(), bytes, page.include_value);
    for r in &out {
        batch.push(partition.as_bytes(), r.time, r.sort, r.value);
    }
    Ok(batch.finish())
}

type Params = Vec<Box<dyn ToSql + Sync + Send>>;

fn param_refs(p: &Params) -> Vec<&(dyn ToSql + Sync)> {
    p.iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

fn push(params: &mut Params, v: impl ToSql + Sync + Send + 'static) -> String {
    params.push(Box::new(v));
    format!("${}", params.len())
}

/// Appends the bounds' predicates on alias `r` (each `AND ...`).
fn bounds_sql(b: &crate::model::ScanBounds, params: &mut Params, sql: &mut String) {
    let time =
        |bound: &Bound<EventTime>, inc: &str, exc: &str, params: &mut Params, sql: &mut String| {
            match bound {
                Bound::Included(t) => sql.push_str(&format!(
                    " AND r.event_time {inc} {}",
                    push(params, t.to_datetime())
                )),
                Bound::Excluded(t) => sql.push_str(&format!(
                    " AND r.event_time {exc} {}",
                    push(params, t.to_datetime())
                )),
                Bound::Unbounded => {}
            }
        };
    time(&b.time_lower, ">=", ">", params, sql);
    time(&b.time_upper, "<=", "<", params, sql);
    let sort =
        |bound: &Bound<SortKey>, inc: &str, exc: &str, params: &mut Params, sql: &mut String| {
            match bound {
                Bound::Included(k) => sql.push_str(&format!(
                    " AND r.sort_key {inc} {}",
                    push(params, k.as_bytes().to_vec())
                )),
                Bound::Excluded(k) => sql.push_str(&format!(
                    " AND r.sort_key {exc} {}",
                    push(params, k.as_bytes().to_vec())
                )),
                Bound::Unbounded => {}
            }
        };
    sort(&b.sort_lower, ">=", ">", params, sql);
    sort(&b.sort_upper, "<=", "<", params, sql);
    let cursor = |c: &Option<ClusteringKey>, op: &str, params: &mut Params, sql: &mut String| {
        if let Some(c) = c {
            let t = push(params, c.event_time.to_datetime());
            let k = push(params, c.sort_key.as_bytes().to_vec());
            sql.push_str(&format!(" AND (r.event_time, r.sort_key) {op} ({t}, {k})"));
        }
    };
    cursor(&b.after, ">", params, sql);
    cursor(&b.before, "<", params, sql);
}

/// The head statement's time bounds and cursors restated on the records' key tuple
/// (`bucket_key, event_time[, sort_key]`), each an `AND ...` on alias `r`. For stored rows,
/// whose bucket key is the key of their time, each is equivalent to the plain predicate of
/// [`bounds_sql`] (kept beside it), but unlike it bounds the primary-key range that the head
/// statement reads across buckets, so the read starts at the bound instead of filtering its
/// way there.
fn head_index_bounds(
    b: &crate::model::ScanBounds,
    key_of: &dyn Fn(EventTime) -> String,
    params: &mut Params,
    sql: &mut String,
) {
    let mut time = |bound: &Bound<EventTime>, inc: &str, exc: &str| {
        let (op, t) = match bound {
            Bound::Included(t) => (inc, t),
            Bound::Excluded(t) => (exc, t),
            Bound::Unbounded => return,
        };
        let k = push(params, key_of(*t));
        let at = push(params, t.to_datetime());
        sql.push_str(&format!(
            " AND (r.bucket_key, r.event_time) {op} ({k}, {at})"
        ));
    };
    time(&b.time_lower, ">=", ">");
    time(&b.time_upper, "<=", "<");
    let mut cursor = |c: &Option<ClusteringKey>, op: &str| {
        if let Some(c) = c {
            let k = push(params, key_of(c.event_time));
            let at = push(params, c.event_time.to_datetime());
            let s = push(params, c.sort_key.as_bytes().to_vec());
            sql.push_str(&format!(
                " AND (r.bucket_key, r.event_time, r.sort_key) {op} ({k}, {at}, {s})"
            ));
        }
    };
    cursor(&b.after, ">");
    cursor(&b.before, "<");
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit.max(1)).unwrap_or(i64::MAX)
}

#[async_trait]
impl Catalog for PgStore {
    async fn migrate(&self) -> StoreResult<()> {
        let client = self.raw_client().await?;
        migrate::migrate(&client).await.map(|_| ())
    }

    async fn register_table(&self, def: &TableDefinition) -> StoreResult<TableDefinition> {
        let writable: Option<i32> = match def.writable_buckets {
            None => None,
            Some(n) => Some(i32::try_from(n).map_err(|_| {
                StoreError::Config(format!(
                    "writable_buckets {n} is larger than the store allows"
                ))
            })?),
        };
        let stored = self
            .run("register_table", || async {
                let mut client = self.pooled().await?;
                let tx = client
                    .build_transaction()
                    .isolation_level(IsolationLevel::Serializable)
                    .start()
                    .await?;
                tx.execute(
                    "INSERT INTO pulpitum_v4_tables \
                     (table_id, bucket_strategy, writable_buckets, record_schema_version, surface) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (table_id) DO NOTHING",
                    &[
                        &def.table_id.as_str(),
                        &def.strategy.as_str(),
                        &writable,
                        &def.record_schema_version,
                        &def.surface,
                    ],
                )
                .await?;
                let row = tx
                    .query_one(
                        "SELECT table_id, bucket_strategy, writable_buckets, record_schema_version, surface \
                         FROM pulpitum_v4_tables WHERE table_id = $1",
                        &[&def.table_id.as_str()],
                    )
                    .await?;
                let stored = decode_table(&row)?;
                tx.commit().await.map_err(TxError::Commit)?;
                Ok(stored)
            })
            .await?;
        self.cache(&stored);
        if &stored != def {
            let summary = |d: &TableDefinition| {
                format!(
                    "(strategy {}, writable_buckets {:?}, record schema {}, surface {})",
                    d.strategy, d.writable_buckets, d.record_schema_version, d.surface
                )
            };
            return Err(StoreError::TableConflict {
                table_id: def.table_id.clone(),
                existing: summary(&stored),
                requested: summary(def),
            });
        }
        Ok(stored)
    }

    async fn table(&self, table_id: &TableId) -> StoreResult<Option<TableDefinition>> {
        if let Some(def) = self
            .tables
            .read()
            .ok()
            .and_then(|t| t.get(table_id).cloned())
        {
            return Ok(Some(def));
        }
        let def = self
            .run("table", || async {
                let client = self.pooled().await?;
                let row = client
                    .query_opt(
                        "SELECT table_id, bucket_strategy, writable_buckets, record_schema_version, surface \
                         FROM pulpitum_v4_tables WHERE table_id = $1",
                        &[&table_id.as_str()],
                    )
                    .await?;
                Ok(row.map(|r| decode_table(&r)).transpose()?)
            })
            .await?;
        if let Some(d) = &def {
            self.cache(d);
        }
        Ok(def)
    }

    async fn tables(&self) -> StoreResult<Vec<TableDefinition>> {
        self.run("tables", || async {
            let client = self.pooled().await?;
            let rows = client
                .query(
                    "SELECT table_id, bucket_strategy, writable_buckets, record_schema_version, surface \
                     FROM pulpitum_v4_tables ORDER BY table_id",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(decode_table).collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn now(&self) -> StoreResult<EventTime> {
        self.run("now", || async {
            let client = self.pooled().await?;
            let row = client.query_one("SELECT now()", &[]).await?;
            let now: DateTime<Utc> = row.try_get(0)?;
            Ok(event_time(now, "store clock")?)
        })
        .await
    }
}

#[async_trait]
impl Appends for PgStore {
    async fn append(&self, table_id: &TableId, record: &Record) -> StoreResult<AppendOutcome> {
        let def = self.definition(table_id).await?;
        let now = if def.writable_buckets.is_some() {
            self.now().await?
        } else {
            EventTime::min_supported()
        };
        let bucket = bucket_for_append(&def, record, now)?;
        let key = bucket.bucket_key.to_string();
        let (start, end) = bucket.bucket_key.bounds();
        let (start, end) = (start.to_datetime(), end.to_datetime());
        let time = record.event_time.to_datetime();
        let strategy = def.strategy.as_str();
        let (inserted, present, clash, state) = self
            .run("append", || async {
                let client = self.pooled().await?;
                let stmt = client.prepare_cached(APPEND_ONE_SQL).await?;
                let row = client
                    .query_one(
                        &stmt,
                        &[
                            &table_id.as_str(),
                            &record.partition_key.as_bytes(),
                            &key,
                            &strategy,
                            &start,
                            &end,
                            &time,
                            &record.sort_key.as_bytes(),
                            &record.value,
                        ],
                    )
                    .await
                    .map_err(append_error)?;
                let inserted: i64 = row.try_get(0)?;
                let present: i64 = row.try_get(1)?;
                let clash: i64 = row.try_get(2)?;
                let state: Option<String> = row.try_get(3)?;
                if inserted + present + clash == 0 && state.is_none() {
                    return Err(TxError::Conflict(
                        "a conflicting row committed concurrently".into(),
                    ));
                }
                Ok((inserted, present, clash, state))
            })
            .await?;
        if let Some(state) = state {
            return Err(StoreError::Fenced {
                bucket,
                state: state_name(&state)?,
            });
        }
        if clash > 0 {
            return Err(StoreError::DuplicateKey {
                bucket,
                event_time: record.event_time,
                sort_key: hex::encode(record.sort_key.as_bytes()),
            });
        }
        Ok(if inserted == 1 {
            AppendOutcome::Inserted
        } else if present == 1 {
            AppendOutcome::AlreadyPresent
        } else {
            return Err(StoreError::Corrupt(format!(
                "append into {bucket} reported {inserted} inserted and {present} present rows"
            )));
        })
    }

    async fn append_batch(
        &self,
        table_id: &TableId,
        records: &[Record],
    ) -> StoreResult<BatchOutcome> {
        self.append_records("append_batch", table_id, records).await
    }
}

#[async_trait]
impl RoutedReads for PgStore {
    async fn list_buckets(
        &self,
        table_id: &TableId,
        filter: &BucketFilter,
    ) -> StoreResult<Vec<BucketMeta>> {
        let mut params: Params = Vec::new();
        let mut sql = format!(
            "SELECT {META_COLS} FROM {META} WHERE table_id = {}",
            push(&mut params, table_id.as_str().to_string())
        );
        if let Some(parts) = &filter.partitions {
            let keys: Vec<Vec<u8>> = parts.iter().map(|p| p.as_bytes().to_vec()).collect();
            sql.push_str(&format!(
                " AND partition_key = ANY({}::BYTEA[])",
                push(&mut params, keys)
            ));
        }
        if let Some(from) = filter.from {
            sql.push_str(&format!(
                " AND bucket_end > {}",
                push(&mut params, from.to_datetime())
            ));
            if let Some(floor) = self.grid_floor(table_id, from) {
                sql.push_str(&format!(
                    " AND bucket_start >= {}",
                    push(&mut params, floor.to_datetime())
                ));
            }
        }
        if let Some(to) = filter.to {
            sql.push_str(&format!(
                " AND bucket_start <= {}",
                push(&mut params, to.to_datetime())
            ));
        }
        sql.push_str(if filter.descending {
            " ORDER BY partition_key, bucket_start DESC"
        } else {
            " ORDER BY partition_key, bucket_start"
        });
        if let Some(limit) = filter.limit {
            // Not `limit_param`: a limit of zero lists nothing, as in the embedded store.
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            sql.push_str(&format!(" LIMIT {}", push(&mut params, limit)));
        }
        self.run("list_buckets", || async {
            let client = self.pooled().await?;
            // A handful of statement texts (with or without each bound): cached per
            // connection, so a listing costs one round trip instead of prepare + execute.
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &param_refs(&params)).await?;
            Ok(rows
                .iter()
                .map(decode_meta)
                .collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn bucket(&self, bucket: &BucketId) -> StoreResult<Option<BucketMeta>> {
        let key = bucket.bucket_key.to_string();
        let sql = format!(
            "SELECT {META_COLS} FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3"
        );
        self.run("bucket", || async {
            let client = self.pooled().await?;
            let row = client
                .query_opt(
                    &sql,
                    &[
                        &bucket.table_id.as_str(),
                        &bucket.partition_key.as_bytes(),
                        &key,
                    ],
                )
                .await?;
            Ok(row.map(|r| decode_meta(&r)).transpose()?)
        })
        .await
    }

    async fn read_page(&self, bucket: &BucketId, req: &PageRequest) -> StoreResult<HotPage> {
        let mut params: Params = Vec::new();
        let t = push(&mut params, bucket.table_id.as_str().to_string());
        let p = push(&mut params, bucket.partition_key.as_bytes().to_vec());
        let k = push(&mut params, bucket.bucket_key.to_string());
        let mut preds = String::new();
        bounds_sql(&req.bounds, &mut params, &mut preds);
        let n = push(&mut params, limit_param(req.limit));
        let dir = if req.descending { "DESC" } else { "ASC" };
        let value = if req.include_value {
            "r.value"
        } else {
            "NULL::BYTEA"
        };
        // The route and the rows come from this one statement (one snapshot), as two
        // uncorrelated parts: the rows subquery names the bucket by parameters, so it is an
        // index range read in order that stops at the limit on any optimiser (a limit under
        // a correlation is what CockroachDB decorrelates into a full scan, see
        // docs/schema.md). An archived bucket's rows are dropped by the join condition.
        let sql = format!(
            "SELECT m.state, m.object_key, x.event_time, x.sort_key, x.value \
             FROM {META} m LEFT JOIN ( \
               SELECT r.event_time, r.sort_key, {value} AS value FROM {RECORDS} r \
               WHERE r.table_id = {t} AND r.partition_key = {p} AND r.bucket_key = {k}{preds} \
               ORDER BY r.event_time {dir}, r.sort_key {dir} LIMIT {n} \
             ) x ON m.state <> 'archived' \
             WHERE m.table_id = {t} AND m.partition_key = {p} AND m.bucket_key = {k} \
             ORDER BY x.event_time {dir}, x.sort_key {dir}"
        );
        self.run("read_page", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &param_refs(&params)).await?;
            let Some(first) = rows.first() else {
                return Ok(HotPage::Missing);
            };
            let state: String = first.try_get(0)?;
            match state.as_str() {
                "archived" => {
                    let object_key: Option<String> = first.try_get(1)?;
                    let object_key = object_key.ok_or_else(|| {
                        StoreError::Corrupt(format!("archived bucket {bucket} has no object key"))
                    })?;
                    Ok(HotPage::Archived { object_key })
                }
                "hot" | "archiving" => {
                    let state = if state == "hot" {
                        BucketState::Hot
                    } else {
                        BucketState::Archiving
                    };
                    let mut out = Vec::with_capacity(rows.len());
                    for row in &rows {
                        if let Some(r) =
                            decode_record(row, 2, &bucket.partition_key, req.include_value)?
                        {
                            out.push(r);
                        }
                    }
                    Ok(HotPage::hot(state, &out, req.include_value))
                }
                other => Err(StoreError::Corrupt(format!(
                    "bucket {bucket} has unknown state {other:?}"
                ))
                .into()),
            }
        })
        .await
    }

    async fn read_head(
        &self,
        table_id: &TableId,
        partition: &PartitionKey,
        from: Option<EventTime>,
        to: Option<EventTime>,
        page: &PageRequest,
    ) -> StoreResult<HeadPage> {
        // The strategy gives the bucket key of any instant (cached: no round trip). A table
        // that is not registered has no buckets, as a listing would find.
        let Some(def) = self.table(table_id).await? else {
            return Ok(HeadPage {
                bucket: None,
                first: HotPage::Missing,
            });
        };
        let strategy = def.strategy;
        let key_of = |t: EventTime| strategy.bucket_of(t).to_string();
        let mut params: Params = Vec::new();
        let t = push(&mut params, table_id.as_str().to_string());
        let p = push(&mut params, partition.as_bytes().to_vec());
        let mut range = String::new();
        // Bounds on the records' bucket keys, by parameters only (see below).
        let mut keys = String::new();
        if let Some(from) = from {
            range.push_str(&format!(
                " AND bucket_end > {}",
                push(&mut params, from.to_datetime())
            ));
            // Implied by `bucket_end > from` (buckets lie on the table's grid), stated to
            // bound the by-start index range from below.
            range.push_str(&format!(
                " AND bucket_start >= {}",
                push(&mut params, strategy.bucket_of(from).start().to_datetime())
            ));
            keys.push_str(&format!(
                " AND r.bucket_key >= {}",
                push(&mut params, key_of(from))
            ));
        }
        if let Some(to) = to {
            range.push_str(&format!(
                " AND bucket_start <= {}",
                push(&mut params, to.to_datetime())
            ));
            keys.push_str(&format!(
                " AND r.bucket_key <= {}",
                push(&mut params, key_of(to))
            ));
        }
        head_index_bounds(&page.bounds, &key_of, &mut params, &mut keys);
        let mut preds = String::new();
        bounds_sql(&page.bounds, &mut params, &mut preds);
        let n = push(&mut params, limit_param(page.limit));
        let dir = if page.descending { "DESC" } else { "ASC" };
        // The values are aggregated only when the page includes them.
        let (value, values) = if page.include_value {
            (", r.value", "array_agg(g.value)")
        } else {
            ("", "NULL::BYTEA[]")
        };
        // One statement, so one snapshot, and one row: the first bucket in scan order (`f`,
        // one probe of the by-start index), its route, and, when it is not archived, up to
        // `n` of its rows aggregated into three arrays, which are NULL when no row matched.
        // Only what a scan needs of the bucket is read, and its start, which must match its
        // key (a stored row that disagrees is corrupt).
        //
        // The bucket is not known before the statement runs, and a rows subquery that named
        // it through `f` would be a limit under a correlation, which CockroachDB decorrelates
        // into a scan of every row of the partition (docs/schema.md). So the rows (`g`) are
        // read without reference to `f`: the partition's rows in key order, which is bucket
        // order then clustering order (bucket keys of one strategy sort as their starts),
        // from the edge of the interval on, cut at `n`. The first bucket in scan order
        // that has rows is `f` itself (any bucket between the edge and `f` would overlap the
        // interval and so be `f`), so its rows come first; rows of the buckets after it, if
        // `f` has fewer than `n`, are dropped by the filter on `f`'s key (an uncorrelated
        // scalar subquery, NULL when `f` is archived; measured cheaper on PostgreSQL than
        // joining the two parts, which sorted `f`). The key-tuple bounds restate the
        // page's time bounds and cursors so that the index range starts at them.
        //
        // Why one row of arrays: every column of every row costs, on the server, on the wire
        // and in decoding, whether it holds a value or NULL. The same rows as rows, each
        // carrying the route, measured 1.30x-1.37x of the direct query in a binary-protocol
        // harness; as arrays, 1.23x-1.30x; the rows with no route at all, 1.19x-1.24x. The
        // arrays come from one aggregate, so their elements line up row by row; their order
        // is checked (and restored) when decoded, since SQL does not promise an aggregate
        // keeps its input's order.
        let sql = format!(
            "WITH f AS ( \
               SELECT bucket_key, state, object_key, hot_deleted, bucket_start FROM {META} \
               WHERE table_id = {t} AND partition_key = {p}{range} \
               ORDER BY bucket_start {dir} LIMIT 1 \
             ) \
             SELECT f.bucket_key, f.state, f.object_key, f.hot_deleted, f.bucket_start, \
               x.t, x.s, x.v \
             FROM f CROSS JOIN ( \
               SELECT array_agg(g.event_time) AS t, array_agg(g.sort_key) AS s, {values} AS v \
               FROM (SELECT r.bucket_key, r.event_time, r.sort_key{value} FROM {RECORDS} r \
                 WHERE r.table_id = {t} AND r.partition_key = {p}{keys}{preds} \
                 ORDER BY r.bucket_key {dir}, r.event_time {dir}, r.sort_key {dir} LIMIT {n}) g \
               WHERE g.bucket_key = (SELECT bucket_key FROM f WHERE state <> 'archived') \
             ) x"
        );
        self.run("read_head", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &param_refs(&params)).await?;
            let head = match rows.as_slice() {
                [] => {
                    return Ok(HeadPage {
                        bucket: None,
                        first: HotPage::Missing,
                    })
                }
                [head] => head,
                more => {
                    return Err(StoreError::Corrupt(format!(
                        "the head read returned {} rows, not one",
                        more.len()
                    ))
                    .into())
                }
            };
            let bucket = decode_routed(head, table_id, partition)?;
            let first = match &bucket.state {
                BucketState::Archived { object_key, .. } => HotPage::Archived {
                    object_key: object_key.clone(),
                },
                state => HotPage::Hot {
                    state: state.clone(),
                    rows: decode_envelope(head, 5, partition, page)?,
                },
            };
            Ok(HeadPage {
                bucket: Some(bucket),
                first,
            })
        })
        .await
    }
}

#[async_trait]
impl Lifecycle for PgStore {
    async fn claim(&self, bucket: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        let key = bucket.bucket_key.to_string();
        let lease = micros(lease);
        let sql = format!(
            "UPDATE {META} SET state = 'archiving', owner_token = $4, generation = generation + 1, \
               lease_expires_at = now() + $5::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND ((state = 'hot' AND (retry_at IS NULL OR retry_at <= now())) \
                 OR (state = 'archiving' AND (lease_expires_at IS NULL OR lease_expires_at <= now()))) \
             RETURNING generation, lease_expires_at"
        );
        self.claim_with(bucket, "claim", &sql, &key, lease).await
    }

    async fn claim_cleanup(
        &self,
        bucket: &BucketId,
        lease: Duration,
    ) -> StoreResult<Option<Claim>> {
        let key = bucket.bucket_key.to_string();
        let lease = micros(lease);
        let sql = format!(
            "UPDATE {META} SET owner_token = $4, generation = generation + 1, \
               lease_expires_at = now() + $5::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND state = 'archived' AND NOT hot_deleted \
               AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
             RETURNING generation, lease_expires_at"
        );
        self.claim_with(bucket, "claim_cleanup", &sql, &key, lease)
            .await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> StoreResult<Claim> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        let lease = micros(lease);
        let sql = format!(
            "UPDATE {META} SET lease_expires_at = now() + $6::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND owner_token = $4 AND generation = $5 AND lease_expires_at > now() \
               AND state IN ('archiving', 'archived') \
             RETURNING lease_expires_at"
        );
        self.run("renew", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let row = tx
                .query_opt(
                    &sql,
                    &[
                        &b.table_id.as_str(),
                        &b.partition_key.as_bytes(),
                        &key,
                        &claim.token,
                        &claim.generation,
                        &lease,
                    ],
                )
                .await?;
            let Some(row) = row else {
                return Err(
                    Self::refusal(&tx, claim, "renew", &["archiving", "archived"], None).await,
                );
            };
            let expires: DateTime<Utc> = row.try_get(0)?;
            let expires_at = event_time(expires, "lease_expires_at")?;
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(Claim {
                expires_at,
                ..claim.clone()
            })
        })
        .await
    }

    async fn snapshot_page(
        &self,
        claim: &Claim,
        after: Option<&ClusteringKey>,
        limit: usize,
    ) -> StoreResult<Vec<Record>> {
        let b = &claim.bucket;
        let mut params: Params = Vec::new();
        let t = push(&mut params, b.table_id.as_str().to_string());
        let p = push(&mut params, b.partition_key.as_bytes().to_vec());
        let k = push(&mut params, b.bucket_key.to_string());
        let tok = push(&mut params, claim.token.clone());
        let g = push(&mut params, claim.generation);
        let mut preds = String::new();
        if let Some(c) = after {
            let at = push(&mut params, c.event_time.to_datetime());
            let ak = push(&mut params, c.sort_key.as_bytes().to_vec());
            preds = format!(" AND (r.event_time, r.sort_key) > ({at}, {ak})");
        }
        let n = push(&mut params, limit_param(limit));
        // Claim check and rows in one statement, the rows subquery bounded by parameters only
        // (no correlated limit; see `read_page`).
        let sql = format!(
            "SELECT x.event_time, x.sort_key, x.value \
             FROM {META} m LEFT JOIN ( \
               SELECT r.event_time, r.sort_key, r.value FROM {RECORDS} r \
               WHERE r.table_id = {t} AND r.partition_key = {p} AND r.bucket_key = {k}{preds} \
               ORDER BY r.event_time, r.sort_key LIMIT {n} \
             ) x ON true \
             WHERE m.table_id = {t} AND m.partition_key = {p} AND m.bucket_key = {k} \
               AND m.owner_token = {tok} AND m.generation = {g} AND m.state = 'archiving' \
               AND m.lease_expires_at > now() \
             ORDER BY x.event_time, x.sort_key"
        );
        self.run("snapshot_page", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let stmt = tx.prepare_cached(&sql).await?;
            let rows = tx.query(&stmt, &param_refs(&params)).await?;
            if rows.is_empty() {
                return Err(Self::refusal(&tx, claim, "snapshot", &["archiving"], None).await);
            }
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                if let Some(r) = decode_record(row, 0, &b.partition_key, true)? {
                    out.push(r);
                }
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(out)
        })
        .await
    }

    async fn defer_archive(&self, claim: &Claim, retry_after: Duration) -> StoreResult<()> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        let retry = micros(retry_after);
        let sql = format!(
            "UPDATE {META} SET state = 'hot', owner_token = NULL, lease_expires_at = NULL, \
               retry_at = now() + $6::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND owner_token = $4 AND generation = $5 AND state = 'archiving' AND lease_expires_at > now()"
        );
        self.conditional_write(
            claim,
            "defer archiving",
            &["archiving"],
            None,
            &sql,
            &[
                &b.table_id.as_str(),
                &b.partition_key.as_bytes(),
                &key,
                &claim.token,
                &claim.generation,
                &retry,
            ],
        )
        .await
    }

    async fn publish_archive(&self, claim: &Claim, object_key: &str) -> StoreResult<()> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        // The owner token and lease are released so that cleanup can be claimed at once.
        let sql = format!(
            "UPDATE {META} SET state = 'archived', object_key = $6, hot_deleted = false, \
               published_at = now(), owner_token = NULL, lease_expires_at = NULL, updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND owner_token = $4 AND generation = $5 AND state = 'archiving' AND lease_expires_at > now()"
        );
        self.conditional_write(
            claim,
            "publish",
            &["archiving"],
            None,
            &sql,
            &[
                &b.table_id.as_str(),
                &b.partition_key.as_bytes(),
                &key,
                &claim.token,
                &claim.generation,
                &object_key,
            ],
        )
        .await
    }

    async fn cleanup_step(
        &self,
        claim: &Claim,
        limit: usize,
        min_age: Duration,
    ) -> StoreResult<(u64, bool)> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        let age = micros(min_age);
        let n = limit_param(limit);
        let delete_sql = format!(
            "WITH m AS ( \
               SELECT 1 FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
                 AND state = 'archived' AND owner_token = $4 AND generation = $5 \
                 AND lease_expires_at > now() \
                 AND published_at + $6::INT8 * INTERVAL '1 microsecond' <= now() \
             ), d AS ( \
               DELETE FROM {RECORDS} WHERE (table_id, partition_key, bucket_key, event_time, sort_key) IN ( \
                 SELECT table_id, partition_key, bucket_key, event_time, sort_key FROM {RECORDS} \
                 WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 AND EXISTS (SELECT 1 FROM m) \
                 ORDER BY event_time, sort_key LIMIT $7) \
               RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM m)::INT8, (SELECT count(*) FROM d)::INT8"
        );
        let remaining_sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {RECORDS} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3)"
        );
        let done_sql = format!(
            "UPDATE {META} SET hot_deleted = true, updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND state = 'archived' AND owner_token = $4 AND generation = $5 AND lease_expires_at > now()"
        );
        self.run("cleanup", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let ids: [&(dyn ToSql + Sync); 3] =
                [&b.table_id.as_str(), &b.partition_key.as_bytes(), &key];
            let row = tx
                .query_one(
                    &delete_sql,
                    &[
                        ids[0],
                        ids[1],
                        ids[2],
                        &claim.token,
                        &claim.generation,
                        &age,
                        &n,
                    ],
                )
                .await?;
            let held: i64 = row.try_get(0)?;
            let deleted: i64 = row.try_get(1)?;
            if held == 0 {
                return Err(
                    Self::refusal(&tx, claim, "clean up", &["archived"], Some(min_age)).await,
                );
            }
            let deleted = u64::try_from(deleted).unwrap_or(0);
            let mut done = false;
            if deleted < n as u64 {
                let remaining: bool = tx.query_one(&remaining_sql, &ids).await?.try_get(0)?;
                if !remaining {
                    let updated = tx
                        .execute(
                            &done_sql,
                            &[ids[0], ids[1], ids[2], &claim.token, &claim.generation],
                        )
                        .await?;
                    if updated != 1 {
                        return Err(TxError::Conflict(
                            "cleanup claim changed mid-transaction".into(),
                        ));
                    }
                    done = true;
                }
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok((deleted, done))
        })
        .await
    }

    async fn discover(&self, cutoff: EventTime, limit: usize) -> StoreResult<Vec<WorkItem>> {
        self.discover_ready(cutoff, limit, Duration::ZERO).await
    }

    async fn discover_ready(
        &self,
        cutoff: EventTime,
        limit: usize,
        cleanup_delay: Duration,
    ) -> StoreResult<Vec<WorkItem>> {
        let cols = "table_id, partition_key, bucket_key, bucket_strategy, bucket_start, bucket_end";
        let sql = format!(
            "SELECT * FROM ( \
               SELECT {cols}, 0::INT4 AS kind FROM {META} \
                 WHERE state = 'hot' AND bucket_end <= $1 AND (retry_at IS NULL OR retry_at <= now()) \
               UNION ALL \
               SELECT {cols}, 1::INT4 AS kind FROM {META} \
                 WHERE state = 'archiving' AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
               UNION ALL \
               SELECT {cols}, 2::INT4 AS kind FROM {META} \
                 WHERE state = 'archived' AND NOT hot_deleted \
                   AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
                   AND published_at + $3::INT8 * INTERVAL '1 microsecond' <= now() \
             ) w ORDER BY bucket_end, table_id, partition_key, bucket_key LIMIT $2"
        );
        let cutoff = cutoff.to_datetime();
        let n = limit_param(limit);
        let delay = micros(cleanup_delay);
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.run("discover", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[&cutoff, &n, &delay]).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let get = |e: tokio_postgres::Error| corrupt("bucket metadata row", e);
                let table_id: String = row.try_get(0).map_err(get)?;
                let pk: Vec<u8> = row.try_get(1).map_err(get)?;
                let key: String = row.try_get(2).map_err(get)?;
                let strategy: String = row.try_get(3).map_err(get)?;
                let kind: i32 = row.try_get(6).map_err(get)?;
                let strategy: BucketStrategy = strategy
                    .parse()
                    .map_err(|e| corrupt("bucket strategy", e))?;
                let bucket = BucketId {
                    table_id: TableId::new(table_id).map_err(|e| corrupt("table id", e))?,
                    partition_key: PartitionKey::new(pk)
                        .map_err(|e| corrupt("partition key", e))?,
                    bucket_key: BucketKey::parse(strategy, &key)
                        .map_err(|e| corrupt("bucket key", e))?,
                };
                let kind = match kind {
                    0 => WorkKind::Eligible,
                    1 => WorkKind::ExpiredClaim,
                    _ => WorkKind::CleanupPending,
                };
                out.push(WorkItem { bucket, kind });
            }
            Ok(out)
        })
        .await
    }

    async fn backlog(&self, cutoff: EventTime) -> StoreResult<Backlog> {
        // Two scalar subqueries so each one is an index range on (state, bucket_end); count()
        // is INT8 on both dialects (sum() would be DECIMAL on CockroachDB).
        let sql = format!(
            "SELECT (SELECT count(*) FROM {META} WHERE state = 'hot' AND bucket_end <= $1), \
                    (SELECT count(*) FROM {META} WHERE state = 'archiving')"
        );
        let cutoff = cutoff.to_datetime();
        self.run("backlog", || async {
            let client = self.pooled().await?;
            let row = client.query_one(&sql, &[&cutoff]).await?;
            let count = |i: usize| -> StoreResult<u64> {
                let n: i64 = row.try_get(i).map_err(|e| corrupt("backlog count", e))?;
                u64::try_from(n).map_err(|e| corrupt("backlog count", e))
            };
            Ok(Backlog {
                eligible: count(0)?,
                archiving: count(1)?,
            })
        })
        .await
    }

    async fn referenced_object_keys(&self) -> StoreResult<Vec<String>> {
        let sql = format!("SELECT DISTINCT object_key FROM {META} WHERE object_key IS NOT NULL ORDER BY object_key");
        self.run("referenced_object_keys", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[]).await?;
            Ok(rows
                .iter()
                .map(|r| r.try_get::<_, String>(0))
                .collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

impl PgStore {
    async fn claim_with(
        &self,
        bucket: &BucketId,
        op: &'static str,
        sql: &str,
        key: &str,
        lease: i64,
    ) -> StoreResult<Option<Claim>> {
        self.run(op, || async {
            let token = new_token();
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let row = tx
                .query_opt(
                    sql,
                    &[
                        &bucket.table_id.as_str(),
                        &bucket.partition_key.as_bytes(),
                        &key,
                        &token,
                        &lease,
                    ],
                )
                .await?;
            let claim = match row {
                None => None,
                Some(row) => {
                    let generation: i64 = row.try_get(0)?;
                    let expires: DateTime<Utc> = row.try_get(1)?;
                    Some(Claim {
                        bucket: bucket.clone(),
                        token,
                        generation,
                        expires_at: event_time(expires, "lease_expires_at")?,
                    })
                }
            };
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(claim)
        })
        .await
    }

    async fn conditional_write(
        &self,
        claim: &Claim,
        op: &'static str,
        allowed: &[&str],
        min_age: Option<Duration>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<()> {
        self.run(op, || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let n = tx.execute(sql, params).await?;
            if n == 0 {
                return Err(Self::refusal(&tx, claim, op, allowed, min_age).await);
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(())
        })
        .await
    }
}

/// A fresh, opaque, unguessable owner token.
fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_rows_are_put_in_clustering_order_either_way() {
        let t = |m: i64| EventTime::from_micros(m).unwrap();
        let rows = || {
            vec![
                Borrowed {
                    time: t(2),
                    sort: b"a",
                    value: b"2a",
                },
                Borrowed {
                    time: t(1),
                    sort: b"z",
                    value: b"1z",
                },
                Borrowed {
                    time: t(2),
                    sort: b"",
                    value: b"2",
                },
                Borrowed {
                    time: t(3),
                    sort: b"b",
                    value: b"3b",
                },
            ]
        };
        fn values<'a>(rs: &[Borrowed<'a>]) -> Vec<&'a [u8]> {
            rs.iter().map(|r| r.value).collect()
        }
        let mut asc = rows();
        in_page_order(&mut asc, false);
        assert_eq!(values(&asc), [b"1z".as_ref(), b"2", b"2a", b"3b"]);
        let mut desc = rows();
        in_page_order(&mut desc, true);
        assert_eq!(values(&desc), [b"3b".as_ref(), b"2a", b"2", b"1z"]);
        // Already ordered input is left as it is.
        in_page_order(&mut desc, true);
        assert_eq!(values(&desc), [b"3b".as_ref(), b"2a", b"2", b"1z"]);
    }
}
