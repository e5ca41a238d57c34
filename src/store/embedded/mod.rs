//! The embedded hot tier: [`SqliteStore`] implements [`HotStore`] on one SQLite file, so
//! Pulpitum runs on a machine with no database server.
//!
//! # What it is
//!
//! It keeps the same tables and columns as the PostgreSQL store (keys as BLOBs, times as
//! INTEGER microseconds since the epoch, the state as TEXT) and the same fencing rules, and it
//! runs the same conformance suite (`tests/conformance/`).
//!
//! # Transactions and locking
//!
//! Each trait call is one SQLite transaction, run by [`SqliteStore::run`] in one of two
//! [`Mode`]s. Writers open it with `BEGIN IMMEDIATE`, which takes the database's single write
//! lock before the first read, so the fence check and the write that depends on it cannot
//! interleave with any other writer, in this process or another one. Readers use deferred
//! transactions on separate connections: in WAL mode each sees one consistent snapshot for
//! the whole transaction, which gives `read_page` and `snapshot_page` the "route and rows
//! from one snapshot" guarantee. A transaction that finds the database busy (another
//! process holds the lock past the busy timeout) is retried whole, a bounded number of times.
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
//!
//! # Where each role lives
//!
//! This file holds the store, its connections and the transaction runner. Each role of the
//! contract has its own file, with the SQL it runs beside it:
//! - `catalog.rs`: [`Catalog`] (migrations, table registration and lookup, the clock);
//! - `append.rs`: [`Appends`] (the Hot fence and insert-if-absent);
//! - `reads.rs`: [`RoutedReads`] (bucket listings and pages; the head read is the trait's
//!   default);
//! - `lifecycle.rs`: [`Lifecycle`] (claims, snapshots, publication, cleanup, discovery);
//! - `control.rs`: [`Control`](crate::store::Control) (policies, the store-wide pause, job
//!   history);
//! - `compaction.rs`: [`Compaction`](crate::store::Compaction) (window claims, a window's
//!   sources, the route switch, retired objects);
//! - `decode.rs`: bucket metadata rows and their conversion, shared by all roles;
//! - `migrate.rs`: the numbered migrations and their runner.
//!
//! [`HotStore`]: crate::store::HotStore
//! [`Catalog`]: crate::store::Catalog
//! [`Appends`]: crate::store::Appends
//! [`RoutedReads`]: crate::store::RoutedReads
//! [`Lifecycle`]: crate::store::Lifecycle

mod append;
mod catalog;
mod changes;
mod compaction;
mod control;
mod decode;
mod lifecycle;
mod migrate;
mod reads;
#[cfg(test)]
mod test_support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use super::{StoreError, StoreResult};

/// How long one SQLite call waits for another process's write lock before it reports busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Attempts of a whole transaction that keeps finding the database busy.
const MAX_ATTEMPTS: u32 = 4;

/// Read-only connections of a file-backed store (reads then never wait for the writer).
const READERS: usize = 2;

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
        // A caller that stops waiting (a statement timed out or cancelled) drops this future,
        // but not the blocking call: without a word it would commit what its caller was told
        // did not happen. The flag tells the transaction to roll back instead, if it has not
        // committed yet.
        // A statement's gate (the wire server's), read here on its task: its writes commit
        // only if it has not been abandoned (see `store::gate`).
        let abandoned = Abandoned::default();
        let flag = Arc::clone(&abandoned.0);
        let statement = crate::store::gate::current();
        let result = tokio::task::spawn_blocking(move || {
            inner.run_blocking(operation, mode, &mut body, &flag, statement.as_deref())
        })
        .await
        .map_err(|e| backend(operation, format!("store worker failed: {e}")))?;
        abandoned.disarm();
        result
    }
}

/// Set when the future waiting for a store call is dropped before the call returned.
#[derive(Default)]
struct Abandoned(Arc<AtomicBool>, bool);

impl Abandoned {
    fn disarm(mut self) {
        self.1 = true;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
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
        abandoned: &AtomicBool,
        statement: Option<&crate::store::gate::CommitGate>,
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
                        // Nobody waits for this write any more: roll it back (dropping
                        // `tx`) rather than commit what its caller reported as not done.
                        Ok(_)
                            if mode == Mode::Write
                                && (abandoned.load(Ordering::SeqCst)
                                    || !crate::store::gate::may_commit(statement)) =>
                        {
                            return Err(backend(operation, "abandoned by its caller; rolled back"));
                        }
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

#[cfg(test)]
mod tests {
    use super::test_support::{rec, tid};
    use super::*;
    use crate::model::BucketStrategy;
    use crate::store::{AppendOutcome, Appends, Catalog, TableDefinition};

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
