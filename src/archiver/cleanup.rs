//! Cleanup: the work item that deletes a published bucket's hot rows. It waits for the
//! readers' route-cache bound (the cleanup delay) after publication, takes its own claim with
//! a fresh generation, and deletes in small transactions under that claim, so a reader never
//! loses rows it may still be routed to and a stale cleaner is fenced out.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::failpoint;
use crate::model::BucketId;
use crate::store::{Claim, JobKind, JobOutcome, StoreError};

use super::{ArchiverError, Runner};

/// How a cleanup attempt ended.
pub(super) enum Cleanup {
    /// All hot rows deleted (this many by us).
    Done(u64),
    /// Already clean, not due yet, or another worker holds the cleanup.
    NotOurs,
    /// Shutdown stopped it between transactions.
    Interrupted,
    /// Our cleanup claim went stale mid-way.
    LeaseLost,
}

impl Runner {
    /// Claims a published bucket's cleanup once its delay has passed (never waiting for it:
    /// a bucket not yet due is left for a later cycle), then deletes the hot rows in small
    /// transactions under that claim, stopping between transactions on shutdown.
    pub(super) async fn finish_cleanup(
        &self,
        bucket: &BucketId,
        shutdown: &CancellationToken,
    ) -> Result<Cleanup, ArchiverError> {
        let meta = self.op("bucket", self.store.bucket(bucket)).await?;
        let Some(published_at) = meta.and_then(|m| m.published_at) else {
            return Ok(Cleanup::NotOurs);
        };
        let now = self.op("now", self.store.now()).await?;
        let delay = self.cleanup_delay_for(&bucket.table_id);
        let due = published_at
            .as_micros()
            .saturating_add(i64::try_from(delay.as_micros()).unwrap_or(i64::MAX));
        if due > now.as_micros() {
            debug!("cleanup not due yet (readers' route-cache bound)");
            return Ok(Cleanup::NotOurs);
        }
        let sent = Instant::now();
        let Some(claim) = self
            .op(
                "claim_cleanup",
                self.store.claim_cleanup(bucket, self.config.lease),
            )
            .await?
        else {
            debug!("cleanup owned elsewhere or already done");
            return Ok(Cleanup::NotOurs);
        };
        debug!(generation = claim.generation, "claimed cleanup");
        let job = self.job_started(&claim, JobKind::Cleanup).await;
        let result = self.clean_claimed(&claim, sent, delay, shutdown).await;
        let (outcome, rows, error) = match &result {
            Ok(Cleanup::Done(n)) => (JobOutcome::Cleaned, Some(*n), None),
            Ok(Cleanup::Interrupted) => (JobOutcome::Interrupted, None, None),
            Ok(Cleanup::LeaseLost) => (JobOutcome::LeaseLost, None, None),
            Ok(Cleanup::NotOurs) => (JobOutcome::Failed, None, Some("not ours".to_string())),
            Err(e) => (JobOutcome::Failed, None, Some(e.to_string())),
        };
        self.job_ended(job, outcome, rows, None, error).await;
        result
    }

    /// Deletes a published bucket's hot rows under `claim`, in small transactions.
    async fn clean_claimed(
        &self,
        claim: &Claim,
        sent: Instant,
        delay: Duration,
        shutdown: &CancellationToken,
    ) -> Result<Cleanup, ArchiverError> {
        let keeper = self.keep_lease(claim.clone(), sent);
        let started = Instant::now();
        let mut deleted = 0u64;
        let mut steps = 0u32;
        loop {
            if !keeper.holds() {
                return Ok(Cleanup::LeaseLost);
            }
            if shutdown.is_cancelled() {
                return Ok(Cleanup::Interrupted);
            }
            let step = self
                .store
                .cleanup_step(claim, self.config.cleanup_batch_rows, delay);
            match tokio::time::timeout(self.config.op_deadline, step).await {
                Ok(Ok((n, finished))) => {
                    deleted += n;
                    self.metrics.rows_deleted.inc_by(n);
                    steps += 1;
                    if steps == 1 {
                        failpoint::hit("mid_cleanup");
                    }
                    if finished {
                        self.metrics.buckets_cleaned.inc();
                        info!(
                            rows_deleted = deleted,
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            "hot rows deleted"
                        );
                        return Ok(Cleanup::Done(deleted));
                    }
                }
                Ok(Err(StoreError::StaleClaim { .. })) => return Ok(Cleanup::LeaseLost),
                Ok(Err(e)) if e.is_retryable() => {
                    warn!(error = %e, "cleanup step failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => warn!("cleanup step deadline passed; retrying"),
            }
        }
    }
}
