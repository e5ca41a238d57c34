//! The DataFusion surface: a thin `TableProvider` over a [`DurableTable`].
//!
//! It translates and nothing more: [`PulpitumTable`] turns SQL filters into scan bounds and
//! partition keys ([`filters`]), asks the table which buckets they can match
//! ([`DurableTable::plan_buckets`]) and hands the plan to [`scan::PulpitumScanExec`], which
//! reads through the table (listing, grouping, routing and tiers are all in
//! [`crate::table`]) and turns envelope rows into SQL columns ([`surface`]). Inserts go
//! through [`sink::PulpitumSink`], `DELETE` and `UPDATE` through [`change::ChangeExec`], and tables are created by SQL through
//! [`factory::PulpitumTableFactory`].
//! Two things the scan tells the optimiser: its exact row count when the manifests know it
//! (`count(*)` then reads nothing: [`DurableTable::exact_rows`]), and, for a TopK across
//! channels, a newest-first order that lets the TopK's dynamic filter skip buckets
//! (`dynamic`).
//! Errors of this layer are one enum, [`ProviderError`], converted to `DataFusionError`
//! only where DataFusion calls in.

pub mod change;
pub mod defaults;
mod dynamic;
pub mod factory;
pub mod filters;
pub mod literals;
mod metrics;
pub mod numbers;
pub mod scan;
pub mod sink;
pub mod surface;
pub mod utc_trunc;
pub mod zoned;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;

pub use change::{ChangeExec, ChangeKind, ChangeShape};
pub use factory::PulpitumTableFactory;
pub use filters::{classify, PushedFilters};
pub use literals::ExactTimeLiterals;
pub use numbers::ExactDecimalLiterals;
pub use scan::{PulpitumScanExec, ScanSpec};
pub use sink::PulpitumSink;
pub use surface::Surface;
pub use zoned::SessionZoneStrings;

use crate::model::ModelError;
pub use crate::table::{BucketCounts, KeyBuckets};
use crate::table::{BucketPlan, DurableTable, TableError, DEFAULT_PAGE_ROWS};

/// Every way the SQL layer can fail.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// A store or archive failure, or a fenced write.
    #[error(transparent)]
    Table(#[from] TableError),
    /// A value that violates the model (key length, time range, sub-microsecond time).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A table's surface name is not `chat`, `raw` or `declared`.
    #[error("unknown surface {0:?} (expected 'chat', 'raw' or 'declared'; a table registered by a newer build needs that build)")]
    UnknownSurface(String),
    /// A bad `CREATE EXTERNAL TABLE` option or column list.
    #[error("invalid table definition: {0}")]
    InvalidDefinition(String),
    /// Rows an INSERT cannot store.
    #[error("invalid INSERT: {0}")]
    InvalidInsert(String),
    /// An INSERT bringing more rows than one statement may write; nothing was written.
    #[error("INSERT of at least {rows} rows exceeds max_insert_rows = {max_rows} rows per statement; nothing was written (split it into several statements, each atomic, or raise max_insert_rows)")]
    InsertTooLarge {
        /// Rows the statement had brought when it passed the cap.
        rows: usize,
        /// The cap.
        max_rows: usize,
    },
    /// A `DELETE` or `UPDATE` the table cannot apply as written.
    #[error("invalid change: {0}")]
    InvalidChange(String),
    /// A `DELETE` or `UPDATE` matching more rows than one statement may change; nothing
    /// was changed.
    #[error("{operation} matching at least {rows} rows exceeds max_insert_rows = {max_rows} rows per statement; nothing was changed (narrow the WHERE and run several statements, each atomic, or raise max_insert_rows)")]
    ChangeTooLarge {
        /// `DELETE` or `UPDATE`.
        operation: &'static str,
        /// Rows the statement had matched when it passed the cap.
        rows: usize,
        /// The cap.
        max_rows: usize,
    },
    /// A stored row that does not fit the table's surface.
    #[error("stored row does not fit the surface: {0}")]
    CorruptRow(String),
    /// A pushed filter whose (bound parameter) value cannot be applied exactly by the scan.
    #[error("filter {0} cannot be applied exactly: a parameter value outside what the table can store, or an unbound parameter")]
    UnappliableFilter(String),
    /// A per-query limit was reached; the query is stopped.
    #[error("query limit exceeded: {0}")]
    LimitExceeded(String),
    /// An Arrow error while building batches.
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    /// A broken internal expectation.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<ProviderError> for DataFusionError {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::InvalidDefinition(_)
            | ProviderError::InvalidChange(_)
            | ProviderError::UnknownSurface(_)
            | ProviderError::UnappliableFilter(_) => DataFusionError::Plan(e.to_string()),
            ProviderError::Arrow(a) => DataFusionError::ArrowError(Box::new(a), None),
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

/// Per-query limits, checked as rows stream out of the scans. `None` disables a limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueryLimits {
    /// Most rows all scans of one table in a query may produce.
    pub max_rows: Option<u64>,
    /// Most bytes (keys, times and values as read) all scans of one table may produce.
    pub max_bytes: Option<u64>,
    /// Longest wall time from the first scan partition's start.
    pub max_duration: Option<Duration>,
}

/// Options of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderOptions {
    /// Per-query limits.
    pub limits: QueryLimits,
    /// Rows per hot page and archive batch.
    pub page_rows: usize,
    /// Most rows one `INSERT` statement may write (it is one transaction; see [`sink`]).
    pub max_insert_rows: usize,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        Self {
            limits: QueryLimits::default(),
            page_rows: DEFAULT_PAGE_ROWS,
            max_insert_rows: sink::DEFAULT_MAX_INSERT_ROWS,
        }
    }
}

/// When scans learn their buckets, as a `SessionConfig` extension
/// (`config.set_extension(Arc::new(ScanPlanning { list_at_execution: true }))`).
///
/// By default a scan lists its buckets while it is planned, so `EXPLAIN` can show bucket
/// counts per tier and a key's buckets can be split across cores. With
/// `list_at_execution`, a scan whose filters name its channels (`=` or `IN`) lists each
/// channel's buckets when it runs, in the same statement as the first page: the plan costs
/// no I/O and a "latest N" page one round trip. Prepared queries
/// ([`crate::prepared::PreparedQuery`]) use it; `EXPLAIN` then shows `buckets=at execution`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanPlanning {
    /// List buckets when the scan runs instead of when it is planned.
    pub list_at_execution: bool,
}

/// Scans that a distributed planner will split into tasks, as a `SessionConfig` extension
/// (set by [`crate::session::distributed_session`]).
///
/// A scan whose buckets are all archived and more than `buckets_per_task` will run as
/// several tasks, and datafusion-distributed's shuffles concatenate what the tasks send: an
/// order each task keeps is not kept across them. Such a scan therefore declares no
/// ordering, so the plan sorts or aggregates by hash instead of relying on one. A scan of
/// more archived buckets than that and some hot ones is planned as the union of two scans
/// ([`ScanSpec::split_tiers`]): the archived one split, the hot one a single task. Scans
/// that stay whole keep their orderings (and their early stop for `ORDER BY ... LIMIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitScans {
    /// Archived buckets per task.
    pub buckets_per_task: usize,
}

/// One Pulpitum table as a DataFusion table.
#[derive(Debug)]
pub struct PulpitumTable {
    table: DurableTable,
    surface: Surface,
    schema: SchemaRef,
    options: ProviderOptions,
    /// What an INSERT that names no value for a column stores (a declared table's
    /// `DEFAULT`s).
    defaults: std::collections::HashMap<String, Expr>,
    /// Scans stay in this process (see [`ScanSpec::local_only`]).
    local_only: bool,
}

impl PulpitumTable {
    /// A provider for a table with a fixed surface (`chat`, `raw`), named by its definition.
    pub fn try_new(table: DurableTable, options: ProviderOptions) -> Result<Self, ProviderError> {
        let surface = Surface::parse(&table.definition().surface)?;
        Ok(Self::with_surface(table, surface, options))
    }

    /// A provider for a table shown as `surface` (a declared table's is built from its
    /// stored schema; see [`PulpitumTableFactory::provider`]).
    pub fn with_surface(table: DurableTable, surface: Surface, options: ProviderOptions) -> Self {
        let defaults = match &surface {
            Surface::Declared(d) => d.defaults(),
            _ => Default::default(),
        };
        Self {
            schema: surface.schema(),
            table,
            surface,
            options,
            defaults,
            local_only: false,
        }
    }

    /// This provider with scans that never run on a distributed worker: the read of a
    /// `DELETE` or `UPDATE`, whose plan holds this process's change machinery.
    pub(crate) fn local_only(mut self) -> Self {
        self.local_only = true;
        self
    }

    /// The underlying table.
    pub fn table(&self) -> &DurableTable {
        &self.table
    }

    /// The surface.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// The rows `spec` returns, stated for the optimiser (`count(*)` answered from the
    /// manifests: [`DurableTable::exact_rows`]) when the scan takes no column at all: what
    /// `count(*)` asks for, and the only shape DataFusion answers from a row count. Any
    /// other scan (a page or a TopK without `content`, a group by) would pay a statement
    /// and, for per-bucket objects, every listed manifest while planning, for a count
    /// nothing uses. A scan listed at execution, a page (a limit), one with value
    /// predicates applied early or a change's read states nothing.
    async fn exact_rows(&self, spec: &ScanSpec) -> Result<Option<u64>, ProviderError> {
        if !spec.projection.is_empty()
            || spec.deferred
            || spec.limit.is_some()
            || spec.local_only
            || !spec.value_filters.is_empty()
        {
            return Ok(None);
        }
        if spec.pushed.empty {
            return Ok(Some(0));
        }
        Ok(self
            .table
            .exact_rows(&spec.keys, &spec.pushed.bounds)
            .await?)
    }

    async fn plan_scan(
        &self,
        target_partitions: usize,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
        list_at_execution: bool,
    ) -> Result<ScanSpec, ProviderError> {
        let pushed = PushedFilters::try_from_exprs(&self.surface, filters)?;
        let value_filters = filters::value_predicates(&self.surface, filters).into();
        let projection: Vec<usize> = projection
            .cloned()
            .unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        // Contradicting filters read nothing: no listing at all.
        let plan = if pushed.empty {
            BucketPlan::default()
        } else {
            self.table
                .plan_buckets(
                    pushed.partitions.as_ref(),
                    &pushed.bounds,
                    list_at_execution,
                )
                .await?
        };
        Ok(ScanSpec {
            table: self.table.clone(),
            surface: self.surface.clone(),
            projection,
            pushed,
            value_filters,
            keys: plan.keys,
            target_partitions: target_partitions.max(1),
            counts: plan.counts,
            deferred: plan.deferred,
            limit,
            descending: false,
            page_rows: self.options.page_rows,
            limits: self.options.limits,
            local_only: self.local_only,
            unordered: false,
        })
    }
}

#[async_trait]
impl TableProvider for PulpitumTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.defaults.get(column)
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters.iter().map(|f| classify(&self.surface, f)).collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let target = state.config().target_partitions();
        let defer = state
            .config()
            .get_extension::<ScanPlanning>()
            .is_some_and(|p| p.list_at_execution);
        let mut spec = self
            .plan_scan(target, projection, filters, limit, defer)
            .await?;
        if let Some(split) = state.config().get_extension::<SplitScans>() {
            // History and recent rows in one scan: the history as a scan that can be split,
            // the recent buckets as one task, each bucket in exactly one of them.
            if let Some((archived, hot)) = spec.split_tiers(split.buckets_per_task) {
                return UnionExec::try_new(vec![
                    Arc::new(PulpitumScanExec::try_new(archived)?),
                    Arc::new(PulpitumScanExec::try_new(hot)?),
                ]);
            }
            spec.unordered = spec
                .splittable_buckets()
                .is_some_and(|n| n > split.buckets_per_task.max(1));
        }
        let rows = self.exact_rows(&spec).await?;
        Ok(Arc::new(
            PulpitumScanExec::try_new(spec)?.with_exact_rows(rows),
        ))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "{insert_op} is not supported: Pulpitum tables are append-only (use INSERT INTO)"
            )));
        }
        let sink = PulpitumSink::new(
            self.table.clone(),
            self.surface.clone(),
            self.options.max_insert_rows,
        );
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }

    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.plan_change(state, ChangeKind::Delete, Vec::new(), filters)
            .await
    }

    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.plan_change(state, ChangeKind::Update, assignments, filters)
            .await
    }

    async fn truncate(&self, _state: &dyn Session) -> DFResult<Arc<dyn ExecutionPlan>> {
        Err(factory::change_refused(
            self.table.definition().table_id.as_str(),
            "TRUNCATE",
        ))
    }
}
