//! The embedded store's numbered migrations and their runner.
//!
//! The SQL lives in `sql/sqlite/NNNN_name.sql`, compiled into the binary. Each applied
//! migration is recorded in `pulpitum_v4_schema_migrations` with a SHA-256 of its text, so a
//! database migrated by another build with an edited file is refused instead of silently
//! used. A migration this build does not know (a newer build ran) is tolerated when it is
//! recorded as additive or as requiring a schema version this build has, and refused
//! otherwise, naming both versions: the rule of the PostgreSQL store
//! ([`crate::store::migrate::pending`]). [`check`] is what a start that is not `migrate`
//! runs: it reads the ledger and changes nothing. The whole run is one `BEGIN IMMEDIATE`
//! transaction: SQLite DDL is transactional and the write lock serializes processes that
//! start together, so no advisory lock is needed and a half-applied migration cannot exist.

use rusqlite::{params, Transaction};

use crate::store::migrate::{behind, pending, Compat, Recorded, Shipped};
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
    // Masks over archived rows: a build that predates them would show deleted and edited
    // rows, so only builds that apply them may run once they can exist.
    Migration {
        version: 6,
        name: "changes",
        sql: include_str!("../../../sql/sqlite/0006_changes.sql"),
        compat: Compat::Requires(6),
    },
    // Retention jobs: builds that predate the kind would refuse to read such rows.
    Migration {
        version: 7,
        name: "retention_jobs",
        sql: include_str!("../../../sql/sqlite/0007_retention_jobs.sql"),
        compat: Compat::Requires(7),
    },
    // Compaction's work list as partial indexes: nothing older builds read changes.
    Migration {
        version: 8,
        name: "compaction_idx",
        sql: include_str!("../../../sql/sqlite/0008_compaction_idx.sql"),
        compat: Compat::Additive,
    },
    // An older build would upsert a new edit over a rewritten mask without clearing
    // `purged_at`, and garbage collection would then delete the edit: only builds that know
    // the column may write masks once it exists.
    Migration {
        version: 9,
        name: "row_masks_purged_at",
        sql: include_str!("../../../sql/sqlite/0009_row_masks_purged_at.sql"),
        compat: Compat::Requires(9),
    },
    // Indexes for compaction's other work (see the PostgreSQL migrations 21 and 22).
    Migration {
        version: 10,
        name: "object_and_mask_idx",
        sql: include_str!("../../../sql/sqlite/0010_object_and_mask_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 11,
        name: "retired_segments_idx",
        sql: include_str!("../../../sql/sqlite/0011_retired_segments_idx.sql"),
        compat: Compat::Additive,
    },
    // Declared tables: see the PostgreSQL migration 24.
    Migration {
        version: 12,
        name: "table_schemas",
        sql: include_str!("../../../sql/sqlite/0012_table_schemas.sql"),
        compat: Compat::Requires(12),
    },
    // The processes that read this store: see the PostgreSQL migration 25.
    Migration {
        version: 13,
        name: "readers",
        sql: include_str!("../../../sql/sqlite/0013_readers.sql"),
        compat: Compat::Additive,
    },
    // Cleanup discovery and buckets by end: see the PostgreSQL migration 26.
    Migration {
        version: 14,
        name: "registry_idx",
        sql: include_str!("../../../sql/sqlite/0014_registry_idx.sql"),
        compat: Compat::Additive,
    },
    // The directories orphan GC lists on most passes: see the PostgreSQL migration 28.
    Migration {
        version: 15,
        name: "gc_prefixes",
        sql: include_str!("../../../sql/sqlite/0015_gc_prefixes.sql"),
        compat: Compat::Additive,
    },
    // Segment routes, their backfill and the buckets not routed to a segment: see the
    // PostgreSQL migrations 29 to 32 (and why an older build may not run once applied).
    Migration {
        version: 16,
        name: "segment_routes",
        sql: include_str!("../../../sql/sqlite/0016_segment_routes.sql"),
        compat: Compat::Requires(16),
    },
    // The claims table renamed, fencing compactions of builds from before 16 still running
    // on the file, then the segments they switched to recorded: see the PostgreSQL
    // migrations 33 and 34.
    Migration {
        version: 17,
        name: "compaction_claims_rename",
        sql: include_str!("../../../sql/sqlite/0017_compaction_claims_rename.sql"),
        compat: Compat::Requires(17),
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

/// Hex SHA-256 of a migration's text, as recorded in the ledger (the PostgreSQL store's).
pub(super) use crate::store::migrate::checksum;

fn shipped() -> Vec<Shipped<'static>> {
    MIGRATIONS
        .iter()
        .map(|m| Shipped {
            version: m.version,
            name: m.name,
            sql: m.sql,
        })
        .collect()
}

fn ledger_exists(tx: &Transaction<'_>) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' \
         AND name = 'pulpitum_v4_schema_migrations')",
        [],
        |r| r.get(0),
    )
}

fn has_compat_column(tx: &Transaction<'_>) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('pulpitum_v4_schema_migrations') \
         WHERE name = 'requires_version')",
        [],
        |r| r.get(0),
    )
}

fn ledger(tx: &Transaction<'_>) -> rusqlite::Result<Vec<Recorded>> {
    let mut stmt = tx.prepare(
        "SELECT version, name, checksum, requires_version FROM pulpitum_v4_schema_migrations \
         ORDER BY version",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(Recorded {
            version: r.get(0)?,
            name: r.get(1)?,
            checksum: r.get(2)?,
            requires: r.get(3)?,
        })
    })?;
    rows.collect()
}

/// Applies every pending migration inside `tx` (opened with `BEGIN IMMEDIATE`), after
/// checking that the recorded ones are exactly this build's. Returns the versions applied.
pub(super) fn apply(tx: &Transaction<'_>, now_micros: i64) -> Result<Vec<i64>, TxError> {
    tx.execute(CREATE_LEDGER, [])?;
    if !has_compat_column(tx)? {
        tx.execute(ADD_COMPAT_COLUMN, [])?;
    }
    let todo = pending(&ledger(tx)?, &shipped())?;
    let mut applied = Vec::new();
    for m in MIGRATIONS {
        if !todo.iter().any(|t| t.version == m.version) {
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
        applied.push(m.version);
    }
    Ok(applied)
}

/// Checks, reading only, that the file holds every migration of this build (see
/// [`crate::store::Catalog::check_schema`]); returns the schema version.
pub(super) fn check(tx: &Transaction<'_>) -> Result<i64, TxError> {
    let shipped = shipped();
    if !ledger_exists(tx)? {
        return Err(behind(&shipped, shipped.len()).into());
    }
    if !has_compat_column(tx)? {
        return Err(StoreError::SchemaBehind {
            detail: "its migration ledger predates this build".into(),
        }
        .into());
    }
    let todo = pending(&ledger(tx)?, &shipped)?;
    if !todo.is_empty() {
        return Err(behind(&todo, shipped.len()).into());
    }
    Ok(schema_version())
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
