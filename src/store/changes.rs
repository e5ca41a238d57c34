//! The values of row changes (`DELETE`, `UPDATE`) and of retention, shared by both backends.
//!
//! A statement's changes arrive as [`RowChange`]s, each naming one row by its clustering key
//! and carrying the value the statement read (so a row changed by someone else since is
//! noticed, never overwritten blind). The store applies them in one serializable
//! transaction: a Hot bucket's rows are deleted or updated in place, under the same fence as
//! appends (a bucket being archived refuses the whole statement with a retryable error);
//! an Archived bucket's rows are masked by a [`RowMask`] in `pulpitum_v4_row_masks`, which
//! every archived read applies above the archive reader. Masks live until a physical
//! rewrite of the objects retires them (not built yet); retention removes whole buckets and
//! their masks ([`ExpiredBucket`]).

use std::collections::BTreeMap;

use super::StoreError;
use crate::model::{BucketId, BucketStrategy, EventTime, PartitionKey, SortKey, TableId};

/// One row a `DELETE` or `UPDATE` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowChange {
    /// The row's partition.
    pub partition_key: PartitionKey,
    /// The row's event time.
    pub event_time: EventTime,
    /// The row's sort key.
    pub sort_key: SortKey,
    /// The value the statement read: the change applies only while the row still holds it.
    pub old_value: Vec<u8>,
    /// The new value (`UPDATE`), or `None` to delete the row.
    pub new_value: Option<Vec<u8>>,
}

/// What a change set did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChangeOutcome {
    /// Hot rows deleted or updated in place.
    pub hot: u64,
    /// Archived rows masked (a delete or edit record written).
    pub masked: u64,
}

impl ChangeOutcome {
    /// Rows changed in total: the count returned to the client.
    pub fn total(&self) -> u64 {
        self.hot + self.masked
    }
}

/// A delete or edit record over one archived row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMask {
    /// The row's event time.
    pub event_time: EventTime,
    /// The row's sort key.
    pub sort_key: SortKey,
    /// The row's new value (an edit), or `None` (deleted).
    pub value: Option<Vec<u8>>,
}

/// A bucket retention removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredBucket {
    /// The bucket.
    pub bucket: BucketId,
    /// Its state when it was removed (`hot` or `archived`).
    pub state: &'static str,
    /// Its fencing generation when it was removed (the job history names the removal by
    /// the next one).
    pub generation: i64,
    /// Its route's object key, if it was archived.
    pub object_key: Option<String>,
    /// Hot rows deleted with it.
    pub rows: u64,
    /// Whether its object was recorded as retired for garbage collection: an archived
    /// bucket's per-bucket object, or a segment once no other bucket routes to it (the last
    /// bucket of a segment to go retires it; garbage collection keeps it for the retirement
    /// delay after that, so a hot-store backup from before the retention still restores).
    /// Rows of removed buckets stay in a segment shared with buckets that remain until the
    /// segment is rewritten or its last bucket goes.
    pub retired: bool,
}

/// One bucket's changes.
pub(super) type BucketChanges<'a> = (BucketId, Vec<&'a RowChange>);

/// A mask found over a changed row: its event time, sort key and value (`None`: deleted).
pub(super) type FoundMask = (EventTime, Vec<u8>, Option<Vec<u8>>);

/// A change set's rows grouped by bucket, in bucket order (so two change sets lock buckets
/// in the same order).
pub(super) fn by_bucket<'a>(
    table_id: &TableId,
    strategy: BucketStrategy,
    changes: &'a [RowChange],
) -> Vec<BucketChanges<'a>> {
    let mut groups: BTreeMap<(Vec<u8>, String), BucketChanges<'a>> = BTreeMap::new();
    for c in changes {
        let key = strategy.bucket_of(c.event_time);
        groups
            .entry((c.partition_key.as_bytes().to_vec(), key.to_string()))
            .or_insert_with(|| {
                (
                    BucketId {
                        table_id: table_id.clone(),
                        partition_key: c.partition_key.clone(),
                        bucket_key: key,
                    },
                    Vec::new(),
                )
            })
            .1
            .push(c);
    }
    groups.into_values().collect()
}

/// `DELETE` when every change deletes, else `UPDATE`.
pub(super) fn operation(changes: &[RowChange]) -> &'static str {
    if changes.iter().all(|c| c.new_value.is_none()) {
        "DELETE"
    } else {
        "UPDATE"
    }
}

/// The conflict of a change whose row no longer holds what the statement read.
pub(super) fn conflict(operation: &'static str, detail: String) -> StoreError {
    StoreError::ChangeConflict { operation, detail }
}

/// Checks the masks found over an archived bucket's changed rows against the values the
/// statement read: a deleted row, or an edit to another value, means the row changed since.
pub(super) fn check_masks(
    operation: &'static str,
    bucket: &BucketId,
    rows: &[&RowChange],
    found: &[FoundMask],
) -> Result<(), StoreError> {
    // Keyed once: a statement over tens of thousands of archived rows that already carry
    // masks would otherwise compare every mask with every row.
    let by_key: std::collections::HashMap<(EventTime, &[u8]), &RowChange> = rows
        .iter()
        .map(|c| ((c.event_time, c.sort_key.as_bytes()), *c))
        .collect();
    for (t, s, value) in found {
        let Some(c) = by_key.get(&(*t, s.as_slice())) else {
            continue;
        };
        match value {
            None => {
                return Err(conflict(
                    operation,
                    format!("a row of {bucket} was deleted since the statement read it"),
                ))
            }
            Some(v) if *v != c.old_value => {
                return Err(conflict(
                    operation,
                    format!("a row of {bucket} was updated since the statement read it"),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}
