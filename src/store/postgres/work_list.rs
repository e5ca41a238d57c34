//! The statements that find compaction's work on PostgreSQL (docs/segments.md, "Finding
//! work"): due windows and their partitions from the partial work-list indexes (migrations
//! 18 and 19), and the buckets still routed to a retired segment (migrations 21 and 23).
//! Each repeats its index's predicate verbatim, since PostgreSQL and CockroachDB use a
//! partial index only for a query that states it; the tests below hold them to the
//! migrations' text.

use super::sql::{META, RETIRED};

/// The predicate of compaction's partial indexes (migrations 18 and 19), verbatim.
pub(super) const TO_COMPACT: &str = "state = 'archived' AND hot_deleted \
     AND object_key NOT LIKE '%/segments/%/s_____-g%/manifest.json'";

/// `next_compaction_start`'s statement: `$1` table, `$2` cursor.
pub(super) fn next_start_sql() -> String {
    format!(
        "SELECT bucket_start, bucket_end FROM {META} \
         WHERE table_id = $1 AND bucket_start >= $2 AND {TO_COMPACT} \
         ORDER BY bucket_start LIMIT 1"
    )
}

/// The retired objects that are segments (the predicate of migration 23's partial index,
/// verbatim): only a segment is shared, so only a retired segment can still be routed to.
pub(super) const RETIRED_SEGMENT: &str = "r.object_key LIKE '%/segments/%/s_____-g%/manifest.json'";

/// The first bucket at or after `$2` of table `$1` still routed to a retired segment: a
/// compaction moved other partitions out of it, and the rows of this one (and the removed
/// rows beside them) must leave it before garbage collection may delete it. The retired
/// segments are read from their partial index (migration 23; the retired per-bucket
/// objects, far more numerous, are not), each joined to its buckets by the object-key
/// index (migration 21).
pub(super) fn retired_start_sql() -> String {
    format!(
        "SELECT m.bucket_start FROM {RETIRED} AS r JOIN {META} AS m \
           ON m.object_key = r.object_key \
         WHERE {RETIRED_SEGMENT} AND m.table_id = $1 AND m.bucket_start >= $2 \
           AND m.state = 'archived' AND m.hot_deleted \
         ORDER BY m.bucket_start LIMIT 1"
    )
}

/// The partitions of a window with a bucket still routed to a retired object (see
/// [`retired_start_sql`]); parameters as [`partitions_sql`]'s.
pub(super) fn retired_partitions_sql() -> String {
    format!(
        "SELECT DISTINCT m.partition_key FROM {RETIRED} AS r JOIN {META} AS m \
           ON m.object_key = r.object_key \
         WHERE {RETIRED_SEGMENT} AND m.table_id = $1 AND m.partition_key > $2 \
           AND m.bucket_start >= $3 AND m.bucket_start < $4 \
           AND m.state = 'archived' AND m.hot_deleted \
         ORDER BY m.partition_key LIMIT $5"
    )
}

/// `partitions_to_compact`'s statement: `$1` table, `$2` the partition after which to
/// list (empty: from the first), `$3`/`$4` the window, `$5` the limit.
pub(super) fn partitions_sql() -> String {
    format!(
        "SELECT DISTINCT partition_key FROM {META} \
         WHERE table_id = $1 AND partition_key > $2 \
           AND bucket_start >= $3 AND bucket_start < $4 AND {TO_COMPACT} \
         ORDER BY partition_key LIMIT $5"
    )
}

/// The statements that read compaction's work list, with the parameter types they take,
/// for tests that check their plans (`EXPLAIN`) use the partial indexes rather than scan.
#[doc(hidden)]
pub fn work_list_statements() -> [(&'static str, String); 2] {
    [
        ("next_compaction_start", next_start_sql()),
        ("partitions_to_compact", partitions_sql()),
    ]
}

/// The statements that find buckets still routed to a retired segment (same parameters as
/// [`work_list_statements`]), for tests that check they reach the registry by its
/// object-key index.
#[doc(hidden)]
pub fn retired_work_statements() -> [(&'static str, String); 2] {
    [
        ("next_compaction_start (retired)", retired_start_sql()),
        ("partitions_to_compact (retired)", retired_partitions_sql()),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_work_list_predicate_is_the_partial_indexes_verbatim() {
        let pred = super::TO_COMPACT
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for sql in [
            include_str!("../../../sql/0018_bucket_metadata_compaction_idx.sql"),
            include_str!("../../../sql/0019_bucket_metadata_compaction_start_idx.sql"),
        ] {
            assert!(sql.contains(&format!("WHERE {pred}")), "{sql}");
        }
        assert!(pred.contains(crate::store::SEGMENT_KEY_LIKE));
    }

    #[test]
    fn the_retired_segment_predicate_is_its_partial_index_verbatim() {
        let pred = super::RETIRED_SEGMENT.trim_start_matches("r.");
        let sql = include_str!("../../../sql/0023_retired_segments_idx.sql");
        assert!(sql.contains(&format!("WHERE {pred}")), "{sql}");
        assert!(pred.contains(crate::store::SEGMENT_KEY_LIKE));
    }
}
