//! [`RoutedReads`] on PostgreSQL: bucket listings, one bucket's page with its route, and
//! the head statement that finds a partition's first bucket and its first page at once.
//!
//! A page and its route come from one statement, so from one snapshot. Rows subqueries
//! name their bucket by parameters, never through a correlation: a limit under a
//! correlation is what CockroachDB decorrelates into a full scan (docs/schema.md). The
//! scan bounds become predicates on alias `r` here (`bounds_sql`, and `head_index_bounds`
//! for the head statement's key range).

use std::ops::Bound;

use async_trait::async_trait;

use super::decode::{corrupt, decode_envelope, decode_meta, decode_record, decode_routed};
use super::sql::{
    limit_param, meta_col, param_refs, push, Params, META, META_COLS, RECORDS, SEGMENT_ROUTES,
    UNSEGMENTED,
};
use super::PgStore;
use crate::model::{BucketId, ClusteringKey, EventTime, PartitionKey, SortKey, TableId};
use crate::store::{
    AcrossListing, BucketFilter, BucketMeta, BucketState, Catalog, HeadPage, HotPage, PageRequest,
    RoutedReads, StoreError, StoreResult,
};

/// Appends the bounds' predicates on alias `r` (each `AND ...`).
fn bounds_sql(b: &crate::model::ScanBounds, params: &mut Params, sql: &mut String) {
    let time =
        |bound: &Bound<EventTime>, inc: &str, exc: &str, params: &mut Params, sql: &mut String| {
            match bound {
                Bound::Included(t) => sql.push_str(&format!(
                    " AND r.event_time {inc} {}",
                    push(params, t.to_datetime())
                )),
                Bound::Excluded(t) => sql.push_str(&format!(
                    " AND r.event_time {exc} {}",
                    push(params, t.to_datetime())
                )),
                Bound::Unbounded => {}
            }
        };
    time(&b.time_lower, ">=", ">", params, sql);
    time(&b.time_upper, "<=", "<", params, sql);
    let sort =
        |bound: &Bound<SortKey>, inc: &str, exc: &str, params: &mut Params, sql: &mut String| {
            match bound {
                Bound::Included(k) => sql.push_str(&format!(
                    " AND r.sort_key {inc} {}",
                    push(params, k.as_bytes().to_vec())
                )),
                Bound::Excluded(k) => sql.push_str(&format!(
                    " AND r.sort_key {exc} {}",
                    push(params, k.as_bytes().to_vec())
                )),
                Bound::Unbounded => {}
            }
        };
    sort(&b.sort_lower, ">=", ">", params, sql);
    sort(&b.sort_upper, "<=", "<", params, sql);
    let cursor = |c: &Option<ClusteringKey>, op: &str, params: &mut Params, sql: &mut String| {
        if let Some(c) = c {
            let t = push(params, c.event_time.to_datetime());
            let k = push(params, c.sort_key.as_bytes().to_vec());
            sql.push_str(&format!(" AND (r.event_time, r.sort_key) {op} ({t}, {k})"));
        }
    };
    cursor(&b.after, ">", params, sql);
    cursor(&b.before, "<", params, sql);
}

/// The head statement's time bounds and cursors restated on the records' key tuple
/// (`bucket_key, event_time[, sort_key]`), each an `AND ...` on alias `r`. For stored rows,
/// whose bucket key is the key of their time, each is equivalent to the plain predicate of
/// [`bounds_sql`] (kept beside it), but unlike it bounds the primary-key range that the head
/// statement reads across buckets, so the read starts at the bound instead of filtering its
/// way there.
fn head_index_bounds(
    b: &crate::model::ScanBounds,
    key_of: &dyn Fn(EventTime) -> String,
    params: &mut Params,
    sql: &mut String,
) {
    let mut time = |bound: &Bound<EventTime>, inc: &str, exc: &str| {
        let (op, t) = match bound {
            Bound::Included(t) => (inc, t),
            Bound::Excluded(t) => (exc, t),
            Bound::Unbounded => return,
        };
        let k = push(params, key_of(*t));
        let at = push(params, t.to_datetime());
        sql.push_str(&format!(
            " AND (r.bucket_key, r.event_time) {op} ({k}, {at})"
        ));
    };
    time(&b.time_lower, ">=", ">");
    time(&b.time_upper, "<=", "<");
    let mut cursor = |c: &Option<ClusteringKey>, op: &str| {
        if let Some(c) = c {
            let k = push(params, key_of(c.event_time));
            let at = push(params, c.event_time.to_datetime());
            let s = push(params, c.sort_key.as_bytes().to_vec());
            sql.push_str(&format!(
                " AND (r.bucket_key, r.event_time, r.sort_key) {op} ({k}, {at}, {s})"
            ));
        }
    };
    cursor(&b.after, ">");
    cursor(&b.before, "<");
}

impl PgStore {
    /// A listing's statement and parameters (one text per combination of bounds, so each is
    /// prepared once per connection); also what `explain_registry_reads` plans.
    pub(super) fn list_statement(
        &self,
        table_id: &TableId,
        filter: &BucketFilter,
    ) -> (String, Params) {
        let mut params: Params = Vec::new();
        let mut sql = format!(
            "SELECT {META_COLS} FROM {META} WHERE table_id = {}",
            push(&mut params, table_id.as_str().to_string())
        );
        if let Some(parts) = &filter.partitions {
            let keys: Vec<Vec<u8>> = parts.iter().map(|p| p.as_bytes().to_vec()).collect();
            sql.push_str(&format!(
                " AND partition_key = ANY({}::BYTEA[])",
                push(&mut params, keys)
            ));
        }
        if let Some(from) = filter.from {
            sql.push_str(&format!(
                " AND bucket_end > {}",
                push(&mut params, from.to_datetime())
            ));
            if let Some(floor) = self.grid_floor(table_id, from) {
                sql.push_str(&format!(
                    " AND bucket_start >= {}",
                    push(&mut params, floor.to_datetime())
                ));
            }
        }
        if let Some(to) = filter.to {
            sql.push_str(&format!(
                " AND bucket_start <= {}",
                push(&mut params, to.to_datetime())
            ));
            // Across every partition over a short interval, the `(table_id, bucket_end)`
            // index answers: bounded above too (implied, as the floor is), its range is the
            // interval's buckets, not every bucket after `from`. Not for chosen partitions,
            // whose own index is the better seek, nor for a long or open interval: the
            // partition-ordered index already gives the listing's order, where the end-ordered
            // one reads about as much and then sorts it (a break-it review measured a
            // 59-day listing of 1.2 million buckets at 0.9 s without the bound, 1.4 s with).
            if filter.partitions.is_none() && filter.from.is_some() {
                if let Some(ceiling) = self.short_grid_ceiling(table_id, filter.from, to) {
                    sql.push_str(&format!(
                        " AND bucket_end <= {}",
                        push(&mut params, ceiling.to_datetime())
                    ));
                }
            }
        }
        sql.push_str(if filter.descending {
            " ORDER BY partition_key, bucket_start DESC"
        } else {
            " ORDER BY partition_key, bucket_start"
        });
        if let Some(limit) = filter.limit {
            // Not `limit_param`: a limit of zero lists nothing, as in the embedded store.
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            sql.push_str(&format!(" LIMIT {}", push(&mut params, limit)));
        }
        (sql, params)
    }
}

#[async_trait]
impl RoutedReads for PgStore {
    async fn list_buckets(
        &self,
        table_id: &TableId,
        filter: &BucketFilter,
    ) -> StoreResult<Vec<BucketMeta>> {
        let (sql, params) = self.list_statement(table_id, filter);
        self.run("list_buckets", || async {
            let client = self.pooled().await?;
            // A handful of statement texts (with or without each bound): cached per
            // connection, so a listing costs one round trip instead of prepare + execute.
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &param_refs(&params)).await?;
            Ok(rows
                .iter()
                .map(decode_meta)
                .collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn list_across(
        &self,
        table_id: &TableId,
        from: EventTime,
        to: EventTime,
    ) -> StoreResult<Option<AcrossListing>> {
        // One statement, so one snapshot: a switch committed while it ran cannot move
        // buckets out of one part after another part judged their segment.
        //
        // `segs`: the segments overlapping the interval, each with the buckets routed to it
        // now, counted in the `_by_object` index (one entry per bucket, read by the
        // database, never sent). A segment with as many routed buckets as its manifest
        // holds is named whole (the last part: its key in `object_key` and its count in the
        // extra column, the other columns NULL). Every other bucket comes as its own row:
        // those not routed to a segment at all (the partial index of migration 32, its
        // predicate verbatim, over the interval's grid), and those routed to a segment some of whose buckets have
        // left it, or whose count is not known.
        let sql = format!(
            "WITH segs AS ( \
               SELECT s.object_key, s.buckets, \
                 (SELECT count(*) FROM {META} c WHERE c.object_key = s.object_key) AS routed \
               FROM {SEGMENT_ROUTES} s \
               WHERE s.table_id = $1 AND s.window_end > $2 AND s.window_start <= $3 \
             ) \
             SELECT {META_COLS}, NULL::INT8 FROM {META} \
             WHERE table_id = $1 AND bucket_end > $2 AND bucket_end <= $4 \
               AND bucket_start <= $3 AND ({UNSEGMENTED}) \
             UNION ALL \
             SELECT {META_COLS}, NULL::INT8 FROM {META} \
             WHERE object_key IN (SELECT object_key FROM segs WHERE routed <> buckets) \
               AND table_id = $1 AND bucket_end > $2 AND bucket_start <= $3 \
             UNION ALL \
             SELECT $1::TEXT, NULL::BYTEA, NULL::TEXT, NULL::TEXT, NULL::TIMESTAMPTZ, \
               NULL::TIMESTAMPTZ, NULL::TEXT, NULL::TEXT, NULL::INT8, NULL::TIMESTAMPTZ, \
               NULL::TIMESTAMPTZ, object_key, NULL::BOOL, NULL::TIMESTAMPTZ, buckets \
             FROM segs WHERE routed = buckets AND buckets >= 0"
        );
        let table = table_id.as_str();
        // `$4` bounds the partial index's range from above: without it a day's listing
        // would read every bucket not in a segment that ended after the day began (the
        // working set up to now), not that day's.
        let ceiling = self.grid_ceiling(table_id, to).to_datetime();
        let (from, to) = (from.to_datetime(), to.to_datetime());
        self.run("list_across", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &[&table, &from, &to, &ceiling]).await?;
            let mut listing = AcrossListing::default();
            for row in &rows {
                let held: Option<i64> = row.try_get(meta_col::PUBLISHED + 1)?;
                match held {
                    Some(n) => {
                        let key: String = row.try_get(meta_col::OBJECT_KEY)?;
                        let n = u64::try_from(n).map_err(|e| corrupt("segment bucket count", e))?;
                        listing.segments.push((key, n));
                    }
                    None => listing.buckets.push(decode_meta(row)?),
                }
            }
            Ok(Some(listing))
        })
        .await
    }

    async fn bucket(&self, bucket: &BucketId) -> StoreResult<Option<BucketMeta>> {
        let key = bucket.bucket_key.to_string();
        let sql = format!(
            "SELECT {META_COLS} FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3"
        );
        self.run("bucket", || async {
            let client = self.pooled().await?;
            let row = client
                .query_opt(
                    &sql,
                    &[
                        &bucket.table_id.as_str(),
                        &bucket.partition_key.as_bytes(),
                        &key,
                    ],
                )
                .await?;
            Ok(row.map(|r| decode_meta(&r)).transpose()?)
        })
        .await
    }

    async fn read_page(&self, bucket: &BucketId, req: &PageRequest) -> StoreResult<HotPage> {
        let mut params: Params = Vec::new();
        let t = push(&mut params, bucket.table_id.as_str().to_string());
        let p = push(&mut params, bucket.partition_key.as_bytes().to_vec());
        let k = push(&mut params, bucket.bucket_key.to_string());
        let mut preds = String::new();
        bounds_sql(&req.bounds, &mut params, &mut preds);
        let n = push(&mut params, limit_param(req.limit));
        let dir = if req.descending { "DESC" } else { "ASC" };
        let value = if req.include_value {
            "r.value"
        } else {
            "NULL::BYTEA"
        };
        // The route and the rows come from this one statement (one snapshot), as two
        // uncorrelated parts: the rows subquery names the bucket by parameters, so it is an
        // index range read in order that stops at the limit on any optimiser (a limit under
        // a correlation is what CockroachDB decorrelates into a full scan, see
        // docs/schema.md). An archived bucket's rows are dropped by the join condition.
        let sql = format!(
            "SELECT m.state, m.object_key, x.event_time, x.sort_key, x.value \
             FROM {META} m LEFT JOIN ( \
               SELECT r.event_time, r.sort_key, {value} AS value FROM {RECORDS} r \
               WHERE r.table_id = {t} AND r.partition_key = {p} AND r.bucket_key = {k}{preds} \
               ORDER BY r.event_time {dir}, r.sort_key {dir} LIMIT {n} \
             ) x ON m.state <> 'archived' \
             WHERE m.table_id = {t} AND m.partition_key = {p} AND m.bucket_key = {k} \
             ORDER BY x.event_time {dir}, x.sort_key {dir}"
        );
        self.run("read_page", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &param_refs(&params)).await?;
            let Some(first) = rows.first() else {
                return Ok(HotPage::Missing);
            };
            let state: String = first.try_get(0)?;
            match state.as_str() {
                "archived" => {
                    let object_key: Option<String> = first.try_get(1)?;
                    let object_key = object_key.ok_or_else(|| {
                        StoreError::Corrupt(format!("archived bucket {bucket} has no object key"))
                    })?;
                    Ok(HotPage::Archived { object_key })
                }
                "hot" | "archiving" => {
                    let state = if state == "hot" {
                        BucketState::Hot
                    } else {
                        BucketState::Archiving
                    };
                    let mut out = Vec::with_capacity(rows.len());
                    for row in &rows {
                        if let Some(r) =
                            decode_record(row, 2, &bucket.partition_key, req.include_value)?
                        {
                            out.push(r);
                        }
                    }
                    Ok(HotPage::hot(state, &out, req.include_value))
                }
                other => Err(StoreError::Corrupt(format!(
                    "bucket {bucket} has unknown state {other:?}"
                ))
                .into()),
            }
        })
        .await
    }

    async fn read_head(
        &self,
        table_id: &TableId,
        partition: &PartitionKey,
        from: Option<EventTime>,
        to: Option<EventTime>,
        page: &PageRequest,
    ) -> StoreResult<HeadPage> {
        // The strategy gives the bucket key of any instant (cached: no round trip). A table
        // that is not registered has no buckets, as a listing would find.
        let Some(def) = self.table(table_id).await? else {
            return Ok(HeadPage {
                bucket: None,
                first: HotPage::Missing,
            });
        };
        let strategy = def.strategy;
        let key_of = |t: EventTime| strategy.bucket_of(t).to_string();
        let mut params: Params = Vec::new();
        let t = push(&mut params, table_id.as_str().to_string());
        let p = push(&mut params, partition.as_bytes().to_vec());
        let mut range = String::new();
        // Bounds on the records' bucket keys, by parameters only (see below).
        let mut keys = String::new();
        if let Some(from) = from {
            range.push_str(&format!(
                " AND bucket_end > {}",
                push(&mut params, from.to_datetime())
            ));
            // Implied by `bucket_end > from` (buckets lie on the table's grid), stated to
            // bound the by-start index range from below.
            range.push_str(&format!(
                " AND bucket_start >= {}",
                push(&mut params, strategy.bucket_of(from).start().to_datetime())
            ));
            keys.push_str(&format!(
                " AND r.bucket_key >= {}",
                push(&mut params, key_of(from))
            ));
        }
        if let Some(to) = to {
            range.push_str(&format!(
                " AND bucket_start <= {}",
                push(&mut params, to.to_datetime())
            ));
            keys.push_str(&format!(
                " AND r.bucket_key <= {}",
                push(&mut params, key_of(to))
            ));
        }
        head_index_bounds(&page.bounds, &key_of, &mut params, &mut keys);
        let mut preds = String::new();
        bounds_sql(&page.bounds, &mut params, &mut preds);
        let n = push(&mut params, limit_param(page.limit));
        let dir = if page.descending { "DESC" } else { "ASC" };
        // The values are aggregated only when the page includes them.
        let (value, values) = if page.include_value {
            (", r.value", "array_agg(g.value)")
        } else {
            ("", "NULL::BYTEA[]")
        };
        // One statement, so one snapshot, and one row: the first bucket in scan order (`f`,
        // one probe of the by-start index), its route, and, when it is not archived, up to
        // `n` of its rows aggregated into three arrays, which are NULL when no row matched.
        // Only what a scan needs of the bucket is read, and its start, which must match its
        // key (a stored row that disagrees is corrupt).
        //
        // The bucket is not known before the statement runs, and a rows subquery that named
        // it through `f` would be a limit under a correlation, which CockroachDB decorrelates
        // into a scan of every row of the partition (docs/schema.md). So the rows (`g`) are
        // read without reference to `f`: the partition's rows in key order, which is bucket
        // order then clustering order (bucket keys of one strategy sort as their starts),
        // from the edge of the interval on, cut at `n`. The first bucket in scan order
        // that has rows is `f` itself (any bucket between the edge and `f` would overlap the
        // interval and so be `f`), so its rows come first; rows of the buckets after it, if
        // `f` has fewer than `n`, are dropped by the filter on `f`'s key (an uncorrelated
        // scalar subquery, NULL when `f` is archived; measured cheaper on PostgreSQL than
        // joining the two parts, which sorted `f`). The key-tuple bounds restate the
        // page's time bounds and cursors so that the index range starts at them.
        //
        // Why one row of arrays: every column of every row costs, on the server, on the wire
        // and in decoding, whether it holds a value or NULL. The same rows as rows, each
        // carrying the route, measured 1.30x-1.37x of the direct query in a binary-protocol
        // harness; as arrays, 1.23x-1.30x; the rows with no route at all, 1.19x-1.24x. The
        // arrays come from one aggregate, so their elements line up row by row; their order
        // is checked (and restored) when decoded, since SQL does not promise an aggregate
        // keeps its input's order.
        let sql = format!(
            "WITH f AS ( \
               SELECT bucket_key, state, object_key, hot_deleted, bucket_start FROM {META} \
               WHERE table_id = {t} AND partition_key = {p}{range} \
               ORDER BY bucket_start {dir} LIMIT 1 \
             ) \
             SELECT f.bucket_key, f.state, f.object_key, f.hot_deleted, f.bucket_start, \
               x.t, x.s, x.v \
             FROM f CROSS JOIN ( \
               SELECT array_agg(g.event_time) AS t, array_agg(g.sort_key) AS s, {values} AS v \
               FROM (SELECT r.bucket_key, r.event_time, r.sort_key{value} FROM {RECORDS} r \
                 WHERE r.table_id = {t} AND r.partition_key = {p}{keys}{preds} \
                 ORDER BY r.bucket_key {dir}, r.event_time {dir}, r.sort_key {dir} LIMIT {n}) g \
               WHERE g.bucket_key = (SELECT bucket_key FROM f WHERE state <> 'archived') \
             ) x"
        );
        self.run("read_head", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &param_refs(&params)).await?;
            let head = match rows.as_slice() {
                [] => {
                    return Ok(HeadPage {
                        bucket: None,
                        first: HotPage::Missing,
                    })
                }
                [head] => head,
                more => {
                    return Err(StoreError::Corrupt(format!(
                        "the head read returned {} rows, not one",
                        more.len()
                    ))
                    .into())
                }
            };
            let bucket = decode_routed(head, table_id, partition)?;
            let first = match &bucket.state {
                BucketState::Archived { object_key, .. } => HotPage::Archived {
                    object_key: object_key.clone(),
                },
                state => HotPage::Hot {
                    state: state.clone(),
                    rows: decode_envelope(head, 5, partition, page)?,
                },
            };
            Ok(HeadPage {
                bucket: Some(bucket),
                first,
            })
        })
        .await
    }
}
