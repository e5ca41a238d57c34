//! Filter classification checked against the shapes DataFusion hands a provider: which
//! predicates are exact, how conjunctions, `IN` lists and keyset cursors combine, and how
//! the pushed filters read in EXPLAIN.

use super::*;
use datafusion::logical_expr::{col, lit};
use datafusion::prelude::Expr;

fn ts(s: &str) -> Expr {
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .unwrap()
        .timestamp_micros();
    Expr::Literal(
        ScalarValue::TimestampMicrosecond(Some(t), Some("UTC".into())),
        None,
    )
}

fn exact(e: &Expr) -> bool {
    classify(&Surface::Chat, e) == TableProviderFilterPushDown::Exact
}

#[test]
fn accepted_shapes() {
    assert!(exact(&col("channel_id").eq(lit(5i64))));
    assert!(exact(&lit(5i64).eq(col("channel_id"))));
    assert!(exact(
        &col("channel_id").in_list(vec![lit(1i64), lit(2i64)], false)
    ));
    let ors = col("channel_id").eq(lit(1i64)).or(col("channel_id")
        .eq(lit(2i64))
        .or(col("channel_id").eq(lit(3i64))));
    assert!(exact(&ors));
    assert_eq!(
        PushedFilters::from_exprs(&Surface::Chat, &[ors])
            .partitions
            .unwrap()
            .len(),
        3
    );
    assert!(!exact(
        &col("channel_id").eq(lit(1i64)).or(col("id").eq(lit(2i64)))
    ));
    assert!(exact(&col("timestamp").gt(ts("2024-01-01T00:00:00Z"))));
    assert!(exact(&ts("2024-01-01T00:00:00Z").lt_eq(col("timestamp"))));
    assert!(exact(&col("timestamp").between(
        ts("2024-01-01T00:00:00Z"),
        ts("2024-01-02T00:00:00Z")
    )));
    assert!(exact(&col("id").lt(lit(10i64))));
    let t = ts("2024-01-01T00:00:00Z");
    let fwd = col("timestamp")
        .gt(t.clone())
        .or(col("timestamp").eq(t.clone()).and(col("id").gt(lit(7i64))));
    assert!(exact(&fwd));
    let back = col("timestamp")
        .eq(t.clone())
        .and(col("id").lt(lit(7i64)))
        .or(col("timestamp").lt(t.clone()));
    assert!(exact(&back));
    let p = PushedFilters::from_exprs(&Surface::Chat, &[fwd]);
    assert_eq!(
        p.bounds.after.unwrap().sort_key.as_bytes(),
        &crate::model::encode_i64(7)
    );
}

#[test]
fn refused_shapes() {
    let t = ts("2024-01-01T00:00:00Z");
    for e in [
        col("channel_id").not_eq(lit(5i64)),
        col("channel_id").gt(lit(5i64)),
        col("channel_id").in_list(vec![lit(1i64)], true),
        col("content").eq(lit("x")),
        col("timestamp").not_eq(t.clone()),
        col("id").eq(col("channel_id")),
        col("id").gt(lit(1i64)).or(col("id").lt(lit(0i64))),
        // Mixed directions are not a cursor.
        col("timestamp")
            .gt(t.clone())
            .or(col("timestamp").eq(t.clone()).and(col("id").lt(lit(7i64)))),
        // Different instants are not a cursor.
        col("timestamp").gt(t.clone()).or(col("timestamp")
            .eq(ts("2024-01-02T00:00:00Z"))
            .and(col("id").gt(lit(7i64)))),
        // Sub-microsecond literal: refused, never narrowed.
        col("timestamp").gt(Expr::Literal(
            ScalarValue::TimestampNanosecond(Some(1_500), None),
            None,
        )),
        col("id").is_null(),
    ] {
        assert!(!exact(&e), "{e} must be Unsupported");
    }
}

#[test]
fn combination_and_contradiction() {
    let p = PushedFilters::from_exprs(
        &Surface::Chat,
        &[
            col("channel_id").in_list(vec![lit(1i64), lit(2i64)], false),
            col("channel_id").eq(lit(2i64)),
            col("timestamp").gt_eq(ts("2024-01-01T00:00:00Z")),
            col("timestamp").gt_eq(ts("2024-01-05T00:00:00Z")),
            col("timestamp").lt(ts("2024-01-10T00:00:00Z")),
        ],
    );
    assert_eq!(p.partitions.as_ref().unwrap().len(), 1);
    assert!(!p.empty);
    let (lo, hi) = p.bounds.time_interval().unwrap();
    assert_eq!(
        lo,
        EventTime::parse_rfc3339("2024-01-05T00:00:00Z").unwrap()
    );
    assert_eq!(
        hi.as_micros(),
        EventTime::parse_rfc3339("2024-01-10T00:00:00Z")
            .unwrap()
            .as_micros()
            - 1
    );
    let p = PushedFilters::from_exprs(
        &Surface::Chat,
        &[
            col("channel_id").eq(lit(1i64)),
            col("channel_id").eq(lit(2i64)),
        ],
    );
    assert!(p.empty);
    let p = PushedFilters::from_exprs(
        &Surface::Chat,
        &[col("id").gt(lit(5i64)), col("id").lt(lit(3i64))],
    );
    assert!(p.empty);
    let p = PushedFilters::from_exprs(
        &Surface::Chat,
        &[col("id").gt(lit(5i64)), col("id").lt_eq(lit(5i64))],
    );
    assert!(p.empty);
    let p = PushedFilters::from_exprs(
        &Surface::Chat,
        &[col("id").gt_eq(lit(5i64)), col("id").lt_eq(lit(5i64))],
    );
    assert!(!p.empty);
    // Out of the supported range: a lower bound before 1900 restricts nothing; an upper
    // bound before 1900 matches nothing.
    let p = PushedFilters::from_exprs(
        &Surface::Chat,
        &[col("timestamp").gt(ts("1800-01-01T00:00:00Z"))],
    );
    assert!(!p.empty);
    assert_eq!(p.bounds.time_lower, Bound::Unbounded);
    let p = PushedFilters::from_exprs(
        &Surface::Chat,
        &[col("timestamp").lt(ts("1800-01-01T00:00:00Z"))],
    );
    assert!(p.empty);
}

#[test]
fn filters_rewritten_after_classification_are_applied_or_refused_as_they_came() {
    use crate::model::schema::{ColumnType, KeyColumn, KeyType, TableSchema};
    let schema = TableSchema::new(
        KeyColumn {
            name: "p".into(),
            ty: KeyType::Int64,
        },
        "at".into(),
        KeyColumn {
            name: "s".into(),
            ty: KeyType::Int64,
        },
        vec![("v".into(), ColumnType::Int64, true, None)],
    )
    .unwrap();
    let surface = Surface::declared(schema);
    let null = Expr::Literal(ScalarValue::Boolean(None), None);
    // `v IN (1, NULL)` after DataFusion's simplifier: a value filter SQL applies above.
    let or_null = col("v").eq(lit(1i64)).or(null.clone());
    assert!(PushedFilters::try_from_exprs(&surface, &[or_null]).is_ok());
    // `NOT (v IN (1, NULL))` simplified to NULL: no row matches.
    let pushed = PushedFilters::try_from_exprs(&surface, &[null]).unwrap();
    assert!(pushed.empty);
    let pushed = PushedFilters::try_from_exprs(&surface, &[lit(true)]).unwrap();
    assert!(!pushed.empty);
    // A key filter the scan cannot apply exactly is refused, never dropped.
    let bad = col("p").eq(Expr::Literal(ScalarValue::Int64(None), None));
    assert!(PushedFilters::try_from_exprs(&surface, &[bad]).is_err());
    // Value filters are Inexact; key filters Exact.
    assert_eq!(
        classify(&surface, &col("v").gt(lit(3i64))),
        TableProviderFilterPushDown::Inexact
    );
    assert_eq!(
        classify(&surface, &col("p").eq(lit(3i64))),
        TableProviderFilterPushDown::Exact
    );
}
