//! Literals with a decimal point cast to a `NUMERIC` or an integer take the value as
//! written.
//!
//! DataFusion reads `1.005` as a double (PostgreSQL reads it as a `NUMERIC`). Where such a
//! literal meets a `NUMERIC` column (an `INSERT`, a comparison), type coercion casts the
//! double, whose exact value is `1.00499999999999989...`: into `NUMERIC(10, 2)` that is
//! `1.00`, where PostgreSQL stores `1.01`; cast to an integer it is truncated (`2.5` became
//! `2`, PostgreSQL rounds to `3`). [`ExactDecimalLiterals`] is an analyzer rule that runs
//! after type coercion and replaces each cast of a float literal to a decimal or an integer
//! by the literal's shortest decimal form (the digits that read back as the same double,
//! which are the digits written for any literal of up to 15 significant digits), rounded
//! half away from zero to the target's scale, as PostgreSQL rounds a `NUMERIC`. A value
//! that does not fit the target is left to DataFusion's cast, which refuses it.
//!
//! (Reading every decimal literal as a `NUMERIC`, DataFusion's
//! `sql_parser.parse_float_as_decimal`, was tried and refused: DataFusion then compares a
//! `DOUBLE PRECISION` column with such a literal by casting the *column* to a fixed
//! `DECIMAL(30, 15)`, which returns wrong rows for small values and fails for large ones.)

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result as DFResult;
use datafusion::logical_expr::expr::{Cast, TryCast};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::analyzer::AnalyzerRule;
use datafusion::scalar::ScalarValue;

/// The analyzer rule; add it after DataFusion's own rules
/// (`SessionContext::add_analyzer_rule`). [`crate::session::session`] does.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExactDecimalLiterals;

impl AnalyzerRule for ExactDecimalLiterals {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DFResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            // A projection's column keeps the name its expression had.
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                let saved = names.save(&e);
                Ok(e.transform_up(|e| Ok(rewrite(e)))?
                    .update_data(|e| saved.restore(e)))
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "pulpitum_exact_decimal_literals"
    }
}

fn rewrite(e: Expr) -> Transformed<Expr> {
    let (inner, to) = match &e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => {
            (expr.as_ref(), field.data_type())
        }
        _ => return Transformed::no(e),
    };
    let x = match inner {
        Expr::Literal(ScalarValue::Float64(Some(x)), _) => *x,
        Expr::Literal(ScalarValue::Float32(Some(x)), _) => f64::from(*x),
        _ => return Transformed::no(e),
    };
    let value = match to {
        DataType::Decimal128(p, s) => unscaled(x, *s)
            .filter(|v| v.unsigned_abs() < 10u128.pow(u32::from(*p)))
            .map(|v| ScalarValue::Decimal128(Some(v), *p, *s)),
        DataType::Int64 => unscaled(x, 0)
            .and_then(|v| i64::try_from(v).ok())
            .map(|v| ScalarValue::Int64(Some(v))),
        DataType::Int32 => unscaled(x, 0)
            .and_then(|v| i32::try_from(v).ok())
            .map(|v| ScalarValue::Int32(Some(v))),
        DataType::Int16 => unscaled(x, 0)
            .and_then(|v| i16::try_from(v).ok())
            .map(|v| ScalarValue::Int16(Some(v))),
        _ => None,
    };
    match value {
        Some(v) => Transformed::yes(Expr::Literal(v, None)),
        None => Transformed::no(e),
    }
}

/// `x`'s shortest decimal form as an unscaled value at `scale`, rounded half away from
/// zero; `None` when it is not finite or does not fit 38 digits.
fn unscaled(x: f64, scale: i8) -> Option<i128> {
    if !x.is_finite() {
        return None;
    }
    // `{:e}` is the shortest form that reads back as `x`: `1.005e0`, `-2.5e-7`.
    let text = format!("{x:e}");
    let (mantissa, exp) = text.split_once('e')?;
    let exp: i32 = exp.parse().ok()?;
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    // The value is digits x 10^(exp - frac.len()); at `scale` it is digits x 10^shift.
    let shift = exp - frac.len() as i32 + i32::from(scale);
    let d: i128 = digits.parse().ok()?;
    let v = if shift >= 0 {
        d.checked_mul(10i128.checked_pow(u32::try_from(shift).ok()?)?)?
    } else {
        let div = 10i128.checked_pow(u32::try_from(-shift).ok()?);
        match div {
            // Smaller than half a unit of the scale: zero.
            None => 0,
            Some(div) => {
                let (q, r) = (d / div, d % div);
                if r * 2 >= div {
                    q + 1
                } else {
                    q
                }
            }
        }
    };
    if v.unsigned_abs() >= 10u128.pow(38) {
        return None;
    }
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[test]
    fn the_shortest_form_rounds_half_away_from_zero() {
        for (x, s, want) in [
            (1.005, 2, Some(101)),
            (-1.005, 2, Some(-101)),
            (1.0049999, 2, Some(100)),
            (2.5, 0, Some(3)),
            (-2.5, 0, Some(-3)),
            (0.1, 15, Some(100_000_000_000_000)),
            (1e-30, 2, Some(0)),
            (123.0, -1, Some(12)),
            (1e30, 0, Some(10i128.pow(30))),
            (1e300, 0, None),
            (f64::NAN, 2, None),
        ] {
            assert_eq!(unscaled(x, s), want, "{x} at scale {s}");
        }
    }

    #[tokio::test]
    async fn float_literals_cast_to_numerics_and_integers_are_as_written() {
        let ctx = SessionContext::new();
        let sql = "SELECT CAST(1.005 AS DECIMAL(10, 2)), CAST(-1.005 AS DECIMAL(10, 2)), \
                   CAST(2.5 AS INT), CAST(-2.5 AS BIGINT), CAST(1.005 AS DOUBLE) * 1";
        let cells = |ctx: SessionContext| async move {
            let b = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            datafusion::arrow::util::pretty::pretty_format_batches(&b)
                .unwrap()
                .to_string()
                .lines()
                .nth(3)
                .unwrap()
                .to_string()
        };
        // Without the rule: the double's value, truncated.
        let before = cells(ctx.clone()).await;
        assert!(before.contains("| 1.00 "), "{before}");
        ctx.add_analyzer_rule(std::sync::Arc::new(ExactDecimalLiterals));
        let after = cells(ctx).await;
        assert_eq!(
            after
                .split('|')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>(),
            vec!["1.01", "-1.01", "3", "-3", "1.005"],
            "{after}"
        );
    }
}
