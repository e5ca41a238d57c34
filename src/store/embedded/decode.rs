//! Decoding the embedded store's rows into the store's types, and the shared keys of its SQL.
//!
//! Every role reads bucket metadata ([`MetaRow`], loaded by [`load_meta`]) and most read
//! records ([`record_from`]); the conversions live here once so each role file holds only its
//! own statements. A stored value that does not convert (an unknown state, a time outside
//! the supported range, a malformed key) is [`StoreError::Corrupt`]: the file was written by
//! something that broke the schema's invariants, and no retry will fix it.

use rusqlite::types::Value;
use rusqlite::{params, OptionalExtension, Transaction};

use crate::model::{
    BucketId, BucketKey, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use crate::store::{BucketMeta, BucketState, StoreError};

use super::{TxError, TxResult};

/// The metadata columns every bucket query selects, in the order [`meta_from_row`] reads.
pub(super) const META_COLUMNS: &str =
    "table_id, partition_key, bucket_key, bucket_strategy, state, owner_token, \
     generation, lease_expires_at, retry_at, object_key, hot_deleted, published_at";

/// The primary-key predicate of one bucket, binding `?1..?3`.
pub(super) const BUCKET_PK: &str = "table_id = ?1 AND partition_key = ?2 AND bucket_key = ?3";

/// A count or limit as SQLite's INTEGER (saturating; no real count comes near the cap).
pub(super) fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stored microsecond time as an [`EventTime`]; out of range is corruption, named by `what`.
pub(super) fn time(micros: i64, what: &str) -> TxResult<EventTime> {
    EventTime::from_micros(micros)
        .map_err(|e| TxError::Store(StoreError::Corrupt(format!("{what} {micros}: {e}"))))
}

/// A stored value that breaks the schema's invariants.
pub(super) fn corrupt(msg: String) -> TxError {
    TxError::Store(StoreError::Corrupt(msg))
}

/// A stored state checked against the three known ones.
pub(super) fn state_name(s: &str) -> TxResult<&'static str> {
    match s {
        "hot" => Ok("hot"),
        "archiving" => Ok("archiving"),
        "archived" => Ok("archived"),
        other => Err(corrupt(format!("unknown bucket state {other:?}"))),
    }
}

/// One metadata row as stored, before conversion.
pub(super) struct MetaRow {
    table_id: String,
    partition_key: Vec<u8>,
    bucket_key: String,
    strategy: String,
    pub(super) state: String,
    pub(super) owner_token: Option<String>,
    pub(super) generation: i64,
    pub(super) lease_expires_at: Option<i64>,
    pub(super) retry_at: Option<i64>,
    object_key: Option<String>,
    pub(super) hot_deleted: bool,
    pub(super) published_at: Option<i64>,
}

/// Reads one row selected with [`META_COLUMNS`].
pub(super) fn meta_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MetaRow> {
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

    pub(super) fn state(&self) -> TxResult<BucketState> {
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

    pub(super) fn to_meta(&self) -> TxResult<BucketMeta> {
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
    pub(super) fn lease_held(&self, now: i64) -> bool {
        self.lease_expires_at.is_some_and(|t| t > now)
    }

    /// A short description for error reasons.
    pub(super) fn describe(&self) -> String {
        match self.state.as_str() {
            "archived" if self.hot_deleted => "archived (hot rows deleted)".to_string(),
            "archived" => "archived (hot rows retained)".to_string(),
            s => s.to_string(),
        }
    }
}

/// A bucket's identity from its stored key columns.
pub(super) fn bucket_id(
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

/// One bucket's metadata row, if it has one.
pub(super) fn load_meta(tx: &Transaction<'_>, id: &BucketId) -> TxResult<Option<MetaRow>> {
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

/// A record of `partition_key` from its stored clustering key and value.
pub(super) fn record_from(
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

/// The bucket's primary key as positional parameters, for statements built at run time.
pub(super) fn bucket_args(id: &BucketId) -> Vec<Value> {
    vec![
        Value::Text(id.table_id.as_str().to_string()),
        Value::Blob(id.partition_key.as_bytes().to_vec()),
        Value::Text(id.bucket_key.to_string()),
    ]
}
