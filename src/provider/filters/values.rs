//! Filters on a declared table's value columns that archived reads may apply early.
//!
//! `column op literal` (`=`, `<>`, `<`, `<=`, `>`, `>=`, either way round), `column IN
//! (literals)` (and the `=`s joined by `OR` DataFusion writes it as), `column IS [NOT] NULL`,
//! and a `BOOLEAN` column alone or under `NOT`, on a value column, are classified `Inexact`: DataFusion keeps
//! evaluating them above the scan, and the scan hands them to the columnar Parquet reader,
//! which skips row groups and pages from statistics and rows before decoding the rest
//! ([`crate::model::schema::predicate`]). A literal whose type is not exactly the column's
//! (DataFusion casts the column instead) is left to SQL: a predicate is only applied where
//! it compares exactly as SQL would.

use std::sync::Arc;

use datafusion::arrow::array::BooleanArray;
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use datafusion::scalar::ScalarValue;

use crate::model::schema::predicate::{CmpOp, Test, ValuePredicate};
use crate::model::schema::{ColumnDef, ColumnType};
use crate::provider::surface::Surface;

/// The value column a filter names, with the filter's shape; `None` for any other filter.
fn shape<'a>(surface: &'a Surface, e: &'a Expr) -> Option<(&'a ColumnDef, Shape<'a>)> {
    let Surface::Declared(d) = surface else {
        return None;
    };
    let column = |e: &Expr| match e {
        Expr::Column(c) => d.schema.column(&c.name),
        _ => None,
    };
    let constant = |e: &Expr| matches!(e, Expr::Literal(..) | Expr::Placeholder(_));
    let boolean = |e: &Expr| column(e).filter(|c| c.ty == ColumnType::Boolean);
    match e {
        Expr::IsNull(inner) => Some((column(inner)?, Shape::IsNull)),
        Expr::IsNotNull(inner) => Some((column(inner)?, Shape::IsNotNull)),
        Expr::Column(_) => Some((boolean(e)?, Shape::Bool(true))),
        Expr::Not(inner) => Some((boolean(inner)?, Shape::Bool(false))),
        Expr::InList(InList {
            expr,
            list,
            negated: false,
        }) if list.iter().all(constant) => {
            Some((column(expr)?, Shape::List(list.iter().collect())))
        }
        Expr::BinaryExpr(BinaryExpr {
            op: Operator::Or, ..
        }) => {
            // DataFusion writes a short IN list as equalities joined by OR.
            let mut items = Vec::new();
            let mut on: Option<&ColumnDef> = None;
            for eq in split_or(e) {
                let (c, Shape::Compare(CmpOp::Eq, v)) = shape(surface, eq)? else {
                    return None;
                };
                if on.is_some_and(|o| o.id != c.id) {
                    return None;
                }
                on = Some(c);
                items.push(v);
            }
            Some((on?, Shape::List(items)))
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let op = cmp_op(*op)?;
            match (left.as_ref(), right.as_ref()) {
                (l, r @ (Expr::Literal(..) | Expr::Placeholder(_))) => {
                    Some((column(l)?, Shape::Compare(op, r)))
                }
                (l @ (Expr::Literal(..) | Expr::Placeholder(_)), r) => {
                    Some((column(r)?, Shape::Compare(flip(op), l)))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

enum Shape<'a> {
    Compare(CmpOp, &'a Expr),
    List(Vec<&'a Expr>),
    Bool(bool),
    IsNull,
    IsNotNull,
}

fn split_or(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let mut v = split_or(left);
            v.extend(split_or(right));
            v
        }
        other => vec![other],
    }
}

fn cmp_op(op: Operator) -> Option<CmpOp> {
    Some(match op {
        Operator::Eq => CmpOp::Eq,
        Operator::NotEq => CmpOp::NotEq,
        Operator::Lt => CmpOp::Lt,
        Operator::LtEq => CmpOp::LtEq,
        Operator::Gt => CmpOp::Gt,
        Operator::GtEq => CmpOp::GtEq,
        _ => return None,
    })
}

fn flip(op: CmpOp) -> CmpOp {
    match op {
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::LtEq => CmpOp::GtEq,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::GtEq => CmpOp::LtEq,
        other => other,
    }
}

/// Whether a filter has the shape of a value predicate (classified `Inexact`; its literal
/// may still turn out not to be usable, and it is then left to SQL).
pub(super) fn is_value_filter(surface: &Surface, e: &Expr) -> bool {
    shape(surface, e).is_some()
}

/// The value predicates among a scan's filters (the usable ones; the rest are SQL's).
pub fn value_predicates(surface: &Surface, filters: &[Expr]) -> Vec<ValuePredicate> {
    filters
        .iter()
        .filter_map(|f| {
            let (c, s) = shape(surface, f)?;
            let test = match s {
                Shape::IsNull => Test::IsNull,
                Shape::IsNotNull => Test::IsNotNull,
                Shape::Compare(op, Expr::Literal(v, _)) => {
                    let lit = v.to_array_of_size(1).ok()?;
                    return ValuePredicate::compare(c.id, &c.name, c.ty, op, lit);
                }
                Shape::Compare(..) => return None,
                Shape::Bool(b) => {
                    let lit = Arc::new(BooleanArray::from(vec![b]));
                    return ValuePredicate::compare(c.id, &c.name, c.ty, CmpOp::Eq, lit);
                }
                Shape::List(items) => {
                    let mut values = Vec::with_capacity(items.len());
                    for item in items {
                        let Expr::Literal(v, _) = item else {
                            return None;
                        };
                        values.push(v.clone());
                    }
                    let list = ScalarValue::iter_to_array(values).ok()?;
                    return ValuePredicate::any_of(c.id, &c.name, c.ty, list);
                }
            };
            Some(ValuePredicate {
                field: c.id,
                name: c.name.clone(),
                ty: c.ty,
                test,
            })
        })
        .collect()
}
