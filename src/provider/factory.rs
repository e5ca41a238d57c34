//! `CREATE EXTERNAL TABLE name STORED AS PULPITUM LOCATION '' OPTIONS (...)`.
//!
//! The factory validates the options, persists the definition in the hot store's registry
//! (`HotStore::register_table`: the same definition again is a no-op, a different strategy
//! or surface for an existing name is refused) and returns the provider. Options:
//! `surface` (`chat`, the default, or `raw`), `bucket_strategy` (`calendar_year_utc`, the
//! default, `calendar_month_utc`, `calendar_day_utc`) and `writable_buckets` (a positive
//! integer: appends only into the newest N buckets).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::CreateExternalTable;

use super::surface::Surface;
use super::{ProviderError, ProviderOptions, PulpitumTable};
use crate::archive::ArchiveStore;
use crate::model::{BucketStrategy, TableId};
use crate::store::{HotStore, TableDefinition};
use crate::table::{DurableTable, RouteCacheConfig, TableError};

/// The `STORED AS` name of Pulpitum tables.
pub const FORMAT_NAME: &str = "PULPITUM";

/// Creates Pulpitum tables from SQL.
#[derive(Clone)]
pub struct PulpitumTableFactory {
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    options: ProviderOptions,
    cache: RouteCacheConfig,
}

impl std::fmt::Debug for PulpitumTableFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PulpitumTableFactory")
            .field("options", &self.options)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl PulpitumTableFactory {
    /// A factory over one store and archive.
    pub fn new(
        store: Arc<dyn HotStore>,
        archive: Arc<ArchiveStore>,
        options: ProviderOptions,
        cache: RouteCacheConfig,
    ) -> Self {
        Self {
            store,
            archive,
            options,
            cache,
        }
    }

    /// The provider of an already registered table.
    pub fn provider(&self, def: TableDefinition) -> Result<PulpitumTable, ProviderError> {
        let table =
            DurableTable::with_cache(self.store.clone(), self.archive.clone(), def, self.cache);
        PulpitumTable::try_new(table, self.options)
    }

    /// Parses the options of a `CREATE EXTERNAL TABLE` into a definition.
    pub fn definition(cmd: &CreateExternalTable) -> Result<TableDefinition, ProviderError> {
        let bad = |m: String| ProviderError::InvalidDefinition(m);
        let table_id = TableId::new(cmd.name.table())?;
        let mut surface = Surface::Chat;
        let mut strategy = BucketStrategy::default();
        let mut writable = None;
        let mut keys: Vec<_> = cmd.options.iter().collect();
        keys.sort();
        for (k, v) in keys {
            let key = k.strip_prefix("format.").unwrap_or(k);
            match key {
                "surface" => surface = Surface::parse(v)?,
                "bucket_strategy" => strategy = v.parse()?,
                "writable_buckets" => {
                    let n: u32 = v
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad(format!("writable_buckets must be a positive integer, got {v:?}")))?;
                    writable = Some(n);
                }
                other => {
                    return Err(bad(format!(
                        "unknown option {other:?} (expected surface, bucket_strategy, writable_buckets)"
                    )))
                }
            }
        }
        if !cmd.locations.iter().all(|l| l.is_empty()) {
            return Err(bad(format!(
                "LOCATION must be '' (the table lives in the configured store), got {:?}",
                cmd.locations
            )));
        }
        if !cmd.table_partition_cols.is_empty() || !cmd.order_exprs.is_empty() {
            return Err(bad(
                "PARTITIONED BY and WITH ORDER are fixed by the surface".into(),
            ));
        }
        if !cmd.schema.fields().is_empty() {
            let want = surface.schema();
            let names: Vec<&str> = cmd
                .schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            let expected: Vec<&str> = want.fields().iter().map(|f| f.name().as_str()).collect();
            let types_ok = cmd
                .schema
                .fields()
                .iter()
                .zip(want.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
            if names != expected || !types_ok {
                return Err(bad(format!(
                    "the {} surface has the columns ({}); omit the column list or match it",
                    surface.as_str(),
                    want.fields()
                        .iter()
                        .map(|f| format!("{} {}", f.name(), f.data_type()))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let mut def = TableDefinition::new(table_id, strategy, surface.as_str());
        def.writable_buckets = writable;
        Ok(def)
    }
}

#[async_trait]
impl TableProviderFactory for PulpitumTableFactory {
    async fn create(
        &self,
        _state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> DFResult<Arc<dyn TableProvider>> {
        let def = Self::definition(cmd)?;
        let stored = self
            .store
            .register_table(&def)
            .await
            .map_err(|e| DataFusionError::from(ProviderError::Table(TableError::Store(e))))?;
        Ok(Arc::new(self.provider(stored)?))
    }
}
