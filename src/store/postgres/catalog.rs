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
use crate::store::{Catalog, StoreError, StoreResult, TableDefinition};

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
}
