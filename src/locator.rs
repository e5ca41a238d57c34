//! Where the data lives: the database locator every entry point accepts, and the redaction
//! that keeps secrets in those strings out of help, errors, logs and `Debug`.
//!
//! A database locator is one of a short list of unambiguous forms, decided by its text
//! alone: a `postgres://` / `postgresql://` URL, a PostgreSQL key=value connection string
//! (`host=db user=app password=...`, parsed by tokio-postgres), `sqlite::memory:`, a
//! `sqlite:` / `sqlite://` URL, or a bare file path that is clearly one (it contains a `/`
//! or ends in `.db`, `.sqlite` or `.sqlite3`). Anything else is refused: a string that was
//! meant to be something else (a mistyped URL, a connection string in a format we do not
//! know) must never quietly become an empty SQLite file in the current folder.
//!
//! Redaction replaces every password, secret, token or key, whether in URL userinfo, URL
//! query parameters or key=value pairs, with `***`; a string that cannot be parsed well
//! enough to redact precisely is shown only by its scheme.

use std::path::PathBuf;

/// File suffixes that mark a bare string as an SQLite file path.
pub const SQLITE_SUFFIXES: &[&str] = &[".db", ".sqlite", ".sqlite3"];

/// What a database locator names.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseLocator {
    /// CockroachDB or PostgreSQL: a URL or a key=value connection string, as given.
    Postgres(String),
    /// An embedded SQLite file.
    SqliteFile(PathBuf),
    /// An embedded SQLite database in memory (tests, demos).
    SqliteMemory,
}

impl std::fmt::Debug for DatabaseLocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Postgres(s) => f.debug_tuple("Postgres").field(&redact(s)).finish(),
            Self::SqliteFile(p) => f.debug_tuple("SqliteFile").field(p).finish(),
            Self::SqliteMemory => f.write_str("SqliteMemory"),
        }
    }
}

/// Why a locator was refused. The message shows the locator redacted.
#[derive(Debug, thiserror::Error)]
pub enum LocatorError {
    /// The string is not one of the accepted forms.
    #[error("database URL {shown}: {reason}; accepted: postgres://..., postgresql://..., a PostgreSQL key=value string (host=... dbname=...), sqlite:PATH, sqlite://PATH, sqlite::memory: or a file path containing '/' or ending in .db, .sqlite or .sqlite3")]
    Unrecognised {
        /// The locator, redacted.
        shown: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Classifies a database locator (see the module documentation for the accepted forms).
pub fn parse_database_url(raw: &str) -> Result<DatabaseLocator, LocatorError> {
    let refuse = |reason| LocatorError::Unrecognised {
        shown: redact(raw),
        reason,
    };
    let s = raw.trim();
    if s.is_empty() {
        return Err(refuse("it is empty"));
    }
    if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        return Ok(DatabaseLocator::Postgres(s.to_string()));
    }
    if s == "sqlite::memory:" {
        return Ok(DatabaseLocator::SqliteMemory);
    }
    if let Some(path) = s
        .strip_prefix("sqlite://")
        .or_else(|| s.strip_prefix("sqlite:"))
    {
        if path.is_empty() {
            return Err(refuse("the sqlite: URL names no file"));
        }
        return Ok(DatabaseLocator::SqliteFile(PathBuf::from(path)));
    }
    if s.contains("://") {
        return Err(refuse("its scheme is not supported"));
    }
    if looks_like_key_value(s) {
        return Ok(DatabaseLocator::Postgres(s.to_string()));
    }
    if s.contains('=') {
        return Err(refuse(
            "it looks like a connection string but is not PostgreSQL key=value pairs",
        ));
    }
    let suffixed = SQLITE_SUFFIXES
        .iter()
        .any(|suffix| s.len() > suffix.len() && s.ends_with(suffix));
    if s.contains('/') || suffixed {
        return Ok(DatabaseLocator::SqliteFile(PathBuf::from(s)));
    }
    Err(refuse("it is neither a URL nor a clear file path"))
}

/// The keys a PostgreSQL key=value connection string may carry (libpq's, as far as
/// tokio-postgres knows them or passes them on).
const PG_KEYS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "tcp_user_timeout",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// Whether `s` is a sequence of `key=value` pairs whose keys are all PostgreSQL's.
fn looks_like_key_value(s: &str) -> bool {
    let pairs = key_value_pairs(s);
    !pairs.is_empty()
        && pairs
            .iter()
            .all(|(k, _)| PG_KEYS.contains(&k.to_ascii_lowercase().as_str()))
}

/// Splits `k=v k2='v 2'` into pairs; `None`-free and empty when the shape does not fit.
fn key_value_pairs(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return out;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if key.is_empty() || chars.next() != Some('=') {
            return Vec::new();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return Vec::new();
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key, value));
    }
}

/// Whether a URL query parameter or key=value key names a secret.
fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "key",
        "credential",
        "signature",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// The locator with every secret replaced by `***`: URL userinfo passwords, query
/// parameters whose name says password, secret, token, key, credential or signature, and
/// the same keys in key=value strings. A string that parses as none of these but could
/// still hide a secret (it has an `@` or an `=`) is reduced to its scheme.
pub fn redact(raw: &str) -> String {
    if let Ok(mut url) = url::Url::parse(raw) {
        if !url.cannot_be_a_base() {
            if url.password().is_some() {
                let _ = url.set_password(Some("***"));
            }
            if url.query().is_some() {
                let pairs: Vec<(String, String)> = url
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret_key(&k) {
                            "***".into()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                url.query_pairs_mut().clear().extend_pairs(pairs);
            }
            return url.to_string();
        }
    }
    let pairs = key_value_pairs(raw);
    if !pairs.is_empty() {
        return pairs
            .into_iter()
            .map(|(k, v)| {
                if secret_key(&k) {
                    format!("{k}=***")
                } else if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c == '\'') {
                    format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
                } else {
                    format!("{k}={v}")
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
    }
    if !raw.contains('@') && !raw.contains('=') {
        return raw.to_string();
    }
    match raw.split_once(':') {
        Some((scheme, _))
            if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            format!("{scheme}:<redacted>")
        }
        _ => "<redacted>".to_string(),
    }
}

/// Creates `dir` and its missing parents readable by the owner only (0700 on Unix); an
/// existing folder keeps its mode (the operator chose it).
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates an empty `file` readable by the owner only (0600 on Unix) if it does not exist;
/// an existing file keeps its mode.
pub fn create_private_file(file: &std::path::Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(file) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_and_refused_forms() {
        use DatabaseLocator::*;
        let ok: &[(&str, DatabaseLocator)] = &[
            (
                "postgres://u:p@h/db",
                Postgres("postgres://u:p@h/db".into()),
            ),
            ("postgresql://h/db", Postgres("postgresql://h/db".into())),
            (
                "host=db user=app password='a b' dbname=x",
                Postgres("host=db user=app password='a b' dbname=x".into()),
            ),
            ("sqlite::memory:", SqliteMemory),
            ("sqlite:hot.sqlite3", SqliteFile("hot.sqlite3".into())),
            ("sqlite:///tmp/x", SqliteFile("/tmp/x".into())),
            ("sqlite://rel/x", SqliteFile("rel/x".into())),
            ("/var/lib/hot", SqliteFile("/var/lib/hot".into())),
            ("./hot", SqliteFile("./hot".into())),
            ("hot.db", SqliteFile("hot.db".into())),
            ("hot.sqlite", SqliteFile("hot.sqlite".into())),
            ("hot.sqlite3", SqliteFile("hot.sqlite3".into())),
        ];
        for (raw, want) in ok {
            assert_eq!(&parse_database_url(raw).unwrap(), want, "{raw}");
        }
        for bad in [
            "",
            "  ",
            "hot",
            "pulpitum",
            ".db",
            "sqlite:",
            "sqlite://",
            "mysql://u:p@h/db",
            "cockroach://h/db",
            "host=db user=app frobnicate=1",
            "db=1",
            "host='unterminated",
        ] {
            let err = parse_database_url(bad).unwrap_err().to_string();
            assert!(err.contains("accepted:"), "{bad}: {err}");
        }
    }

    #[test]
    fn redaction_hides_every_secret() {
        let cases = [
            (
                "postgres://app:s3cr3t@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            ("postgres://app@db/x", "postgres://app@db/x"),
            (
                "postgres://db/x?password=s3cr3t&sslmode=require",
                "postgres://db/x?password=***&sslmode=require",
            ),
            (
                "s3://bkt/p?secret_access_key=s3cr3t&region=x",
                "s3://bkt/p?secret_access_key=***&region=x",
            ),
            (
                "host=db user=app password=s3cr3t",
                "host=db user=app password=***",
            ),
            (
                "host=db password='s3 cr3t' dbname=x",
                "host=db password=*** dbname=x",
            ),
            ("file:///tmp/a", "file:///tmp/a"),
            ("sqlite:///tmp/a.db", "sqlite:///tmp/a.db"),
            ("/tmp/hot.db", "/tmp/hot.db"),
            ("postgres://app:s3 cr3t@db/x", "postgres://app:***@db/x"),
            ("nonsense s3cr3t@host", "<redacted>"),
        ];
        for (raw, want) in cases {
            assert_eq!(redact(raw), want, "{raw}");
        }
        let d = format!(
            "{:?}",
            DatabaseLocator::Postgres("postgres://a:s3cr3t@h/d".into())
        );
        assert!(!d.contains("s3cr3t"), "{d}");
    }
}
