//! Retry policy for hot-store transactions: which database errors may be retried, which
//! leave the commit's outcome unknown, and how long to wait between attempts.
//!
//! CockroachDB and PostgreSQL under `SERIALIZABLE` abort transactions on conflicts (40001)
//! and deadlocks (40P01); the whole transaction is then safe to run again. An error while
//! committing is different: 40003 (`statement_completion_unknown`) or a connection lost
//! during `COMMIT` means the transaction may or may not have committed, so it must never be
//! retried blindly; the caller re-reads durable state instead.

use std::time::Duration;

use rand::Rng;

/// SQLSTATE of a serialization failure.
pub(crate) const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE of a detected deadlock.
pub(crate) const DEADLOCK_DETECTED: &str = "40P01";
/// SQLSTATE of a statement whose completion is unknown (CockroachDB).
pub(crate) const STATEMENT_COMPLETION_UNKNOWN: &str = "40003";

/// Bounded, jittered exponential backoff for whole-transaction retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first one included (at least 1).
    pub max_attempts: u32,
    /// Delay before the second attempt, before jitter.
    pub base_delay: Duration,
    /// Upper bound of any single delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 12,
            base_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(250),
        }
    }
}

/// What to do with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// Run the whole transaction again (after a backoff).
    Retry,
    /// The transaction may have committed: report outcome-unknown.
    OutcomeUnknown,
    /// A permanent failure for this operation.
    Fail,
}

impl RetryPolicy {
    /// A policy with `max_attempts` attempts and the default delays.
    #[must_use]
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// The delay before attempt `attempt + 1` (`attempt` counts from 1): exponential in the
    /// attempt number, capped, with "full jitter" (uniform in `[d/2, d]`) so that colliding
    /// transactions spread out instead of colliding again in lockstep.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let base = self.base_delay.as_micros() as u64;
        let cap = self.max_delay.as_micros() as u64;
        let d = base.saturating_mul(1u64 << exp).min(cap).max(1);
        let jittered = rand::rng().random_range(d / 2..=d);
        Duration::from_micros(jittered)
    }

    /// Whether another attempt is allowed after `attempt` attempts.
    pub fn may_retry(&self, attempt: u32) -> bool {
        attempt < self.max_attempts.max(1)
    }

    /// Classifies a failure from its SQLSTATE (if the server sent one), whether the
    /// connection was lost, and whether it happened while committing (or while running a
    /// statement that commits by itself).
    pub(crate) fn classify(
        code: Option<&str>,
        connection_lost: bool,
        during_commit: bool,
    ) -> Disposition {
        match code {
            Some(STATEMENT_COMPLETION_UNKNOWN) => Disposition::OutcomeUnknown,
            // A conflict reported by COMMIT itself is a definite abort: safe to retry.
            Some(SERIALIZATION_FAILURE) | Some(DEADLOCK_DETECTED) => Disposition::Retry,
            Some(_) => Disposition::Fail,
            None if connection_lost && during_commit => Disposition::OutcomeUnknown,
            // Lost before COMMIT was sent: nothing committed, so a fresh connection may retry.
            None if connection_lost => Disposition::Retry,
            None if during_commit => Disposition::OutcomeUnknown,
            None => Disposition::Fail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_conflicts_and_unknown_outcomes() {
        use Disposition::*;
        assert_eq!(RetryPolicy::classify(Some("40001"), false, false), Retry);
        assert_eq!(RetryPolicy::classify(Some("40001"), false, true), Retry);
        assert_eq!(RetryPolicy::classify(Some("40P01"), false, false), Retry);
        assert_eq!(
            RetryPolicy::classify(Some("40003"), false, true),
            OutcomeUnknown
        );
        assert_eq!(
            RetryPolicy::classify(Some("40003"), false, false),
            OutcomeUnknown
        );
        assert_eq!(RetryPolicy::classify(None, true, true), OutcomeUnknown);
        assert_eq!(RetryPolicy::classify(None, true, false), Retry);
        assert_eq!(RetryPolicy::classify(Some("23505"), false, false), Fail);
        assert_eq!(RetryPolicy::classify(Some("42P01"), false, true), Fail);
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let p = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
        };
        for _ in 0..100 {
            let d1 = p.backoff(1);
            assert!(d1 >= Duration::from_millis(5) && d1 <= Duration::from_millis(10));
            let d3 = p.backoff(3);
            assert!(d3 >= Duration::from_millis(20) && d3 <= Duration::from_millis(40));
            assert!(p.backoff(30) <= Duration::from_millis(40));
        }
        assert!(p.may_retry(4));
        assert!(!p.may_retry(5));
        assert!(!RetryPolicy::default().with_max_attempts(0).may_retry(1));
    }
}
