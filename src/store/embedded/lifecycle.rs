//! [`Lifecycle`] for the embedded store: the archiver's claims, snapshots, publication,
//! cleanup and discovery.
//!
//! Every step under a claim runs [`verify_claim`] in its own transaction first: same
//! generation, a state the step accepts, same owner token, lease unexpired at the store's
//! clock. Writers hold SQLite's write lock from that check to the commit, and the UPDATE
//! repeats the generation and token in its WHERE clause, so a stale worker can never write.
//! `snapshot_page` verifies and reads in one read snapshot, so the fence cannot move between
//! the check and the rows.

use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Transaction};

use crate::model::{BucketId, ClusteringKey, EventTime, Record, TableId};
use crate::store::{
    Backlog, BucketMeta, Claim, Eligibility, GcPrefix, Lifecycle, StoreError, StoreResult,
    TableLag, WorkItem, WorkKind,
};

use super::decode::{
    bucket_args, bucket_id, corrupt, load_meta, meta_from_row, record_from, state_name, time,
    to_i64, MetaRow, BUCKET_PK, META_COLUMNS,
};
use super::{Mode, SqliteStore, TxError, TxResult};

/// `now + d`, capped at the last supported instant so the result is always an [`EventTime`].
pub(super) fn plus(now: i64, d: Duration) -> i64 {
    let d = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    now.saturating_add(d)
        .min(EventTime::end_of_supported().as_micros() - 1)
}

/// Which states an operation under a claim accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ClaimState {
    /// A pre-publication claim: `archiving`.
    Archiving,
    /// A cleanup claim: `archived` with hot rows retained.
    Cleanup,
    /// Either (renewal).
    Any,
}

/// Verifies in the caller's transaction that `claim` is current for `operation`: same
/// generation, a state the operation accepts, same token, lease unexpired at `now`.
/// Generation is checked first: a newer claim supersedes this one whatever the state.
fn verify_claim(
    tx: &Transaction<'_>,
    claim: &Claim,
    operation: &'static str,
    accepts: ClaimState,
    now: i64,
) -> TxResult<MetaRow> {
    let stale = |reason: String| -> TxError {
        StoreError::StaleClaim {
            bucket: claim.bucket.clone(),
            generation: claim.generation,
            reason,
        }
        .into()
    };
    let Some(row) = load_meta(tx, &claim.bucket)? else {
        return Err(stale("the bucket has no metadata".into()));
    };
    if row.generation != claim.generation {
        return Err(stale(format!(
            "the bucket is at generation {} ({})",
            row.generation,
            row.describe()
        )));
    }
    let state_ok = match accepts {
        ClaimState::Archiving => row.state == "archiving",
        ClaimState::Cleanup => row.state == "archived" && !row.hot_deleted,
        ClaimState::Any => {
            row.state == "archiving" || (row.state == "archived" && !row.hot_deleted)
        }
    };
    if !state_ok {
        if accepts == ClaimState::Any {
            return Err(stale(format!(
                "the bucket is {}; the claim was released",
                row.describe()
            )));
        }
        return Err(StoreError::InvalidTransition {
            bucket: claim.bucket.clone(),
            operation,
            state: row.describe(),
        }
        .into());
    }
    if row.owner_token.as_deref() != Some(claim.token.as_str()) {
        return Err(stale(match &row.owner_token {
            Some(_) => "another owner token holds this generation".to_string(),
            None => "no owner holds the bucket".to_string(),
        }));
    }
    if !row.lease_held(now) {
        let expired = row
            .lease_expires_at
            .and_then(|t| EventTime::from_micros(t).ok())
            .map_or_else(
                || "no lease is set".to_string(),
                |t| format!("the lease expired at {t}"),
            );
        let now = EventTime::from_micros(now).map_or_else(|_| now.to_string(), |t| t.to_string());
        return Err(stale(format!("{expired} (store time {now})")));
    }
    Ok(row)
}

pub(super) fn fresh_token() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    hex::encode(bytes)
}

/// Whether archive claims on `id`'s table are paused, by its policy or store-wide.
fn archiving_paused(tx: &Transaction<'_>, id: &BucketId) -> TxResult<bool> {
    let paused: i64 = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM pulpitum_v4_policies WHERE table_id = ?1 AND paused = 1) \
                 OR EXISTS (SELECT 1 FROM pulpitum_v4_store_control WHERE paused = 1)",
        )?
        .query_row(params![id.table_id.as_str()], |r| r.get(0))?;
    Ok(paused != 0)
}

/// The time condition of eligibility for a Hot bucket `m` joined to its table's policy `p`:
/// `?1` is the cutoff for tables without a policy, `?2` the bound for tables with one and
/// `?3` the store's now (see [`Eligibility`]). The first conjunct is implied by the second
/// and bounds the `(state, bucket_end)` index range, which a policy-dependent bound cannot:
/// the largest value the `CASE` can take (see the PostgreSQL store's `eligible_by_time`).
const ELIGIBLE_BY_TIME: &str = "m.bucket_end <= max(?1, min(?2, \
       COALESCE(?3 - (SELECT min(q.archive_after_us) FROM pulpitum_v4_policies q), ?1))) \
     AND m.bucket_end <= CASE WHEN p.archive_after_us IS NULL THEN ?1 \
     ELSE min(?2, ?3 - p.archive_after_us) END";

#[async_trait]
impl Lifecycle for SqliteStore {
    async fn claim(&self, bucket: &BucketId, lease: Duration) -> StoreResult<Option<Claim>> {
        let id = bucket.clone();
        self.run("claim", Mode::Write, move |tx, now| {
            let Some(row) = load_meta(tx, &id)? else {
                return Ok(None);
            };
            let claimable = match row.state.as_str() {
                "hot" => row.retry_at.is_none_or(|t| t <= now),
                "archiving" => !row.lease_held(now),
                _ => false,
            };
            // A paused table or store takes no new claims; read under the write lock, so a
            // committed pause is seen by every claim after it.
            if !claimable || archiving_paused(tx, &id)? {
                return Ok(None);
            }
            let claim = Claim {
                bucket: id.clone(),
                token: fresh_token(),
                generation: row.generation + 1,
                expires_at: time(plus(now, lease), "lease expiry")?,
            };
            // Compare-and-set on the generation read above; the write lock already excludes
            // other writers, this keeps the statement correct on its own.
            let n = tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET state = 'archiving', owner_token = ?4, \
                     generation = ?5, lease_expires_at = ?6, retry_at = NULL, updated_at = ?7 \
                     WHERE {BUCKET_PK} AND generation = ?8"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    claim.token,
                    claim.generation,
                    claim.expires_at.as_micros(),
                    now,
                    row.generation,
                ],
            )?;
            Ok((n == 1).then_some(claim))
        })
        .await
    }

    async fn claim_cleanup(
        &self,
        bucket: &BucketId,
        lease: Duration,
    ) -> StoreResult<Option<Claim>> {
        let id = bucket.clone();
        self.run("claim_cleanup", Mode::Write, move |tx, now| {
            let Some(row) = load_meta(tx, &id)? else {
                return Ok(None);
            };
            if row.state != "archived" || row.hot_deleted || row.lease_held(now) {
                return Ok(None);
            }
            let claim = Claim {
                bucket: id.clone(),
                token: fresh_token(),
                generation: row.generation + 1,
                expires_at: time(plus(now, lease), "lease expiry")?,
            };
            let n = tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET owner_token = ?4, generation = ?5, \
                     lease_expires_at = ?6, updated_at = ?7 \
                     WHERE {BUCKET_PK} AND generation = ?8 AND state = 'archived' AND hot_deleted = 0"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    claim.token,
                    claim.generation,
                    claim.expires_at.as_micros(),
                    now,
                    row.generation,
                ],
            )?;
            Ok((n == 1).then_some(claim))
        })
        .await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> StoreResult<Claim> {
        let claim = claim.clone();
        self.run("renew", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, "renew", ClaimState::Any, now)?;
            let expires = plus(now, lease);
            let id = &claim.bucket;
            tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET lease_expires_at = ?4, updated_at = ?5 \
                     WHERE {BUCKET_PK} AND generation = ?6 AND owner_token = ?7"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    expires,
                    now,
                    claim.generation,
                    claim.token,
                ],
            )?;
            Ok(Claim {
                expires_at: time(expires, "lease expiry")?,
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
        let claim = claim.clone();
        let after = after.cloned();
        // Verification and the read share one snapshot: the fence cannot move in between.
        self.run("snapshot_page", Mode::Read, move |tx, now| {
            verify_claim(tx, &claim, "snapshot", ClaimState::Archiving, now)?;
            let id = &claim.bucket;
            let mut sql = "SELECT event_time, sort_key, value FROM pulpitum_v4_records \
                           WHERE table_id = ? AND partition_key = ? AND bucket_key = ?"
                .to_string();
            let mut args = bucket_args(id);
            if let Some(c) = &after {
                sql.push_str(" AND (event_time, sort_key) > (?, ?)");
                args.push(Value::Integer(c.event_time.as_micros()));
                args.push(Value::Blob(c.sort_key.as_bytes().to_vec()));
            }
            sql.push_str(" ORDER BY event_time, sort_key LIMIT ?");
            args.push(Value::Integer(to_i64(limit)));
            let mut stmt = tx.prepare_cached(&sql)?;
            let mut rows = stmt.query(params_from_iter(args.iter()))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(record_from(
                    &id.partition_key,
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                )?);
            }
            Ok(out)
        })
        .await
    }

    async fn defer_archive(&self, claim: &Claim, retry_after: Duration) -> StoreResult<()> {
        let claim = claim.clone();
        self.run("defer_archive", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, "defer", ClaimState::Archiving, now)?;
            let id = &claim.bucket;
            tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET state = 'hot', owner_token = NULL, \
                     lease_expires_at = NULL, retry_at = ?4, updated_at = ?5 \
                     WHERE {BUCKET_PK} AND generation = ?6 AND owner_token = ?7"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    plus(now, retry_after),
                    now,
                    claim.generation,
                    claim.token,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn publish_archive(&self, claim: &Claim, object_key: &str) -> StoreResult<()> {
        let claim = claim.clone();
        let object_key = object_key.to_string();
        self.run("publish_archive", Mode::Write, move |tx, now| {
            verify_claim(tx, &claim, "publish", ClaimState::Archiving, now)?;
            let id = &claim.bucket;
            // Publication ends the claim: the owner and lease are cleared so cleanup can be
            // claimed at once (it still waits for min_age since publication).
            tx.execute(
                &format!(
                    "UPDATE pulpitum_v4_bucket_metadata SET state = 'archived', object_key = ?4, \
                     hot_deleted = 0, published_at = ?5, owner_token = NULL, lease_expires_at = NULL, \
                     updated_at = ?5 \
                     WHERE {BUCKET_PK} AND generation = ?6 AND owner_token = ?7"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    object_key,
                    now,
                    claim.generation,
                    claim.token,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn cleanup_step(
        &self,
        claim: &Claim,
        limit: usize,
        min_age: Duration,
    ) -> StoreResult<(u64, bool)> {
        let claim = claim.clone();
        self.run("cleanup_step", Mode::Write, move |tx, now| {
            // A repeated step after the last one committed is a no-op that reports done.
            if let Some(row) = load_meta(tx, &claim.bucket)? {
                if row.state == "archived"
                    && row.hot_deleted
                    && row.generation == claim.generation
                    && row.owner_token.as_deref() == Some(claim.token.as_str())
                {
                    return Ok((0, true));
                }
            }
            let row = verify_claim(tx, &claim, "clean up", ClaimState::Cleanup, now)?;
            let published = row
                .published_at
                .ok_or_else(|| corrupt(format!("archived bucket {} has no publication time", claim.bucket)))?;
            if plus(published, min_age) > now {
                return Err(StoreError::InvalidTransition {
                    bucket: claim.bucket.clone(),
                    operation: "clean up before min_age has passed since publication",
                    state: format!(
                        "{} published at {} (min_age {:?})",
                        row.describe(),
                        time(published, "publication time")?,
                        min_age
                    ),
                }
                .into());
            }
            let id = &claim.bucket;
            let key = params![id.table_id.as_str(), id.partition_key.as_bytes(), id.bucket_key.to_string()];
            let deleted = tx.execute(
                &format!(
                    "DELETE FROM pulpitum_v4_records WHERE {BUCKET_PK} AND (event_time, sort_key) IN \
                     (SELECT event_time, sort_key FROM pulpitum_v4_records WHERE {BUCKET_PK} \
                      ORDER BY event_time, sort_key LIMIT ?4)"
                ),
                params![
                    id.table_id.as_str(),
                    id.partition_key.as_bytes(),
                    id.bucket_key.to_string(),
                    to_i64(limit),
                ],
            )?;
            let remaining: bool = tx.query_row(
                &format!("SELECT EXISTS (SELECT 1 FROM pulpitum_v4_records WHERE {BUCKET_PK})"),
                key,
                |r| r.get(0),
            )?;
            if !remaining {
                tx.execute(
                    &format!(
                        "UPDATE pulpitum_v4_bucket_metadata SET hot_deleted = 1, updated_at = ?4 \
                         WHERE {BUCKET_PK} AND generation = ?5"
                    ),
                    params![
                        id.table_id.as_str(),
                        id.partition_key.as_bytes(),
                        id.bucket_key.to_string(),
                        now,
                        claim.generation,
                    ],
                )?;
            }
            Ok((deleted as u64, !remaining))
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
        let delay = i64::try_from(cleanup_delay.as_micros()).unwrap_or(i64::MAX);
        let (cutoff, bound) = (rule.cutoff.as_micros(), rule.policy_bound().as_micros());
        self.run("discover", Mode::Read, move |tx, now| {
            // Archive work skips paused tables and a paused store; cleanup never does.
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT m.table_id, m.partition_key, m.bucket_key, m.bucket_strategy, m.state \
                 FROM pulpitum_v4_bucket_metadata m \
                 LEFT JOIN pulpitum_v4_policies p ON p.table_id = m.table_id \
                 WHERE (((m.state = 'hot' AND {ELIGIBLE_BY_TIME} \
                          AND (m.retry_at IS NULL OR m.retry_at <= ?3)) \
                        OR (m.state = 'archiving' \
                          AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= ?3))) \
                       AND COALESCE(p.paused, 0) = 0 \
                       AND NOT EXISTS (SELECT 1 FROM pulpitum_v4_store_control WHERE paused = 1)) \
                    OR (m.state = 'archived' AND m.hot_deleted = 0 \
                        AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= ?3) \
                        AND m.published_at <= ?3 - max(?5, COALESCE(p.cleanup_delay_us, 0))) \
                 ORDER BY m.bucket_end, m.table_id, m.partition_key, m.bucket_key \
                 LIMIT ?4"
            ))?;
            let mut rows = stmt.query(params![cutoff, bound, now, to_i64(limit), delay])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let table_id: String = r.get(0)?;
                let pk: Vec<u8> = r.get(1)?;
                let key: String = r.get(2)?;
                let strategy: String = r.get(3)?;
                let state: String = r.get(4)?;
                let kind = match state_name(&state)? {
                    "hot" => WorkKind::Eligible,
                    "archiving" => WorkKind::ExpiredClaim,
                    _ => WorkKind::CleanupPending,
                };
                out.push(WorkItem {
                    bucket: bucket_id(&table_id, &pk, &strategy, &key)?,
                    kind,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn backlog(&self, rule: &Eligibility) -> StoreResult<Backlog> {
        let (cutoff, bound) = (rule.cutoff.as_micros(), rule.policy_bound().as_micros());
        self.run("backlog", Mode::Read, move |tx, now| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT m.table_id, count(*), min(m.bucket_end) FROM pulpitum_v4_bucket_metadata m \
                 LEFT JOIN pulpitum_v4_policies p ON p.table_id = m.table_id \
                 WHERE m.state = 'hot' AND {ELIGIBLE_BY_TIME} \
                 GROUP BY m.table_id ORDER BY m.table_id"
            ))?;
            let mut backlog = Backlog::default();
            let mut rows = stmt.query(params![cutoff, bound, now])?;
            while let Some(r) = rows.next()? {
                let table: String = r.get(0)?;
                let n: i64 = r.get(1)?;
                let oldest: i64 = r.get(2)?;
                let n = u64::try_from(n).unwrap_or(0);
                backlog.eligible += n;
                backlog.tables.push(TableLag {
                    table_id: TableId::new(table).map_err(|e| corrupt(e.to_string()))?,
                    eligible: n,
                    oldest_eligible_end: Some(time(oldest, "bucket_end")?),
                });
            }
            let archiving: i64 = tx
                .prepare_cached(
                    "SELECT count(*) FROM pulpitum_v4_bucket_metadata WHERE state = 'archiving'",
                )?
                .query_row([], |r| r.get(0))?;
            backlog.archiving = u64::try_from(archiving).unwrap_or(0);
            Ok(backlog)
        })
        .await
    }

    async fn archiving_claims(&self) -> StoreResult<Vec<BucketMeta>> {
        self.run("archiving_claims", Mode::Read, |tx, _| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {META_COLUMNS} FROM pulpitum_v4_bucket_metadata WHERE state = 'archiving'"
            ))?;
            let rows = stmt.query_map([], meta_from_row)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.to_meta()?);
            }
            Ok(out)
        })
        .await
    }

    async fn routed_among(&self, keys: &[String]) -> StoreResult<Vec<String>> {
        let keys = keys.to_vec();
        self.run("routed_among", Mode::Read, move |tx, _| {
            // One probe of the object-key index per key (SQLite caps bound parameters, so
            // no array): the statement is prepared once.
            let mut stmt = tx.prepare_cached(
                "SELECT 1 FROM pulpitum_v4_bucket_metadata WHERE object_key = ?1 LIMIT 1",
            )?;
            let mut out = Vec::new();
            for key in &keys {
                if stmt.exists(params![key])? {
                    out.push(key.clone());
                }
            }
            out.sort();
            out.dedup();
            Ok(out)
        })
        .await
    }

    async fn note_gc_prefix(&self, prefix: &str) -> StoreResult<GcPrefix> {
        let prefix = prefix.to_string();
        self.run("note_gc_prefix", Mode::Write, move |tx, now| {
            tx.prepare_cached(
                "INSERT INTO pulpitum_v4_gc_prefixes (prefix, recorded_at) VALUES (?1, ?2) \
                 ON CONFLICT (prefix) DO UPDATE SET recorded_at = excluded.recorded_at",
            )?
            .execute(params![prefix, now])?;
            Ok(GcPrefix {
                prefix: prefix.clone(),
                recorded_at: time(now, "recorded_at")?,
            })
        })
        .await
    }

    async fn gc_prefixes(
        &self,
        min_age: Duration,
        under: &str,
        limit: usize,
    ) -> StoreResult<Vec<GcPrefix>> {
        let age = i64::try_from(min_age.as_micros()).unwrap_or(i64::MAX);
        let under = under.to_string();
        self.run("gc_prefixes", Mode::Read, move |tx, now| {
            let mut stmt = tx.prepare_cached(
                "SELECT prefix, recorded_at FROM pulpitum_v4_gc_prefixes \
                 WHERE recorded_at <= ?1 AND substr(prefix, 1, length(?3)) = ?3 \
                 ORDER BY recorded_at, prefix LIMIT ?2",
            )?;
            let rows = stmt
                .query_map(
                    params![now.saturating_sub(age), to_i64(limit), under],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(prefix, at)| {
                    Ok(GcPrefix {
                        prefix,
                        recorded_at: time(at, "recorded_at")?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn forget_gc_prefixes(&self, seen: &[GcPrefix]) -> StoreResult<u64> {
        if seen.is_empty() {
            return Ok(0);
        }
        let seen = seen.to_vec();
        self.run("forget_gc_prefixes", Mode::Write, move |tx, _| {
            // Only a row as read: one noted again since stays for the next pass.
            let mut delete = tx.prepare_cached(
                "DELETE FROM pulpitum_v4_gc_prefixes WHERE prefix = ?1 AND recorded_at = ?2",
            )?;
            let mut forgotten = 0u64;
            for g in &seen {
                forgotten += delete.execute(params![g.prefix, g.recorded_at.as_micros()])? as u64;
            }
            Ok(forgotten)
        })
        .await
    }

    async fn referenced_object_keys(&self) -> StoreResult<Vec<String>> {
        self.run("referenced_object_keys", Mode::Read, |tx, _| {
            let mut stmt = tx.prepare(
                "SELECT DISTINCT object_key FROM pulpitum_v4_bucket_metadata \
                 WHERE object_key IS NOT NULL ORDER BY object_key",
            )?;
            let keys = stmt.query_map([], |r| r.get(0))?;
            Ok(keys.collect::<rusqlite::Result<Vec<String>>>()?)
        })
        .await
    }
}
