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
    /// How long after publication the hot rows are kept: a margin for a reader in the middle
    /// of a hot page when publication commits, and for operators reading the hot table
    /// directly. Not needed for routed reads (a hot page is read with its route in one
    /// statement, and only archived routes are cached), so any value from 0 is accepted.
    pub cleanup_delay: Duration,
    /// The readers' archived-route cache bound (`RouteCacheConfig::ttl`, 60 s in the
    /// binaries): part of [`Self::retirement_delay`].
    pub reader_route_cache: Duration,
    /// The longest statement of any reader (at least every server's statement timeout): a
    /// scan reads with the routes it found for its whole run. Part of
    /// [`Self::retirement_delay`].
    pub reader_statement_timeout: Duration,
    /// How old a hot-store backup may be and still be restored against the live archive
    /// (docs/backup.md): objects a compaction or retention replaced are kept this long.
    /// Part of [`Self::retirement_delay`].
    pub backup_retention: Duration,
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
    /// Job history older than this (by start) is pruned, a batch per cycle.
    pub job_retention: Duration,
    /// Whether this process compacts published buckets into segments (see
    /// `docs/segments.md`).
    pub compaction: bool,
    /// A window is compacted once its end is this far in the past (by the store's clock),
    /// so late buckets of the window have settled.
    pub compact_after: Duration,
    /// A segment is closed at the partition boundary where its rows (uncompressed key and
    /// value bytes) reach this size.
    pub segment_target_bytes: usize,
    /// A compaction pass writes no new segment once it has run this long, so archival,
    /// cleanup, retention and GC get their turn; the segment in progress is finished and
    /// switched, the rest is left for the next pass (which resumes in the window where this
    /// one stopped). Zero: one segment per pass.
    pub compact_budget: Duration,
    /// Most partitions in one segment (default
    /// [`SEGMENT_MAX_PARTITIONS`](super::compact::SEGMENT_MAX_PARTITIONS)); not a setting,
    /// tests lower it to make many segments of few rows.
    pub segment_max_partitions: usize,
    /// Partitions listed per page of a window's work (default
    /// [`COMPACT_PAGE_PARTITIONS`](super::compact::COMPACT_PAGE_PARTITIONS)); not a
    /// setting, tests lower it to page small windows.
    pub compact_page_partitions: usize,
    /// Directory of the file a segment's payload is encoded into before its upload (`None`:
    /// the system's temporary directory); it needs room for one segment's payload.
    pub spill_dir: Option<std::path::PathBuf>,
    /// A segment payload up to this size is one create-once PUT; a larger one is a
    /// multipart upload under a unique key.
    pub segment_put_max_bytes: usize,
    /// Part size of a segment's multipart upload and of the ranged reads verifying it.
    pub segment_part_bytes: usize,
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
            reader_route_cache: crate::table::ROUTE_CACHE_TTL,
            reader_statement_timeout: DEFAULT_READER_STATEMENT_TIMEOUT,
            backup_retention: DEFAULT_BACKUP_RETENTION,
            snapshot_page_rows: 10_000,
            cleanup_batch_rows: 10_000,
            concurrency: 4,
            op_deadline: Duration::from_secs(30),
            upload_deadline: Duration::from_secs(3600),
            job_retention: Duration::from_secs(7 * 24 * 3600),
            compaction: true,
            compact_after: Duration::from_secs(24 * 3600),
            segment_target_bytes: 128 << 20,
            compact_budget: Duration::from_secs(300),
            segment_max_partitions: super::compact::SEGMENT_MAX_PARTITIONS,
            compact_page_partitions: super::compact::COMPACT_PAGE_PARTITIONS,
            spill_dir: None,
            segment_put_max_bytes: crate::archive::segment::SEGMENT_PUT_MAX_BYTES as usize,
            segment_part_bytes: crate::archive::segment::SEGMENT_PART_BYTES,
        }
    }

    /// Checks every value against its documented range, then the relations between
    /// settings.
    pub fn validate(&self) -> Result<(), ArchiverError> {
        for (bound, value) in [
            (&INTERVAL, self.interval),
            (&LEASE, self.lease),
            (&RETRY, self.retry),
            (&GC_DELAY, self.gc_delay),
            (&CLEANUP_DELAY, self.cleanup_delay),
            (&UPLOAD_DEADLINE, self.upload_deadline),
            (&OP_DEADLINE, self.op_deadline),
            (&JOB_RETENTION, self.job_retention),
            (&COMPACT_AFTER, self.compact_after),
            (&COMPACT_BUDGET, self.compact_budget),
            (&READER_ROUTE_CACHE, self.reader_route_cache),
            (&READER_STATEMENT_TIMEOUT, self.reader_statement_timeout),
            (&BACKUP_RETENTION, self.backup_retention),
        ] {
            bound.check(value, &format!("{} s", value.as_secs_f64()))?;
        }
        for (bound, value) in [
            (&SCAN_LIMIT, self.scan_limit),
            (&SNAPSHOT_PAGE_ROWS, self.snapshot_page_rows),
            (&CLEANUP_BATCH_ROWS, self.cleanup_batch_rows),
            (&CONCURRENCY, self.concurrency),
            (&SEGMENT_TARGET_BYTES, self.segment_target_bytes),
            (&SEGMENT_PUT_MAX_BYTES, self.segment_put_max_bytes),
            (&SEGMENT_PART_BYTES, self.segment_part_bytes),
        ] {
            bound.check(value, &value.to_string())?;
        }
        let bad =
            |setting: &'static str, reason: String| Err(ArchiverError::Config { setting, reason });
        if let Some(dir) = &self.spill_dir {
            if !dir.is_dir() {
                return bad(
                    "ARCHIVER_SPILL_DIR (--spill-dir)",
                    format!("{} is not a directory", dir.display()),
                );
            }
            // A directory that refuses writes would fail every compaction: found now.
            if let Err(e) = crate::archive::segment::probe_spill_dir(dir) {
                return bad("ARCHIVER_SPILL_DIR (--spill-dir)", e.to_string());
            }
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
                    super::publish::publication_window(self.op_deadline).as_secs_f64(),
                    CLOCK_SKEW_ALLOWANCE.as_secs(),
                ),
            );
        }
        Ok(())
    }

    /// How segments are spilled and uploaded (see `docs/segments.md`).
    pub fn segment_upload(&self) -> crate::archive::SegmentUpload {
        crate::archive::SegmentUpload {
            spill_dir: self.spill_dir.clone(),
            put_max_bytes: self.segment_put_max_bytes as u64,
            part_bytes: self.segment_part_bytes,
        }
    }

    /// The GC delay must exceed this: the longest a claimed generation's first object can
    /// wait for its publication (upload deadline, then every publication attempt and
    /// re-read), plus [`CLOCK_SKEW_ALLOWANCE`] between this host and the object store.
    pub fn min_gc_delay(&self) -> Duration {
        self.upload_deadline
            .saturating_add(super::publish::publication_window(self.op_deadline))
            .saturating_add(CLOCK_SKEW_ALLOWANCE)
    }
}

impl ArchiverConfig {
    /// How long after its retirement (by the store's clock) an object a compaction switch
    /// or retention replaced must still be kept, so every reader that may still be sent to
    /// it finds it:
    ///
    /// - a reader: a route is served from a cache for at most
    ///   [`Self::reader_route_cache`] after it was read from the hot store, and a statement
    ///   that started with it (or listed it at planning) reads with it for at most
    ///   [`Self::reader_statement_timeout`]; the two add up, since a route cached just
    ///   before the switch may start a statement just before its cache bound ends;
    /// - a restore: a hot-store backup up to [`Self::backup_retention`] old names objects
    ///   replaced since (docs/backup.md);
    ///
    /// the longer of the two, plus [`CLOCK_SKEW_ALLOWANCE`] between the reader's host and
    /// the store.
    pub fn retirement_delay(&self) -> Duration {
        self.reader_route_cache
            .saturating_add(self.reader_statement_timeout)
            .max(self.backup_retention)
            .saturating_add(CLOCK_SKEW_ALLOWANCE)
    }

    /// How long a retired object that holds erased rows is kept: the readers' bound alone
    /// (route cache plus statement timeout, plus skew), not the backup retention. A
    /// hot-store backup restored from before the erasure may then route buckets to an
    /// object that is gone; the archiver's start repairs those routes from the erasure log
    /// (`crate::erasure`), so the restore neither loses rows nor brings erased ones back.
    pub fn erased_retirement_delay(&self) -> Duration {
        self.reader_route_cache
            .saturating_add(self.reader_statement_timeout)
            .saturating_add(CLOCK_SKEW_ALLOWANCE)
    }
}

/// The servers' default statement timeout (`PULPITUM_SERVER_STATEMENT_TIMEOUT_MS`).
pub const DEFAULT_READER_STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);

/// Seven days: docs/backup.md advises a daily hot-store backup kept a week, so any backup
/// an operator keeps restores against the live archive alone.
pub const DEFAULT_BACKUP_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How far the object store's clock (which dates objects) may be from this host's (which
/// ages them) for [`ArchiverConfig::min_gc_delay`].
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5);

/// The accepted range of one duration setting.
#[derive(Debug, Clone, Copy)]
pub struct SecondsRange {
    /// How the error names it: the environment variable and the flag.
    pub setting: &'static str,
    /// Smallest accepted value.
    pub min: Duration,
    /// Largest accepted value: bounds keep every deadline and timestamp sum far from the
    /// stores' limits (PostgreSQL intervals, SQLite's microsecond integers).
    pub max: Duration,
}

impl SecondsRange {
    /// The range as operators read it in an error and in docs/archiver.md.
    pub fn accepted(&self) -> String {
        format!(
            "a number of seconds from {} to {}",
            self.min.as_secs_f64(),
            self.max.as_secs_f64()
        )
    }

    fn check(&self, value: Duration, shown: &str) -> Result<Duration, ArchiverError> {
        if value < self.min || value > self.max {
            return Err(ArchiverError::Config {
                setting: self.setting,
                reason: format!("{shown} is out of range; accepted: {}", self.accepted()),
            });
        }
        Ok(value)
    }

    /// Parses a decimal number of seconds (`15`, `0.5`) and checks the range.
    pub fn parse(&self, raw: &str) -> Result<Duration, ArchiverError> {
        let refuse = |what: &str| ArchiverError::Config {
            setting: self.setting,
            reason: format!("{raw:?} {what}; accepted: {}", self.accepted()),
        };
        let v: f64 = raw.trim().parse().map_err(|_| refuse("is not a number"))?;
        // Out-of-range values (negative, 1e30, infinite) are refused before any conversion.
        if !v.is_finite() || v < self.min.as_secs_f64() || v > self.max.as_secs_f64() {
            return Err(refuse("is out of range"));
        }
        let d = Duration::try_from_secs_f64(v).map_err(|_| refuse("is out of range"))?;
        self.check(d, &format!("{raw:?}"))
    }
}

/// The accepted range of one count setting.
#[derive(Debug, Clone, Copy)]
pub struct CountRange {
    /// How the error names it: the environment variable and the flag.
    pub setting: &'static str,
    /// Smallest accepted value.
    pub min: usize,
    /// Largest accepted value.
    pub max: usize,
}

impl CountRange {
    /// The range as operators read it in an error and in docs/archiver.md.
    pub fn accepted(&self) -> String {
        format!("a whole number from {} to {}", self.min, self.max)
    }

    fn check(&self, value: usize, shown: &str) -> Result<usize, ArchiverError> {
        if value < self.min || value > self.max {
            return Err(ArchiverError::Config {
                setting: self.setting,
                reason: format!("{shown} is out of range; accepted: {}", self.accepted()),
            });
        }
        Ok(value)
    }

    /// Parses a whole number and checks the range.
    pub fn parse(&self, raw: &str) -> Result<usize, ArchiverError> {
        let t = raw.trim();
        let v: usize = t.parse().map_err(|_| ArchiverError::Config {
            setting: self.setting,
            reason: format!(
                "{raw:?} is {}; accepted: {}",
                if t.parse::<i128>().is_ok() {
                    "out of range"
                } else {
                    "not a whole number"
                },
                self.accepted()
            ),
        })?;
        self.check(v, &format!("{raw:?}"))
    }
}

const DAY: u64 = 24 * 3600;

/// `--interval-seconds`: the pause between cycles.
pub const INTERVAL: SecondsRange = SecondsRange {
    setting: "ARCHIVER_INTERVAL_SECONDS (--interval-seconds)",
    min: Duration::from_millis(10),
    max: Duration::from_secs(DAY),
};
/// `--lease-seconds`: renewed every third, so it must leave time for a renewal round trip.
pub const LEASE: SecondsRange = SecondsRange {
    setting: "ARCHIVER_LEASE_SECONDS (--lease-seconds)",
    min: Duration::from_millis(300),
    max: Duration::from_secs(DAY),
};
/// `--retry-seconds`.
pub const RETRY: SecondsRange = SecondsRange {
    setting: "ARCHIVER_RETRY_SECONDS (--retry-seconds)",
    min: Duration::ZERO,
    max: Duration::from_secs(7 * DAY),
};
/// `--gc-delay-seconds`: never 0, which would let GC delete an upload in progress.
pub const GC_DELAY: SecondsRange = SecondsRange {
    setting: "ARCHIVER_GC_DELAY_SECONDS (--gc-delay-seconds)",
    min: Duration::from_secs(1),
    max: Duration::from_secs(30 * DAY),
};
/// `--cleanup-delay-seconds`.
pub const CLEANUP_DELAY: SecondsRange = SecondsRange {
    setting: "ARCHIVER_CLEANUP_DELAY_SECONDS (--cleanup-delay-seconds)",
    min: Duration::ZERO,
    max: Duration::from_secs(7 * DAY),
};
/// `--reader-route-cache-seconds`: the readers' route-cache bound (a day at most, far above
/// the 60 s the binaries use).
pub const READER_ROUTE_CACHE: SecondsRange = SecondsRange {
    setting: "ARCHIVER_READER_ROUTE_CACHE_SECONDS (--reader-route-cache-seconds)",
    min: Duration::ZERO,
    max: Duration::from_secs(DAY),
};
/// `--reader-statement-timeout-seconds`: the servers' statement timeout.
pub const READER_STATEMENT_TIMEOUT: SecondsRange = SecondsRange {
    setting: "ARCHIVER_READER_STATEMENT_TIMEOUT_SECONDS (--reader-statement-timeout-seconds)",
    min: Duration::ZERO,
    max: Duration::from_secs(7 * DAY),
};
/// `--backup-retention-seconds`: 0 (backups are restored with their archive copy) to ten
/// years.
pub const BACKUP_RETENTION: SecondsRange = SecondsRange {
    setting: "ARCHIVER_BACKUP_RETENTION_SECONDS (--backup-retention-seconds)",
    min: Duration::ZERO,
    max: Duration::from_secs(3650 * DAY),
};
/// `--job-retention-seconds`: at least an hour, so a runbook query finds the last attempts.
pub const JOB_RETENTION: SecondsRange = SecondsRange {
    setting: "ARCHIVER_JOB_RETENTION_SECONDS (--job-retention-seconds)",
    min: Duration::from_secs(3600),
    max: Duration::from_secs(3650 * DAY),
};
/// `--compact-after-seconds`.
pub const COMPACT_AFTER: SecondsRange = SecondsRange {
    setting: "ARCHIVER_COMPACT_AFTER_SECONDS (--compact-after-seconds)",
    min: Duration::ZERO,
    max: Duration::from_secs(3650 * DAY),
};
/// `--compact-budget-seconds`: 0 writes one segment per pass; a day at most, so a pass
/// never keeps archival, cleanup and GC waiting longer.
pub const COMPACT_BUDGET: SecondsRange = SecondsRange {
    setting: "ARCHIVER_COMPACT_BUDGET_SECONDS (--compact-budget-seconds)",
    min: Duration::ZERO,
    max: Duration::from_secs(DAY),
};
/// `--segment-target-bytes`: from 1 MiB (tests) to 4 GiB (a segment is encoded into a
/// spill file, never held in memory).
pub const SEGMENT_TARGET_BYTES: CountRange = CountRange {
    setting: "ARCHIVER_SEGMENT_TARGET_BYTES (--segment-target-bytes)",
    min: 1 << 20,
    max: 4 << 30,
};
/// `--segment-put-max-bytes`: from 1 MiB to 5 GiB (S3's largest single PUT).
pub const SEGMENT_PUT_MAX_BYTES: CountRange = CountRange {
    setting: "ARCHIVER_SEGMENT_PUT_MAX_BYTES (--segment-put-max-bytes)",
    min: 1 << 20,
    max: 5 << 30,
};
/// `--segment-part-bytes`: from 5 MiB (S3's smallest part) to 1 GiB; two parts are in
/// memory during an upload.
pub const SEGMENT_PART_BYTES: CountRange = CountRange {
    setting: "ARCHIVER_SEGMENT_PART_BYTES (--segment-part-bytes)",
    min: 5 << 20,
    max: 1 << 30,
};
/// `--upload-deadline-seconds`: 0 would defer every bucket.
pub const UPLOAD_DEADLINE: SecondsRange = SecondsRange {
    setting: "ARCHIVER_UPLOAD_DEADLINE_SECONDS (--upload-deadline-seconds)",
    min: Duration::from_secs(1),
    max: Duration::from_secs(DAY),
};
/// `--op-deadline-seconds`: any single database operation; sets the publication window.
pub const OP_DEADLINE: SecondsRange = SecondsRange {
    setting: "ARCHIVER_OP_DEADLINE_SECONDS (--op-deadline-seconds)",
    min: Duration::from_millis(10),
    max: Duration::from_secs(DAY),
};
/// `--health-max-age-seconds`: checked against the interval by the binary too.
pub const HEALTH_MAX_AGE: SecondsRange = SecondsRange {
    setting: "ARCHIVER_HEALTH_MAX_AGE_SECONDS (--health-max-age-seconds)",
    min: Duration::from_secs(1),
    max: Duration::from_secs(7 * DAY),
};
/// `--scan-limit`.
pub const SCAN_LIMIT: CountRange = CountRange {
    setting: "ARCHIVER_SCAN_LIMIT (--scan-limit)",
    min: 1,
    max: 100_000,
};
/// `--snapshot-page-rows`.
pub const SNAPSHOT_PAGE_ROWS: CountRange = CountRange {
    setting: "ARCHIVER_SNAPSHOT_PAGE_ROWS (--snapshot-page-rows)",
    min: 1,
    max: 1_000_000,
};
/// `--cleanup-batch-rows`.
pub const CLEANUP_BATCH_ROWS: CountRange = CountRange {
    setting: "ARCHIVER_CLEANUP_BATCH_ROWS (--cleanup-batch-rows)",
    min: 1,
    max: 1_000_000,
};
/// `--concurrency`.
pub const CONCURRENCY: CountRange = CountRange {
    setting: "ARCHIVER_CONCURRENCY (--concurrency)",
    min: 1,
    max: 1024,
};

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

/// The first instant at which the default cutoff ([`january_first_of_previous_year`])
/// reaches `end`, so a bucket ending at `end` becomes eligible by it: January 1 of the
/// year after the first January 1 at or after `end`. `None` past the supported range.
pub fn default_cutoff_reaches(end: EventTime) -> Option<EventTime> {
    let at = end.to_datetime();
    let jan1 = |y: i32| Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).single();
    let first_jan1 = if jan1(at.year()) == Some(at) {
        at.year()
    } else {
        at.year() + 1
    };
    EventTime::from_datetime(jan1(first_jan1 + 1)?).ok()
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

/// Parses `ARCHIVER_ELIGIBLE_BEFORE`: an RFC 3339 instant inside the supported years. A
/// malformed value and a well-formed one outside the range get different messages.
pub fn parse_eligible_before(raw: &str) -> Result<EventTime, ArchiverError> {
    use crate::model::{MAX_SUPPORTED_YEAR, MIN_SUPPORTED_YEAR};
    const SETTING: &str = "ARCHIVER_ELIGIBLE_BEFORE (--eligible-before)";
    let accepted = format!(
        "an RFC 3339 instant such as 2025-01-01T00:00:00Z, in the years {MIN_SUPPORTED_YEAR} to {MAX_SUPPORTED_YEAR}"
    );
    let dt =
        chrono::DateTime::parse_from_rfc3339(raw.trim()).map_err(|e| ArchiverError::Config {
            setting: SETTING,
            reason: format!("{raw:?} is not an RFC 3339 instant ({e}); accepted: {accepted}"),
        })?;
    EventTime::from_datetime(dt.with_timezone(&Utc)).map_err(|_| ArchiverError::Config {
        setting: SETTING,
        reason: format!("{raw:?} is out of range; accepted: {accepted}"),
    })
}

/// Parses a non-negative number of seconds, at most 30 days (settings without a range of
/// their own; the archiver's own durations use the [`SecondsRange`] constants).
pub fn parse_seconds(setting: &'static str, raw: &str) -> Result<Duration, ArchiverError> {
    SecondsRange {
        setting,
        min: Duration::ZERO,
        max: Duration::from_secs(30 * DAY),
    }
    .parse(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inverse agrees with the rule itself: at the instant it names the default cutoff
    /// has reached the bucket's end, and one microsecond earlier it had not.
    #[test]
    fn the_default_cutoff_reaches_a_bucket_end_when_the_rule_says() {
        for (end, want) in [
            ("2026-09-05T00:00:00Z", "2028-01-01T00:00:00Z"),
            ("2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"),
            ("2027-01-01T00:00:00.000001Z", "2029-01-01T00:00:00Z"),
            ("2026-12-31T23:59:59Z", "2028-01-01T00:00:00Z"),
            ("1999-02-01T00:00:00Z", "2001-01-01T00:00:00Z"),
        ] {
            let end = EventTime::parse_rfc3339(end).unwrap();
            let from = default_cutoff_reaches(end).unwrap();
            assert_eq!(from.to_string(), want, "{end}");
            let cutoff = |t: EventTime| january_first_of_previous_year(t.to_datetime());
            assert!(cutoff(from) >= end, "{end}");
            let before = EventTime::from_micros(from.as_micros() - 1).unwrap();
            assert!(cutoff(before) < end, "{end}");
        }
        let last = EventTime::parse_rfc3339("2199-06-01T00:00:00Z").unwrap();
        assert_eq!(default_cutoff_reaches(last), None);
    }

    /// A spill directory that exists but cannot take a file is refused at start, naming the
    /// setting, not found by every compaction failing. (`/proc/self` refuses file creation
    /// even to root, which a read-only mode would not.)
    #[cfg(target_os = "linux")]
    #[test]
    fn an_unwritable_spill_directory_is_refused_at_start() {
        let mut c = ArchiverConfig::with_defaults();
        c.spill_dir = Some(std::path::PathBuf::from("/proc/self"));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("ARCHIVER_SPILL_DIR"), "{e}");
        c.spill_dir = Some(std::env::temp_dir());
        c.validate().unwrap();
    }

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
                + super::super::publish::publication_window(c.op_deadline)
                + CLOCK_SKEW_ALLOWANCE
        );
        // Zero is already outside the setting's range, which says so first.
        c.gc_delay = Duration::ZERO;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("ARCHIVER_GC_DELAY_SECONDS"), "{err}");
        for bad in [Duration::from_secs(3), floor] {
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

    /// The retirement delay is derived from the three settings it covers, each alone able
    /// to lengthen it, plus the skew allowance; a bad value of each is refused by name.
    #[test]
    fn the_retirement_delay_follows_the_readers_and_the_backup_retention() {
        let secs = Duration::from_secs;
        let mut c = ArchiverConfig::with_defaults();
        // Defaults: the backup retention (7 days) is the longest.
        assert_eq!(
            c.retirement_delay(),
            secs(7 * 24 * 3600) + CLOCK_SKEW_ALLOWANCE
        );
        c.backup_retention = Duration::ZERO;
        c.reader_route_cache = Duration::ZERO;
        c.reader_statement_timeout = Duration::ZERO;
        assert_eq!(c.retirement_delay(), CLOCK_SKEW_ALLOWANCE);
        // A cached route may start a statement just before its cache bound ends: the two
        // reader bounds add up.
        c.reader_route_cache = secs(60);
        assert_eq!(c.retirement_delay(), secs(65));
        c.reader_statement_timeout = secs(900);
        assert_eq!(c.retirement_delay(), secs(965));
        c.backup_retention = secs(3 * 3600);
        assert_eq!(c.retirement_delay(), secs(3 * 3600 + 5));
        c.backup_retention = secs(100);
        assert_eq!(c.retirement_delay(), secs(965));
        // The cleanup delay (hot rows) is not a reader bound of archived routes.
        c.cleanup_delay = secs(7 * 24 * 3600);
        assert_eq!(c.retirement_delay(), secs(965));
        type Set = fn(&mut ArchiverConfig);
        let cases: [(&str, Set); 3] = [
            ("ARCHIVER_READER_ROUTE_CACHE_SECONDS", |c| {
                c.reader_route_cache = Duration::from_secs(2 * 86_400)
            }),
            ("ARCHIVER_READER_STATEMENT_TIMEOUT_SECONDS", |c| {
                c.reader_statement_timeout = Duration::from_secs(8 * 86_400)
            }),
            ("ARCHIVER_BACKUP_RETENTION_SECONDS", |c| {
                c.backup_retention = Duration::from_secs(3651 * 86_400)
            }),
        ];
        for (setting, set) in cases {
            let mut c = ArchiverConfig::with_defaults();
            set(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(setting), "{err}");
        }
    }

    #[test]
    fn default_cutoff_is_january_first_of_last_year() {
        let t = default_eligible_before().to_datetime();
        assert_eq!((t.month(), t.day()), (1, 1));
        assert_eq!(t.year(), Utc::now().year() - 1);
    }
}
