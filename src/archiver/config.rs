//! Archiver settings, their defaults and their validation.
//!
//! Every value is checked before any work starts; a bad one is a typed error naming the
//! setting. The binary maps flags and environment variables onto [`ArchiverConfig`]; the
//! library accepts the struct directly.

use std::time::Duration;

use chrono::{Datelike, TimeZone, Utc};

use crate::archive::PayloadFormat;
use crate::model::EventTime;

use super::ArchiverError;

/// Environment variables of the v2/year-specific archiver that v4 refuses to honour.
pub const OBSOLETE_SETTINGS: &[&str] = &[
    "ARCHIVER_KEEP_HOT_BUCKETS",
    "ARCHIVER_ELIGIBLE_THROUGH_YEAR",
];

/// How one archiver process behaves.
#[derive(Debug, Clone)]
pub struct ArchiverConfig {
    /// A bucket is eligible when `bucket_end <= eligible_before`. `None` (the default): January
    /// 1 of the previous UTC year, recomputed every cycle so a long-running daemon's cutoff
    /// moves at each new year.
    pub eligible_before: Option<EventTime>,
    /// Pause between discovery cycles.
    pub interval: Duration,
    /// Owner-lease duration of claims; renewed every third of it.
    pub lease: Duration,
    /// Delay before a deferred bucket may be claimed again.
    pub retry: Duration,
    /// Maximum work items discovered per cycle.
    pub scan_limit: usize,
    /// Payload format of new archives.
    pub format: PayloadFormat,
    /// Orphaned objects younger than this are never deleted; above [`Self::min_gc_delay`].
    pub gc_delay: Duration,
    /// How long after publication the hot rows are kept, so readers that cached the old
    /// route finish; at least the readers' archived-route cache bound.
    pub cleanup_delay: Duration,
    /// Rows per snapshot page (one statement each).
    pub snapshot_page_rows: usize,
    /// Rows deleted per cleanup transaction.
    pub cleanup_batch_rows: usize,
    /// Buckets worked on at once by one process.
    pub concurrency: usize,
    /// Deadline of any single store operation.
    pub op_deadline: Duration,
    /// Deadline of one bucket's whole snapshot, upload and verification.
    pub upload_deadline: Duration,
}

impl ArchiverConfig {
    /// The documented defaults, with the moving cutoff (January 1 of the previous UTC year).
    pub fn with_defaults() -> Self {
        Self {
            eligible_before: None,
            interval: Duration::from_secs(15),
            lease: Duration::from_secs(60),
            retry: Duration::from_secs(15),
            scan_limit: 64,
            format: PayloadFormat::Parquet,
            gc_delay: Duration::from_secs(24 * 3600),
            cleanup_delay: Duration::from_secs(60),
            snapshot_page_rows: 10_000,
            cleanup_batch_rows: 10_000,
            concurrency: 4,
            op_deadline: Duration::from_secs(30),
            upload_deadline: Duration::from_secs(3600),
        }
    }

    /// Checks the relations between settings.
    pub fn validate(&self) -> Result<(), ArchiverError> {
        let bad =
            |setting: &'static str, reason: String| Err(ArchiverError::Config { setting, reason });
        if self.lease < Duration::from_millis(300) {
            return bad("ARCHIVER_LEASE_SECONDS", "must be at least 0.3 s".into());
        }
        if self.interval.is_zero() {
            return bad("ARCHIVER_INTERVAL_SECONDS", "must be positive".into());
        }
        if self.scan_limit == 0 {
            return bad("ARCHIVER_SCAN_LIMIT", "must be at least 1".into());
        }
        if self.snapshot_page_rows == 0 || self.cleanup_batch_rows == 0 {
            return bad("page sizes", "must be at least 1 row".into());
        }
        if self.concurrency == 0 {
            return bad("ARCHIVER_CONCURRENCY", "must be at least 1".into());
        }
        let floor = self.min_gc_delay();
        if self.gc_delay <= floor {
            // An object younger than this may belong to a publication still in progress.
            return bad(
                "ARCHIVER_GC_DELAY_SECONDS",
                format!(
                    "{} s is too short: it must be above {} s, the upload deadline ({} s) plus \
                     the publication retry window ({} s, from the operation deadline) plus {} s \
                     of clock-skew allowance",
                    self.gc_delay.as_secs_f64(),
                    floor.as_secs_f64(),
                    self.upload_deadline.as_secs_f64(),
                    super::runner::publication_window(self.op_deadline).as_secs_f64(),
                    CLOCK_SKEW_ALLOWANCE.as_secs(),
                ),
            );
        }
        Ok(())
    }

    /// The GC delay must exceed this: the longest a claimed generation's first object can
    /// wait for its publication (upload deadline, then every publication attempt and
    /// re-read), plus [`CLOCK_SKEW_ALLOWANCE`] between this host and the object store.
    pub fn min_gc_delay(&self) -> Duration {
        self.upload_deadline
            .saturating_add(super::runner::publication_window(self.op_deadline))
            .saturating_add(CLOCK_SKEW_ALLOWANCE)
    }
}

/// How far the object store's clock (which dates objects) may be from this host's (which
/// ages them) for [`ArchiverConfig::min_gc_delay`].
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5);

/// January 1 of the previous UTC year.
pub fn default_eligible_before() -> EventTime {
    january_first_of_previous_year(Utc::now())
}

/// January 1 of the UTC year before `now`'s: the default cutoff at the instant `now`.
pub fn january_first_of_previous_year(now: chrono::DateTime<Utc>) -> EventTime {
    let y = now.year() - 1;
    let dt = Utc
        .with_ymd_and_hms(y, 1, 1, 0, 0, 0)
        .single()
        .expect("valid date");
    EventTime::from_datetime(dt).expect("inside supported range")
}

/// Refuses obsolete settings, naming their replacement.
pub fn reject_obsolete(env: impl Fn(&str) -> Option<String>) -> Result<(), ArchiverError> {
    for name in OBSOLETE_SETTINGS {
        if env(name).is_some() {
            return Err(ArchiverError::Config {
                setting: name,
                reason: "is obsolete and not supported by the v4 archiver; set ARCHIVER_ELIGIBLE_BEFORE (an RFC 3339 cutoff) instead".into(),
            });
        }
    }
    Ok(())
}

/// Parses a whole, positive number of seconds.
pub fn parse_seconds(setting: &'static str, raw: &str) -> Result<Duration, ArchiverError> {
    let v: f64 = raw.trim().parse().map_err(|_| ArchiverError::Config {
        setting,
        reason: format!("{raw:?} is not a number of seconds"),
    })?;
    if !v.is_finite() || v < 0.0 {
        return Err(ArchiverError::Config {
            setting,
            reason: format!("{raw:?} must be a non-negative number of seconds"),
        });
    }
    Ok(Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn obsolete_settings_are_refused_by_name() {
        let err = reject_obsolete(|k| (k == "ARCHIVER_KEEP_HOT_BUCKETS").then(|| "3".into()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("ARCHIVER_KEEP_HOT_BUCKETS"), "{err}");
        assert!(err.contains("ARCHIVER_ELIGIBLE_BEFORE"), "{err}");
        assert!(reject_obsolete(|_| None).is_ok());
    }

    #[test]
    fn bad_values_are_named() {
        assert!(parse_seconds("ARCHIVER_LEASE_SECONDS", "abc")
            .unwrap_err()
            .to_string()
            .contains("ARCHIVER_LEASE_SECONDS"));
        assert!(parse_seconds("X", "-1").is_err());
        assert_eq!(
            parse_seconds("X", "1.5").unwrap(),
            Duration::from_millis(1500)
        );
        let mut c = ArchiverConfig::with_defaults();
        assert!(c.validate().is_ok());
        c.lease = Duration::from_millis(10);
        assert!(c.validate().is_err());
        let mut c = ArchiverConfig::with_defaults();
        c.gc_delay = Duration::from_secs(60);
        assert!(c.validate().unwrap_err().to_string().contains("GC_DELAY"));
    }

    #[test]
    fn gc_delay_must_exceed_upload_deadline_and_publication_window() {
        let mut c = ArchiverConfig::with_defaults();
        c.upload_deadline = Duration::from_secs(3);
        c.op_deadline = Duration::from_secs(1);
        let floor = c.min_gc_delay();
        assert_eq!(
            floor,
            Duration::from_secs(3)
                + super::super::runner::publication_window(c.op_deadline)
                + CLOCK_SKEW_ALLOWANCE
        );
        for bad in [Duration::ZERO, Duration::from_secs(3), floor] {
            c.gc_delay = bad;
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("ARCHIVER_GC_DELAY_SECONDS"), "{err}");
            assert!(
                err.contains(&format!("above {} s", floor.as_secs_f64())),
                "{err}"
            );
        }
        c.gc_delay = floor + Duration::from_millis(1);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn default_cutoff_is_january_first_of_last_year() {
        let t = default_eligible_before().to_datetime();
        assert_eq!((t.month(), t.day()), (1, 1));
        assert_eq!(t.year(), Utc::now().year() - 1);
    }
}
