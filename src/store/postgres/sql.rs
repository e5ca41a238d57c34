//! SQL text shared by the roles: the table names, the bucket metadata column list with the
//! positions the decoder reads it by, and the builders of numbered parameters.
//!
//! Statements that take a variable set of predicates (a listing with or without each bound,
//! a page with cursors) are assembled as text with `$n` placeholders pushed beside their
//! values, so each distinct shape is one prepared statement cached per connection. Each
//! statement's own text stays beside the role that sends it.

use tokio_postgres::types::ToSql;

/// The bucket metadata table: one row per bucket, its state and its route.
pub(super) const META: &str = "pulpitum_v4_bucket_metadata";
/// The hot records table.
pub(super) const RECORDS: &str = "pulpitum_v4_records";
/// Per-table tiering policies.
pub(super) const POLICIES: &str = "pulpitum_v4_policies";
/// The store-wide switches (one row).
pub(super) const STORE_CONTROL: &str = "pulpitum_v4_store_control";
/// Job history.
pub(super) const JOBS: &str = "pulpitum_v4_jobs";
/// Window claims of segment compaction (named `pulpitum_v4_compactions` before migration 33,
/// whose rename fences older builds out of compaction).
pub(super) const COMPACTIONS: &str = "pulpitum_v4_compaction_claims";
/// Object keys a compaction's route switch replaced, with when.
pub(super) const RETIRED: &str = "pulpitum_v4_retired_objects";
/// Archive directories orphan GC lists on most passes.
pub(super) const GC_PREFIXES: &str = "pulpitum_v4_gc_prefixes";
/// One row per segment manifest: its window and how many buckets it holds.
pub(super) const SEGMENT_ROUTES: &str = "pulpitum_v4_segment_routes";
/// The predicate of migration 32's partial index, verbatim: a bucket not routed to a
/// segment (hot, archiving, or archived in an object of its own).
pub(super) const UNSEGMENTED: &str =
    "object_key IS NULL OR object_key NOT LIKE '%/segments/%/s_____-g%/manifest.json'";

/// The predicate "the store is not paused", for statements that hand out or take archive
/// work; read in the same statement, so a committed pause is seen by the next claim.
pub(super) const STORE_NOT_PAUSED: &str =
    "NOT EXISTS (SELECT 1 FROM pulpitum_v4_store_control c WHERE c.paused)";

/// The time condition of eligibility for a Hot bucket `m` joined to its table's policy `p`
/// (`LEFT JOIN`), with the cutoff for tables without a policy and the bound for tables with
/// one as the placeholders `{cutoff}` and `{bound}` (see [`crate::store::Eligibility`]).
///
/// The first conjunct is implied by the second and is there for the index: a bound that
/// depends on the joined policy is no range an index can seek, so without it a discovery
/// reads every Hot bucket's entry rather than the eligible ones. It is the largest value
/// the `CASE` can take: the cutoff for a table without `archive_after`, else at most
/// `LEAST(bound, now() - a)` for the smallest `a` of any policy; with no such policy, the
/// cutoff alone. (The bound alone would not do: without a ceiling it is the end of the
/// supported range, and the range would hold every Hot bucket.)
pub(super) fn eligible_by_time(cutoff: &str, bound: &str) -> String {
    format!(
        "m.bucket_end <= GREATEST({cutoff}::TIMESTAMPTZ, LEAST({bound}::TIMESTAMPTZ, \
           COALESCE(now() - (SELECT min(q.archive_after_us) FROM {POLICIES} q) \
             * INTERVAL '1 microsecond', {cutoff}::TIMESTAMPTZ))) \
         AND m.bucket_end <= CASE WHEN p.archive_after_us IS NULL THEN {cutoff}::TIMESTAMPTZ \
           ELSE LEAST({bound}::TIMESTAMPTZ, now() - p.archive_after_us * INTERVAL '1 microsecond') END"
    )
}

/// Every column of [`META`], in the order [`meta_col`] numbers them.
pub(super) const META_COLS: &str =
    "table_id, partition_key, bucket_key, bucket_strategy, bucket_start, \
     bucket_end, state, owner_token, generation, lease_expires_at, retry_at, object_key, \
     hot_deleted, published_at";

/// Column positions of [`META_COLS`](crate::store::postgres::sql::META_COLS); every
/// statement decoded by [`decode_meta`](crate::store::postgres::decode::decode_meta) selects
/// them first, in this order (read by position: a name lookup per column per row cost more
/// than the decoding).
pub(super) mod meta_col {
    pub const TABLE_ID: usize = 0;
    pub const PARTITION_KEY: usize = 1;
    pub const BUCKET_KEY: usize = 2;
    pub const STRATEGY: usize = 3;
    pub const START: usize = 4;
    pub const END: usize = 5;
    pub const STATE: usize = 6;
    pub const OWNER: usize = 7;
    pub const GENERATION: usize = 8;
    pub const LEASE: usize = 9;
    pub const RETRY: usize = 10;
    pub const OBJECT_KEY: usize = 11;
    pub const HOT_DELETED: usize = 12;
    pub const PUBLISHED: usize = 13;
}

/// A statement's parameters, in `$n` order, for statements assembled from optional parts.
pub(super) type Params = Vec<Box<dyn ToSql + Sync + Send>>;

/// The parameters as the client takes them.
pub(super) fn param_refs(p: &Params) -> Vec<&(dyn ToSql + Sync)> {
    p.iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// Adds a parameter and returns its placeholder (`$n`).
pub(super) fn push(params: &mut Params, v: impl ToSql + Sync + Send + 'static) -> String {
    params.push(Box::new(v));
    format!("${}", params.len())
}

/// A duration in whole microseconds, the unit the statements' intervals are built from
/// (`$n::INT8 * INTERVAL '1 microsecond'`); saturates rather than wrapping.
pub(super) fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A page size as a `LIMIT` parameter: at least 1, so a page always makes progress.
pub(super) fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit.max(1)).unwrap_or(i64::MAX)
}
