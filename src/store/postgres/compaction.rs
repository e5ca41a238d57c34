//! [`Compaction`] on PostgreSQL: window claims, a window's sources, the route switch and the
//! retired objects (docs/segments.md, sections 5 to 7).
//!
//! A window claim is one conditional upsert of its `pulpitum_v4_compaction_claims` row (a fresh
//! token, generation + 1, a lease from the database's `now()`); renewing and releasing are
//! conditional updates on token and generation, and a refused write re-reads the row in
//! the same transaction to say why, as the bucket claims do (`claims`).
//!
//! The switch is one serializable transaction. Its first statement is a write to the claim
//! row that matches only a current claim, so a claim taken by another compactor conflicts
//! with the switch on that row whichever commits first. Then the buckets' routes are read
//! (all of them, before anything is written, so the first bucket that differs is named by
//! what the compaction read, not by this switch's own writes), updated with the same
//! conditions repeated in the `UPDATE`'s `WHERE`, and counted; the replaced keys are
//! recorded last. Thousands of buckets go as arrays (`unnest`), [`SWITCH_CHUNK`] per
//! statement: one statement per chunk rather than per bucket, and no statement so large that
//! CockroachDB's advice against huge multi-row writes applies to it.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_postgres::{IsolationLevel, Row};

use super::claims::new_token;
use super::decode::{corrupt, event_time};
use super::sql::{limit_param, micros, COMPACTIONS, META, RETIRED, SEGMENT_ROUTES};
use super::work_list::{
    next_start_sql, partitions_sql, retired_partitions_sql, retired_start_sql, RETIRED_SEGMENT,
};

/// The row masks table (edits and deletes of archived rows).
pub(super) const MASKS: &str = "pulpitum_v4_row_masks";
use super::{PgStore, TxError};
use crate::model::{BucketId, BucketKey, EventTime, PartitionKey, TableId};
use crate::store::compaction::{claim_mismatch, StoredClaim};
use crate::store::{
    Compaction, CompactionClaim, CompactionSource, RetiredObject, RouteSwitch, RowMask, StoreError,
    StoreResult, WindowState,
};

/// Buckets per statement of a switch (and keys per statement of the retired-object writes).
pub(super) const SWITCH_CHUNK: usize = 5_000;

/// The claim columns, in the order [`decode_claim`] reads them.
const CLAIM_COLS: &str =
    "table_id, window_key, window_start, window_end, owner_token, generation, lease_expires_at";

fn decode_claim(row: &Row) -> StoreResult<CompactionClaim> {
    let bad = |e: tokio_postgres::Error| corrupt("compaction claim row", e);
    let table: String = row.try_get(0).map_err(bad)?;
    let start: DateTime<Utc> = row.try_get(2).map_err(bad)?;
    let end: DateTime<Utc> = row.try_get(3).map_err(bad)?;
    let token: Option<String> = row.try_get(4).map_err(bad)?;
    let lease: Option<DateTime<Utc>> = row.try_get(6).map_err(bad)?;
    let (Some(owner_token), Some(lease)) = (token, lease) else {
        return Err(StoreError::Corrupt(
            "a held compaction claim without an owner token or lease".into(),
        ));
    };
    Ok(CompactionClaim {
        table_id: TableId::new(table).map_err(|e| corrupt("compaction table id", e))?,
        window_key: row.try_get(1).map_err(bad)?,
        window_start: event_time(start, "window_start")?,
        window_end: event_time(end, "window_end")?,
        owner_token,
        generation: row.try_get(5).map_err(bad)?,
        lease_expires_at: event_time(lease, "compaction lease_expires_at")?,
    })
}

impl PgStore {
    /// Re-reads a window's claim row inside the transaction of a refused write and names
    /// what makes `claim` stale; a row that shows none of it changed while it was checked,
    /// and the transaction runs again.
    pub(super) async fn compaction_refusal(
        tx: &deadpool_postgres::Transaction<'_>,
        claim: &CompactionClaim,
        op: &'static str,
    ) -> TxError {
        let sql = format!(
            "SELECT owner_token, generation, lease_expires_at, now() FROM {COMPACTIONS} \
             WHERE table_id = $1 AND window_key = $2"
        );
        let row = match tx
            .query_opt(&sql, &[&claim.table_id.as_str(), &claim.window_key])
            .await
        {
            Ok(r) => r,
            Err(e) => return TxError::Db(e),
        };
        let Some(row) = row else {
            return stale(claim, "the window was never claimed".into());
        };
        let parsed: Result<_, tokio_postgres::Error> = (|| {
            Ok((
                row.try_get::<_, Option<String>>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, Option<DateTime<Utc>>>(2)?,
                row.try_get::<_, DateTime<Utc>>(3)?,
            ))
        })();
        let (token, generation, lease, now) = match parsed {
            Ok(v) => v,
            Err(e) => return TxError::Store(corrupt("compaction claim row", e)),
        };
        let times = lease
            .map(|l| event_time(l, "compaction lease_expires_at"))
            .transpose()
            .and_then(|l| Ok((l, event_time(now, "now")?)));
        let (lease, now) = match times {
            Ok(v) => v,
            Err(e) => return TxError::Store(e),
        };
        let stored = StoredClaim {
            owner_token: token.as_deref(),
            generation,
            lease_expires_at: lease,
        };
        match claim_mismatch(claim, Some(stored), now) {
            Some(reason) => stale(claim, reason),
            None => TxError::Conflict(format!(
                "{op}: the window's claim changed while it was checked"
            )),
        }
    }
}

pub(super) fn stale(claim: &CompactionClaim, reason: String) -> TxError {
    TxError::Store(StoreError::StaleCompaction {
        table_id: claim.table_id.clone(),
        window_key: claim.window_key.clone(),
        generation: claim.generation,
        reason,
    })
}

#[async_trait]
impl Compaction for PgStore {
    async fn next_compaction_start(
        &self,
        table_id: &TableId,
        from: EventTime,
        before: EventTime,
    ) -> StoreResult<Option<EventTime>> {
        // The first entry of the partial index at or after `from`; whether it is due is
        // decided here, not in the `WHERE`, so that a table whose earliest work is not due
        // yet costs one probe rather than a scan of everything after it.
        let sql = next_start_sql();
        let masked_sql = format!(
            "SELECT m.bucket_start FROM {MASKS} AS k JOIN {META} AS m \
               ON m.table_id = k.table_id AND m.partition_key = k.partition_key \
              AND m.bucket_key = k.bucket_key \
             WHERE k.table_id = $1 AND k.purged_at IS NULL AND m.bucket_start >= $2 \
               AND m.state = 'archived' AND m.hot_deleted \
             ORDER BY m.bucket_start LIMIT 1"
        );
        let retired_sql = retired_start_sql();
        let from = from.to_datetime();
        self.run("next_compaction_start", || async {
            let client = self.pooled().await?;
            let bad = |e: tokio_postgres::Error| corrupt("compaction candidate", e);
            let mut first = None;
            if let Some(row) = client.query_opt(&sql, &[&table_id.as_str(), &from]).await? {
                let start: DateTime<Utc> = row.try_get(0).map_err(bad)?;
                let end: DateTime<Utc> = row.try_get(1).map_err(bad)?;
                if event_time(end, "bucket_end")? <= before {
                    first = Some(event_time(start, "bucket_start")?);
                }
            }
            // Masked buckets, and buckets still routed to a retired segment, are due at
            // once.
            for due_now in [&masked_sql, &retired_sql] {
                if let Some(row) = client
                    .query_opt(due_now, &[&table_id.as_str(), &from])
                    .await?
                {
                    let start: DateTime<Utc> = row.try_get(0).map_err(bad)?;
                    let start = event_time(start, "bucket_start")?;
                    first = Some(first.map_or(start, |f: EventTime| f.min(start)));
                }
            }
            Ok(first)
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
        // Partition keys are never empty, so the empty key sorts before every one of them.
        let sql = partitions_sql();
        let masked_sql = format!(
            "SELECT DISTINCT k.partition_key FROM {MASKS} AS k JOIN {META} AS m \
               ON m.table_id = k.table_id AND m.partition_key = k.partition_key \
              AND m.bucket_key = k.bucket_key \
             WHERE k.table_id = $1 AND k.partition_key > $2 AND k.purged_at IS NULL \
               AND m.bucket_start >= $3 AND m.bucket_start < $4 \
               AND m.state = 'archived' AND m.hot_deleted \
             ORDER BY k.partition_key LIMIT $5"
        );
        let retired_sql = retired_partitions_sql();
        let after: &[u8] = after.map_or(&[], |p| p.as_bytes());
        let (from, to) = (start.to_datetime(), end.to_datetime());
        let n = limit_param(limit);
        self.run("partitions_to_compact", || async {
            let client = self.pooled().await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                [&table_id.as_str(), &after, &from, &to, &n];
            // Three lists, each the first `limit` of its kind: the first `limit` of their
            // union is among them (one statement with `UNION` would list every partition
            // with work before its `LIMIT`).
            let mut keys = std::collections::BTreeSet::new();
            let routed = if routes_due {
                client.query(&sql, &params).await?
            } else {
                Vec::new()
            };
            let masked = client.query(&masked_sql, &params).await?;
            let retired = client.query(&retired_sql, &params).await?;
            for rows in [routed, masked, retired] {
                for row in &rows {
                    let pk: Vec<u8> = row
                        .try_get(0)
                        .map_err(|e| corrupt("compaction partition", e))?;
                    keys.insert(pk);
                }
            }
            keys.into_iter()
                .take(limit)
                .map(|pk| PartitionKey::new(pk).map_err(|e| corrupt("partition key", e).into()))
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
        // One statement: every bucket of the listed partitions in the window, by primary
        // key order per partition (a join with the array, as the change lookups do, so the
        // planner probes the key rather than scanning the window). Readiness is decided
        // from the same rows, so sources and not-ready partitions are one snapshot.
        let sql = format!(
            "SELECT m.partition_key, m.bucket_key, m.bucket_start, m.object_key, \
                    (m.state = 'archived' AND m.hot_deleted) AS ready, \
                    EXISTS (SELECT 1 FROM {MASKS} AS k WHERE k.table_id = m.table_id \
                      AND k.partition_key = m.partition_key AND k.bucket_key = m.bucket_key \
                      AND k.purged_at IS NULL) AS masked, \
                    EXISTS (SELECT 1 FROM {RETIRED} AS r WHERE r.object_key = m.object_key \
                      AND {RETIRED_SEGMENT}) AS on_retired \
             FROM {META} AS m JOIN unnest($2::BYTEA[]) AS p(pk) ON m.partition_key = p.pk \
             WHERE m.table_id = $1 AND m.bucket_start >= $3 AND m.bucket_start < $4 \
             ORDER BY m.partition_key, m.bucket_start"
        );
        let keys: Vec<&[u8]> = partitions.iter().map(PartitionKey::as_bytes).collect();
        let (from, to) = (start.to_datetime(), end.to_datetime());
        self.run("partition_sources", || async {
            let client = self.pooled().await?;
            let rows = client
                .query(&sql, &[&table_id.as_str(), &keys, &from, &to])
                .await?;
            let mut state = WindowState::default();
            let mut due_now: std::collections::HashSet<PartitionKey> =
                std::collections::HashSet::new();
            for row in &rows {
                let bad = |e: tokio_postgres::Error| corrupt("compaction source row", e);
                let pk: Vec<u8> = row.try_get(0).map_err(bad)?;
                let key: String = row.try_get(1).map_err(bad)?;
                let stored_start: DateTime<Utc> = row.try_get(2).map_err(bad)?;
                let object_key: Option<String> = row.try_get(3).map_err(bad)?;
                let ready: bool = row.try_get(4).map_err(bad)?;
                let masked: bool = row.try_get(5).map_err(bad)?;
                let on_retired: bool = row.try_get(6).map_err(bad)?;
                let partition_key =
                    PartitionKey::new(pk).map_err(|e| corrupt("partition key", e))?;
                if ready && (masked || on_retired) {
                    due_now.insert(partition_key.clone());
                }
                if !ready {
                    if state.not_ready.last() != Some(&partition_key) {
                        state.not_ready.push(partition_key);
                    }
                    continue;
                }
                let bucket_key =
                    BucketKey::parse_any(&key).map_err(|e| corrupt("bucket key", e))?;
                if event_time(stored_start, "bucket_start")? != bucket_key.start() {
                    return Err(TxError::Store(StoreError::Corrupt(format!(
                        "bucket {key} is stored with a start that does not match its key"
                    ))));
                }
                let bucket = crate::model::BucketId {
                    table_id: table_id.clone(),
                    partition_key,
                    bucket_key,
                };
                let object_key = object_key.ok_or_else(|| {
                    StoreError::Corrupt(format!("archived bucket {bucket} has no object key"))
                })?;
                state.sources.push(CompactionSource {
                    bucket_start: bucket_key.start(),
                    bucket_end: bucket_key.end(),
                    bucket,
                    object_key,
                    masked,
                });
            }
            // A partition with any bucket not ready is left for a later pass, unless work
            // that is due at once waits in its ready buckets (see `WindowState`).
            if !state.not_ready.is_empty() {
                let not_ready: std::collections::HashSet<&PartitionKey> =
                    state.not_ready.iter().collect();
                let kept = std::mem::take(&mut state.sources)
                    .into_iter()
                    .filter(|s| {
                        !not_ready.contains(&s.bucket.partition_key)
                            || due_now.contains(&s.bucket.partition_key)
                    })
                    .collect();
                state.sources = kept;
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
        // A new window starts at generation 1; an existing one is taken only when no live
        // lease holds it (released claims have none), and takes generation + 1.
        let sql = format!(
            "INSERT INTO {COMPACTIONS} AS c \
               (table_id, window_key, window_start, window_end, owner_token, generation, \
                lease_expires_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 1, now() + $6::INT8 * INTERVAL '1 microsecond', now()) \
             ON CONFLICT (table_id, window_key) DO UPDATE SET \
               window_start = excluded.window_start, window_end = excluded.window_end, \
               owner_token = excluded.owner_token, generation = c.generation + 1, \
               lease_expires_at = excluded.lease_expires_at, updated_at = now() \
             WHERE c.lease_expires_at IS NULL OR c.lease_expires_at <= now() \
             RETURNING {CLAIM_COLS}"
        );
        let (from, to) = (start.to_datetime(), end.to_datetime());
        let lease = micros(lease);
        self.run("claim_compaction", || async {
            let token = new_token();
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let row = tx
                .query_opt(
                    &sql,
                    &[&table_id.as_str(), &window_key, &from, &to, &token, &lease],
                )
                .await?;
            let claim = row.as_ref().map(decode_claim).transpose()?;
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(claim)
        })
        .await
    }

    async fn renew_compaction(
        &self,
        claim: &CompactionClaim,
        lease: Duration,
    ) -> StoreResult<CompactionClaim> {
        let sql = format!(
            "UPDATE {COMPACTIONS} SET lease_expires_at = now() + $5::INT8 * INTERVAL '1 microsecond', \
               updated_at = now() \
             WHERE table_id = $1 AND window_key = $2 AND owner_token = $3 AND generation = $4 \
               AND lease_expires_at > now() \
             RETURNING lease_expires_at"
        );
        let lease = micros(lease);
        self.run("renew_compaction", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let row = tx
                .query_opt(
                    &sql,
                    &[
                        &claim.table_id.as_str(),
                        &claim.window_key,
                        &claim.owner_token,
                        &claim.generation,
                        &lease,
                    ],
                )
                .await?;
            let Some(row) = row else {
                return Err(Self::compaction_refusal(&tx, claim, "renew_compaction").await);
            };
            let expires: DateTime<Utc> = row.try_get(0)?;
            let lease_expires_at = event_time(expires, "compaction lease_expires_at")?;
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(CompactionClaim {
                lease_expires_at,
                ..claim.clone()
            })
        })
        .await
    }

    async fn release_compaction(&self, claim: &CompactionClaim) -> StoreResult<()> {
        // Token and generation only: a claim whose lease ran out but that nobody took over
        // is still this worker's to end, and releasing it changes nothing for anyone else.
        let sql = format!(
            "UPDATE {COMPACTIONS} SET owner_token = NULL, lease_expires_at = NULL, updated_at = now() \
             WHERE table_id = $1 AND window_key = $2 AND owner_token = $3 AND generation = $4"
        );
        self.run("release_compaction", || async {
            let client = self.pooled().await?;
            client
                .execute(
                    &sql,
                    &[
                        &claim.table_id.as_str(),
                        &claim.window_key,
                        &claim.owner_token,
                        &claim.generation,
                    ],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn compaction_claims(&self) -> StoreResult<Vec<CompactionClaim>> {
        let sql = format!(
            "SELECT {CLAIM_COLS} FROM {COMPACTIONS} WHERE owner_token IS NOT NULL \
             ORDER BY table_id, window_key"
        );
        self.run("compaction_claims", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[]).await?;
            Ok(rows
                .iter()
                .map(decode_claim)
                .collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn switch_routes(
        &self,
        claim: &CompactionClaim,
        switches: &[RouteSwitch],
    ) -> StoreResult<u64> {
        self.switch(claim, switches).await
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
        // One statement: the masks as read (kind and value compared, so one changed since is
        // left), and the route compared in the same statement.
        let sql = format!(
            "UPDATE {MASKS} AS k SET purged_at = now() \
             FROM unnest($4::TIMESTAMPTZ[], $5::BYTEA[], $6::BYTEA[]) AS u(t, s, v) \
             WHERE k.table_id = $1 AND k.partition_key = $2 AND k.bucket_key = $3 \
               AND k.event_time = u.t AND k.sort_key = u.s AND k.purged_at IS NULL \
               AND k.value IS NOT DISTINCT FROM u.v \
               AND EXISTS (SELECT 1 FROM {META} AS m WHERE m.table_id = $1 \
                 AND m.partition_key = $2 AND m.bucket_key = $3 AND m.state = 'archived' \
                 AND m.object_key = $7)"
        );
        let times: Vec<DateTime<Utc>> = masks.iter().map(|m| m.event_time.to_datetime()).collect();
        let sorts: Vec<&[u8]> = masks.iter().map(|m| m.sort_key.as_bytes()).collect();
        let values: Vec<Option<&[u8]>> = masks.iter().map(|m| m.value.as_deref()).collect();
        let pk = bucket.partition_key.as_bytes();
        let key = bucket.bucket_key.to_string();
        self.run("mark_masks_purged", || async {
            let client = self.pooled().await?;
            let n = client
                .execute(
                    &sql,
                    &[
                        &bucket.table_id.as_str(),
                        &pk,
                        &key,
                        &times,
                        &sorts,
                        &values,
                        &route,
                    ],
                )
                .await?;
            Ok(n)
        })
        .await
    }

    async fn forget_purged_masks(&self, older_than: Duration, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        // PostgreSQL has no `DELETE ... LIMIT`: the batch is chosen by key.
        let sql = format!(
            "DELETE FROM {MASKS} AS k \
             USING (SELECT table_id, partition_key, bucket_key, event_time, sort_key FROM {MASKS} \
                    WHERE purged_at <= now() - $1::INT8 * INTERVAL '1 microsecond' LIMIT $2) AS d \
             WHERE k.table_id = d.table_id AND k.partition_key = d.partition_key \
               AND k.bucket_key = d.bucket_key AND k.event_time = d.event_time \
               AND k.sort_key = d.sort_key \
               AND k.purged_at <= now() - $1::INT8 * INTERVAL '1 microsecond'"
        );
        let older = micros(older_than);
        let n = limit_param(limit);
        self.run("forget_purged_masks", || async {
            let client = self.pooled().await?;
            Ok(client.execute(&sql, &[&older, &n]).await?)
        })
        .await
    }

    async fn drop_empty_buckets(
        &self,
        claim: &CompactionClaim,
        buckets: &[CompactionSource],
    ) -> StoreResult<u64> {
        self.drop_empty(claim, buckets).await
    }

    async fn retired_objects(&self) -> StoreResult<Vec<RetiredObject>> {
        let sql = format!("SELECT object_key, retired_at FROM {RETIRED} ORDER BY object_key");
        self.run("retired_objects", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[]).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let bad = |e: tokio_postgres::Error| corrupt("retired object row", e);
                let at: DateTime<Utc> = row.try_get(1).map_err(bad)?;
                out.push(RetiredObject {
                    object_key: row.try_get(0).map_err(bad)?,
                    retired_at: event_time(at, "retired_at")?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn forget_retired(&self, keys: &[String]) -> StoreResult<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let sql = format!("DELETE FROM {RETIRED} WHERE object_key = ANY($1::TEXT[])");
        self.run("forget_retired", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let mut deleted = 0;
            for chunk in keys.chunks(SWITCH_CHUNK) {
                deleted += tx.execute(&sql, &[&chunk]).await?;
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(deleted)
        })
        .await
    }

    async fn segments_not_counted(
        &self,
        after: Option<&(TableId, String)>,
        limit: usize,
    ) -> StoreResult<Vec<(TableId, String)>> {
        // The table holds one row per segment: read in key order past the last one seen,
        // so a caller's pages cover every row once whatever it does between them.
        let sql = format!(
            "SELECT table_id, object_key FROM {SEGMENT_ROUTES} \
             WHERE buckets < 0 AND (table_id, object_key) > ($1, $2) \
             ORDER BY table_id, object_key LIMIT $3"
        );
        let (table, key) = after.map_or(("", ""), |(t, k)| (t.as_str(), k.as_str()));
        let n = limit_param(limit);
        self.run("segments_not_counted", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[&table, &key, &n]).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let bad = |e: tokio_postgres::Error| corrupt("segment route row", e);
                let table: String = row.try_get(0).map_err(bad)?;
                let table = TableId::new(table).map_err(|e| corrupt("segment route table", e))?;
                out.push((table, row.try_get(1).map_err(bad)?));
            }
            Ok(out)
        })
        .await
    }

    async fn record_segment_count(
        &self,
        table: &TableId,
        object_key: &str,
        buckets: u64,
    ) -> StoreResult<bool> {
        let n = i64::try_from(buckets).map_err(|_| corrupt("segment bucket count", buckets))?;
        let sql = format!(
            "UPDATE {SEGMENT_ROUTES} SET buckets = $3 \
             WHERE table_id = $1 AND object_key = $2 AND buckets < 0"
        );
        self.run("record_segment_count", || async {
            let client = self.pooled().await?;
            Ok(client
                .execute(&sql, &[&table.as_str(), &object_key, &n])
                .await?
                == 1)
        })
        .await
    }
}
