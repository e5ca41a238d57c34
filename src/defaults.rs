//! The embedded default: with no URLs, everything lives under `./pulpitum-data` (an
//! embedded SQLite hot store and a local-filesystem archive), so one machine can run the
//! whole product with nothing installed.

use std::path::{Path, PathBuf};

/// Folder of the embedded default, relative to the working directory.
pub const DATA_DIR: &str = "pulpitum-data";

/// Why the URLs could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum DefaultsError {
    /// Only one of the two URLs was given. Mixing a shared hot store with a machine-local
    /// archive would publish routes other machines cannot read, so both or neither.
    #[error("--database-url and --archive-url go together: {0} is set but {1} is not")]
    HalfConfigured(&'static str, &'static str),
    /// The data folder could not be created.
    #[error("cannot create the data folder {path}: {source}")]
    Io {
        /// The folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The database and archive URLs to use: the given ones, or the embedded default under
/// `./pulpitum-data` (created if missing).
pub fn resolve_urls(
    database_url: Option<&str>,
    archive_url: Option<&str>,
) -> Result<(String, String), DefaultsError> {
    match (database_url, archive_url) {
        (Some(d), Some(a)) => Ok((d.to_string(), a.to_string())),
        (Some(_), None) => Err(DefaultsError::HalfConfigured(
            "the database URL",
            "the archive URL",
        )),
        (None, Some(_)) => Err(DefaultsError::HalfConfigured(
            "the archive URL",
            "the database URL",
        )),
        (None, None) => embedded_urls(Path::new(DATA_DIR)),
    }
}

/// Whether a binary started with this database URL (`None`: none given, so the embedded
/// default) applies the migrations itself. Only for a store the process creates and owns:
/// the embedded default under `./pulpitum-data` (so `pulpitum demo` and a first `pulpitum`
/// need no extra step) and `sqlite::memory:`. Every other store is migrated by an explicit
/// `pulpitum migrate`, run as the schema's owner; other starts only check its version.
pub fn start_migrates(database_url: Option<&str>) -> bool {
    match database_url {
        None => true,
        Some(url) => matches!(
            crate::locator::parse_database_url(url),
            Ok(crate::locator::DatabaseLocator::SqliteMemory)
        ),
    }
}

/// URLs of an embedded installation rooted at `dir`.
pub fn embedded_urls(dir: &Path) -> Result<(String, String), DefaultsError> {
    let archive = dir.join("archive");
    crate::locator::create_private_dir(&archive).map_err(|source| DefaultsError::Io {
        path: archive.clone(),
        source,
    })?;
    let abs = std::fs::canonicalize(dir).map_err(|source| DefaultsError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok((
        format!("sqlite://{}", abs.join("hot.sqlite3").display()),
        format!("file://{}", abs.join("archive").display()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_or_neither() {
        assert!(matches!(
            resolve_urls(Some("postgres://x"), None),
            Err(DefaultsError::HalfConfigured(..))
        ));
        assert!(resolve_urls(None, Some("s3://b/p")).is_err());
        let (d, a) = resolve_urls(Some("postgres://x"), Some("s3://b/p")).unwrap();
        assert_eq!((d.as_str(), a.as_str()), ("postgres://x", "s3://b/p"));
        let dir = tempfile::tempdir().unwrap();
        let (d, a) = embedded_urls(dir.path()).unwrap();
        assert!(
            d.starts_with("sqlite:///") && d.ends_with("hot.sqlite3"),
            "{d}"
        );
        assert!(a.starts_with("file:///") && a.ends_with("/archive"), "{a}");
    }

    #[test]
    fn only_stores_the_process_owns_are_migrated_at_start() {
        assert!(start_migrates(None));
        assert!(start_migrates(Some("sqlite::memory:")));
        for given in [
            "postgres://x/y",
            "./hot.db",
            "sqlite:hot.sqlite3",
            "host=db",
        ] {
            assert!(!start_migrates(Some(given)), "{given}");
        }
    }
}
