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
//!
//! Migrating is an explicit, privileged step (`pulpitum migrate`, run as the schema's
//! owner); every other start only reads the ledger and judges it with [`pending`]: a
//! migration of this build that is not recorded stops the start with
//! [`StoreError::SchemaBehind`] naming the command to run, so no ordinary start ever needs
//! a DDL right.

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

/// One row of a store's migration ledger, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The migration's version.
    pub version: i64,
    /// Its name as recorded.
    pub name: String,
    /// The SHA-256 of its text as recorded.
    pub checksum: String,
    /// Its `requires_version` (`None`: recorded before the column existed).
    pub requires: Option<i64>,
}

/// One migration this build ships, as the ledger check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shipped<'a> {
    /// Its version.
    pub version: i64,
    /// Its name.
    pub name: &'a str,
    /// Its statement text.
    pub sql: &'a str,
}

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The versions this call applied, in order (empty when the schema was current).
    pub applied: Vec<i64>,
    /// The schema version now: this build's.
    pub version: i64,
}

/// Judges a ledger against this build's migrations (ordered by version): an applied
/// migration whose name or text differs from this build's is refused, one this build does
/// not know is judged by [`check_newer`]. Returns the shipped migrations not yet recorded.
pub fn pending<'a>(
    recorded: &[Recorded],
    shipped: &[Shipped<'a>],
) -> Result<Vec<Shipped<'a>>, StoreError> {
    let known = shipped.last().map_or(0, |m| m.version);
    for row in recorded {
        match shipped.iter().find(|m| m.version == row.version) {
            None => {
                // A requirement beyond i32 can never be met: keep it as the largest one.
                let requires = row.requires.map(|r| i32::try_from(r).unwrap_or(i32::MAX));
                let version32 = i32::try_from(row.version).unwrap_or(i32::MAX);
                check_newer(
                    row.version,
                    &row.name,
                    Compat::from_recorded(version32, requires),
                    known,
                )?;
            }
            Some(m) => {
                let expected = checksum(m.sql);
                if m.name != row.name || expected != row.checksum {
                    return Err(StoreError::Migration(format!(
                        "migration {} ({}) was applied with different SQL than this build's \
                         {:04}_{}.sql (checksum {}, this build {expected}): applied migrations \
                         must never be edited; add a new one instead",
                        row.version, row.name, m.version, m.name, row.checksum
                    )));
                }
            }
        }
    }
    Ok(shipped
        .iter()
        .filter(|m| !recorded.iter().any(|r| r.version == m.version))
        .copied()
        .collect())
}

/// The refusal of a start whose database lacks migrations of this build: `pending` lists
/// them (all of them when the database has no ledger at all).
pub fn behind(pending: &[Shipped<'_>], shipped: usize) -> StoreError {
    let list = pending
        .iter()
        .map(|m| format!("{} ({})", m.version, m.name))
        .collect::<Vec<_>>()
        .join(", ");
    let detail = if pending.len() == shipped {
        "the database has no Pulpitum schema yet".to_string()
    } else {
        format!(
            "migration{} {list} of this build {} not applied",
            if pending.len() == 1 { "" } else { "s" },
            if pending.len() == 1 { "is" } else { "are" }
        )
    };
    StoreError::SchemaBehind { detail }
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

    fn row(version: i64, name: &str, sql: &str, requires: Option<i64>) -> Recorded {
        Recorded {
            version,
            name: name.into(),
            checksum: checksum(sql),
            requires,
        }
    }

    #[test]
    fn the_ledger_check_lists_what_is_missing_and_refuses_edits() {
        let shipped = [
            Shipped {
                version: 1,
                name: "a",
                sql: "CREATE A",
            },
            Shipped {
                version: 2,
                name: "b",
                sql: "CREATE B",
            },
        ];
        assert_eq!(pending(&[], &shipped).unwrap(), shipped.to_vec());
        let one = [row(1, "a", "CREATE A", Some(0))];
        assert_eq!(pending(&one, &shipped).unwrap(), vec![shipped[1]]);
        let both = [one[0].clone(), row(2, "b", "CREATE B", Some(0))];
        assert!(pending(&both, &shipped).unwrap().is_empty());
        let edited = [row(1, "a", "CREATE A2", Some(0))];
        let e = pending(&edited, &shipped).unwrap_err().to_string();
        assert!(
            e.contains("migration 1 (a)") && e.contains("never be edited"),
            "{e}"
        );
        let newer = [both[0].clone(), both[1].clone(), row(3, "c", "X", Some(3))];
        let e = pending(&newer, &shipped).unwrap_err().to_string();
        assert!(e.contains("schema version 3 or later"), "{e}");

        let e = behind(&shipped, 2).to_string();
        assert!(
            e.contains("no Pulpitum schema yet") && e.contains("pulpitum migrate"),
            "{e}"
        );
        let e = behind(&shipped[1..], 2).to_string();
        assert!(
            e.contains("migration 2 (b) of this build is not applied"),
            "{e}"
        );
    }
}
