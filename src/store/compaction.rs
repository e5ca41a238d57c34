//! The values of segment compaction's registry (docs/segments.md, sections 5 to 7): a claim
//! on one window of one table, the archived buckets a window holds, the route switches that
//! move buckets from their per-bucket objects to segments, and the objects a switch retired.
//!
//! A window claim follows the protocol of a bucket claim (a fresh owner token, the next
//! generation, a lease on the store's clock) but lives in its own table
//! (`pulpitum_v4_compactions`), so compacting a window never fences a bucket: the buckets it
//! reads are already archived and immutable, and the switch itself checks each bucket's
//! route. Window keys are opaque text to the store; the compactor chooses them from the
//! table's bucket strategy.

use crate::model::{BucketId, EventTime, TableId};

/// A live (or held) claim on one window of one table for compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionClaim {
    /// The table.
    pub table_id: TableId,
    /// The window's name (for example `month:2024-03`); opaque to the store.
    pub window_key: String,
    /// Inclusive start: buckets with `bucket_start` in `[window_start, window_end)` belong
    /// to the window.
    pub window_start: EventTime,
    /// Exclusive end.
    pub window_end: EventTime,
    /// Opaque owner token, unique per claim.
    pub owner_token: String,
    /// Fencing generation: +1 on every claim of the window, 1 for the first.
    pub generation: i64,
    /// Lease expiry by the store's clock.
    pub lease_expires_at: EventTime,
}

/// One archived bucket of a window with its current route: a compaction source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionSource {
    /// The bucket.
    pub bucket: BucketId,
    /// Its inclusive start.
    pub bucket_start: EventTime,
    /// Its exclusive end.
    pub bucket_end: EventTime,
    /// The manifest its route names now (a per-bucket manifest or an older segment's).
    pub object_key: String,
}

/// What a window holds at one moment (one snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowState {
    /// The buckets that are archived with their hot rows deleted, ordered by partition key,
    /// then bucket start.
    pub sources: Vec<CompactionSource>,
    /// The buckets of the window that are not sources yet: hot, being archived, or archived
    /// with hot rows not yet deleted. A window is complete when this is 0.
    pub not_ready: u64,
}

/// One bucket's route move, applied only if the bucket still routes to `from_object_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSwitch {
    /// The bucket.
    pub bucket: BucketId,
    /// The route the compaction read the bucket's rows from.
    pub from_object_key: String,
    /// The segment manifest that holds the same rows now.
    pub to_object_key: String,
}

/// An object key a switch replaced, and when (store clock): garbage collection deletes it
/// only once no route names it and `retired_at` is older than the readers' route-cache
/// bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetiredObject {
    /// The replaced manifest's key.
    pub object_key: String,
    /// The last time a switch replaced it.
    pub retired_at: EventTime,
}

/// Checks the input of a switch before any statement runs, identically for both stores:
/// every bucket belongs to the claim's table and window (the claim fences nothing else),
/// and no bucket is listed twice (a second move of one bucket in one transaction would
/// make the updated-row count meaningless). The first offending switch is
/// [`StoreError::RouteChanged`](super::StoreError::RouteChanged): the switch as asked
/// cannot be applied, and nothing was written.
pub(crate) fn check_switches(
    claim: &CompactionClaim,
    switches: &[RouteSwitch],
) -> Result<(), super::StoreError> {
    let mut seen = std::collections::HashSet::with_capacity(switches.len());
    for s in switches {
        let b = &s.bucket;
        let refuse = |reason: String| super::StoreError::RouteChanged {
            bucket: b.clone(),
            reason,
        };
        if b.table_id != claim.table_id {
            return Err(refuse(format!(
                "the bucket belongs to table {}, not to the claim's table {}",
                b.table_id, claim.table_id
            )));
        }
        let start = b.bucket_key.start();
        if start < claim.window_start || start >= claim.window_end {
            return Err(refuse(format!(
                "the bucket starts at {start}, outside the claimed window {} [{}, {})",
                claim.window_key, claim.window_start, claim.window_end
            )));
        }
        if !seen.insert(b) {
            return Err(refuse("the bucket is listed twice in one switch".into()));
        }
    }
    Ok(())
}

/// [`check_switches`] for the buckets of a [`drop_empty_buckets`]: each must be of the
/// claim's table and window, and listed once.
///
/// [`drop_empty_buckets`]: super::Compaction::drop_empty_buckets
pub(crate) fn check_sources(
    claim: &CompactionClaim,
    sources: &[CompactionSource],
) -> Result<(), super::StoreError> {
    let as_switches: Vec<RouteSwitch> = sources
        .iter()
        .map(|s| RouteSwitch {
            bucket: s.bucket.clone(),
            from_object_key: s.object_key.clone(),
            to_object_key: String::new(),
        })
        .collect();
    check_switches(claim, &as_switches)
}

/// The distinct replaced keys of a switch, sorted (each is recorded once).
pub(crate) fn retired_keys(switches: &[RouteSwitch]) -> Vec<String> {
    let keys: std::collections::BTreeSet<&str> = switches
        .iter()
        .map(|s| s.from_object_key.as_str())
        .collect();
    keys.into_iter().map(str::to_string).collect()
}

/// The stored claim of a window, as the refusal of a write under a claim reads it.
pub(crate) struct StoredClaim<'a> {
    /// The owner token, `None` once released.
    pub owner_token: Option<&'a str>,
    /// The window's generation.
    pub generation: i64,
    /// The lease, `None` once released.
    pub lease_expires_at: Option<EventTime>,
}

/// Why `claim` does not hold its window, given the window's stored claim (`None`: the
/// window has no row) and the store's `now`; `None` when it does hold it. Both stores word
/// their refusals with it.
pub(crate) fn claim_mismatch(
    claim: &CompactionClaim,
    stored: Option<StoredClaim<'_>>,
    now: EventTime,
) -> Option<String> {
    let Some(s) = stored else {
        return Some("the window was never claimed".into());
    };
    if s.generation != claim.generation {
        return Some(format!("the window's generation is now {}", s.generation));
    }
    match (s.owner_token, s.lease_expires_at) {
        (None, _) | (_, None) => Some("the claim was released".into()),
        (Some(t), _) if t != claim.owner_token => {
            Some("another owner token holds the window".into())
        }
        (_, Some(l)) if l <= now => Some(format!("the lease expired at {l} (store time {now})")),
        _ => None,
    }
}

/// Why a bucket's stored route does not allow switching it from `from_object_key`, given
/// its stored state, cleanup flag and object key (all `None`: the bucket has no metadata);
/// `None` when it does. Both stores word their refusals with it.
pub(crate) fn route_mismatch(
    from_object_key: &str,
    state: Option<&str>,
    hot_deleted: Option<bool>,
    object_key: Option<&str>,
) -> Option<String> {
    match (state, hot_deleted, object_key) {
        (None, ..) => Some("the bucket has no metadata".into()),
        (Some(s), ..) if s != "archived" => Some(format!("the bucket is {s}, not archived")),
        (_, Some(false) | None, _) => Some("the bucket's hot rows are not deleted yet".into()),
        (_, _, Some(k)) if k == from_object_key => None,
        (_, _, k) => Some(format!(
            "the bucket routes to {}, not to {from_object_key} (the object the compaction read)",
            k.unwrap_or("nothing")
        )),
    }
}
