//! The archiver: moves whole, write-fenced buckets from the hot store to the archive and
//! switches their read route, surviving a crash or pause at any step.
//!
//! It uses the hot store and the archive directly and never the SQL surface. [`Runner`]
//! drives discovery cycles and the per-bucket protocol (publication and cleanup are separate
//! work items); `lease` renews claims; [`gc`] removes objects that no route or claim
//! references; [`compact`] rewrites published windows into segments and moves their routes;
//! [`metrics`] counts what happened; [`config`] holds and validates settings.

mod cleanup;
pub mod compact;
pub mod config;
mod control;
pub mod gc;
mod lease;
pub mod metrics;
mod publish;
pub mod retention;
mod runner;
pub mod segment_counts;
mod sources;
mod window_lease;

pub use compact::{CompactReport, WindowOutcome};
pub use config::ArchiverConfig;
pub use gc::{
    collect_garbage, collect_garbage_incremental, collect_garbage_with, GcDelays, GcReport,
};
pub use metrics::ArchiverMetrics;
pub use retention::RetentionReport;
pub use runner::{
    is_fully_archived, BucketOutcome, Clock, CycleReport, DrainReport, Runner, REMAINING_COUNT_CAP,
};

use crate::archive::ArchiveError;
use crate::model::BucketId;
use crate::store::StoreError;

/// Every way the archiver can fail.
#[derive(Debug, thiserror::Error)]
pub enum ArchiverError {
    /// A setting is invalid; nothing was started.
    #[error("invalid archiver setting {setting}: {reason}")]
    Config {
        /// The flag or environment variable.
        setting: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The hot store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The archive failed (boxed: the OpenDAL error inside is large).
    #[error(transparent)]
    Archive(Box<ArchiveError>),
    /// A store operation exceeded its deadline.
    #[error("{operation} exceeded its deadline")]
    Deadline {
        /// The operation.
        operation: &'static str,
    },
    /// A step's outcome could not be settled by re-reading the store; the next cycle will.
    #[error("{step} of {bucket} is unresolved: {detail}")]
    Unresolved {
        /// The bucket.
        bucket: BucketId,
        /// The step.
        step: &'static str,
        /// The last error seen.
        detail: String,
    },
}

impl From<ArchiveError> for ArchiverError {
    fn from(e: ArchiveError) -> Self {
        Self::Archive(Box::new(e))
    }
}
