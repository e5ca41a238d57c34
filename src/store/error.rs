//! The store's one error type, shared by every role and both backends, so a caller matches
//! the same variants whichever database answered.

use crate::model::{BucketId, BucketKey, EventTime, ModelError, TableId};

/// Every way a hot-store operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A `DELETE` or `UPDATE` met a bucket that is being archived (write-fenced); nothing
    /// was changed. Retryable: the bucket is published within the archiver's lease.
    #[error("bucket {bucket} is being archived: {operation} is refused until it is published (seconds); nothing was changed, retry the statement")]
    BeingArchived {
        /// The bucket.
        bucket: BucketId,
        /// `DELETE` or `UPDATE`.
        operation: &'static str,
    },
    /// A `DELETE` or `UPDATE` found a row changed or removed since the statement read it;
    /// nothing was changed. Retryable: reading again sees the new state.
    #[error("{operation}: {detail}; nothing was changed, retry the statement")]
    ChangeConflict {
        /// `DELETE` or `UPDATE`.
        operation: &'static str,
        /// What changed.
        detail: String,
    },
    /// Input that violates the model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The table id is not registered.
    #[error("table {0} is not registered")]
    UnknownTable(TableId),
    /// A schema change that lost a race: the table's schema is no longer the version the
    /// change was made from (another change was stored first). Nothing was written.
    #[error("table {table_id}: the schema changed while this change was made (it was made from version {from}, the newest is {newest}); nothing was changed, run the statement again")]
    SchemaChanged {
        /// The table.
        table_id: TableId,
        /// The version the change started from.
        from: u32,
        /// The newest stored version.
        newest: u32,
    },
    /// Registering an existing table id with a different definition.
    #[error("table {table_id} is already registered as {existing}; requested {requested} (the bucket strategy and surface of a table are immutable)")]
    TableConflict {
        /// The table.
        table_id: TableId,
        /// The stored definition, summarised.
        existing: String,
        /// The requested definition, summarised.
        requested: String,
    },
    /// The append targets a bucket that is not Hot: it is being archived or is archived.
    #[error("bucket {bucket} is {state}: writes are fenced")]
    Fenced {
        /// The bucket.
        bucket: BucketId,
        /// Its state name.
        state: &'static str,
    },
    /// The append falls outside the table's writable-bucket guard: older than the newest N
    /// buckets, or later than the bucket of the store's clock (plus
    /// [`super::WRITABLE_CLOCK_ALLOWANCE`]).
    #[error(
        "bucket {bucket} is outside the table's writable buckets: writable_buckets = {writable_buckets} \
         accepts {oldest} to {newest} by the store's clock"
    )]
    NotWritable {
        /// The bucket.
        bucket: BucketId,
        /// The configured guard.
        writable_buckets: u32,
        /// The oldest bucket the guard accepted at the time of the append.
        oldest: BucketKey,
        /// The newest bucket the guard accepted at the time of the append.
        newest: BucketKey,
    },
    /// A different value already exists under the same physical key.
    #[error("a different record already exists in {bucket} at event_time {event_time}, sort_key {sort_key}")]
    DuplicateKey {
        /// The bucket.
        bucket: BucketId,
        /// Event time of the key.
        event_time: EventTime,
        /// Sort key, displayed as hex.
        sort_key: String,
    },
    /// The caller's claim is not current: another token or generation, an expired lease, or
    /// the bucket is in another state. Nothing was written.
    #[error("claim on {bucket} (generation {generation}) is stale: {reason}")]
    StaleClaim {
        /// The bucket.
        bucket: BucketId,
        /// The generation the caller held.
        generation: i64,
        /// What the store found instead.
        reason: String,
    },
    /// The caller's compaction claim on a window is not current: another token or
    /// generation holds the window, the lease expired, or the claim was released. Nothing was
    /// written.
    #[error("compaction claim on {table_id} window {window_key} (generation {generation}) is stale: {reason}")]
    StaleCompaction {
        /// The table.
        table_id: TableId,
        /// The window.
        window_key: String,
        /// The generation the caller held.
        generation: i64,
        /// What the store found instead.
        reason: String,
    },
    /// A route switch cannot be applied as asked: this bucket (the first such of the switch)
    /// no longer routes to the object the compaction read (a re-archive or another
    /// compaction moved it), is not archived with its hot rows deleted, or lies outside the
    /// claimed window. Nothing was switched; the attempt's objects are orphans.
    #[error("route of bucket {bucket} cannot be switched: {reason}; nothing was switched")]
    RouteChanged {
        /// The bucket.
        bucket: BucketId,
        /// What the store found.
        reason: String,
    },
    /// A transition that the bucket's current state does not allow (for example cleanup
    /// before publication, or publishing twice).
    #[error("bucket {bucket}: cannot {operation} in state {state}")]
    InvalidTransition {
        /// The bucket.
        bucket: BucketId,
        /// The refused operation.
        operation: &'static str,
        /// The state found.
        state: String,
    },
    /// The commit's outcome is unknown (40003, or the connection dropped during COMMIT). The
    /// caller must re-read durable state to learn whether it took effect.
    #[error("outcome of {operation} is unknown: {detail}")]
    OutcomeUnknown {
        /// The operation.
        operation: &'static str,
        /// The underlying error.
        detail: String,
    },
    /// Serialization conflicts persisted past the retry budget.
    #[error("{operation} kept conflicting after {attempts} attempts: {detail}")]
    RetriesExhausted {
        /// The operation.
        operation: &'static str,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        detail: String,
    },
    /// A stored row that does not decode (a corrupted or foreign value).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// Migration bookkeeping disagrees with this build (edited or unknown migrations).
    #[error("migration error: {0}")]
    Migration(String),
    /// The database lacks migrations this build needs (or has no Pulpitum schema at all).
    /// Starts only check the schema; applying migrations is the schema owner's explicit step.
    #[error("the hot store's schema is behind this build: {detail}; run `pulpitum migrate` (or `pulpitum-archiver migrate`) with the same database URL, as the role that owns the schema (docs/operations.md, \"Upgrade and rollback\")")]
    SchemaBehind {
        /// Which migrations are missing.
        detail: String,
    },
    /// The database role lacks a privilege the operation needs (SQLSTATE 42501). Not
    /// retryable: the grants must change, or the operation is not this role's.
    #[error("permission denied during {operation}: {detail}; the database role lacks a grant this needs (docs/permissions.md, \"Database\", lists the grants of each role; a read-only role can only read)")]
    PermissionDenied {
        /// The operation.
        operation: &'static str,
        /// The server's message (which names the table).
        detail: String,
    },
    /// Bad connection settings.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A database session the store must not run on: a setting that the fence or the
    /// store's isolation from other schemas relies on has another value (see
    /// `postgres::session`). Not retryable: the deployment must change.
    #[error("unsafe database session: {setting} is {value:?}, the store needs {required:?} (were the connection's startup options dropped, by a pooler for one? set it for the role or database instead)")]
    UnsafeSession {
        /// The session setting.
        setting: &'static str,
        /// The value the session has.
        value: String,
        /// The value the store needs.
        required: String,
    },
    /// Any other database or I/O failure (retryable by the caller).
    #[error("database error during {operation}: {detail}")]
    Backend {
        /// The operation.
        operation: &'static str,
        /// The underlying error.
        detail: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed. A stale claim (a bucket's or a
    /// window's) and a changed route are final for the attempt that met them: retrying the
    /// same call can only meet them again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::OutcomeUnknown { .. }
                | Self::RetriesExhausted { .. }
                | Self::Backend { .. }
                | Self::BeingArchived { .. }
                | Self::ChangeConflict { .. }
        )
    }
}

/// Result alias for store operations.
pub type StoreResult<T> = Result<T, StoreError>;
