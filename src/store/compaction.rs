//! The values of segment compaction's registry (docs/segments.md, sections 5 to 7): a claim
//! on one window of one table, the archived buckets a window holds, the route switches that
//! move buckets from their per-bucket objects to segments, and the objects a switch retired.
//!
//! A window claim follows the protocol of a bucket claim (a fresh owner token, the next
//! generation, a lease on the store's clock) but lives in its own table
//! (`pulpitum_v4_compaction_claims`), so compacting a window never fences a bucket: the buckets it
//! reads are already archived and immutable, and the switch itself checks each bucket's
//! route. Window keys are opaque text to the store; the compactor chooses them from the
//! table's bucket strategy.

use crate::model::{BucketId, EventTime, PartitionKey, TableId};

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
    /// Whether the bucket had delete or edit records (masks) not yet rewritten when it was
    /// listed: the compaction reads and applies them, so the rewrite leaves the rows out
    /// (or holds the edited values).
    pub masked: bool,
}

/// What some partitions of a window hold at one moment (one snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowState {
    /// The buckets that are archived with their hot rows deleted, ordered by partition key,
    /// then bucket start.
    pub sources: Vec<CompactionSource>,
    /// The partitions, in key order, that also hold a bucket that is not a source yet: hot,
    /// being archived, or archived with hot rows not yet deleted. Their ready buckets are
    /// sources only when work due at once waits in one of them (masks not yet rewritten, or
    /// a route to a retired object), so a channel still being written in the window has its
    /// deleted rows rewritten now and is compacted whole once every bucket is ready;
    /// otherwise compaction skips them until then.
    pub not_ready: Vec<PartitionKey>,
}

/// The SQL `LIKE` pattern (case-sensitive, as on PostgreSQL) of a segment manifest's key:
/// `…/segments/<window>/s<ordinal, 5 digits>-g<generation>/manifest.json`. A per-bucket
/// manifest's key (`…/v4/<table>/<partition hex>/<bucket>/g<generation>/manifest.json`)
/// never matches it, whatever the table is called (a table may be named `segments`): no
/// component after `segments/` of such a key starts with `s` and has `-g` at its seventh
/// character. Statements repeat it literally, as the partial index of migration 18 does,
/// because a planner uses a partial index only for a query that states its predicate.
pub const SEGMENT_KEY_LIKE: &str = "%/segments/%/s_____-g%/manifest.json";

/// [`SEGMENT_KEY_LIKE`] as a SQLite `GLOB` (SQLite's `LIKE` ignores ASCII case; `GLOB` does
/// not).
pub const SEGMENT_KEY_GLOB: &str = "*/segments/*/s?????-g*/manifest.json";

/// Whether `key` names a segment manifest: [`SEGMENT_KEY_LIKE`] evaluated as the stores do.
/// A segment is shared by many buckets, so removing one bucket's route never retires it,
/// and a bucket routed to one is not compacted again unless its partition has new work.
pub fn is_segment_key(key: &str) -> bool {
    like(SEGMENT_KEY_LIKE.as_bytes(), key.as_bytes())
}

/// SQL `LIKE` without escapes: `%` is any run of bytes, `_` any one byte. (Both patterns
/// are ASCII, so matching bytes equals matching characters wherever a `_` meets ASCII.)
fn like(pattern: &[u8], s: &[u8]) -> bool {
    // Greedy matching with one backtrack point (the last `%`): linear in practice and
    // never exponential.
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match pattern.get(p) {
            Some(b'%') => {
                star = Some((p, i));
                p += 1;
            }
            Some(&c) if c == b'_' || c == s[i] => {
                p += 1;
                i += 1;
            }
            _ => match star {
                Some((sp, si)) => {
                    p = sp + 1;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'%')
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
    /// How many buckets that segment's manifest holds, when the caller knows it (the
    /// compactor that wrote it does). The switch records it with the segment's route, so a
    /// listing across partitions can tell when every one of them is routed there; `None`
    /// records it as not known, and the segment's buckets are listed one by one.
    pub to_buckets: Option<u64>,
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
            to_buckets: None,
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

/// A segment's route as a switch records it: the window its switched buckets lie in and
/// how many buckets its manifest holds (`-1`: not known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentRoute {
    /// The segment manifest's key.
    pub object_key: String,
    /// The earliest start of the buckets switched to it.
    pub window_start: EventTime,
    /// The latest end of the buckets switched to it.
    pub window_end: EventTime,
    /// Buckets its manifest holds, or -1.
    pub buckets: i64,
}

/// The segment routes a switch records, one per distinct target that is a segment (a
/// replacement of a per-bucket object by another, as after an erasure, records none). When
/// the switches disagree on a segment's bucket count the largest known one is kept: the
/// count is a property of the immutable manifest, so any caller that knows it knows the same.
pub(crate) fn segment_routes(switches: &[RouteSwitch]) -> Vec<SegmentRoute> {
    let mut by_key: std::collections::BTreeMap<&str, SegmentRoute> = Default::default();
    for s in switches {
        if !is_segment_key(&s.to_object_key) {
            continue;
        }
        let (start, end) = s.bucket.bucket_key.bounds();
        let known = s
            .to_buckets
            .and_then(|n| i64::try_from(n).ok())
            .unwrap_or(-1);
        let e = by_key
            .entry(s.to_object_key.as_str())
            .or_insert_with(|| SegmentRoute {
                object_key: s.to_object_key.clone(),
                window_start: start,
                window_end: end,
                buckets: known,
            });
        e.window_start = e.window_start.min(start);
        e.window_end = e.window_end.max(end);
        e.buckets = e.buckets.max(known);
    }
    by_key.into_values().collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_keys_are_told_from_per_bucket_keys_whatever_the_table_is_called() {
        for key in [
            "v4/chat/segments/month:2024-03/s00000-g1/manifest.json",
            "pre/fix/v4/segments/segments/month:2024-03/s00012-g345/manifest.json",
        ] {
            assert!(is_segment_key(key), "{key}");
        }
        for key in [
            // A table named `segments`: its per-bucket objects are not segments.
            "v4/segments/7365/day:2024-03-01/g1/manifest.json",
            "v4/chat/7365/day:2024-03-01/g1/manifest.json",
            "v4/chat/segments/month:2024-03/s00000-g1/payload.parquet",
            "v4/chat/segments/month:2024-03/s0000-g1/manifest.json",
            "v4/chat/SEGMENTS/month:2024-03/s00000-g1/manifest.json",
            "",
        ] {
            assert!(!is_segment_key(key), "{key}");
        }
    }

    #[test]
    fn like_matches_as_sql_does() {
        let m = |p: &str, s: &str| like(p.as_bytes(), s.as_bytes());
        assert!(m("%", ""));
        assert!(m("a%b", "ab") && m("a%b", "axxb") && !m("a%b", "axxbc"));
        assert!(m("_b%", "abc") && !m("_b", "b"));
        assert!(m("%a%a%a", "aaa") && !m("%a%a%a", "aa"));
        assert!(m("%x%y", "xaxbyxy") && !m("%x%y", "yx"));
    }

    #[test]
    fn the_patterns_agree_with_the_partial_indexes() {
        let pg = include_str!("../../sql/0018_bucket_metadata_compaction_idx.sql");
        assert!(pg.contains(&format!("'{SEGMENT_KEY_LIKE}'")), "{pg}");
        let lite = include_str!("../../sql/sqlite/0008_compaction_idx.sql");
        assert!(lite.contains(&format!("'{SEGMENT_KEY_GLOB}'")), "{lite}");
    }
}
