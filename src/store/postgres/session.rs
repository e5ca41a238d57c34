//! What a new pooled connection is checked for and given before the store uses it.
//!
//! The settings that every server knows (`search_path`, `default_transaction_isolation`)
//! travel as startup options; the fence's safety rests on the second, and a connection
//! pooler (pgbouncer with `ignore_startup_parameters = options`, for one) may drop them
//! without a word. So each new connection reads back what the session really has, in one
//! round trip with the server's version, and is refused unless its default isolation is
//! `SERIALIZABLE` and its schema is the configured one. Settings that only some servers know
//! are chosen from that version and `SET` afterwards: `plan_cache_mode` exists on PostgreSQL
//! from 12 and on CockroachDB from 24.2, `jit` on PostgreSQL from 11 only, and an older
//! server refuses a startup option it does not know, which would refuse every connection.

use std::fmt;

use tokio_postgres::Client;

use crate::store::StoreError;

/// The query whose one row [`check`] reads: version, isolation default, current schema.
pub const PROBE_SQL: &str = "SELECT version(), current_setting('default_transaction_isolation'), \
     current_schema()::TEXT";

/// The server behind a connection, from `SELECT version()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// PostgreSQL `major.minor` (development and release-candidate builds count as their
    /// major with minor 0).
    Postgres {
        /// Major version (10 and later number majors with one figure).
        major: u32,
        /// Minor version.
        minor: u32,
    },
    /// CockroachDB `vYEAR.RELEASE.PATCH`.
    Cockroach {
        /// The release year's two digits (23 in v23.2.4).
        year: u32,
        /// The release of that year (2 in v23.2.4).
        release: u32,
        /// The patch (4 in v23.2.4).
        patch: u32,
    },
    /// Something else that speaks the protocol: only settings every server has are used.
    Unknown,
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Postgres { major, minor } => write!(f, "PostgreSQL {major}.{minor}"),
            Self::Cockroach {
                year,
                release,
                patch,
            } => write!(f, "CockroachDB v{year}.{release}.{patch}"),
            Self::Unknown => f.write_str("an unrecognised server"),
        }
    }
}

/// Reads the server from the text of `SELECT version()`, for example `PostgreSQL 15.4
/// (Debian ...) on x86_64-pc-linux-gnu, ...` or `CockroachDB CCL v23.2.4
/// (x86_64-pc-linux-gnu, built ...)`.
pub fn parse_version(text: &str) -> Server {
    let mut words = text.split_whitespace();
    match words.next() {
        Some("PostgreSQL") => {
            let Some(number) = words.next() else {
                return Server::Unknown;
            };
            let mut parts = number.split('.');
            let major = leading_number(parts.next().unwrap_or(""));
            let minor = parts.next().map_or(Some(0), leading_number);
            match (major, minor) {
                (Some(major), Some(minor)) => Server::Postgres { major, minor },
                _ => Server::Unknown,
            }
        }
        Some("CockroachDB") => {
            // "CCL" or "OSS" comes before the version; take the first word that is one.
            let Some(number) = words.find_map(|w| w.strip_prefix('v')) else {
                return Server::Unknown;
            };
            let mut parts = number.split('.');
            let mut next = || parts.next().and_then(leading_number);
            match (next(), next(), next()) {
                (Some(year), Some(release), patch) => Server::Cockroach {
                    year,
                    release,
                    patch: patch.unwrap_or(0),
                },
                _ => Server::Unknown,
            }
        }
        _ => Server::Unknown,
    }
}

/// The digits a version part starts with (`17devel` and `0-alpha.5` have some after them).
fn leading_number(part: &str) -> Option<u32> {
    let end = part
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(part.len());
    part[..end].parse().ok()
}

impl Server {
    /// Whether the server knows the `plan_cache_mode` session variable. PostgreSQL added it
    /// in 12; CockroachDB documents it from v24.2 (it was back-ported to some v23.2 and v24.1
    /// patch releases, which one is not pinned down here, so those are left alone).
    pub fn has_plan_cache_mode(self) -> bool {
        match self {
            Self::Postgres { major, .. } => major >= 12,
            Self::Cockroach { year, release, .. } => (year, release) >= (24, 2),
            Self::Unknown => false,
        }
    }

    /// Whether the server compiles expressions with LLVM (PostgreSQL from 11, where `jit`
    /// exists; CockroachDB has no such setting).
    pub fn has_jit(self) -> bool {
        matches!(self, Self::Postgres { major, .. } if major >= 11)
    }

    /// The `SET` statements a new session of this server gets (in this order); `generic_plans`
    /// is [`super::PgStoreConfig::generic_plans`].
    ///
    /// JIT is turned off: every store statement is a short read or write of a few index
    /// ranges, and a generic plan's estimates (made without the parameters) pass
    /// `jit_above_cost` on a large registry, so PostgreSQL compiled a discovery that does
    /// 4 ms of work for 26 ms per execution (6 million buckets, docs/sizing.md).
    pub fn session_settings(self, generic_plans: bool) -> Vec<&'static str> {
        let mut out = Vec::new();
        if generic_plans && self.has_plan_cache_mode() {
            out.push("SET plan_cache_mode = force_generic_plan");
        }
        if self.has_jit() {
            out.push("SET jit = off");
        }
        out
    }
}

/// What a new session reported about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The server.
    pub server: Server,
    /// `default_transaction_isolation` as the server spells it.
    pub isolation: String,
    /// `current_schema()`, `None` when no schema of the search path exists.
    pub schema: Option<String>,
}

/// Refuses a session that is not safe to run the store on: a default isolation weaker than
/// `SERIALIZABLE` (single-statement appends and reads rely on it to take part in the fence),
/// or another schema than the configured one (the store would read and write another
/// store's tables).
pub fn verify(probe: &Probe, schema: Option<&str>) -> Result<(), StoreError> {
    if !probe.isolation.trim().eq_ignore_ascii_case("serializable") {
        return Err(StoreError::UnsafeSession {
            setting: "default_transaction_isolation",
            value: probe.isolation.clone(),
            required: "serializable".into(),
        });
    }
    if let Some(want) = schema {
        if probe.schema.as_deref() != Some(want) {
            return Err(StoreError::UnsafeSession {
                setting: "search_path",
                value: probe.schema.clone().unwrap_or_else(|| "(no schema)".into()),
                required: want.to_string(),
            });
        }
    }
    Ok(())
}

/// Reads, checks and completes a new session (see the module documentation).
pub async fn prepare(
    client: &Client,
    schema: Option<&str>,
    generic_plans: bool,
) -> Result<Server, StoreError> {
    let backend = |e: tokio_postgres::Error| StoreError::Backend {
        operation: "connect",
        detail: super::describe(&e),
    };
    let row = client.query_one(PROBE_SQL, &[]).await.map_err(backend)?;
    let probe = Probe {
        server: parse_version(row.try_get(0).map_err(backend)?),
        isolation: row.try_get(1).map_err(backend)?,
        schema: row.try_get(2).map_err(backend)?,
    };
    verify(&probe, schema)?;
    let settings = probe.server.session_settings(generic_plans);
    if !settings.is_empty() {
        client
            .batch_execute(&settings.join("; "))
            .await
            .map_err(backend)?;
    }
    Ok(probe.server)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = "SET plan_cache_mode = force_generic_plan";
    const JIT: &str = "SET jit = off";

    #[test]
    fn versions_and_the_settings_chosen_for_them() {
        let cases: &[(&str, Server, bool)] = &[
            (
                "CockroachDB CCL v23.1.14 (x86_64-pc-linux-gnu, built 2024/01/16 18:34:12, go1.21.5)",
                Server::Cockroach { year: 23, release: 1, patch: 14 },
                false,
            ),
            (
                "CockroachDB CCL v23.2.4 (x86_64-pc-linux-gnu, built 2024/04/08 19:49:20, go1.21.9 X:nocoverageredesign)",
                Server::Cockroach { year: 23, release: 2, patch: 4 },
                false,
            ),
            (
                "CockroachDB OSS v24.1.0 (aarch64-unknown-linux-gnu, built 2024/05/15 21:28:49, go1.22.3)",
                Server::Cockroach { year: 24, release: 1, patch: 0 },
                false,
            ),
            (
                "CockroachDB CCL v24.2.0-alpha.2 (x86_64-pc-linux-gnu, built 2024/06/20, go1.22.4)",
                Server::Cockroach { year: 24, release: 2, patch: 0 },
                true,
            ),
            (
                "CockroachDB CCL v24.2.3 (x86_64-pc-linux-gnu, built 2024/09/23 22:30:53, go1.22.5)",
                Server::Cockroach { year: 24, release: 2, patch: 3 },
                true,
            ),
            (
                "CockroachDB CCL v25.1.2 (x86_64-pc-linux-gnu, built 2025/03/10, go1.22.8)",
                Server::Cockroach { year: 25, release: 1, patch: 2 },
                true,
            ),
            (
                "CockroachDB CCL v25.4.0 (x86_64-pc-linux-gnu, built 2025/11/03, go1.23.12)",
                Server::Cockroach { year: 25, release: 4, patch: 0 },
                true,
            ),
            (
                "PostgreSQL 11.22 on x86_64-pc-linux-gnu, compiled by gcc (GCC) 4.8.5 20150623, 64-bit",
                Server::Postgres { major: 11, minor: 22 },
                false,
            ),
            (
                "PostgreSQL 12.0 on x86_64-pc-linux-gnu, compiled by gcc, 64-bit",
                Server::Postgres { major: 12, minor: 0 },
                true,
            ),
            (
                "PostgreSQL 15.4 (Debian 15.4-1.pgdg120+1) on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14) 12.2.0, 64-bit",
                Server::Postgres { major: 15, minor: 4 },
                true,
            ),
            (
                "PostgreSQL 17.2 on aarch64-unknown-linux-gnu, compiled by clang version 16.0.6, 64-bit",
                Server::Postgres { major: 17, minor: 2 },
                true,
            ),
            (
                "PostgreSQL 17devel on x86_64-pc-linux-gnu",
                Server::Postgres { major: 17, minor: 0 },
                true,
            ),
            ("MySQL 8.0.36", Server::Unknown, false),
            ("CockroachDB CCL (no version)", Server::Unknown, false),
            ("", Server::Unknown, false),
        ];
        for (text, server, plans) in cases {
            let parsed = parse_version(text);
            assert_eq!(parsed, *server, "{text}");
            assert_eq!(parsed.has_plan_cache_mode(), *plans, "{text}");
            // JIT off on every PostgreSQL these cases name (all from 11), nowhere else.
            let jit: Vec<&str> = match parsed {
                Server::Postgres { .. } => vec![JIT],
                _ => vec![],
            };
            let mut want: Vec<&str> = if *plans { vec![PLAN] } else { vec![] };
            want.extend(&jit);
            assert_eq!(parsed.session_settings(true), want, "{text}");
            assert_eq!(parsed.session_settings(false), jit, "{text}");
        }
        assert!(!Server::Postgres {
            major: 10,
            minor: 23
        }
        .has_jit());
    }

    #[test]
    fn weak_isolation_and_a_foreign_schema_are_refused() {
        let probe = |isolation: &str, schema: Option<&str>| Probe {
            server: Server::Postgres {
                major: 17,
                minor: 0,
            },
            isolation: isolation.into(),
            schema: schema.map(str::to_string),
        };
        assert!(verify(&probe("serializable", Some("s")), Some("s")).is_ok());
        assert!(verify(&probe("SERIALIZABLE", Some("public")), None).is_ok());
        for weak in ["read committed", "repeatable read", "read uncommitted", ""] {
            match verify(&probe(weak, Some("s")), Some("s")) {
                Err(StoreError::UnsafeSession { setting, value, .. }) => {
                    assert_eq!(setting, "default_transaction_isolation");
                    assert_eq!(value, weak);
                }
                other => panic!("{weak}: {other:?}"),
            }
        }
        match verify(&probe("serializable", Some("public")), Some("s")) {
            Err(StoreError::UnsafeSession {
                setting,
                value,
                required,
            }) => {
                assert_eq!(
                    (setting, value.as_str(), required.as_str()),
                    ("search_path", "public", "s")
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            verify(&probe("serializable", None), Some("s")),
            Err(StoreError::UnsafeSession {
                setting: "search_path",
                ..
            })
        ));
    }
}
