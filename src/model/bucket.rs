//! Time buckets: the built-in calendar strategies, their canonical keys and UTC bounds.
//!
//! A bucket key is an identifier (`year:2024`, `month:2024-02`, `day:2024-02-29`), not a
//! sortable timestamp: chronological work uses [`BucketKey::bounds`]. Parsing is strict so
//! that one bucket never has two spellings.

use chrono::{Datelike, NaiveDate};
use std::fmt;
use std::str::FromStr;

use super::{EventTime, ModelError, PartitionKey, TableId, MAX_SUPPORTED_YEAR, MIN_SUPPORTED_YEAR};

/// How event times are grouped into buckets. Immutable per table id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum BucketStrategy {
    /// One bucket per UTC calendar year (the default).
    #[default]
    CalendarYearUtc,
    /// One bucket per UTC calendar month.
    CalendarMonthUtc,
    /// One bucket per UTC calendar day.
    CalendarDayUtc,
}

impl BucketStrategy {
    /// The stable name stored in the registry and in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CalendarYearUtc => "calendar_year_utc",
            Self::CalendarMonthUtc => "calendar_month_utc",
            Self::CalendarDayUtc => "calendar_day_utc",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::CalendarYearUtc => "year",
            Self::CalendarMonthUtc => "month",
            Self::CalendarDayUtc => "day",
        }
    }

    /// The strategy of the compaction windows of this strategy's buckets: a month of day
    /// buckets, a year of month buckets, and a year bucket on its own. A window is the span
    /// one archive segment covers, chosen so that a table with few partitions still gets
    /// few, large objects (see `docs/segments.md`).
    pub fn window_strategy(self) -> BucketStrategy {
        match self {
            Self::CalendarDayUtc => Self::CalendarMonthUtc,
            Self::CalendarMonthUtc | Self::CalendarYearUtc => Self::CalendarYearUtc,
        }
    }

    /// The bucket that contains `t`.
    pub fn bucket_of(self, t: EventTime) -> BucketKey {
        let d = t.to_datetime().date_naive();
        let start = match self {
            Self::CalendarYearUtc => NaiveDate::from_ymd_opt(d.year(), 1, 1),
            Self::CalendarMonthUtc => NaiveDate::from_ymd_opt(d.year(), d.month(), 1),
            Self::CalendarDayUtc => Some(d),
        }
        .expect("valid calendar date");
        BucketKey {
            strategy: self,
            start,
        }
    }
}

impl FromStr for BucketStrategy {
    type Err = ModelError;

    /// Accepts exactly the stable names (`calendar_year_utc`, ...) and the spec's CamelCase
    /// spellings (`CalendarYearUtc`, ...); nothing else.
    fn from_str(s: &str) -> Result<Self, ModelError> {
        match s {
            "calendar_year_utc" | "CalendarYearUtc" => Ok(Self::CalendarYearUtc),
            "calendar_month_utc" | "CalendarMonthUtc" => Ok(Self::CalendarMonthUtc),
            "calendar_day_utc" | "CalendarDayUtc" => Ok(Self::CalendarDayUtc),
            other => Err(ModelError::UnknownStrategy(other.to_string())),
        }
    }
}

impl fmt::Display for BucketStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One bucket of a strategy, identified by the first calendar day it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey {
    strategy: BucketStrategy,
    start: NaiveDate,
}

impl BucketKey {
    /// Parses a canonical key of the given strategy; any other spelling is an error.
    pub fn parse(strategy: BucketStrategy, key: &str) -> Result<Self, ModelError> {
        let bad = |reason: &str| ModelError::MalformedBucketKey {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        let rest = key
            .strip_prefix(strategy.prefix())
            .and_then(|r| r.strip_prefix(':'))
            .ok_or_else(|| bad(&format!("expected prefix '{}:'", strategy.prefix())))?;
        let parts: Vec<&str> = rest.split('-').collect();
        let want = match strategy {
            BucketStrategy::CalendarYearUtc => 1,
            BucketStrategy::CalendarMonthUtc => 2,
            BucketStrategy::CalendarDayUtc => 3,
        };
        let widths = [4usize, 2, 2];
        if parts.len() != want {
            return Err(bad("wrong number of date components"));
        }
        for (p, w) in parts.iter().zip(widths) {
            if p.len() != w || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("components must be zero-padded decimal digits"));
            }
        }
        let year: i32 = parts[0].parse().map_err(|_| bad("bad year"))?;
        if !(MIN_SUPPORTED_YEAR..=MAX_SUPPORTED_YEAR).contains(&year) {
            return Err(bad("year outside the supported range"));
        }
        let month: u32 = parts
            .get(1)
            .map_or(Ok(1), |m| m.parse())
            .map_err(|_| bad("bad month"))?;
        let day: u32 = parts
            .get(2)
            .map_or(Ok(1), |d| d.parse())
            .map_err(|_| bad("bad day"))?;
        let start = NaiveDate::from_ymd_opt(year, month, day).ok_or_else(|| bad("no such date"))?;
        Ok(Self { strategy, start })
    }

    /// Parses a key whose strategy is implied by its prefix (`year:`, `month:`, `day:`).
    pub fn parse_any(key: &str) -> Result<Self, ModelError> {
        let strategy = match key.split(':').next() {
            Some("year") => BucketStrategy::CalendarYearUtc,
            Some("month") => BucketStrategy::CalendarMonthUtc,
            Some("day") => BucketStrategy::CalendarDayUtc,
            _ => {
                return Err(ModelError::MalformedBucketKey {
                    key: key.to_string(),
                    reason: "unknown prefix".into(),
                })
            }
        };
        Self::parse(strategy, key)
    }

    /// The compaction window holding this bucket (a bucket of
    /// [`BucketStrategy::window_strategy`]).
    pub fn window(&self) -> BucketKey {
        self.strategy.window_strategy().bucket_of(self.start())
    }

    /// The strategy this key belongs to.
    pub fn strategy(&self) -> BucketStrategy {
        self.strategy
    }

    /// The inclusive start of the bucket.
    pub fn start(&self) -> EventTime {
        EventTime::from_ymd(self.start.year(), self.start.month(), self.start.day())
    }

    /// The exclusive end of the bucket, which is the start of the next one.
    pub fn end(&self) -> EventTime {
        let d = self.next_start();
        EventTime::from_ymd(d.year(), d.month(), d.day())
    }

    /// `[start, end)` in UTC.
    pub fn bounds(&self) -> (EventTime, EventTime) {
        (self.start(), self.end())
    }

    /// Whether `t` lies inside `[start, end)`.
    pub fn contains(&self, t: EventTime) -> bool {
        let (s, e) = self.bounds();
        s <= t && t < e
    }

    fn next_start(&self) -> NaiveDate {
        let d = self.start;
        match self.strategy {
            BucketStrategy::CalendarYearUtc => NaiveDate::from_ymd_opt(d.year() + 1, 1, 1),
            BucketStrategy::CalendarMonthUtc if d.month() == 12 => {
                NaiveDate::from_ymd_opt(d.year() + 1, 1, 1)
            }
            BucketStrategy::CalendarMonthUtc => NaiveDate::from_ymd_opt(d.year(), d.month() + 1, 1),
            BucketStrategy::CalendarDayUtc => d.succ_opt(),
        }
        .expect("valid calendar date")
    }

    /// The following bucket, or `None` past the supported range.
    pub fn next(&self) -> Option<Self> {
        let start = self.next_start();
        (start.year() <= MAX_SUPPORTED_YEAR).then_some(Self {
            strategy: self.strategy,
            start,
        })
    }

    /// The preceding bucket, or `None` before the supported range.
    pub fn prev(&self) -> Option<Self> {
        let prev_day = self.start.pred_opt()?;
        if prev_day.year() < MIN_SUPPORTED_YEAR {
            return None;
        }
        let t = EventTime::from_ymd(prev_day.year(), prev_day.month(), prev_day.day());
        Some(self.strategy.bucket_of(t))
    }
}

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.start;
        match self.strategy {
            BucketStrategy::CalendarYearUtc => write!(f, "year:{:04}", d.year()),
            BucketStrategy::CalendarMonthUtc => write!(f, "month:{:04}-{:02}", d.year(), d.month()),
            BucketStrategy::CalendarDayUtc => {
                write!(f, "day:{:04}-{:02}-{:02}", d.year(), d.month(), d.day())
            }
        }
    }
}

/// The physical identity of a bucket: `(table_id, partition_key, bucket_key)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketId {
    /// The logical table.
    pub table_id: TableId,
    /// The partition the bucket belongs to.
    pub partition_key: PartitionKey,
    /// The time bucket.
    pub bucket_key: BucketKey,
}

impl BucketId {
    /// The bucket holding a record of this table.
    pub fn of_record(table_id: &TableId, strategy: BucketStrategy, record: &super::Record) -> Self {
        Self {
            table_id: table_id.clone(),
            partition_key: record.partition_key.clone(),
            bucket_key: strategy.bucket_of(record.event_time),
        }
    }
}

impl fmt::Display for BucketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.table_id, self.partition_key, self.bucket_key
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [BucketStrategy; 3] = [
        BucketStrategy::CalendarYearUtc,
        BucketStrategy::CalendarMonthUtc,
        BucketStrategy::CalendarDayUtc,
    ];

    fn any_time() -> impl Strategy<Value = EventTime> {
        (EventTime::min_supported().as_micros()..EventTime::end_of_supported().as_micros())
            .prop_map(|m| EventTime::from_micros(m).unwrap())
    }

    proptest! {
        #[test]
        fn every_instant_lies_in_its_bucket(t in any_time(), s in 0usize..3) {
            let b = ALL[s].bucket_of(t);
            prop_assert!(b.contains(t));
            let (start, end) = b.bounds();
            prop_assert!(start <= t && t < end);
            // Exactly one: the neighbours do not contain it.
            if let Some(n) = b.next() { prop_assert!(!n.contains(t)); }
            if let Some(p) = b.prev() { prop_assert!(!p.contains(t)); }
        }

        #[test]
        fn keys_round_trip(t in any_time(), s in 0usize..3) {
            let b = ALL[s].bucket_of(t);
            let text = b.to_string();
            prop_assert_eq!(BucketKey::parse(ALL[s], &text).unwrap(), b);
            prop_assert_eq!(BucketKey::parse_any(&text).unwrap(), b);
            prop_assert_eq!(text.parse::<String>().unwrap(), b.to_string());
        }

        #[test]
        fn consecutive_buckets_tile_time(t in any_time(), s in 0usize..3) {
            let b = ALL[s].bucket_of(t);
            if let Some(n) = b.next() {
                prop_assert_eq!(b.end(), n.start());
                prop_assert_eq!(n.prev().unwrap(), b);
                prop_assert!(ALL[s].bucket_of(n.start()) == n);
                let last = EventTime::from_micros(b.end().as_micros() - 1).unwrap();
                prop_assert_eq!(ALL[s].bucket_of(last), b);
            }
        }
    }

    #[test]
    fn whole_range_tiles_without_gaps() {
        for s in [
            BucketStrategy::CalendarYearUtc,
            BucketStrategy::CalendarMonthUtc,
        ] {
            let mut b = s.bucket_of(EventTime::min_supported());
            assert_eq!(b.start(), EventTime::min_supported());
            let mut n = 1;
            while let Some(next) = b.next() {
                assert_eq!(b.end(), next.start());
                b = next;
                n += 1;
            }
            assert_eq!(b.end(), EventTime::end_of_supported());
            let expected = match s {
                BucketStrategy::CalendarYearUtc => 300,
                _ => 3600,
            };
            assert_eq!(n, expected);
        }
        // Days across leap-year edges, including the 2100 non-leap century.
        let b = BucketKey::parse(BucketStrategy::CalendarDayUtc, "day:2024-02-28").unwrap();
        assert_eq!(b.next().unwrap().to_string(), "day:2024-02-29");
        assert_eq!(
            b.next().unwrap().next().unwrap().to_string(),
            "day:2024-03-01"
        );
        let b = BucketKey::parse(BucketStrategy::CalendarDayUtc, "day:2100-02-28").unwrap();
        assert_eq!(b.next().unwrap().to_string(), "day:2100-03-01");
        assert!(BucketKey::parse(BucketStrategy::CalendarDayUtc, "day:2100-02-29").is_err());
        let m = BucketKey::parse(BucketStrategy::CalendarMonthUtc, "month:2023-12").unwrap();
        assert_eq!(m.next().unwrap().to_string(), "month:2024-01");
    }

    #[test]
    fn parsing_is_strict() {
        use BucketStrategy::*;
        let bad = [
            (CalendarYearUtc, "year:24"),
            (CalendarYearUtc, "year:2024-01"),
            (CalendarYearUtc, "Year:2024"),
            (CalendarYearUtc, "year: 2024"),
            (CalendarYearUtc, "year:+024"),
            (CalendarYearUtc, "month:2024-01"),
            (CalendarYearUtc, "year:1899"),
            (CalendarYearUtc, "year:2200"),
            (CalendarMonthUtc, "month:2024-1"),
            (CalendarMonthUtc, "month:2024-13"),
            (CalendarMonthUtc, "month:2024-00"),
            (CalendarDayUtc, "day:2023-02-29"),
            (CalendarDayUtc, "day:2024-04-31"),
            (CalendarDayUtc, "day:2024-04-01 "),
            (CalendarDayUtc, ""),
        ];
        for (s, k) in bad {
            assert!(
                matches!(
                    BucketKey::parse(s, k),
                    Err(ModelError::MalformedBucketKey { .. })
                ),
                "{k:?} should be rejected for {s}"
            );
        }
        assert!(matches!(
            "calendar_week_utc".parse::<BucketStrategy>(),
            Err(ModelError::UnknownStrategy(_))
        ));
        assert_eq!(
            "CalendarMonthUtc".parse::<BucketStrategy>().unwrap(),
            CalendarMonthUtc
        );
    }
}
