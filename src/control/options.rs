//! Policy options as an operator writes them (`archive_after = '90 days'`), parsed into a
//! [`PolicyUpdate`]. Every refusal names the option and says what it accepts.
//!
//! Durations take one or more `<number> <unit>` terms (`'90 days'`, `'1 day 12 hours'`,
//! `'36h'`), in the units PostgreSQL's interval input and ClickHouse's TTL clauses share
//! for fixed lengths: microseconds up to weeks. Months and years are refused rather than
//! guessed: their length varies, and a boundary that moves by days would surprise whoever
//! set it. The one exception is `retain_for` ([`parse_retention`]), where "keep five years"
//! is how the rule is written: there a year is 365.25 days and a month 30 days, the lengths
//! PostgreSQL's `EXTRACT(EPOCH FROM INTERVAL ...)` gives them, so the cutoff never lands
//! inside the last year's leap day.

use std::time::Duration;

use crate::archive::PayloadFormat;
use crate::store::PolicyUpdate;

use super::ControlError;

/// The longest duration a policy accepts (100 years).
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Every option a table policy has, in the order the docs list them.
pub const OPTIONS: [&str; 5] = [
    "archive_after",
    "format",
    "cleanup_delay",
    "paused",
    "retain_for",
];

/// Parses a duration option's value.
pub fn parse_duration(option: &str, raw: &str) -> Result<Duration, ControlError> {
    parse_length(option, raw, false)
}

/// Parses `retain_for`: a duration, where years (365.25 days) and months (30 days) are
/// accepted too. It must be at least [`MIN_RETENTION`]: a retention of minutes is a typo
/// more often than a policy, and it would remove every bucket but the one being written.
pub fn parse_retention(option: &str, raw: &str) -> Result<Duration, ControlError> {
    let d = parse_length(option, raw, true)?;
    if d < MIN_RETENTION {
        return Err(ControlError::BadOption {
            option: option.to_string(),
            value: raw.to_string(),
            reason: "must be at least 1 day (RESET (retain_for) keeps everything; \
                     DELETE removes rows sooner)"
                .into(),
        });
    }
    Ok(d)
}

/// The shortest `retain_for` accepted.
pub const MIN_RETENTION: Duration = Duration::from_secs(86_400);

fn parse_length(option: &str, raw: &str, calendar: bool) -> Result<Duration, ControlError> {
    let bad = |reason: String| ControlError::BadOption {
        option: option.to_string(),
        value: raw.to_string(),
        reason,
    };
    let text = raw.trim().to_ascii_lowercase();
    if text.is_empty() {
        return Err(bad("is empty; write a duration such as '90 days'".into()));
    }
    // Split "36h" into "36 h" and "1day" into "1 day": tokens alternate number, unit.
    let mut spaced = String::with_capacity(text.len() + 8);
    let mut prev_digit = false;
    for c in text.chars() {
        let digit = c.is_ascii_digit() || c == '.' || c == '-';
        if !spaced.is_empty() && digit != prev_digit && !c.is_whitespace() {
            spaced.push(' ');
        }
        spaced.push(c);
        prev_digit = digit;
    }
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    if !tokens.len().is_multiple_of(2) {
        return Err(bad(
            "needs a unit after every number, e.g. '90 days' or '12 hours'".into(),
        ));
    }
    let mut total = 0f64;
    for pair in tokens.chunks(2) {
        let n: f64 = pair[0].parse().map_err(|_| {
            bad(format!(
                "{:?} is not a number; write e.g. '90 days'",
                pair[0]
            ))
        })?;
        let unit = match pair[1] {
            "us" | "usec" | "usecs" | "microsecond" | "microseconds" => 1e-6,
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1e-3,
            "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 604_800.0,
            "mon" | "mons" | "month" | "months" if calendar => 30.0 * 86_400.0,
            "y" | "year" | "years" if calendar => 365.25 * 86_400.0,
            "mon" | "mons" | "month" | "months" | "y" | "year" | "years" => {
                return Err(bad(format!(
                    "{:?} has no fixed length; use days (e.g. '365 days')",
                    pair[1]
                )))
            }
            other => {
                let units = if calendar {
                    "seconds, minutes, hours, days, weeks, months or years"
                } else {
                    "seconds, minutes, hours, days or weeks"
                };
                return Err(bad(format!("unknown unit {other:?}; use {units}")));
            }
        };
        total += n * unit;
    }
    if !total.is_finite() || total < 0.0 || total > MAX_DURATION.as_secs_f64() {
        return Err(bad(format!(
            "must be between 0 and {} days",
            MAX_DURATION.as_secs() / 86_400
        )));
    }
    Ok(Duration::from_micros((total * 1e6).round() as u64))
}

/// Parses a boolean option's value (`true`/`false`, `on`/`off`, `1`/`0`, as PostgreSQL's
/// storage parameters do).
pub fn parse_bool(option: &str, raw: &str) -> Result<bool, ControlError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(ControlError::BadOption {
            option: option.to_string(),
            value: raw.to_string(),
            reason: "is not a boolean; use true or false".into(),
        }),
    }
}

/// Parses a payload format option's value.
pub fn parse_format(option: &str, raw: &str) -> Result<String, ControlError> {
    raw.trim()
        .to_ascii_lowercase()
        .parse::<PayloadFormat>()
        .map(|f| f.to_string())
        .map_err(|_| ControlError::BadOption {
            option: option.to_string(),
            value: raw.to_string(),
            reason: "is not a payload format; use parquet or json".into(),
        })
}

fn known(option: &str) -> Result<&'static str, ControlError> {
    let lower = option.to_ascii_lowercase();
    OPTIONS
        .into_iter()
        .find(|o| *o == lower)
        .ok_or_else(|| ControlError::UnknownOption {
            option: option.to_string(),
        })
}

/// `SET (option = value, ...)`: every option named is set; an option named twice is refused.
pub fn set_options(pairs: &[(String, String)]) -> Result<PolicyUpdate, ControlError> {
    let mut u = PolicyUpdate::default();
    let mut seen = Vec::new();
    for (option, value) in pairs {
        let name = known(option)?;
        if seen.contains(&name) {
            return Err(ControlError::RepeatedOption {
                option: name.to_string(),
            });
        }
        seen.push(name);
        match name {
            "archive_after" => u.archive_after = Some(Some(parse_duration(name, value)?)),
            "format" => u.format = Some(Some(parse_format(name, value)?)),
            "cleanup_delay" => u.cleanup_delay = Some(Some(parse_duration(name, value)?)),
            "retain_for" => u.retain_for = Some(Some(parse_retention(name, value)?)),
            _ => u.paused = Some(parse_bool(name, value)?),
        }
    }
    Ok(u)
}

/// `RESET (option, ...)`: every option named goes back to the archiver's setting (`paused`
/// to false).
pub fn reset_options(options: &[String]) -> Result<PolicyUpdate, ControlError> {
    let mut u = PolicyUpdate::default();
    for option in options {
        match known(option)? {
            "archive_after" => u.archive_after = Some(None),
            "format" => u.format = Some(None),
            "cleanup_delay" => u.cleanup_delay = Some(None),
            "retain_for" => u.retain_for = Some(None),
            _ => u.paused = Some(false),
        }
    }
    Ok(u)
}

/// A duration as the shortest exact text in the largest unit that divides it (`90 days`,
/// `36 hours`, `1500 ms`), the form the system tables and the CLI print.
pub fn format_duration(d: Duration) -> String {
    let us = d.as_micros();
    for (size, unit) in [
        (604_800_000_000u128, "weeks"),
        (86_400_000_000, "days"),
        (3_600_000_000, "hours"),
        (60_000_000, "minutes"),
        (1_000_000, "seconds"),
        (1_000, "ms"),
    ] {
        if us >= size && us.is_multiple_of(size) {
            let n = us / size;
            if unit == "weeks" {
                // Days read better than weeks for retention ("90 days", not "12.9 weeks").
                return format!("{} days", n * 7);
            }
            let unit = if n == 1 {
                unit.trim_end_matches('s')
            } else {
                unit
            };
            return format!("{n} {unit}");
        }
    }
    if us == 0 {
        return "0 seconds".into();
    }
    format!("{us} us")
}

/// A `retain_for` as it was most likely written: whole years (365.25 days, the length
/// [`parse_retention`] gives a year) as `5 years`, anything else as [`format_duration`]
/// prints it. Only retention prints years, because only retention accepts them back.
pub fn format_retention(d: Duration) -> String {
    const YEAR_US: u128 = 31_557_600_000_000;
    let us = d.as_micros();
    if us >= YEAR_US && us.is_multiple_of(YEAR_US) {
        let n = us / YEAR_US;
        return if n == 1 {
            "1 year".into()
        } else {
            format!("{n} years")
        };
    }
    format_duration(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_prints_in_the_units_it_is_parsed_in() {
        for text in ["5 years", "1 year", "90 days", "36 hours", "18 months"] {
            let d = parse_retention("retain_for", text).unwrap();
            let shown = format_retention(d);
            assert_eq!(parse_retention("retain_for", &shown).unwrap(), d, "{text}");
        }
        assert_eq!(
            format_retention(parse_retention("r", "5 years").unwrap()),
            "5 years"
        );
        assert_eq!(
            format_retention(parse_retention("r", "1 year").unwrap()),
            "1 year"
        );
        assert_eq!(
            format_retention(parse_retention("r", "18 months").unwrap()),
            "540 days"
        );
        for short in ["1 microsecond", "0 days", "23 hours"] {
            let e = parse_retention("retain_for", short)
                .unwrap_err()
                .to_string();
            assert!(e.contains("at least 1 day"), "{short}: {e}");
        }
        assert!(parse_retention("retain_for", "1 day").is_ok());
        let e = parse_retention("retain_for", "5 fortnights")
            .unwrap_err()
            .to_string();
        assert!(e.contains("months or years"), "{e}");
    }

    #[test]
    fn retention_takes_years_and_months_and_refuses_zero() {
        let day = 86_400u64;
        assert_eq!(
            parse_retention("retain_for", "5 years").unwrap(),
            Duration::from_secs(5 * 365 * day + 5 * day / 4)
        );
        assert_eq!(
            parse_retention("retain_for", "18 months").unwrap(),
            Duration::from_secs(18 * 30 * day)
        );
        assert!(parse_retention("retain_for", "0 days").is_err());
        // Other options still refuse calendar units.
        assert!(parse_duration("archive_after", "1 year").is_err());
        let u = set_options(&[("retain_for".into(), "2 years".into())]).unwrap();
        assert_eq!(
            u.retain_for,
            Some(Some(Duration::from_secs(2 * 365 * day + day / 2)))
        );
        assert_eq!(
            reset_options(&["retain_for".into()]).unwrap().retain_for,
            Some(None)
        );
    }

    #[test]
    fn durations_in_the_forms_operators_write() {
        let d = |s| parse_duration("archive_after", s).unwrap();
        assert_eq!(d("90 days"), Duration::from_secs(90 * 86_400));
        assert_eq!(d("1 day 12 hours"), Duration::from_secs(36 * 3_600));
        assert_eq!(d("36h"), Duration::from_secs(36 * 3_600));
        assert_eq!(d("2 Weeks"), Duration::from_secs(14 * 86_400));
        assert_eq!(d("1.5 hours"), Duration::from_secs(5_400));
        assert_eq!(d("0 s"), Duration::ZERO);
        assert_eq!(d("250 ms"), Duration::from_millis(250));
    }

    #[test]
    fn bad_durations_name_the_option_and_the_fix() {
        for (raw, needle) in [
            ("90", "needs a unit"),
            ("3 months", "no fixed length"),
            ("1 year", "no fixed length"),
            ("ten days", "not a number"),
            ("5 fortnights", "unknown unit"),
            ("", "is empty"),
            ("-1 days", "between 0 and"),
            ("40000 days", "between 0 and"),
        ] {
            let e = parse_duration("archive_after", raw)
                .unwrap_err()
                .to_string();
            assert!(e.contains("archive_after"), "{raw}: {e}");
            assert!(e.contains(needle), "{raw}: {e}");
        }
    }

    #[test]
    fn set_and_reset_build_updates_and_refuse_unknown_or_repeated_options() {
        let u = set_options(&[
            ("archive_after".into(), "90 days".into()),
            ("FORMAT".into(), "JSON".into()),
            ("paused".into(), "on".into()),
        ])
        .unwrap();
        assert_eq!(
            u.archive_after,
            Some(Some(Duration::from_secs(90 * 86_400)))
        );
        assert_eq!(u.format, Some(Some("json".into())));
        assert_eq!(u.cleanup_delay, None);
        assert_eq!(u.paused, Some(true));
        let e = set_options(&[("archive_afterr".into(), "1 day".into())]).unwrap_err();
        assert!(e.to_string().contains("archive_afterr"), "{e}");
        assert!(e.to_string().contains("archive_after, format"), "{e}");
        let e = set_options(&[
            ("paused".into(), "true".into()),
            ("paused".into(), "false".into()),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("more than once"), "{e}");
        let e = set_options(&[("format".into(), "csv".into())]).unwrap_err();
        assert!(e.to_string().contains("format"), "{e}");
        let e = set_options(&[("paused".into(), "maybe".into())]).unwrap_err();
        assert!(e.to_string().contains("paused"), "{e}");
        let r = reset_options(&["archive_after".into(), "paused".into()]).unwrap();
        assert_eq!(r.archive_after, Some(None));
        assert_eq!(r.paused, Some(false));
        assert_eq!(r.format, None);
    }

    #[test]
    fn durations_print_in_their_largest_exact_unit() {
        assert_eq!(format_duration(Duration::from_secs(90 * 86_400)), "90 days");
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1 day");
        assert_eq!(format_duration(Duration::from_secs(36 * 3_600)), "36 hours");
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1500 ms");
        assert_eq!(format_duration(Duration::ZERO), "0 seconds");
        for s in ["90 days", "36 hours", "1500 ms", "1 day", "7 days"] {
            let d = parse_duration("x", s).unwrap();
            assert_eq!(format_duration(d), s);
        }
    }
}
