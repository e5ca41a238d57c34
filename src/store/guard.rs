//! The writable-bucket guard: which buckets a table accepts appends into at the store's
//! "now". Both backends apply it inside their append transaction.

use std::time::Duration;

use super::{StoreError, StoreResult, TableDefinition};
use crate::model::{BucketId, BucketKey, EventTime, Record};

/// How far ahead of the store's clock an append may be and still count as "now" for the
/// writable-bucket guard: writers' clocks run a little ahead of the database's, and a
/// message stamped a second after midnight by such a writer belongs to the new day's
/// bucket, not to a refused one.
pub const WRITABLE_CLOCK_ALLOWANCE: Duration = Duration::from_secs(300);

/// The buckets a table's guard accepts at `now`, oldest and newest, or `None` when the
/// table has no guard: the newest `writable_buckets` buckets ending with the bucket of
/// `now`, plus the bucket of `now +` [`WRITABLE_CLOCK_ALLOWANCE`] when that is the next one.
pub fn writable_range(def: &TableDefinition, now: EventTime) -> Option<(BucketKey, BucketKey)> {
    let n = def.writable_buckets?;
    let current = def.strategy.bucket_of(now);
    let mut oldest = current;
    for _ in 1..n.max(1) {
        match oldest.prev() {
            Some(p) => oldest = p,
            None => break,
        }
    }
    let allowance = i64::try_from(WRITABLE_CLOCK_ALLOWANCE.as_micros()).unwrap_or(i64::MAX);
    let newest = EventTime::from_micros(now.as_micros().saturating_add(allowance))
        .map(|t| def.strategy.bucket_of(t))
        .unwrap_or(current);
    Some((oldest, newest))
}

/// Helper shared by both stores: the bucket a record lands in, with the guard applied
/// (see [`writable_range`]). A bucket in the future is refused like an old one: a writer
/// whose clock or data is years off would otherwise create buckets the archiver cannot
/// reach for years, out of sight of every "latest" read.
pub fn bucket_for_append(
    def: &TableDefinition,
    record: &Record,
    now: EventTime,
) -> StoreResult<BucketId> {
    let id = BucketId::of_record(&def.table_id, def.strategy, record);
    if let (Some(n), Some((oldest, newest))) = (def.writable_buckets, writable_range(def, now)) {
        let start = id.bucket_key.start();
        if start < oldest.start() || start > newest.start() {
            return Err(StoreError::NotWritable {
                bucket: id,
                writable_buckets: n,
                oldest,
                newest,
            });
        }
    }
    Ok(id)
}
