//! [`Compaction`] for the embedded store: window claims, a window's sources, the route
//! switch and the retired objects, with the same meaning as on PostgreSQL (see
//! `store::postgres::compaction` and docs/segments.md, sections 5 to 7).
//!
//! Every write runs under SQLite's write lock (`BEGIN IMMEDIATE`), so the claim check, the
//! route checks and the updates of a switch see one state that nobody else can change
//! between them; the updates still repeat their conditions and are counted, so each
//! statement is correct on its own. A failed switch returns an error from the transaction
//! body, which rolls the whole transaction back: nothing of it is written.
//!
//! SQLite's `LIKE` ignores ASCII case, PostgreSQL's does not: the work list's predicate
//! tells segment keys by [`SEGMENT_KEY_GLOB`], the `GLOB` form of PostgreSQL's
//! [`SEGMENT_KEY_LIKE`], so both stores select exactly the same buckets.
//!
//! [`SEGMENT_KEY_GLOB`]: crate::store::SEGMENT_KEY_GLOB
//! [`SEGMENT_KEY_LIKE`]: crate::store::SEGMENT_KEY_LIKE

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row, Transaction};

use crate::model::{BucketId, EventTime, PartitionKey, TableId};
use crate::store::compaction::{
    check_sources, check_switches, claim_mismatch, retired_keys, route_mismatch, segment_routes,
    StoredClaim,
};
use crate::store::{
    Compaction, CompactionClaim, CompactionSource, RetiredObject, RouteSwitch, RowMask, StoreError,
    StoreResult, WindowState,
};

use super::decode::{bucket_id, corrupt, time, to_i64, BUCKET_PK};
use super::lifecycle::{fresh_token, plus};
use super::{Mode, SqliteStore, TxError, TxResult};

/// The predicate of compaction's partial indexes (migration 8), verbatim.
const TO_COMPACT: &str = "state = 'archived' AND hot_deleted = 1 \
     AND NOT (object_key GLOB '*/segments/*/s?????-g*/manifest.json')";

/// The retired objects that are segments (see the PostgreSQL store): the predicate of the
/// partial index of migration 11, verbatim.
const RETIRED_SEGMENT: &str = "r.object_key GLOB '*/segments/*/s?????-g*/manifest.json'";

/// The claim columns, in the order [`claim_from`] reads them.
const CLAIM_COLS: &str =
    "table_id, window_key, window_start, window_end, owner_token, generation, lease_expires_at";

/// One bucket of `partition_sources` as stored: key, strategy, start, route, ready, masked,
/// routed to a retired object.
type SourceRow = (String, String, i64, Option<String>, bool, bool, bool);

/// One claim row as stored, before conversion.
type ClaimRow = (String, String, i64, i64, Option<String>, i64, Option<i64>);

fn claim_row(r: &Row<'_>) -> rusqlite::Result<ClaimRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

fn claim_from(row: ClaimRow) -> TxResult<CompactionClaim> {
    let (table, window_key, start, end, token, generation, lease) = row;
    let (Some(owner_token), Some(lease)) = (token, lease) else {
        return Err(corrupt(format!(
            "held compaction claim on {table} {window_key} without an owner token or lease"
        )));
    };
    Ok(CompactionClaim {
        table_id: TableId::new(table).map_err(|e| corrupt(e.to_string()))?,
        window_key,
        window_start: time(start, "window start")?,
        window_end: time(end, "window end")?,
        owner_token,
        generation,
        lease_expires_at: time(lease, "compaction lease expiry")?,
    })
}

/// Checks in the caller's transaction that `claim` holds its window at `now`.
fn verify_claim(tx: &Transaction<'_>, claim: &CompactionClaim, now: i64) -> TxResult<()> {
    let row: Option<(Option<String>, i64, Option<i64>)> = tx
        .prepare_cached(
            "SELECT owner_token, generation, lease_expires_at FROM pulpitum_v4_compaction_claims \
             WHERE table_id = ?1 AND window_key = ?2",
        )?
        .query_row(params![claim.table_id.as_str(), claim.window_key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let stored = match &row {
        None => None,
        Some((token, generation, lease)) => Some(StoredClaim {
            owner_token: token.as_deref(),
            generation: *generation,
            lease_expires_at: lease
                .map(|l| time(l, "compaction lease expiry"))
                .transpose()?,
        }),
    };
    match claim_mismatch(claim, stored, time(now, "store time")?) {
        None => Ok(()),
        Some(reason) => Err(StoreError::StaleCompaction {
            table_id: claim.table_id.clone(),
            window_key: claim.window_key.clone(),
            generation: claim.generation,
            reason,
        }
        .into()),
    }
}

#[async_trait]
impl Compaction for SqliteStore {
    async fn next_compaction_start(
        &self,
        table_id: &TableId,
        from: EventTime,
        before: EventTime,
    ) -> StoreResult<Option<EventTime>> {
        let table_id = table_id.clone();
        // As on PostgreSQL: the first entry at or after `from`, judged due here.
        let sql = format!(
            "SELECT bucket_start, bucket_end FROM pulpitum_v4_bucket_metadata \
             WHERE table_id = ?1 AND bucket_start >= ?2 AND {TO_COMPACT} \
             ORDER BY bucket_start LIMIT 1"
        );
        self.run("next_compaction_start", Mode::Read, move |tx, _| {
            let first: Option<(i64, i64)> = tx
                .prepare_cached(&sql)?
                .query_row(params![table_id.as_str(), from.as_micros()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let due = first
                .filter(|(_, end)| *end <= before.as_micros())
                .map(|(start, _)| start);
            // Buckets with masks not yet rewritten are due at once.
            let masked: Option<i64> = tx
                .prepare_cached(
                    "SELECT m.bucket_start FROM pulpitum_v4_row_masks AS k \
                     JOIN pulpitum_v4_bucket_metadata AS m ON m.table_id = k.table_id \
                       AND m.partition_key = k.partition_key AND m.bucket_key = k.bucket_key \
                     WHERE k.table_id = ?1 AND k.purged_at IS NULL AND m.bucket_start >= ?2 \
                       AND m.state = 'archived' AND m.hot_deleted = 1 \
                     ORDER BY m.bucket_start LIMIT 1",
                )?
                .query_row(params![table_id.as_str(), from.as_micros()], |r| r.get(0))
                .optional()?;
            // So are buckets still routed to a retired segment (see the PostgreSQL store).
            let retired: Option<i64> = tx
                .prepare_cached(&format!(
                    "SELECT m.bucket_start FROM pulpitum_v4_retired_objects AS r \
                         JOIN pulpitum_v4_bucket_metadata AS m ON m.object_key = r.object_key \
                         WHERE {RETIRED_SEGMENT} AND m.table_id = ?1 AND m.bucket_start >= ?2 \
                           AND m.state = 'archived' AND m.hot_deleted = 1 \
                         ORDER BY m.bucket_start LIMIT 1"
                ))?
                .query_row(params![table_id.as_str(), from.as_micros()], |r| r.get(0))
                .optional()?;
            match due.into_iter().chain(masked).chain(retired).min() {
                Some(start) => Ok(Some(time(start, "bucket start")?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn partitions_to_compact(
        &self,
        table_id: &TableId,
        start: EventTime,
        end: EventTime,
        after: Option<&PartitionKey>,
        limit: usize,
        routes_due: bool,
    ) -> StoreResult<Vec<PartitionKey>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let table_id = table_id.clone();
        // Partition keys are never empty: the empty blob sorts before every one of them.
        let after = after.map_or_else(Vec::new, |p| p.as_bytes().to_vec());
        let sql = format!(
            "SELECT DISTINCT partition_key FROM pulpitum_v4_bucket_metadata \
             WHERE table_id = ?1 AND partition_key > ?2 \
               AND bucket_start >= ?3 AND bucket_start < ?4 AND {TO_COMPACT} \
             ORDER BY partition_key LIMIT ?5"
        );
        let retired_sql = format!(
            "SELECT DISTINCT m.partition_key FROM pulpitum_v4_retired_objects AS r \
             JOIN pulpitum_v4_bucket_metadata AS m ON m.object_key = r.object_key \
             WHERE {RETIRED_SEGMENT} AND m.table_id = ?1 AND m.partition_key > ?2 \
               AND m.bucket_start >= ?3 AND m.bucket_start < ?4 \
               AND m.state = 'archived' AND m.hot_deleted = 1 \
             ORDER BY m.partition_key LIMIT ?5"
        );
        self.run("partitions_to_compact", Mode::Read, move |tx, _| {
            let args = params![
                table_id.as_str(),
                after,
                start.as_micros(),
                end.as_micros(),
                to_i64(limit)
            ];
            // Each kind of work limited on its own, merged, then limited (as on PostgreSQL).
            let mut keys = std::collections::BTreeSet::new();
            if routes_due {
                keys = tx
                    .prepare_cached(&sql)?
                    .query_map(args, |r| r.get::<_, Vec<u8>>(0))?
                    .collect::<rusqlite::Result<_>>()?;
            }
            // Masked partitions, and partitions still routed to a retired segment.
            for due_now in [
                "SELECT DISTINCT k.partition_key FROM pulpitum_v4_row_masks AS k \
                 JOIN pulpitum_v4_bucket_metadata AS m ON m.table_id = k.table_id \
                   AND m.partition_key = k.partition_key AND m.bucket_key = k.bucket_key \
                 WHERE k.table_id = ?1 AND k.partition_key > ?2 AND k.purged_at IS NULL \
                   AND m.bucket_start >= ?3 AND m.bucket_start < ?4 \
                   AND m.state = 'archived' AND m.hot_deleted = 1 \
                 ORDER BY k.partition_key LIMIT ?5",
                &retired_sql,
            ] {
                let found = tx
                    .prepare_cached(due_now)?
                    .query_map(args, |r| r.get::<_, Vec<u8>>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                keys.extend(found);
            }
            keys.into_iter()
                .take(limit)
                .map(|k| PartitionKey::new(k).map_err(|e| corrupt(format!("partition key: {e}"))))
                .collect()
        })
        .await
    }

    async fn partition_sources(
        &self,
        table_id: &TableId,
        start: EventTime,
        end: EventTime,
        partitions: &[PartitionKey],
    ) -> StoreResult<WindowState> {
        if partitions.is_empty() {
            return Ok(WindowState::default());
        }
        let table_id = table_id.clone();
        let partitions = partitions.to_vec();
        let (from, to) = (start.as_micros(), end.as_micros());
        // One read transaction (one snapshot); one probe of the primary key per partition,
        // in key order, which in process costs less than building an array join.
        self.run("partition_sources", Mode::Read, move |tx, _| {
            let mut stmt = tx.prepare_cached(
                "SELECT m.bucket_key, m.bucket_strategy, m.bucket_start, m.object_key, \
                        (m.state = 'archived' AND m.hot_deleted = 1), \
                        EXISTS (SELECT 1 FROM pulpitum_v4_row_masks AS k \
                          WHERE k.table_id = m.table_id AND k.partition_key = m.partition_key \
                            AND k.bucket_key = m.bucket_key AND k.purged_at IS NULL), \
                        EXISTS (SELECT 1 FROM pulpitum_v4_retired_objects AS r \
                          WHERE r.object_key = m.object_key \
                            AND r.object_key GLOB '*/segments/*/s?????-g*/manifest.json') \
                 FROM pulpitum_v4_bucket_metadata AS m \
                 WHERE m.table_id = ?1 AND m.partition_key = ?2 \
                   AND m.bucket_start >= ?3 AND m.bucket_start < ?4 \
                 ORDER BY m.bucket_start",
            )?;
            let mut sorted = partitions.clone();
            sorted.sort();
            sorted.dedup();
            let mut state = WindowState::default();
            for pk in sorted {
                let rows: Vec<SourceRow> = stmt
                    .query_map(params![table_id.as_str(), pk.as_bytes(), from, to], |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                // A partition with a bucket not ready waits, unless work due at once (masks,
                // a retired route) waits in its ready buckets (see `WindowState`).
                if rows.iter().any(|r| !r.4) {
                    let due_now = rows.iter().any(|r| r.4 && (r.5 || r.6));
                    state.not_ready.push(pk.clone());
                    if !due_now {
                        continue;
                    }
                }
                for (key, strategy, stored_start, object_key, ready, masked, _) in rows {
                    if !ready {
                        continue;
                    }
                    let bucket = bucket_id(table_id.as_str(), pk.as_bytes(), &strategy, &key)?;
                    if bucket.bucket_key.start().as_micros() != stored_start {
                        return Err(corrupt(format!(
                            "bucket {bucket} is stored with a start that does not match its key"
                        )));
                    }
                    let object_key = object_key.ok_or_else(|| {
                        corrupt(format!("archived bucket {bucket} has no object key"))
                    })?;
                    state.sources.push(CompactionSource {
                        bucket_start: bucket.bucket_key.start(),
                        bucket_end: bucket.bucket_key.end(),
                        bucket,
                        object_key,
                        masked,
                    });
                }
            }
            Ok(state)
        })
        .await
    }

    async fn claim_compaction(
        &self,
        table_id: &TableId,
        window_key: &str,
        start: EventTime,
        end: EventTime,
        lease: Duration,
    ) -> StoreResult<Option<CompactionClaim>> {
        let table_id = table_id.clone();
        let window_key = window_key.to_string();
        self.run("claim_compaction", Mode::Write, move |tx, now| {
            let current: Option<(i64, Option<i64>)> = tx
                .prepare_cached(
                    "SELECT generation, lease_expires_at FROM pulpitum_v4_compaction_claims \
                     WHERE table_id = ?1 AND window_key = ?2",
                )?
                .query_row(params![table_id.as_str(), window_key], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            // A live lease holds the window; a released claim has none.
            if current.is_some_and(|(_, lease)| lease.is_some_and(|l| l > now)) {
                return Ok(None);
            }
            let claim = CompactionClaim {
                table_id: table_id.clone(),
                window_key: window_key.clone(),
                window_start: start,
                window_end: end,
                owner_token: fresh_token(),
                generation: current.map_or(1, |(g, _)| g + 1),
                lease_expires_at: time(plus(now, lease), "compaction lease expiry")?,
            };
            let args = params![
                table_id.as_str(),
                window_key,
                start.as_micros(),
                end.as_micros(),
                claim.owner_token,
                claim.generation,
                claim.lease_expires_at.as_micros(),
                now,
            ];
            let n = match current {
                None => tx.execute(
                    "INSERT INTO pulpitum_v4_compaction_claims (table_id, window_key, window_start, \
                       window_end, owner_token, generation, lease_expires_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    args,
                )?,
                // Compare-and-set on the generation read above; the write lock already
                // excludes other writers, this keeps the statement correct on its own.
                Some(_) => tx.execute(
                    "UPDATE pulpitum_v4_compaction_claims SET window_start = ?3, window_end = ?4, \
                       owner_token = ?5, generation = ?6, lease_expires_at = ?7, updated_at = ?8 \
                     WHERE table_id = ?1 AND window_key = ?2 AND generation = ?6 - 1",
                    args,
                )?,
            };
            Ok((n == 1).then_some(claim))
        })
        .await
    }

    async fn renew_compaction(
        &self,
        claim: &CompactionClaim,
        lease: Duration,
    ) -> StoreResult<CompactionClaim> {
        let claim = claim.clone();
        self.run("renew_compaction", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, now)?;
            let expires = plus(now, lease);
            tx.execute(
                "UPDATE pulpitum_v4_compaction_claims SET lease_expires_at = ?5, updated_at = ?6 \
                 WHERE table_id = ?1 AND window_key = ?2 AND owner_token = ?3 AND generation = ?4",
                params![
                    claim.table_id.as_str(),
                    claim.window_key,
                    claim.owner_token,
                    claim.generation,
                    expires,
                    now,
                ],
            )?;
            Ok(CompactionClaim {
                lease_expires_at: time(expires, "compaction lease expiry")?,
                ..claim.clone()
            })
        })
        .await
    }

    async fn release_compaction(&self, claim: &CompactionClaim) -> StoreResult<()> {
        let claim = claim.clone();
        // Token and generation only, as on PostgreSQL: an expired claim nobody took over is
        // still this worker's to end.
        self.run("release_compaction", Mode::Write, move |tx, now| {
            tx.execute(
                "UPDATE pulpitum_v4_compaction_claims SET owner_token = NULL, lease_expires_at = NULL, \
                   updated_at = ?5 \
                 WHERE table_id = ?1 AND window_key = ?2 AND owner_token = ?3 AND generation = ?4",
                params![
                    claim.table_id.as_str(),
                    claim.window_key,
                    claim.owner_token,
                    claim.generation,
                    now,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn compaction_claims(&self) -> StoreResult<Vec<CompactionClaim>> {
        self.run("compaction_claims", Mode::Read, |tx, _| {
            let rows = tx
                .prepare_cached(&format!(
                    "SELECT {CLAIM_COLS} FROM pulpitum_v4_compaction_claims \
                     WHERE owner_token IS NOT NULL ORDER BY table_id, window_key"
                ))?
                .query_map([], claim_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter().map(claim_from).collect()
        })
        .await
    }

    async fn switch_routes(
        &self,
        claim: &CompactionClaim,
        switches: &[RouteSwitch],
    ) -> StoreResult<u64> {
        check_switches(claim, switches)?;
        let claim = claim.clone();
        let switches = switches.to_vec();
        let retired = retired_keys(&switches);
        let segments = segment_routes(&switches);
        self.run("switch_routes", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, now)?;
            // Every route is checked before anything is written, so the first bucket that
            // differs is named by what the compaction read.
            {
                let mut check = tx.prepare_cached(&format!(
                    "SELECT state, hot_deleted, object_key FROM pulpitum_v4_bucket_metadata \
                     WHERE {BUCKET_PK}"
                ))?;
                for s in &switches {
                    let b = &s.bucket;
                    let row: Option<(String, bool, Option<String>)> = check
                        .query_row(
                            params![
                                b.table_id.as_str(),
                                b.partition_key.as_bytes(),
                                b.bucket_key.to_string()
                            ],
                            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                        )
                        .optional()?;
                    let reason = match &row {
                        None => route_mismatch(&s.from_object_key, None, None, None),
                        Some((state, hot_deleted, key)) => route_mismatch(
                            &s.from_object_key,
                            Some(state),
                            Some(*hot_deleted),
                            key.as_deref(),
                        ),
                    };
                    if let Some(reason) = reason {
                        return Err(StoreError::RouteChanged {
                            bucket: b.clone(),
                            reason,
                        }
                        .into());
                    }
                }
            }
            let mut switched = 0u64;
            {
                let mut update = tx.prepare_cached(&format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET object_key = ?5, updated_at = ?6 \
                     WHERE {BUCKET_PK} AND state = 'archived' AND hot_deleted = 1 \
                       AND object_key = ?4"
                ))?;
                for s in &switches {
                    let b = &s.bucket;
                    switched += update.execute(params![
                        b.table_id.as_str(),
                        b.partition_key.as_bytes(),
                        b.bucket_key.to_string(),
                        s.from_object_key,
                        s.to_object_key,
                        now,
                    ])? as u64;
                }
            }
            if switched != switches.len() as u64 {
                // Impossible under the write lock after the checks above; refuse rather
                // than commit a partial switch.
                return Err(TxError::Store(StoreError::Backend {
                    operation: "switch_routes",
                    detail: format!("updated {switched} of {} buckets", switches.len()),
                }));
            }
            // The latest retirement wins: readers may hold a route to the key until the
            // last switch that replaced it, plus their cache bound.
            let mut retire = tx.prepare_cached(
                "INSERT INTO pulpitum_v4_retired_objects (object_key, retired_at) VALUES (?1, ?2) \
                 ON CONFLICT (object_key) DO UPDATE SET \
                   retired_at = max(retired_at, excluded.retired_at)",
            )?;
            for key in &retired {
                retire.execute(params![key, now])?;
            }
            // In the same transaction as the routes (see the PostgreSQL store).
            let mut record = tx.prepare_cached(
                "INSERT INTO pulpitum_v4_segment_routes \
                   (table_id, object_key, window_start, window_end, buckets) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (table_id, object_key) DO UPDATE SET \
                   window_start = min(window_start, excluded.window_start), \
                   window_end = max(window_end, excluded.window_end), \
                   buckets = max(buckets, excluded.buckets)",
            )?;
            for r in &segments {
                record.execute(params![
                    claim.table_id.as_str(),
                    r.object_key,
                    r.window_start.as_micros(),
                    r.window_end.as_micros(),
                    r.buckets,
                ])?;
            }
            Ok(switched)
        })
        .await
    }

    async fn mark_masks_purged(
        &self,
        bucket: &BucketId,
        route: &str,
        masks: &[RowMask],
    ) -> StoreResult<u64> {
        if masks.is_empty() {
            return Ok(0);
        }
        let bucket = bucket.clone();
        let route = route.to_string();
        let masks = masks.to_vec();
        self.run("mark_masks_purged", Mode::Write, move |tx, now| {
            let ids = params![
                bucket.table_id.as_str(),
                bucket.partition_key.as_bytes(),
                bucket.bucket_key.to_string()
            ];
            // The route first (under the write lock nothing moves it before the updates).
            let routed: Option<Option<String>> = tx
                .prepare_cached(&format!(
                    "SELECT object_key FROM pulpitum_v4_bucket_metadata \
                     WHERE {BUCKET_PK} AND state = 'archived'"
                ))?
                .query_row(ids, |r| r.get(0))
                .optional()?;
            if routed.flatten().as_deref() != Some(route.as_str()) {
                return Ok(0);
            }
            let mut stmt = tx.prepare_cached(&format!(
                "UPDATE pulpitum_v4_row_masks SET purged_at = ?6 \
                 WHERE {BUCKET_PK} AND event_time = ?4 AND sort_key = ?5 \
                   AND purged_at IS NULL AND value IS ?7"
            ))?;
            let mut marked = 0u64;
            for m in &masks {
                marked += stmt.execute(params![
                    bucket.table_id.as_str(),
                    bucket.partition_key.as_bytes(),
                    bucket.bucket_key.to_string(),
                    m.event_time.as_micros(),
                    m.sort_key.as_bytes(),
                    now,
                    m.value
                ])? as u64;
            }
            Ok(marked)
        })
        .await
    }

    async fn forget_purged_masks(&self, older_than: Duration, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let older = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        self.run("forget_purged_masks", Mode::Write, move |tx, now| {
            let cutoff = now.saturating_sub(older);
            let n = tx
                .prepare_cached(
                    "DELETE FROM pulpitum_v4_row_masks WHERE (table_id, partition_key, \
                       bucket_key, event_time, sort_key) IN (SELECT table_id, partition_key, \
                       bucket_key, event_time, sort_key FROM pulpitum_v4_row_masks \
                       WHERE purged_at <= ?1 LIMIT ?2)",
                )?
                .execute(params![cutoff, to_i64(limit)])?;
            Ok(n as u64)
        })
        .await
    }

    async fn drop_empty_buckets(
        &self,
        claim: &CompactionClaim,
        buckets: &[CompactionSource],
    ) -> StoreResult<u64> {
        check_sources(claim, buckets)?;
        if buckets.is_empty() {
            return Ok(0);
        }
        let claim = claim.clone();
        let buckets = buckets.to_vec();
        self.run("drop_empty_buckets", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, now)?;
            let mut dropped = 0u64;
            for s in &buckets {
                let b = &s.bucket;
                let key = b.bucket_key.to_string();
                let ids = params![b.table_id.as_str(), b.partition_key.as_bytes(), key];
                let row: Option<(String, bool, Option<String>)> = tx
                    .prepare_cached(&format!(
                        "SELECT state, hot_deleted, object_key FROM pulpitum_v4_bucket_metadata \
                         WHERE {BUCKET_PK}"
                    ))?
                    .query_row(ids, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?;
                let reason = match &row {
                    None => route_mismatch(&s.object_key, None, None, None),
                    Some((state, hot_deleted, key)) => route_mismatch(
                        &s.object_key,
                        Some(state),
                        Some(*hot_deleted),
                        key.as_deref(),
                    ),
                };
                if let Some(reason) = reason {
                    return Err(StoreError::RouteChanged {
                        bucket: b.clone(),
                        reason,
                    }
                    .into());
                }
                tx.prepare_cached(&format!(
                    "DELETE FROM pulpitum_v4_bucket_metadata WHERE {BUCKET_PK}"
                ))?
                .execute(ids)?;
                // Masks stay, marked rewritten: a reader holding the old route applies them
                // until garbage collection forgets them.
                super::changes::mark_bucket_masks_purged(tx, b, now)?;
                tx.prepare_cached(
                    "INSERT INTO pulpitum_v4_retired_objects (object_key, retired_at) \
                     VALUES (?1, ?2) ON CONFLICT (object_key) DO UPDATE SET \
                       retired_at = max(retired_at, excluded.retired_at)",
                )?
                .execute(params![s.object_key, now])?;
                dropped += 1;
            }
            Ok(dropped)
        })
        .await
    }

    async fn retired_objects(&self) -> StoreResult<Vec<RetiredObject>> {
        self.run("retired_objects", Mode::Read, |tx, _| {
            let rows = tx
                .prepare_cached(
                    "SELECT object_key, retired_at FROM pulpitum_v4_retired_objects \
                     ORDER BY object_key",
                )?
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(object_key, at)| {
                    Ok(RetiredObject {
                        object_key,
                        retired_at: time(at, "retired_at")?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn forget_retired(&self, keys: &[String]) -> StoreResult<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let keys = keys.to_vec();
        self.run("forget_retired", Mode::Write, move |tx, _| {
            let mut delete =
                tx.prepare_cached("DELETE FROM pulpitum_v4_retired_objects WHERE object_key = ?1")?;
            let mut deleted = 0u64;
            for key in &keys {
                deleted += delete.execute([key])? as u64;
            }
            Ok(deleted)
        })
        .await
    }

    async fn segments_not_counted(
        &self,
        after: Option<&(TableId, String)>,
        limit: usize,
    ) -> StoreResult<Vec<(TableId, String)>> {
        let (table, key) = after.map_or((String::new(), String::new()), |(t, k)| {
            (t.as_str().to_string(), k.clone())
        });
        let n = to_i64(limit.max(1));
        self.run("segments_not_counted", Mode::Read, move |tx, _| {
            let rows = tx
                .prepare_cached(
                    "SELECT table_id, object_key FROM pulpitum_v4_segment_routes \
                     WHERE buckets < 0 AND (table_id, object_key) > (?1, ?2) \
                     ORDER BY table_id, object_key LIMIT ?3",
                )?
                .query_map(params![table, key, n], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(t, k)| {
                    let t = TableId::new(t)
                        .map_err(|e| corrupt(format!("segment route table: {e}")))?;
                    Ok((t, k))
                })
                .collect()
        })
        .await
    }

    async fn record_segment_count(
        &self,
        table: &TableId,
        object_key: &str,
        buckets: u64,
    ) -> StoreResult<bool> {
        let table = table.as_str().to_string();
        let key = object_key.to_string();
        self.run("record_segment_count", Mode::Write, move |tx, _| {
            let n = i64::try_from(buckets)
                .map_err(|_| corrupt(format!("a segment of {buckets} buckets")))?;
            let updated = tx
                .prepare_cached(
                    "UPDATE pulpitum_v4_segment_routes SET buckets = ?3 \
                     WHERE table_id = ?1 AND object_key = ?2 AND buckets < 0",
                )?
                .execute(params![table, key, n])?;
            Ok(updated == 1)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_work_list_predicate_is_the_partial_indexes_verbatim() {
        let pred = super::TO_COMPACT
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let sql = include_str!("../../../sql/sqlite/0008_compaction_idx.sql");
        assert_eq!(sql.matches(&format!("WHERE {pred};")).count(), 2, "{sql}");
        // The GLOB is the LIKE of PostgreSQL's index: `%` is `*`, `_` is `?`.
        let glob = crate::store::SEGMENT_KEY_LIKE
            .replace('%', "*")
            .replace('_', "?");
        assert_eq!(glob, crate::store::SEGMENT_KEY_GLOB);
        assert!(pred.contains(crate::store::SEGMENT_KEY_GLOB));
    }
}
