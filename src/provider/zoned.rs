//! Times written without an offset are read in the session's time zone.
//!
//! PostgreSQL reads `WHERE timestamp >= '2026-01-01 09:00:00'` in the session's `TimeZone`: a
//! client in New York (JDBC sends the JVM's zone at login) means 14:00 UTC. DataFusion casts
//! the string to the column's type, `timestamptz` in UTC, and so reads it as 09:00 UTC: the
//! same query returned other rows than on PostgreSQL as soon as a session set a zone.
//!
//! [`SessionZoneStrings`] is an analyzer rule that runs after type coercion and before
//! [`super::ExactTimeLiterals`]: each string literal cast to a time with a zone is replaced
//! by the instant it names in the session's zone, written with an explicit UTC offset
//! (`2026-01-01T14:00:00.000000000Z`), which every later step (the cast, the exact
//! comparison of finer literals, pruning) reads the same whatever zone it assumes.
//! [`in_session_zone`] is the same rewrite for a value bound to a prepared statement's
//! parameter ([`crate::prepared`]), which is how the wire server runs ad-hoc pages.
//!
//! A string with its own offset or `Z` keeps its instant. A local time that a change of
//! offset skips (02:30 on the day New York springs forward) is read with the offset in force
//! before the change, and one that occurs twice (01:30 on the day it falls back) as the
//! later of the two, standard time, as PostgreSQL does. With no session zone set nothing is
//! rewritten (strings are read in UTC, as before), nor are `TIMESTAMP '...'` literals, which
//! DataFusion types as times without a zone (a documented difference, see docs/sql.md).

use std::str::FromStr;

use chrono::{DateTime, Duration, FixedOffset, LocalResult, Offset, SecondsFormat, TimeZone, Utc};
use datafusion::arrow::array::timezone::Tz;
use datafusion::arrow::compute::kernels::cast_utils::string_to_datetime;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result as DFResult};
use datafusion::logical_expr::expr::{Cast, TryCast};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};
use datafusion::optimizer::analyzer::AnalyzerRule;
use datafusion::scalar::ScalarValue;

/// The analyzer rule; add it after DataFusion's own rules and before
/// [`super::ExactTimeLiterals`]. [`crate::session::session`] does.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionZoneStrings;

impl AnalyzerRule for SessionZoneStrings {
    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> DFResult<LogicalPlan> {
        let Some(name) = config.execution.time_zone.as_deref() else {
            return Ok(plan);
        };
        let Ok(zone) = Tz::from_str(name) else {
            return Ok(plan);
        };
        plan.transform_up_with_subqueries(|node| {
            let schema = merge_schema(&node.inputs());
            // A rewritten expression keeps its name: a projection's column named after the
            // string as written stays so named (the plan's schema says so).
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                let saved = names.save(&e);
                e.transform_up(|e| rewrite(e, &zone, name, &schema))
                    .map(|t| t.update_data(|e| saved.restore(e)))
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "pulpitum_session_zone_strings"
    }
}

/// A string cast to a time with a zone, read in the session's `zone` (named `zone_name`): a
/// literal made explicit (`CAST('2026-01-05T05:00:00.000000000Z' AS ...)`), any other string
/// (a column of an `INSERT ... SELECT`) cast through a time in the session's zone first,
/// which arrow reads local strings in (but refuses a local time the clock skips or repeats:
/// a known difference, docs/sql.md). A non-literal cast to the session's own zone reads its
/// strings there already and is left alone, which also keeps the rule idempotent.
fn rewrite(e: Expr, zone: &Tz, zone_name: &str, schema: &DFSchema) -> DFResult<Transformed<Expr>> {
    let (Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field })) = &e else {
        return Ok(Transformed::no(e));
    };
    let DataType::Timestamp(unit, Some(target)) = field.data_type() else {
        return Ok(Transformed::no(e));
    };
    let operand = match expr.as_ref() {
        // Even for a cast to the session's own zone: arrow refuses a local time the clock
        // skips or shows twice, which PostgreSQL reads (break-it finding).
        Expr::Literal(value, metadata) => match in_session_zone(value, zone) {
            Some(explicit) => Expr::Literal(explicit, metadata.clone()),
            None => return Ok(Transformed::no(e)),
        },
        _ if target.as_ref() == zone_name => return Ok(Transformed::no(e)),
        other => match other.get_type(schema) {
            Ok(DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8) => {
                let local = DataType::Timestamp(*unit, Some(zone_name.into()));
                let other = Box::new(other.clone());
                // A TRY_CAST stays one: a string that does not parse is NULL, not an error.
                match &e {
                    Expr::TryCast(_) => Expr::TryCast(TryCast::new(other, local)),
                    _ => Expr::Cast(Cast::new(other, local)),
                }
            }
            _ => return Ok(Transformed::no(e)),
        },
    };
    let operand = Box::new(operand);
    Ok(Transformed::yes(match e {
        Expr::Cast(c) => Expr::Cast(Cast { expr: operand, ..c }),
        Expr::TryCast(c) => Expr::TryCast(TryCast { expr: operand, ..c }),
        other => other,
    }))
}

/// `value`, a string naming a time, as the instant it names in `zone` written with an
/// explicit offset; `None` when it is not a string, does not parse (the cast reports that),
/// or lies outside the years 1 to 9999 (left as written).
pub fn in_session_zone(value: &ScalarValue, zone: &Tz) -> Option<ScalarValue> {
    let text = match value {
        ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => s.trim(),
        ScalarValue::LargeUtf8(Some(s)) => s.trim(),
        _ => return None,
    };
    let instant = instant_in(text, zone)?;
    if !(1..=9999).contains(&chrono::Datelike::year(&instant)) {
        return None;
    }
    let explicit = instant.to_rfc3339_opts(SecondsFormat::Nanos, true);
    Some(match value {
        ScalarValue::Utf8View(_) => ScalarValue::Utf8View(Some(explicit)),
        ScalarValue::LargeUtf8(_) => ScalarValue::LargeUtf8(Some(explicit)),
        _ => ScalarValue::Utf8(Some(explicit)),
    })
}

/// The instant `text` names, a local time (no offset of its own) read in `zone`.
fn instant_in(text: &str, zone: &Tz) -> Option<DateTime<Utc>> {
    // Parsed twice, as if the local zone were UTC and then an hour east of it: a string
    // with its own offset names the same instant both times, a local one an hour apart.
    let as_utc = string_to_datetime(&Utc, text).ok()?;
    let east = FixedOffset::east_opt(3600)?;
    let as_east = string_to_datetime(&east, text).ok()?;
    if as_utc == as_east {
        return Some(as_utc);
    }
    local_instant(as_utc.naive_utc(), zone)
}

/// The instant of the local time `local` in `zone`: PostgreSQL's reading of a time that the
/// clock skipped or showed twice (module doc). `None` only outside chrono's range.
pub fn local_instant(local: chrono::NaiveDateTime, zone: &Tz) -> Option<DateTime<Utc>> {
    match zone.from_local_datetime(&local) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        // Twice on the clock: the later instant (standard time where the repeat is the end
        // of summer time).
        LocalResult::Ambiguous(_, later) => Some(later.with_timezone(&Utc)),
        // Skipped by the clock: read with the offset in force before the change.
        LocalResult::None => {
            let before = zone
                .offset_from_utc_datetime(&(local - Duration::days(1)))
                .fix();
            Some((local - Duration::seconds(i64::from(before.local_minus_utc()))).and_utc())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, zone: &str) -> Option<String> {
        let zone = Tz::from_str(zone).unwrap();
        match in_session_zone(&ScalarValue::Utf8(Some(text.into())), &zone)? {
            ScalarValue::Utf8(Some(s)) => Some(s),
            other => panic!("{other:?}"),
        }
    }

    /// Local times take the session's offset, PostgreSQL's way around gaps and repeats;
    /// strings with their own offset keep their instant; what does not parse is left alone.
    #[test]
    fn local_times_are_read_in_the_zone() {
        let cases = [
            (
                "2026-01-01 09:00:00",
                "America/New_York",
                "2026-01-01T14:00:00.000000000Z",
            ),
            (
                "2026-01-01",
                "Asia/Kolkata",
                "2025-12-31T18:30:00.000000000Z",
            ),
            (
                "2026-07-01T09:00:00.123456789",
                "America/New_York",
                "2026-07-01T13:00:00.123456789Z",
            ),
            (
                "2026-01-01 09:00:00Z",
                "America/New_York",
                "2026-01-01T09:00:00.000000000Z",
            ),
            (
                "2026-01-01 09:00:00+05:30",
                "America/New_York",
                "2026-01-01T03:30:00.000000000Z",
            ),
            (
                "2026-01-01 09:00:00",
                "+02:00",
                "2026-01-01T07:00:00.000000000Z",
            ),
            // Spring forward in New York (2026-03-08 02:00 EST to 03:00 EDT): 02:30 with
            // the offset before, EST.
            (
                "2026-03-08 02:30:00",
                "America/New_York",
                "2026-03-08T07:30:00.000000000Z",
            ),
            // Fall back (2026-11-01 02:00 EDT to 01:00 EST): 01:30 as EST, the later.
            (
                "2026-11-01 01:30:00",
                "America/New_York",
                "2026-11-01T06:30:00.000000000Z",
            ),
        ];
        for (text, zone, want) in cases {
            assert_eq!(read(text, zone).as_deref(), Some(want), "{text} in {zone}");
        }
        assert_eq!(read("not a time", "America/New_York"), None);
        assert_eq!(read("0000-06-01 00:00:00", "America/New_York"), None);
        let zone = Tz::from_str("UTC").unwrap();
        assert_eq!(in_session_zone(&ScalarValue::Int64(Some(1)), &zone), None);
    }

    /// The rule rewrites only a string cast to a time with a zone, and only when the
    /// session has a zone.
    #[test]
    fn the_rule_rewrites_strings_cast_to_zoned_times() {
        use datafusion::arrow::datatypes::TimeUnit;
        use datafusion::logical_expr::{lit, LogicalPlanBuilder};
        let zoned = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let naive = DataType::Timestamp(TimeUnit::Microsecond, None);
        let plan = LogicalPlanBuilder::empty(true)
            .project(vec![
                Expr::Cast(Cast::new(
                    Box::new(lit("2026-01-01 09:00:00")),
                    zoned.clone(),
                ))
                .alias("a"),
                Expr::Cast(Cast::new(Box::new(lit("2026-01-01 09:00:00")), naive)).alias("b"),
                Expr::TryCast(TryCast::new(Box::new(lit("2026-01-01")), zoned)).alias("c"),
            ])
            .unwrap()
            .build()
            .unwrap();
        let mut config = ConfigOptions::new();
        let unchanged = SessionZoneStrings.analyze(plan.clone(), &config).unwrap();
        assert_eq!(unchanged, plan);
        config.execution.time_zone = Some("America/New_York".into());
        let shown = SessionZoneStrings
            .analyze(plan, &config)
            .unwrap()
            .display_indent()
            .to_string();
        assert!(shown.contains("2026-01-01T14:00:00.000000000Z"), "{shown}");
        assert!(shown.contains("2026-01-01T05:00:00.000000000Z"), "{shown}");
        assert!(shown.contains("Utf8(\"2026-01-01 09:00:00\")"), "{shown}");
    }
}
