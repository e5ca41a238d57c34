//! The hot tier: the durable authority for mutable records and for routing state.
//!
//! The contract is split by role ([`Catalog`], [`Appends`], [`RoutedReads`], [`Lifecycle`],
//! [`Control`], [`Compaction`]; [`HotStore`] is all six, see [`roles`]);
//! [`postgres::PgStore`] implements it on CockroachDB or PostgreSQL and
//! [`embedded::SqliteStore`] on an embedded SQLite file. Both run one conformance suite (`tests/conformance/`). The fencing rules live in the store itself: an
//! append commits only into a Hot bucket, and every archiver step that writes checks owner
//! token, fencing generation and lease expiry in the same statement, against the store's own
//! clock, so a paused or stale worker is rejected whatever its own clock says.

mod compaction;
mod control;
pub mod embedded;
mod error;
mod guard;
pub mod migrate;
pub mod postgres;
mod retry;
pub mod roles;
mod types;

pub use compaction::{CompactionClaim, CompactionSource, RetiredObject, RouteSwitch, WindowState};
pub use control::*;
pub use error::{StoreError, StoreResult};
pub use guard::{bucket_for_append, writable_range, WRITABLE_CLOCK_ALLOWANCE};
pub use retry::RetryPolicy;
pub use roles::{Appends, Catalog, Compaction, Control, HotStore, Lifecycle, RoutedReads};
pub use types::*;

/// Opens the hot store a locator names (see [`crate::locator`]): a `postgres://` /
/// `postgresql://` URL or key=value string (CockroachDB or PostgreSQL), `sqlite://PATH`,
/// `sqlite:PATH` or a clear file path (the embedded store; created if absent) or
/// `sqlite::memory:`. Anything else is [`StoreError::Config`], with secrets redacted.
pub async fn open(database_url: &str) -> StoreResult<std::sync::Arc<dyn HotStore>> {
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
            std::sync::Arc::new(embedded::SqliteStore::open(path)?)
        }
    })
}
