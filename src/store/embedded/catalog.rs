//! [`Catalog`] for the embedded store: migrations, table registration and lookup, the clock.
//!
//! A table's definition is registered once and never changes in strategy or surface (a
//! second registration that differs is [`StoreError::TableConflict`]); [`require_table`] is
//! also how an append learns its table's strategy and guard inside its own transaction.
//! The clock is the system clock (`clock_micros`), which every process sharing the
//! file reads alike.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Transaction};

use crate::model::{EventTime, TableId};
use crate::store::migrate::Migrated;
use crate::store::{Catalog, ReaderInfo, StoreError, StoreResult, StoredSchema, TableDefinition};

use super::decode::{corrupt, time};
use super::{backend, clock_micros, migrate, Mode, SqliteStore, TxError, TxResult};

fn table_from_row(
    r: &rusqlite::Row<'_>,
) -> rusqlite::Result<(String, String, Option<i64>, i32, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn table_def(row: (String, String, Option<i64>, i32, String)) -> TxResult<TableDefinition> {
    let (id, strategy, writable, version, surface) = row;
    Ok(TableDefinition {
        table_id: TableId::new(id.clone()).map_err(|e| corrupt(e.to_string()))?,
        strategy: strategy
            .parse()
            .map_err(|e| corrupt(format!("table {id}: {e}")))?,
        writable_buckets: writable
            .map(|n| {
                u32::try_from(n).map_err(|_| corrupt(format!("table {id}: writable_buckets {n}")))
            })
            .transpose()?,
        record_schema_version: version,
        surface,
    })
}

const TABLE_COLUMNS: &str =
    "table_id, bucket_strategy, writable_buckets, record_schema_version, surface";

fn load_table(tx: &Transaction<'_>, table_id: &TableId) -> TxResult<Option<TableDefinition>> {
    let sql = format!("SELECT {TABLE_COLUMNS} FROM pulpitum_v4_tables WHERE table_id = ?1");
    tx.prepare_cached(&sql)?
        .query_row([table_id.as_str()], table_from_row)
        .optional()?
        .map(table_def)
        .transpose()
}

pub(super) fn require_table(tx: &Transaction<'_>, table_id: &TableId) -> TxResult<TableDefinition> {
    load_table(tx, table_id)?
        .ok_or_else(|| TxError::Store(StoreError::UnknownTable(table_id.clone())))
}

fn newest_schema(tx: &Transaction<'_>, table_id: &TableId) -> TxResult<Option<StoredSchema>> {
    tx.prepare_cached(
        "SELECT schema_version, definition FROM pulpitum_v4_table_schemas \
         WHERE table_id = ?1 ORDER BY schema_version DESC LIMIT 1",
    )?
    .query_row([table_id.as_str()], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
    })
    .optional()?
    .map(|(v, definition)| {
        Ok(StoredSchema {
            version: u32::try_from(v).map_err(|_| corrupt(format!("table schema version {v}")))?,
            definition,
        })
    })
    .transpose()
}

#[async_trait]
impl Catalog for SqliteStore {
    async fn migrate(&self) -> StoreResult<Migrated> {
        let applied = self.run("migrate", Mode::Write, migrate::apply).await?;
        Ok(Migrated {
            applied,
            version: migrate::schema_version(),
        })
    }

    async fn check_schema(&self) -> StoreResult<i64> {
        self.run("check_schema", Mode::Read, |tx, _| migrate::check(tx))
            .await
    }

    async fn register_table(&self, def: &TableDefinition) -> StoreResult<TableDefinition> {
        let def = def.clone();
        self.run("register_table", Mode::Write, move |tx, now| {
            if let Some(existing) = load_table(tx, &def.table_id)? {
                if existing.strategy != def.strategy || existing.surface != def.surface {
                    return Err(StoreError::TableConflict {
                        table_id: def.table_id.clone(),
                        existing: format!("strategy {}, surface {}", existing.strategy, existing.surface),
                        requested: format!("strategy {}, surface {}", def.strategy, def.surface),
                    }
                    .into());
                }
                return Ok(existing);
            }
            tx.execute(
                "INSERT INTO pulpitum_v4_tables \
                 (table_id, bucket_strategy, writable_buckets, record_schema_version, surface, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    def.table_id.as_str(),
                    def.strategy.as_str(),
                    def.writable_buckets.map(i64::from),
                    def.record_schema_version,
                    def.surface,
                    now,
                ],
            )?;
            Ok(def.clone())
        })
        .await
    }

    async fn table_schema(&self, table_id: &TableId) -> StoreResult<Option<StoredSchema>> {
        let table_id = table_id.clone();
        self.run("table_schema", Mode::Read, move |tx, _| {
            newest_schema(tx, &table_id)
        })
        .await
    }

    async fn put_table_schema(&self, table_id: &TableId, schema: &StoredSchema) -> StoreResult<()> {
        let (table_id, schema) = (table_id.clone(), schema.clone());
        self.run("put_table_schema", Mode::Write, move |tx, now| {
            require_table(tx, &table_id)?;
            let newest = newest_schema(tx, &table_id)?;
            if newest.as_ref() == Some(&schema) {
                return Ok(());
            }
            let newest_version = newest.map_or(0, |n| n.version);
            if newest_version + 1 != schema.version {
                return Err(StoreError::SchemaChanged {
                    table_id: table_id.clone(),
                    from: schema.version.saturating_sub(1),
                    newest: newest_version,
                }
                .into());
            }
            tx.execute(
                "INSERT INTO pulpitum_v4_table_schemas \
                 (table_id, schema_version, definition, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![
                    table_id.as_str(),
                    i64::from(schema.version),
                    schema.definition,
                    now
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn announce_reader(&self, reader: &ReaderInfo) -> StoreResult<()> {
        let r = reader.clone();
        self.run("announce_reader", Mode::Write, move |tx, now| {
            tx.execute(
                "INSERT INTO pulpitum_v4_readers \
                 (reader_id, role, build, record_schema, schema_format, seen_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (reader_id) DO UPDATE SET role = excluded.role, \
                 build = excluded.build, record_schema = excluded.record_schema, \
                 schema_format = excluded.schema_format, seen_at = excluded.seen_at",
                params![
                    r.reader_id,
                    r.role,
                    r.build,
                    i64::from(r.record_schema),
                    i64::from(r.schema_format),
                    now
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn withdraw_reader(&self, reader_id: &str) -> StoreResult<()> {
        let id = reader_id.to_string();
        self.run("withdraw_reader", Mode::Write, move |tx, _| {
            tx.execute(
                "DELETE FROM pulpitum_v4_readers WHERE reader_id = ?1",
                params![id],
            )?;
            Ok(())
        })
        .await
    }

    async fn readers_since(&self, since: EventTime) -> StoreResult<Vec<ReaderInfo>> {
        let since = since.as_micros();
        self.run("readers_since", Mode::Read, move |tx, _| {
            let mut stmt = tx.prepare(
                "SELECT reader_id, role, build, record_schema, schema_format, seen_at \
                 FROM pulpitum_v4_readers WHERE seen_at >= ?1 ORDER BY seen_at, reader_id",
            )?;
            let rows = stmt.query_map(params![since], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (reader_id, role, build, record, format, seen) = row?;
                let (Ok(record_schema), Ok(schema_format), Ok(seen_at)) = (
                    u32::try_from(record),
                    u32::try_from(format),
                    time(seen, "reader seen_at"),
                ) else {
                    tracing::warn!(reader = %reader_id, "reader registry row left out: out of range");
                    continue;
                };
                out.push(ReaderInfo {
                    reader_id,
                    role,
                    build,
                    record_schema,
                    schema_format,
                    seen_at,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn forget_readers(&self, before: EventTime, after: EventTime) -> StoreResult<u64> {
        let (before, after) = (before.as_micros(), after.as_micros());
        self.run("forget_readers", Mode::Write, move |tx, _| {
            Ok(tx.execute(
                "DELETE FROM pulpitum_v4_readers WHERE seen_at < ?1 OR seen_at > ?2",
                params![before, after],
            )? as u64)
        })
        .await
    }

    async fn table(&self, table_id: &TableId) -> StoreResult<Option<TableDefinition>> {
        let table_id = table_id.clone();
        self.run("table", Mode::Read, move |tx, _| load_table(tx, &table_id))
            .await
    }

    async fn tables(&self) -> StoreResult<Vec<TableDefinition>> {
        self.run("tables", Mode::Read, |tx, _| {
            let mut stmt = tx.prepare(&format!(
                "SELECT {TABLE_COLUMNS} FROM pulpitum_v4_tables ORDER BY table_id"
            ))?;
            let rows = stmt.query_map([], table_from_row)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(table_def(row?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn now(&self) -> StoreResult<EventTime> {
        Ok(time(clock_micros(), "store clock").map_err(|e| match e {
            TxError::Store(s) => s,
            TxError::Sql(s) => backend("now", s),
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::tid;
    use super::super::{lock, migrate};
    use super::*;
    use crate::model::BucketStrategy;

    fn ledger(s: &SqliteStore) -> Vec<(i64, String)> {
        let c = lock(&s.inner.writer);
        let mut st = c
            .prepare("SELECT version, name FROM pulpitum_v4_schema_migrations ORDER BY version")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[tokio::test]
    async fn migrations_apply_once_and_refuse_foreign_bookkeeping() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.migrate().await.unwrap();
        s.migrate().await.unwrap();
        let want: Vec<(i64, String)> = migrate::MIGRATIONS
            .iter()
            .map(|m| (m.version, m.name.to_string()))
            .collect();
        assert_eq!(ledger(&s), want);

        lock(&s.inner.writer)
            .execute(
                "UPDATE pulpitum_v4_schema_migrations SET checksum = 'x' WHERE version = 2",
                [],
            )
            .unwrap();
        let err = s.migrate().await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Migration(m) if m.contains("different SQL")),
            "{err}"
        );

        let sum = migrate::checksum(migrate::MIGRATIONS[1].sql);
        lock(&s.inner.writer)
            .execute(
                "UPDATE pulpitum_v4_schema_migrations SET checksum = ?1 WHERE version = 2",
                [sum],
            )
            .unwrap();
        lock(&s.inner.writer)
            .execute(
                // No `requires_version`: a newer build's migration of unknown compatibility
                // counts as breaking.
                "INSERT INTO pulpitum_v4_schema_migrations (version, name, checksum, applied_at) \
                 VALUES (99, 'future', 'x', 0)",
                [],
            )
            .unwrap();
        let err = s.migrate().await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Migration(m) if m.contains("migration 99 (future)")),
            "{err}"
        );
    }

    /// The check a start runs reads the ledger and changes nothing: a new file, a ledger
    /// without this build's last migration and one from before `requires_version` are
    /// behind (naming `pulpitum migrate`), a newer breaking migration is refused.
    #[tokio::test]
    async fn the_schema_check_names_what_is_missing_and_changes_nothing() {
        let s = SqliteStore::open_in_memory().unwrap();
        let e = s.check_schema().await.unwrap_err();
        assert!(
            matches!(&e, StoreError::SchemaBehind { detail } if detail.contains("no Pulpitum schema")),
            "{e}"
        );
        assert!(e.to_string().contains("run `pulpitum migrate`"), "{e}");
        assert!(ledger_absent(&s), "the check created the ledger");
        s.migrate().await.unwrap();
        assert_eq!(s.check_schema().await.unwrap(), migrate::schema_version());

        let last = migrate::schema_version();
        lock(&s.inner.writer)
            .execute(
                "DELETE FROM pulpitum_v4_schema_migrations WHERE version = ?1",
                [last],
            )
            .unwrap();
        let e = s.check_schema().await.unwrap_err().to_string();
        assert!(
            e.contains(&format!("migration {last} (")) && e.contains("is not applied"),
            "{e}"
        );
        assert_eq!(
            ledger(&s).len() as i64,
            last - 1,
            "the check applied nothing"
        );

        // (Embedded migrations are plain CREATEs in one transaction, never half applied, so
        // a ledger row removed by hand is not repaired by `migrate`: a fresh store here.)
        let s = SqliteStore::open_in_memory().unwrap();
        s.migrate().await.unwrap();
        lock(&s.inner.writer)
            .execute(
                "INSERT INTO pulpitum_v4_schema_migrations \
                 (version, name, checksum, applied_at, requires_version) \
                 VALUES (?1, 'newer', 'x', 0, ?1)",
                [last + 1],
            )
            .unwrap();
        let e = s.check_schema().await.unwrap_err().to_string();
        assert!(e.contains("run a newer build"), "{e}");

        let old = SqliteStore::open_in_memory().unwrap();
        lock(&old.inner.writer)
            .execute_batch(
                "CREATE TABLE pulpitum_v4_schema_migrations (version INTEGER PRIMARY KEY, \
                 name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)",
            )
            .unwrap();
        let e = old.check_schema().await.unwrap_err().to_string();
        assert!(e.contains("ledger predates this build"), "{e}");
    }

    fn ledger_absent(s: &SqliteStore) -> bool {
        lock(&s.inner.writer)
            .query_row(
                "SELECT count(*) = 0 FROM sqlite_master WHERE name = 'pulpitum_v4_schema_migrations'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    }

    #[tokio::test]
    async fn registration_is_immutable_in_strategy_and_surface() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.migrate().await.unwrap();
        let mut def = TableDefinition::new(tid("chat"), BucketStrategy::CalendarDayUtc, "chat");
        def.writable_buckets = Some(3);
        assert_eq!(s.register_table(&def).await.unwrap(), def);
        assert_eq!(s.register_table(&def).await.unwrap(), def);

        let other_strategy = TableDefinition {
            strategy: BucketStrategy::CalendarMonthUtc,
            ..def.clone()
        };
        let err = s.register_table(&other_strategy).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::TableConflict { existing, requested, .. }
                if existing.contains("calendar_day_utc") && requested.contains("calendar_month_utc")),
            "{err}"
        );
        let other_surface = TableDefinition {
            surface: "raw".into(),
            ..def.clone()
        };
        assert!(matches!(
            s.register_table(&other_surface).await,
            Err(StoreError::TableConflict { .. })
        ));
        // A different guard is not a conflict: the stored row is returned unchanged.
        let other_guard = TableDefinition {
            writable_buckets: None,
            ..def.clone()
        };
        assert_eq!(s.register_table(&other_guard).await.unwrap(), def);

        let raw = TableDefinition::new(tid("audit"), BucketStrategy::CalendarYearUtc, "raw");
        s.register_table(&raw).await.unwrap();
        assert_eq!(s.tables().await.unwrap(), vec![raw.clone(), def.clone()]);
        assert_eq!(s.table(&tid("chat")).await.unwrap(), Some(def));
        assert_eq!(s.table(&tid("nope")).await.unwrap(), None);
    }
}
