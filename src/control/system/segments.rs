//! The compaction side of the system tables: `pulpitum_compactions` (the window claims that
//! are held now, live or expired) and `pulpitum_retired_objects` (the objects a compaction
//! switch replaced, waiting for garbage collection).
//!
//! Both are read whole from the store when the plan executes. A claim's owner token is a
//! fencing credential and is never shown: the window, generation and lease say who holds
//! what for how long. A retired object's deletion time is not shown either, because it
//! depends on the archiver's configuration (its retirement delay), which the store does not
//! know; docs/system-tables.md says how to compute it.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field};

use super::{text_array, time_array, ts};
use crate::model::EventTime;
use crate::store::{CompactionClaim, RetiredObject};

/// The columns of `pulpitum_compactions`.
pub(super) fn compaction_fields() -> Vec<Field> {
    vec![
        Field::new("table_id", DataType::Utf8, false),
        Field::new("window_key", DataType::Utf8, false),
        ts("window_start", false),
        ts("window_end", false),
        Field::new("generation", DataType::Int64, false),
        ts("lease_expires_at", false),
        Field::new("lease_expired", DataType::Boolean, false),
    ]
}

/// The columns of `pulpitum_retired_objects`.
pub(super) fn retired_fields() -> Vec<Field> {
    vec![
        Field::new("object_key", DataType::Utf8, false),
        ts("retired_at", false),
    ]
}

/// Rows of `pulpitum_compactions`; `now` is the store's clock, which decides leases.
pub(super) fn compaction_columns(claims: &[CompactionClaim], now: EventTime) -> Vec<ArrayRef> {
    vec![
        text_array(
            claims
                .iter()
                .map(|c| Some(c.table_id.to_string()))
                .collect(),
        ),
        text_array(claims.iter().map(|c| Some(c.window_key.clone())).collect()),
        time_array(
            claims
                .iter()
                .map(|c| Some(c.window_start.as_micros()))
                .collect(),
        ),
        time_array(
            claims
                .iter()
                .map(|c| Some(c.window_end.as_micros()))
                .collect(),
        ),
        Arc::new(Int64Array::from(
            claims.iter().map(|c| c.generation).collect::<Vec<_>>(),
        )),
        time_array(
            claims
                .iter()
                .map(|c| Some(c.lease_expires_at.as_micros()))
                .collect(),
        ),
        Arc::new(BooleanArray::from(
            claims
                .iter()
                .map(|c| c.lease_expires_at <= now)
                .collect::<Vec<_>>(),
        )),
    ]
}

/// Rows of `pulpitum_retired_objects`.
pub(super) fn retired_columns(objects: &[RetiredObject]) -> Vec<ArrayRef> {
    vec![
        text_array(objects.iter().map(|o| Some(o.object_key.clone())).collect()),
        time_array(
            objects
                .iter()
                .map(|o| Some(o.retired_at.as_micros()))
                .collect(),
        ),
    ]
}
