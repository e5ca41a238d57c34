//! The session variables a client may set, and nothing else.
//!
//! `SET` and `RESET` change the connection's own session only (each connection has its own
//! [`SessionContext`], see [`super::session`]). A name is matched after PostgreSQL's
//! normalisation (case-insensitive, quoted or not, `SET TIME ZONE` as `timezone`), against
//! an allow-list; anything else, DataFusion's settings under any spelling included, is
//! refused with SQLSTATE 42501 or, for a value the variable does not take, 22023. A value
//! is taken only when it has the meaning PostgreSQL gives it here: `client_encoding` is
//! UTF8 and nothing else, `standard_conforming_strings` is on, `search_path` may only name
//! the schemas the server resolves (`public`, `pg_catalog`, `"$user"`).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::array::timezone::Tz;
use datafusion::execution::FunctionRegistry;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{
    Expr, ObjectName, Reset, ResetStatement, Set, Statement, Value,
};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError};

/// Metadata key of the client's own statement timeout, in milliseconds (the key
/// datafusion-postgres's `SHOW statement_timeout` reads).
pub const TIMEOUT_KEY: &str = "statement_timeout_ms";

/// The change a `SET`/`RESET` makes: metadata entries to write (`None` removes one), the
/// session's time zone, and the parameter statuses to report to the client.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Connection metadata (datafusion-postgres and pgwire read formats and the timeout
    /// from it).
    pub metadata: Vec<(String, Option<String>)>,
    /// A new time zone for the session (`Some(None)`: back to UTC).
    pub time_zone: Option<Option<String>>,
    /// `ParameterStatus` messages to send (name, value), as PostgreSQL reports them.
    pub report: Vec<(String, String)>,
}

fn bad_value(name: &str, value: &str, accepted: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "22023".into(),
        format!("invalid value for parameter \"{name}\": \"{value}\" ({accepted})"),
    )))
}

fn refused(name: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "42501".into(),
        format!(
            "parameter \"{name}\" cannot be set over the wire; the settable ones are {}",
            ALLOWED.join(", ")
        ),
    )))
}

/// The variables a client may set.
pub const ALLOWED: [&str; 11] = [
    "application_name",
    "bytea_output",
    "client_encoding",
    "client_min_messages",
    "datestyle",
    "extra_float_digits",
    "intervalstyle",
    "search_path",
    "standard_conforming_strings",
    "statement_timeout",
    "timezone",
];

/// A variable's name as PostgreSQL matches it: every part lower-cased, joined by dots.
fn normalise(name: &ObjectName) -> String {
    name.0
        .iter()
        .map(|p| match p.as_ident() {
            Some(i) => i.value.to_lowercase(),
            None => p.to_string().to_lowercase(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// A value as text; `None` for `DEFAULT`.
fn value_text(values: &[Expr]) -> Option<String> {
    fn one(v: &Expr) -> String {
        match v {
            Expr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                Value::Number(n, _) => n.clone(),
                Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            Expr::Identifier(i) => i.value.clone(),
            Expr::UnaryOp { op, expr } => format!("{op}{}", one(expr)),
            other => other.to_string(),
        }
    }
    let text = values.iter().map(one).collect::<Vec<_>>().join(", ");
    (!text.eq_ignore_ascii_case("default")).then_some(text)
}

/// The name PostgreSQL reports a variable's changes under, for those it reports.
fn reported(name: &str) -> Option<&'static str> {
    Some(match name {
        "application_name" => "application_name",
        "datestyle" => "DateStyle",
        "intervalstyle" => "IntervalStyle",
        "timezone" => "TimeZone",
        "client_encoding" => "client_encoding",
        "standard_conforming_strings" => "standard_conforming_strings",
        _ => return None,
    })
}

/// A statement timeout in PostgreSQL's syntax (a number of milliseconds, or a number and
/// one of `ms`, `s`, `min`, `h`, `d`) as milliseconds; 0 means none.
fn timeout_ms(value: &str) -> Option<u64> {
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// The value a variable takes, checked and put in canonical form.
fn canonical(name: &str, value: &str) -> Result<String, PgWireError> {
    let lower = value.trim().to_ascii_lowercase();
    match name {
        "application_name" => Ok(value.chars().take(63).collect()),
        "bytea_output" => match lower.as_str() {
            "hex" | "escape" => Ok(lower),
            _ => Err(bad_value(name, value, "hex or escape")),
        },
        "client_encoding" => match lower.replace(['-', '_'], "").as_str() {
            "utf8" | "unicode" => Ok("UTF8".into()),
            _ => Err(bad_value(name, value, "this server speaks UTF8 only")),
        },
        "client_min_messages" => match lower.as_str() {
            "debug5" | "debug4" | "debug3" | "debug2" | "debug1" | "debug" | "log" | "notice"
            | "warning" | "error" => Ok(lower),
            _ => Err(bad_value(
                name,
                value,
                "debug5..debug1, log, notice, warning, error",
            )),
        },
        "datestyle" => {
            let mut style = "ISO";
            let mut order = "YMD";
            for part in lower.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                match part {
                    "iso" => style = "ISO",
                    "sql" => style = "SQL",
                    "german" => style = "German",
                    "postgres" => style = "Postgres",
                    "ymd" => order = "YMD",
                    "mdy" | "us" | "noneuropean" => order = "MDY",
                    "dmy" | "euro" | "european" => order = "DMY",
                    _ => {
                        return Err(bad_value(
                            name,
                            value,
                            "ISO, SQL, German or Postgres, and YMD, MDY or DMY",
                        ))
                    }
                }
            }
            Ok(format!("{style}, {order}"))
        }
        "extra_float_digits" => match lower.parse::<i8>() {
            Ok(n) if (-15..=3).contains(&n) => Ok(n.to_string()),
            _ => Err(bad_value(name, value, "an integer from -15 to 3")),
        },
        "intervalstyle" => match lower.as_str() {
            "postgres" | "postgres_verbose" | "sql_standard" | "iso_8601" => Ok(lower),
            _ => Err(bad_value(
                name,
                value,
                "postgres, postgres_verbose, sql_standard or iso_8601",
            )),
        },
        "search_path" => {
            let ok = lower
                .split(',')
                .map(str::trim)
                .all(|s| matches!(s.trim_matches('"'), "public" | "pg_catalog" | "$user" | ""));
            if ok {
                Ok(value.trim().to_string())
            } else {
                Err(bad_value(
                    name,
                    value,
                    "tables resolve in public and pg_catalog only",
                ))
            }
        }
        "standard_conforming_strings" => match lower.as_str() {
            "on" | "true" | "1" | "yes" => Ok("on".into()),
            _ => Err(bad_value(name, value, "this server always conforms: on")),
        },
        "statement_timeout" => match timeout_ms(value) {
            Some(ms) => Ok(ms.to_string()),
            None => Err(bad_value(
                name,
                value,
                "milliseconds, or a number with ms, s, min, h or d",
            )),
        },
        "timezone" => {
            let tz = value.trim();
            let utc = matches!(lower.as_str(), "utc" | "etc/utc" | "z" | "local");
            if utc {
                return Ok("UTC".into());
            }
            Tz::from_str(tz)
                .map(|_| tz.to_string())
                .map_err(|_| bad_value(name, value, "an IANA name such as Europe/Paris, or +HH:MM"))
        }
        _ => Err(refused(name)),
    }
}

/// Applies one variable's new value (`None`: its default) to a [`Change`].
fn assign(change: &mut Change, name: &str, value: Option<&str>) -> Result<(), PgWireError> {
    if !ALLOWED.contains(&name) {
        return Err(refused(name));
    }
    let canonical = value.map(|v| canonical(name, v)).transpose()?;
    match name {
        "statement_timeout" => {
            let ms = canonical.filter(|ms| ms != "0");
            change.metadata.push((TIMEOUT_KEY.into(), ms));
        }
        "timezone" => {
            let tz = canonical.filter(|t| t != "UTC");
            change.time_zone = Some(tz.clone());
            change.metadata.push(("timezone".into(), tz.clone()));
            change
                .report
                .push(("TimeZone".into(), tz.unwrap_or_else(|| "UTC".into())));
        }
        _ => {
            if let (Some(shown), Some(v)) = (reported(name), &canonical) {
                change.report.push((shown.into(), v.clone()));
            }
            change.metadata.push((name.to_string(), canonical));
        }
    }
    Ok(())
}

/// What a `SET` or `RESET` statement changes, or why it is refused.
pub fn change(statement: &Statement) -> Result<Change, PgWireError> {
    let mut change = Change::default();
    match statement {
        Statement::Set(Set::SingleAssignment {
            hivevar: false,
            variable,
            values,
            scope: _,
        }) => {
            let name = normalise(variable);
            let name = if name == "time zone" {
                "timezone".into()
            } else {
                name
            };
            assign(&mut change, &name, value_text(values).as_deref())?;
        }
        Statement::Set(Set::SetTimeZone { value, .. }) => {
            assign(
                &mut change,
                "timezone",
                value_text(std::slice::from_ref(value)).as_deref(),
            )?;
        }
        Statement::Reset(ResetStatement { reset }) => match reset {
            Reset::ALL => {
                for name in ALLOWED {
                    assign(&mut change, name, None)?;
                }
            }
            Reset::ConfigurationParameter(name) => {
                assign(&mut change, &normalise(name), None)?;
            }
        },
        other => {
            let text = other.to_string();
            return Err(super::guard::refused_statement(&text));
        }
    }
    Ok(change)
}

/// The value `SHOW name` answers for a variable of the allow-list (`None` for any other
/// name): the connection's own, else the server's default.
pub fn show(name: &str, metadata: &HashMap<String, String>) -> Option<String> {
    let name = if name == "time zone" {
        "timezone"
    } else {
        name
    };
    if !ALLOWED.contains(&name) {
        return None;
    }
    let own = match name {
        "statement_timeout" => metadata.get(TIMEOUT_KEY).map(|ms| format!("{ms}ms")),
        other => metadata.get(other).cloned(),
    };
    Some(own.unwrap_or_else(|| {
        match name {
            "bytea_output" => "hex",
            "client_encoding" => "UTF8",
            "client_min_messages" => "notice",
            "datestyle" => "ISO, YMD",
            "extra_float_digits" => "1",
            "intervalstyle" => "postgres",
            "search_path" => "\"$user\", public",
            "standard_conforming_strings" => "on",
            "statement_timeout" => "0",
            "timezone" => "UTC",
            _ => "",
        }
        .to_string()
    }))
}

/// Applies a change to the connection: its metadata and its own session's time zone.
pub fn apply(change: &Change, metadata: &mut HashMap<String, String>, ctx: &SessionContext) {
    for (k, v) in &change.metadata {
        match v {
            Some(v) => {
                metadata.insert(k.clone(), v.clone());
            }
            None => {
                metadata.remove(k);
            }
        }
    }
    if let Some(tz) = &change.time_zone {
        let state = ctx.state_ref();
        let mut state = state.write();
        state.config_mut().options_mut().execution.time_zone = tz.clone();
        // Functions that read the time zone when they are made (now(), current_time())
        // are made again, as DataFusion's own SET does.
        let options = state.config().options().clone();
        let updated: Vec<_> = state
            .scalar_functions()
            .values()
            .filter_map(|f| f.inner().with_updated_config(&options).map(Arc::new))
            .collect();
        for f in updated {
            // Replacing a function by its own name cannot fail.
            let _ = state.register_udf(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn of(sql: &str) -> Result<Change, String> {
        let s = Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0);
        change(&s).map_err(|e| match e {
            PgWireError::UserError(i) => format!("{} {}", i.code, i.message),
            o => o.to_string(),
        })
    }

    #[test]
    fn datafusion_settings_are_refused_however_spelled() {
        for sql in [
            "SET datafusion.execution.batch_size = 1",
            "SET \"datafusion\".execution.batch_size = 1",
            "SET \"DataFusion\".\"execution\".batch_size TO 1",
            "SET SESSION datafusion.execution.time_zone = '+05:00'",
            "SET LOCAL datafusion.optimizer.max_passes = 0",
            "RESET datafusion.execution.batch_size",
            "SET work_mem = '1GB'",
            "SET role = admin",
        ] {
            let e = of(sql).unwrap_err();
            assert!(e.starts_with("42501"), "{sql}: {e}");
        }
    }

    #[test]
    fn allowed_variables_take_only_meaningful_values() {
        let c = of("SET \"TimeZone\" = 'America/New_York'").unwrap();
        assert_eq!(c.time_zone, Some(Some("America/New_York".into())));
        assert_eq!(
            c.report,
            vec![("TimeZone".into(), "America/New_York".into())]
        );
        let c = of("SET TIME ZONE 'UTC'").unwrap();
        assert_eq!(c.time_zone, Some(None));
        assert!(of("SET timezone = 'Mars/Olympus'")
            .unwrap_err()
            .starts_with("22023"));
        let c = of("SET statement_timeout = '2s'").unwrap();
        assert_eq!(c.metadata, vec![(TIMEOUT_KEY.into(), Some("2000".into()))]);
        let c = of("SET statement_timeout TO 0").unwrap();
        assert_eq!(c.metadata, vec![(TIMEOUT_KEY.into(), None)]);
        assert!(of("SET statement_timeout = 'soon'")
            .unwrap_err()
            .starts_with("22023"));
        let c = of("SET datestyle = iso, mdy").unwrap();
        assert_eq!(
            c.metadata,
            vec![("datestyle".into(), Some("ISO, MDY".into()))]
        );
        assert!(of("SET client_encoding = 'LATIN1'")
            .unwrap_err()
            .starts_with("22023"));
        assert!(of("SET client_encoding = 'UTF8'").is_ok());
        assert!(of("SET standard_conforming_strings = off")
            .unwrap_err()
            .starts_with("22023"));
        assert!(of("SET search_path = other")
            .unwrap_err()
            .starts_with("22023"));
        assert!(of("SET search_path = \"$user\", public").is_ok());
        let c = of("SET application_name TO DEFAULT").unwrap();
        assert_eq!(c.metadata, vec![("application_name".into(), None)]);
        let mut meta = HashMap::new();
        assert_eq!(show("timezone", &meta).as_deref(), Some("UTC"));
        assert_eq!(show("time zone", &meta).as_deref(), Some("UTC"));
        meta.insert(TIMEOUT_KEY.to_string(), "2000".to_string());
        assert_eq!(show("statement_timeout", &meta).as_deref(), Some("2000ms"));
        assert_eq!(show("datafusion.execution.batch_size", &meta), None);
        let c = of("RESET ALL").unwrap();
        assert_eq!(c.metadata.len(), ALLOWED.len());
        assert_eq!(c.time_zone, Some(None));
    }
}
