//! What the control plane means to a running archiver: the tables' policies, re-read at every
//! discovery cycle so a change takes effect without a restart, and the job history it writes
//! beside its work.
//!
//! Policies are advisory here and authoritative in the store: discovery and claims apply
//! `archive_after` and the pauses in their own statements, so a policy this process read a
//! moment ago can never make it claim what the store holds back. What the archiver takes
//! from its copy is how to do the work: the payload format and the cleanup delay (never
//! below its own, which is the readers' safety bound).
//!
//! History writes are best effort by design: a job's start is written after its claim has
//! committed and its end after its outcome is settled, each in its own statement under the
//! operation deadline. A failed write is logged and counted, and the work goes on as if the
//! history did not exist, so history can neither fail a step nor weaken a fence.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use tracing::warn;

use crate::archive::PayloadFormat;
use crate::model::{EventTime, TableId};
use crate::store::{Claim, Eligibility, JobEnd, JobKind, JobOutcome, JobStart, TablePolicy};

use super::runner::BucketOutcome;
use super::Runner;

/// Most history rows pruned per cycle (one indexed statement).
pub const PRUNE_BATCH: usize = 1_000;

/// This process's copy of the tables' policies.
#[derive(Debug, Default)]
pub(super) struct PolicyCache(RwLock<HashMap<TableId, TablePolicy>>);

impl PolicyCache {
    fn replace(&self, policies: Vec<TablePolicy>) {
        let map = policies
            .into_iter()
            .map(|p| (p.table_id.clone(), p))
            .collect();
        *self.0.write().expect("not poisoned") = map;
    }

    fn get(&self, table: &TableId) -> Option<TablePolicy> {
        self.0.read().expect("not poisoned").get(table).cloned()
    }
}

/// The name a process writes into job history when none is configured: host and pid.
pub fn default_worker_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

impl Runner {
    /// The eligibility rule in force now: the configured cutoff as a ceiling over every
    /// table, or (none configured) the default cutoff for tables without a policy only.
    pub fn eligibility(&self) -> Eligibility {
        Eligibility {
            cutoff: self.cutoff(),
            ceiling: self.config.eligible_before.is_some(),
        }
    }

    /// Re-reads the policies; on failure keeps the previous copy (discovery itself applies
    /// the store's current policies either way).
    pub(super) async fn refresh_policies(&self) {
        match self.op("policies", self.store.policies()).await {
            Ok(p) => self.policies.replace(p),
            Err(e) => warn!(error = %e, "reading table policies failed; keeping the last copy"),
        }
    }

    /// The payload format of a new archive of `table`: its policy's, else the configured one.
    pub(super) fn format_for(&self, table: &TableId) -> PayloadFormat {
        let Some(name) = self.policies.get(table).and_then(|p| p.format) else {
            return self.config.format;
        };
        name.parse().unwrap_or_else(|e| {
            warn!(table = %table, error = %e, "policy names an unknown payload format; using the archiver's");
            self.config.format
        })
    }

    /// The columnar layout of a declared table's Parquet payloads, at its newest schema
    /// version (read for every bucket, so a schema change reaches the next payload).
    /// `None` for the fixed surfaces, and (with a warning) when the schema cannot be read:
    /// the binary envelope holds every table's rows exactly, only not as named columns.
    pub(super) async fn layout_for(&self, table: &TableId) -> Option<crate::archive::ValueColumns> {
        let def = match self.store.table(table).await {
            Ok(Some(d)) => d,
            Ok(None) => return None,
            Err(e) => {
                warn!(table = %table, error = %e, "cannot read the table's definition; writing the binary layout");
                return None;
            }
        };
        if def.surface != crate::control::schema::DECLARED {
            return None;
        }
        let schema = match self.store.table_schema(table).await {
            Ok(Some(s)) => crate::model::schema::TableSchema::from_json(&s.definition)
                .map_err(|e| e.to_string()),
            Ok(None) => Err("no stored schema".to_string()),
            Err(e) => Err(e.to_string()),
        };
        match schema {
            Ok(s) => Some(crate::archive::ValueColumns::new(s)),
            Err(e) => {
                warn!(table = %table, error = %e, "cannot read the table's schema; writing the binary layout");
                None
            }
        }
    }

    /// The cleanup delay of `table`: the larger of its policy's and the configured one.
    pub(super) fn cleanup_delay_for(&self, table: &TableId) -> Duration {
        let policy = self.policies.get(table).and_then(|p| p.cleanup_delay);
        policy.map_or(self.config.cleanup_delay, |d| {
            d.max(self.config.cleanup_delay)
        })
    }

    /// Records the start of the job `claim` began (best effort).
    pub(super) async fn job_started(&self, claim: &Claim, kind: JobKind) -> JobStart {
        let job = JobStart {
            bucket: claim.bucket.clone(),
            generation: claim.generation,
            kind,
            worker: self.worker.clone(),
        };
        let write = self.store.record_job_start(&job);
        if let Err(e) = self.op("record_job_start", write).await {
            self.metrics.history_write_failures.inc();
            warn!(error = %e, "recording the job's start failed; the work goes on");
        }
        job
    }

    /// Records how a job ended (best effort).
    pub(super) async fn job_ended(
        &self,
        job: JobStart,
        outcome: JobOutcome,
        rows: Option<u64>,
        bytes: Option<u64>,
        error: Option<String>,
    ) {
        let end = JobEnd {
            job,
            outcome,
            rows,
            bytes,
            error,
        };
        let write = self.store.record_job_end(&end);
        if let Err(e) = self.op("record_job_end", write).await {
            self.metrics.history_write_failures.inc();
            warn!(error = %e, "recording the job's end failed");
        }
    }

    /// Records the end of an archive job from its result.
    pub(super) async fn archive_job_ended(
        &self,
        job: JobStart,
        result: &Result<BucketOutcome, super::ArchiverError>,
    ) {
        let (outcome, rows, bytes, error) = match result {
            Ok(BucketOutcome::Archived { rows, bytes }) => {
                (JobOutcome::Published, Some(*rows), Some(*bytes), None)
            }
            Ok(BucketOutcome::Deferred { reason }) => {
                (JobOutcome::Deferred, None, None, Some(reason.clone()))
            }
            Ok(BucketOutcome::LeaseLost) => (JobOutcome::LeaseLost, None, None, None),
            Ok(BucketOutcome::Interrupted) => (JobOutcome::Interrupted, None, None, None),
            Ok(BucketOutcome::Cleaned { rows_deleted }) => {
                (JobOutcome::Cleaned, Some(*rows_deleted), None, None)
            }
            Ok(BucketOutcome::Skipped) => (JobOutcome::Failed, None, None, Some("skipped".into())),
            Err(e) => (JobOutcome::Failed, None, None, Some(e.to_string())),
        };
        self.job_ended(job, outcome, rows, bytes, error).await;
    }

    /// Prunes history older than the retention (best effort, one batch).
    pub(super) async fn prune_history(&self) {
        let cutoff = (self.clock)()
            - chrono::Duration::from_std(self.config.job_retention)
                .unwrap_or(chrono::Duration::MAX);
        // Whole microseconds: the clock has nanoseconds, which `from_datetime` refuses (it
        // did, so no history was ever pruned).
        let Ok(before) = EventTime::from_micros(cutoff.timestamp_micros()) else {
            return;
        };
        match self
            .op("prune_jobs", self.store.prune_jobs(before, PRUNE_BATCH))
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::debug!(pruned = n, "job history pruned"),
            Err(e) => warn!(error = %e, "pruning job history failed"),
        }
    }
}
