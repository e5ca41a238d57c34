//! TopK's dynamic filter as a time window the scan skips whole buckets by.
//!
//! `ORDER BY timestamp DESC LIMIT n` across channels cannot be answered by one channel's
//! order, so DataFusion keeps a TopK above the scan. That TopK publishes, as it runs, a
//! filter every row it could still keep must pass (`timestamp > t` once it holds `n` rows,
//! with its ties on the next sort key), and offers it to the scan through filter pushdown.
//! The scan reads each channel newest first (the sort pushdown answers "inexact": the
//! order helps, the TopK stays) and, before it opens a bucket or a run of buckets, asks
//! the filter's current state whether any time in the unit's interval can pass; a unit
//! that cannot is not read at all. So after the first buckets of each channel the rest of
//! its history is skipped, instead of every row of the window flowing into the TopK.
//!
//! The filter is only ever used to skip units: the TopK above still applies its own order
//! and limit to every row it receives, and the scan tells the pushdown it did not take the
//! filter. A shape this module does not recognise reads as "any time", so a unit is
//! skipped only when the filter provably rejects every time in it.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, IsNullExpr, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::snapshot_physical_expr;

use crate::table::ScanUnit;

/// An inclusive interval of times in microseconds; empty when `lo > hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    lo: i64,
    hi: i64,
}

impl Span {
    const ALL: Self = Self {
        lo: i64::MIN,
        hi: i64::MAX,
    };
    const EMPTY: Self = Self {
        lo: i64::MAX,
        hi: i64::MIN,
    };

    fn is_empty(self) -> bool {
        self.lo > self.hi
    }

    fn meet(self, other: Self) -> Self {
        Self {
            lo: self.lo.max(other.lo),
            hi: self.hi.min(other.hi),
        }
    }

    fn join(self, other: Self) -> Self {
        if self.is_empty() {
            return other;
        }
        if other.is_empty() {
            return self;
        }
        Self {
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
        }
    }
}

/// The times `unit` can hold rows at (a key found at execution: any).
pub(super) fn unit_span(unit: &ScanUnit) -> Span {
    let of = |b: &crate::model::BucketId| {
        let (s, e) = b.bucket_key.bounds();
        Span {
            lo: s.as_micros(),
            hi: e.as_micros() - 1,
        }
    };
    match unit {
        ScanUnit::Key(_) => Span::ALL,
        ScanUnit::Bucket(b, _) => of(b),
        ScanUnit::Run(buckets, ..) => buckets.iter().map(of).fold(Span::EMPTY, Span::join),
    }
}

/// Whether a row of some time in `span` could pass every filter of `filters` as they stand
/// now; `time` is the index of the time column in the scan's output (the filters' column
/// indices are the scan's), `None` when the scan does not output it.
pub(super) fn may_pass(filters: &[Arc<dyn PhysicalExpr>], time: Option<usize>, span: Span) -> bool {
    let Some(time) = time else {
        return true;
    };
    filters
        .iter()
        .all(|f| match snapshot_physical_expr(Arc::clone(f)) {
            Ok(now) => !times_passing(&now, time).meet(span).is_empty(),
            Err(_) => true,
        })
}

/// A superset of the times at which a row can satisfy `e` (a row's other columns unknown).
fn times_passing(e: &Arc<dyn PhysicalExpr>, time: usize) -> Span {
    if let Some(l) = e.downcast_ref::<Literal>() {
        return match l.value() {
            ScalarValue::Boolean(Some(false)) | ScalarValue::Boolean(None) => Span::EMPTY,
            _ => Span::ALL,
        };
    }
    if let Some(n) = e.downcast_ref::<IsNullExpr>() {
        // The time column is never null: no row passes `timestamp IS NULL`.
        return if is_time(n.arg(), time) {
            Span::EMPTY
        } else {
            Span::ALL
        };
    }
    let Some(b) = e.downcast_ref::<BinaryExpr>() else {
        return Span::ALL;
    };
    match b.op() {
        Operator::And => times_passing(b.left(), time).meet(times_passing(b.right(), time)),
        Operator::Or => times_passing(b.left(), time).join(times_passing(b.right(), time)),
        op => match (is_time(b.left(), time), micros(b.right())) {
            (true, Some(t)) => compared(*op, t),
            _ => Span::ALL,
        },
    }
}

/// Times `x` with `x op t`, widened to whole microseconds (`t` rounded outwards).
fn compared(op: Operator, t: i64) -> Span {
    match op {
        Operator::Gt | Operator::GtEq => Span {
            lo: t,
            hi: i64::MAX,
        },
        Operator::Lt | Operator::LtEq => Span {
            lo: i64::MIN,
            hi: t,
        },
        Operator::Eq => Span { lo: t, hi: t },
        _ => Span::ALL,
    }
}

fn is_time(e: &Arc<dyn PhysicalExpr>, time: usize) -> bool {
    e.downcast_ref::<Column>()
        .is_some_and(|c| c.index() == time)
}

/// A timestamp literal in microseconds; a finer one is truncated towards the past, which
/// [`compared`] treats as inclusive on both sides (so nothing that passes is excluded).
fn micros(e: &Arc<dyn PhysicalExpr>) -> Option<i64> {
    let l = e.downcast_ref::<Literal>()?;
    match l.value() {
        ScalarValue::TimestampMicrosecond(Some(v), _) => Some(*v),
        ScalarValue::TimestampNanosecond(Some(v), _) => Some(v.div_euclid(1_000)),
        ScalarValue::TimestampMillisecond(Some(v), _) => v.checked_mul(1_000),
        ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1_000_000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::physical_expr::expressions::{col, is_null, lit};

    fn ts(v: i64) -> Arc<dyn PhysicalExpr> {
        lit(ScalarValue::TimestampMicrosecond(
            Some(v),
            Some("UTC".into()),
        ))
    }

    fn bin(
        l: Arc<dyn PhysicalExpr>,
        op: Operator,
        r: Arc<dyn PhysicalExpr>,
    ) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(l, op, r))
    }

    /// The shapes TopK publishes for `ORDER BY timestamp DESC, id DESC` (nulls first, as
    /// DataFusion orders descending) and ascending, and what they let through.
    #[test]
    fn topk_filters_bound_the_times_they_let_through() {
        let schema = Schema::new(vec![
            Field::new("channel_id", DataType::Int64, false),
            Field::new(
                "timestamp",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new("id", DataType::Int64, false),
        ]);
        let t = col("timestamp", &schema).unwrap();
        let id = col("id", &schema).unwrap();
        let newest = bin(
            bin(
                is_null(t.clone()).unwrap(),
                Operator::Or,
                bin(t.clone(), Operator::Gt, ts(100)),
            ),
            Operator::Or,
            bin(
                bin(t.clone(), Operator::Eq, ts(100)),
                Operator::And,
                bin(
                    is_null(id.clone()).unwrap(),
                    Operator::Or,
                    bin(id.clone(), Operator::Gt, lit(7i64)),
                ),
            ),
        );
        assert_eq!(
            times_passing(&newest, 1),
            Span {
                lo: 100,
                hi: i64::MAX
            }
        );
        let f = [newest];
        assert!(!may_pass(&f, Some(1), Span { lo: 0, hi: 99 }));
        assert!(may_pass(&f, Some(1), Span { lo: 0, hi: 100 }));
        assert!(may_pass(&f, None, Span { lo: 0, hi: 99 }));
        let oldest = bin(t.clone(), Operator::Lt, ts(50));
        assert_eq!(
            times_passing(&oldest, 1),
            Span {
                lo: i64::MIN,
                hi: 50
            }
        );
        // Before the TopK holds its rows, its filter is `true`: everything passes.
        assert_eq!(times_passing(&lit(true), 1), Span::ALL);
        assert!(times_passing(&lit(false), 1).is_empty());
        // A filter on another column, or a shape not known here, bounds nothing.
        assert_eq!(
            times_passing(&bin(id.clone(), Operator::Gt, lit(3i64)), 1),
            Span::ALL
        );
        assert_eq!(
            times_passing(&bin(t.clone(), Operator::NotEq, ts(5)), 1),
            Span::ALL
        );
        assert_eq!(times_passing(&bin(ts(5), Operator::Lt, t), 1), Span::ALL);
    }
}
