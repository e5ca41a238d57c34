//! The hot tier: the durable authority for mutable records and for routing state.
//!
//! The contract is split by role ([`Catalog`], [`Appends`], [`RoutedReads`], [`Lifecycle`],
//! [`Control`], [`Compaction`]; [`HotStore`] is all six, see [`roles`]);
//! [`postgres::PgStore`] implements it on CockroachDB or PostgreSQL and
//! [`embedded::SqliteStore`] on an embedded SQLite file. Both run one conformance suite (`tests/conformance/`). The fencing rules live in the store itself: an
//! append commits only into a Hot bucket, and every archiver step that writes checks owner
//! token, fencing generation and lease expiry in the same statement, against the store's own
//! clock, so a paused or stale worker is rejected whatever its own clock says.

mod changes;
mod compaction;
mod control;
pub mod embedded;
mod error;
pub mod gate;
mod guard;
pub mod migrate;
pub mod postgres;
mod retry;
pub mod roles;
mod types;

pub use changes::{ChangeOutcome, ExpiredBucket, RowChange, RowMask};
pub use compaction::{
    is_segment_key, CompactionClaim, CompactionSource, RetiredObject, RouteSwitch, WindowState,
    SEGMENT_KEY_GLOB, SEGMENT_KEY_LIKE,
};
pub use control::*;
pub use error::{StoreError, StoreResult};
pub use guard::{bucket_for_append, writable_range, WRITABLE_CLOCK_ALLOWANCE};
pub use retry::RetryPolicy;
pub use roles::{Appends, Catalog, Changes, Compaction, Control, HotStore, Lifecycle, RoutedReads};
pub use types::*;

/// Opens the hot store a locator names (see [`crate::locator`]): a `postgres://` /
/// `postgresql://` URL or key=value string (CockroachDB or PostgreSQL), `sqlite://PATH`,
/// `sqlite:PATH` or a clear file path (the embedded store; created if absent) or
/// `sqlite::memory:`. Anything else is [`StoreError::Config`], with secrets redacted. Runs no
/// schema step: see [`open_started`] for what a process start does.
pub async fn open(database_url: &str) -> StoreResult<std::sync::Arc<dyn HotStore>> {
    open_with(database_url, true).await
}

/// [`open`], except that an embedded store's file must already exist: a locator an operator
/// typed (`./typo.db`) never silently becomes a new, empty store. `pulpitum migrate` creates
/// one; the embedded default under `./pulpitum-data` is created by whichever binary first
/// opens it.
pub async fn open_existing(database_url: &str) -> StoreResult<std::sync::Arc<dyn HotStore>> {
    open_with(database_url, false).await
}

/// What a process start does: with `migrate` (`pulpitum migrate`, or a store the process
/// itself creates and owns: the embedded default, `sqlite::memory:`) it opens the store,
/// creating an embedded file if absent, and applies pending migrations; otherwise it opens an
/// existing store and only checks the schema version ([`Catalog::check_schema`]), which
/// needs no DDL right.
pub async fn open_started(
    database_url: &str,
    migrate: bool,
) -> StoreResult<(std::sync::Arc<dyn HotStore>, Option<migrate::Migrated>)> {
    if migrate {
        let store = open(database_url).await?;
        let done = store.migrate().await?;
        Ok((store, Some(done)))
    } else {
        let store = open_existing(database_url).await?;
        store.check_schema().await?;
        Ok((store, None))
    }
}

async fn open_with(database_url: &str, create: bool) -> StoreResult<std::sync::Arc<dyn HotStore>> {
    use crate::locator::{parse_database_url, DatabaseLocator};
    let locator =
        parse_database_url(database_url).map_err(|e| StoreError::Config(e.to_string()))?;
    Ok(match locator {
        DatabaseLocator::Postgres(url) => {
            std::sync::Arc::new(postgres::PgStore::connect(&url).await?)
        }
        DatabaseLocator::SqliteMemory => {
            std::sync::Arc::new(embedded::SqliteStore::open_in_memory()?)
        }
        DatabaseLocator::SqliteFile(path) => {
            if !create && !path.exists() {
                return Err(StoreError::Config(format!(
                    "no embedded store at {}: the file does not exist. A database URL is never \
                     created by an ordinary start; check the path, or create the store with \
                     `pulpitum migrate --database-url {}` (without a URL, the binaries use the \
                     embedded default in ./{})",
                    path.display(),
                    crate::locator::redact(database_url),
                    crate::defaults::DATA_DIR
                )));
            }
            std::sync::Arc::new(embedded::SqliteStore::open(path)?)
        }
    })
}
