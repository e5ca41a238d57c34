//! The embedded store's numbered migrations and their runner.
//!
//! The SQL lives in `sql/sqlite/NNNN_name.sql`, compiled into the binary. Each applied
//! migration is recorded in `pulpitum_v4_schema_migrations` with a SHA-256 of its text, so a
//! database migrated by another build (an edited file, or a newer migration this build does
//! not know) is refused instead of silently used. The whole run is one `BEGIN IMMEDIATE`
//! transaction: SQLite DDL is transactional and the write lock serializes processes that
//! start together, so no advisory lock is needed and a half-applied migration cannot exist.

use rusqlite::{params, OptionalExtension, Transaction};
use sha2::{Digest, Sha256};

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
}

/// Every migration of this build, in order.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "tables",
        sql: include_str!("../../../sql/sqlite/0001_tables.sql"),
    },
    Migration {
        version: 2,
        name: "bucket_metadata",
        sql: include_str!("../../../sql/sqlite/0002_bucket_metadata.sql"),
    },
    Migration {
        version: 3,
        name: "records",
        sql: include_str!("../../../sql/sqlite/0003_records.sql"),
    },
];

const CREATE_LEDGER: &str = "CREATE TABLE IF NOT EXISTS pulpitum_v4_schema_migrations (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT";

/// Hex SHA-256 of a migration's text, as recorded in the ledger.
pub(super) fn checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

/// Applies every pending migration inside `tx` (opened with `BEGIN IMMEDIATE`), after
/// checking that the recorded ones are exactly this build's. Returns how many were applied.
pub(super) fn apply(tx: &Transaction<'_>, now_micros: i64) -> Result<usize, TxError> {
    tx.execute(CREATE_LEDGER, [])?;
    let mut applied = 0;
    {
        let mut stmt = tx.prepare(
            "SELECT version, name, checksum FROM pulpitum_v4_schema_migrations ORDER BY version",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        for row in rows {
            let (version, name, sum) = row?;
            let Some(known) = MIGRATIONS.iter().find(|m| m.version == version) else {
                return Err(StoreError::Migration(format!(
                    "the database records migration {version} ({name}), which this build does not know; \
                     it was migrated by a newer pulpitum"
                ))
                .into());
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
            "INSERT INTO pulpitum_v4_schema_migrations (version, name, checksum, applied_at) \
             VALUES (?1, ?2, ?3, ?4)",
            params![m.version, m.name, checksum(m.sql), now_micros],
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
