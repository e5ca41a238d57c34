//! The values of the control plane: per-table tiering policies, the store-wide pause, the
//! eligibility rule discovery applies, per-table backlog, and the archiver's job history.
//!
//! Policies live in the registry (`pulpitum_v4_policies`), so every archiver sees a change at
//! its next discovery cycle without a restart. The store treats a policy's payload format as
//! an opaque name; the archive layer validates it.

use std::time::Duration;

use crate::model::{BucketId, EventTime, TableId};

/// A table's tiering policy. A field left `None` keeps the archiver's setting for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePolicy {
    /// The table.
    pub table_id: TableId,
    /// A bucket is eligible once `bucket_end <= now - archive_after` (by the store's clock).
    pub archive_after: Option<Duration>,
    /// Payload format of new archives (`parquet` or `json`).
    pub format: Option<String>,
    /// How long after publication a bucket's hot rows may be deleted. The archiver's own
    /// cleanup delay (the readers' route-cache bound) is a floor this cannot lower.
    pub cleanup_delay: Option<Duration>,
    /// No new archive claims while set; cleanup of published buckets continues.
    pub paused: bool,
    /// Whole buckets that ended more than this long before the store's now are removed from
    /// both tiers by the archiver; `None` keeps everything.
    pub retain_for: Option<Duration>,
    /// When the policy last changed (store clock); `None` for a table that never had one.
    pub updated_at: Option<EventTime>,
}

impl TablePolicy {
    /// The empty policy of a table: today's behaviour.
    pub fn none(table_id: TableId) -> Self {
        Self {
            table_id,
            archive_after: None,
            format: None,
            cleanup_delay: None,
            paused: false,
            retain_for: None,
            updated_at: None,
        }
    }
}

/// A change to one table's policy: `None` leaves a field alone; `Some(None)` resets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyUpdate {
    /// New `archive_after`.
    pub archive_after: Option<Option<Duration>>,
    /// New payload format.
    pub format: Option<Option<String>>,
    /// New cleanup delay.
    pub cleanup_delay: Option<Option<Duration>>,
    /// New paused flag.
    pub paused: Option<bool>,
    /// New retention period.
    pub retain_for: Option<Option<Duration>>,
}

impl PolicyUpdate {
    /// Whether the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// Which Hot buckets discovery may hand out, by `bucket_end`.
///
/// A table without `archive_after` uses `cutoff`. A table with one uses
/// `now - archive_after`, and also `cutoff` when `ceiling` is set: an operator's explicit
/// `ARCHIVER_ELIGIBLE_BEFORE` bounds every table, and never makes eligible what a policy
/// holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eligibility {
    /// The cutoff for tables without a policy.
    pub cutoff: EventTime,
    /// Whether `cutoff` also bounds tables with a policy.
    pub ceiling: bool,
}

impl Eligibility {
    /// The rule of an archiver with a fixed cutoff for every table and no policies in play
    /// beyond their own `archive_after` (tests and callers that predate policies).
    pub fn before(cutoff: EventTime) -> Self {
        Self {
            cutoff,
            ceiling: true,
        }
    }

    /// The bound applied to tables with a policy: the cutoff when it is a ceiling, else the
    /// end of the supported range, so `LEAST(bound, now - archive_after)` is the policy's
    /// alone.
    pub fn policy_bound(&self) -> EventTime {
        if self.ceiling {
            self.cutoff
        } else {
            EventTime::end_of_supported()
        }
    }
}

/// One table's share of the archiving backlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLag {
    /// The table.
    pub table_id: TableId,
    /// Hot buckets eligible by time (paused or not, retry time or not).
    pub eligible: u64,
    /// The end of the oldest of them: how far behind archiving is.
    pub oldest_eligible_end: Option<EventTime>,
}

/// What an archiver job did to a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// Claim, snapshot, upload, verify, publish.
    Archive,
    /// Delete a published bucket's hot rows.
    Cleanup,
    /// Retention removed a whole bucket (see [`TablePolicy::retain_for`]).
    Retention,
}

impl JobKind {
    /// Stored name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Archive => "archive",
            Self::Cleanup => "cleanup",
            Self::Retention => "retention",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "archive" => Some(Self::Archive),
            "cleanup" => Some(Self::Cleanup),
            "retention" => Some(Self::Retention),
            _ => None,
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobOutcome {
    /// Started, not finished (or its worker died: see [`JobOutcome::Abandoned`]).
    Running,
    /// The archive was published.
    Published,
    /// The hot rows were deleted.
    Cleaned,
    /// Failed before publication; the bucket is Hot again with a retry time.
    Deferred,
    /// The claim was lost mid-way.
    LeaseLost,
    /// Failed otherwise (the bucket is left for a later claim).
    Failed,
    /// Shutdown handed the bucket back.
    Interrupted,
    /// Its worker stopped without finishing and a later claim took the bucket over.
    Abandoned,
    /// A bucket past its table's retention was removed from both tiers.
    Expired,
}

impl JobOutcome {
    /// Every outcome, in the order the docs list them.
    pub const ALL: [JobOutcome; 9] = [
        Self::Running,
        Self::Published,
        Self::Cleaned,
        Self::Deferred,
        Self::LeaseLost,
        Self::Failed,
        Self::Interrupted,
        Self::Abandoned,
        Self::Expired,
    ];

    /// Stored name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Published => "published",
            Self::Cleaned => "cleaned",
            Self::Deferred => "deferred",
            Self::LeaseLost => "lease_lost",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
            Self::Abandoned => "abandoned",
            Self::Expired => "expired",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// The start of a job: written after its claim succeeds, outside the claim's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStart {
    /// The bucket.
    pub bucket: BucketId,
    /// The claim's fencing generation (unique per bucket, so it names the job).
    pub generation: i64,
    /// Archive or cleanup.
    pub kind: JobKind,
    /// The archiver process that claimed it.
    pub worker: String,
}

/// The end of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnd {
    /// The job (a missing start row is written with it).
    pub job: JobStart,
    /// How it ended (never [`JobOutcome::Running`]).
    pub outcome: JobOutcome,
    /// Rows archived or deleted.
    pub rows: Option<u64>,
    /// Payload bytes uploaded.
    pub bytes: Option<u64>,
    /// Why it did not succeed.
    pub error: Option<String>,
}

/// One row of job history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    /// The bucket.
    pub bucket: BucketId,
    /// The claim's generation.
    pub generation: i64,
    /// Archive or cleanup.
    pub kind: JobKind,
    /// The archiver process.
    pub worker: String,
    /// When its start was recorded (store clock).
    pub started_at: EventTime,
    /// When it ended, if it did.
    pub finished_at: Option<EventTime>,
    /// How it ended.
    pub outcome: JobOutcome,
    /// Rows archived or deleted.
    pub rows: Option<u64>,
    /// Payload bytes.
    pub bytes: Option<u64>,
    /// Why it did not succeed.
    pub error: Option<String>,
}

/// A selection of job history, newest start first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only this table's jobs.
    pub table: Option<TableId>,
    /// Only jobs started at or after this.
    pub since: Option<EventTime>,
    /// Only jobs started at or before this.
    pub until: Option<EventTime>,
    /// At most this many.
    pub limit: Option<usize>,
}

/// Longest error text kept in a history row; longer ones are cut on a character boundary.
pub const JOB_ERROR_MAX: usize = 1_000;

/// `text` cut to [`JOB_ERROR_MAX`] bytes on a character boundary.
pub fn clip_error(text: &str) -> String {
    if text.len() <= JOB_ERROR_MAX {
        return text.to_string();
    }
    let mut end = JOB_ERROR_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
