//! [`Changes`] on PostgreSQL: `DELETE`/`UPDATE` change sets, the masks archived reads apply,
//! and retention's removal of whole buckets.
//!
//! A change set is one serializable transaction, one bucket after another. Each bucket's
//! metadata row is read first. A Hot bucket's row is then written (`updated_at`) with the
//! state repeated in the `WHERE`, so a claim that fences the bucket and this change conflict
//! on that row whichever commits first (the same guarantee an append's single statement
//! has); its rows are deleted or updated with their old value in the condition, and the
//! counts must match. An Archived bucket's existing masks for the rows are read, checked
//! against the values the statement read, and the new delete or edit records upserted.
//! Rows go as arrays (`unnest`), one statement per bucket and kind.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_postgres::IsolationLevel;

use super::decode::{corrupt, event_time};
use super::sql::{limit_param, META, RECORDS, RETIRED};
use super::{PgStore, TxError};
use crate::model::{BucketId, BucketKey, EventTime, PartitionKey, SortKey, TableId};
use crate::store::changes::{by_bucket, check_masks, conflict, operation};
use crate::store::{
    ChangeOutcome, Changes, ExpiredBucket, RowChange, RowMask, StoreError, StoreResult,
};

/// The masks table.
const MASKS: &str = "pulpitum_v4_row_masks";

/// A mask (aliased `m`, its bucket's key in `$1`..`$3`) belongs to the bucket as it is now:
/// no registry row of that key was created after the mask. A bucket removed (its rows all
/// deleted, or past retention) keeps its masks, marked rewritten, for the readers still on
/// its old route; a bucket created again under the same key by a late append must not
/// inherit them (they would hide, and a rewrite would erase, re-inserted rows).
const CURRENT_INCARNATION: &str = "NOT EXISTS (SELECT 1 FROM pulpitum_v4_bucket_metadata b \
     WHERE b.table_id = $1 AND b.partition_key = $2 AND b.bucket_key = $3 \
       AND b.created_at > m.created_at)";

#[async_trait]
impl Changes for PgStore {
    async fn apply_changes(
        &self,
        table_id: &TableId,
        read_at: EventTime,
        changes: &[RowChange],
    ) -> StoreResult<ChangeOutcome> {
        if changes.is_empty() {
            return Ok(ChangeOutcome::default());
        }
        let def = self.definition(table_id).await?;
        let op = operation(changes);
        let gate = crate::store::gate::current();
        let groups = by_bucket(table_id, def.strategy, changes);
        let read_at = read_at.to_datetime();
        let state_sql = format!(
            "SELECT state, published_at FROM {META} \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3"
        );
        // Joins with the arrays rather than `IN (SELECT unnest ...)`: on a table without fresh
        // statistics PostgreSQL planned the latter as a semi join that scanned the arrays
        // again for every row of the bucket (a 2,000-row DELETE in a 120,000-row bucket ran
        // past the statement timeout).
        let delete_sql = format!(
            "DELETE FROM {RECORDS} AS r \
             USING unnest($4::TIMESTAMPTZ[], $5::BYTEA[], $6::BYTEA[]) AS u(t, s, v) \
             WHERE r.table_id = $1 AND r.partition_key = $2 AND r.bucket_key = $3 \
               AND r.event_time = u.t AND r.sort_key = u.s AND r.value = u.v"
        );
        let update_sql = format!(
            "UPDATE {RECORDS} AS r SET value = u.nv \
             FROM unnest($4::TIMESTAMPTZ[], $5::BYTEA[], $6::BYTEA[], $7::BYTEA[]) \
               AS u(t, s, ov, nv) \
             WHERE r.table_id = $1 AND r.partition_key = $2 AND r.bucket_key = $3 \
               AND r.event_time = u.t AND r.sort_key = u.s AND r.value = u.ov"
        );
        let masks_sql = format!(
            "SELECT m.event_time, m.sort_key, m.value FROM {MASKS} m \
             JOIN unnest($4::TIMESTAMPTZ[], $5::BYTEA[]) AS u(t, s) \
               ON m.event_time = u.t AND m.sort_key = u.s \
             WHERE m.table_id = $1 AND m.partition_key = $2 AND m.bucket_key = $3 \
               AND {CURRENT_INCARNATION}"
        );
        let upsert_sql = format!(
            "INSERT INTO {MASKS} AS m \
               (table_id, partition_key, bucket_key, event_time, sort_key, kind, value, created_at) \
             SELECT $1, $2, $3, u.t, u.s, CASE WHEN u.v IS NULL THEN 'delete' ELSE 'edit' END, \
               u.v, now() \
             FROM unnest($4::TIMESTAMPTZ[], $5::BYTEA[], $6::BYTEA[]) AS u(t, s, v) \
             ON CONFLICT (table_id, partition_key, bucket_key, event_time, sort_key) DO UPDATE SET \
               kind = excluded.kind, value = excluded.value, created_at = excluded.created_at, \
               purged_at = NULL"
        );
        self.run("apply_changes", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let mut out = ChangeOutcome::default();
            for (bucket, rows) in &groups {
                let pk = bucket.partition_key.as_bytes();
                let key = bucket.bucket_key.to_string();
                let head: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&table_id.as_str(), &pk, &key];
                let Some(meta) = tx.query_opt(&state_sql, &head).await? else {
                    return Err(TxError::Store(conflict(
                        op,
                        format!("bucket {bucket} was removed since the statement read it"),
                    )));
                };
                let state: String = meta.try_get(0)?;
                let published: Option<DateTime<Utc>> = meta.try_get(1)?;
                let times: Vec<DateTime<Utc>> =
                    rows.iter().map(|c| c.event_time.to_datetime()).collect();
                let sorts: Vec<&[u8]> = rows.iter().map(|c| c.sort_key.as_bytes()).collect();
                let olds: Vec<&[u8]> = rows.iter().map(|c| c.old_value.as_slice()).collect();
                let news: Vec<Option<&[u8]>> =
                    rows.iter().map(|c| c.new_value.as_deref()).collect();
                match state.as_str() {
                    "hot" => {
                        // The bucket's state was read in this serializable transaction: a
                        // claim committed between that read and this commit conflicts with
                        // it, as it does with an append, so nothing is written to the
                        // registry (the write role may not: it would let it claim buckets).
                        let deletes: Vec<usize> = (0..rows.len())
                            .filter(|&i| rows[i].new_value.is_none())
                            .collect();
                        let pick = |v: &[usize]| -> (Vec<DateTime<Utc>>, Vec<&[u8]>, Vec<&[u8]>) {
                            (
                                v.iter().map(|&i| times[i]).collect(),
                                v.iter().map(|&i| sorts[i]).collect(),
                                v.iter().map(|&i| olds[i]).collect(),
                            )
                        };
                        let mut changed = 0u64;
                        if !deletes.is_empty() {
                            let (t, s, o) = pick(&deletes);
                            changed += tx
                                .execute(&delete_sql, &[&table_id.as_str(), &pk, &key, &t, &s, &o])
                                .await?;
                        }
                        let updates: Vec<usize> = (0..rows.len())
                            .filter(|&i| rows[i].new_value.is_some())
                            .collect();
                        if !updates.is_empty() {
                            let (t, s, o) = pick(&updates);
                            let n: Vec<&[u8]> = updates
                                .iter()
                                .map(|&i| news[i].unwrap_or_default())
                                .collect();
                            changed += tx
                                .execute(
                                    &update_sql,
                                    &[&table_id.as_str(), &pk, &key, &t, &s, &o, &n],
                                )
                                .await?;
                        }
                        if changed != rows.len() as u64 {
                            return Err(TxError::Store(conflict(
                                op,
                                format!(
                                    "{} of {} rows of {bucket} changed since the statement read them",
                                    rows.len() as u64 - changed,
                                    rows.len()
                                ),
                            )));
                        }
                        out.hot += changed;
                    }
                    "archiving" => {
                        return Err(TxError::Store(StoreError::BeingArchived {
                            bucket: bucket.clone(),
                            operation: op,
                        }))
                    }
                    "archived" => {
                        // Published after the statement read it: the rows it read were hot,
                        // and the archive may hold other values. Read again.
                        if published.is_none_or(|p| p >= read_at) {
                            return Err(TxError::Store(conflict(
                                op,
                                format!("bucket {bucket} was archived since the statement read it"),
                            )));
                        }
                        let found = tx
                            .query(&masks_sql, &[&table_id.as_str(), &pk, &key, &times, &sorts])
                            .await?;
                        let mut existing = Vec::with_capacity(found.len());
                        for r in &found {
                            let t: DateTime<Utc> = r.try_get(0)?;
                            existing.push((
                                event_time(t, "mask event_time")?,
                                r.try_get::<_, Vec<u8>>(1)?,
                                r.try_get::<_, Option<Vec<u8>>>(2)?,
                            ));
                        }
                        check_masks(op, bucket, rows, &existing)?;
                        let n = tx
                            .execute(
                                &upsert_sql,
                                &[&table_id.as_str(), &pk, &key, &times, &sorts, &news],
                            )
                            .await?;
                        out.masked += n;
                    }
                    other => {
                        return Err(TxError::Store(StoreError::Corrupt(format!(
                            "unknown bucket state {other:?}"
                        ))))
                    }
                }
            }
            // A statement its caller has abandoned (a wire timeout) commits nothing: the
            // transaction rolls back when `tx` drops (see `store::gate`).
            if !crate::store::gate::may_commit(gate.as_deref()) {
                return Err(TxError::Store(abandoned(op)));
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(out)
        })
        .await
    }

    async fn row_masks(&self, bucket: &BucketId) -> StoreResult<Vec<RowMask>> {
        let sql = format!(
            "SELECT m.event_time, m.sort_key, m.value FROM {MASKS} m \
             WHERE m.table_id = $1 AND m.partition_key = $2 AND m.bucket_key = $3 \
               AND {CURRENT_INCARNATION} \
             ORDER BY m.event_time, m.sort_key"
        );
        let key = bucket.bucket_key.to_string();
        self.run("row_masks", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client
                .query(
                    &stmt,
                    &[
                        &bucket.table_id.as_str(),
                        &bucket.partition_key.as_bytes(),
                        &key,
                    ],
                )
                .await?;
            rows.iter().map(mask_of_row).collect()
        })
        .await
    }

    async fn row_masks_of(
        &self,
        table_id: &TableId,
        partition: &PartitionKey,
        buckets: &[BucketKey],
    ) -> StoreResult<Vec<RowMask>> {
        if buckets.is_empty() {
            return Ok(Vec::new());
        }
        // CURRENT_INCARNATION per mask's own bucket: the same rule as `row_masks`.
        let sql = format!(
            "SELECT m.event_time, m.sort_key, m.value FROM {MASKS} m \
             WHERE m.table_id = $1 AND m.partition_key = $2 AND m.bucket_key = ANY($3) \
               AND NOT EXISTS (SELECT 1 FROM {META} b \
                   WHERE b.table_id = $1 AND b.partition_key = $2 \
                     AND b.bucket_key = m.bucket_key AND b.created_at > m.created_at) \
             ORDER BY m.event_time, m.sort_key"
        );
        let keys: Vec<String> = buckets.iter().map(ToString::to_string).collect();
        self.run("row_masks_of", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client
                .query(&stmt, &[&table_id.as_str(), &partition.as_bytes(), &keys])
                .await?;
            rows.iter().map(mask_of_row).collect()
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
        // Every delete record counts, purged or not and whatever its incarnation: the
        // answer only ever withholds a count, so erring towards "has deletes" is safe.
        // Named partitions make the primary key's prefix the access path.
        let only = if partitions.is_some() {
            "AND partition_key = ANY($5)"
        } else {
            ""
        };
        let sql = format!(
            "SELECT DISTINCT partition_key, bucket_key FROM {MASKS} \
             WHERE table_id = $1 AND bucket_key >= $2 AND bucket_key <= $3 AND kind = 'delete' \
             {only} LIMIT $4"
        );
        let (first, last) = (first.to_string(), last.to_string());
        let n = limit_param(limit);
        let keys: Vec<&[u8]> = partitions
            .unwrap_or_default()
            .iter()
            .map(PartitionKey::as_bytes)
            .collect();
        self.run("buckets_with_deletes", || async {
            let client = self.pooled().await?;
            let stmt = client.prepare_cached(&sql).await?;
            let (t, f, l) = (table_id.as_str(), &first, &last);
            let rows = if partitions.is_some() {
                client.query(&stmt, &[&t, f, l, &n, &keys]).await?
            } else {
                client.query(&stmt, &[&t, f, l, &n]).await?
            };
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let pk: Vec<u8> = r.try_get(0)?;
                let key: String = r.try_get(1)?;
                out.push((
                    PartitionKey::new(pk).map_err(|e| corrupt("partition key", e))?,
                    BucketKey::parse_any(&key).map_err(|e| corrupt("bucket key", e))?,
                ));
            }
            Ok(Some(out))
        })
        .await
    }

    async fn expired_buckets(
        &self,
        table_id: &TableId,
        before: EventTime,
        limit: usize,
    ) -> StoreResult<Vec<BucketId>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let def = self.definition(table_id).await?;
        let sql = expired_sql();
        let before = before.to_datetime();
        let n = limit_param(limit);
        self.run("expired_buckets", || async {
            let client = self.pooled().await?;
            let rows = client
                .query(&sql, &[&table_id.as_str(), &before, &n])
                .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let pk: Vec<u8> = r.try_get(0)?;
                let key: String = r.try_get(1)?;
                out.push(BucketId {
                    table_id: table_id.clone(),
                    partition_key: PartitionKey::new(pk)
                        .map_err(|e| corrupt("partition key", e))?,
                    bucket_key: BucketKey::parse(def.strategy, &key)
                        .map_err(|e| corrupt("bucket key", e))?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn expire_bucket(
        &self,
        bucket: &BucketId,
        before: EventTime,
    ) -> StoreResult<Option<ExpiredBucket>> {
        let read_sql = format!(
            "SELECT state, object_key, generation FROM {META} \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 AND bucket_end <= $4"
        );
        let drop_meta = format!(
            "DELETE FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND state = $4"
        );
        let drop_rows = format!(
            "DELETE FROM {RECORDS} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3"
        );
        // Masks stay, marked rewritten: a reader that still holds the bucket's old route
        // applies them until GC forgets them after the retirement delay (a bucket created
        // again under the key does not see them: `CURRENT_INCARNATION`).
        let drop_masks = format!(
            "UPDATE {MASKS} SET purged_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 AND purged_at IS NULL"
        );
        // Retired once no bucket routes to it any more (a segment shared with buckets that
        // stay is retired by the last one to go): retiring it earlier would make compaction
        // rewrite the rest of the segment, bucket by expired bucket. Two removals of a
        // segment's last buckets at once each see the other's: serializable isolation
        // refuses one of them, and its retry retires the object. A bucket removed with
        // deletes not yet rewritten retires it at once, though: the deleted rows' bytes are
        // in it, and retiring it is what makes compaction move the other buckets out.
        let upsert = "ON CONFLICT (object_key) DO UPDATE SET \
               retired_at = GREATEST(r.retired_at, excluded.retired_at)";
        let retire = format!(
            "INSERT INTO {RETIRED} AS r (object_key, retired_at) \
             SELECT $1::TEXT, now() WHERE NOT EXISTS (SELECT 1 FROM {META} WHERE object_key = $1) \
             {upsert}"
        );
        let retire_now = format!(
            "INSERT INTO {RETIRED} AS r (object_key, retired_at) VALUES ($1, now()) {upsert}"
        );
        let key = bucket.bucket_key.to_string();
        let before = before.to_datetime();
        self.run("expire_bucket", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let pk = bucket.partition_key.as_bytes();
            let head: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&bucket.table_id.as_str(), &pk, &key];
            let row = tx
                .query_opt(&read_sql, &[&bucket.table_id.as_str(), &pk, &key, &before])
                .await?;
            let Some(row) = row else {
                tx.commit().await.map_err(TxError::Commit)?;
                return Ok(None);
            };
            let state: String = row.try_get(0)?;
            let object_key: Option<String> = row.try_get(1)?;
            let generation: i64 = row.try_get(2)?;
            let state: &'static str = match state.as_str() {
                "hot" => "hot",
                "archived" => "archived",
                _ => {
                    tx.commit().await.map_err(TxError::Commit)?;
                    return Ok(None);
                }
            };
            if tx
                .execute(&drop_meta, &[&bucket.table_id.as_str(), &pk, &key, &state])
                .await?
                != 1
            {
                return Err(TxError::Conflict(format!(
                    "bucket {bucket} changed while it was expired"
                )));
            }
            let rows = tx.execute(&drop_rows, &head).await?;
            let unrewritten = tx.execute(&drop_masks, &head).await?;
            let retired = match &object_key {
                Some(k) if state == "archived" && unrewritten > 0 => {
                    tx.execute(&retire_now, &[k]).await? == 1
                }
                Some(k) if state == "archived" => tx.execute(&retire, &[k]).await? == 1,
                _ => false,
            };
            tx.commit().await.map_err(TxError::Commit)?;
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

/// `expired_buckets`' statement: `$1` table, `$2` bound, `$3` limit; a range of the
/// `(table_id, bucket_end)` index (migration 27) in its order, so a pass with nothing due
/// reads nothing and a page reads its own entries. Ordered by end alone: a tie-break on the
/// partition would read every bucket sharing an end to sort them (a whole day's buckets
/// for each page of a thousand, a break-it review found).
pub(super) fn expired_sql() -> String {
    format!(
        "SELECT partition_key, bucket_key FROM {META} \
         WHERE table_id = $1 AND bucket_end <= $2 AND state IN ('hot', 'archived') \
         ORDER BY bucket_end LIMIT $3"
    )
}

/// The error of a write whose statement was abandoned before it committed.
pub(super) fn abandoned(operation: &'static str) -> StoreError {
    StoreError::Backend {
        operation,
        detail: "abandoned by its caller; rolled back".into(),
    }
}

/// A mask from a row of `event_time, sort_key, value`.
fn mask_of_row(r: &tokio_postgres::Row) -> Result<RowMask, TxError> {
    let t: DateTime<Utc> = r.try_get(0)?;
    let s: Vec<u8> = r.try_get(1)?;
    Ok(RowMask {
        event_time: event_time(t, "mask event_time")?,
        sort_key: SortKey::new(s).map_err(|e| corrupt("mask sort key", e))?,
        value: r.try_get(2)?,
    })
}
