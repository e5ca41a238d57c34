//! The compare-and-set plumbing of the archiver's steps on PostgreSQL: taking a claim
//! (a fresh owner token, generation + 1 and a lease, in one conditional `UPDATE`), a
//! conditional write under a held claim, and the re-read that explains a refusal.
//!
//! A conditional statement that matches no row says nothing about why; `refusal` re-reads
//! the bucket in the same transaction and names the cause (stale generation, wrong state,
//! another owner, an expired lease, too young to clean up), or reports a conflict to retry
//! when the row shows none of these (it changed while it was checked).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use tokio_postgres::IsolationLevel;

use super::decode::{corrupt, event_time};
use super::sql::META;
use super::{PgStore, TxError};
use crate::model::BucketId;
use crate::store::{Claim, StoreError, StoreResult};

impl PgStore {
    /// Re-reads a bucket inside the transaction of a refused conditional write and turns
    /// what it finds into the precise error.
    pub(super) async fn refusal(
        tx: &deadpool_postgres::Transaction<'_>,
        claim: &Claim,
        op: &'static str,
        allowed: &[&str],
        min_age: Option<Duration>,
    ) -> TxError {
        let b = &claim.bucket;
        let sql = format!(
            "SELECT state, owner_token, generation, lease_expires_at, published_at, now() \
             FROM {META} WHERE table_id = $1 AND partition_key = $2 AND bucket_key = $3"
        );
        let key = b.bucket_key.to_string();
        let row = match tx
            .query_opt(
                &sql,
                &[&b.table_id.as_str(), &b.partition_key.as_bytes(), &key],
            )
            .await
        {
            Ok(r) => r,
            Err(e) => return TxError::Db(e),
        };
        let stale = |reason: String| {
            TxError::Store(StoreError::StaleClaim {
                bucket: b.clone(),
                generation: claim.generation,
                reason,
            })
        };
        let Some(row) = row else {
            return stale("the bucket has no metadata".into());
        };
        let parsed: Result<_, tokio_postgres::Error> = (|| {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, Option<String>>(1)?,
                row.try_get::<_, i64>(2)?,
                row.try_get::<_, Option<DateTime<Utc>>>(3)?,
                row.try_get::<_, Option<DateTime<Utc>>>(4)?,
                row.try_get::<_, DateTime<Utc>>(5)?,
            ))
        })();
        let (state, token, generation, lease, published, now) = match parsed {
            Ok(v) => v,
            Err(e) => return TxError::Store(corrupt("bucket metadata", e)),
        };
        if generation != claim.generation {
            return stale(format!("the bucket's generation is now {generation}"));
        }
        if !allowed.contains(&state.as_str()) {
            return TxError::Store(StoreError::InvalidTransition {
                bucket: b.clone(),
                operation: op,
                state,
            });
        }
        if token.as_deref() != Some(claim.token.as_str()) {
            return stale("another owner token holds the bucket".into());
        }
        match lease {
            Some(l) if l > now => {}
            Some(l) => return stale(format!("the lease expired at {l} (store time {now})")),
            None => return stale("the claim holds no lease".into()),
        }
        if let (Some(min_age), Some(published)) = (min_age, published) {
            let age = now - published;
            if age < chrono::Duration::from_std(min_age).unwrap_or(chrono::Duration::MAX) {
                return TxError::Store(StoreError::InvalidTransition {
                    bucket: b.clone(),
                    operation: "clean up before the minimum age since publication",
                    state: format!(
                        "archived {} ms ago, minimum {} ms",
                        age.num_milliseconds(),
                        min_age.as_millis()
                    ),
                });
            }
        }
        TxError::Conflict(format!("{op}: the bucket changed while it was checked"))
    }

    /// Runs a claiming `UPDATE` (`sql`, whose parameters are table, partition, bucket key,
    /// a fresh owner token and the lease in microseconds, and which returns the new
    /// generation and lease expiry) and returns the claim it took, or `None` when the
    /// bucket was not claimable.
    pub(super) async fn claim_with(
        &self,
        bucket: &BucketId,
        op: &'static str,
        sql: &str,
        key: &str,
        lease: i64,
    ) -> StoreResult<Option<Claim>> {
        self.run(op, || async {
            let token = new_token();
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let row = tx
                .query_opt(
                    sql,
                    &[
                        &bucket.table_id.as_str(),
                        &bucket.partition_key.as_bytes(),
                        &key,
                        &token,
                        &lease,
                    ],
                )
                .await?;
            let claim = match row {
                None => None,
                Some(row) => {
                    let generation: i64 = row.try_get(0)?;
                    let expires: DateTime<Utc> = row.try_get(1)?;
                    Some(Claim {
                        bucket: bucket.clone(),
                        token,
                        generation,
                        expires_at: event_time(expires, "lease_expires_at")?,
                    })
                }
            };
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(claim)
        })
        .await
    }

    /// Runs `sql`, a write that matches the bucket only while `claim` holds, in its own
    /// transaction; when it matches nothing, [`Self::refusal`] says why (`allowed` are the
    /// states the step may start from).
    pub(super) async fn conditional_write(
        &self,
        claim: &Claim,
        op: &'static str,
        allowed: &[&str],
        min_age: Option<Duration>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<()> {
        self.run(op, || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let n = tx.execute(sql, params).await?;
            if n == 0 {
                return Err(Self::refusal(&tx, claim, op, allowed, min_age).await);
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(())
        })
        .await
    }
}

/// A fresh, opaque, unguessable owner token.
pub(super) fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}
