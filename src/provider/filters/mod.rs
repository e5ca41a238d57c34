//! Filter classification: which SQL predicates the scan applies itself, exactly.
//!
//! [`classify`] is a pure function of one filter and the surface. It answers `Exact` only
//! for shapes the scan applies completely (so DataFusion drops them from the plan and can
//! still push `LIMIT` into the scan): partition `=` / `IN`, time comparisons and
//! `BETWEEN`, sort-key comparisons, the keyset cursor `t > a OR (t = a AND k > b)` and its
//! mirror with `<`, and conjunctions of these. Simple predicates on a declared table's value
//! columns are `Inexact` (`values.rs`): evaluated by DataFusion above the scan, and applied
//! early by columnar archive reads. Everything else is `Unsupported`, evaluated by
//! DataFusion above the scan. [`PushedFilters::from_exprs`] turns the accepted filters
//! into one partition set and one [`ScanBounds`].
//!
//! Literals that cannot be represented without loss are refused out loud: a nanosecond
//! timestamp with sub-microsecond digits is `Unsupported` (the store keeps microseconds, so
//! narrowing it would change which rows match). In a session such a comparison never gets
//! here: [`super::literals`] rewrites it first into an exact one with microsecond literals,
//! which DataFusion's optimizer would otherwise produce by truncating.

use std::collections::BTreeSet;
use std::ops::Bound;

use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::scalar::ScalarValue;

mod values;

pub use values::value_predicates;

use super::surface::{Role, Surface};
use crate::model::{ClusteringKey, EventTime, PartitionKey, ScanBounds, SortKey};

/// What one accepted filter contributes to the scan.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Partition key in this set.
    Partitions(BTreeSet<PartitionKey>),
    /// A bound on time (lower when `lower`).
    Time { lower: bool, bound: TimeBound },
    /// A bound on the sort key.
    Sort { lower: bool, bound: Bound<SortKey> },
    /// The forward keyset cursor.
    After(TimeBound, SortKey),
    /// The backward keyset cursor.
    Before(TimeBound, SortKey),
    /// Several pieces at once (a conjunction).
    All(Vec<Piece>),
}

/// A time literal, possibly outside the supported range (then it decides emptiness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeBound {
    Included(i64),
    Excluded(i64),
}

/// Classifies one filter for `TableProvider::supports_filters_pushdown`.
///
/// A filter with parameters (`channel_id = $1` in a prepared query) is classified by its
/// shape: each placeholder is replaced by a representable value of its inferred type. The
/// real value arrives before the scan is planned; one that cannot be applied exactly then
/// fails the query ([`PushedFilters::try_from_exprs`]) instead of being dropped.
pub fn classify(surface: &Surface, expr: &Expr) -> TableProviderFilterPushDown {
    let accepted = match with_probe_values(expr) {
        Some(probe) => piece(surface, &probe).is_some(),
        None => false,
    };
    if accepted {
        TableProviderFilterPushDown::Exact
    } else if values::is_value_filter(surface, expr) {
        TableProviderFilterPushDown::Inexact
    } else {
        TableProviderFilterPushDown::Unsupported
    }
}

/// `expr` with every placeholder replaced by a representable literal of its type; `None`
/// when a placeholder's type is unknown.
fn with_probe_values(expr: &Expr) -> Option<Expr> {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::common::tree_node::{Transformed, TreeNode};
    use datafusion::logical_expr::expr::Placeholder;
    let mut unknown = false;
    let out = expr
        .clone()
        .transform(|e| {
            let Expr::Placeholder(Placeholder { field, .. }) = &e else {
                return Ok(Transformed::no(e));
            };
            let probe = field.as_ref().and_then(|f| match f.data_type() {
                DataType::Binary => Some(ScalarValue::Binary(Some(vec![0]))),
                DataType::LargeBinary => Some(ScalarValue::LargeBinary(Some(vec![0]))),
                DataType::BinaryView => Some(ScalarValue::BinaryView(Some(vec![0]))),
                other => ScalarValue::new_zero(other).ok(),
            });
            match probe {
                Some(v) => Ok(Transformed::yes(Expr::Literal(v, None))),
                None => {
                    unknown = true;
                    Ok(Transformed::no(e))
                }
            }
        })
        .ok()?
        .data;
    (!unknown).then_some(out)
}

/// Whether a filter names columns, and only key columns of the surface.
fn names_key_columns_only(surface: &Surface, e: &Expr) -> bool {
    let cols = e.column_refs();
    !cols.is_empty()
        && cols
            .iter()
            .all(|c| matches!(surface.role_of(&c.name), Some(r) if r != Role::Value))
}

fn column_role(surface: &Surface, e: &Expr) -> Option<Role> {
    match e {
        Expr::Column(c) => surface.role_of(&c.name),
        _ => None,
    }
}

fn flip(op: Operator) -> Option<Operator> {
    Some(match op {
        Operator::Eq => Operator::Eq,
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        _ => return None,
    })
}

/// `column op literal` with the column on the left, whichever way it was written.
fn comparison(surface: &Surface, e: &Expr) -> Option<(Role, Operator, ScalarValue)> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
        return None;
    };
    match (left.as_ref(), right.as_ref()) {
        (l, Expr::Literal(v, _)) => Some((column_role(surface, l)?, *op, v.clone())),
        (Expr::Literal(v, _), r) => Some((column_role(surface, r)?, flip(*op)?, v.clone())),
        _ => None,
    }
}

/// Microseconds of a timestamp literal; `None` when it is not a timestamp or would lose
/// sub-microsecond digits.
fn micros_of(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::TimestampMicrosecond(Some(x), _) => Some(*x),
        ScalarValue::TimestampMillisecond(Some(x), _) => x.checked_mul(1_000),
        ScalarValue::TimestampSecond(Some(x), _) => x.checked_mul(1_000_000),
        ScalarValue::TimestampNanosecond(Some(x), _) if x % 1_000 == 0 => Some(x / 1_000),
        _ => None,
    }
}

fn sort_key_of(surface: &Surface, v: &ScalarValue) -> Option<SortKey> {
    surface.sort_key_of(v)
}

fn partition_of(surface: &Surface, v: &ScalarValue) -> Option<PartitionKey> {
    surface.partition_of(v)
}

fn piece(surface: &Surface, e: &Expr) -> Option<Piece> {
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) => Some(Piece::All(vec![
            piece(surface, left)?,
            piece(surface, right)?,
        ])),
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => cursor(surface, left, right).or_else(|| {
            // DataFusion rewrites a short `IN` list into ORed equalities.
            match (piece(surface, left)?, piece(surface, right)?) {
                (Piece::Partitions(a), Piece::Partitions(b)) => {
                    Some(Piece::Partitions(a.union(&b).cloned().collect()))
                }
                _ => None,
            }
        }),
        Expr::BinaryExpr(_) => {
            let (role, op, v) = comparison(surface, e)?;
            match role {
                Role::Partition if op == Operator::Eq => {
                    Some(Piece::Partitions([partition_of(surface, &v)?].into()))
                }
                Role::Time => {
                    let t = micros_of(&v)?;
                    let (lo, hi) = (true, false);
                    Some(match op {
                        Operator::Eq => Piece::All(vec![
                            Piece::Time {
                                lower: lo,
                                bound: TimeBound::Included(t),
                            },
                            Piece::Time {
                                lower: hi,
                                bound: TimeBound::Included(t),
                            },
                        ]),
                        Operator::Gt => Piece::Time {
                            lower: lo,
                            bound: TimeBound::Excluded(t),
                        },
                        Operator::GtEq => Piece::Time {
                            lower: lo,
                            bound: TimeBound::Included(t),
                        },
                        Operator::Lt => Piece::Time {
                            lower: hi,
                            bound: TimeBound::Excluded(t),
                        },
                        Operator::LtEq => Piece::Time {
                            lower: hi,
                            bound: TimeBound::Included(t),
                        },
                        _ => return None,
                    })
                }
                Role::Sort => {
                    let k = sort_key_of(surface, &v)?;
                    Some(match op {
                        Operator::Eq => Piece::All(vec![
                            Piece::Sort {
                                lower: true,
                                bound: Bound::Included(k.clone()),
                            },
                            Piece::Sort {
                                lower: false,
                                bound: Bound::Included(k),
                            },
                        ]),
                        Operator::Gt => Piece::Sort {
                            lower: true,
                            bound: Bound::Excluded(k),
                        },
                        Operator::GtEq => Piece::Sort {
                            lower: true,
                            bound: Bound::Included(k),
                        },
                        Operator::Lt => Piece::Sort {
                            lower: false,
                            bound: Bound::Excluded(k),
                        },
                        Operator::LtEq => Piece::Sort {
                            lower: false,
                            bound: Bound::Included(k),
                        },
                        _ => return None,
                    })
                }
                _ => None,
            }
        }
        Expr::InList(list) if !list.negated => {
            if column_role(surface, &list.expr)? != Role::Partition || list.list.is_empty() {
                return None;
            }
            let mut set = BTreeSet::new();
            for item in &list.list {
                let Expr::Literal(v, _) = item else {
                    return None;
                };
                set.insert(partition_of(surface, v)?);
            }
            Some(Piece::Partitions(set))
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) => {
            let (Expr::Literal(lo, _), Expr::Literal(hi, _)) = (low.as_ref(), high.as_ref()) else {
                return None;
            };
            match column_role(surface, expr)? {
                Role::Time => Some(Piece::All(vec![
                    Piece::Time {
                        lower: true,
                        bound: TimeBound::Included(micros_of(lo)?),
                    },
                    Piece::Time {
                        lower: false,
                        bound: TimeBound::Included(micros_of(hi)?),
                    },
                ])),
                Role::Sort => Some(Piece::All(vec![
                    Piece::Sort {
                        lower: true,
                        bound: Bound::Included(sort_key_of(surface, lo)?),
                    },
                    Piece::Sort {
                        lower: false,
                        bound: Bound::Included(sort_key_of(surface, hi)?),
                    },
                ])),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `t > a OR (t = a AND k > b)` (forward) or the same with `<` (backward), in any operand
/// order inside the OR and the AND.
fn cursor(surface: &Surface, l: &Expr, r: &Expr) -> Option<Piece> {
    let try_order = |strict: &Expr, tie: &Expr| -> Option<Piece> {
        let (role, op, tv) = comparison(surface, strict)?;
        if role != Role::Time || !matches!(op, Operator::Gt | Operator::Lt) {
            return None;
        }
        let t = micros_of(&tv)?;
        let Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) = tie
        else {
            return None;
        };
        let parts = [comparison(surface, left)?, comparison(surface, right)?];
        let eq = parts
            .iter()
            .find(|(r, o, _)| *r == Role::Time && *o == Operator::Eq)?;
        let key = parts.iter().find(|(r, _, _)| *r == Role::Sort)?;
        if micros_of(&eq.2)? != t || key.1 != op {
            return None;
        }
        let k = sort_key_of(surface, &key.2)?;
        Some(if op == Operator::Gt {
            Piece::After(TimeBound::Included(t), k)
        } else {
            Piece::Before(TimeBound::Included(t), k)
        })
    };
    try_order(l, r).or_else(|| try_order(r, l))
}

/// The pushed filters of one scan, combined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedFilters {
    /// Only these partitions; `None` means every partition (enumerated from metadata).
    pub partitions: Option<BTreeSet<PartitionKey>>,
    /// Bounds every tier applies.
    pub bounds: ScanBounds,
    /// The filters contradict each other (or need times outside the supported range): the
    /// scan reads nothing.
    pub empty: bool,
}

impl PushedFilters {
    /// Combines filters that were all classified `Exact` (value filters, `Inexact`, are
    /// skipped: see [`value_predicates`]), failing on one that cannot be applied exactly: a parameter whose bound value the stores cannot represent (an
    /// empty raw key, a sub-microsecond time) or a placeholder left unbound. Dropping such a
    /// filter would return rows it excludes.
    pub fn try_from_exprs(
        surface: &Surface,
        filters: &[Expr],
    ) -> Result<Self, super::ProviderError> {
        // Only Exact and Inexact filters reach a scan. The Inexact ones name a value column,
        // and DataFusion may have rewritten them since (`v IN (1, NULL)` into `v = 1 OR
        // NULL`, `NOT (v IN (1, NULL))` into `NULL`); SQL applies them above the scan, so
        // one the scan cannot use is no error. One naming key columns only was classified
        // Exact: dropping it would return rows it excludes.
        // A filter simplified to a constant holds for every row or for none.
        let constant = |f: &Expr| match f {
            Expr::Literal(v, _) => Some(*v == ScalarValue::Boolean(Some(true))),
            _ => None,
        };
        if let Some(bad) = filters.iter().find(|f| {
            piece(surface, f).is_none()
                && constant(f).is_none()
                && (f.column_refs().is_empty() || names_key_columns_only(surface, f))
        }) {
            return Err(super::ProviderError::UnappliableFilter(bad.to_string()));
        }
        let mut out = Self::from_exprs(surface, filters);
        if filters.iter().any(|f| constant(f) == Some(false)) {
            out.empty = true;
        }
        Ok(out)
    }

    /// Combines the filters that [`classify`] accepted; others are ignored (DataFusion
    /// evaluates them above the scan).
    pub fn from_exprs(surface: &Surface, filters: &[Expr]) -> Self {
        let mut out = Self {
            partitions: None,
            bounds: ScanBounds::all(),
            empty: false,
        };
        for f in filters {
            if let Some(p) = piece(surface, f) {
                out.apply(p);
            }
        }
        if out.bounds.time_interval().is_none() {
            out.empty = true;
        }
        if let (Bound::Included(l) | Bound::Excluded(l), Bound::Included(u) | Bound::Excluded(u)) =
            (&out.bounds.sort_lower, &out.bounds.sort_upper)
        {
            let strict = !matches!(
                (&out.bounds.sort_lower, &out.bounds.sort_upper),
                (Bound::Included(_), Bound::Included(_))
            );
            if l > u || (strict && l == u) {
                out.empty = true;
            }
        }
        if out.partitions.as_ref().is_some_and(BTreeSet::is_empty) {
            out.empty = true;
        }
        out
    }

    fn apply(&mut self, p: Piece) {
        let min = EventTime::min_supported().as_micros();
        let end = EventTime::end_of_supported().as_micros();
        match p {
            Piece::All(ps) => ps.into_iter().for_each(|p| self.apply(p)),
            Piece::Partitions(set) => {
                self.partitions = Some(match self.partitions.take() {
                    None => set,
                    Some(old) => old.intersection(&set).cloned().collect(),
                });
            }
            Piece::Time { lower, bound } => {
                // Normalise to an inclusive microsecond bound, then clamp to the range.
                let incl = match (lower, bound) {
                    (_, TimeBound::Included(t)) => t,
                    (true, TimeBound::Excluded(t)) => t.saturating_add(1),
                    (false, TimeBound::Excluded(t)) => t.saturating_sub(1),
                };
                if lower {
                    if incl >= end {
                        self.empty = true;
                    } else if incl > min {
                        let t = EventTime::from_micros(incl).expect("in range");
                        tighten_time(&mut self.bounds.time_lower, t, true);
                    }
                } else if incl < min {
                    self.empty = true;
                } else if incl < end - 1 {
                    let t = EventTime::from_micros(incl).expect("in range");
                    tighten_time(&mut self.bounds.time_upper, t, false);
                }
            }
            Piece::Sort { lower, bound } => {
                let slot = if lower {
                    &mut self.bounds.sort_lower
                } else {
                    &mut self.bounds.sort_upper
                };
                tighten_sort(slot, bound, lower);
            }
            Piece::After(TimeBound::Included(t) | TimeBound::Excluded(t), k) => {
                if t >= end {
                    self.empty = true;
                    return;
                }
                if t < min {
                    return; // every stored row is after it
                }
                let key = ClusteringKey {
                    event_time: EventTime::from_micros(t).expect("in range"),
                    sort_key: k,
                };
                if self.bounds.after.as_ref().is_none_or(|a| key > *a) {
                    self.bounds.after = Some(key);
                }
            }
            Piece::Before(TimeBound::Included(t) | TimeBound::Excluded(t), k) => {
                if t < min {
                    self.empty = true;
                    return;
                }
                if t >= end {
                    return;
                }
                let key = ClusteringKey {
                    event_time: EventTime::from_micros(t).expect("in range"),
                    sort_key: k,
                };
                if self.bounds.before.as_ref().is_none_or(|b| key < *b) {
                    self.bounds.before = Some(key);
                }
            }
        }
    }
}

fn tighten_time(slot: &mut Bound<EventTime>, t: EventTime, lower: bool) {
    let replace = match slot {
        Bound::Unbounded => true,
        Bound::Included(x) | Bound::Excluded(x) => {
            if lower {
                t > *x
            } else {
                t < *x
            }
        }
    };
    if replace {
        *slot = Bound::Included(t);
    }
}

fn tighten_sort(slot: &mut Bound<SortKey>, new: Bound<SortKey>, lower: bool) {
    let (nk, n_excl) = match &new {
        Bound::Included(k) => (k, false),
        Bound::Excluded(k) => (k, true),
        Bound::Unbounded => return,
    };
    let replace = match slot {
        Bound::Unbounded => true,
        Bound::Included(x) | Bound::Excluded(x) => {
            let ord = nk.cmp(x);
            let excl_now = matches!(slot, Bound::Excluded(_));
            match ord {
                std::cmp::Ordering::Equal => n_excl && !excl_now,
                std::cmp::Ordering::Greater => lower,
                std::cmp::Ordering::Less => !lower,
            }
        }
    };
    if replace {
        *slot = new;
    }
}

impl PushedFilters {
    /// The pushed predicates in the surface's column names, with readable literals (for
    /// EXPLAIN): e.g. `[channel_id IN (1), timestamp >= 2024-05-02T00:00:00Z]`.
    pub fn describe(&self, surface: &Surface) -> String {
        let [p, t, k] = surface.key_names();
        let pkey = |b: &[u8]| surface.display_key(Role::Partition, b);
        let key = |b: &[u8]| surface.display_key(Role::Sort, b);
        let mut parts = Vec::new();
        if let Some(set) = &self.partitions {
            let vals: Vec<String> = set.iter().map(|pk| pkey(pk.as_bytes())).collect();
            parts.push(format!("{p} IN ({})", vals.join(", ")));
        }
        match &self.bounds.time_lower {
            Bound::Included(x) => parts.push(format!("{t} >= {x}")),
            Bound::Excluded(x) => parts.push(format!("{t} > {x}")),
            Bound::Unbounded => {}
        }
        match &self.bounds.time_upper {
            Bound::Included(x) => parts.push(format!("{t} <= {x}")),
            Bound::Excluded(x) => parts.push(format!("{t} < {x}")),
            Bound::Unbounded => {}
        }
        match &self.bounds.sort_lower {
            Bound::Included(x) => parts.push(format!("{k} >= {}", key(x.as_bytes()))),
            Bound::Excluded(x) => parts.push(format!("{k} > {}", key(x.as_bytes()))),
            Bound::Unbounded => {}
        }
        match &self.bounds.sort_upper {
            Bound::Included(x) => parts.push(format!("{k} <= {}", key(x.as_bytes()))),
            Bound::Excluded(x) => parts.push(format!("{k} < {}", key(x.as_bytes()))),
            Bound::Unbounded => {}
        }
        if let Some(c) = &self.bounds.after {
            parts.push(format!(
                "({t}, {k}) > ({}, {})",
                c.event_time,
                key(c.sort_key.as_bytes())
            ));
        }
        if let Some(c) = &self.bounds.before {
            parts.push(format!(
                "({t}, {k}) < ({}, {})",
                c.event_time,
                key(c.sort_key.as_bytes())
            ));
        }
        if self.empty {
            parts.push("false".into());
        }
        format!("[{}]", parts.join(", "))
    }
}

#[cfg(test)]
mod tests;
