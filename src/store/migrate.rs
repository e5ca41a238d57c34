//! The rules of the schema-migration ledger that both hot stores share.
//!
//! Each store records its applied migrations in `pulpitum_v4_schema_migrations` with a
//! SHA-256 of each statement ([`checksum`]) and the migration's [`Compat`]
//! (`requires_version`). Rolling deploys and rollbacks: a build runs against a database
//! that records migrations it does not know (a newer build ran) when every one of them is
//! additive, or requires a schema version no later than this build's; otherwise it refuses
//! to start, naming the migration, the version it requires and this build's version
//! ([`check_newer`]; docs/schema.md, "Upgrade and rollback"). The runners live with their
//! stores: [`crate::store::postgres::migrate`] for CockroachDB/PostgreSQL and the embedded
//! store's own.

use sha2::{Digest, Sha256};

use super::StoreError;

/// What a migration asks of the builds that run against a database where it is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compat {
    /// Only adds (a table, an index, a nullable column) what older builds never read: every
    /// build keeps running. Recorded as `requires_version = 0`.
    Additive,
    /// Changes something older builds rely on: only builds whose schema version is at least
    /// this one may run (at most the migration's own version; lower when the builds since
    /// that version were written to work either way).
    Requires(i32),
}

impl Compat {
    /// The ledger's `requires_version` value.
    pub fn recorded(self) -> i32 {
        match self {
            Self::Additive => 0,
            Self::Requires(v) => v,
        }
    }

    /// The rule of a recorded `requires_version` of migration `version`: a missing value
    /// (a ledger row written by hand, or by a build without this rule) is taken as
    /// breaking, since nothing said otherwise.
    pub fn from_recorded(version: i32, requires: Option<i32>) -> Self {
        match requires {
            Some(0) => Self::Additive,
            Some(v) => Self::Requires(v),
            None => Self::Requires(version),
        }
    }
}

/// Checks one applied migration that this build does not know (a newer build recorded
/// it) against this build's schema version `known`: `Ok` when this build may run anyway,
/// otherwise the error that names both versions.
pub fn check_newer(version: i64, name: &str, compat: Compat, known: i64) -> Result<(), StoreError> {
    match compat {
        Compat::Additive => Ok(()),
        Compat::Requires(v) if i64::from(v) <= known => Ok(()),
        Compat::Requires(v) => Err(StoreError::Migration(format!(
            "the database records migration {version} ({name}), which requires a pulpitum build \
             with schema version {v} or later; this build's schema version is {known}: run a \
             newer build, or roll the schema back first (docs/schema.md, \"Upgrade and rollback\")"
        ))),
    }
}

/// Lowercase hex SHA-256 of a migration's statement text as shipped: what the ledger
/// records, and compares with on every start.
pub fn checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_migrations_are_tolerated_only_when_this_build_satisfies_them() {
        assert!(check_newer(7, "x", Compat::Additive, 5).is_ok());
        assert!(check_newer(7, "x", Compat::Requires(5), 5).is_ok());
        let e = check_newer(7, "drop_x", Compat::Requires(6), 5)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("migration 7 (drop_x)")
                && e.contains("schema version 6")
                && e.contains("is 5"),
            "{e}"
        );
        assert_eq!(Compat::from_recorded(7, Some(0)), Compat::Additive);
        assert_eq!(Compat::from_recorded(7, None), Compat::Requires(7));
        assert_eq!(Compat::from_recorded(7, Some(6)), Compat::Requires(6));
        assert_eq!(Compat::Requires(6).recorded(), 6);
    }
}
