//! [`Control`] on PostgreSQL: per-table policies, the store-wide pause and job history.
//!
//! A policy update is one serializable upsert that touches only the fields it names, so two
//! operators changing different options at once both win. History statements run on their
//! own, after the lifecycle step they describe has committed or failed: the archiver treats
//! their errors as warnings, so history can never fail or reorder a fenced step.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_postgres::{IsolationLevel, Row};

use super::decode::{corrupt, event_time};
use super::sql::{limit_param, micros, param_refs, push, Params, JOBS, POLICIES, STORE_CONTROL};
use super::{PgStore, TxError};
use crate::model::{BucketId, BucketKey, EventTime, PartitionKey, TableId};
use crate::store::{
    Control, JobEnd, JobFilter, JobKind, JobOutcome, JobRecord, JobStart, PolicyUpdate, StoreError,
    StoreResult, TablePolicy,
};

const POLICY_COLS: &str =
    "table_id, archive_after_us, payload_format, cleanup_delay_us, paused, updated_at, \
     retain_for_us";

fn duration(v: Option<i64>, what: &str) -> StoreResult<Option<Duration>> {
    v.map(|us| {
        u64::try_from(us)
            .map(Duration::from_micros)
            .map_err(|e| corrupt(what, e))
    })
    .transpose()
}

fn count(v: Option<i64>, what: &str) -> StoreResult<Option<u64>> {
    v.map(|n| u64::try_from(n).map_err(|e| corrupt(what, e)))
        .transpose()
}

fn decode_policy(row: &Row) -> StoreResult<TablePolicy> {
    let bad = |e: tokio_postgres::Error| corrupt("policy row", e);
    let table: String = row.try_get(0).map_err(bad)?;
    let updated: DateTime<Utc> = row.try_get(5).map_err(bad)?;
    Ok(TablePolicy {
        table_id: TableId::new(table).map_err(|e| corrupt("policy table id", e))?,
        archive_after: duration(row.try_get(1).map_err(bad)?, "archive_after")?,
        format: row.try_get(2).map_err(bad)?,
        cleanup_delay: duration(row.try_get(3).map_err(bad)?, "cleanup_delay")?,
        paused: row.try_get(4).map_err(bad)?,
        retain_for: duration(row.try_get(6).map_err(bad)?, "retain_for")?,
        updated_at: Some(event_time(updated, "policy updated_at")?),
    })
}

fn decode_job(row: &Row) -> StoreResult<JobRecord> {
    let bad = |e: tokio_postgres::Error| corrupt("job history row", e);
    let table: String = row.try_get(0).map_err(bad)?;
    let pk: Vec<u8> = row.try_get(1).map_err(bad)?;
    let key: String = row.try_get(2).map_err(bad)?;
    let strategy: String = row.try_get(3).map_err(bad)?;
    let kind: String = row.try_get(5).map_err(bad)?;
    let outcome: String = row.try_get(9).map_err(bad)?;
    let started: DateTime<Utc> = row.try_get(7).map_err(bad)?;
    let finished: Option<DateTime<Utc>> = row.try_get(8).map_err(bad)?;
    let strategy = strategy
        .parse()
        .map_err(|e| corrupt("job bucket strategy", e))?;
    Ok(JobRecord {
        bucket: BucketId {
            table_id: TableId::new(table).map_err(|e| corrupt("job table id", e))?,
            partition_key: PartitionKey::new(pk).map_err(|e| corrupt("job partition key", e))?,
            bucket_key: BucketKey::parse(strategy, &key)
                .map_err(|e| corrupt("job bucket key", e))?,
        },
        generation: row.try_get(4).map_err(bad)?,
        kind: JobKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown job kind {kind:?}")))?,
        worker: row.try_get(6).map_err(bad)?,
        started_at: event_time(started, "job started_at")?,
        finished_at: finished
            .map(|t| event_time(t, "job finished_at"))
            .transpose()?,
        outcome: JobOutcome::parse(&outcome)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown job outcome {outcome:?}")))?,
        rows: count(row.try_get(10).map_err(bad)?, "job row_count")?,
        bytes: count(row.try_get(11).map_err(bad)?, "job byte_count")?,
        error: row.try_get(12).map_err(bad)?,
    })
}

#[async_trait]
impl Control for PgStore {
    async fn policies(&self) -> StoreResult<Vec<TablePolicy>> {
        let sql = format!("SELECT {POLICY_COLS} FROM {POLICIES} ORDER BY table_id");
        self.run("policies", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[]).await?;
            Ok(rows
                .iter()
                .map(decode_policy)
                .collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn update_policy(
        &self,
        table_id: &TableId,
        update: &PolicyUpdate,
    ) -> StoreResult<TablePolicy> {
        // For each field: "is it set" and the new value; a new row takes the values as
        // given (NULL where unset), an existing row keeps every field the update leaves.
        let sql = format!(
            "INSERT INTO {POLICIES} AS t ({POLICY_COLS}) \
             VALUES ($1, $3::INT8, $5::TEXT, $7::INT8, COALESCE($8::BOOL, false), now(), \
               $10::INT8) \
             ON CONFLICT (table_id) DO UPDATE SET \
               archive_after_us = CASE WHEN $2::BOOL THEN $3::INT8 ELSE t.archive_after_us END, \
               payload_format = CASE WHEN $4::BOOL THEN $5::TEXT ELSE t.payload_format END, \
               cleanup_delay_us = CASE WHEN $6::BOOL THEN $7::INT8 ELSE t.cleanup_delay_us END, \
               paused = COALESCE($8::BOOL, t.paused), updated_at = now(), \
               retain_for_us = CASE WHEN $9::BOOL THEN $10::INT8 ELSE t.retain_for_us END \
             RETURNING {POLICY_COLS}"
        );
        let set_after = update.archive_after.is_some();
        let after = update.archive_after.flatten().map(micros);
        let set_format = update.format.is_some();
        let format = update.format.clone().flatten();
        let set_delay = update.cleanup_delay.is_some();
        let delay = update.cleanup_delay.flatten().map(micros);
        let paused = update.paused;
        let set_retain = update.retain_for.is_some();
        let retain = update.retain_for.flatten().map(micros);
        self.run("update_policy", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let known = tx
                .query_opt(
                    "SELECT 1 FROM pulpitum_v4_tables WHERE table_id = $1",
                    &[&table_id.as_str()],
                )
                .await?;
            if known.is_none() {
                return Err(TxError::Store(StoreError::UnknownTable(table_id.clone())));
            }
            let row = tx
                .query_one(
                    &sql,
                    &[
                        &table_id.as_str(),
                        &set_after,
                        &after,
                        &set_format,
                        &format,
                        &set_delay,
                        &delay,
                        &paused,
                        &set_retain,
                        &retain,
                    ],
                )
                .await?;
            let policy = decode_policy(&row)?;
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(policy)
        })
        .await
    }

    async fn store_paused(&self) -> StoreResult<bool> {
        let sql = format!("SELECT paused FROM {STORE_CONTROL} WHERE id = 1");
        self.run("store_paused", || async {
            let client = self.pooled().await?;
            let row = client.query_opt(&sql, &[]).await?;
            Ok(match row {
                None => false,
                Some(r) => r.try_get(0)?,
            })
        })
        .await
    }

    async fn set_store_paused(&self, paused: bool) -> StoreResult<()> {
        let sql = format!(
            "INSERT INTO {STORE_CONTROL} (id, paused, updated_at) VALUES (1, $1, now()) \
             ON CONFLICT (id) DO UPDATE SET paused = excluded.paused, updated_at = now()"
        );
        self.run("set_store_paused", || async {
            let client = self.pooled().await?;
            client.execute(&sql, &[&paused]).await?;
            Ok(())
        })
        .await
    }

    async fn record_job_start(&self, job: &JobStart) -> StoreResult<()> {
        let abandon = format!(
            "UPDATE {JOBS} SET outcome = 'abandoned', finished_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND generation < $4 AND outcome = 'running'"
        );
        let insert = format!(
            "INSERT INTO {JOBS} (table_id, partition_key, bucket_key, generation, kind, worker, started_at, outcome) \
             VALUES ($1, $2, $3, $4, $5, $6, now(), 'running') \
             ON CONFLICT (table_id, partition_key, bucket_key, generation) DO NOTHING"
        );
        let b = &job.bucket;
        let key = b.bucket_key.to_string();
        self.run("record_job_start", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            tx.execute(
                &abandon,
                &[
                    &b.table_id.as_str(),
                    &b.partition_key.as_bytes(),
                    &key,
                    &job.generation,
                ],
            )
            .await?;
            tx.execute(
                &insert,
                &[
                    &b.table_id.as_str(),
                    &b.partition_key.as_bytes(),
                    &key,
                    &job.generation,
                    &job.kind.name(),
                    &job.worker,
                ],
            )
            .await?;
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(())
        })
        .await
    }

    async fn record_job_end(&self, end: &JobEnd) -> StoreResult<()> {
        let sql = format!(
            "INSERT INTO {JOBS} (table_id, partition_key, bucket_key, generation, kind, worker, \
               started_at, finished_at, outcome, row_count, byte_count, error) \
             VALUES ($1, $2, $3, $4, $5, $6, now(), now(), $7, $8, $9, $10) \
             ON CONFLICT (table_id, partition_key, bucket_key, generation) DO UPDATE SET \
               finished_at = now(), outcome = excluded.outcome, row_count = excluded.row_count, \
               byte_count = excluded.byte_count, error = excluded.error"
        );
        let job = &end.job;
        let b = &job.bucket;
        let key = b.bucket_key.to_string();
        let rows = end.rows.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let bytes = end.bytes.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let error = end.error.as_deref().map(crate::store::clip_error);
        self.run("record_job_end", || async {
            let client = self.pooled().await?;
            client
                .execute(
                    &sql,
                    &[
                        &b.table_id.as_str(),
                        &b.partition_key.as_bytes(),
                        &key,
                        &job.generation,
                        &job.kind.name(),
                        &job.worker,
                        &end.outcome.name(),
                        &rows,
                        &bytes,
                        &error,
                    ],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn jobs(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>> {
        let mut params: Params = Vec::new();
        let mut preds = Vec::new();
        if let Some(t) = &filter.table {
            let p = push(&mut params, t.as_str().to_string());
            preds.push(format!("j.table_id = {p}"));
        }
        if let Some(since) = filter.since {
            let p = push(&mut params, since.to_datetime());
            preds.push(format!("j.started_at >= {p}"));
        }
        if let Some(until) = filter.until {
            let p = push(&mut params, until.to_datetime());
            preds.push(format!("j.started_at <= {p}"));
        }
        let mut sql = format!(
            "SELECT j.table_id, j.partition_key, j.bucket_key, tb.bucket_strategy, j.generation, \
               j.kind, j.worker, j.started_at, j.finished_at, j.outcome, j.row_count, \
               j.byte_count, j.error \
             FROM {JOBS} j JOIN pulpitum_v4_tables tb ON tb.table_id = j.table_id"
        );
        if !preds.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&preds.join(" AND "));
        }
        sql.push_str(
            " ORDER BY j.started_at DESC, j.table_id, j.partition_key, j.bucket_key, j.generation DESC",
        );
        if let Some(n) = filter.limit {
            let p = push(&mut params, limit_param(n));
            sql.push_str(&format!(" LIMIT {p}"));
        }
        self.run("jobs", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &param_refs(&params)).await?;
            Ok(rows
                .iter()
                .map(decode_job)
                .collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn prune_jobs(&self, before: EventTime, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let sql = format!(
            "DELETE FROM {JOBS} WHERE (table_id, partition_key, bucket_key, generation) IN ( \
               SELECT table_id, partition_key, bucket_key, generation FROM {JOBS} \
               WHERE started_at < $1 ORDER BY started_at LIMIT $2)"
        );
        let before = before.to_datetime();
        let n = limit_param(limit);
        self.run("prune_jobs", || async {
            let client = self.pooled().await?;
            Ok(client.execute(&sql, &[&before, &n]).await?)
        })
        .await
    }
}
