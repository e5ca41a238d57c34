//! The record model: table identity, opaque keys, microsecond event times, records, time
//! buckets and scan bounds. Pure values and validation only; nothing here performs I/O, so
//! every other layer (hot store, archive, archiver, SQL provider) can share these types and
//! the rules they enforce.

mod bounds;
mod bucket;
pub mod envelope;
mod int_key;
mod keys;
pub mod schema;
mod time;

pub use bounds::{ClusteringKey, ScanBounds};
pub use bucket::{BucketId, BucketKey, BucketStrategy};
pub use envelope::{batch_to_records, envelope_schema, records_to_batch, EnvelopeBuilder};
pub use int_key::{decode_i64, encode_i64};
pub use keys::{PartitionKey, Record, SortKey, TableId, MAX_KEY_LEN, MAX_TABLE_ID_LEN};
pub use time::{EventTime, MAX_SUPPORTED_YEAR, MIN_SUPPORTED_YEAR};

/// The record schema version: the layout of a record's fields, written into every table
/// registration, archive manifest and payload, and checked wherever one is read. The one
/// definition every tier uses.
pub const RECORD_SCHEMA_VERSION: u32 = 2;

/// Every way a value can fail model validation. Each variant names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A table id that is empty, too long or uses characters outside `[a-z0-9_]`.
    #[error("invalid table id {id:?}: {reason}")]
    InvalidTableId {
        /// The rejected id.
        id: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A partition or sort key longer than [`MAX_KEY_LEN`] (or an empty partition key).
    #[error("invalid {kind} key of {len} bytes: {reason}")]
    InvalidKey {
        /// `partition` or `sort`.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A timestamp with sub-microsecond digits: the hot store keeps microseconds, and silently
    /// truncating would make two distinct records collide or reorder.
    #[error("event time {0} has sub-microsecond precision; the store keeps microseconds")]
    SubMicrosecondTime(String),
    /// A timestamp outside the supported range of years.
    #[error("event time {0} is outside the supported range {MIN_SUPPORTED_YEAR}-01-01 .. {MAX_SUPPORTED_YEAR}-12-31 UTC")]
    TimeOutOfRange(String),
    /// A bucket strategy name that is not one of the built-in strategies.
    #[error("unknown bucket strategy {0:?} (expected calendar_year_utc, calendar_month_utc or calendar_day_utc)")]
    UnknownStrategy(String),
    /// An envelope batch without the columns or types of the envelope.
    #[error("not an envelope batch: {0}")]
    Envelope(String),
    /// A bucket key that is not the canonical form of the expected strategy.
    #[error("malformed bucket key {key:?}: {reason}")]
    MalformedBucketKey {
        /// The rejected key.
        key: String,
        /// Why it was rejected.
        reason: String,
    },
}
