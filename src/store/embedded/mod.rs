//! The embedded hot tier: [`SqliteStore`] implements [`HotStore`] on one SQLite file, so
//! Pulpitum runs on a machine with no database server.
//!
//! It keeps the same tables and columns as the PostgreSQL store (keys as BLOBs, times as
//! INTEGER microseconds since the epoch, the state as TEXT) and the same fencing rules. Each
//! trait call is one SQLite transaction: writers open it with `BEGIN IMMEDIATE`, which takes
//! the database's single write lock before the first read, so the fence check and the write
//! that depends on it cannot interleave with any other writer, in this process or another
//! one. Readers use deferred transactions on separate connections: in WAL mode each sees one
//! consistent snapshot for the whole transaction, which gives `read_page` and
//! `snapshot_page` the "route and rows from one snapshot" guarantee.
//!
//! The store's clock is the system clock, read inside the transaction after the lock is
//! held. That is sound here because every process sharing an embedded file runs on the
//! same machine and therefore reads the same clock; a lease is never compared against a
//! remote worker's time.
//!
//! Durability: WAL with `synchronous = FULL`, so a commit is on disk (WAL fsynced) before an
//! append is acknowledged, even across power loss. `NORMAL` would only survive process
//! crashes, which is not enough for invariant 1 (an acknowledged append is never lost).
//!
//! All SQLite calls run on tokio's blocking pool (`spawn_blocking`), never on the async
//! worker threads. A call whose future is dropped still runs its transaction to the end
//! (commit or rollback as a whole); the caller learns the outcome by re-reading.

mod migrate;

use std::collections::HashSet;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rand::Rng;
use rusqlite::types::Value;
use rusqlite::{
    params, params_from_iter, Connection, ErrorCode, OptionalExtension, Transaction,
    TransactionBehavior,
};

use crate::model::{
    BucketId, BucketKey, BucketStrategy, ClusteringKey, EventTime, PartitionKey, Record, SortKey,
    TableId,
};

use super::{
    bucket_for_append, AppendOutcome, Appends, Backlog, BatchOutcome, BucketFilter, BucketMeta,
    BucketState, Catalog, Claim, HotPage, Lifecycle, PageRequest, RoutedReads, StoreError,
    StoreResult, TableDefinition, WorkItem, WorkKind,
};

/// How long one SQLite call waits for another process's write lock before it reports busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Attempts of a whole transaction that keeps finding the database busy.
const MAX_ATTEMPTS: u32 = 4;

/// Read-only connections of a file-backed store (reads then never wait for the writer).
const READERS: usize = 2;

/// The metadata columns every bucket query selects, in the order [`meta_from_row`] reads.
const META_COLUMNS: &str =
    "table_id, partition_key, bucket_key, bucket_strategy, state, owner_token, \
     generation, lease_expires_at, retry_at, object_key, hot_deleted, published_at";

/// The primary-key predicate of one bucket, binding `?1..?3`.
const BUCKET_PK: &str = "table_id = ?1 AND partition_key = ?2 AND bucket_key = ?3";

/// A SQLite-backed hot store. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The one connection that writes; its mutex also serializes this process's writers.
    writer: Mutex<Connection>,
    /// Snapshot readers (empty for an in-memory store, whose data only `writer` can see).
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("readers", &self.inner.readers.len())
            .finish()
    }
}

/// An error inside a transaction body: either already typed, or a raw SQLite error that the
/// runner classifies (busy -> retry, anything else -> [`StoreError::Backend`]).
#[derive(Debug)]
enum TxError {
    Store(StoreError),
    Sql(rusqlite::Error),
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<crate::model::ModelError> for TxError {
    fn from(e: crate::model::ModelError) -> Self {
        Self::Store(StoreError::Model(e))
    }
}

type TxResult<T> = Result<T, TxError>;

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

fn backend(operation: &'static str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        operation,
        detail: e.to_string(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `BEGIN IMMEDIATE` on the writer connection.
    Write,
    /// `BEGIN DEFERRED` on a reader connection: one snapshot, no writes.
    Read,
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`, creating missing parent directories.
    /// Sets WAL mode, `synchronous = FULL` and a busy timeout. Does not migrate: call
    /// [`HotStore::migrate`]. This is a blocking call; from async code wrap it in
    /// `spawn_blocking` if the file may be slow to open.
    pub fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::locator::create_private_dir(parent).map_err(|e| {
                StoreError::Config(format!("cannot create directory {}: {e}", parent.display()))
            })?;
        }
        // The rows are the application's data: owner-only. SQLite gives the -wal and -shm
        // files the mode of the database file, so creating it 0600 covers all three.
        crate::locator::create_private_file(&path)
            .map_err(|e| StoreError::Config(format!("cannot create {}: {e}", path.display())))?;
        let open = |op: &'static str| -> StoreResult<Connection> {
            let c = Connection::open(&path)
                .map_err(|e| StoreError::Config(format!("cannot open {}: {e}", path.display())))?;
            c.busy_timeout(BUSY_TIMEOUT).map_err(|e| backend(op, e))?;
            Ok(c)
        };
        let writer = open("open")?;
        // Switching a fresh file to WAL takes an exclusive lock, and SQLite answers BUSY at
        // once (without its busy handler) while another process is doing the same: retry
        // within the busy timeout rather than fail a concurrent start.
        let started = std::time::Instant::now();
        let mode: String = loop {
            match writer.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
                Ok(m) => break m,
                Err(rusqlite::Error::SqliteFailure(f, _))
                    if f.code == rusqlite::ErrorCode::DatabaseBusy
                        && started.elapsed() < BUSY_TIMEOUT =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(
                        5 + rand::random::<u64>() % 20,
                    ));
                }
                Err(e) => return Err(backend("open", e)),
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Config(format!(
                "{} cannot use WAL journaling (got {mode}); is it on a network file system?",
                path.display()
            )));
        }
        writer
            .pragma_update(None, "synchronous", "FULL")
            .map_err(|e| backend("open", e))?;
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let r = open("open")?;
            // A reader that tried to write would break the single-writer design; refuse it.
            r.pragma_update(None, "query_only", true)
                .map_err(|e| backend("open", e))?;
            readers.push(Mutex::new(r));
        }
        Ok(Self::from_parts(writer, readers, Some(path)))
    }

    /// A private in-memory store (for tests): one connection, gone when the store is dropped.
    pub fn open_in_memory() -> StoreResult<Self> {
        let c = Connection::open_in_memory().map_err(|e| backend("open", e))?;
        Ok(Self::from_parts(c, Vec::new(), None))
    }

    fn from_parts(
        writer: Connection,
        readers: Vec<Mutex<Connection>>,
        path: Option<PathBuf>,
    ) -> Self {
        writer.set_prepared_statement_cache_capacity(32);
        Self {
            inner: Arc::new(Inner {
                writer: Mutex::new(writer),
                readers,
                next_reader: AtomicUsize::new(0),
                path,
            }),
        }
    }

    /// The database file, or `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Runs `body` as one transaction on the blocking pool, retrying the whole transaction a
    /// bounded number of times while another process holds the database busy.
    async fn run<T, F>(&self, operation: &'static str, mode: Mode, mut body: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&Transaction<'_>, i64) -> TxResult<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.run_blocking(operation, mode, &mut body))
            .await
            .map_err(|e| backend(operation, format!("store worker failed: {e}")))?
    }
}

/// A poisoned mutex only means a previous call panicked; its transaction was rolled back when
/// it unwound, so the connection is still consistent.
fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn run_blocking<T>(
        &self,
        operation: &'static str,
        mode: Mode,
        body: &mut dyn FnMut(&Transaction<'_>, i64) -> TxResult<T>,
    ) -> StoreResult<T> {
        let mut last = String::new();
        for attempt in 1..=MAX_ATTEMPTS {
            let mut guard = match mode {
                Mode::Read if !self.readers.is_empty() => {
                    let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
                    lock(&self.readers[i])
                }
                _ => lock(&self.writer),
            };
            let behavior = match mode {
                Mode::Write => TransactionBehavior::Immediate,
                Mode::Read => TransactionBehavior::Deferred,
            };
            let err = match guard.transaction_with_behavior(behavior) {
                Err(e) => TxError::Sql(e),
                Ok(tx) => {
                    // The clock is read only once the transaction (and, for writers, the
                    // write lock) is held, so commit order and clock order agree.
                    let now = clock_micros();
                    match body(&tx, now) {
                        Ok(v) => match tx.commit() {
                            Ok(()) => return Ok(v),
                            Err(e) if mode == Mode::Write => {
                                // The commit may or may not have reached the WAL.
                                return Err(StoreError::OutcomeUnknown {
                                    operation,
                                    detail: e.to_string(),
                                });
                            }
                            Err(e) => TxError::Sql(e),
                        },
                        // Dropping `tx` rolls back: nothing of a failed call is written.
                        Err(e) => e,
                    }
                }
            };
            drop(guard);
            match err {
                TxError::Sql(e) if is_busy(&e) => {
                    last = e.to_string();
                    if attempt < MAX_ATTEMPTS {
                        let jitter = rand::rng().random_range(0..50u64);
                        std::thread::sleep(Duration::from_millis(20 * u64::from(attempt) + jitter));
                    }
                }
                TxError::Sql(e) => return Err(backend(operation, e)),
                TxError::Store(e) => return Err(e),
            }
        }
        Err(StoreError::RetriesExhausted {
            operation,
            attempts: MAX_ATTEMPTS,
            detail: last,
        })
    }
}

fn clock_micros() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// `now + d`, capped at the last supported instant so the result is always an [`EventTime`].
fn plus(now: i64, d: Duration) -> i64 {
    let d = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    now.saturating_add(d)
        .min(EventTime::end_of_supported().as_micros() - 1)
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn time(micros: i64, what: &str) -> TxResult<EventTime> {
    EventTime::from_micros(micros)
        .map_err(|e| TxError::Store(StoreError::Corrupt(format!("{what} {micros}: {e}"))))
}

fn corrupt(msg: String) -> TxError {
    TxError::Store(StoreError::Corrupt(msg))
}

fn state_name(s: &str) -> TxResult<&'static str> {
    match s {
        "hot" => Ok("hot"),
        "archiving" => Ok("archiving"),
        "archived" => Ok("archived"),
        other => Err(corrupt(format!("unknown bucket state {other:?}"))),
    }
}

/// One metadata row as stored, before conversion.
struct MetaRow {
    table_id: String,
    partition_key: Vec<u8>,
    bucket_key: String,
    strategy: String,
    state: String,
    owner_token: Option<String>,
    generation: i64,
    lease_expires_at: Option<i64>,
    retry_at: Option<i64>,
    object_key: Option<String>,
    hot_deleted: bool,
    published_at: Option<i64>,
}

fn meta_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MetaRow> {
    Ok(MetaRow {
        table_id: r.get(0)?,
        partition_key: r.get(1)?,
        bucket_key: r.get(2)?,
        strategy: r.get(3)?,
        state: r.get(4)?,
        owner_token: r.get(5)?,
        generation: r.get(6)?,
        lease_expires_at: r.get(7)?,
        retry_at: r.get(8)?,
        object_key: r.get(9)?,
        hot_deleted: r.get(10)?,
        published_at: r.get(11)?,
    })
}

impl MetaRow {
    fn bucket_id(&self) -> TxResult<BucketId> {
        bucket_id(
            &self.table_id,
            &self.partition_key,
            &self.strategy,
            &self.bucket_key,
        )
    }

    fn state(&self) -> TxResult<BucketState> {
        Ok(match state_name(&self.state)? {
            "hot" => BucketState::Hot,
            "archiving" => BucketState::Archiving,
            _ => BucketState::Archived {
                object_key: self.object_key.clone().ok_or_else(|| {
                    corrupt(format!(
                        "archived bucket {} has no object key",
                        self.bucket_key
                    ))
                })?,
                hot_deleted: self.hot_deleted,
            },
        })
    }

    fn to_meta(&self) -> TxResult<BucketMeta> {
        Ok(BucketMeta {
            id: self.bucket_id()?,
            state: self.state()?,
            generation: self.generation,
            owner_token: self.owner_token.clone(),
            lease_expires_at: self
                .lease_expires_at
                .map(|t| time(t, "lease expiry"))
                .transpose()?,
            retry_at: self.retry_at.map(|t| time(t, "retry time")).transpose()?,
            published_at: self
                .published_at
                .map(|t| time(t, "publication time"))
                .transpose()?,
        })
    }

    /// Whether an owner's lease is held at `now` (a missing lease is not held).
    fn lease_held(&self, now: i64) -> bool {
        self.lease_expires_at.is_some_and(|t| t > now)
    }

    /// A short description for error reasons.
    fn describe(&self) -> String {
        match self.state.as_str() {
            "archived" if self.hot_deleted => "archived (hot rows deleted)".to_string(),
            "archived" => "archived (hot rows retained)".to_string(),
            s => s.to_string(),
        }
    }
}

fn bucket_id(
    table_id: &str,
    partition_key: &[u8],
    strategy: &str,
    bucket_key: &str,
) -> TxResult<BucketId> {
    let strategy: BucketStrategy = strategy
        .parse()
        .map_err(|e| corrupt(format!("bucket {bucket_key}: {e}")))?;
    Ok(BucketId {
        table_id: TableId::new(table_id).map_err(|e| corrupt(e.to_string()))?,
        partition_key: PartitionKey::new(partition_key.to_vec())
            .map_err(|e| corrupt(e.to_string()))?,
        bucket_key: BucketKey::parse(strategy, bucket_key).map_err(|e| corrupt(e.to_string()))?,
    })
}

fn load_meta(tx: &Transaction<'_>, id: &BucketId) -> TxResult<Option<MetaRow>> {
    let sql = format!("SELECT {META_COLUMNS} FROM pulpitum_v4_bucket_metadata WHERE {BUCKET_PK}");
    Ok(tx
        .prepare_cached(&sql)?
        .query_row(
            params![
                id.table_id.as_str(),
                id.partition_key.as_bytes(),
                id.bucket_key.to_string()
            ],
            meta_from_row,
        )
        .optional()?)
}

fn table_from_row(
    r: &rusqlite::Row<'_>,
) -> rusqlite::Result<(String, String, Option<i64>, i32, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn table_def(row: (String, String, Option<i64>, i32, String)) -> TxResult<TableDefinition> {
    let (id, strategy, writable, version, surface) = row;
    Ok(TableDefinition {
        table_id: TableId::new(id.clone()).map_err(|e| corrupt(e.to_string()))?,
        strategy: strategy
            .parse()
            .map_err(|e| corrupt(format!("table {id}: {e}")))?,
        writable_buckets: writable
            .map(|n| {
                u32::try_from(n).map_err(|_| corrupt(format!("table {id}: writable_buckets {n}")))
            })
            .transpose()?,
        record_schema_version: version,
        surface,
    })
}

const TABLE_COLUMNS: &str =
    "table_id, bucket_strategy, writable_buckets, record_schema_version, surface";

fn load_table(tx: &Transaction<'_>, table_id: &TableId) -> TxResult<Option<TableDefinition>> {
    let sql = format!("SELECT {TABLE_COLUMNS} FROM pulpitum_v4_tables WHERE table_id = ?1");
    tx.prepare_cached(&sql)?
        .query_row([table_id.as_str()], table_from_row)
        .optional()?
        .map(table_def)
        .transpose()
}

fn require_table(tx: &Transaction<'_>, table_id: &TableId) -> TxResult<TableDefinition> {
    load_table(tx, table_id)?
        .ok_or_else(|| TxError::Store(StoreError::UnknownTable(table_id.clone())))
}

/// Creates the bucket's metadata as Hot if absent, then refuses unless it is Hot: the fence.
fn ensure_hot(tx: &Transaction<'_>, id: &BucketId, now: i64) -> TxResult<()> {
    let (start, end) = id.bucket_key.bounds();
    let inserted = tx
        .prepare_cached(
            "INSERT INTO pulpitum_v4_bucket_metadata \
             (table_id, partition_key, bucket_key, bucket_strategy, bucket_start, bucket_end, \
              state, generation, hot_deleted, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'hot', 0, 0, ?7, ?7) \
             ON CONFLICT (table_id, partition_key, bucket_key) DO NOTHING",
        )?
        .execute(params![
            id.table_id.as_str(),
            id.partition_key.as_bytes(),
            id.bucket_key.to_string(),
            id.bucket_key.strategy().as_str(),
            start.as_micros(),
            end.as_micros(),
            now,
        ])?;
    if inserted == 1 {
        return Ok(());
    }
    let state: String = tx
        .prepare_cached(&format!(
            "SELECT state FROM pulpitum_v4_bucket_metadata WHERE {BUCKET_PK}"
        ))?
        .query_row(
            params![
                id.table_id.as_str(),
                id.partition_key.as_bytes(),
                id.bucket_key.to_string()
            ],
            |r| r.get(0),
        )?;
    match state_name(&state)? {
        "hot" => Ok(()),
        state => Err(StoreError::Fenced {
            bucket: id.clone(),
            state,
        }
        .into()),
    }
}

/// Inserts one record into a bucket already checked Hot in this transaction.
fn insert_record(tx: &Transaction<'_>, id: &BucketId, record: &Record) -> TxResult<AppendOutcome> {
    let key = params![
        id.table_id.as_str(),
        id.partition_key.as_bytes(),
        id.bucket_key.to_string(),
        record.event_time.as_micros(),
        record.sort_key.as_bytes(),
        record.value.as_slice(),
    ];
    let inserted = tx
        .prepare_cached(
            "INSERT INTO pulpitum_v4_records \
             (table_id, partition_key, bucket_key, event_time, sort_key, value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (table_id, partition_key, bucket_key, event_time, sort_key) DO NOTHING",
        )?
        .execute(key)?;
    if inserted == 1 {
        return Ok(AppendOutcome::Inserted);
    }
    let same: bool = tx
        .prepare_cached(&format!(
            "SELECT value = ?6 FROM pulpitum_v4_records \
             WHERE {BUCKET_PK} AND event_time = ?4 AND sort_key = ?5"
        ))?
        .query_row(key, |r| r.get(0))?;
    if same {
        Ok(AppendOutcome::AlreadyPresent)
    } else {
        Err(StoreError::DuplicateKey {
            bucket: id.clone(),
            event_time: record.event_time,
            sort_key: hex::encode(record.sort_key.as_bytes()),
        }
        .into())
    }
}

fn record_from(
    partition_key: &PartitionKey,
    t: i64,
    k: Vec<u8>,
    value: Vec<u8>,
) -> TxResult<Record> {
    Ok(Record {
        partition_key: partition_key.clone(),
        event_time: time(t, "event time")?,
        sort_key: SortKey::new(k).map_err(|e| corrupt(e.to_string()))?,
        value,
    })
}

/// Which states an operation under a claim accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ClaimState {
    /// A pre-publication claim: `archiving`.
    Archiving,
    /// A cleanup claim: `archived` with hot rows retained.
    Cleanup,
    /// Either (renewal).
    Any,
}

/// Verifies in the caller's transaction that `claim` is current for `operation`: same
/// generation, a state the operation accepts, same token, lease unexpired at `now`.
/// Generation is checked first: a newer claim supersedes this one whatever the state.
fn verify_claim(
    tx: &Transaction<'_>,
    claim: &Claim,
    operation: &'static str,
    accepts: ClaimState,
    now: i64,
) -> TxResult<MetaRow> {
    let stale = |reason: String| -> TxError {
        StoreError::StaleClaim {
            bucket: claim.bucket.clone(),
            generation: claim.generation,
            reason,
        }
        .into()
    };
    let Some(row) = load_meta(tx, &claim.bucket)? else {
        return Err(stale("the bucket has no metadata".into()));
    };
    if row.generation != claim.generation {
        return Err(stale(format!(
            "the bucket is at generation {} ({})",
            row.generation,
            row.describe()
        )));
    }
    let state_ok = match accepts {
        ClaimState::Archiving => row.state == "archiving",
        ClaimState::Cleanup => row.state == "archived" && !row.hot_deleted,
        ClaimState::Any => {
            row.state == "archiving" || (row.state == "archived" && !row.hot_deleted)
        }
    };
    if !state_ok {
        if accepts == ClaimState::Any {
            return Err(stale(format!(
                "the bucket is {}; the claim was released",
                row.describe()
            )));
        }
        return Err(StoreError::InvalidTransition {
            bucket: claim.bucket.clone(),
            operation,
            state: row.describe(),
        }
        .into());
    }
    if row.owner_token.as_deref() != Some(claim.token.as_str()) {
        return Err(stale(match &row.owner_token {
            Some(_) => "another owner token holds this generation".to_string(),
            None => "no owner holds the bucket".to_string(),
        }));
    }
    if !row.lease_held(now) {
        let expired = row
            .lease_expires_at
            .and_then(|t| EventTime::from_micros(t).ok())
            .map_or_else(
                || "no lease is set".to_string(),
                |t| format!("the lease expired at {t}"),
            );
        let now = EventTime::from_micros(now).map_or_else(|_| now.to_string(), |t| t.to_string());
        return Err(stale(format!("{expired} (store time {now})")));
    }
    Ok(row)
}

fn fresh_token() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    hex::encode(bytes)
}

/// Appends a bound on `col` to a WHERE clause.
fn push_bound(sql: &mut String, args: &mut Vec<Value>, col: &str, lower: bool, b: &Bound<Value>) {
    let (op, v) = match (b, lower) {
        (Bound::Unbounded, _) => return,
        (Bound::Included(v), true) => (">=", v),
        (Bound::Excluded(v), true) => (">", v),
        (Bound::Included(v), false) => ("<=", v),
        (Bound::Excluded(v), false) => ("<", v),
    };
    sql.push_str(&format!(" AND {col} {op} ?"));
    args.push(v.clone());
}

fn time_bound(b: &Bound<EventTime>) -> Bound<Value> {
    b.as_ref().map(|t| Value::Integer(t.as_micros()))
}

fn sort_bound(b: &Bound<SortKey>) -> Bound<Value> {
    b.as_ref().map(|k| Value::Blob(k.as_bytes().to_vec()))
}

fn bucket_args(id: &BucketId) -> Vec<Value> {
    vec![
        Value::Text(id.table_id.as_str().to_string()),
        Value::Blob(id.partition_key.as_bytes().to_vec()),
        Value::Text(id.bucket_key.to_string()),
    ]
}

#[async_trait]
impl Catalog for SqliteStore {
    async fn migrate(&self) -> StoreResult<()> {
        self.run("migrate", Mode::Write, |tx, now| {
            migrate::apply(tx, now).map(|_| ())
        })
        .await
    }

    async fn register_table(&self, def: &TableDefinition) -> StoreResult<TableDefinition> {
        let def = def.clone();
        self.run("register_table", Mode::Write, move |tx, now| {
            if let Some(existing) = load_table(tx, &def.table_id)? {
                if existing.strategy != def.strategy || existing.surface != def.surface {
                    return Err(StoreError::TableConflict {
                        table_id: def.table_id.clone(),
                        existing: format!("strategy {}, surface {}", existing.strategy, existing.surface),
                        requested: format!("strategy {}, surface {}", def.strategy, def.surface),
                    }
                    .into());
                }
                return Ok(existing);
            }
            tx.execute(
                "INSERT INTO pulpitum_v4_tables \
                 (table_id, bucket_strategy, writable_buckets, record_schema_version, surface, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    def.table_id.as_str(),
                    def.strategy.as_str(),
                    def.writable_buckets.map(i64::from),
                    def.record_schema_version,
                    def.surface,
                    now,
                ],
            )?;
            Ok(def.clone())
        })
        .await
    }

    async fn table(&self, table_id: &TableId) -> StoreResult<Option<TableDefinition>> {
        let table_id = table_id.clone();
        self.run("table", Mode::Read, move |tx, _| load_table(tx, &table_id))
            .await
    }

    async fn tables(&self) -> StoreResult<Vec<TableDefinition>> {
        self.run("tables", Mode::Read, |tx, _| {
            let mut stmt = tx.prepare(&format!(
                "SELECT {TABLE_COLUMNS} FROM pulpitum_v4_tables ORDER BY table_id"
            ))?;
            let rows = stmt.query_map([], table_from_row)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(table_def(row?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn now(&self) -> StoreResult<EventTime> {
        Ok(time(clock_micros(), "store clock").map_err(|e| match e {
            TxError::Store(s) => s,
            TxError::Sql(s) => backend("now", s),
        })?)
    }
}

#[async_trait]
impl Appends for SqliteStore {
    async fn append(&self, table_id: &TableId, record: &Record) -> StoreResult<AppendOutcome> {
        let table_id = table_id.clone();
        let record = record.clone();
        self.run("append", Mode::Write, move |tx, now| {
            let def = require_table(tx, &table_id)?;
            let id = bucket_for_append(&def, &record, time(now, "store clock")?)?;
            ensure_hot(tx, &id, now)?;
            insert_record(tx, &id, &record)
        })
        .await
    }

    async fn append_batch(
        &self,
        table_id: &TableId,
        records: &[Record],
    ) -> StoreResult<BatchOutcome> {
        let table_id = table_id.clone();
        let records = records.to_vec();
        self.run("append_batch", Mode::Write, move |tx, now| {
            let def = require_table(tx, &table_id)?;
            let now_t = time(now, "store clock")?;
            // Each bucket is checked once per transaction; the write lock keeps it Hot until
            // commit, so later records of the same bucket need no second check.
            let mut checked: HashSet<BucketId> = HashSet::new();
            let mut out = BatchOutcome::default();
            for record in &records {
                let id = bucket_for_append(&def, record, now_t)?;
                if !checked.contains(&id) {
                    ensure_hot(tx, &id, now)?;
                    checked.insert(id.clone());
                }
                match insert_record(tx, &id, record)? {
                    AppendOutcome::Inserted => out.inserted += 1,
                    AppendOutcome::AlreadyPresent => out.already_present += 1,
                }
            }
            Ok(out)
        })
        .await
    }
}

#[async_trait]
impl RoutedReads for SqliteStore {
    async fn list_buckets(
        &self,
        table_id: &TableId,
        filter: &BucketFilter,
    ) -> StoreResult<Vec<BucketMeta>> {
        let table_id = table_id.clone();
        let filter = filter.clone();
        // An unregistered table simply has no buckets (as in the PostgreSQL store).
        self.run("list_buckets", Mode::Read, move |tx, _| {
            let mut sql = format!(
                "SELECT {META_COLUMNS} FROM pulpitum_v4_bucket_metadata WHERE table_id = ?"
            );
            let mut base = vec![Value::Text(table_id.as_str().to_string())];
            if let Some(from) = filter.from {
                sql.push_str(" AND bucket_end > ?");
                base.push(Value::Integer(from.as_micros()));
            }
            if let Some(to) = filter.to {
                sql.push_str(" AND bucket_start <= ?");
                base.push(Value::Integer(to.as_micros()));
            }
            // One query per requested partition, in key order, keeps the statement's shape
            // fixed whatever the number of partitions (SQLite caps bound parameters).
            let partitions: Vec<Option<&PartitionKey>> = match &filter.partitions {
                None => vec![None],
                Some(ps) => {
                    let mut ps: Vec<&PartitionKey> = ps.iter().collect();
                    ps.sort();
                    ps.dedup();
                    ps.into_iter().map(Some).collect()
                }
            };
            let mut out = Vec::new();
            for p in partitions {
                let mut sql = sql.clone();
                let mut args = base.clone();
                if let Some(p) = p {
                    sql.push_str(" AND partition_key = ?");
                    args.push(Value::Blob(p.as_bytes().to_vec()));
                }
                sql.push_str(if filter.descending {
                    " ORDER BY partition_key, bucket_start DESC"
                } else {
                    " ORDER BY partition_key, bucket_start"
                });
                if let Some(limit) = filter.limit {
                    // The limit is over the whole listing, partitions in key order.
                    let left = limit.saturating_sub(out.len());
                    if left == 0 {
                        break;
                    }
                    sql.push_str(" LIMIT ?");
                    args.push(Value::Integer(i64::try_from(left).unwrap_or(i64::MAX)));
                }
                let mut stmt = tx.prepare_cached(&sql)?;
                let rows = stmt.query_map(params_from_iter(args.iter()), meta_from_row)?;
                for row in rows {
                    out.push(row?.to_meta()?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn bucket(&self, bucket: &BucketId) -> StoreResult<Option<BucketMeta>> {
        let id = bucket.clone();
        self.run("bucket", Mode::Read, move |tx, _| {
            load_meta(tx, &id)?.map(|m| m.to_meta()).transpose()
        })
        .await
    }

    async fn read_page(&self, bucket: &BucketId, req: &PageRequest) -> StoreResult<HotPage> {
        let id = bucket.clone();
        let req = req.clone();
        // A deferred transaction: both statements read the same WAL snapshot, so the route
        // and the rows belong to one moment.
        self.run("read_page", Mode::Read, move |tx, _| {
            let Some(meta) = load_meta(tx, &id)? else {
                return Ok(HotPage::Missing);
            };
            let state = match meta.state()? {
                BucketState::Archived { object_key, .. } => {
                    return Ok(HotPage::Archived { object_key })
                }
                s => s,
            };
            let b = &req.bounds;
            let value_col = if req.include_value { ", value" } else { "" };
            let mut sql = format!(
                "SELECT event_time, sort_key{value_col} FROM pulpitum_v4_records \
                 WHERE table_id = ? AND partition_key = ? AND bucket_key = ?"
            );
            let mut args = bucket_args(&id);
            push_bound(
                &mut sql,
                &mut args,
                "event_time",
                true,
                &time_bound(&b.time_lower),
            );
            push_bound(
                &mut sql,
                &mut args,
                "event_time",
                false,
                &time_bound(&b.time_upper),
            );
            push_bound(
                &mut sql,
                &mut args,
                "sort_key",
                true,
                &sort_bound(&b.sort_lower),
            );
            push_bound(
                &mut sql,
                &mut args,
                "sort_key",
                false,
                &sort_bound(&b.sort_upper),
            );
            for (cursor, op) in [(&b.after, ">"), (&b.before, "<")] {
                if let Some(c) = cursor {
                    sql.push_str(&format!(" AND (event_time, sort_key) {op} (?, ?)"));
                    args.push(Value::Integer(c.event_time.as_micros()));
                    args.push(Value::Blob(c.sort_key.as_bytes().to_vec()));
                }
            }
            let dir = if req.descending { "DESC" } else { "ASC" };
            sql.push_str(&format!(
                " ORDER BY event_time {dir}, sort_key {dir} LIMIT ?"
            ));
            args.push(Value::Integer(to_i64(req.limit)));
            let mut stmt = tx.prepare_cached(&sql)?;
            let mut rows = stmt.query(params_from_iter(args.iter()))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let value = if req.include_value {
                    r.get(2)?
                } else {
                    Vec::new()
                };
                out.push(record_from(&id.partition_key, r.get(0)?, r.get(1)?, value)?);
            }
            Ok(HotPage::hot(state, &out, req.include_value))
        })
        .await
    }
}

#[async_trait]
impl Lifecycle for SqliteStore {
    async fn claim(&self, bucket: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        let id = bucket.clone();
        self.run("claim", Mode::Write, move |tx, now| {
            let Some(row) = load_meta(tx, &id)? else {
                return Ok(None);
            };
            let claimable = match row.state.as_str() {
                "hot" => row.retry_at.is_none_or(|t| t <= now),
                "archiving" => !row.lease_held(now),
                _ => false,
            };
            if !claimable {
                return Ok(None);
            }
            let claim = Claim {
                bucket: id.clone(),
                token: fresh_token(),
                generation: row.generation + 1,
                expires_at: time(plus(now, lease), "lease expiry")?,
            };
            // Compare-and-set on the generation read above; the write lock already excludes
            // other writers, this keeps the statement correct on its own.
            let n = tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET state = 'archiving', owner_token = ?4, \
                     generation = ?5, lease_expires_at = ?6, retry_at = NULL, updated_at = ?7 \
                     WHERE {BUCKET_PK} AND generation = ?8"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    claim.token,
                    claim.generation,
                    claim.expires_at.as_micros(),
                    now,
                    row.generation,
                ],
            )?;
            Ok((n == 1).then_some(claim))
        })
        .await
    }

    async fn claim_cleanup(
        &self,
        bucket: &BucketId,
        lease: Duration,
    ) -> StoreResult<Option<Claim>> {
        let id = bucket.clone();
        self.run("claim_cleanup", Mode::Write, move |tx, now| {
            let Some(row) = load_meta(tx, &id)? else {
                return Ok(None);
            };
            if row.state != "archived" || row.hot_deleted || row.lease_held(now) {
                return Ok(None);
            }
            let claim = Claim {
                bucket: id.clone(),
                token: fresh_token(),
                generation: row.generation + 1,
                expires_at: time(plus(now, lease), "lease expiry")?,
            };
            let n = tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET owner_token = ?4, generation = ?5, \
                     lease_expires_at = ?6, updated_at = ?7 \
                     WHERE {BUCKET_PK} AND generation = ?8 AND state = 'archived' AND hot_deleted = 0"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    claim.token,
                    claim.generation,
                    claim.expires_at.as_micros(),
                    now,
                    row.generation,
                ],
            )?;
            Ok((n == 1).then_some(claim))
        })
        .await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> StoreResult<Claim> {
        let claim = claim.clone();
        self.run("renew", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, "renew", ClaimState::Any, now)?;
            let expires = plus(now, lease);
            let id = &claim.bucket;
            tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET lease_expires_at = ?4, updated_at = ?5 \
                     WHERE {BUCKET_PK} AND generation = ?6 AND owner_token = ?7"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    expires,
                    now,
                    claim.generation,
                    claim.token,
                ],
            )?;
            Ok(Claim {
                expires_at: time(expires, "lease expiry")?,
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
        let claim = claim.clone();
        let after = after.cloned();
        // Verification and the read share one snapshot: the fence cannot move in between.
        self.run("snapshot_page", Mode::Read, move |tx, now| {
            verify_claim(tx, &claim, "snapshot", ClaimState::Archiving, now)?;
            let id = &claim.bucket;
            let mut sql = "SELECT event_time, sort_key, value FROM pulpitum_v4_records \
                           WHERE table_id = ? AND partition_key = ? AND bucket_key = ?"
                .to_string();
            let mut args = bucket_args(id);
            if let Some(c) = &after {
                sql.push_str(" AND (event_time, sort_key) > (?, ?)");
                args.push(Value::Integer(c.event_time.as_micros()));
                args.push(Value::Blob(c.sort_key.as_bytes().to_vec()));
            }
            sql.push_str(" ORDER BY event_time, sort_key LIMIT ?");
            args.push(Value::Integer(to_i64(limit)));
            let mut stmt = tx.prepare_cached(&sql)?;
            let mut rows = stmt.query(params_from_iter(args.iter()))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(record_from(
                    &id.partition_key,
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                )?);
            }
            Ok(out)
        })
        .await
    }

    async fn defer_archive(&self, claim: &Claim, retry_after: Duration) -> StoreResult<()> {
        let claim = claim.clone();
        self.run("defer_archive", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, "defer", ClaimState::Archiving, now)?;
            let id = &claim.bucket;
            tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET state = 'hot', owner_token = NULL, \
                     lease_expires_at = NULL, retry_at = ?4, updated_at = ?5 \
                     WHERE {BUCKET_PK} AND generation = ?6 AND owner_token = ?7"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    plus(now, retry_after),
                    now,
                    claim.generation,
                    claim.token,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn publish_archive(&self, claim: &Claim, object_key: &str) -> StoreResult<()> {
        let claim = claim.clone();
        let object_key = object_key.to_string();
        self.run("publish_archive", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, "publish", ClaimState::Archiving, now)?;
            let id = &claim.bucket;
            // Publication ends the claim: the owner and lease are cleared so cleanup can be
            // claimed at once (it still waits for min_age since publication).
            tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET state = 'archived', object_key = ?4, \
                     hot_deleted = 0, published_at = ?5, owner_token = NULL, lease_expires_at = NULL, \
                     updated_at = ?5 \
                     WHERE {BUCKET_PK} AND generation = ?6 AND owner_token = ?7"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    object_key,
                    now,
                    claim.generation,
                    claim.token,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn cleanup_step(
        &self,
        claim: &Claim,
        limit: usize,
        min_age: Duration,
    ) -> StoreResult<(u64, bool)> {
        let claim = claim.clone();
        self.run("cleanup_step", Mode::Write, move |tx, now| {
            // A repeated step after the last one committed is a no-op that reports done.
            if let Some(row) = load_meta(tx, &claim.bucket)? {
                if row.state == "archived"
                    && row.hot_deleted
                    && row.generation == claim.generation
                    && row.owner_token.as_deref() == Some(claim.token.as_str())
                {
                    return Ok((0, true));
                }
            }
            let row = verify_claim(tx, &claim, "clean up", ClaimState::Cleanup, now)?;
            let published = row
                .published_at
                .ok_or_else(|| corrupt(format!("archived bucket {} has no publication time", claim.bucket)))?;
            if plus(published, min_age) > now {
                return Err(StoreError::InvalidTransition {
                    bucket: claim.bucket.clone(),
                    operation: "clean up before min_age has passed since publication",
                    state: format!(
                        "{} published at {} (min_age {:?})",
                        row.describe(),
                        time(published, "publication time")?,
                        min_age
                    ),
                }
                .into());
            }
            let id = &claim.bucket;
            let key = params![id.table_id.as_str(), id.partition_key.as_bytes(), id.bucket_key.to_string()];
            let deleted = tx.execute(
                &format!(
                    "DELETE FROM pulpitum_v4_records WHERE {BUCKET_PK} AND (event_time, sort_key) IN \
                     (SELECT event_time, sort_key FROM pulpitum_v4_records WHERE {BUCKET_PK} \
                      ORDER BY event_time, sort_key LIMIT ?4)"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    to_i64(limit),
                ],
            )?;
            let remaining: bool = tx.query_row(
                &format!("SELECT EXISTS (SELECT 1 FROM pulpitum_v4_records WHERE {BUCKET_PK})"),
                key,
                |r| r.get(0),
            )?;
            if !remaining {
                tx.execute(
                    &format!(
                        "UPDATE pulpitum_v4_bucket_metadata SET hot_deleted = 1, updated_at = ?4 \
                         WHERE {BUCKET_PK} AND generation = ?5"
                    ),
                    params![
                        id.table_id.as_str(),
                        id.partition_key.as_bytes(),
                        id.bucket_key.to_string(),
                        now,
                        claim.generation,
                    ],
                )?;
            }
            Ok((deleted as u64, !remaining))
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
        let delay = i64::try_from(cleanup_delay.as_micros()).unwrap_or(i64::MAX);
        self.run("discover", Mode::Read, move |tx, now| {
            let mut stmt = tx.prepare_cached(
                "SELECT table_id, partition_key, bucket_key, bucket_strategy, state \
                 FROM pulpitum_v4_bucket_metadata \
                 WHERE (state = 'hot' AND bucket_end <= ?1 AND (retry_at IS NULL OR retry_at <= ?2)) \
                    OR (state = 'archiving' AND (lease_expires_at IS NULL OR lease_expires_at <= ?2)) \
                    OR (state = 'archived' AND hot_deleted = 0 \
                        AND (lease_expires_at IS NULL OR lease_expires_at <= ?2) \
                        AND published_at <= ?4) \
                 ORDER BY bucket_end, table_id, partition_key, bucket_key \
                 LIMIT ?3",
            )?;
            let published_by = now.saturating_sub(delay);
            let mut rows = stmt.query(params![
                cutoff.as_micros(),
                now,
                to_i64(limit),
                published_by
            ])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let table_id: String = r.get(0)?;
                let pk: Vec<u8> = r.get(1)?;
                let key: String = r.get(2)?;
                let strategy: String = r.get(3)?;
                let state: String = r.get(4)?;
                let kind = match state_name(&state)? {
                    "hot" => WorkKind::Eligible,
                    "archiving" => WorkKind::ExpiredClaim,
                    _ => WorkKind::CleanupPending,
                };
                out.push(WorkItem {
                    bucket: bucket_id(&table_id, &pk, &strategy, &key)?,
                    kind,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn backlog(&self, cutoff: EventTime) -> StoreResult<Backlog> {
        self.run("backlog", Mode::Read, move |tx, _| {
            let mut stmt = tx.prepare_cached(
                "SELECT (SELECT count(*) FROM pulpitum_v4_bucket_metadata \
                           WHERE state = 'hot' AND bucket_end <= ?1), \
                        (SELECT count(*) FROM pulpitum_v4_bucket_metadata \
                           WHERE state = 'archiving')",
            )?;
            let (eligible, archiving): (i64, i64) =
                stmt.query_row(params![cutoff.as_micros()], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(Backlog {
                eligible: u64::try_from(eligible).unwrap_or(0),
                archiving: u64::try_from(archiving).unwrap_or(0),
            })
        })
        .await
    }

    async fn referenced_object_keys(&self) -> StoreResult<Vec<String>> {
        self.run("referenced_object_keys", Mode::Read, |tx, _| {
            let mut stmt = tx.prepare(
                "SELECT DISTINCT object_key FROM pulpitum_v4_bucket_metadata \
                 WHERE object_key IS NOT NULL ORDER BY object_key",
            )?;
            let keys = stmt.query_map([], |r| r.get(0))?;
            Ok(keys.collect::<rusqlite::Result<Vec<String>>>()?)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ScanBounds;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn tid(s: &str) -> TableId {
        TableId::new(s).unwrap()
    }

    fn rec(pk: &[u8], micros: i64, sk: &[u8], v: &[u8]) -> Record {
        Record {
            partition_key: PartitionKey::new(pk.to_vec()).unwrap(),
            event_time: EventTime::from_micros(micros).unwrap(),
            sort_key: SortKey::new(sk.to_vec()).unwrap(),
            value: v.to_vec(),
        }
    }

    async fn store_with(def: &TableDefinition) -> SqliteStore {
        let s = SqliteStore::open_in_memory().unwrap();
        s.migrate().await.unwrap();
        s.register_table(def).await.unwrap();
        s
    }

    fn ledger(s: &SqliteStore) -> Vec<(i64, String)> {
        let c = lock(&s.inner.writer);
        let mut st = c
            .prepare("SELECT version, name FROM pulpitum_v4_schema_migrations ORDER BY version")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[tokio::test]
    async fn migrations_apply_once_and_refuse_foreign_bookkeeping() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.migrate().await.unwrap();
        s.migrate().await.unwrap();
        let want: Vec<(i64, String)> = migrate::MIGRATIONS
            .iter()
            .map(|m| (m.version, m.name.to_string()))
            .collect();
        assert_eq!(ledger(&s), want);

        lock(&s.inner.writer)
            .execute(
                "UPDATE pulpitum_v4_schema_migrations SET checksum = 'x' WHERE version = 2",
                [],
            )
            .unwrap();
        let err = s.migrate().await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Migration(m) if m.contains("different SQL")),
            "{err}"
        );

        let sum = migrate::checksum(migrate::MIGRATIONS[1].sql);
        lock(&s.inner.writer)
            .execute(
                "UPDATE pulpitum_v4_schema_migrations SET checksum = ?1 WHERE version = 2",
                [sum],
            )
            .unwrap();
        lock(&s.inner.writer)
            .execute(
                // No `requires_version`: a newer build's migration of unknown compatibility
                // counts as breaking.
                "INSERT INTO pulpitum_v4_schema_migrations (version, name, checksum, applied_at) \
                 VALUES (99, 'future', 'x', 0)",
                [],
            )
            .unwrap();
        let err = s.migrate().await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Migration(m) if m.contains("migration 99 (future)")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn registration_is_immutable_in_strategy_and_surface() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.migrate().await.unwrap();
        let mut def = TableDefinition::new(tid("chat"), BucketStrategy::CalendarDayUtc, "chat");
        def.writable_buckets = Some(3);
        assert_eq!(s.register_table(&def).await.unwrap(), def);
        assert_eq!(s.register_table(&def).await.unwrap(), def);

        let other_strategy = TableDefinition {
            strategy: BucketStrategy::CalendarMonthUtc,
            ..def.clone()
        };
        let err = s.register_table(&other_strategy).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::TableConflict { existing, requested, .. }
                if existing.contains("calendar_day_utc") && requested.contains("calendar_month_utc")),
            "{err}"
        );
        let other_surface = TableDefinition {
            surface: "raw".into(),
            ..def.clone()
        };
        assert!(matches!(
            s.register_table(&other_surface).await,
            Err(StoreError::TableConflict { .. })
        ));
        // A different guard is not a conflict: the stored row is returned unchanged.
        let other_guard = TableDefinition {
            writable_buckets: None,
            ..def.clone()
        };
        assert_eq!(s.register_table(&other_guard).await.unwrap(), def);

        let raw = TableDefinition::new(tid("audit"), BucketStrategy::CalendarYearUtc, "raw");
        s.register_table(&raw).await.unwrap();
        assert_eq!(s.tables().await.unwrap(), vec![raw.clone(), def.clone()]);
        assert_eq!(s.table(&tid("chat")).await.unwrap(), Some(def));
        assert_eq!(s.table(&tid("nope")).await.unwrap(), None);
    }

    #[tokio::test]
    async fn append_is_insert_if_absent_and_typed() {
        let def = TableDefinition::new(tid("t"), BucketStrategy::CalendarYearUtc, "raw");
        let s = store_with(&def).await;
        let r = rec(b"p", 1_700_000_000_000_000, b"a", b"v1");
        assert!(matches!(
            s.append(&tid("unknown"), &r).await,
            Err(StoreError::UnknownTable(_))
        ));
        assert_eq!(
            s.append(&tid("t"), &r).await.unwrap(),
            AppendOutcome::Inserted
        );
        assert_eq!(
            s.append(&tid("t"), &r).await.unwrap(),
            AppendOutcome::AlreadyPresent
        );
        let changed = Record {
            value: b"v2".to_vec(),
            ..r.clone()
        };
        let err = s.append(&tid("t"), &changed).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::DuplicateKey { sort_key, .. } if sort_key == "61"),
            "{err}"
        );
        let id = BucketId::of_record(&tid("t"), def.strategy, &r);
        let meta = s.bucket(&id).await.unwrap().unwrap();
        assert_eq!(meta.state, BucketState::Hot);
        assert_eq!(meta.generation, 0);
        assert_eq!(meta.owner_token, None);
        let page = s
            .read_page(
                &id,
                &PageRequest {
                    bounds: ScanBounds::all(),
                    descending: false,
                    limit: 10,
                    include_value: true,
                },
            )
            .await
            .unwrap();
        assert_eq!(page, HotPage::hot(BucketState::Hot, &[r], true));
    }

    #[tokio::test]
    async fn writable_bucket_guard_rejects_old_buckets_and_writes_nothing() {
        let mut def = TableDefinition::new(tid("g"), BucketStrategy::CalendarDayUtc, "raw");
        def.writable_buckets = Some(2);
        let s = store_with(&def).await;
        let now = s.now().await.unwrap().as_micros();
        let day = 86_400_000_000;
        let old = rec(b"p", now - 3 * day, b"", b"x");
        let err = s.append(&tid("g"), &old).await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::NotWritable {
                    writable_buckets: 2,
                    ..
                }
            ),
            "{err}"
        );
        let id = BucketId::of_record(&tid("g"), def.strategy, &old);
        assert_eq!(s.bucket(&id).await.unwrap(), None);
        // Yesterday is the second-newest bucket: accepted.
        let recent = rec(b"p", now - day, b"", b"x");
        assert_eq!(
            s.append(&tid("g"), &recent).await.unwrap(),
            AppendOutcome::Inserted
        );
        // A batch with one guarded record commits nothing.
        let err = s
            .append_batch(&tid("g"), &[rec(b"q", now, b"", b"x"), old.clone()])
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NotWritable { .. }));
        let q = BucketId::of_record(&tid("g"), def.strategy, &rec(b"q", now, b"", b""));
        assert_eq!(s.bucket(&q).await.unwrap(), None);
    }

    fn random_bounds(rng: &mut StdRng, times: &[i64], keys: &[Vec<u8>]) -> ScanBounds {
        let t = |rng: &mut StdRng| {
            EventTime::from_micros(times[rng.random_range(0..times.len())]).unwrap()
        };
        let k =
            |rng: &mut StdRng| SortKey::new(keys[rng.random_range(0..keys.len())].clone()).unwrap();
        let tb = |rng: &mut StdRng| match rng.random_range(0..3) {
            0 => Bound::Unbounded,
            1 => Bound::Included(t(rng)),
            _ => Bound::Excluded(t(rng)),
        };
        let kb = |rng: &mut StdRng| match rng.random_range(0..4) {
            0 | 1 => Bound::Unbounded,
            2 => Bound::Included(k(rng)),
            _ => Bound::Excluded(k(rng)),
        };
        let ck = |rng: &mut StdRng| {
            rng.random_bool(0.4).then(|| ClusteringKey {
                event_time: t(rng),
                sort_key: k(rng),
            })
        };
        ScanBounds {
            time_lower: tb(rng),
            time_upper: tb(rng),
            sort_lower: kb(rng),
            sort_upper: kb(rng),
            after: ck(rng),
            before: ck(rng),
        }
    }

    /// `read_page` must agree exactly with the reference filter `ScanBounds::matches`, in
    /// both orders, with limits and without values.
    #[tokio::test]
    async fn read_page_applies_bounds_like_the_reference_filter() {
        let def = TableDefinition::new(tid("b"), BucketStrategy::CalendarYearUtc, "raw");
        let s = store_with(&def).await;
        let base = 1_700_000_000_000_000;
        let times: Vec<i64> = (0..8).map(|i| base + i * 1_000).collect();
        // Keys that differ in length and in a byte >= 0x80, where bytewise order matters.
        let keys: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![1],
            vec![0x7f],
            vec![0x80],
            vec![0xff, 1],
        ];
        let mut all = Vec::new();
        for &t in &times {
            for k in &keys {
                all.push(rec(b"p", t, k, &[k.len() as u8, (t % 251) as u8]));
            }
        }
        let out = s.append_batch(&tid("b"), &all).await.unwrap();
        assert_eq!(out.inserted, all.len() as u64);
        all.sort_by_key(Record::clustering_key);
        let id = BucketId::of_record(&tid("b"), def.strategy, &all[0]);
        let mut rng = StdRng::seed_from_u64(7);
        let mut nonempty = 0;
        for _ in 0..300 {
            let bounds = random_bounds(&mut rng, &times, &keys);
            let descending = rng.random_bool(0.5);
            let include_value = rng.random_bool(0.5);
            let limit = rng.random_range(1..70);
            let mut want: Vec<Record> = all.iter().filter(|r| bounds.matches(r)).cloned().collect();
            if descending {
                want.reverse();
            }
            want.truncate(limit);
            if !include_value {
                for r in &mut want {
                    r.value.clear();
                }
            }
            nonempty += usize::from(!want.is_empty());
            let req = PageRequest {
                bounds: bounds.clone(),
                descending,
                limit,
                include_value,
            };
            let HotPage::Hot { state, rows } = s.read_page(&id, &req).await.unwrap() else {
                panic!("bucket should be hot");
            };
            assert_eq!(state, BucketState::Hot);
            assert_eq!(
                crate::model::batch_to_records(&rows).unwrap(),
                want,
                "bounds {bounds:?} desc {descending} limit {limit}"
            );
        }
        assert!(
            nonempty > 100,
            "the random bounds should mostly select rows ({nonempty})"
        );
    }

    #[tokio::test]
    async fn file_store_is_durable_wal_and_creates_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/deeper/hot.sqlite");
        let def = TableDefinition::new(tid("f"), BucketStrategy::CalendarMonthUtc, "raw");
        let r = rec(b"p", 1_700_000_000_000_000, b"k", b"v");
        {
            let s = SqliteStore::open(&path).unwrap();
            assert_eq!(s.path(), Some(path.as_path()));
            s.migrate().await.unwrap();
            s.register_table(&def).await.unwrap();
            s.append(&tid("f"), &r).await.unwrap();
            let c = lock(&s.inner.writer);
            let mode: String = c
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
            let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
            assert_eq!(sync, 2, "synchronous must be FULL");
        }
        let s = SqliteStore::open(&path).unwrap();
        s.migrate().await.unwrap();
        assert_eq!(s.tables().await.unwrap(), vec![def.clone()]);
        assert_eq!(
            s.append(&tid("f"), &r).await.unwrap(),
            AppendOutcome::AlreadyPresent
        );
        // Readers are read-only connections.
        let reader = lock(&s.inner.readers[0]);
        assert!(reader
            .execute("DELETE FROM pulpitum_v4_records", [])
            .is_err());
    }
}
