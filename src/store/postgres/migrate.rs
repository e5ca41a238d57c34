//! Schema migrations for the CockroachDB/PostgreSQL hot store, and their runner.
//!
//! The numbered files in `sql/` are embedded at build time. Each holds exactly one
//! idempotent DDL statement (`CREATE ... IF NOT EXISTS`), so several processes may start
//! at once without a lock (CockroachDB has no advisory locks): every process runs every
//! missing statement, the losers of PostgreSQL's catalog races (23505, 42P07, and 42710 for
//! a table's row type) or of a serialization conflict (40001) simply run it again and find
//! the object present, and the version is recorded with `INSERT .. ON CONFLICT DO NOTHING`.
//! The ledger keeps a SHA-256 of each file: an applied migration whose file has since been
//! edited stops the runner with [`StoreError::Migration`] rather than guessing. Only
//! `pulpitum_v4_*` objects are ever created; v3 tables are never read, changed or dropped.
//!
//! Rolling deploys and rollbacks: the ledger also records each migration's [`Compat`]
//! (`requires_version`), and migrations recorded by a newer build are judged by the rule
//! both stores share ([`check_newer`](crate::store::migrate::check_newer); docs/schema.md,
//! "Upgrade and rollback").
//!
//! Only `pulpitum migrate` runs [`migrate`] (the schema owner's step: it needs the rights
//! to create and alter tables); every other start runs [`check`], one `SELECT` of the
//! ledger, so the roles an application or an archiver runs as need no DDL right.

use std::time::Duration;

use tokio_postgres::Client;

use crate::store::migrate::{behind, checksum, pending, Compat, Recorded, Shipped};
use crate::store::{StoreError, StoreResult};

/// One numbered migration step: a single DDL statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Version number, strictly increasing in [`MIGRATIONS`].
    pub version: i32,
    /// Short name (the file name without number and extension).
    pub name: &'static str,
    /// The statement.
    pub sql: &'static str,
    /// Which older builds may still run once this migration is applied.
    pub compat: Compat,
}

impl Migration {
    /// Lowercase hex SHA-256 of the statement text as shipped.
    pub fn checksum(&self) -> String {
        checksum(self.sql)
    }
}

/// The ledger table, created before any numbered step and never recorded in itself.
pub const BOOTSTRAP_SQL: &str = include_str!("../../../sql/0000_schema_migrations.sql");

/// The ledger's compatibility column, added to ledgers created before it existed (run
/// after [`BOOTSTRAP_SQL`] by every `migrate`, and likewise never recorded; an `ALTER
/// TABLE`, so only the ledger's owner may run it).
pub const BOOTSTRAP_COMPAT_SQL: &str =
    include_str!("../../../sql/0000_schema_migrations_requires_version.sql");

/// This build's schema version: the last migration it knows.
pub fn schema_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Every migration of this build, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "tables",
        sql: include_str!("../../../sql/0001_tables.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 2,
        name: "bucket_metadata",
        sql: include_str!("../../../sql/0002_bucket_metadata.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 3,
        name: "bucket_metadata_discovery_idx",
        sql: include_str!("../../../sql/0003_bucket_metadata_discovery_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 4,
        name: "records",
        sql: include_str!("../../../sql/0004_records.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 5,
        name: "bucket_metadata_by_start_idx",
        sql: include_str!("../../../sql/0005_bucket_metadata_by_start_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 6,
        name: "policies",
        sql: include_str!("../../../sql/0006_policies.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 7,
        name: "store_control",
        sql: include_str!("../../../sql/0007_store_control.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 8,
        name: "jobs",
        sql: include_str!("../../../sql/0008_jobs.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 9,
        name: "jobs_by_start_idx",
        sql: include_str!("../../../sql/0009_jobs_by_start_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 10,
        name: "compactions",
        sql: include_str!("../../../sql/0010_compactions.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 11,
        name: "retired_objects",
        sql: include_str!("../../../sql/0011_retired_objects.sql"),
        compat: Compat::Additive,
    },
    // A build that predates masks would show deleted and edited archived rows as they were:
    // once masks can exist, only builds that apply them may run.
    Migration {
        version: 12,
        name: "row_masks",
        sql: include_str!("../../../sql/0012_row_masks.sql"),
        compat: Compat::Requires(12),
    },
    Migration {
        version: 13,
        name: "policy_retain_for",
        sql: include_str!("../../../sql/0013_policy_retain_for.sql"),
        compat: Compat::Additive,
    },
    // Job history gains the retention kind and the expired outcome: builds that predate
    // them would refuse to read such rows.
    Migration {
        version: 14,
        name: "jobs_kind_check_drop",
        sql: include_str!("../../../sql/0014_jobs_kind_check_drop.sql"),
        compat: Compat::Requires(14),
    },
    Migration {
        version: 15,
        name: "jobs_outcome_check_drop",
        sql: include_str!("../../../sql/0015_jobs_outcome_check_drop.sql"),
        compat: Compat::Requires(14),
    },
    Migration {
        version: 16,
        name: "jobs_kind_check_drop_crdb",
        sql: include_str!("../../../sql/0016_jobs_kind_check_drop_crdb.sql"),
        compat: Compat::Requires(14),
    },
    Migration {
        version: 17,
        name: "jobs_outcome_check_drop_crdb",
        sql: include_str!("../../../sql/0017_jobs_outcome_check_drop_crdb.sql"),
        compat: Compat::Requires(14),
    },
    // Compaction's work list as partial indexes: an index changes no row older builds read
    // or write.
    Migration {
        version: 18,
        name: "bucket_metadata_compaction_idx",
        sql: include_str!("../../../sql/0018_bucket_metadata_compaction_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 19,
        name: "bucket_metadata_compaction_start_idx",
        sql: include_str!("../../../sql/0019_bucket_metadata_compaction_start_idx.sql"),
        compat: Compat::Additive,
    },
    // An older build would upsert a new edit over a rewritten mask without clearing
    // `purged_at`, and garbage collection would then delete the edit: only builds that know
    // the column may write masks once it exists.
    Migration {
        version: 20,
        name: "row_masks_purged_at",
        sql: include_str!("../../../sql/0020_row_masks_purged_at.sql"),
        compat: Compat::Requires(20),
    },
    // Indexes for compaction's other work (routes to retired segments, masks not rewritten
    // yet): an index changes no row older builds read or write.
    Migration {
        version: 21,
        name: "bucket_metadata_object_key_idx",
        sql: include_str!("../../../sql/0021_bucket_metadata_object_key_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 22,
        name: "row_masks_unpurged_idx",
        sql: include_str!("../../../sql/0022_row_masks_unpurged_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 23,
        name: "retired_segments_idx",
        sql: include_str!("../../../sql/0023_retired_segments_idx.sql"),
        compat: Compat::Additive,
    },
    // Declared tables: an older build would meet a table of the surface `declared`, which it
    // does not know, and fail to build its sessions; so once this is applied, only builds
    // that know declared tables start (the rest stop, naming the upgrade).
    Migration {
        version: 24,
        name: "table_schemas",
        sql: include_str!("../../../sql/0024_table_schemas.sql"),
        compat: Compat::Requires(24),
    },
    Migration {
        version: 25,
        name: "readers",
        sql: include_str!("../../../sql/0025_readers.sql"),
        compat: Compat::Additive,
    },
    // Indexes for the archiver's per-cycle reads (cleanup discovery; retention) and for
    // listings across a table's partitions: additive.
    Migration {
        version: 26,
        name: "bucket_metadata_cleanup_idx",
        sql: include_str!("../../../sql/0026_bucket_metadata_cleanup_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 27,
        name: "bucket_metadata_by_end_idx",
        sql: include_str!("../../../sql/0027_bucket_metadata_by_end_idx.sql"),
        compat: Compat::Additive,
    },
    // The directories orphan GC lists on most passes. Additive: an older build neither
    // notes nor reads them (its objects are found by the full listings, at every start and
    // daily).
    Migration {
        version: 28,
        name: "gc_prefixes",
        sql: include_str!("../../../sql/0028_gc_prefixes.sql"),
        compat: Compat::Additive,
    },
    // Segment routes: listings across partitions read a segment's buckets from its manifest
    // when the routes say every bucket it holds is still routed to it. An older build would
    // switch buckets to a segment without recording it, and this build's listings would then
    // miss them; so once this is applied, only builds that record segments start.
    Migration {
        version: 29,
        name: "segment_routes",
        sql: include_str!("../../../sql/0029_segment_routes.sql"),
        compat: Compat::Requires(29),
    },
    Migration {
        version: 30,
        name: "segment_routes_by_end_idx",
        sql: include_str!("../../../sql/0030_segment_routes_by_end_idx.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 31,
        name: "segment_routes_backfill",
        sql: include_str!("../../../sql/0031_segment_routes_backfill.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 32,
        name: "bucket_metadata_unsegmented_idx",
        sql: include_str!("../../../sql/0032_bucket_metadata_unsegmented_idx.sql"),
        compat: Compat::Additive,
    },
    // The fence `Requires(29)` cannot be: a build from before 29 that was already running
    // when it was applied keeps compacting, and its switches record no segment route. Its
    // every compaction opens on the claims table by its old name, so the rename makes them
    // fail before a route moves; requires this version, since this build names the new one.
    Migration {
        version: 33,
        name: "compaction_claims_rename",
        sql: include_str!("../../../sql/0033_compaction_claims_rename.sql"),
        compat: Compat::Requires(33),
    },
    // Records what such a build switched between 29 and the fence.
    Migration {
        version: 34,
        name: "segment_routes_backfill_again",
        sql: include_str!("../../../sql/0034_segment_routes_backfill_again.sql"),
        compat: Compat::Additive,
    },
];

/// SQLSTATEs raised when concurrent sessions create the same catalog object (42P06 for a
/// schema, 42P07 for a table or index, 42710 for a table's row type, 42701 for a column
/// added twice, 23505 when PostgreSQL's catalog index notices first), or conflict while
/// creating or recording it (40001, which CockroachDB raises for concurrent schema changes);
/// re-running the idempotent statement resolves them.
const RACE_CODES: [&str; 6] = ["23505", "42P06", "42P07", "42710", "42701", "40001"];

/// How often a racing DDL statement is re-run before giving up.
const DDL_ATTEMPTS: u32 = 20;

/// Applies [`MIGRATIONS`]; returns the versions this call recorded.
pub async fn migrate(client: &Client) -> StoreResult<Vec<i32>> {
    apply(client, MIGRATIONS).await
}

fn shipped(migrations: &[Migration]) -> Vec<Shipped<'_>> {
    migrations
        .iter()
        .map(|m| Shipped {
            version: m.version.into(),
            name: m.name,
            sql: m.sql,
        })
        .collect()
}

/// Applies the given migrations (tests pass edited lists to exercise the checksum guard).
pub async fn apply(client: &Client, migrations: &[Migration]) -> StoreResult<Vec<i32>> {
    run_ddl(client, BOOTSTRAP_SQL).await?;
    run_ddl(client, BOOTSTRAP_COMPAT_SQL).await?;
    let applied = ledger(client).await.map_err(|e| backend(&e))?;
    let todo = pending(&applied, &shipped(migrations))?;
    // A migrator can stall here (a slow link, a paused VM) while another applies everything.
    crate::failpoint::hit("migrate_after_ledger");
    let mut recorded = Vec::new();
    for m in migrations {
        if !todo.iter().any(|t| t.version == i64::from(m.version)) {
            continue;
        }
        // The ledger read above may be stale: a migration another process recorded since is
        // not run again. Re-running it is harmless for most (they are idempotent), but not
        // once a later one changed what it made: 10's `CREATE TABLE IF NOT EXISTS` run after
        // 33's rename would bring the old claims table back, and this run's own 33 would
        // then fail on the name taken.
        if let Some(stored) = recorded_checksum(client, m.version).await? {
            check_checksum(m, &stored)?;
            continue;
        }
        run_ddl(client, m.sql).await?;
        if record(client, m).await? {
            recorded.push(m.version);
        }
    }
    Ok(recorded)
}

/// The check every start that is not `migrate` runs: one read of the ledger, no DDL (see
/// [`crate::store::Catalog::check_schema`]). Returns this build's schema version.
pub async fn check(client: &Client, migrations: &[Migration]) -> StoreResult<i64> {
    use tokio_postgres::error::SqlState;
    let shipped = shipped(migrations);
    let applied = match ledger(client).await {
        Ok(rows) => rows,
        // No ledger in the schema the search path names: nothing was migrated there, or the
        // role looks in another schema than the owner migrated; say which one it looked in.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
            let schema: Option<String> = client
                .query_one("SELECT current_schema()::TEXT", &[])
                .await
                .ok()
                .and_then(|r| r.get(0));
            let detail = match schema {
                Some(s) => format!(
                    "the database has no Pulpitum schema yet: schema {s:?}, the first on this \
                     role's search path, has no pulpitum_v4_schema_migrations (if the owner \
                     migrated another schema, set the role's search_path to it)"
                ),
                None => "no schema on this role's search path exists or is usable (it needs \
                         USAGE on the schema the owner migrated, and search_path naming it)"
                    .into(),
            };
            return Err(StoreError::SchemaBehind { detail });
        }
        // A ledger from before `requires_version`: older than every migration since.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN) => {
            return Err(StoreError::SchemaBehind {
                detail: "its migration ledger predates this build".into(),
            })
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            return Err(StoreError::PermissionDenied {
                operation: "the schema version check",
                detail: describe(&e),
            })
        }
        Err(e) => return Err(backend(&e)),
    };
    let todo = pending(&applied, &shipped)?;
    if !todo.is_empty() {
        return Err(behind(&todo, shipped.len()));
    }
    Ok(shipped.last().map_or(0, |m| m.version))
}

async fn ledger(client: &Client) -> Result<Vec<Recorded>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT version, name, checksum, requires_version FROM pulpitum_v4_schema_migrations \
             ORDER BY version",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Recorded {
                version: r.try_get::<_, i32>(0)?.into(),
                name: r.try_get(1)?,
                checksum: r.try_get(2)?,
                requires: r.try_get::<_, Option<i32>>(3)?.map(i64::from),
            })
        })
        .collect()
}

fn check_checksum(m: &Migration, stored: &str) -> StoreResult<()> {
    let expected = m.checksum();
    if stored != expected {
        return Err(StoreError::Migration(format!(
            "migration {} ({}) was applied with checksum {stored} but this build has {expected}: \
             applied migrations must never be edited; add a new one instead",
            m.version, m.name
        )));
    }
    Ok(())
}

/// The checksum recorded for `version`, if it is recorded.
async fn recorded_checksum(client: &Client, version: i32) -> StoreResult<Option<String>> {
    let row = client
        .query_opt(
            "SELECT checksum FROM pulpitum_v4_schema_migrations WHERE version = $1",
            &[&version],
        )
        .await
        .map_err(|e| backend(&e))?;
    row.map(|r| r.try_get(0).map_err(|e| backend(&e)))
        .transpose()
}

/// Records `m`; when another process recorded it first, verifies that its checksum agrees.
async fn record(client: &Client, m: &Migration) -> StoreResult<bool> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let res = client
            .query(
                "INSERT INTO pulpitum_v4_schema_migrations (version, name, checksum, requires_version) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (version) DO NOTHING RETURNING version",
                &[&m.version, &m.name, &m.checksum(), &m.compat.recorded()],
            )
            .await;
        match res {
            Ok(rows) if !rows.is_empty() => return Ok(true),
            Ok(_) => {
                let row = client
                    .query_one(
                        "SELECT checksum FROM pulpitum_v4_schema_migrations WHERE version = $1",
                        &[&m.version],
                    )
                    .await
                    .map_err(|e| backend(&e))?;
                let stored: String = row.try_get(0).map_err(|e| backend(&e))?;
                check_checksum(m, &stored)?;
                return Ok(false);
            }
            Err(e) if is_race(&e) && attempt < DDL_ATTEMPTS => pause(attempt).await,
            Err(e) => return Err(backend(&e)),
        }
    }
}

/// Runs one idempotent DDL statement, re-running it when it loses a catalog race (the
/// store's `CREATE SCHEMA IF NOT EXISTS` at connect goes through here too).
pub(crate) async fn run_ddl(client: &Client, sql: &str) -> StoreResult<()> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match client.batch_execute(sql).await {
            Ok(()) => return Ok(()),
            Err(e) if is_race(&e) && attempt < DDL_ATTEMPTS => pause(attempt).await,
            Err(e) => return Err(backend(&e)),
        }
    }
}

fn is_race(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| RACE_CODES.contains(&c.code()))
}

async fn pause(attempt: u32) {
    let ms = (attempt as u64 * 5).min(100) + rand::random_range(0..5u64);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

fn backend(e: &tokio_postgres::Error) -> StoreError {
    if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_SCHEMA_NAME) {
        return StoreError::Backend {
            operation: "migrate",
            detail: format!(
                "{}: no schema on the search path exists or is usable by this role (create the \
                 schema, owned by the role that migrates, and set that role's search_path)",
                describe(e)
            ),
        };
    }
    // Only the schema's owner may migrate: a role without the right learns it plainly.
    if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
        return StoreError::PermissionDenied {
            operation: "migrate",
            detail: describe(e),
        };
    }
    StoreError::Backend {
        operation: "migrate",
        detail: describe(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_single_ddl_statements() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "versions are dense and ordered");
            let code: String = m
                .sql
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            let statements = code.split(';').filter(|s| !s.trim().is_empty()).count();
            assert_eq!(
                statements, 1,
                "migration {} must hold exactly one statement",
                m.version
            );
            // Creations say IF NOT EXISTS; the constraint drops (14 to 17) IF EXISTS; the
            // segment routes' backfills (31, 34) write what is not there yet; the claims
            // table's rename (33) IF EXISTS.
            assert!(
                code.contains("IF NOT EXISTS")
                    || code.contains("DROP CONSTRAINT IF EXISTS")
                    || code.contains("ALTER TABLE IF EXISTS")
                    || code.contains("ON CONFLICT (table_id, object_key) DO"),
                "migration {} must be idempotent",
                m.version
            );
            assert!(
                !code.to_lowercase().contains("pulpitum_v3"),
                "migration {} must not touch v3 tables",
                m.version
            );
        }
        for m in MIGRATIONS {
            if let Compat::Requires(v) = m.compat {
                assert!(
                    v >= 1 && v <= m.version,
                    "migration {} may require only a schema version up to its own",
                    m.version
                );
            }
        }
        assert_eq!(MIGRATIONS[0].checksum().len(), 64);
        assert_ne!(MIGRATIONS[0].checksum(), MIGRATIONS[1].checksum());
    }
}
