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
//!
//! A StartupMessage's parameters go through the same rules ([`startup`]): a known variable
//! with a value it does not take refuses the connection (FATAL 22023, as PostgreSQL refuses
//! a bad startup option), a name that is not a variable a client may set refuses it with
//! 42704, and what is taken is reported back in the login's ParameterStatus messages
//! ([`Reported`]). Without this, `intervalstyle=nonsense` at the start broke every later
//! statement of the connection.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::array::timezone::Tz;
use datafusion::execution::FunctionRegistry;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{
    Expr, ObjectName, Reset, ResetStatement, Set, Statement, Value,
};
use datafusion_postgres::pgwire::api::auth::{
    DefaultServerParameterProvider, ServerParameterProvider,
};
use datafusion_postgres::pgwire::api::ClientInfo;
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
            // No conversion, as PostgreSQL does for SQL_ASCII (what libpq's `auto` picks in
            // the C locale, so psql sends it).
            "sqlascii" => Ok("SQL_ASCII".into()),
            _ => Err(bad_value(
                name,
                value,
                "this server speaks UTF8 only (SQL_ASCII: bytes as they are)",
            )),
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
            const TAKES: &str = "an IANA name such as Europe/Paris, or a number of hours east \
                                 of UTC such as 5.5 or -3";
            // A number is hours east of UTC, as PostgreSQL reads it.
            if let Ok(hours) = tz.parse::<f64>() {
                let minutes = (hours * 60.0).round();
                if !hours.is_finite() || minutes.abs() > 15.0 * 60.0 || minutes != hours * 60.0 {
                    return Err(bad_value(name, value, TAKES));
                }
                let (sign, minutes) = (if minutes < 0.0 { '-' } else { '+' }, minutes.abs() as u32);
                return Ok(format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60));
            }
            // Any other signed offset is a POSIX zone to PostgreSQL, where `+05:30` is five and
            // a half hours WEST of UTC; chrono reads it east. Refused rather than read the
            // other way round from PostgreSQL.
            if tz.starts_with(['+', '-']) {
                return Err(bad_value(name, value, TAKES));
            }
            Tz::from_str(tz)
                .map(|_| tz.to_string())
                .map_err(|_| bad_value(name, value, TAKES))
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

/// Startup parameters PostgreSQL takes that are not variables: who, where, and the
/// connection's kind.
const CONNECTION_PARAMETERS: [&str; 2] = ["user", "database"];

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".into(),
        code.into(),
        message,
    )))
}

/// A variable's error at the start, where every error is FATAL.
fn at_start(e: PgWireError) -> PgWireError {
    match e {
        PgWireError::UserError(mut info) => {
            info.severity = "FATAL".into();
            PgWireError::UserError(info)
        }
        other => other,
    }
}

/// The `name=value` settings of a StartupMessage's `options` (PostgreSQL's `-c name=value`,
/// `-cname=value` and `--name=value`; a backslash escapes the next character, a space
/// included); anything else in it refuses the connection.
fn options(text: &str) -> Result<Vec<(String, String)>, PgWireError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_ascii_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let invalid = |w: &str| {
        fatal(
            "42601",
            format!(
                "invalid command-line argument in startup option \"options\": \"{w}\" (only \
                 -c name=value and --name=value are taken)"
            ),
        )
    };
    let mut out = Vec::new();
    let mut words = words.into_iter();
    while let Some(w) = words.next() {
        let setting = if w == "-c" {
            words.next().ok_or_else(|| invalid(&w))?
        } else if let Some(rest) = w.strip_prefix("--") {
            rest.replace('-', "_")
        } else if let Some(rest) = w.strip_prefix("-c") {
            rest.to_string()
        } else {
            return Err(invalid(&w));
        };
        let (name, value) = setting.split_once('=').ok_or_else(|| invalid(&setting))?;
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

/// Checks a StartupMessage's parameters with the rules of `SET`: the parameters pgwire is
/// to keep (`user`, `database`, and each variable under its own name, in canonical form)
/// and the change to apply to the session at the login, or the FATAL refusal.
pub fn startup<'a>(
    params: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(Vec<(String, String)>, Change), PgWireError> {
    let mut kept = Vec::new();
    let mut settings = Vec::new();
    for (name, value) in params {
        let lower = name.to_ascii_lowercase();
        if CONNECTION_PARAMETERS.contains(&lower.as_str()) {
            kept.push((lower, value.to_string()));
        } else if lower == "options" {
            settings.extend(options(value)?);
        } else if lower == "replication" {
            if !matches!(
                value.to_ascii_lowercase().as_str(),
                "false" | "off" | "no" | "0"
            ) {
                return Err(fatal(
                    "0A000",
                    "replication connections are not supported by this server".into(),
                ));
            }
        } else if lower.starts_with("_pq_.") {
            // Protocol extensions: none is supported, and a client that asks must cope
            // without (PostgreSQL reports them unsupported; pgwire does not negotiate).
        } else {
            settings.push((name.to_string(), value.to_string()));
        }
    }
    let mut change = Change::default();
    for (name, value) in settings {
        let lower = name.to_ascii_lowercase();
        if !ALLOWED.contains(&lower.as_str()) {
            return Err(fatal(
                "42704",
                format!(
                    "unrecognized configuration parameter \"{name}\" in the startup packet; a \
                     client may set {}",
                    ALLOWED.join(", ")
                ),
            ));
        }
        assign(&mut change, &lower, Some(&value)).map_err(at_start)?;
    }
    for (name, value) in &change.metadata {
        if let Some(v) = value {
            kept.push((name.clone(), v.clone()));
        }
    }
    Ok((kept, change))
}

/// The ParameterStatus messages of a login: pgwire's defaults, with the values the client
/// set in its StartupMessage (kept in the connection's metadata by [`startup`]).
#[derive(Default)]
pub struct Reported {
    defaults: DefaultServerParameterProvider,
}

/// The variables a login reports, by their metadata key and their reported name.
const REPORTED_AT_LOGIN: [(&str, &str); 4] = [
    ("client_encoding", "client_encoding"),
    ("datestyle", "DateStyle"),
    ("intervalstyle", "IntervalStyle"),
    ("timezone", "TimeZone"),
];

impl Reported {
    /// The values the client set that differ from what pgwire reports by default.
    pub fn overrides(metadata: &HashMap<String, String>) -> Vec<(String, String)> {
        REPORTED_AT_LOGIN
            .iter()
            .filter_map(|(key, shown)| {
                metadata
                    .get(*key)
                    .map(|v| (shown.to_string(), v.to_string()))
            })
            .collect()
    }
}

impl ServerParameterProvider for Reported {
    fn server_parameters<C: ClientInfo>(&self, client: &C) -> Option<HashMap<String, String>> {
        let mut params = self.defaults.server_parameters(client)?;
        params.extend(Self::overrides(client.metadata()));
        Some(params)
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
        // Numbers are hours east, as PostgreSQL reads them; signed offsets, which PostgreSQL
        // reads as POSIX zones (west), are refused.
        for (given, taken) in [
            ("-3", "-03:00"),
            ("5.5", "+05:30"),
            ("'+05.75'", "+05:45"),
            ("'+05'", "+05:00"),
        ] {
            let c = of(&format!("SET TIME ZONE {given}")).unwrap();
            assert_eq!(c.time_zone, Some(Some(taken.into())), "{given}");
        }
        for refused in ["'+05:30'", "'-0800'", "'16'", "'NaN'", "'5.1234'"] {
            assert!(
                of(&format!("SET TIME ZONE {refused}")).is_err(),
                "{refused}"
            );
        }
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

    fn start(params: &[(&str, &str)]) -> Result<(Vec<(String, String)>, Change), String> {
        startup(params.iter().copied()).map_err(|e| match e {
            PgWireError::UserError(i) => format!("{} {} {}", i.severity, i.code, i.message),
            o => o.to_string(),
        })
    }

    #[test]
    fn startup_parameters_follow_the_rules_of_set() {
        // What JDBC, libpq (psql, psycopg), node-postgres and tokio-postgres send.
        let (kept, change) = start(&[
            ("user", "alice"),
            ("database", "db"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "Europe/Paris"),
            ("extra_float_digits", "3"),
            ("application_name", "psql"),
            ("statement_timeout", "5000"),
            (
                "options",
                "-c search_path=public --intervalstyle=iso_8601 -cbytea_output=escape",
            ),
            ("replication", "false"),
            ("_pq_.something", "x"),
        ])
        .unwrap();
        let kept: HashMap<_, _> = kept.into_iter().collect();
        assert_eq!(kept["user"], "alice");
        assert_eq!(kept["datestyle"], "ISO, YMD");
        assert_eq!(kept["timezone"], "Europe/Paris");
        assert_eq!(kept["extra_float_digits"], "3");
        assert_eq!(kept[TIMEOUT_KEY], "5000");
        assert_eq!(kept["intervalstyle"], "iso_8601");
        assert_eq!(kept["bytea_output"], "escape");
        assert_eq!(kept["search_path"], "public");
        assert!(!kept.contains_key("replication") && !kept.contains_key("_pq_.something"));
        assert_eq!(change.time_zone, Some(Some("Europe/Paris".into())));
        assert!(start(&[("client_encoding", "SQL_ASCII")]).is_ok());
        for (name, value, code) in [
            ("client_encoding", "LATIN1", "FATAL 22023"),
            ("extra_float_digits", "-128", "FATAL 22023"),
            ("IntervalStyle", "nonsense", "FATAL 22023"),
            ("bytea_output", "nonsense", "FATAL 22023"),
            ("statement_timeout_ms", "1", "FATAL 42704"),
            ("work_mem", "1GB", "FATAL 42704"),
            ("datafusion.execution.batch_size", "1", "FATAL 42704"),
            ("options", "-d 5", "FATAL 42601"),
            ("options", "-c work_mem=1GB", "FATAL 42704"),
            ("options", "-c intervalstyle=bad", "FATAL 22023"),
            ("replication", "database", "FATAL 0A000"),
        ] {
            let e = start(&[("user", "a"), (name, value)]).unwrap_err();
            assert!(e.starts_with(code), "{name}={value}: {e}");
        }
        let e = start(&[("bytea_output", "nonsense")]).unwrap_err();
        assert!(
            e.contains("bytea_output") && e.contains("hex or escape"),
            "{e}"
        );
    }
}
