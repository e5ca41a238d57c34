//! Process-wide logging of the bundled binaries: a `tracing` subscriber on standard error,
//! filtered by `PULPITUM_LOG`, as plain text (coloured only on a terminal) or as one JSON
//! object per line for log collectors.
//!
//! The filter is checked, not guessed: an invalid `PULPITUM_LOG` stops the binary with a
//! message instead of silently logging nothing. A bare word in it must be a level; a target
//! is written `target=level`, so a misspelt level is never read as a target that matches
//! nothing. PostgreSQL server notices (tokio-postgres reports them at INFO, for example
//! "relation ... already exists, skipping" from every migration check) are operator noise,
//! so they are shown only when debug output is asked for, globally or for `tokio_postgres`.
//! OpenDAL's S3 request signer (`reqsign`) prints the credentials it loads at debug, so its
//! level is capped at info and a filter naming it is refused.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The variable holding the filter.
pub const LOG_ENV: &str = "PULPITUM_LOG";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colours only when standard error is a terminal and
    /// `NO_COLOR` is unset.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`, `spans`).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = LoggingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(LoggingError::Format(s.to_string())),
        }
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `PULPITUM_LOG` is not a valid filter.
    #[error("{LOG_ENV}={value:?} is not a valid log filter ({reason}); accepted: a level (off, error, warn, info, debug, trace) and/or target=level pairs separated by commas, e.g. info,pulpitum=debug")]
    Filter {
        /// The variable's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The log format is unknown.
    #[error("--log-format {0:?} is not a log format; accepted: text or json")]
    Format(String),
}

const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// The filter for `spec` (the value of `PULPITUM_LOG`, or `None` for `default_level`), with
/// PostgreSQL notices moved below INFO unless the filter asks for debug output.
pub fn filter(spec: Option<&str>, default_level: &str) -> Result<EnvFilter, LoggingError> {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty());
    let text = spec.unwrap_or(default_level);
    let refuse = |reason: String| LoggingError::Filter {
        value: text.to_string(),
        reason,
    };
    let mut global_debug = false;
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !directive.contains('=') && !directive.contains('[') {
            let level = directive.to_ascii_lowercase();
            if !LEVELS.contains(&level.as_str()) {
                return Err(refuse(format!(
                    "{directive:?} is not a level; write a target as {directive}=LEVEL"
                )));
            }
            global_debug |= level == "debug" || level == "trace";
        }
    }
    // OpenDAL's request signer prints the S3 credentials (secret key included) at debug:
    // its level is capped whatever the filter says, so no filter can leak them.
    if text.contains("reqsign") {
        return Err(refuse(
            "the S3 signer (reqsign) logs credentials at debug, so its level is fixed at info"
                .into(),
        ));
    }
    let mut full = text.to_string();
    if !global_debug && !text.contains("tokio_postgres") {
        full.push_str(",tokio_postgres::connection=warn");
    }
    full.push_str(",reqsign=info,reqsign_core=info,reqsign_aws_v4=info");
    EnvFilter::builder()
        .with_regex(false)
        .parse(&full)
        .map_err(|e| refuse(e.to_string()))
}

/// Installs the subscriber for a binary: `PULPITUM_LOG` (else `default_level`), written to
/// standard error in `format`. Call once, before anything logs.
pub fn init(default_level: &str, format: LogFormat) -> Result<(), LoggingError> {
    let spec = std::env::var(LOG_ENV).ok();
    let filter = filter(spec.as_deref(), default_level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second subscriber (tests that call twice) is not an error worth stopping for.
    let _ = match format {
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colour).try_init()
        }
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_checked() {
        for ok in [
            "info",
            "warn,pulpitum=debug",
            "pulpitum::archiver=trace",
            "off",
            " ",
        ] {
            assert!(filter(Some(ok), "info").is_ok(), "{ok}");
        }
        for bad in [
            "verbose",
            "info,pulpitum=loud",
            "infoo",
            "pulpitum=debug,chatty",
        ] {
            let err = filter(Some(bad), "info").unwrap_err().to_string();
            assert!(
                err.contains("PULPITUM_LOG") && err.contains("accepted"),
                "{err}"
            );
        }
        assert!("json".parse::<LogFormat>().is_ok());
        assert!("xml".parse::<LogFormat>().is_err());
    }

    #[test]
    fn postgres_notices_need_debug() {
        let shown = |spec: Option<&str>| filter(spec, "info").unwrap().to_string();
        assert!(shown(None).contains("tokio_postgres::connection=warn"));
        assert!(shown(Some("pulpitum=debug")).contains("tokio_postgres::connection=warn"));
        assert!(!shown(Some("debug")).contains("tokio_postgres::connection=warn"));
        assert!(!shown(Some("info,tokio_postgres=debug")).contains("connection=warn"));
    }
}
