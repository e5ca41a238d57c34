//! The two statements of compaction that rewrite routes, on PostgreSQL: the switch of a
//! window's buckets to their segments, and the removal of buckets left with no rows. Both
//! are one serializable transaction each, opened by a write to the claim row that matches
//! only a current claim (see `compaction.rs` for why that row), and send their buckets as
//! arrays, [`SWITCH_CHUNK`] per statement. [`super::compaction`] holds the rest of the
//! `Compaction` role and delegates these two here.

use chrono::{DateTime, Utc};
use tokio_postgres::IsolationLevel;

use super::compaction::{MASKS, SWITCH_CHUNK};
use super::decode::corrupt;
use super::sql::{COMPACTIONS, META, RETIRED, SEGMENT_ROUTES};
use super::{PgStore, TxError};
use crate::store::compaction::{
    check_sources, check_switches, retired_keys, route_mismatch, segment_routes,
};
use crate::store::{CompactionClaim, CompactionSource, RouteSwitch, StoreError, StoreResult};

impl PgStore {
    /// `Compaction::switch_routes`: the buckets of a written segment move to it, in one
    /// transaction that holds the claim and finds every route still the one compaction
    /// read; the replaced objects are recorded as retired.
    pub(super) async fn switch(
        &self,
        claim: &CompactionClaim,
        switches: &[RouteSwitch],
    ) -> StoreResult<u64> {
        check_switches(claim, switches)?;
        // Writing the claim row (only while the claim is current) puts the switch and any
        // later claim of the window in a write-write conflict on one row.
        let hold_sql = format!(
            "UPDATE {COMPACTIONS} SET updated_at = now() \
             WHERE table_id = $1 AND window_key = $2 AND owner_token = $3 AND generation = $4 \
               AND lease_expires_at > now()"
        );
        // Both statements find each bucket by a primary-key probe under a LATERAL ... LIMIT 1
        // driven by the array, as the batch append does: a plain join of the array to the
        // metadata was planned (generic plan, a table filled faster than its statistics) as
        // a loop over the table's rows rescanning the array, quadratic: 36 s for 12,000
        // buckets instead of 0.1 s. The bucket's start is passed too, so either index on
        // (table, partition, ...) answers the probe exactly.
        //
        // The check names the first bucket of a chunk (in the caller's order) whose route
        // does not allow its switch; a missing bucket comes out with NULLs.
        let check_sql = format!(
            "SELECT s.i, p.state, p.hot_deleted, p.object_key \
             FROM unnest($2::BYTEA[], $3::TEXT[], $4::TIMESTAMPTZ[], $5::TEXT[]) WITH ORDINALITY \
               AS s(partition_key, bucket_key, bucket_start, from_key, i) \
             LEFT JOIN LATERAL ( \
               SELECT m.state, m.hot_deleted, m.object_key FROM {META} m \
               WHERE m.table_id = $1 AND m.partition_key = s.partition_key \
                 AND m.bucket_key = s.bucket_key AND m.bucket_start = s.bucket_start LIMIT 1 \
             ) p ON true \
             WHERE p.state IS DISTINCT FROM 'archived' OR NOT p.hot_deleted \
               OR p.object_key IS DISTINCT FROM s.from_key \
             ORDER BY s.i LIMIT 1"
        );
        // The update repeats the whole condition on the probed row and the route
        // compare-and-set on the row it writes; the target has no condition of its own
        // beyond its key, so the planner has no reason to start from it.
        let update_sql = format!(
            "UPDATE {META} AS m SET object_key = x.to_key, updated_at = now() \
             FROM ( \
               SELECT s.partition_key, s.bucket_key, s.bucket_start, s.from_key, s.to_key \
               FROM unnest($2::BYTEA[], $3::TEXT[], $4::TIMESTAMPTZ[], $5::TEXT[], $6::TEXT[]) \
                 AS s(partition_key, bucket_key, bucket_start, from_key, to_key) \
               CROSS JOIN LATERAL ( \
                 SELECT 1 FROM {META} p WHERE p.table_id = $1 \
                   AND p.partition_key = s.partition_key AND p.bucket_key = s.bucket_key \
                   AND p.bucket_start = s.bucket_start AND p.state = 'archived' \
                   AND p.hot_deleted AND p.object_key = s.from_key LIMIT 1 \
               ) ok \
             ) x \
             WHERE m.table_id = $1 AND m.partition_key = x.partition_key \
               AND m.bucket_key = x.bucket_key AND m.bucket_start = x.bucket_start \
               AND m.object_key = x.from_key"
        );
        // The latest retirement wins: readers may hold a route to the key until the last
        // switch that replaced it, plus their cache bound.
        let retire_sql = format!(
            "INSERT INTO {RETIRED} AS r (object_key, retired_at) \
             SELECT k.object_key, now() FROM unnest($1::TEXT[]) AS k(object_key) \
             ON CONFLICT (object_key) DO UPDATE SET \
               retired_at = GREATEST(r.retired_at, excluded.retired_at)"
        );
        struct Chunk<'a> {
            offset: usize,
            partitions: Vec<&'a [u8]>,
            keys: Vec<String>,
            starts: Vec<DateTime<Utc>>,
            from: Vec<&'a str>,
            to: Vec<&'a str>,
        }
        let chunks: Vec<Chunk<'_>> = switches
            .chunks(SWITCH_CHUNK)
            .enumerate()
            .map(|(n, c)| Chunk {
                offset: n * SWITCH_CHUNK,
                partitions: c
                    .iter()
                    .map(|s| s.bucket.partition_key.as_bytes())
                    .collect(),
                keys: c.iter().map(|s| s.bucket.bucket_key.to_string()).collect(),
                starts: c
                    .iter()
                    .map(|s| s.bucket.bucket_key.start().to_datetime())
                    .collect(),
                from: c.iter().map(|s| s.from_object_key.as_str()).collect(),
                to: c.iter().map(|s| s.to_object_key.as_str()).collect(),
            })
            .collect();
        let retired = retired_keys(switches);
        // Each segment's route: the union of its windows and the largest known count, so a
        // segment switched over several transactions ends with its whole window.
        let segment_sql = format!(
            "INSERT INTO {SEGMENT_ROUTES} AS s \
               (table_id, object_key, window_start, window_end, buckets) \
             SELECT $1, x.k, x.ws, x.we, x.n \
             FROM unnest($2::TEXT[], $3::TIMESTAMPTZ[], $4::TIMESTAMPTZ[], $5::INT8[]) \
               AS x(k, ws, we, n) \
             ON CONFLICT (table_id, object_key) DO UPDATE SET \
               window_start = LEAST(s.window_start, excluded.window_start), \
               window_end = GREATEST(s.window_end, excluded.window_end), \
               buckets = GREATEST(s.buckets, excluded.buckets)"
        );
        struct Segments {
            keys: Vec<String>,
            starts: Vec<DateTime<Utc>>,
            ends: Vec<DateTime<Utc>>,
            buckets: Vec<i64>,
        }
        let routes = segment_routes(switches);
        let segments = Segments {
            keys: routes.iter().map(|r| r.object_key.clone()).collect(),
            starts: routes
                .iter()
                .map(|r| r.window_start.to_datetime())
                .collect(),
            ends: routes.iter().map(|r| r.window_end.to_datetime()).collect(),
            buckets: routes.iter().map(|r| r.buckets).collect(),
        };
        let table = claim.table_id.as_str();
        self.run("switch_routes", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let held = tx
                .execute(
                    &hold_sql,
                    &[
                        &table,
                        &claim.window_key,
                        &claim.owner_token,
                        &claim.generation,
                    ],
                )
                .await?;
            if held == 0 {
                return Err(Self::compaction_refusal(&tx, claim, "switch_routes").await);
            }
            for c in &chunks {
                let row = tx
                    .query_opt(
                        &check_sql,
                        &[&table, &c.partitions, &c.keys, &c.starts, &c.from],
                    )
                    .await?;
                if let Some(row) = row {
                    let i: i64 = row.try_get(0)?;
                    let at = usize::try_from(i - 1)
                        .ok()
                        .and_then(|i| switches.get(c.offset + i))
                        .ok_or_else(|| corrupt("route check ordinal", i))?;
                    let state: Option<String> = row.try_get(1)?;
                    let hot_deleted: Option<bool> = row.try_get(2)?;
                    let object_key: Option<String> = row.try_get(3)?;
                    let reason = route_mismatch(
                        &at.from_object_key,
                        state.as_deref(),
                        hot_deleted,
                        object_key.as_deref(),
                    )
                    .unwrap_or_else(|| "the route changed while it was checked".into());
                    return Err(TxError::Store(StoreError::RouteChanged {
                        bucket: at.bucket.clone(),
                        reason,
                    }));
                }
            }
            let mut switched = 0u64;
            for c in &chunks {
                switched += tx
                    .execute(
                        &update_sql,
                        &[&table, &c.partitions, &c.keys, &c.starts, &c.from, &c.to],
                    )
                    .await?;
            }
            if switched != switches.len() as u64 {
                // Every route was just checked in this transaction: a different count means
                // the rows moved underneath it. Nothing is committed; run it again.
                return Err(TxError::Conflict(format!(
                    "switch_routes updated {switched} of {} buckets",
                    switches.len()
                )));
            }
            for keys in retired.chunks(SWITCH_CHUNK) {
                tx.execute(&retire_sql, &[&keys]).await?;
            }
            // In the same transaction as the routes: a listing across partitions that reads
            // this segment whole must never see its buckets routed here without it.
            if !segments.keys.is_empty() {
                tx.execute(
                    &segment_sql,
                    &[
                        &table,
                        &segments.keys,
                        &segments.starts,
                        &segments.ends,
                        &segments.buckets,
                    ],
                )
                .await?;
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(switched)
        })
        .await
    }

    /// `Compaction::drop_empty_buckets`: buckets whose every row was deleted leave the
    /// registry, under the same claim and route checks as a switch.
    pub(super) async fn drop_empty(
        &self,
        claim: &CompactionClaim,
        buckets: &[CompactionSource],
    ) -> StoreResult<u64> {
        check_sources(claim, buckets)?;
        if buckets.is_empty() {
            return Ok(0);
        }
        let hold_sql = format!(
            "UPDATE {COMPACTIONS} SET updated_at = now() \
             WHERE table_id = $1 AND window_key = $2 AND owner_token = $3 AND generation = $4 \
               AND lease_expires_at > now()"
        );
        let read_sql = format!(
            "SELECT state, hot_deleted, object_key FROM {META} \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 AND bucket_start = $4"
        );
        // The route compare-and-set again in the statement that deletes.
        let drop_sql = format!(
            "DELETE FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND bucket_start = $4 AND state = 'archived' AND hot_deleted AND object_key = $5"
        );
        // Masks stay, marked rewritten: a reader holding the old route applies them until
        // garbage collection forgets them (see `forget_purged_masks`).
        let masks_sql = format!(
            "UPDATE {MASKS} SET purged_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 AND purged_at IS NULL"
        );
        let retire_sql = format!(
            "INSERT INTO {RETIRED} AS r (object_key, retired_at) VALUES ($1, now()) \
             ON CONFLICT (object_key) DO UPDATE SET \
               retired_at = GREATEST(r.retired_at, excluded.retired_at)"
        );
        let table = claim.table_id.as_str();
        self.run("drop_empty_buckets", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let held = tx
                .execute(
                    &hold_sql,
                    &[
                        &table,
                        &claim.window_key,
                        &claim.owner_token,
                        &claim.generation,
                    ],
                )
                .await?;
            if held == 0 {
                return Err(Self::compaction_refusal(&tx, claim, "drop_empty_buckets").await);
            }
            let mut dropped = 0u64;
            for s in buckets {
                let pk = s.bucket.partition_key.as_bytes();
                let key = s.bucket.bucket_key.to_string();
                let start = s.bucket.bucket_key.start().to_datetime();
                let n = tx
                    .execute(&drop_sql, &[&table, &pk, &key, &start, &s.object_key])
                    .await?;
                if n != 1 {
                    let row = tx
                        .query_opt(&read_sql, &[&table, &pk, &key, &start])
                        .await?;
                    let (state, hot_deleted, object_key): (
                        Option<String>,
                        Option<bool>,
                        Option<String>,
                    ) = match &row {
                        Some(r) => (Some(r.try_get(0)?), Some(r.try_get(1)?), r.try_get(2)?),
                        None => (None, None, None),
                    };
                    let reason = route_mismatch(
                        &s.object_key,
                        state.as_deref(),
                        hot_deleted,
                        object_key.as_deref(),
                    )
                    .unwrap_or_else(|| "the route changed while it was checked".into());
                    return Err(TxError::Store(StoreError::RouteChanged {
                        bucket: s.bucket.clone(),
                        reason,
                    }));
                }
                tx.execute(&masks_sql, &[&table, &pk, &key]).await?;
                tx.execute(&retire_sql, &[&s.object_key]).await?;
                dropped += 1;
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(dropped)
        })
        .await
    }
}
