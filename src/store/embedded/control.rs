//! [`Control`] for the embedded store: per-table policies, the store-wide pause and job
//! history, with the same meaning as on PostgreSQL (see `store::postgres::control`).
//!
//! A policy update reads and writes the row under SQLite's write lock, so updates of
//! different fields by two processes never lose either.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, OptionalExtension, Row};

use crate::model::{EventTime, TableId};
use crate::store::{
    Control, JobEnd, JobFilter, JobKind, JobOutcome, JobRecord, JobStart, PolicyUpdate,
    StoreResult, TablePolicy,
};

use super::catalog::require_table;
use super::decode::{bucket_id, corrupt, time, to_i64};
use super::{Mode, SqliteStore, TxResult};

const POLICY_COLS: &str =
    "table_id, archive_after_us, payload_format, cleanup_delay_us, paused, updated_at, \
     retain_for_us";

type PolicyRow = (
    String,
    Option<i64>,
    Option<String>,
    Option<i64>,
    i64,
    i64,
    Option<i64>,
);

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn duration(v: Option<i64>, what: &str) -> TxResult<Option<Duration>> {
    v.map(|us| {
        u64::try_from(us)
            .map(Duration::from_micros)
            .map_err(|_| corrupt(format!("{what} {us}")))
    })
    .transpose()
}

fn policy_row(r: &Row<'_>) -> rusqlite::Result<PolicyRow> {
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

fn policy(row: PolicyRow) -> TxResult<TablePolicy> {
    let (table, after, format, delay, paused, updated, retain) = row;
    Ok(TablePolicy {
        table_id: TableId::new(table).map_err(|e| corrupt(e.to_string()))?,
        archive_after: duration(after, "archive_after")?,
        format,
        cleanup_delay: duration(delay, "cleanup_delay")?,
        paused: paused != 0,
        retain_for: duration(retain, "retain_for")?,
        updated_at: Some(time(updated, "policy updated_at")?),
    })
}

fn count(v: Option<i64>, what: &str) -> TxResult<Option<u64>> {
    v.map(|n| u64::try_from(n).map_err(|_| corrupt(format!("{what} {n}"))))
        .transpose()
}

#[async_trait]
impl Control for SqliteStore {
    async fn policies(&self) -> StoreResult<Vec<TablePolicy>> {
        self.run("policies", Mode::Read, |tx, _| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {POLICY_COLS} FROM pulpitum_v4_policies ORDER BY table_id"
            ))?;
            let rows = stmt
                .query_map([], policy_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter().map(policy).collect()
        })
        .await
    }

    async fn update_policy(
        &self,
        table_id: &TableId,
        update: &PolicyUpdate,
    ) -> StoreResult<TablePolicy> {
        let table_id = table_id.clone();
        let update = update.clone();
        self.run("update_policy", Mode::Write, move |tx, now| {
            require_table(tx, &table_id)?;
            let current = tx
                .prepare_cached(&format!(
                    "SELECT {POLICY_COLS} FROM pulpitum_v4_policies WHERE table_id = ?1"
                ))?
                .query_row([table_id.as_str()], policy_row)
                .optional()?;
            let mut p = match current {
                Some(row) => policy(row)?,
                None => TablePolicy::none(table_id.clone()),
            };
            if let Some(v) = update.archive_after {
                p.archive_after = v;
            }
            if let Some(v) = &update.format {
                p.format.clone_from(v);
            }
            if let Some(v) = update.cleanup_delay {
                p.cleanup_delay = v;
            }
            if let Some(v) = update.paused {
                p.paused = v;
            }
            if let Some(v) = update.retain_for {
                p.retain_for = v;
            }
            tx.execute(
                &format!(
                    "INSERT OR REPLACE INTO pulpitum_v4_policies ({POLICY_COLS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                ),
                params![
                    table_id.as_str(),
                    p.archive_after.map(micros),
                    p.format,
                    p.cleanup_delay.map(micros),
                    i64::from(p.paused),
                    now,
                    p.retain_for.map(micros)
                ],
            )?;
            p.updated_at = Some(time(now, "policy updated_at")?);
            Ok(p)
        })
        .await
    }

    async fn store_paused(&self) -> StoreResult<bool> {
        self.run("store_paused", Mode::Read, |tx, _| {
            let paused: Option<i64> = tx
                .prepare_cached("SELECT paused FROM pulpitum_v4_store_control WHERE id = 1")?
                .query_row([], |r| r.get(0))
                .optional()?;
            Ok(paused.unwrap_or(0) != 0)
        })
        .await
    }

    async fn set_store_paused(&self, paused: bool) -> StoreResult<()> {
        self.run("set_store_paused", Mode::Write, move |tx, now| {
            tx.execute(
                "INSERT INTO pulpitum_v4_store_control (id, paused, updated_at) VALUES (1, ?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at",
                params![i64::from(paused), now],
            )?;
            Ok(())
        })
        .await
    }

    async fn record_job_start(&self, job: &JobStart) -> StoreResult<()> {
        let job = job.clone();
        self.run("record_job_start", Mode::Write, move |tx, now| {
            let b = &job.bucket;
            let key = b.bucket_key.to_string();
            tx.execute(
                "UPDATE pulpitum_v4_jobs SET outcome = 'abandoned', finished_at = ?5 \
                 WHERE table_id = ?1 AND partition_key = ?2 AND bucket_key = ?3 \
                   AND generation < ?4 AND outcome = 'running'",
                params![
                    b.table_id.as_str(),
                    b.partition_key.as_bytes(),
                    key,
                    job.generation,
                    now
                ],
            )?;
            tx.execute(
                "INSERT OR IGNORE INTO pulpitum_v4_jobs \
                 (table_id, partition_key, bucket_key, generation, kind, worker, started_at, outcome) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running')",
                params![
                    b.table_id.as_str(),
                    b.partition_key.as_bytes(),
                    key,
                    job.generation,
                    job.kind.name(),
                    job.worker,
                    now
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn record_job_end(&self, end: &JobEnd) -> StoreResult<()> {
        let end = end.clone();
        self.run("record_job_end", Mode::Write, move |tx, now| {
            let job = &end.job;
            let b = &job.bucket;
            tx.execute(
                "INSERT INTO pulpitum_v4_jobs (table_id, partition_key, bucket_key, generation, \
                   kind, worker, started_at, finished_at, outcome, row_count, byte_count, error) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, ?10, ?11) \
                 ON CONFLICT (table_id, partition_key, bucket_key, generation) DO UPDATE SET \
                   finished_at = excluded.finished_at, outcome = excluded.outcome, \
                   row_count = excluded.row_count, byte_count = excluded.byte_count, \
                   error = excluded.error",
                params![
                    b.table_id.as_str(),
                    b.partition_key.as_bytes(),
                    b.bucket_key.to_string(),
                    job.generation,
                    job.kind.name(),
                    job.worker,
                    now,
                    end.outcome.name(),
                    end.rows.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
                    end.bytes.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
                    end.error.as_deref().map(crate::store::clip_error),
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn jobs(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>> {
        let filter = filter.clone();
        self.run("jobs", Mode::Read, move |tx, _| {
            let mut args: Vec<Value> = Vec::new();
            let mut preds = Vec::new();
            if let Some(t) = &filter.table {
                args.push(Value::Text(t.as_str().to_string()));
                preds.push(format!("j.table_id = ?{}", args.len()));
            }
            if let Some(since) = filter.since {
                args.push(Value::Integer(since.as_micros()));
                preds.push(format!("j.started_at >= ?{}", args.len()));
            }
            if let Some(until) = filter.until {
                args.push(Value::Integer(until.as_micros()));
                preds.push(format!("j.started_at <= ?{}", args.len()));
            }
            let mut sql = String::from(
                "SELECT j.table_id, j.partition_key, j.bucket_key, tb.bucket_strategy, \
                   j.generation, j.kind, j.worker, j.started_at, j.finished_at, j.outcome, \
                   j.row_count, j.byte_count, j.error \
                 FROM pulpitum_v4_jobs j JOIN pulpitum_v4_tables tb ON tb.table_id = j.table_id",
            );
            if !preds.is_empty() {
                sql.push_str(" WHERE ");
                sql.push_str(&preds.join(" AND "));
            }
            sql.push_str(
                " ORDER BY j.started_at DESC, j.table_id, j.partition_key, j.bucket_key, j.generation DESC",
            );
            if let Some(n) = filter.limit {
                args.push(Value::Integer(to_i64(n)));
                sql.push_str(&format!(" LIMIT ?{}", args.len()));
            }
            let mut stmt = tx.prepare(&sql)?;
            let mut rows = stmt.query(params_from_iter(args))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let table: String = r.get(0)?;
                let pk: Vec<u8> = r.get(1)?;
                let key: String = r.get(2)?;
                let strategy: String = r.get(3)?;
                let kind: String = r.get(5)?;
                let outcome: String = r.get(9)?;
                let finished: Option<i64> = r.get(8)?;
                out.push(JobRecord {
                    bucket: bucket_id(&table, &pk, &strategy, &key)?,
                    generation: r.get(4)?,
                    kind: JobKind::parse(&kind)
                        .ok_or_else(|| corrupt(format!("unknown job kind {kind:?}")))?,
                    worker: r.get(6)?,
                    started_at: time(r.get(7)?, "job started_at")?,
                    finished_at: finished
                        .map(|t| time(t, "job finished_at"))
                        .transpose()?,
                    outcome: JobOutcome::parse(&outcome)
                        .ok_or_else(|| corrupt(format!("unknown job outcome {outcome:?}")))?,
                    rows: count(r.get(10)?, "job row_count")?,
                    bytes: count(r.get(11)?, "job byte_count")?,
                    error: r.get(12)?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn prune_jobs(&self, before: EventTime, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        self.run("prune_jobs", Mode::Write, move |tx, _| {
            let n = tx.execute(
                "DELETE FROM pulpitum_v4_jobs WHERE (table_id, partition_key, bucket_key, generation) IN ( \
                   SELECT table_id, partition_key, bucket_key, generation FROM pulpitum_v4_jobs \
                   WHERE started_at < ?1 ORDER BY started_at LIMIT ?2)",
                params![before.as_micros(), to_i64(limit)],
            )?;
            Ok(n as u64)
        })
        .await
    }
}
