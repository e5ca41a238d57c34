//! [`Changes`] for the embedded store, with the same meaning as on PostgreSQL (see
//! `store::postgres::changes`): a change set is one `BEGIN IMMEDIATE` transaction, so the
//! state check of every bucket it touches and its writes hold SQLite's single write lock
//! together, and no claim can fence a bucket in between.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};

use crate::model::{BucketId, BucketKey, EventTime, PartitionKey, SortKey, TableId};
use crate::store::changes::{by_bucket, check_masks, conflict, operation};
use crate::store::{
    ChangeOutcome, Changes, ExpiredBucket, RowChange, RowMask, StoreError, StoreResult,
};

use super::catalog::require_table;
use super::decode::{corrupt, state_name, time, BUCKET_PK};
use super::{Mode, SqliteStore, TxResult};

/// A mask (aliased `m`, its bucket's key in `?1`..`?3`) belongs to the bucket as it is now:
/// no registry row of that key was created after it (see the PostgreSQL store's
/// `CURRENT_INCARNATION`: a bucket created again by a late append must not inherit the
/// masks its removed namesake keeps for readers on the old route).
const CURRENT_INCARNATION: &str = "NOT EXISTS (SELECT 1 FROM pulpitum_v4_bucket_metadata b \
     WHERE b.table_id = ?1 AND b.partition_key = ?2 AND b.bucket_key = ?3 \
       AND b.created_at > m.created_at)";

#[async_trait]
impl Changes for SqliteStore {
    async fn apply_changes(
        &self,
        table_id: &TableId,
        read_at: EventTime,
        changes: &[RowChange],
    ) -> StoreResult<ChangeOutcome> {
        if changes.is_empty() {
            return Ok(ChangeOutcome::default());
        }
        let table_id = table_id.clone();
        let changes = changes.to_vec();
        self.run("apply_changes", Mode::Write, move |tx, now| {
            let def = require_table(tx, &table_id)?;
            let op = operation(&changes);
            let mut out = ChangeOutcome::default();
            for (bucket, rows) in by_bucket(&table_id, def.strategy, &changes) {
                let pk = params![
                    table_id.as_str(),
                    bucket.partition_key.as_bytes(),
                    bucket.bucket_key.to_string()
                ];
                let meta: Option<(String, Option<i64>)> = tx
                    .prepare_cached(&format!(
                        "SELECT state, published_at FROM pulpitum_v4_bucket_metadata \
                         WHERE {BUCKET_PK}"
                    ))?
                    .query_row(pk, |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                let Some((state, published)) = meta else {
                    return Err(conflict(
                        op,
                        format!("bucket {bucket} was removed since the statement read it"),
                    )
                    .into());
                };
                match state_name(&state)? {
                    "hot" => {
                        let mut changed = 0u64;
                        for c in &rows {
                            let key = params![
                                table_id.as_str(),
                                bucket.partition_key.as_bytes(),
                                bucket.bucket_key.to_string(),
                                c.event_time.as_micros(),
                                c.sort_key.as_bytes(),
                                c.old_value.as_slice(),
                                c.new_value.as_deref(),
                            ];
                            let n = match &c.new_value {
                                None => tx
                                    .prepare_cached(&format!(
                                        "DELETE FROM pulpitum_v4_records WHERE {BUCKET_PK} \
                                         AND event_time = ?4 AND sort_key = ?5 AND value = ?6 \
                                         AND ?7 IS NULL"
                                    ))?
                                    .execute(key)?,
                                Some(_) => tx
                                    .prepare_cached(&format!(
                                        "UPDATE pulpitum_v4_records SET value = ?7 \
                                         WHERE {BUCKET_PK} AND event_time = ?4 AND sort_key = ?5 \
                                         AND value = ?6"
                                    ))?
                                    .execute(key)?,
                            };
                            changed += n as u64;
                        }
                        if changed != rows.len() as u64 {
                            return Err(conflict(
                                op,
                                format!(
                                    "{} of {} rows of {bucket} changed since the statement read them",
                                    rows.len() as u64 - changed,
                                    rows.len()
                                ),
                            )
                            .into());
                        }
                        out.hot += changed;
                    }
                    "archiving" => {
                        return Err(StoreError::BeingArchived {
                            bucket: bucket.clone(),
                            operation: op,
                        }
                        .into())
                    }
                    _ => {
                        if published.is_none_or(|p| p >= read_at.as_micros()) {
                            return Err(conflict(
                                op,
                                format!("bucket {bucket} was archived since the statement read it"),
                            )
                            .into());
                        }
                        let mut found = Vec::new();
                        {
                            let mut stmt = tx.prepare_cached(&format!(
                                "SELECT m.value FROM pulpitum_v4_row_masks AS m \
                                 WHERE {BUCKET_PK} AND event_time = ?4 AND sort_key = ?5 \
                                   AND {CURRENT_INCARNATION}"
                            ))?;
                            for c in &rows {
                                let v: Option<Option<Vec<u8>>> = stmt
                                    .query_row(
                                        params![
                                            table_id.as_str(),
                                            bucket.partition_key.as_bytes(),
                                            bucket.bucket_key.to_string(),
                                            c.event_time.as_micros(),
                                            c.sort_key.as_bytes()
                                        ],
                                        |r| r.get(0),
                                    )
                                    .optional()?;
                                if let Some(v) = v {
                                    found.push((c.event_time, c.sort_key.as_bytes().to_vec(), v));
                                }
                            }
                        }
                        check_masks(op, &bucket, &rows, &found)?;
                        let mut stmt = tx.prepare_cached(
                            "INSERT INTO pulpitum_v4_row_masks \
                             (table_id, partition_key, bucket_key, event_time, sort_key, kind, \
                              value, created_at) \
                             VALUES (?1, ?2, ?3, ?4, ?5, \
                               CASE WHEN ?6 IS NULL THEN 'delete' ELSE 'edit' END, ?6, ?7) \
                             ON CONFLICT (table_id, partition_key, bucket_key, event_time, sort_key) \
                             DO UPDATE SET kind = excluded.kind, value = excluded.value, \
                               created_at = excluded.created_at, purged_at = NULL",
                        )?;
                        for c in &rows {
                            out.masked += stmt.execute(params![
                                table_id.as_str(),
                                bucket.partition_key.as_bytes(),
                                bucket.bucket_key.to_string(),
                                c.event_time.as_micros(),
                                c.sort_key.as_bytes(),
                                c.new_value.as_deref(),
                                now
                            ])? as u64;
                        }
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    async fn row_masks(&self, bucket: &BucketId) -> StoreResult<Vec<RowMask>> {
        self.row_masks_of(
            &bucket.table_id,
            &bucket.partition_key,
            std::slice::from_ref(&bucket.bucket_key),
        )
        .await
    }

    async fn row_masks_of(
        &self,
        table_id: &TableId,
        partition: &PartitionKey,
        buckets: &[BucketKey],
    ) -> StoreResult<Vec<RowMask>> {
        let (table, partition) = (table_id.clone(), partition.clone());
        let keys: std::collections::HashSet<String> =
            buckets.iter().map(ToString::to_string).collect();
        let (Some(lo), Some(hi)) = (keys.iter().min().cloned(), keys.iter().max().cloned()) else {
            return Ok(Vec::new());
        };
        // One range of the primary key from the least to the greatest key (as text), the
        // masks of keys in between that are not the run's dropped here: one statement
        // whatever the run's length, where a statement per bucket cost a run of a month
        // thirty lookups. The incarnation rule is the one `row_masks` applies, per mask.
        self.run("row_masks", Mode::Read, move |tx, _| {
            let mut stmt = tx.prepare_cached(
                "SELECT m.bucket_key, m.event_time, m.sort_key, m.value \
                 FROM pulpitum_v4_row_masks AS m \
                 WHERE m.table_id = ?1 AND m.partition_key = ?2 \
                   AND m.bucket_key >= ?3 AND m.bucket_key <= ?4 \
                   AND NOT EXISTS (SELECT 1 FROM pulpitum_v4_bucket_metadata b \
                       WHERE b.table_id = ?1 AND b.partition_key = ?2 \
                         AND b.bucket_key = m.bucket_key AND b.created_at > m.created_at) \
                 ORDER BY m.event_time, m.sort_key",
            )?;
            let rows = stmt
                .query_map(params![table.as_str(), partition.as_bytes(), lo, hi], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Vec<u8>>(2)?,
                        r.get::<_, Option<Vec<u8>>>(3)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .filter(|(key, ..)| keys.contains(key))
                .map(|(_, t, s, value)| {
                    Ok(RowMask {
                        event_time: time(t, "mask event time")?,
                        sort_key: SortKey::new(s).map_err(|e| corrupt(e.to_string()))?,
                        value,
                    })
                })
                .collect()
        })
        .await
    }

    async fn buckets_with_deletes(
        &self,
        table_id: &TableId,
        partitions: Option<&[PartitionKey]>,
        (first, last): (&BucketKey, &BucketKey),
        limit: usize,
    ) -> StoreResult<Option<Vec<(PartitionKey, BucketKey)>>> {
        let table = table_id.clone();
        let (first, last) = (first.to_string(), last.to_string());
        let n = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let partitions: Option<Vec<Vec<u8>>> =
            partitions.map(|p| p.iter().map(|k| k.as_bytes().to_vec()).collect());
        // Every delete record counts, purged or not and whatever its incarnation: the
        // answer only ever withholds a count (see the trait). Named partitions are read one
        // primary-key prefix each, in one read transaction.
        self.run("buckets_with_deletes", Mode::Read, move |tx, _| {
            let row = |r: &rusqlite::Row<'_>| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, String>(1)?));
            let mut rows = Vec::new();
            match &partitions {
                Some(keys) => {
                    let mut stmt = tx.prepare_cached(
                        "SELECT DISTINCT partition_key, bucket_key FROM pulpitum_v4_row_masks \
                         WHERE table_id = ?1 AND partition_key = ?5 \
                           AND bucket_key >= ?2 AND bucket_key <= ?3 AND kind = 'delete' \
                         LIMIT ?4",
                    )?;
                    for key in keys {
                        let params = params![table.as_str(), first, last, n, key];
                        for r in stmt.query_map(params, row)? {
                            rows.push(r?);
                        }
                    }
                }
                None => {
                    let mut stmt = tx.prepare_cached(
                        "SELECT DISTINCT partition_key, bucket_key FROM pulpitum_v4_row_masks \
                         WHERE table_id = ?1 AND bucket_key >= ?2 AND bucket_key <= ?3 \
                           AND kind = 'delete' \
                         LIMIT ?4",
                    )?;
                    for r in stmt.query_map(params![table.as_str(), first, last, n], row)? {
                        rows.push(r?);
                    }
                }
            }
            rows.into_iter()
                .map(|(pk, key)| {
                    Ok((
                        PartitionKey::new(pk).map_err(|e| corrupt(e.to_string()))?,
                        BucketKey::parse_any(&key).map_err(|e| corrupt(e.to_string()))?,
                    ))
                })
                .collect::<TxResult<Vec<_>>>()
                .map(Some)
        })
        .await
    }

    async fn expired_buckets(
        &self,
        table_id: &TableId,
        before: EventTime,
        limit: usize,
    ) -> StoreResult<Vec<BucketId>> {
        let table_id = table_id.clone();
        self.run("expired_buckets", Mode::Read, move |tx, _| {
            let def = require_table(tx, &table_id)?;
            let mut stmt = tx.prepare_cached(
                "SELECT partition_key, bucket_key FROM pulpitum_v4_bucket_metadata \
                 WHERE table_id = ?1 AND bucket_end <= ?2 AND state IN ('hot', 'archived') \
                 ORDER BY bucket_end, partition_key LIMIT ?3",
            )?;
            let rows = stmt
                .query_map(
                    params![
                        table_id.as_str(),
                        before.as_micros(),
                        i64::try_from(limit).unwrap_or(i64::MAX)
                    ],
                    |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, String>(1)?)),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(pk, key)| {
                    Ok(BucketId {
                        table_id: table_id.clone(),
                        partition_key: PartitionKey::new(pk).map_err(|e| corrupt(e.to_string()))?,
                        bucket_key: crate::model::BucketKey::parse(def.strategy, &key)
                            .map_err(|e| corrupt(e.to_string()))?,
                    })
                })
                .collect::<TxResult<Vec<_>>>()
        })
        .await
    }

    async fn expire_bucket(
        &self,
        bucket: &BucketId,
        before: EventTime,
    ) -> StoreResult<Option<ExpiredBucket>> {
        let bucket = bucket.clone();
        self.run("expire_bucket", Mode::Write, move |tx, now| {
            let pk = params![
                bucket.table_id.as_str(),
                bucket.partition_key.as_bytes(),
                bucket.bucket_key.to_string()
            ];
            let row: Option<(String, Option<String>, i64, i64)> = tx
                .prepare_cached(&format!(
                    "SELECT state, object_key, bucket_end, generation \
                     FROM pulpitum_v4_bucket_metadata WHERE {BUCKET_PK}"
                ))?
                .query_row(pk, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .optional()?;
            let Some((state, object_key, end, generation)) = row else {
                return Ok(None);
            };
            let state = match state_name(&state)? {
                s @ ("hot" | "archived") if end <= before.as_micros() => s,
                _ => return Ok(None),
            };
            tx.prepare_cached(&format!(
                "DELETE FROM pulpitum_v4_bucket_metadata WHERE {BUCKET_PK}"
            ))?
            .execute(pk)?;
            let rows = tx
                .prepare_cached(&format!(
                    "DELETE FROM pulpitum_v4_records WHERE {BUCKET_PK}"
                ))?
                .execute(pk)? as u64;
            // Masks stay, marked rewritten, for readers still on the old route (see
            // `CURRENT_INCARNATION`).
            let unrewritten = mark_bucket_masks_purged(tx, &bucket, now)?;
            // The object is retired once no bucket routes to it any more (a segment shared
            // with buckets that stay is retired by the last one to go): retiring it earlier
            // would make compaction rewrite the rest of the segment, bucket by expired
            // bucket. A bucket removed with deletes not yet rewritten retires it at once:
            // the deleted rows' bytes are in it (see the PostgreSQL store).
            let retired = match &object_key {
                Some(k) if state == "archived" => {
                    let only_if_unrouted = if unrewritten > 0 {
                        ""
                    } else {
                        "AND NOT EXISTS (SELECT 1 FROM pulpitum_v4_bucket_metadata \
                         WHERE object_key = ?1)"
                    };
                    tx.prepare_cached(&format!(
                        "INSERT INTO pulpitum_v4_retired_objects (object_key, retired_at) \
                         SELECT ?1, ?2 WHERE true {only_if_unrouted} \
                         ON CONFLICT (object_key) DO UPDATE SET \
                           retired_at = max(retired_at, excluded.retired_at)",
                    ))?
                    .execute(params![k, now])?
                        == 1
                }
                _ => false,
            };
            Ok(Some(ExpiredBucket {
                bucket: bucket.clone(),
                state,
                generation,
                object_key,
                rows,
                retired,
            }))
        })
        .await
    }
}

/// Marks every mask of `bucket` not yet rewritten as rewritten at `now` (a removed bucket's
/// masks stay, marked, for readers still on its old route); how many were.
pub(super) fn mark_bucket_masks_purged(
    tx: &rusqlite::Transaction<'_>,
    bucket: &BucketId,
    now: i64,
) -> rusqlite::Result<usize> {
    tx.prepare_cached(&format!(
        "UPDATE pulpitum_v4_row_masks SET purged_at = ?4 \
         WHERE {BUCKET_PK} AND purged_at IS NULL"
    ))?
    .execute(params![
        bucket.table_id.as_str(),
        bucket.partition_key.as_bytes(),
        bucket.bucket_key.to_string(),
        now
    ])
}
