//! Statement shapes: an ad-hoc query with its literals lifted into parameters, so the same
//! page asked for with another channel or another word reuses one prepared plan.
//!
//! A BI tool or a driver without prepared statements sends `SELECT ... WHERE channel_id = 7
//! ORDER BY timestamp DESC LIMIT 50` as text, again and again with other values. Parsing,
//! analysing and optimising it each time cost several times the query itself. [`lift`] turns
//! it into `... WHERE channel_id = $1 ...` and the value `7`; the caller prepares the lifted
//! statement once ([`super::PreparedQuery`], cached under the lifted text) and executes it
//! with the values.
//!
//! Only literals whose meaning cannot change by becoming a parameter are lifted: integers
//! and strings that are a direct operand of a comparison (`=`, `<>`, `<`, `<=`, `>`, `>=`),
//! a member of an `IN` list, a bound of `BETWEEN` or a `LIKE` pattern, in the `WHERE` of a
//! plain `SELECT`, through `AND`, `OR`, `NOT` and parentheses; never in the select list,
//! `GROUP BY` or `ORDER BY` (where `1` is a column position), `LIMIT`, function arguments or
//! subqueries. The caller then checks each lifted value against the type the prepared plan
//! gave its parameter ([`binds_like_a_literal`]) and runs the statement as written whenever
//! one does not bind the way the literal would have been coerced, or when preparing or
//! binding fails; so a statement's answer and its errors are those of the statement as
//! written.

use datafusion::arrow::datatypes::DataType;
use datafusion::scalar::ScalarValue;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, SetExpr, Statement, UnaryOperator, Value, ValueWithSpan, Visit, Visitor,
};

/// A statement with its literals lifted.
#[derive(Debug, Clone)]
pub struct Lifted {
    /// The statement with `$1..$n` in place of the lifted literals.
    pub statement: Statement,
    /// Its text: the cache key of its shape.
    pub text: String,
    /// The lifted values, `$1` first.
    pub values: Vec<ScalarValue>,
}

/// `statement` with its liftable literals replaced by parameters; `None` when it is not a
/// plain `SELECT` (no `INTO`) or already has parameters.
pub fn lift(statement: &Statement) -> Option<Lifted> {
    let Statement::Query(query) = statement else {
        return None;
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    if select.into.is_some() || has_placeholders(statement) {
        return None;
    }
    let mut statement = statement.clone();
    let mut values = Vec::new();
    if let Statement::Query(q) = &mut statement {
        if let SetExpr::Select(s) = q.body.as_mut() {
            if let Some(w) = s.selection.as_mut() {
                lift_in(w, &mut values);
            }
        }
    }
    Some(Lifted {
        text: statement.to_string(),
        statement,
        values,
    })
}

impl Lifted {
    /// Whether every lifted value binds to its parameter (of `types`, `$1` first) exactly as
    /// its literal would have been coerced ([`binds_like_a_literal`]).
    pub fn binds_to(&self, types: &[DataType]) -> bool {
        types.len() == self.values.len()
            && self
                .values
                .iter()
                .zip(types)
                .all(|(v, t)| binds_like_a_literal(v, t))
    }
}

/// Whether `given`, a lifted literal, binds to a parameter of type `param` exactly as the
/// literal would have been coerced where it stood. DataFusion compares a number with a
/// string by casting the string to the number's type, and a time with a string by parsing
/// the string: so an integer binds to any numeric parameter and a string to a string, a
/// number, a timestamp or a date (the binding casts the same way, fails where the cast
/// fails, and an instant finer than the column is planned with the value itself, see
/// [`super::PreparedQuery::physical_plan`]). An integer for a text or time column does not:
/// SQL casts the *column* to a number there, which a parameter typed like the column would
/// not do.
pub fn binds_like_a_literal(given: &ScalarValue, param: &DataType) -> bool {
    let given = given.data_type();
    given == *param
        || (given == DataType::Int64 && param.is_numeric())
        || (given == DataType::Utf8
            && (param.is_numeric()
                || matches!(
                    param,
                    DataType::Timestamp(..)
                        | DataType::Date32
                        | DataType::Utf8View
                        | DataType::LargeUtf8
                )))
}

/// Prepared shapes for one session (the shell's, or an embedding application's), least
/// recently used out: [`ShapeCache::query`] runs an ad-hoc query through its shape.
///
/// A shape is kept under its text and the session's time zone, and prepared again when a
/// declared table it reads has a newer schema ([`super::PreparedQuery::is_current`]).
/// [`ShapeCache::clear`] forgets every shape: call it after a statement that changes tables
/// (the shell does after every statement that is not a query).
#[derive(Debug)]
pub struct ShapeCache {
    shapes: std::sync::Mutex<crate::lru::Lru<String, Option<std::sync::Arc<super::PreparedQuery>>>>,
}

impl ShapeCache {
    /// A cache of at most `capacity` shapes.
    pub fn new(capacity: usize) -> Self {
        Self {
            shapes: std::sync::Mutex::new(crate::lru::Lru::new(capacity)),
        }
    }

    /// Forgets every shape.
    pub fn clear(&self) {
        self.shapes.lock().expect("shapes lock").clear();
    }

    /// The result of `sql` run through its prepared shape, or `None` when it should run as
    /// written (see the module's documentation for when).
    pub async fn query(
        &self,
        ctx: &datafusion::prelude::SessionContext,
        sql: &str,
    ) -> Option<(
        datafusion::arrow::datatypes::SchemaRef,
        datafusion::execution::SendableRecordBatchStream,
    )> {
        let (dialect, zone) = {
            let state = ctx.state_ref();
            let state = state.read();
            let options = state.config().options();
            (
                options.sql_parser.dialect,
                options.execution.time_zone.clone().unwrap_or_default(),
            )
        };
        let dialect = datafusion::sql::sqlparser::dialect::dialect_from_str(dialect)?;
        let mut statements =
            datafusion::sql::sqlparser::parser::Parser::parse_sql(dialect.as_ref(), sql).ok()?;
        if statements.len() != 1 {
            return None;
        }
        let lifted = lift(&statements.pop()?)?;
        let key = format!("{zone}\0{}", lifted.text);
        let cached = self.shapes.lock().expect("shapes lock").get(&key);
        let prepared = match cached {
            Some(Some(p)) if p.is_current().await.ok()? => p,
            Some(None) => return None,
            _ => {
                let p = match super::prepare_parsed(ctx, &lifted.statement).await {
                    Ok(p) if p.is_query() => Some(std::sync::Arc::new(p)),
                    _ => None,
                };
                self.shapes
                    .lock()
                    .expect("shapes lock")
                    .insert(key, p.clone());
                p?
            }
        };
        if !lifted.binds_to(prepared.parameter_types()) {
            return None;
        }
        let stream = prepared.execute_stream(&lifted.values).await.ok()?;
        Some((prepared.schema(), stream))
    }
}

fn has_placeholders(statement: &Statement) -> bool {
    struct Find(bool);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_value(&mut self, v: &ValueWithSpan) -> std::ops::ControlFlow<()> {
            if matches!(v.value, Value::Placeholder(_)) {
                self.0 = true;
                return std::ops::ControlFlow::Break(());
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    let mut f = Find(false);
    let _ = statement.visit(&mut f);
    f.0
}

fn lift_in(e: &mut Expr, values: &mut Vec<ScalarValue>) {
    match e {
        Expr::BinaryOp { left, op, right } => match op {
            BinaryOperator::And | BinaryOperator::Or => {
                lift_in(left, values);
                lift_in(right, values);
            }
            BinaryOperator::Eq
            | BinaryOperator::NotEq
            | BinaryOperator::Lt
            | BinaryOperator::LtEq
            | BinaryOperator::Gt
            | BinaryOperator::GtEq => {
                lift_leaf(left, values);
                lift_leaf(right, values);
            }
            _ => {}
        },
        Expr::Nested(inner) => lift_in(inner, values),
        Expr::UnaryOp {
            op: UnaryOperator::Not,
            expr,
        } => lift_in(expr, values),
        Expr::InList { list, .. } => {
            for item in list {
                lift_leaf(item, values);
            }
        }
        Expr::Between { low, high, .. } => {
            lift_leaf(low, values);
            lift_leaf(high, values);
        }
        Expr::Like {
            pattern,
            any: false,
            escape_char: None,
            ..
        }
        | Expr::ILike {
            pattern,
            any: false,
            escape_char: None,
            ..
        } => lift_leaf(pattern, values),
        _ => {}
    }
}

fn lift_leaf(e: &mut Expr, values: &mut Vec<ScalarValue>) {
    let Expr::Value(v) = e else {
        return;
    };
    let scalar = match &v.value {
        // An integer as SQL reads it (a BIGINT); a decimal or an exponent stays in place.
        Value::Number(n, false) if n.bytes().all(|b| b.is_ascii_digit()) => {
            match n.parse::<i64>() {
                Ok(x) => ScalarValue::Int64(Some(x)),
                Err(_) => return,
            }
        }
        Value::SingleQuotedString(s) => ScalarValue::Utf8(Some(s.clone())),
        _ => return,
    };
    values.push(scalar);
    v.value = Value::Placeholder(format!("${}", values.len()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn lifted(sql: &str) -> Option<(String, Vec<ScalarValue>)> {
        let s = Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0);
        lift(&s).map(|l| (l.text, l.values))
    }

    #[test]
    fn pages_of_one_shape_share_one_text() {
        let (a, va) = lifted(
            "SELECT * FROM chat WHERE channel_id = 7 ORDER BY timestamp DESC, id DESC LIMIT 50",
        )
        .unwrap();
        let (b, vb) = lifted(
            "select *   from chat where channel_id=12 order by timestamp desc, id desc limit 50",
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a,
            "SELECT * FROM chat WHERE channel_id = $1 ORDER BY timestamp DESC, id DESC LIMIT 50"
        );
        assert_eq!(va, vec![ScalarValue::Int64(Some(7))]);
        assert_eq!(vb, vec![ScalarValue::Int64(Some(12))]);
        // Another limit is another shape.
        let (c, _) = lifted(
            "SELECT * FROM chat WHERE channel_id = 7 ORDER BY timestamp DESC, id DESC LIMIT 10",
        )
        .unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn only_operands_of_predicates_are_lifted() {
        let (text, values) = lifted(
            "SELECT 1, 'a', channel_id FROM chat WHERE (channel_id IN (1, 2) OR NOT id BETWEEN 3 AND 4) \
             AND content LIKE '%x%' AND timestamp >= '2026-01-01' AND length(content) > 5 + 1 \
             AND id > 1.5 AND id = -3 AND channel_id IN (SELECT 9) GROUP BY 1 ORDER BY 1 LIMIT 2",
        )
        .unwrap();
        assert_eq!(
            text,
            "SELECT 1, 'a', channel_id FROM chat WHERE (channel_id IN ($1, $2) OR NOT id BETWEEN $3 AND $4) \
             AND content LIKE $5 AND timestamp >= $6 AND length(content) > 5 + 1 AND id > 1.5 \
             AND id = -3 AND channel_id IN (SELECT 9) GROUP BY 1 ORDER BY 1 LIMIT 2"
        );
        assert_eq!(values.len(), 6);
        assert_eq!(values[5], ScalarValue::Utf8(Some("2026-01-01".into())));
        // Not a plain SELECT, or parameters already: left alone.
        for sql in [
            "SELECT 1 INTO t FROM chat WHERE id = 1",
            "SELECT * FROM chat WHERE id = $1",
            "SELECT 1 UNION SELECT 2",
            "INSERT INTO chat VALUES (1, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'x')",
            "EXPLAIN SELECT * FROM chat WHERE id = 1",
        ] {
            assert!(lifted(sql).is_none(), "{sql}");
        }
    }

    #[test]
    fn a_number_binds_to_text_never() {
        let s = ScalarValue::Utf8(Some("7".into()));
        let i = ScalarValue::Int64(Some(7));
        assert!(binds_like_a_literal(&s, &DataType::Int64));
        assert!(!binds_like_a_literal(&i, &DataType::Boolean));
        assert!(binds_like_a_literal(&i, &DataType::Int32));
        assert!(binds_like_a_literal(&i, &DataType::Float64));
        assert!(!binds_like_a_literal(&i, &DataType::Utf8));
        assert!(binds_like_a_literal(
            &s,
            &DataType::Timestamp(
                datafusion::arrow::datatypes::TimeUnit::Microsecond,
                Some("UTC".into())
            )
        ));
    }
}
