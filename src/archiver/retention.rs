//! Retention: whole buckets past their table's `retain_for` removed from both tiers.
//!
//! Every cycle, for each table whose policy sets `retain_for`, the buckets that ended at or
//! before `now - retain_for` (the store's clock) are removed one at a time, each in one
//! transaction of the hot store ([`crate::store::Changes::expire_bucket`]): a Hot bucket's
//! metadata and rows go together, under the same serializable check as appends, so no
//! append can commit into it meanwhile; an Archived bucket's route goes, its masks are
//! marked rewritten (kept for readers still on the old route until GC forgets them), and
//! its object, per-bucket or segment, is recorded as retired: garbage collection keeps it
//! while any route names it and for the retirement delay after, so a hot-store backup from
//! before the removal still restores (docs/backup.md). A bucket in a segment disappears
//! from every read at once; the segment's bytes stay while other buckets use it. A bucket
//! being archived is left for the next cycle. Each removal is a `retention` job in the
//! history.

use tracing::{info, warn};

use super::{ArchiverError, Runner};
use crate::store::{JobEnd, JobKind, JobOutcome, JobStart};

/// Buckets removed per table per pass; the next cycle takes the rest.
pub const RETENTION_BATCH: usize = 1_000;

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Buckets removed.
    pub buckets: u64,
    /// Hot rows deleted with them.
    pub rows: u64,
    /// Objects (per-bucket or segments) recorded as retired for garbage collection.
    pub retired: u64,
    /// Buckets whose removal failed (left for the next pass).
    pub failed: u64,
}

impl Runner {
    /// Removes the buckets of every table that are past its retention (see the module).
    pub async fn retention_pass(&self) -> Result<RetentionReport, ArchiverError> {
        let mut report = RetentionReport::default();
        let policies = self.op("policies", self.store.policies()).await?;
        let now = self.op("now", self.store.now()).await?;
        for policy in policies {
            let Some(keep) = policy.retain_for else {
                continue;
            };
            let keep_us = i64::try_from(keep.as_micros()).unwrap_or(i64::MAX);
            let Ok(cutoff) =
                crate::model::EventTime::from_micros(now.as_micros().saturating_sub(keep_us))
            else {
                continue;
            };
            let buckets = self
                .op(
                    "expired_buckets",
                    self.store
                        .expired_buckets(&policy.table_id, cutoff, RETENTION_BATCH),
                )
                .await?;
            for bucket in buckets {
                match self
                    .op("expire_bucket", self.store.expire_bucket(&bucket, cutoff))
                    .await
                {
                    Ok(Some(done)) => {
                        report.buckets += 1;
                        report.rows += done.rows;
                        report.retired += u64::from(done.retired);
                        let job = JobStart {
                            bucket: done.bucket.clone(),
                            generation: done.generation + 1,
                            kind: JobKind::Retention,
                            worker: self.worker.clone(),
                        };
                        let end = JobEnd {
                            job,
                            outcome: JobOutcome::Expired,
                            rows: Some(done.rows),
                            bytes: None,
                            error: None,
                        };
                        if let Err(e) = self
                            .op("record_job_end", self.store.record_job_end(&end))
                            .await
                        {
                            self.metrics.history_write_failures.inc();
                            warn!(error = %e, "recording a retention job failed; the bucket is removed");
                        }
                        info!(
                            bucket = %done.bucket,
                            state = done.state,
                            rows = done.rows,
                            object = done.object_key.as_deref().unwrap_or(""),
                            retired = done.retired,
                            "bucket past retention removed"
                        );
                    }
                    Ok(None) => {}
                    Err(e) => {
                        report.failed += 1;
                        warn!(bucket = %bucket, error = %e, "removing a bucket past retention failed");
                    }
                }
            }
        }
        Ok(report)
    }
}
