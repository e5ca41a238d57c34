//! Bound parameter values, checked around arrow-pg's decoding of them.
//!
//! arrow-pg (0.16) decodes a binary value by its type without checking its length (an
//! `interval` of fewer than 16 bytes panics), multiplies without checking (an `int8` bound
//! where a timestamp is compared overflows: a panic in a debug build, a silently wrapped,
//! wrong value in a release build), and turns a timestamp it cannot represent into NULL (a
//! comparison with NULL matches nothing: wrong rows, silently). So:
//!
//! - [`check`], before decoding: a binary value of a fixed-width type must have exactly its
//!   width (22P03); an integer bound where a timestamp is expected, or an interval, must fit
//!   the conversion arrow-pg makes of it (22008);
//! - [`check_decoded`], after: a value the client sent may not have become NULL (22008);
//! - [`local_times_in_zone`], after: a local time for a `timestamptz` parameter (text
//!   without an offset, or a binary `timestamp`) is read in the session's time zone, as
//!   PostgreSQL reads it (pgwire reads it in UTC);
//! - [`guarded`]: a panic that still happens in decoding or executing fails the statement
//!   instead of the connection;
//! - [`typed_limits`], at Parse: a parameter that is a `LIMIT` or `OFFSET` is a `bigint`,
//!   as PostgreSQL types it (DataFusion leaves it untyped, and a driver that sent it with
//!   type 0 had it read as text: `XX000`).

use std::future::Future;
use std::panic::AssertUnwindSafe;

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::Placeholder;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion_postgres::arrow_pg::datatypes::into_pg_type;
use datafusion_postgres::pgwire::api::portal::Portal;
use datafusion_postgres::pgwire::api::Type;
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use futures::FutureExt;

fn error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        code.into(),
        message,
    )))
}

/// The exact binary width of a fixed-width type.
fn width(t: &Type) -> Option<usize> {
    Some(match *t {
        Type::BOOL | Type::CHAR => 1,
        Type::INT2 => 2,
        Type::INT4 | Type::OID | Type::FLOAT4 | Type::DATE => 4,
        Type::INT8 | Type::FLOAT8 | Type::TIME | Type::TIMESTAMP | Type::TIMESTAMPTZ => 8,
        Type::INTERVAL | Type::UUID => 16,
        _ => return None,
    })
}

/// The integer a parameter holds, binary or text.
fn integer(t: &Type, binary: bool, bytes: &[u8]) -> Option<i64> {
    if binary {
        match (t, bytes.len()) {
            (&Type::INT2, 2) => Some(i16::from_be_bytes([bytes[0], bytes[1]]).into()),
            (&Type::INT4, 4) => Some(i32::from_be_bytes(bytes.try_into().ok()?).into()),
            (&Type::INT8, 8) => Some(i64::from_be_bytes(bytes.try_into().ok()?)),
            _ => None,
        }
    } else {
        std::str::from_utf8(bytes).ok()?.trim().parse().ok()
    }
}

/// Checks each parameter of `portal` against the type it will be decoded as, before it is.
/// `inferred` are the types the plan expects, `$1` first.
pub(super) fn check<S>(portal: &Portal<S>, inferred: &[Option<DataType>]) -> PgWireResult<()> {
    for (i, value) in portal.parameters.iter().enumerate() {
        let Some(bytes) = value else { continue };
        let target = inferred.get(i).cloned().flatten();
        let pg_type = match portal.statement.parameter_types.get(i).cloned().flatten() {
            Some(t) => t,
            None => match target.as_ref().map(into_pg_type) {
                Some(Ok(t)) => t,
                _ => continue,
            },
        };
        let binary = portal.parameter_format.is_binary(i);
        let n = i + 1;
        if binary {
            if let Some(w) = width(&pg_type) {
                if bytes.len() != w {
                    return Err(error(
                        "22P03",
                        format!(
                            "incorrect binary data format in bind parameter {n}: {} takes {w} \
                             bytes, {} were sent",
                            pg_type.name(),
                            bytes.len()
                        ),
                    ));
                }
            }
        }
        // An integer bound to a timestamp is scaled to the timestamp's unit.
        let factor = match &target {
            Some(DataType::Timestamp(TimeUnit::Millisecond, _)) => 1_000,
            Some(DataType::Timestamp(TimeUnit::Microsecond, _)) => 1_000_000,
            Some(DataType::Timestamp(TimeUnit::Nanosecond, _)) => 1_000_000_000,
            _ => 1,
        };
        if factor > 1 {
            if let Some(v) = integer(&pg_type, binary, bytes) {
                if v.checked_mul(factor).is_none() {
                    return Err(error(
                        "22008",
                        format!("bind parameter {n}: {v} is out of range for a timestamp"),
                    ));
                }
            }
        }
        // An interval's microseconds become nanoseconds.
        if pg_type == Type::INTERVAL {
            let fits = if binary {
                let micros = i64::from_be_bytes(bytes[..8].try_into().expect("16 bytes"));
                micros.checked_mul(1_000).is_some()
            } else {
                // A run of more than 12 digits may hold more hours or seconds than the
                // conversion can carry; no interval a client means needs one.
                bytes
                    .split(|b| !b.is_ascii_digit())
                    .all(|run| run.len() <= 12)
            };
            if !fits {
                return Err(error(
                    "22008",
                    format!("bind parameter {n}: interval out of range"),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses decoded values that are NULL where the client sent a value.
pub(super) fn check_decoded<S>(portal: &Portal<S>, values: &[ScalarValue]) -> PgWireResult<()> {
    for (i, (sent, decoded)) in portal.parameters.iter().zip(values).enumerate() {
        if sent.is_some() && decoded.is_null() {
            return Err(error(
                "22008",
                format!(
                    "bind parameter {}: the value is out of the range this server can compare \
                     ({})",
                    i + 1,
                    decoded.data_type()
                ),
            ));
        }
    }
    Ok(())
}

/// Each parameter of a time with a zone is read again in the session's `zone`
/// ([`crate::provider::zoned`]), as PostgreSQL reads it: one sent as text without an offset
/// of its own, and one sent in binary as a `timestamp` without a zone (psycopg's naive
/// `datetime`), which pgwire both read in UTC. `types` are the parameters' types, `values`
/// their decoded values, replaced in place.
pub(super) fn local_times_in_zone<S>(
    portal: &Portal<S>,
    types: &[DataType],
    values: &mut [ScalarValue],
    zone: Option<&datafusion::arrow::array::timezone::Tz>,
) {
    let Some(zone) = zone else {
        return;
    };
    for (i, (t, value)) in types.iter().zip(values.iter_mut()).enumerate() {
        if !matches!(t, DataType::Timestamp(_, Some(_))) || value.is_null() {
            continue;
        }
        let instant = if portal.parameter_format.is_binary(i) {
            let declared = portal.statement.parameter_types.get(i).cloned().flatten();
            if declared != Some(Type::TIMESTAMP) {
                continue;
            }
            // Decoded as the instant of its local time in UTC: the local time again.
            let Ok(ScalarValue::TimestampMicrosecond(Some(us), _)) =
                value.cast_to(&DataType::Timestamp(TimeUnit::Microsecond, None))
            else {
                continue;
            };
            let Some(local) = chrono::DateTime::from_timestamp_micros(us) else {
                continue;
            };
            crate::provider::zoned::local_instant(local.naive_utc(), zone).map(|at| {
                ScalarValue::TimestampMicrosecond(Some(at.timestamp_micros()), Some("UTC".into()))
            })
        } else {
            let Some(Some(raw)) = portal.parameters.get(i) else {
                continue;
            };
            let Ok(text) = std::str::from_utf8(raw) else {
                continue;
            };
            let text = ScalarValue::Utf8(Some(text.to_string()));
            crate::provider::zoned::in_session_zone(&text, zone)
        };
        if let Some(v) = instant.and_then(|v| v.cast_to(t).ok()) {
            *value = v;
        }
    }
}

/// Runs `work`, turning a panic inside it into an error of the statement.
pub(super) async fn guarded<T>(work: impl Future<Output = PgWireResult<T>>) -> PgWireResult<T> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(r) => r,
        Err(_) => Err(super::handlers::internal_error()),
    }
}

/// `plan` with each untyped parameter that is a whole `LIMIT` or `OFFSET` typed `bigint`
/// (PostgreSQL's type for them), so that it is described to the client, decoded and bound
/// as one. A parameter used anywhere else in the statement is left as it was, to take its
/// type from that use (`WHERE a >= $1 LIMIT $1` with an `int` column: typing it here
/// would conflict, break-it finding).
pub(super) fn typed_limits(plan: LogicalPlan) -> PgWireResult<LogicalPlan> {
    let elsewhere = used_outside_limits(&plan).map_err(|e| PgWireError::ApiError(Box::new(e)))?;
    crate::prepared::map_limits(plan, |e| match e {
        Expr::Placeholder(Placeholder { id, field: None }) if !elsewhere.contains(id) => {
            let field = Arc::new(Field::new(id.clone(), DataType::Int64, true));
            Some(Expr::Placeholder(Placeholder {
                id: id.clone(),
                field: Some(field),
            }))
        }
        _ => None,
    })
    .map_err(|e| PgWireError::ApiError(Box::new(e)))
}

/// The parameters used anywhere but as a whole `LIMIT` or `OFFSET`.
fn used_outside_limits(
    plan: &LogicalPlan,
) -> datafusion::common::Result<std::collections::HashSet<String>> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut ids = std::collections::HashSet::new();
    let mut note = |e: &Expr| {
        e.apply(|e| {
            if let Expr::Placeholder(Placeholder { id, .. }) = e {
                ids.insert(id.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .map(|_| ())
    };
    plan.apply_with_subqueries(|p| {
        match p {
            // A limit's own expressions are its skip and fetch: a bare parameter there is
            // a limit's; anything else is noted.
            LogicalPlan::Limit(l) => {
                for e in l.skip.iter().chain(l.fetch.iter()) {
                    if !matches!(**e, Expr::Placeholder(_)) {
                        note(e)?;
                    }
                }
            }
            _ => {
                p.apply_expressions(|e| {
                    note(e)?;
                    Ok(TreeNodeRecursion::Continue)
                })?;
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn types(sql: &str) -> Vec<(String, Option<DataType>)> {
        let plan = SessionContext::new()
            .state()
            .create_logical_plan(sql)
            .await
            .unwrap();
        let mut t: Vec<_> = typed_limits(plan)
            .unwrap()
            .get_parameter_types()
            .unwrap()
            .into_iter()
            .collect();
        t.sort();
        t
    }

    #[tokio::test]
    async fn limit_and_offset_parameters_are_bigints() {
        let int = Some(DataType::Int64);
        assert_eq!(
            types("SELECT * FROM (VALUES (1), (2)) t(a) LIMIT $1 OFFSET $2").await,
            vec![("$1".into(), int.clone()), ("$2".into(), int.clone())]
        );
        // In a subquery too; a parameter typed by its use keeps that type.
        assert_eq!(
            types(
                "SELECT * FROM (SELECT a FROM (VALUES (1), (2)) t(a) \
                 WHERE a > $1 LIMIT $2) s"
            )
            .await,
            vec![
                ("$1".into(), Some(DataType::Int64)),
                ("$2".into(), int.clone())
            ]
        );
        // A parameter used elsewhere too takes its type from there (break-it finding: an
        // `int` column's comparison conflicted with the limit's `bigint`).
        assert_eq!(
            types(
                "SELECT a FROM (VALUES (CAST(1 AS INT)), (CAST(2 AS INT))) t(a) \
                 WHERE a >= $1 ORDER BY a LIMIT $1"
            )
            .await,
            vec![("$1".into(), Some(DataType::Int32))]
        );
        // A parameter that is only part of the limit's expression is left to DataFusion.
        assert_eq!(
            types("SELECT 1 LIMIT $1::INT").await,
            vec![("$1".into(), None)]
        );
    }
}
