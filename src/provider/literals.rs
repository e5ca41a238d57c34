//! Exact comparisons of a timestamp column with a literal finer than the column.
//!
//! Pulpitum's time columns are `Timestamp(µs)`. DataFusion compares such a column with a
//! nanosecond literal by casting the column to nanoseconds, and then its optimizer
//! "unwraps" that cast by truncating the literal to microseconds (towards zero):
//! `timestamp = TIMESTAMP '…00.123456789Z'` becomes `timestamp = …00.123456`, which is
//! pushed down and returns a row that does not satisfy the predicate (a string literal
//! compared with the column is truncated the same way when it is cast to the column's type).
//!
//! [`ExactTimeLiterals`] is an analyzer rule that runs after type coercion, before the
//! optimizer, and rewrites each such comparison into one with literals of the column's
//! own unit that has the same answer on every row, NULL included. With `f` the literal
//! rounded down (towards minus infinity, which matters before 1970) and `c` rounded up, both
//! in the column's unit (`f == c` when the literal is exact):
//!
//! | predicate | rewritten | for a finer literal |
//! |---|---|---|
//! | `t = x` | `t >= c AND t <= f` | matches nothing |
//! | `t <> x` | `t < c OR t > f` | every non-NULL row |
//! | `t < x` | `t < c` | `t <= f` |
//! | `t <= x` | `t <= f` | |
//! | `t > x` | `t > f` | `t >= c` |
//! | `t >= x` | `t >= c` | |
//! | `t BETWEEN x AND y` | `t BETWEEN c(x) AND f(y)` | |
//! | `t IN (x, …)` | the exact members; a finer one can match nothing | |
//! | `t IS [NOT] DISTINCT FROM x` | `true` / `false` | |
//!
//! The rewritten forms are the shapes the scan pushes down exactly, so such a query still
//! prunes buckets (an equality with a finer literal reads nothing at all).

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, DFSchemaRef, ExprSchema, Result as DFResult};
use datafusion::logical_expr::expr::{Cast, InList, TryCast};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, LogicalPlan, Operator};
use datafusion::optimizer::analyzer::AnalyzerRule;
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::scalar::ScalarValue;

/// The analyzer rule; add it after DataFusion's own rules
/// (`SessionContext::add_analyzer_rule`). [`crate::session::session`] does.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExactTimeLiterals;

impl AnalyzerRule for ExactTimeLiterals {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DFResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let schema = merge_schema(&node.inputs());
            if schema.fields().is_empty() {
                return Ok(Transformed::no(node));
            }
            // A rewritten expression keeps its name: `SELECT timestamp >= '...' FROM t` names
            // its column after the comparison as written (break-it finding: a projection's
            // schema no longer matched its expressions, an internal error).
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                let saved = names.save(&e);
                e.transform_up(|e| rewrite(e, &schema))
                    .map(|t| t.update_data(|e| saved.restore(e)))
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "pulpitum_exact_time_literals"
    }
}

/// A timestamp column of the plan, possibly under the cast type coercion put on it.
struct TimeColumn {
    column: Expr,
    unit: TimeUnit,
    tz: Option<Arc<str>>,
}

fn time_column(e: &Expr, schema: &DFSchema) -> Option<TimeColumn> {
    let inner = match e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field })
            if matches!(field.data_type(), DataType::Timestamp(..)) =>
        {
            expr.as_ref()
        }
        other => other,
    };
    let Expr::Column(c) = inner else {
        return None;
    };
    match schema.field_from_column(c).ok()?.data_type().clone() {
        DataType::Timestamp(unit, tz) => Some(TimeColumn {
            column: inner.clone(),
            unit,
            tz,
        }),
        _ => None,
    }
}

const fn nanos_per(unit: TimeUnit) -> i128 {
    match unit {
        TimeUnit::Second => 1_000_000_000,
        TimeUnit::Millisecond => 1_000_000,
        TimeUnit::Microsecond => 1_000,
        TimeUnit::Nanosecond => 1,
    }
}

/// Folds a constant expression to a literal; `None` when it is not constant.
fn fold(e: Expr) -> Option<ScalarValue> {
    let simplifier = ExprSimplifier::new(
        SimplifyContext::builder()
            .with_schema(DFSchemaRef::new(DFSchema::empty()))
            .build(),
    );
    match simplifier.simplify(e).ok()? {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

fn nanos_of(v: &ScalarValue) -> Option<i128> {
    Some(match v {
        ScalarValue::TimestampSecond(Some(x), _) => i128::from(*x) * 1_000_000_000,
        ScalarValue::TimestampMillisecond(Some(x), _) => i128::from(*x) * 1_000_000,
        ScalarValue::TimestampMicrosecond(Some(x), _) => i128::from(*x) * 1_000,
        ScalarValue::TimestampNanosecond(Some(x), _) => i128::from(*x),
        _ => return None,
    })
}

/// The instant a constant expression names, in nanoseconds, BEFORE any narrowing cast
/// type coercion put on it: a string or a finer timestamp cast to the column's coarser type
/// is read at nanosecond precision instead. `None` for a non-constant or NULL.
fn precise_nanos(e: &Expr) -> Option<i128> {
    if !e.column_refs().is_empty() || e.is_volatile() || has_placeholder(e) {
        return None;
    }
    if let Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) = e {
        if let DataType::Timestamp(unit, tz) = field.data_type() {
            if *unit != TimeUnit::Nanosecond {
                let wide = Expr::Cast(Cast::new(
                    expr.clone(),
                    DataType::Timestamp(TimeUnit::Nanosecond, tz.clone()),
                ));
                if let Some(n) = fold(wide).as_ref().and_then(nanos_of) {
                    return Some(n);
                }
            }
        }
    }
    nanos_of(&fold(e.clone())?)
}

fn is_null_constant(e: &Expr) -> bool {
    e.column_refs().is_empty()
        && !has_placeholder(e)
        && fold(e.clone()).is_some_and(|v| v.is_null())
}

fn has_placeholder(e: &Expr) -> bool {
    e.exists(|x| Ok(matches!(x, Expr::Placeholder(_))))
        .unwrap_or(true)
}

/// `(floor, ceil)` of an instant in the column's unit, as literals of the column's type.
fn rounded(col: &TimeColumn, nanos: i128) -> Option<(Expr, Expr, bool)> {
    let per = nanos_per(col.unit);
    let floor = nanos.div_euclid(per);
    let exact = nanos.rem_euclid(per) == 0;
    let ceil = if exact { floor } else { floor + 1 };
    let lit = |v: i128| -> Option<Expr> {
        let v = Some(i64::try_from(v).ok()?);
        let tz = col.tz.clone();
        Some(Expr::Literal(
            match col.unit {
                TimeUnit::Second => ScalarValue::TimestampSecond(v, tz),
                TimeUnit::Millisecond => ScalarValue::TimestampMillisecond(v, tz),
                TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(v, tz),
                TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(v, tz),
            },
            None,
        ))
    };
    Some((lit(floor)?, lit(ceil)?, exact))
}

fn flip(op: Operator) -> Operator {
    match op {
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        other => other,
    }
}

fn cmp(l: Expr, op: Operator, r: Expr) -> Expr {
    Expr::BinaryExpr(BinaryExpr::new(Box::new(l), op, Box::new(r)))
}

fn rewrite(e: Expr, schema: &DFSchema) -> DFResult<Transformed<Expr>> {
    let out = match &e {
        Expr::BinaryExpr(b) => rewrite_comparison(b, schema),
        Expr::Between(b) => rewrite_between(b, schema),
        Expr::InList(l) => rewrite_in_list(l, schema),
        _ => None,
    };
    Ok(match out {
        Some(new) => Transformed::yes(new),
        None => Transformed::no(e),
    })
}

fn rewrite_comparison(b: &BinaryExpr, schema: &DFSchema) -> Option<Expr> {
    use Operator::*;
    if !matches!(
        b.op,
        Eq | NotEq | Lt | LtEq | Gt | GtEq | IsDistinctFrom | IsNotDistinctFrom
    ) {
        return None;
    }
    let (col, op, other) = match time_column(&b.left, schema) {
        Some(c) => (c, b.op, b.right.as_ref()),
        None => (time_column(&b.right, schema)?, flip(b.op), b.left.as_ref()),
    };
    let (floor, ceil, exact) = rounded(&col, precise_nanos(other)?)?;
    let uncast =
        matches!(b.left.as_ref(), Expr::Column(_)) || matches!(b.right.as_ref(), Expr::Column(_));
    if exact && uncast && matches!(other, Expr::Literal(..)) {
        // Already a comparison of the column with a literal of its own type.
        return None;
    }
    let t = col.column;
    Some(match op {
        Eq if exact => cmp(t, Eq, floor),
        Eq => cmp(t.clone(), GtEq, ceil).and(cmp(t, LtEq, floor)),
        NotEq if exact => cmp(t, NotEq, floor),
        NotEq => cmp(t.clone(), Lt, ceil).or(cmp(t, Gt, floor)),
        Lt => cmp(t, Lt, ceil),
        LtEq => cmp(t, LtEq, floor),
        Gt => cmp(t, Gt, floor),
        GtEq => cmp(t, GtEq, ceil),
        IsDistinctFrom if exact => cmp(t, IsDistinctFrom, floor),
        IsNotDistinctFrom if exact => cmp(t, IsNotDistinctFrom, floor),
        // A non-NULL instant no stored time can equal.
        IsDistinctFrom => Expr::Literal(ScalarValue::Boolean(Some(true)), None),
        IsNotDistinctFrom => Expr::Literal(ScalarValue::Boolean(Some(false)), None),
        _ => return None,
    })
}

fn rewrite_between(b: &Between, schema: &DFSchema) -> Option<Expr> {
    let col = time_column(&b.expr, schema)?;
    let (_, low, _) = rounded(&col, precise_nanos(&b.low)?)?;
    let (high, _, _) = rounded(&col, precise_nanos(&b.high)?)?;
    Some(Expr::Between(Between::new(
        Box::new(col.column),
        b.negated,
        Box::new(low),
        Box::new(high),
    )))
}

fn rewrite_in_list(l: &InList, schema: &DFSchema) -> Option<Expr> {
    let col = time_column(&l.expr, schema)?;
    let mut kept = Vec::with_capacity(l.list.len());
    let mut dropped = None;
    for item in &l.list {
        let Some((floor, ceil, exact)) = precise_nanos(item).and_then(|n| rounded(&col, n)) else {
            if is_null_constant(item) {
                kept.push(Expr::Literal(
                    ScalarValue::try_from(&DataType::Timestamp(col.unit, col.tz.clone())).ok()?,
                    None,
                ));
                continue;
            }
            // A parameter or anything not constant: leave the whole list alone.
            return None;
        };
        if exact {
            kept.push(floor);
        } else {
            dropped = Some((floor, ceil));
        }
    }
    let t = col.column;
    Some(match (kept.is_empty(), dropped) {
        (false, _) => Expr::InList(InList::new(Box::new(t), kept, l.negated)),
        // Every member is finer than the column: no row is in the list (NULL stays NULL).
        (true, Some((floor, ceil))) if !l.negated => {
            cmp(t.clone(), Operator::GtEq, ceil).and(cmp(t, Operator::LtEq, floor))
        }
        (true, Some((floor, ceil))) => {
            cmp(t.clone(), Operator::Lt, ceil).or(cmp(t, Operator::Gt, floor))
        }
        (true, None) => return None,
    })
}
