//! `CREATE EXTERNAL TABLE name STORED AS PULPITUM LOCATION '' OPTIONS (...)`, and what
//! the session's catalog does with Pulpitum tables.
//!
//! The factory validates the options and the column list, then compares the definition
//! with the hot store's registry: the identical definition of an existing table is a
//! no-op (with or without `IF NOT EXISTS`), a different one is refused naming every field
//! that differs, and a new one is persisted with `HotStore::register_table`. Options:
//! `surface` (`chat`, the default, or `raw`), `bucket_strategy` (`calendar_year_utc`, the
//! default, `calendar_month_utc`, `calendar_day_utc`) and `writable_buckets` (a positive
//! integer: appends only into the newest N buckets).
//!
//! DataFusion decides whether to call a factory from its catalog: a name it finds is either
//! an error or, with `IF NOT EXISTS`, skipped without looking at the definition. So the
//! session's default schema is a [`PulpitumSchema`], which resolves Pulpitum tables as
//! usual but does not report them to that existence check, so every `CREATE EXTERNAL
//! TABLE` reaches the registry. It also refuses to deregister a Pulpitum table: `DROP
//! TABLE` would otherwise remove it from one session while the registry brings it back in
//! the next (see [`DROP_REFUSED`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::{SchemaProvider, Session, TableProvider, TableProviderFactory};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::{CreateExternalTable, DdlStatement, LogicalPlan, WriteOp};
use datafusion::prelude::SessionContext;

use super::surface::{declared, Surface};
use super::{ProviderError, ProviderOptions, PulpitumTable};
use crate::archive::ArchiveStore;
use crate::model::schema::TableSchema;
use crate::model::{BucketStrategy, TableId};
use crate::table::{
    DurableTable, HotStore, RouteCacheConfig, StoreError, TableDefinition, TableError,
};

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

/// Names every session gives its system tables (see `crate::control::system`); a table may
/// not take one.
pub const RESERVED_TABLE_NAMES: [&str; 5] = [
    "pulpitum_tables",
    "pulpitum_buckets",
    "pulpitum_jobs",
    "pulpitum_compactions",
    "pulpitum_retired_objects",
];

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

    /// The provider of the table registered under `name`, if any: how a session finds a
    /// table that another process registered after the session was built.
    pub async fn resolve(&self, name: &str) -> Result<Option<PulpitumTable>, ProviderError> {
        // A name that cannot be a table id is no table (and costs no store round trip).
        let Ok(id) = TableId::new(name) else {
            return Ok(None);
        };
        let def = self
            .store
            .table(&id)
            .await
            .map_err(|e| ProviderError::Table(TableError::Store(e)))?;
        match def {
            Some(d) => Ok(Some(self.provider(d).await?)),
            None => Ok(None),
        }
    }

    /// The provider of an already registered table; a declared table's at the newest
    /// version of its schema.
    pub async fn provider(&self, def: TableDefinition) -> Result<PulpitumTable, ProviderError> {
        let surface = if def.surface == declared::NAME {
            let schema = self.declared_schema(&def.table_id).await?;
            Surface::declared(schema)
        } else {
            Surface::parse(&def.surface)?
        };
        let table =
            DurableTable::with_cache(self.store.clone(), self.archive.clone(), def, self.cache);
        Ok(PulpitumTable::with_surface(table, surface, self.options))
    }

    /// The newest schema of a declared table.
    pub async fn declared_schema(&self, table: &TableId) -> Result<TableSchema, ProviderError> {
        let stored = self
            .store
            .table_schema(table)
            .await
            .map_err(|e| ProviderError::Table(TableError::Store(e)))?
            .ok_or_else(|| {
                ProviderError::InvalidDefinition(format!(
                    "declared table {table} has no stored schema (its CREATE EXTERNAL TABLE \
                     was interrupted): run the same CREATE EXTERNAL TABLE again"
                ))
            })?;
        let schema = TableSchema::from_json(&stored.definition)
            .map_err(|e| ProviderError::InvalidDefinition(format!("table {table}: {e}")))?;
        if schema.version != stored.version {
            return Err(ProviderError::InvalidDefinition(format!(
                "table {table}: schema version {} is stored as version {}",
                schema.version, stored.version
            )));
        }
        Ok(schema)
    }

    /// Parses the options of a `CREATE EXTERNAL TABLE` into a definition.
    pub fn definition(cmd: &CreateExternalTable) -> Result<TableDefinition, ProviderError> {
        let bad = |m: String| ProviderError::InvalidDefinition(m);
        let table_id = TableId::new(cmd.name.table())?;
        if RESERVED_TABLE_NAMES.contains(&table_id.as_str()) {
            return Err(bad(format!(
                "{table_id} is the name of a system table; choose another name"
            )));
        }
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
        check_columns(&surface, cmd)?;
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
        let store_err = |e| DataFusionError::from(ProviderError::Table(TableError::Store(e)));
        let stored = match self.store.table(&def.table_id).await.map_err(store_err)? {
            Some(existing) => existing,
            None => match self.store.register_table(&def).await {
                Ok(stored) => stored,
                // Registered by another session since the lookup: compare with that one.
                Err(StoreError::TableConflict { .. }) => self
                    .store
                    .table(&def.table_id)
                    .await
                    .map_err(store_err)?
                    .ok_or_else(|| {
                        DataFusionError::Execution(format!(
                            "table {} changed while being created; run the statement again",
                            def.table_id
                        ))
                    })?,
                Err(e) => return Err(store_err(e)),
            },
        };
        let differences = differences(&stored, &def);
        if !differences.is_empty() {
            return Err(ProviderError::InvalidDefinition(format!(
                "table {} already exists with another definition: {}; a table's definition \
                 cannot change (create a table under another name instead)",
                def.table_id,
                differences.join(", ")
            ))
            .into());
        }
        Ok(Arc::new(self.provider(stored).await?))
    }
}

/// The user-visible fields in which a stored definition and a requested one differ, as
/// `field is <stored>, not <requested>`. The record schema version is the store's business
/// (a table keeps the version it was created with), so it is not compared.
fn differences(stored: &TableDefinition, requested: &TableDefinition) -> Vec<String> {
    let guard = |n: Option<u32>| n.map_or_else(|| "unset".to_string(), |n| n.to_string());
    let mut out = Vec::new();
    if stored.surface != requested.surface {
        out.push(format!(
            "surface is {}, not {}",
            stored.surface, requested.surface
        ));
    }
    if stored.strategy != requested.strategy {
        out.push(format!(
            "bucket_strategy is {}, not {}",
            stored.strategy, requested.strategy
        ));
    }
    if stored.writable_buckets != requested.writable_buckets {
        out.push(format!(
            "writable_buckets is {}, not {}",
            guard(stored.writable_buckets),
            guard(requested.writable_buckets)
        ));
    }
    out
}

/// Checks a `CREATE EXTERNAL TABLE` column list against the surface: the same names in the
/// same order, each with a type a PostgreSQL user would write for it. DataFusion has
/// already turned the SQL types into Arrow types, so spellings collapse: `BIGINT` and
/// `INT8` are `Int64`; `TEXT`, `VARCHAR` and `STRING` are `Utf8`/`Utf8View`; `BYTEA` is
/// `Binary`; `TIMESTAMPTZ`, `TIMESTAMP WITH TIME ZONE` and, because the session has no
/// time zone to tell them apart, plain `TIMESTAMP`, are `Timestamp` (any precision: the
/// table keeps microseconds whatever the list says, and INSERT refuses finer values).
fn check_columns(surface: &Surface, cmd: &CreateExternalTable) -> Result<(), ProviderError> {
    let declared = cmd.schema.fields();
    if declared.is_empty() {
        return Ok(());
    }
    let want = surface.schema();
    let expected = want
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), sql_type(f.data_type())))
        .collect::<Vec<_>>()
        .join(", ");
    if declared.len() != want.fields().len() {
        return Err(ProviderError::InvalidDefinition(format!(
            "the {} surface has the columns ({expected}); the column list has {} column{}: \
             omit the column list or match it",
            surface.as_str(),
            declared.len(),
            if declared.len() == 1 { "" } else { "s" }
        )));
    }
    for (i, (got, want)) in declared.iter().zip(want.fields()).enumerate() {
        if got.name() != want.name() {
            return Err(ProviderError::InvalidDefinition(format!(
                "column {} is named {:?}, but the {} surface's column {} is {:?} (the surface \
                 has the columns ({expected}))",
                i + 1,
                got.name(),
                surface.as_str(),
                i + 1,
                want.name()
            )));
        }
        if !same_type(got.data_type(), want.data_type()) {
            return Err(ProviderError::InvalidDefinition(format!(
                "column {} is declared {}, but the {} surface stores it as {} (the surface has \
                 the columns ({expected}))",
                got.name(),
                sql_type(got.data_type()),
                surface.as_str(),
                sql_type(want.data_type())
            )));
        }
    }
    Ok(())
}

/// Whether a declared column type is a spelling of the surface's type (see
/// [`check_columns`]).
fn same_type(declared: &DataType, surface: &DataType) -> bool {
    use DataType as D;
    match (declared, surface) {
        (D::Int64, D::Int64) => true,
        (D::Utf8 | D::Utf8View | D::LargeUtf8, D::Utf8) => true,
        (D::Binary | D::BinaryView | D::LargeBinary, D::Binary) => true,
        (D::Timestamp(_, tz), D::Timestamp(_, _)) => tz
            .as_deref()
            .is_none_or(|tz| matches!(tz, "UTC" | "+00:00" | "Z" | "+00")),
        _ => false,
    }
}

/// The PostgreSQL name of an Arrow type, for messages (the Arrow name when there is none).
fn sql_type(t: &DataType) -> String {
    use DataType as D;
    match t {
        D::Int16 => "SMALLINT".into(),
        D::Int32 => "INT".into(),
        D::Int64 => "BIGINT".into(),
        D::Float32 => "REAL".into(),
        D::Float64 => "DOUBLE PRECISION".into(),
        D::Boolean => "BOOLEAN".into(),
        D::Date32 | D::Date64 => "DATE".into(),
        D::Utf8 | D::Utf8View | D::LargeUtf8 => "TEXT".into(),
        D::Binary | D::BinaryView | D::LargeBinary => "BYTEA".into(),
        D::Timestamp(_, Some(_)) => "TIMESTAMPTZ".into(),
        D::Timestamp(_, None) => "TIMESTAMP".into(),
        other => other.to_string(),
    }
}

/// The error of `DROP TABLE` on a Pulpitum table (and of deregistering one).
pub const DROP_REFUSED: &str = "DROP TABLE is not supported for Pulpitum tables: the table's \
    definition, hot rows, bucket routes and archived objects would all stay, and the table \
    would return in the next session (tables are append-only; see \"Dropping a table\" in \
    docs/sql.md)";

/// The error of `DELETE`, `UPDATE`, `TRUNCATE` or `MERGE` on a Pulpitum table: what is not
/// supported yet, and what to do instead.
pub fn change_refused(table: &str, op: &str) -> DataFusionError {
    let instead = if op == "MERGE" {
        "use UPDATE, and INSERT for new rows"
    } else {
        "use DELETE FROM with a WHERE naming the rows (docs/sql.md)"
    };
    DataFusionError::Plan(format!(
        "table {table}: {op} is not supported for Pulpitum tables yet; {instead}"
    ))
}

/// The session's default schema: DataFusion's in-memory schema, except that Pulpitum
/// tables are hidden from `table_exist` (so that `CREATE EXTERNAL TABLE` always reaches
/// the factory, which compares definitions) and cannot be deregistered (`DROP TABLE` is
/// refused with [`DROP_REFUSED`]).
#[derive(Debug, Default)]
pub struct PulpitumSchema {
    tables: RwLock<HashMap<String, Arc<dyn TableProvider>>>,
    /// When each declared table's schema version was last compared with the registry, and
    /// the stale epoch then.
    checked: std::sync::Mutex<HashMap<String, (std::time::Instant, u64)>>,
    /// Finds tables registered after the session was built (by another process), on their
    /// first use; `None` keeps the schema to what was registered in it.
    resolver: Option<PulpitumTableFactory>,
}

pub(crate) fn is_pulpitum(t: &Arc<dyn TableProvider>) -> bool {
    t.downcast_ref::<PulpitumTable>().is_some()
}

impl PulpitumSchema {
    /// Makes this the default schema of `ctx`'s default catalog (before any table is
    /// registered: tables already there are not carried over). With a `resolver`, a table
    /// registered in the store later (by the shell, another service) is found on its first
    /// use, so a long-running session (the wire server) needs no restart to see it; it is
    /// listed (`information_schema`, psql's `\dt`) from then on.
    pub fn install(ctx: &SessionContext, resolver: Option<PulpitumTableFactory>) -> DFResult<()> {
        let state = ctx.state();
        let names = &state.config_options().catalog;
        let catalog = ctx.catalog(&names.default_catalog).ok_or_else(|| {
            DataFusionError::Internal(format!("no catalog {}", names.default_catalog))
        })?;
        let schema = Self {
            tables: RwLock::default(),
            checked: Default::default(),
            resolver,
        };
        catalog.register_schema(&names.default_schema, Arc::new(schema))?;
        Ok(())
    }

    /// A cached declared table's provider, rebuilt when the registry holds a newer schema
    /// version (changed by another process); compared at most once per
    /// [`SCHEMA_RECHECK`] per table, so a change made elsewhere is seen within that.
    async fn recheck(
        &self,
        name: &str,
        cached: Arc<dyn TableProvider>,
    ) -> DFResult<Arc<dyn TableProvider>> {
        let (Some(resolver), Some(table)) =
            (&self.resolver, cached.downcast_ref::<PulpitumTable>())
        else {
            return Ok(cached);
        };
        let Surface::Declared(d) = table.surface() else {
            return Ok(cached);
        };
        {
            let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            let epoch = STALE_EPOCH.load(std::sync::atomic::Ordering::SeqCst);
            match checked.get(name) {
                Some((at, e)) if *e == epoch && now.duration_since(*at) < SCHEMA_RECHECK => {
                    return Ok(cached)
                }
                _ => {
                    checked.insert(name.to_string(), (now, epoch));
                }
            }
        }
        let newest = resolver
            .declared_schema(&table.table().definition().table_id)
            .await?;
        if newest.version == d.schema.version {
            return Ok(cached);
        }
        let fresh: Arc<dyn TableProvider> = Arc::new(
            resolver
                .provider(table.table().definition().clone())
                .await?,
        );
        self.write().insert(name.to_string(), fresh.clone());
        Ok(fresh)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<dyn TableProvider>>> {
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<dyn TableProvider>>> {
        self.tables.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl SchemaProvider for PulpitumSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.read().keys().cloned().collect();
        names.sort();
        names
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let cached = self.read().get(name).cloned();
        if let Some(t) = cached {
            return self.recheck(name, t).await.map(Some);
        }
        let Some(resolver) = &self.resolver else {
            return Ok(None);
        };
        let Some(found) = resolver.resolve(name).await? else {
            return Ok(None);
        };
        let found: Arc<dyn TableProvider> = Arc::new(found);
        // Another task may have found it meanwhile: keep the first, so every query of this
        // session shares one provider (and its route cache).
        Ok(Some(
            self.write()
                .entry(name.to_string())
                .or_insert(found)
                .clone(),
        ))
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let mut tables = self.write();
        match tables.get(&name) {
            // The factory has just checked the new provider's definition against the
            // registry, so replacing the session's provider changes nothing.
            Some(old) if is_pulpitum(old) && is_pulpitum(&table) => {}
            Some(_) => {
                return Err(DataFusionError::Execution(format!(
                    "The table {name} already exists"
                )))
            }
            None => {}
        }
        Ok(tables.insert(name, table))
    }

    fn deregister_table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let mut tables = self.write();
        if tables.get(name).is_some_and(is_pulpitum) {
            return Err(DataFusionError::Plan(format!(
                "table {name}: {DROP_REFUSED}"
            )));
        }
        Ok(tables.remove(name))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.read().get(name).is_some_and(|t| !is_pulpitum(t))
    }
}

/// How often a session compares a declared table's schema version with the registry.
pub const SCHEMA_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Bumped whenever a statement found its declared table's schema outdated: every session of
/// the process then compares its schemas at their next use, whatever [`SCHEMA_RECHECK`] says.
static STALE_EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Marks the process's declared-table schemas as possibly outdated (see [`STALE_EPOCH`]).
pub fn schema_went_stale() {
    STALE_EPOCH.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Drops a table's provider from the session's default schema, so that its next use
/// resolves it from the registry afresh (after a schema change made through this session).
pub fn forget_table(ctx: &SessionContext, name: &str) {
    let state = ctx.state();
    let names = &state.config_options().catalog;
    let Some(schema) = ctx
        .catalog(&names.default_catalog)
        .and_then(|c| c.schema(&names.default_schema))
    else {
        return;
    };
    if let Some(p) = schema.downcast_ref::<PulpitumSchema>() {
        p.write().remove(name);
        p.checked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
}

/// Refuses a planned statement that DataFusion would let through silently: `DROP TABLE IF
/// EXISTS` on a Pulpitum table (DataFusion ignores the deregistration's error when `IF
/// EXISTS` is given). `ctx.sql` cannot be intercepted, so a caller that wants this check
/// (the `pulpitum` shell does) plans first, checks, then executes.
pub async fn check_statement(ctx: &SessionContext, plan: &LogicalPlan) -> DFResult<()> {
    if let LogicalPlan::Ddl(DdlStatement::DropTable(drop)) = plan {
        if let Ok(t) = ctx.table_provider(drop.name.clone()).await {
            if is_pulpitum(&t) {
                return Err(DataFusionError::Plan(format!(
                    "table {}: {DROP_REFUSED}",
                    drop.name
                )));
            }
        }
    }
    // Refused here, before planning, so the answer is one line rather than DataFusion's
    // "not implemented ... for Base table" (the provider refuses the same way for callers
    // that plan without this check).
    if let LogicalPlan::Dml(dml) = plan {
        let op = match dml.op {
            WriteOp::Truncate => Some("TRUNCATE"),
            WriteOp::MergeInto(_) => Some("MERGE"),
            _ => None,
        };
        if let Some(op) = op {
            if let Ok(t) = ctx.table_provider(dml.table_name.clone()).await {
                if is_pulpitum(&t) {
                    return Err(change_refused(&dml.table_name.to_string(), op));
                }
            }
        }
    }
    Ok(())
}
