//! Clustering keys and scan bounds: the part of a query that every tier can apply itself.
//!
//! `ScanBounds` is what the SQL layer pushes down and what the hot store, the archive reader
//! and the embedded store each translate into their own predicates. `matches` is the
//! reference semantics every tier must agree with.

use std::ops::Bound;

use super::{BucketKey, EventTime, Record, SortKey};

/// A record's position inside a bucket: `(event_time, sort_key)`, ordered lexicographically.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusteringKey {
    /// Leading component.
    pub event_time: EventTime,
    /// Tie-breaker among records with the same event time.
    pub sort_key: SortKey,
}

/// Predicates a scan applies exactly. All parts are conjunctive; `Unbounded` everywhere means
/// "every record".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanBounds {
    /// Lower bound on `event_time`.
    pub time_lower: Bound<EventTime>,
    /// Upper bound on `event_time`.
    pub time_upper: Bound<EventTime>,
    /// Lower bound on `sort_key` (a row filter: sort keys are not globally ordered).
    pub sort_lower: Bound<SortKey>,
    /// Upper bound on `sort_key`.
    pub sort_upper: Bound<SortKey>,
    /// Keyset cursor: only records with a clustering key strictly after this one.
    pub after: Option<ClusteringKey>,
    /// Keyset cursor: only records with a clustering key strictly before this one.
    pub before: Option<ClusteringKey>,
}

impl Default for ScanBounds {
    fn default() -> Self {
        Self::all()
    }
}

impl ScanBounds {
    /// No restriction.
    pub fn all() -> Self {
        Self {
            time_lower: Bound::Unbounded,
            time_upper: Bound::Unbounded,
            sort_lower: Bound::Unbounded,
            sort_upper: Bound::Unbounded,
            after: None,
            before: None,
        }
    }

    /// Whether a record satisfies every bound: the reference semantics for all tiers.
    pub fn matches(&self, r: &Record) -> bool {
        self.matches_key(r.event_time, &r.sort_key)
    }

    /// [`Self::matches`] on the clustering key alone.
    pub fn matches_key(&self, t: EventTime, k: &SortKey) -> bool {
        let in_lower = |b: &Bound<EventTime>| match b {
            Bound::Included(x) => t >= *x,
            Bound::Excluded(x) => t > *x,
            Bound::Unbounded => true,
        };
        let in_upper = |b: &Bound<EventTime>| match b {
            Bound::Included(x) => t <= *x,
            Bound::Excluded(x) => t < *x,
            Bound::Unbounded => true,
        };
        let sort_ok = match &self.sort_lower {
            Bound::Included(x) => k >= x,
            Bound::Excluded(x) => k > x,
            Bound::Unbounded => true,
        } && match &self.sort_upper {
            Bound::Included(x) => k <= x,
            Bound::Excluded(x) => k < x,
            Bound::Unbounded => true,
        };
        let after_ok = self
            .after
            .as_ref()
            .is_none_or(|c| (t, k) > (c.event_time, &c.sort_key));
        let before_ok = self
            .before
            .as_ref()
            .is_none_or(|c| (t, k) < (c.event_time, &c.sort_key));
        in_lower(&self.time_lower) && in_upper(&self.time_upper) && sort_ok && after_ok && before_ok
    }

    /// The smallest time interval `[lo, hi]` (inclusive, in microseconds) that can hold a
    /// matching record, or `None` when the bounds are contradictory on time alone.
    pub fn time_interval(&self) -> Option<(EventTime, EventTime)> {
        let mut lo = EventTime::min_supported().as_micros();
        let mut hi = EventTime::end_of_supported().as_micros() - 1;
        match self.time_lower {
            Bound::Included(t) => lo = lo.max(t.as_micros()),
            Bound::Excluded(t) => lo = lo.max(t.as_micros() + 1),
            Bound::Unbounded => {}
        }
        match self.time_upper {
            Bound::Included(t) => hi = hi.min(t.as_micros()),
            Bound::Excluded(t) => hi = hi.min(t.as_micros() - 1),
            Bound::Unbounded => {}
        }
        if let Some(c) = &self.after {
            lo = lo.max(c.event_time.as_micros());
        }
        if let Some(c) = &self.before {
            hi = hi.min(c.event_time.as_micros());
        }
        if lo > hi {
            return None;
        }
        Some((
            EventTime::from_micros(lo).ok()?,
            EventTime::from_micros(hi).ok()?,
        ))
    }

    /// Whether a bucket can hold a matching record (pruning before any I/O).
    pub fn may_overlap(&self, bucket: &BucketKey) -> bool {
        match self.time_interval() {
            None => false,
            Some((lo, hi)) => {
                let (s, e) = bucket.bounds();
                lo < e && hi >= s
            }
        }
    }

    /// These bounds with the `after` cursor advanced to `key` (used to page forwards).
    #[must_use]
    pub fn with_after(&self, key: ClusteringKey) -> Self {
        Self {
            after: Some(key),
            ..self.clone()
        }
    }

    /// These bounds with the `before` cursor moved back to `key` (used to page backwards).
    #[must_use]
    pub fn with_before(&self, key: ClusteringKey) -> Self {
        Self {
            before: Some(key),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BucketStrategy, PartitionKey};

    fn rec(us: i64, k: u8) -> Record {
        Record {
            partition_key: PartitionKey::new(vec![1]).unwrap(),
            event_time: EventTime::from_micros(us).unwrap(),
            sort_key: SortKey::new(vec![k]).unwrap(),
            value: vec![],
        }
    }

    #[test]
    fn cursor_is_lexicographic() {
        let c = ClusteringKey {
            event_time: EventTime::from_micros(100).unwrap(),
            sort_key: SortKey::new(vec![5]).unwrap(),
        };
        let b = ScanBounds::all().with_after(c.clone());
        assert!(!b.matches(&rec(100, 5)));
        assert!(b.matches(&rec(100, 6)));
        assert!(!b.matches(&rec(99, 200)));
        assert!(b.matches(&rec(101, 0)));
        let b = ScanBounds::all().with_before(c);
        assert!(b.matches(&rec(100, 4)));
        assert!(!b.matches(&rec(100, 5)));
    }

    #[test]
    fn pruning_uses_the_time_interval() {
        let day = BucketStrategy::CalendarDayUtc;
        let t = EventTime::parse_rfc3339("2024-03-10T12:00:00Z").unwrap();
        let b = ScanBounds {
            time_lower: Bound::Included(t),
            time_upper: Bound::Excluded(EventTime::parse_rfc3339("2024-03-11T00:00:00Z").unwrap()),
            ..ScanBounds::all()
        };
        assert!(b.may_overlap(&day.bucket_of(t)));
        let next = day.bucket_of(t).next().unwrap();
        assert!(!b.may_overlap(&next));
        assert!(!b.may_overlap(&day.bucket_of(t).prev().unwrap()));
        let empty = ScanBounds {
            time_lower: Bound::Excluded(t),
            time_upper: Bound::Included(t),
            ..ScanBounds::all()
        };
        assert_eq!(empty.time_interval(), None);
        assert!(!empty.may_overlap(&day.bucket_of(t)));
    }
}
