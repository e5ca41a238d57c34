//! Event times: UTC instants with microsecond precision inside a documented range of years.
//!
//! The range 1900..=2199 keeps every bucket bound representable both as CockroachDB/PostgreSQL
//! `TIMESTAMPTZ` and as the archive's `Timestamp(ns, UTC)` (an i64 of nanoseconds spans
//! 1677..2262), so no bucket can be written that one tier cannot store.

use chrono::{DateTime, Datelike, SecondsFormat, Utc};
use std::fmt;

use super::ModelError;

/// First supported calendar year (inclusive).
pub const MIN_SUPPORTED_YEAR: i32 = 1900;
/// Last supported calendar year (inclusive).
pub const MAX_SUPPORTED_YEAR: i32 = 2199;

/// `1900-01-01T00:00:00Z` in Unix microseconds (checked against the calendar in the tests):
/// a constant, because every decoded time is range-checked and chrono's calendar arithmetic
/// showed up in a hot page's profile.
const MIN_SUPPORTED_MICROS: i64 = -2_208_988_800_000_000;
/// `2200-01-01T00:00:00Z` in Unix microseconds.
const END_OF_SUPPORTED_MICROS: i64 = 7_258_118_400_000_000;

/// A UTC instant, stored as microseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventTime(i64);

impl EventTime {
    /// The first supported instant, `1900-01-01T00:00:00Z`.
    pub const fn min_supported() -> Self {
        Self(MIN_SUPPORTED_MICROS)
    }

    /// The first instant after the supported range, `2200-01-01T00:00:00Z` (exclusive).
    pub const fn end_of_supported() -> Self {
        Self(END_OF_SUPPORTED_MICROS)
    }

    /// Midnight UTC of a calendar date, which the caller knows to be valid. Computed with
    /// the civil-days formula (H. Hinnant's `days_from_civil`) rather than through chrono:
    /// bucket bounds are derived from their dates on every listing and page.
    pub(crate) fn from_ymd(y: i32, m: u32, d: u32) -> Self {
        debug_assert!(
            (1..=12).contains(&m) && (1..=31).contains(&d),
            "{y}-{m}-{d}"
        );
        let y = i64::from(y) - i64::from(m <= 2);
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = i64::from((m + 9) % 12);
        let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        Self(days * 86_400_000_000)
    }

    /// Builds an event time from microseconds since the epoch, checking the range.
    pub fn from_micros(micros: i64) -> Result<Self, ModelError> {
        let t = Self(micros);
        if t < Self::min_supported() || t >= Self::end_of_supported() {
            return Err(ModelError::TimeOutOfRange(t.to_string()));
        }
        Ok(t)
    }

    /// Builds an event time from nanoseconds since the epoch. Sub-microsecond digits are an
    /// error, never truncated.
    pub fn from_nanos(nanos: i64) -> Result<Self, ModelError> {
        if nanos % 1_000 != 0 {
            let dt = DateTime::from_timestamp_nanos(nanos);
            return Err(ModelError::SubMicrosecondTime(
                dt.to_rfc3339_opts(SecondsFormat::Nanos, true),
            ));
        }
        Self::from_micros(nanos / 1_000)
    }

    /// Converts a chrono instant, rejecting sub-microsecond precision and out-of-range years.
    pub fn from_datetime(dt: DateTime<Utc>) -> Result<Self, ModelError> {
        if !dt.timestamp_subsec_nanos().is_multiple_of(1_000) {
            return Err(ModelError::SubMicrosecondTime(
                dt.to_rfc3339_opts(SecondsFormat::Nanos, true),
            ));
        }
        if dt.year() < MIN_SUPPORTED_YEAR || dt.year() > MAX_SUPPORTED_YEAR {
            return Err(ModelError::TimeOutOfRange(
                dt.to_rfc3339_opts(SecondsFormat::AutoSi, true),
            ));
        }
        Ok(Self(dt.timestamp_micros()))
    }

    /// Parses an RFC 3339 string.
    pub fn parse_rfc3339(s: &str) -> Result<Self, ModelError> {
        let dt = DateTime::parse_from_rfc3339(s)
            .map_err(|_| ModelError::TimeOutOfRange(format!("{s:?} (not RFC 3339)")))?;
        Self::from_datetime(dt.with_timezone(&Utc))
    }

    /// Microseconds since the Unix epoch.
    pub fn as_micros(self) -> i64 {
        self.0
    }

    /// Nanoseconds since the Unix epoch (always representable inside the supported range).
    pub fn as_nanos(self) -> i64 {
        self.0 * 1_000
    }

    /// The chrono instant.
    pub fn to_datetime(self) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(self.0).expect("supported range fits chrono")
    }
}

impl fmt::Display for EventTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match DateTime::from_timestamp_micros(self.0) {
            Some(dt) => f.write_str(&dt.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            None => write!(f, "{}us", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn rejects_sub_microsecond_precision() {
        let dt = Utc.timestamp_opt(1_700_000_000, 1_500).unwrap();
        assert!(matches!(
            EventTime::from_datetime(dt),
            Err(ModelError::SubMicrosecondTime(_))
        ));
        assert!(matches!(
            EventTime::from_nanos(1_700_000_000_000_000_001),
            Err(ModelError::SubMicrosecondTime(_))
        ));
        let ok = Utc.timestamp_opt(1_700_000_000, 2_000).unwrap();
        assert_eq!(
            EventTime::from_datetime(ok).unwrap().as_micros(),
            1_700_000_000_000_002
        );
    }

    #[test]
    fn rejects_out_of_range_years() {
        let dt = Utc.with_ymd_and_hms(1899, 12, 31, 23, 59, 59).unwrap();
        assert!(matches!(
            EventTime::from_datetime(dt),
            Err(ModelError::TimeOutOfRange(_))
        ));
        let dt = Utc.with_ymd_and_hms(2200, 1, 1, 0, 0, 0).unwrap();
        assert!(EventTime::from_datetime(dt).is_err());
        assert!(EventTime::from_micros(EventTime::end_of_supported().as_micros()).is_err());
        assert!(EventTime::from_micros(EventTime::end_of_supported().as_micros() - 1).is_ok());
    }

    #[test]
    fn civil_days_match_chrono_for_every_supported_date() {
        let mut day = chrono::NaiveDate::from_ymd_opt(MIN_SUPPORTED_YEAR, 1, 1).unwrap();
        let end = chrono::NaiveDate::from_ymd_opt(MAX_SUPPORTED_YEAR + 1, 1, 1).unwrap();
        while day <= end {
            let expected = Utc
                .with_ymd_and_hms(day.year(), day.month(), day.day(), 0, 0, 0)
                .unwrap()
                .timestamp_micros();
            assert_eq!(
                EventTime::from_ymd(day.year(), day.month(), day.day()).as_micros(),
                expected,
                "{day}"
            );
            day = day.succ_opt().unwrap();
        }
    }

    #[test]
    fn supported_range_constants_match_the_calendar() {
        assert_eq!(
            EventTime::min_supported(),
            EventTime::from_ymd(MIN_SUPPORTED_YEAR, 1, 1)
        );
        assert_eq!(
            EventTime::end_of_supported(),
            EventTime::from_ymd(MAX_SUPPORTED_YEAR + 1, 1, 1)
        );
    }
}
