//! Predicates on a declared table's value columns that an archived read may apply early:
//! to skip row groups and pages from their statistics, and to drop rows before the rest of
//! their columns are decoded.
//!
//! A predicate names its column by field id and carries the column's type in the table's
//! newest schema, so a payload written before a widening (an `INTEGER` column now `BIGINT`)
//! is compared after the stored values are cast, exactly as reading them would. Applying a
//! predicate early only ever narrows what is read: SQL evaluates the filter again above the
//! scan, so a predicate must keep every row that can match, and may keep more. Statistics
//! are therefore used only where they are bounds under SQL's comparison: never for floating
//! point, whose `NaN` sorts above every number (and a negative `NaN` below) while Parquet's
//! statistics leave `NaN` out.

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, Datum, Scalar};
use datafusion::arrow::compute::kernels::cmp;
use datafusion::arrow::compute::{cast, is_not_null, is_null};
use datafusion::arrow::error::ArrowError;

use super::ColumnType;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `<>`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
}

impl CmpOp {
    fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::NotEq => "<>",
            Self::Lt => "<",
            Self::LtEq => "<=",
            Self::Gt => ">",
            Self::GtEq => ">=",
        }
    }
}

/// What a predicate asks of its column.
#[derive(Debug, Clone)]
pub enum Test {
    /// `column op literal`; the literal is a one-element array of the column's type.
    Compare(CmpOp, ArrayRef),
    /// `column IN (literals)` (or `=`s joined by `OR`); the literals are an array of the
    /// column's type, without nulls.
    AnyOf(ArrayRef),
    /// `column IS NULL`.
    IsNull,
    /// `column IS NOT NULL`.
    IsNotNull,
}

/// One predicate on one value column.
#[derive(Debug, Clone)]
pub struct ValuePredicate {
    /// The column's field id.
    pub field: u32,
    /// The column's SQL name (for `EXPLAIN`).
    pub name: String,
    /// The column's type in the table's newest schema.
    pub ty: ColumnType,
    /// The test.
    pub test: Test,
}

impl std::fmt::Display for ValuePredicate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.test {
            Test::Compare(op, lit) => {
                let v = datafusion::arrow::util::display::array_value_to_string(lit, 0)
                    .unwrap_or_else(|_| "?".into());
                write!(f, "{} {} {v}", self.name, op.symbol())
            }
            Test::AnyOf(list) => {
                let items: Vec<String> = (0..list.len())
                    .map(|i| {
                        datafusion::arrow::util::display::array_value_to_string(list, i)
                            .unwrap_or_else(|_| "?".into())
                    })
                    .collect();
                write!(f, "{} IN ({})", self.name, items.join(", "))
            }
            Test::IsNull => write!(f, "{} IS NULL", self.name),
            Test::IsNotNull => write!(f, "{} IS NOT NULL", self.name),
        }
    }
}

impl ValuePredicate {
    /// A comparison, if `literal` (one element, not null) has exactly the column's type.
    pub fn compare(
        field: u32,
        name: &str,
        ty: ColumnType,
        op: CmpOp,
        literal: ArrayRef,
    ) -> Option<Self> {
        if literal.len() != 1 || literal.is_null(0) || literal.data_type() != &ty.arrow() {
            return None;
        }
        Some(Self {
            field,
            name: name.to_string(),
            ty,
            test: Test::Compare(op, literal),
        })
    }

    /// `column IN (literals)`, if there are some, none is null and all have exactly the
    /// column's type.
    pub fn any_of(field: u32, name: &str, ty: ColumnType, literals: ArrayRef) -> Option<Self> {
        if literals.is_empty() || literals.null_count() > 0 || literals.data_type() != &ty.arrow() {
            return None;
        }
        Some(Self {
            field,
            name: name.to_string(),
            ty,
            test: Test::AnyOf(literals),
        })
    }

    /// The values of a column as the table's newest schema reads them (`stored` holds the
    /// type a payload was written with, which widens to the newest).
    fn widened(&self, stored: &ArrayRef, from: ColumnType) -> Result<ArrayRef, ArrowError> {
        if !from.widens_to(self.ty) {
            return Err(ArrowError::InvalidArgumentError(format!(
                "column {} was stored as {from}, which does not widen to {}",
                self.name, self.ty
            )));
        }
        if stored.data_type() == &self.ty.arrow() {
            return Ok(stored.clone());
        }
        cast(stored, &self.ty.arrow())
    }

    /// Which rows of a column (stored as `from`) may match: `false` only where the row
    /// cannot (a `NULL` comparison is not a match, as in SQL's `WHERE`).
    pub fn evaluate(
        &self,
        stored: &ArrayRef,
        from: ColumnType,
    ) -> Result<BooleanArray, ArrowError> {
        let col = self.widened(stored, from)?;
        let out = match &self.test {
            Test::IsNull => return is_null(&col),
            Test::IsNotNull => return is_not_null(&col),
            Test::Compare(op, lit) => compare(*op, &col, lit)?,
            Test::AnyOf(list) => {
                let mut any: Option<BooleanArray> = None;
                for i in 0..list.len() {
                    let m = compare(CmpOp::Eq, &col, &list.slice(i, 1))?;
                    any = Some(match any {
                        None => m,
                        Some(prev) => datafusion::arrow::compute::or_kleene(&prev, &m)?,
                    });
                }
                any.expect("a non-empty list")
            }
        };
        // A NULL result drops the row.
        Ok(match out.nulls() {
            None => out,
            Some(_) => out.iter().map(|b| Some(b == Some(true))).collect(),
        })
    }

    /// Whether a run of `rows` rows whose statistics are `min`, `max` (one-element arrays of
    /// the stored type; null when unknown) and `nulls` (`None`: unknown) may hold a match.
    /// `true` when the statistics cannot decide it.
    pub fn may_match(
        &self,
        from: ColumnType,
        min: &ArrayRef,
        max: &ArrayRef,
        nulls: Option<u64>,
        rows: u64,
    ) -> bool {
        match &self.test {
            Test::IsNull => nulls != Some(0),
            Test::IsNotNull => nulls != Some(rows),
            Test::AnyOf(list) => (0..list.len()).any(|i| {
                let eq = Self {
                    test: Test::Compare(CmpOp::Eq, list.slice(i, 1)),
                    ..self.clone()
                };
                eq.may_match(from, min, max, nulls, rows)
            }),
            Test::Compare(op, lit) => {
                if nulls == Some(rows) && rows > 0 {
                    // Only NULLs: no comparison matches.
                    return false;
                }
                if matches!(self.ty, ColumnType::Float32 | ColumnType::Float64) {
                    return true;
                }
                let (Ok(min), Ok(max)) = (self.widened(min, from), self.widened(max, from)) else {
                    return true;
                };
                if min.is_null(0) || max.is_null(0) {
                    return true;
                }
                let holds = |op: CmpOp, a: &ArrayRef| {
                    compare(op, a, lit).is_ok_and(|r| r.is_valid(0) && r.value(0))
                };
                match op {
                    CmpOp::Eq => !(holds(CmpOp::Gt, &min) || holds(CmpOp::Lt, &max)),
                    CmpOp::Lt => holds(CmpOp::Lt, &min),
                    CmpOp::LtEq => holds(CmpOp::LtEq, &min),
                    CmpOp::Gt => holds(CmpOp::Gt, &max),
                    CmpOp::GtEq => holds(CmpOp::GtEq, &max),
                    // Only a run of one repeated value could be excluded; not worth the risk
                    // of truncated statistics.
                    CmpOp::NotEq => true,
                }
            }
        }
    }
}

/// What a scan of a declared table needs of each row's value, and the predicates it may
/// apply early. The default reads every field and applies nothing.
#[derive(Debug, Clone, Default)]
pub struct ValueRead {
    /// The field ids read; `None`: every field, with each row's stored bytes exactly (what
    /// `DELETE`, `UPDATE`, masks and compaction compare). With `Some`, a returned value may
    /// hold only these fields.
    pub fields: Option<std::sync::Arc<[u32]>>,
    /// Predicates the scan may apply to skip row groups, pages and rows (all must hold).
    pub filters: std::sync::Arc<[ValuePredicate]>,
}

impl ValueRead {
    /// Whether the read wants field `id`.
    pub fn wants(&self, id: u32) -> bool {
        self.fields.as_ref().is_none_or(|f| f.contains(&id))
    }
}

/// Compares as SQL does: Arrow's kernels order floating point totally, so `-0.0` and `0.0`
/// differ there; DataFusion (and PostgreSQL) take them as equal, so both sides are
/// normalised first, as DataFusion's own comparison does.
fn compare(op: CmpOp, a: &ArrayRef, literal: &ArrayRef) -> Result<BooleanArray, ArrowError> {
    let zero = datafusion::common::utils::normalize_float_zero;
    compare_raw(op, &zero(a), &Scalar::new(zero(literal)))
}

fn compare_raw(op: CmpOp, a: &dyn Datum, b: &dyn Datum) -> Result<BooleanArray, ArrowError> {
    match op {
        CmpOp::Eq => cmp::eq(a, b),
        CmpOp::NotEq => cmp::neq(a, b),
        CmpOp::Lt => cmp::lt(a, b),
        CmpOp::LtEq => cmp::lt_eq(a, b),
        CmpOp::Gt => cmp::gt(a, b),
        CmpOp::GtEq => cmp::gt_eq(a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};
    use std::sync::Arc;

    fn int_pred(op: CmpOp, v: i64) -> ValuePredicate {
        ValuePredicate::compare(
            4,
            "n",
            ColumnType::Int64,
            op,
            Arc::new(Int64Array::from(vec![v])),
        )
        .unwrap()
    }

    #[test]
    fn rows_of_a_column_stored_narrower_are_compared_widened() {
        let stored: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(7), Some(-3)]));
        let p = int_pred(CmpOp::GtEq, 1);
        let got = p.evaluate(&stored, ColumnType::Int32).unwrap();
        assert_eq!(
            got.iter().collect::<Vec<_>>(),
            vec![Some(true), Some(false), Some(true), Some(false)]
        );
        // A stored type that does not widen is an error, never a guess.
        let text: ArrayRef = Arc::new(StringArray::from(vec!["1"]));
        assert!(p.evaluate(&text, ColumnType::Text).is_err());
        let is_null = ValuePredicate {
            test: Test::IsNull,
            ..p.clone()
        };
        assert_eq!(
            is_null
                .evaluate(&stored, ColumnType::Int32)
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            vec![Some(false), Some(true), Some(false), Some(false)]
        );
    }

    #[test]
    fn statistics_exclude_only_runs_that_cannot_match() {
        let one = |v: i32| -> ArrayRef { Arc::new(Int32Array::from(vec![v])) };
        let unknown: ArrayRef = Arc::new(Int32Array::from(vec![None::<i32>]));
        let (min, max) = (one(10), one(20));
        let cases = [
            (CmpOp::Eq, 9, false),
            (CmpOp::Eq, 10, true),
            (CmpOp::Eq, 21, false),
            (CmpOp::Lt, 10, false),
            (CmpOp::LtEq, 10, true),
            (CmpOp::Gt, 20, false),
            (CmpOp::GtEq, 20, true),
            (CmpOp::NotEq, 15, true),
        ];
        for (op, v, want) in cases {
            let p = int_pred(op, v);
            assert_eq!(
                p.may_match(ColumnType::Int32, &min, &max, Some(0), 100),
                want,
                "{p}"
            );
            // Unknown statistics never exclude.
            assert!(p.may_match(ColumnType::Int32, &unknown, &max, None, 100));
        }
        // A run of NULLs matches no comparison, and IS NULL needs a NULL.
        assert!(!int_pred(CmpOp::NotEq, 1).may_match(
            ColumnType::Int32,
            &unknown,
            &unknown,
            Some(5),
            5
        ));
        let is_null = ValuePredicate {
            test: Test::IsNull,
            ..int_pred(CmpOp::Eq, 0)
        };
        assert!(!is_null.may_match(ColumnType::Int32, &min, &max, Some(0), 5));
        assert!(is_null.may_match(ColumnType::Int32, &min, &max, None, 5));
    }

    #[test]
    fn floating_point_statistics_are_never_trusted() {
        // Parquet's statistics leave NaN out, and NaN is above every number in SQL.
        let p = ValuePredicate::compare(
            2,
            "x",
            ColumnType::Float64,
            CmpOp::Gt,
            Arc::new(Float64Array::from(vec![5.0])),
        )
        .unwrap();
        let one = |v: f64| -> ArrayRef { Arc::new(Float64Array::from(vec![v])) };
        assert!(p.may_match(ColumnType::Float64, &one(1.0), &one(2.0), Some(0), 3));
        let rows: ArrayRef = Arc::new(Float64Array::from(vec![1.0, f64::NAN, 6.0]));
        assert_eq!(
            p.evaluate(&rows, ColumnType::Float64)
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            vec![Some(false), Some(true), Some(true)]
        );
    }

    #[test]
    fn signed_zeros_are_equal_as_in_sql() {
        // Arrow's kernels order -0.0 below 0.0; SQL takes them as equal.
        let rows: ArrayRef = Arc::new(Float64Array::from(vec![-0.0, 0.0, 1.0]));
        for (op, lit, want) in [
            (CmpOp::Eq, 0.0, vec![true, true, false]),
            (CmpOp::Eq, -0.0, vec![true, true, false]),
            (CmpOp::GtEq, 0.0, vec![true, true, true]),
            (CmpOp::Lt, 0.0, vec![false, false, false]),
            (CmpOp::NotEq, -0.0, vec![false, false, true]),
        ] {
            let p = ValuePredicate::compare(
                2,
                "x",
                ColumnType::Float64,
                op,
                Arc::new(Float64Array::from(vec![lit])),
            )
            .unwrap();
            let got: Vec<bool> = p
                .evaluate(&rows, ColumnType::Float64)
                .unwrap()
                .iter()
                .map(|b| b == Some(true))
                .collect();
            assert_eq!(got, want, "{p}");
        }
        let any = ValuePredicate::any_of(
            2,
            "x",
            ColumnType::Float64,
            Arc::new(Float64Array::from(vec![0.0, 3.0])),
        )
        .unwrap();
        let got: Vec<bool> = any
            .evaluate(&rows, ColumnType::Float64)
            .unwrap()
            .iter()
            .map(|b| b == Some(true))
            .collect();
        assert_eq!(got, vec![true, true, false]);
    }

    #[test]
    fn a_list_matches_any_of_its_values() {
        let p = ValuePredicate::any_of(
            4,
            "n",
            ColumnType::Int64,
            Arc::new(Int64Array::from(vec![3, 40])),
        )
        .unwrap();
        let stored: ArrayRef = Arc::new(Int32Array::from(vec![Some(3), None, Some(4), Some(40)]));
        assert_eq!(
            p.evaluate(&stored, ColumnType::Int32)
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            vec![Some(true), Some(false), Some(false), Some(true)]
        );
        let one = |v: i32| -> ArrayRef { Arc::new(Int32Array::from(vec![v])) };
        assert!(p.may_match(ColumnType::Int32, &one(30), &one(50), Some(0), 9));
        assert!(!p.may_match(ColumnType::Int32, &one(5), &one(39), Some(0), 9));
        assert_eq!(p.to_string(), "n IN (3, 40)");
        let with_null: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        assert!(ValuePredicate::any_of(4, "n", ColumnType::Int64, with_null).is_none());
    }

    #[test]
    fn a_literal_of_another_type_is_not_a_predicate() {
        let lit: ArrayRef = Arc::new(Int32Array::from(vec![1]));
        assert!(ValuePredicate::compare(1, "n", ColumnType::Int64, CmpOp::Eq, lit).is_none());
        let null: ArrayRef = Arc::new(Int64Array::from(vec![None::<i64>]));
        assert!(ValuePredicate::compare(1, "n", ColumnType::Int64, CmpOp::Eq, null).is_none());
    }
}
