//! [`Lifecycle`] on PostgreSQL: the archiver's steps (claim, renew, snapshot, defer,
//! publish, clean up) and its discovery queries.
//!
//! Each step is one serializable transaction whose writing (or reading) statement checks
//! owner token, generation, state and `lease_expires_at > now()` itself, on the database's
//! clock. Taking a claim, the conditional write and the explanation of a refusal are shared
//! by the steps and live in `claims`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use tokio_postgres::IsolationLevel;

use super::decode::{corrupt, decode_meta, decode_record, event_time};
use super::sql::{
    eligible_by_time, limit_param, micros, param_refs, push, Params, GC_PREFIXES, META, META_COLS,
    POLICIES, RECORDS, STORE_NOT_PAUSED,
};
use super::{PgStore, TxError};
use crate::model::{
    BucketId, BucketKey, BucketStrategy, ClusteringKey, PartitionKey, Record, TableId,
};
use crate::store::{
    Backlog, BucketMeta, Claim, Eligibility, GcPrefix, Lifecycle, StoreResult, TableLag, WorkItem,
    WorkKind,
};

#[async_trait]
impl Lifecycle for PgStore {
    async fn claim(&self, bucket: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        let key = bucket.bucket_key.to_string();
        let lease = micros(lease);
        let sql = format!(
            "UPDATE {META} SET state = 'archiving', owner_token = $4, generation = generation + 1, \
               lease_expires_at = now() + $5::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND ((state = 'hot' AND (retry_at IS NULL OR retry_at <= now())) \
                 OR (state = 'archiving' AND (lease_expires_at IS NULL OR lease_expires_at <= now()))) \
               AND NOT EXISTS (SELECT 1 FROM {POLICIES} p WHERE p.table_id = $1 AND p.paused) \
               AND {STORE_NOT_PAUSED} \
             RETURNING generation, lease_expires_at"
        );
        self.claim_with(bucket, "claim", &sql, &key, lease).await
    }

    async fn claim_cleanup(
        &self,
        bucket: &BucketId,
        lease: Duration,
    ) -> StoreResult<Option<Claim>> {
        let key = bucket.bucket_key.to_string();
        let lease = micros(lease);
        let sql = format!(
            "UPDATE {META} SET owner_token = $4, generation = generation + 1, \
               lease_expires_at = now() + $5::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND state = 'archived' AND NOT hot_deleted \
               AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
             RETURNING generation, lease_expires_at"
        );
        self.claim_with(bucket, "claim_cleanup", &sql, &key, lease)
            .await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> StoreResult<Claim> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        let lease = micros(lease);
        let sql = format!(
            "UPDATE {META} SET lease_expires_at = now() + $6::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND owner_token = $4 AND generation = $5 AND lease_expires_at > now() \
               AND state IN ('archiving', 'archived') \
             RETURNING lease_expires_at"
        );
        self.run("renew", || async {
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
                        &b.table_id.as_str(),
                        &b.partition_key.as_bytes(),
                        &key,
                        &claim.token,
                        &claim.generation,
                        &lease,
                    ],
                )
                .await?;
            let Some(row) = row else {
                return Err(
                    Self::refusal(&tx, claim, "renew", &["archiving", "archived"], None).await,
                );
            };
            let expires: DateTime<Utc> = row.try_get(0)?;
            let expires_at = event_time(expires, "lease_expires_at")?;
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(Claim {
                expires_at,
                ..claim.clone()
            })
        })
        .await
    }

    async fn snapshot_page(
        &self,
        claim: &Claim,
        after: Option<&ClusteringKey>,
        limit: usize,
    ) -> StoreResult<Vec<Record>> {
        let b = &claim.bucket;
        let mut params: Params = Vec::new();
        let t = push(&mut params, b.table_id.as_str().to_string());
        let p = push(&mut params, b.partition_key.as_bytes().to_vec());
        let k = push(&mut params, b.bucket_key.to_string());
        let tok = push(&mut params, claim.token.clone());
        let g = push(&mut params, claim.generation);
        let mut preds = String::new();
        if let Some(c) = after {
            let at = push(&mut params, c.event_time.to_datetime());
            let ak = push(&mut params, c.sort_key.as_bytes().to_vec());
            preds = format!(" AND (r.event_time, r.sort_key) > ({at}, {ak})");
        }
        let n = push(&mut params, limit_param(limit));
        // Claim check and rows in one statement, the rows subquery bounded by parameters only
        // (no correlated limit; see `read_page`).
        let sql = format!(
            "SELECT x.event_time, x.sort_key, x.value \
             FROM {META} m LEFT JOIN ( \
               SELECT r.event_time, r.sort_key, r.value FROM {RECORDS} r \
               WHERE r.table_id = {t} AND r.partition_key = {p} AND r.bucket_key = {k}{preds} \
               ORDER BY r.event_time, r.sort_key LIMIT {n} \
             ) x ON true \
             WHERE m.table_id = {t} AND m.partition_key = {p} AND m.bucket_key = {k} \
               AND m.owner_token = {tok} AND m.generation = {g} AND m.state = 'archiving' \
               AND m.lease_expires_at > now() \
             ORDER BY x.event_time, x.sort_key"
        );
        self.run("snapshot_page", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let stmt = tx.prepare_cached(&sql).await?;
            let rows = tx.query(&stmt, &param_refs(&params)).await?;
            if rows.is_empty() {
                return Err(Self::refusal(&tx, claim, "snapshot", &["archiving"], None).await);
            }
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                if let Some(r) = decode_record(row, 0, &b.partition_key, true)? {
                    out.push(r);
                }
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(out)
        })
        .await
    }

    async fn defer_archive(&self, claim: &Claim, retry_after: Duration) -> StoreResult<()> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        let retry = micros(retry_after);
        let sql = format!(
            "UPDATE {META} SET state = 'hot', owner_token = NULL, lease_expires_at = NULL, \
               retry_at = now() + $6::INT8 * INTERVAL '1 microsecond', updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND owner_token = $4 AND generation = $5 AND state = 'archiving' AND lease_expires_at > now()"
        );
        self.conditional_write(
            claim,
            "defer archiving",
            &["archiving"],
            None,
            &sql,
            &[
                &b.table_id.as_str(),
                &b.partition_key.as_bytes(),
                &key,
                &claim.token,
                &claim.generation,
                &retry,
            ],
        )
        .await
    }

    async fn publish_archive(&self, claim: &Claim, object_key: &str) -> StoreResult<()> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        // The owner token and lease are released so that cleanup can be claimed at once.
        let sql = format!(
            "UPDATE {META} SET state = 'archived', object_key = $6, hot_deleted = false, \
               published_at = now(), owner_token = NULL, lease_expires_at = NULL, updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND owner_token = $4 AND generation = $5 AND state = 'archiving' AND lease_expires_at > now()"
        );
        self.conditional_write(
            claim,
            "publish",
            &["archiving"],
            None,
            &sql,
            &[
                &b.table_id.as_str(),
                &b.partition_key.as_bytes(),
                &key,
                &claim.token,
                &claim.generation,
                &object_key,
            ],
        )
        .await
    }

    async fn cleanup_step(
        &self,
        claim: &Claim,
        limit: usize,
        min_age: Duration,
    ) -> StoreResult<(u64, bool)> {
        let b = &claim.bucket;
        let key = b.bucket_key.to_string();
        let age = micros(min_age);
        let n = limit_param(limit);
        let delete_sql = format!(
            "WITH m AS ( \
               SELECT 1 FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
                 AND state = 'archived' AND owner_token = $4 AND generation = $5 \
                 AND lease_expires_at > now() \
                 AND published_at + $6::INT8 * INTERVAL '1 microsecond' <= now() \
             ), d AS ( \
               DELETE FROM {RECORDS} WHERE (table_id, partition_key, bucket_key, event_time, sort_key) IN ( \
                 SELECT table_id, partition_key, bucket_key, event_time, sort_key FROM {RECORDS} \
                 WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 AND EXISTS (SELECT 1 FROM m) \
                 ORDER BY event_time, sort_key LIMIT $7) \
               RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM m)::INT8, (SELECT count(*) FROM d)::INT8"
        );
        let remaining_sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {RECORDS} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3)"
        );
        let done_sql = format!(
            "UPDATE {META} SET hot_deleted = true, updated_at = now() \
             WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3 \
               AND state = 'archived' AND owner_token = $4 AND generation = $5 AND lease_expires_at > now()"
        );
        self.run("cleanup", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let ids: [&(dyn ToSql + Sync); 3] =
                [&b.table_id.as_str(), &b.partition_key.as_bytes(), &key];
            let row = tx
                .query_one(
                    &delete_sql,
                    &[
                        ids[0],
                        ids[1],
                        ids[2],
                        &claim.token,
                        &claim.generation,
                        &age,
                        &n,
                    ],
                )
                .await?;
            let held: i64 = row.try_get(0)?;
            let deleted: i64 = row.try_get(1)?;
            if held == 0 {
                return Err(
                    Self::refusal(&tx, claim, "clean up", &["archived"], Some(min_age)).await,
                );
            }
            let deleted = u64::try_from(deleted).unwrap_or(0);
            let mut done = false;
            if deleted < n as u64 {
                let remaining: bool = tx.query_one(&remaining_sql, &ids).await?.try_get(0)?;
                if !remaining {
                    let updated = tx
                        .execute(
                            &done_sql,
                            &[ids[0], ids[1], ids[2], &claim.token, &claim.generation],
                        )
                        .await?;
                    if updated != 1 {
                        return Err(TxError::Conflict(
                            "cleanup claim changed mid-transaction".into(),
                        ));
                    }
                    done = true;
                }
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok((deleted, done))
        })
        .await
    }

    async fn discover(&self, rule: &Eligibility, limit: usize) -> StoreResult<Vec<WorkItem>> {
        self.discover_ready(rule, limit, Duration::ZERO).await
    }

    async fn discover_ready(
        &self,
        rule: &Eligibility,
        limit: usize,
        cleanup_delay: Duration,
    ) -> StoreResult<Vec<WorkItem>> {
        let sql = discover_sql();
        let cutoff = rule.cutoff.to_datetime();
        let bound = rule.policy_bound().to_datetime();
        let n = limit_param(limit);
        let delay = micros(cleanup_delay);
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.run("discover", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[&cutoff, &bound, &delay, &n]).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let get = |e: tokio_postgres::Error| corrupt("bucket metadata row", e);
                let table_id: String = row.try_get(0).map_err(get)?;
                let pk: Vec<u8> = row.try_get(1).map_err(get)?;
                let key: String = row.try_get(2).map_err(get)?;
                let strategy: String = row.try_get(3).map_err(get)?;
                let kind: i32 = row.try_get(6).map_err(get)?;
                let strategy: BucketStrategy = strategy
                    .parse()
                    .map_err(|e| corrupt("bucket strategy", e))?;
                let bucket = BucketId {
                    table_id: TableId::new(table_id).map_err(|e| corrupt("table id", e))?,
                    partition_key: PartitionKey::new(pk)
                        .map_err(|e| corrupt("partition key", e))?,
                    bucket_key: BucketKey::parse(strategy, &key)
                        .map_err(|e| corrupt("bucket key", e))?,
                };
                let kind = match kind {
                    0 => WorkKind::Eligible,
                    1 => WorkKind::ExpiredClaim,
                    _ => WorkKind::CleanupPending,
                };
                out.push(WorkItem { bucket, kind });
            }
            Ok(out)
        })
        .await
    }

    async fn backlog(&self, rule: &Eligibility) -> StoreResult<Backlog> {
        let sql = backlog_sql();
        let cutoff = rule.cutoff.to_datetime();
        let bound = rule.policy_bound().to_datetime();
        self.run("backlog", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[&cutoff, &bound]).await?;
            let mut backlog = Backlog::default();
            for row in &rows {
                let bad = |e: tokio_postgres::Error| corrupt("backlog row", e);
                let table: Option<String> = row.try_get(0).map_err(bad)?;
                let n: i64 = row.try_get(1).map_err(bad)?;
                let n = u64::try_from(n).map_err(|e| corrupt("backlog count", e))?;
                match table {
                    None => backlog.archiving = n,
                    Some(table) => {
                        let oldest: Option<DateTime<Utc>> = row.try_get(2).map_err(bad)?;
                        backlog.eligible += n;
                        backlog.tables.push(TableLag {
                            table_id: TableId::new(table).map_err(|e| corrupt("table id", e))?,
                            eligible: n,
                            oldest_eligible_end: oldest
                                .map(|t| event_time(t, "bucket_end"))
                                .transpose()?,
                        });
                    }
                }
            }
            backlog.tables.sort_by(|a, b| a.table_id.cmp(&b.table_id));
            Ok(backlog)
        })
        .await
    }

    async fn archiving_claims(&self) -> StoreResult<Vec<BucketMeta>> {
        let sql = archiving_sql();
        self.run("archiving_claims", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[]).await?;
            Ok(rows
                .iter()
                .map(decode_meta)
                .collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn routed_among(&self, keys: &[String]) -> StoreResult<Vec<String>> {
        let sql = routed_among_sql();
        let mut out = Vec::new();
        for chunk in keys.chunks(ROUTED_AMONG_BATCH) {
            let chunk = chunk.to_vec();
            let found = self
                .run("routed_among", || async {
                    let client = self.pooled().await?;
                    let rows = client.query(&sql, &[&chunk]).await?;
                    Ok(rows
                        .iter()
                        .map(|r| r.try_get::<_, String>(0))
                        .collect::<Result<Vec<_>, _>>()?)
                })
                .await?;
            out.extend(found);
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    async fn note_gc_prefix(&self, prefix: &str) -> StoreResult<GcPrefix> {
        let sql = format!(
            "INSERT INTO {GC_PREFIXES} (prefix, recorded_at) VALUES ($1, now()) \
             ON CONFLICT (prefix) DO UPDATE SET recorded_at = excluded.recorded_at \
             RETURNING recorded_at"
        );
        let at: DateTime<Utc> = self
            .run("note_gc_prefix", || async {
                let client = self.pooled().await?;
                let row = client.query_one(&sql, &[&prefix]).await?;
                Ok(row.try_get(0)?)
            })
            .await?;
        Ok(GcPrefix {
            prefix: prefix.to_string(),
            recorded_at: event_time(at, "recorded_at")?,
        })
    }

    async fn gc_prefixes(
        &self,
        min_age: Duration,
        under: &str,
        limit: usize,
    ) -> StoreResult<Vec<GcPrefix>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT prefix, recorded_at FROM {GC_PREFIXES} \
             WHERE recorded_at <= now() - $1::INT8 * INTERVAL '1 microsecond' \
               AND left(prefix, length($3::TEXT)) = $3::TEXT \
             ORDER BY recorded_at, prefix LIMIT $2"
        );
        let (age, n) = (micros(min_age), limit_param(limit));
        self.run("gc_prefixes", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[&age, &n, &under]).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let at: DateTime<Utc> = row.try_get(1)?;
                out.push(GcPrefix {
                    prefix: row.try_get(0)?,
                    recorded_at: event_time(at, "recorded_at")?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn forget_gc_prefixes(&self, seen: &[GcPrefix]) -> StoreResult<u64> {
        if seen.is_empty() {
            return Ok(0);
        }
        // Each row only as read: one noted again since (a new compaction of the same
        // window) stays for the next pass.
        let sql = format!(
            "DELETE FROM {GC_PREFIXES} g USING unnest($1::TEXT[], $2::TIMESTAMPTZ[]) AS s(prefix, at) \
             WHERE g.prefix = s.prefix AND g.recorded_at = s.at"
        );
        let mut forgotten = 0;
        for chunk in seen.chunks(ROUTED_AMONG_BATCH) {
            let prefixes: Vec<&str> = chunk.iter().map(|g| g.prefix.as_str()).collect();
            let ats: Vec<DateTime<Utc>> =
                chunk.iter().map(|g| g.recorded_at.to_datetime()).collect();
            forgotten += self
                .run("forget_gc_prefixes", || async {
                    let client = self.pooled().await?;
                    Ok(client.execute(&sql, &[&prefixes, &ats]).await?)
                })
                .await?;
        }
        Ok(forgotten)
    }

    async fn referenced_object_keys(&self) -> StoreResult<Vec<String>> {
        let sql = format!("SELECT DISTINCT object_key FROM {META} WHERE object_key IS NOT NULL ORDER BY object_key");
        self.run("referenced_object_keys", || async {
            let client = self.pooled().await?;
            let rows = client.query(&sql, &[]).await?;
            Ok(rows
                .iter()
                .map(|r| r.try_get::<_, String>(0))
                .collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

/// Keys per `routed_among` statement: one probe of the object-key index each, in a
/// statement of bounded size.
const ROUTED_AMONG_BATCH: usize = 1_000;

/// The predicate of migration 26's partial cleanup index, which [`discover_sql`] states
/// verbatim for its alias `m` (PostgreSQL and CockroachDB use a partial index only for a
/// query that implies it).
#[cfg(test)]
const CLEANUP_PENDING: &str = "state = 'archived' AND NOT hot_deleted";

/// `discover_ready`'s statement: `$1` cutoff, `$2` policy bound, `$3` cleanup delay (µs),
/// `$4` limit. Each branch reads only its working set: Hot buckets up to the greatest bound
/// and expired claims from the `(state, bucket_end)` index, unfinished cleanups from the
/// partial index of migration 26, never the archived history.
pub(super) fn discover_sql() -> String {
    let cols = "m.table_id, m.partition_key, m.bucket_key, m.bucket_strategy, m.bucket_start, m.bucket_end";
    let eligible = eligible_by_time("$1", "$2");
    // Archive work (kinds 0 and 1) skips paused tables and a paused store; cleanup
    // (kind 2) never does, so a pause never keeps published buckets' hot rows.
    format!(
        "SELECT * FROM ( \
           SELECT {cols}, 0::INT4 AS kind FROM {META} m LEFT JOIN {POLICIES} p ON p.table_id = m.table_id \
             WHERE m.state = 'hot' AND {eligible} \
               AND (m.retry_at IS NULL OR m.retry_at <= now()) \
               AND NOT COALESCE(p.paused, false) AND {STORE_NOT_PAUSED} \
           UNION ALL \
           SELECT {cols}, 1::INT4 AS kind FROM {META} m LEFT JOIN {POLICIES} p ON p.table_id = m.table_id \
             WHERE m.state = 'archiving' AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= now()) \
               AND NOT COALESCE(p.paused, false) AND {STORE_NOT_PAUSED} \
           UNION ALL \
           SELECT {cols}, 2::INT4 AS kind FROM {META} m LEFT JOIN {POLICIES} p ON p.table_id = m.table_id \
             WHERE m.state = 'archived' AND NOT m.hot_deleted \
               AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= now()) \
               AND m.published_at + GREATEST($3::INT8, COALESCE(p.cleanup_delay_us, 0)) * INTERVAL '1 microsecond' <= now() \
         ) w ORDER BY bucket_end, table_id, partition_key, bucket_key LIMIT $4"
    )
}

/// `backlog`'s statement: `$1` cutoff, `$2` policy bound. The eligible Hot buckets grouped
/// by table, then one row (table NULL) counting the Archiving ones; count() is INT8 on both
/// dialects (sum() would be DECIMAL on CockroachDB).
pub(super) fn backlog_sql() -> String {
    let eligible = eligible_by_time("$1", "$2");
    format!(
        "SELECT m.table_id, count(*), min(m.bucket_end) FROM {META} m \
           LEFT JOIN {POLICIES} p ON p.table_id = m.table_id \
           WHERE m.state = 'hot' AND {eligible} GROUP BY m.table_id \
         UNION ALL \
         SELECT NULL::TEXT, count(*), NULL::TIMESTAMPTZ FROM {META} WHERE state = 'archiving'"
    )
}

/// `archiving_claims`' statement: every in-flight claim, from the `(state, bucket_end)`
/// index.
pub(super) fn archiving_sql() -> String {
    format!("SELECT {META_COLS} FROM {META} WHERE state = 'archiving'")
}

/// `routed_among`'s statement: `$1` object keys; one probe of the object-key index each,
/// stopping at the first bucket (a segment's manifest is routed to by thousands).
pub(super) fn routed_among_sql() -> String {
    format!(
        "SELECT k FROM (SELECT DISTINCT k FROM unnest($1::TEXT[]) AS u(k)) AS keys \
         WHERE EXISTS (SELECT 1 FROM {META} m WHERE m.object_key = keys.k)"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn cleanup_discovery_states_its_partial_index_predicate() {
        let sql = super::discover_sql().replace("m.", "");
        assert!(sql.contains(super::CLEANUP_PENDING), "{sql}");
        let migration = include_str!("../../../sql/0026_bucket_metadata_cleanup_idx.sql");
        assert!(
            migration.contains(&format!("WHERE {};", super::CLEANUP_PENDING)),
            "{migration}"
        );
    }
}
