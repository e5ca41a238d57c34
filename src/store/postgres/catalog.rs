//! [`Catalog`] on PostgreSQL: running the migrations, the table registry and the store's
//! clock.
//!
//! Registering a table is one serializable transaction (insert if absent, read back), so
//! concurrent registrations agree on one definition; definitions are cached once read,
//! since they never change.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_postgres::IsolationLevel;

use super::decode::{decode_table, event_time};
use super::{migrate, PgStore, TxError};
use crate::model::{EventTime, TableId};
use crate::store::migrate::Migrated;
use crate::store::{Catalog, ReaderInfo, StoreError, StoreResult, StoredSchema, TableDefinition};

/// A version as the registry's `INT4`.
fn version_i32(v: u32) -> StoreResult<i32> {
    i32::try_from(v).map_err(|_| StoreError::Config(format!("version {v} too large")))
}

#[async_trait]
impl Catalog for PgStore {
    async fn migrate(&self) -> StoreResult<Migrated> {
        let client = self.raw_client().await?;
        let applied = migrate::migrate(&client).await?;
        Ok(Migrated {
            applied: applied.into_iter().map(i64::from).collect(),
            version: migrate::schema_version().into(),
        })
    }

    async fn check_schema(&self) -> StoreResult<i64> {
        let client = self.raw_client().await?;
        migrate::check(&client, migrate::MIGRATIONS).await
    }

    async fn register_table(&self, def: &TableDefinition) -> StoreResult<TableDefinition> {
        let writable: Option<i32> = match def.writable_buckets {
            None => None,
            Some(n) => Some(i32::try_from(n).map_err(|_| {
                StoreError::Config(format!(
                    "writable_buckets {n} is larger than the store allows"
                ))
            })?),
        };
        let stored = self
            .run("register_table", || async {
                let mut client = self.pooled().await?;
                let tx = client
                    .build_transaction()
                    .isolation_level(IsolationLevel::Serializable)
                    .start()
                    .await?;
                tx.execute(
                    "INSERT INTO pulpitum_v4_tables \
                     (table_id, bucket_strategy, writable_buckets, record_schema_version, surface) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (table_id) DO NOTHING",
                    &[
                        &def.table_id.as_str(),
                        &def.strategy.as_str(),
                        &writable,
                        &def.record_schema_version,
                        &def.surface,
                    ],
                )
                .await?;
                let row = tx
                    .query_one(
                        "SELECT table_id, bucket_strategy, writable_buckets, record_schema_version, surface \
                         FROM pulpitum_v4_tables WHERE table_id = $1",
                        &[&def.table_id.as_str()],
                    )
                    .await?;
                let stored = decode_table(&row)?;
                tx.commit().await.map_err(TxError::Commit)?;
                Ok(stored)
            })
            .await?;
        self.cache(&stored);
        if &stored != def {
            let summary = |d: &TableDefinition| {
                format!(
                    "(strategy {}, writable_buckets {:?}, record schema {}, surface {})",
                    d.strategy, d.writable_buckets, d.record_schema_version, d.surface
                )
            };
            return Err(StoreError::TableConflict {
                table_id: def.table_id.clone(),
                existing: summary(&stored),
                requested: summary(def),
            });
        }
        Ok(stored)
    }

    async fn table(&self, table_id: &TableId) -> StoreResult<Option<TableDefinition>> {
        if let Some(def) = self
            .tables
            .read()
            .ok()
            .and_then(|t| t.get(table_id).cloned())
        {
            return Ok(Some(def));
        }
        let def = self
            .run("table", || async {
                let client = self.pooled().await?;
                let row = client
                    .query_opt(
                        "SELECT table_id, bucket_strategy, writable_buckets, record_schema_version, surface \
                         FROM pulpitum_v4_tables WHERE table_id = $1",
                        &[&table_id.as_str()],
                    )
                    .await?;
                Ok(row.map(|r| decode_table(&r)).transpose()?)
            })
            .await?;
        if let Some(d) = &def {
            self.cache(d);
        }
        Ok(def)
    }

    async fn tables(&self) -> StoreResult<Vec<TableDefinition>> {
        self.run("tables", || async {
            let client = self.pooled().await?;
            let rows = client
                .query(
                    "SELECT table_id, bucket_strategy, writable_buckets, record_schema_version, surface \
                     FROM pulpitum_v4_tables ORDER BY table_id",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(decode_table).collect::<StoreResult<Vec<_>>>()?)
        })
        .await
    }

    async fn now(&self) -> StoreResult<EventTime> {
        self.run("now", || async {
            let client = self.pooled().await?;
            let row = client.query_one("SELECT now()", &[]).await?;
            let now: DateTime<Utc> = row.try_get(0)?;
            Ok(event_time(now, "store clock")?)
        })
        .await
    }

    async fn table_schema(&self, table_id: &TableId) -> StoreResult<Option<StoredSchema>> {
        self.run("table_schema", || async {
            let client = self.pooled().await?;
            let row = client
                .query_opt(
                    "SELECT schema_version, definition FROM pulpitum_v4_table_schemas \
                     WHERE table_id = $1 ORDER BY schema_version DESC LIMIT 1",
                    &[&table_id.as_str()],
                )
                .await?;
            row.map(|r| stored_schema(&r)).transpose()
        })
        .await
    }

    async fn announce_reader(&self, reader: &ReaderInfo) -> StoreResult<()> {
        let (record, format) = (
            version_i32(reader.record_schema)?,
            version_i32(reader.schema_format)?,
        );
        self.run("announce_reader", || async {
            let client = self.pooled().await?;
            client
                .execute(
                    "INSERT INTO pulpitum_v4_readers \
                     (reader_id, role, build, record_schema, schema_format, seen_at) \
                     VALUES ($1, $2, $3, $4, $5, now()) \
                     ON CONFLICT (reader_id) DO UPDATE SET role = excluded.role, \
                     build = excluded.build, record_schema = excluded.record_schema, \
                     schema_format = excluded.schema_format, seen_at = excluded.seen_at",
                    &[
                        &reader.reader_id,
                        &reader.role,
                        &reader.build,
                        &record,
                        &format,
                    ],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn withdraw_reader(&self, reader_id: &str) -> StoreResult<()> {
        self.run("withdraw_reader", || async {
            let client = self.pooled().await?;
            client
                .execute(
                    "DELETE FROM pulpitum_v4_readers WHERE reader_id = $1",
                    &[&reader_id],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn readers_since(&self, since: EventTime) -> StoreResult<Vec<ReaderInfo>> {
        let since = since.to_datetime();
        self.run("readers_since", || async {
            let client = self.pooled().await?;
            let rows = client
                .query(
                    "SELECT reader_id, role, build, record_schema, schema_format, seen_at \
                     FROM pulpitum_v4_readers WHERE seen_at >= $1 ORDER BY seen_at, reader_id",
                    &[&since],
                )
                .await?;
            let decode = |r: &tokio_postgres::Row| -> StoreResult<ReaderInfo> {
                let get =
                    |e: tokio_postgres::Error| StoreError::Corrupt(format!("reader row: {e}"));
                let version = |v: i32| {
                    u32::try_from(v)
                        .map_err(|_| StoreError::Corrupt(format!("reader row: version {v}")))
                };
                Ok(ReaderInfo {
                    reader_id: r.try_get(0).map_err(get)?,
                    role: r.try_get(1).map_err(get)?,
                    build: r.try_get(2).map_err(get)?,
                    record_schema: version(r.try_get(3).map_err(get)?)?,
                    schema_format: version(r.try_get(4).map_err(get)?)?,
                    seen_at: event_time(r.try_get(5).map_err(get)?, "reader seen_at")?,
                })
            };
            Ok(rows
                .iter()
                .filter_map(|r| match decode(r) {
                    Ok(reader) => Some(reader),
                    Err(e) => {
                        tracing::warn!(error = %e, "reader registry row left out");
                        None
                    }
                })
                .collect())
        })
        .await
    }

    async fn forget_readers(&self, before: EventTime, after: EventTime) -> StoreResult<u64> {
        let (before, after) = (before.to_datetime(), after.to_datetime());
        self.run("forget_readers", || async {
            let client = self.pooled().await?;
            Ok(client
                .execute(
                    "DELETE FROM pulpitum_v4_readers WHERE seen_at < $1 OR seen_at > $2",
                    &[&before, &after],
                )
                .await?)
        })
        .await
    }

    async fn put_table_schema(&self, table_id: &TableId, schema: &StoredSchema) -> StoreResult<()> {
        let version = i32::try_from(schema.version).map_err(|_| {
            StoreError::Config(format!("schema version {} too large", schema.version))
        })?;
        self.run("put_table_schema", || async {
            let mut client = self.pooled().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .await?;
            let known = tx
                .query_opt(
                    "SELECT 1 FROM pulpitum_v4_tables WHERE table_id = $1",
                    &[&table_id.as_str()],
                )
                .await?;
            if known.is_none() {
                return Err(TxError::Store(StoreError::UnknownTable(table_id.clone())));
            }
            let newest = tx
                .query_opt(
                    "SELECT schema_version, definition FROM pulpitum_v4_table_schemas \
                     WHERE table_id = $1 ORDER BY schema_version DESC LIMIT 1",
                    &[&table_id.as_str()],
                )
                .await?
                .map(|r| stored_schema(&r))
                .transpose()?;
            if let Some(n) = &newest {
                if n == schema {
                    return Ok(());
                }
            }
            let newest_version = newest.map_or(0, |n| n.version);
            let changed = || {
                TxError::Store(StoreError::SchemaChanged {
                    table_id: table_id.clone(),
                    from: schema.version.saturating_sub(1),
                    newest: newest_version,
                })
            };
            if newest_version + 1 != schema.version {
                return Err(changed());
            }
            let n = tx
                .execute(
                    "INSERT INTO pulpitum_v4_table_schemas (table_id, schema_version, definition) \
                     VALUES ($1, $2, $3) ON CONFLICT (table_id, schema_version) DO NOTHING",
                    &[&table_id.as_str(), &version, &schema.definition],
                )
                .await?;
            if n != 1 {
                return Err(changed());
            }
            tx.commit().await.map_err(TxError::Commit)?;
            Ok(())
        })
        .await
    }
}

fn stored_schema(r: &tokio_postgres::Row) -> Result<StoredSchema, TxError> {
    let v: i32 = r.try_get(0)?;
    Ok(StoredSchema {
        version: u32::try_from(v).map_err(|_| {
            TxError::Store(StoreError::Corrupt(format!("table schema version {v}")))
        })?,
        definition: r.try_get(1)?,
    })
}
