//! The embedded store's numbered migrations and their runner.
//!
//! The SQL lives in `sql/sqlite/NNNN_name.sql`, compiled into the binary. Each applied
//! migration is recorded in `pulpitum_v4_schema_migrations` with a SHA-256 of its text, so a
//! database migrated by another build with an edited file is refused instead of silently
//! used. A migration this build does not know (a newer build ran) is tolerated when it is
//! recorded as additive or as requiring a schema version this build has, and refused
//! otherwise, naming both versions: the rule of the PostgreSQL store
//! ([`crate::store::migrate::check_newer`]). The whole run is one `BEGIN IMMEDIATE`
//! transaction: SQLite DDL is transactional and the write lock serializes processes that
//! start together, so no advisory lock is needed and a half-applied migration cannot exist.

use rusqlite::{params, OptionalExtension, Transaction};
use sha2::{Digest, Sha256};

use crate::store::migrate::{check_newer, Compat};
use crate::store::StoreError;

use super::TxError;

/// One numbered migration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Migration {
    /// Position in the sequence, starting at 1, without gaps.
    pub version: i64,
    /// The file's name without the number and extension.
    pub name: &'static str,
    /// The SQL text.
    pub sql: &'static str,
    /// Which older builds may still run once this migration is applied.
    pub compat: Compat,
}

/// Every migration of this build, in order.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "tables",
        sql: include_str!("../../../sql/sqlite/0001_tables.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 2,
        name: "bucket_metadata",
        sql: include_str!("../../../sql/sqlite/0002_bucket_metadata.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 3,
        name: "records",
        sql: include_str!("../../../sql/sqlite/0003_records.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 4,
        name: "control",
        sql: include_str!("../../../sql/sqlite/0004_control.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 5,
        name: "compaction",
        sql: include_str!("../../../sql/sqlite/0005_compaction.sql"),
        compat: Compat::Additive,
    },
];

const CREATE_LEDGER: &str = "CREATE TABLE IF NOT EXISTS pulpitum_v4_schema_migrations (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    applied_at INTEGER NOT NULL,
    requires_version INTEGER
) STRICT";

/// Adds the compatibility column to a ledger created before it existed (SQLite has no
/// `ADD COLUMN IF NOT EXISTS`; the caller checks first). See `requires_version` in
/// `sql/0000_schema_migrations_requires_version.sql`: 0 = additive, N = builds with schema
/// version N or later, NULL = breaking.
const ADD_COMPAT_COLUMN: &str =
    "ALTER TABLE pulpitum_v4_schema_migrations ADD COLUMN requires_version INTEGER";

/// This build's schema version: the last migration it knows.
pub(super) fn schema_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Hex SHA-256 of a migration's text, as recorded in the ledger.
pub(super) fn checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

/// Applies every pending migration inside `tx` (opened with `BEGIN IMMEDIATE`), after
/// checking that the recorded ones are exactly this build's. Returns how many were applied.
pub(super) fn apply(tx: &Transaction<'_>, now_micros: i64) -> Result<usize, TxError> {
    tx.execute(CREATE_LEDGER, [])?;
    let has_compat: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('pulpitum_v4_schema_migrations') \
         WHERE name = 'requires_version')",
        [],
        |r| r.get(0),
    )?;
    if !has_compat {
        tx.execute(ADD_COMPAT_COLUMN, [])?;
    }
    let mut applied = 0;
    {
        let mut stmt = tx.prepare(
            "SELECT version, name, checksum, requires_version FROM pulpitum_v4_schema_migrations \
             ORDER BY version",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<i64>>(3)?,
            ))
        })?;
        for row in rows {
            let (version, name, sum, requires) = row?;
            let Some(known) = MIGRATIONS.iter().find(|m| m.version == version) else {
                // A requirement beyond i32 can never be met: keep it as the largest one.
                let requires = requires.map(|r| i32::try_from(r).unwrap_or(i32::MAX));
                let version32 = i32::try_from(version).unwrap_or(i32::MAX);
                check_newer(
                    version,
                    &name,
                    Compat::from_recorded(version32, requires),
                    schema_version(),
                )?;
                continue;
            };
            if known.name != name || checksum(known.sql) != sum {
                return Err(StoreError::Migration(format!(
                    "migration {version} ({name}) was applied with different SQL than this build's \
                     {:04}_{}.sql; migrations must never be edited once released",
                    known.version, known.name
                ))
                .into());
            }
        }
    }
    for m in MIGRATIONS {
        let done: Option<i64> = tx
            .query_row(
                "SELECT version FROM pulpitum_v4_schema_migrations WHERE version = ?1",
                [m.version],
                |r| r.get(0),
            )
            .optional()?;
        if done.is_some() {
            continue;
        }
        tx.execute_batch(m.sql)?;
        tx.execute(
            "INSERT INTO pulpitum_v4_schema_migrations \
             (version, name, checksum, applied_at, requires_version) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                m.version,
                m.name,
                checksum(m.sql),
                now_micros,
                m.compat.recorded()
            ],
        )?;
        applied += 1;
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_dense_and_names_match_files() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                m.version,
                i as i64 + 1,
                "migration versions must have no gaps"
            );
            assert!(!m.sql.trim().is_empty(), "migration {} is empty", m.name);
        }
    }
}
