//! Exact floats from decimal literals.
//!
//! Sessions read an unquoted literal with a decimal point or an exponent as a `NUMERIC`
//! (`datafusion.sql_parser.parse_float_as_decimal`), as PostgreSQL does, so `1.005` is
//! exact into a `NUMERIC` column and in arithmetic. Where such a literal meets a float,
//! type coercion casts it, and Arrow's decimal-to-float cast multiplies by a power of ten
//! that is itself rounded: `1e30` became `1.0000000000000002e30`, one unit in the last
//! place away from the double PostgreSQL gives. [`ExactFloatLiterals`] is an analyzer rule
//! that runs after type coercion and replaces each cast of a decimal literal to a float
//! by the float nearest to the literal's exact value (Rust's correctly rounded parse of its
//! digits).

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
pub struct ExactFloatLiterals;

impl AnalyzerRule for ExactFloatLiterals {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DFResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            // A projection's column keeps the name its expression had (`1.5` in SQL).
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
        "pulpitum_exact_float_literals"
    }
}

fn rewrite(e: Expr) -> Transformed<Expr> {
    let (inner, to) = match &e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => {
            (expr.as_ref(), field.data_type())
        }
        _ => return Transformed::no(e),
    };
    let Expr::Literal(v, _) = inner else {
        return Transformed::no(e);
    };
    let Some(exact) = decimal_text(v) else {
        return Transformed::no(e);
    };
    let value = match to {
        DataType::Float64 => exact
            .parse::<f64>()
            .ok()
            .map(|f| ScalarValue::Float64(Some(f))),
        DataType::Float32 => exact
            .parse::<f32>()
            .ok()
            .map(|f| ScalarValue::Float32(Some(f))),
        _ => None,
    };
    match value {
        Some(v) => Transformed::yes(Expr::Literal(v, None)),
        None => Transformed::no(e),
    }
}

/// A decimal literal's exact value as `<unscaled>e<-scale>`, which Rust's float parsers
/// round correctly.
fn decimal_text(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Decimal128(Some(x), _, s) => Some(format!("{x}e{}", -i32::from(*s))),
        ScalarValue::Decimal256(Some(x), _, s) => Some(format!("{x}e{}", -i32::from(*s))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn decimal_literals_become_the_nearest_float() {
        let ctx = SessionContext::new_with_config(
            datafusion::prelude::SessionConfig::new()
                .set_bool("datafusion.sql_parser.parse_float_as_decimal", true),
        );
        let sql = "SELECT CAST(1e30 AS DOUBLE), CAST(-0.1 AS REAL), CAST(123.456e-20 AS DOUBLE), \
                   CAST(1.005 AS DOUBLE) * 1";
        let cells = |ctx: SessionContext| async move {
            let b = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            let b = &b[0];
            (
                b.column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Float64Array>()
                    .unwrap()
                    .value(0),
                b.column(1)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Float32Array>()
                    .unwrap()
                    .value(0),
                b.column(2)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Float64Array>()
                    .unwrap()
                    .value(0),
                b.column(3)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Float64Array>()
                    .unwrap()
                    .value(0),
            )
        };
        // Without the rule, Arrow's cast is a unit in the last place off.
        let (off, ..) = cells(ctx.clone()).await;
        assert_ne!(off, 1e30);
        ctx.add_analyzer_rule(std::sync::Arc::new(ExactFloatLiterals));
        assert_eq!(cells(ctx).await, (1e30, -0.1f32, 123.456e-20, 1.005));
    }
}
