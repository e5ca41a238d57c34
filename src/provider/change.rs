//! `DELETE` and `UPDATE` for Pulpitum tables.
//!
//! A statement runs in two steps. First it reads the rows it changes with an ordinary scan
//! of the table under the statement's `WHERE` (every predicate a query supports; archived
//! rows come with their masks applied, so a deleted row is never matched twice and an
//! edited row is matched by its new body), computing the new `content` for an `UPDATE`.
//! Then it hands those rows, each with the value it read, to
//! [`DurableTable::apply_changes`]: one transaction of the hot store that deletes or updates
//! hot rows in place, under the append fence, and masks archived rows. If a row changed in
//! between (another statement, or its bucket was published), nothing is written and the
//! statement reads again, at most [`ATTEMPTS`] times; a bucket being archived fails the
//! statement with a retryable error. The count returned is the rows changed.
//!
//! Limits: only the value column may be assigned (the other columns are the row's key and
//! its place in the bucket layout; delete and insert instead), the `WHERE` may not hold a
//! subquery and `UPDATE ... FROM` is refused ([`ChangeShape`], an analyzer rule that sees
//! the statement before DataFusion's optimizer turns a subquery into a join, whose
//! predicates the DML planner would drop), and a statement changes at most
//! `max_insert_rows` rows, since the rows are held in memory and written in one
//! transaction.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{cast, col, Expr, LogicalPlan, LogicalPlanBuilder, WriteOp};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use super::surface::{Role, Surface};
use super::{ProviderError, PulpitumTable};
use crate::table::{DurableTable, RowChange, StoreError, TableError};

/// Times a statement reads and applies its rows before giving up on concurrent changes.
pub const ATTEMPTS: u32 = 4;

/// The column of the new value an `UPDATE`'s read carries beside the row.
const NEW_VALUE: &str = "__pulpitum_new_value";

/// `DELETE` or `UPDATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Rows are removed.
    Delete,
    /// Rows get a new value.
    Update,
}

impl ChangeKind {
    fn name(self) -> &'static str {
        match self {
            Self::Delete => "DELETE",
            Self::Update => "UPDATE",
        }
    }
}

impl PulpitumTable {
    /// The plan of a `DELETE` (`assignments` empty) or `UPDATE`: the read of the rows it
    /// changes, under the change node.
    pub(super) async fn plan_change(
        &self,
        state: &dyn Session,
        kind: ChangeKind,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let filters = unsealed(filters)?;
        // A declared table's read carries each row's stored value (see
        // `Surface::with_stored_value`); the fixed surfaces' value column is that value.
        let read_surface = self.surface.with_stored_value();
        // Planned here, read here: the read's plan carries the statement's seal (a UDF only
        // this process knows), and its rows are written back by this process.
        let reader = PulpitumTable::with_surface(self.table.clone(), read_surface, self.options)
            .local_only();
        let read_schema = reader.schema.clone();
        let mut assigned: std::collections::HashMap<String, Expr> = Default::default();
        for (column, expr) in assignments {
            match self.surface.role_of(&column) {
                Some(Role::Value) => {
                    assigned.insert(column, expr);
                }
                _ => {
                    let message = match &self.surface {
                        Surface::Declared(_) => format!(
                            "UPDATE may not set {column}: it is part of the row's key \
                             (delete the row and insert it again instead)"
                        ),
                        other => format!(
                            "UPDATE may set only {}: {column} is part of the row's key \
                             (delete the row and insert it again instead)",
                            other.schema().field(Role::Value.index()).name()
                        ),
                    };
                    return Err(ProviderError::InvalidChange(message).into());
                }
            }
        }
        let mut builder = LogicalPlanBuilder::scan(
            "pulpitum_change_target",
            provider_as_source(Arc::new(reader)),
            None,
        )?;
        if let Some(predicate) = conjunction(filters) {
            builder = builder.filter(predicate)?;
        }
        if kind == ChangeKind::Update {
            let mut exprs: Vec<Expr> = read_schema
                .fields()
                .iter()
                .map(|f| col(f.name().as_str()))
                .collect();
            if let Surface::Declared(_) = &self.surface {
                // The new row: each value column as assigned (cast to its type) or as read.
                for (i, f) in read_schema.fields().iter().enumerate() {
                    if let Some(e) = assigned.get(f.name()) {
                        exprs[i] = cast(e.clone(), f.data_type().clone()).alias(f.name());
                    }
                }
            } else {
                let value_index = Role::Value.index();
                let value = read_schema.field(value_index);
                let new_value = assigned
                    .remove(value.name())
                    .unwrap_or_else(|| col(value.name().as_str()));
                exprs.push(cast(new_value, value.data_type().clone()).alias(NEW_VALUE));
            }
            builder = builder.project(exprs)?;
        }
        let read = state.create_physical_plan(&builder.build()?).await?;
        Ok(Arc::new(ChangeExec::new(
            self.table.clone(),
            self.surface.clone(),
            kind,
            read,
            self.options.max_insert_rows,
        )))
    }
}

/// The plan node of a `DELETE` or `UPDATE`: reads the rows, applies the changes, returns
/// the count (`count UInt64`, as DataFusion's DML plans do).
#[derive(Debug)]
pub struct ChangeExec {
    table: DurableTable,
    surface: Surface,
    kind: ChangeKind,
    read: Arc<dyn ExecutionPlan>,
    max_rows: usize,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
}

impl ChangeExec {
    fn new(
        table: DurableTable,
        surface: Surface,
        kind: ChangeKind,
        read: Arc<dyn ExecutionPlan>,
        max_rows: usize,
    ) -> Self {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "count",
            DataType::UInt64,
            false,
        )]));
        let props = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self {
            table,
            surface,
            kind,
            read,
            max_rows,
            schema,
            props: Arc::new(props),
        }
    }

    /// Reads the rows to change as the changes themselves, from every partition of the
    /// read (the optimizer may take the single-partition requirement off a read it
    /// rewrites; reading them all does not depend on it).
    async fn read_changes(&self, ctx: &Arc<TaskContext>) -> DFResult<Vec<RowChange>> {
        let partitions = self
            .read
            .properties()
            .output_partitioning()
            .partition_count();
        let streams = (0..partitions)
            .map(|p| self.read.execute(p, ctx.clone()))
            .collect::<DFResult<Vec<_>>>()?;
        let mut stream = futures::stream::select_all(streams);
        let mut out: Vec<RowChange> = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let rows = out.len() + batch.num_rows();
            if rows > self.max_rows {
                return Err(ProviderError::ChangeTooLarge {
                    operation: self.kind.name(),
                    rows,
                    max_rows: self.max_rows,
                }
                .into());
            }
            let old = self.surface.with_stored_value().batch_to_records(&batch)?;
            let new = match self.kind {
                ChangeKind::Delete => None,
                ChangeKind::Update => Some(self.new_values(&batch)?),
            };
            for (i, r) in old.into_iter().enumerate() {
                out.push(RowChange {
                    partition_key: r.partition_key,
                    event_time: r.event_time,
                    sort_key: r.sort_key,
                    old_value: r.value,
                    new_value: new.as_ref().map(|n| n[i].clone()),
                });
            }
        }
        Ok(out)
    }

    /// An `UPDATE`'s new values, as the surface stores them.
    fn new_values(&self, batch: &RecordBatch) -> DFResult<Vec<Vec<u8>>> {
        let schema = self.surface.schema();
        let as_rows = if let Surface::Declared(_) = &self.surface {
            // The assigned row, without the stored value: encoded afresh (a NULL set into a
            // NOT NULL column is named by the encoding).
            let schema = self.surface.incoming_schema();
            let columns: Vec<ArrayRef> = schema
                .fields()
                .iter()
                .map(|f| {
                    batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                        ProviderError::Internal(format!("UPDATE read lacks {}", f.name()))
                    })
                })
                .collect::<Result<_, _>>()?;
            RecordBatch::try_new(schema, columns)?
        } else {
            let value_name = schema.field(Role::Value.index()).name().clone();
            let new = batch
                .column_by_name(NEW_VALUE)
                .ok_or_else(|| ProviderError::Internal("UPDATE read lacks its new value".into()))?;
            if new.null_count() > 0 {
                return Err(ProviderError::InvalidChange(format!(
                    "UPDATE would set {value_name} to NULL; every column is NOT NULL"
                ))
                .into());
            }
            let columns: Vec<ArrayRef> = (0..3)
                .map(|i| batch.column(i).clone())
                .chain(std::iter::once(new.clone()))
                .collect();
            RecordBatch::try_new(schema, columns)?
        };
        let records = self
            .surface
            .batch_to_records(&as_rows)
            .map_err(|e| match e {
                ProviderError::InvalidInsert(m) => ProviderError::InvalidChange(m),
                other => other,
            })?;
        Ok(records.into_iter().map(|r| r.value).collect())
    }

    async fn run(&self, ctx: Arc<TaskContext>) -> DFResult<u64> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Before the read: a bucket published after this moment was read from hot rows.
            let read_at = self
                .table
                .store_now()
                .await
                .map_err(|e| DataFusionError::from(ProviderError::from(e)))?;
            let changes = self.read_changes(&ctx).await?;
            if let Surface::Declared(d) = &self.surface {
                d.check_current(&self.table, self.kind.name()).await?;
            }
            // An erasure logs the keys before they change (crate::erasure), so a statement
            // that fails from here on is still re-applied by the archiver.
            if let Some(erasure) = ctx
                .session_config()
                .get_extension::<crate::erasure::ErasureContext>()
            {
                if self.kind != ChangeKind::Delete {
                    return Err(ProviderError::InvalidChange(
                        "an erasure is a DELETE; an UPDATE cannot be one".into(),
                    )
                    .into());
                }
                erasure
                    .before_apply(&self.table, &changes)
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
            }
            match self.table.apply_changes(read_at, &changes).await {
                Ok(done) => return Ok(done.total()),
                Err(TableError::Store(StoreError::ChangeConflict { .. })) if attempt < ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                }
                Err(e) => return Err(ProviderError::from(e).into()),
            }
        }
    }
}

impl DisplayAs for ChangeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PulpitumChangeExec: {} table={}, hot rows in place, archived rows masked, atomic, max_rows={}",
            self.kind.name(),
            self.table.definition().table_id,
            self.max_rows
        )
    }
}

impl ExecutionPlan for ChangeExec {
    fn name(&self) -> &str {
        "PulpitumChangeExec"
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.read]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let [read] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("ChangeExec takes one child".into()))?;
        Ok(Arc::new(Self::new(
            self.table.clone(),
            self.surface.clone(),
            self.kind,
            read,
            self.max_rows,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "ChangeExec has one partition, asked for {partition}"
            )));
        }
        let me = Self::new(
            self.table.clone(),
            self.surface.clone(),
            self.kind,
            self.read.clone(),
            self.max_rows,
        );
        let schema = self.schema.clone();
        let out = futures::stream::once(async move {
            let n = me.run(context).await?;
            let count: ArrayRef = Arc::new(UInt64Array::from(vec![n]));
            Ok(RecordBatch::try_new(me.schema.clone(), vec![count])?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)))
    }
}

/// Refuses `DELETE` and `UPDATE` statements on Pulpitum tables whose shape the change path
/// cannot honour: a subquery in the `WHERE` or the assignments, or other tables joined in
/// (`UPDATE ... FROM`). DataFusion's DML planner hands a table only the predicates on the
/// table itself, so after the optimizer turned a subquery into a join the statement would
/// change every row the remaining predicates match; refusing it here, before the
/// optimizer, is the only safe answer.
///
/// It also seals the statement's `WHERE` so the optimizer cannot take it apart. Left as it
/// is, a `WHERE` the optimizer proves false (`id IS NULL`, `id = 1 AND id = 2`) is replaced by
/// an empty relation, and DataFusion's DML planner, finding no predicate left, hands the
/// table none: the statement would change every row. A `WHERE` that repeats an expression is
/// rewritten to columns of a projection the planner does not hand over. Sealed in
/// [`WhereSeal`] (volatile, so it is neither folded, split, pushed into the scan nor
/// shared), the predicate reaches [`PulpitumTable::plan_change`] whole, which unseals it;
/// the change's own read is an ordinary query, optimized as one, and finds the rows the
/// predicate names: none for a `WHERE` that is never true.
#[derive(Debug, Default)]
pub struct ChangeShape;

/// A change's `WHERE`, held inside a function that takes no arguments and is marked
/// volatile: what [`ChangeShape`] puts in place of the predicate (see there). The optimizer
/// sees a call it may neither evaluate, push down nor share, and no column, so the DML
/// planner hands it over as one filter on the target. It is never executed: the change's
/// read runs the predicate itself; a plan that did execute it fails rather than guess.
#[derive(Debug, PartialEq, Eq, Hash)]
struct WhereSeal {
    predicate: Expr,
    signature: datafusion::logical_expr::Signature,
}

const WHERE_SEAL: &str = "pulpitum_where";

impl datafusion::logical_expr::ScalarUDFImpl for WhereSeal {
    fn name(&self) -> &str {
        WHERE_SEAL
    }

    fn signature(&self) -> &datafusion::logical_expr::Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DFResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(
        &self,
        _args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> DFResult<datafusion::logical_expr::ColumnarValue> {
        Err(DataFusionError::Internal(format!(
            "{WHERE_SEAL} holds a change's WHERE for its planning and is never executed"
        )))
    }
}

/// `predicate` sealed (see [`ChangeShape`]).
fn seal(predicate: Expr) -> Expr {
    use datafusion::logical_expr::{ScalarUDF, Signature, Volatility};
    let udf = ScalarUDF::new_from_impl(WhereSeal {
        predicate,
        signature: Signature::exact(vec![], Volatility::Volatile),
    });
    Arc::new(udf).call(vec![])
}

/// The predicates of a change's filters with their seals opened, split at `AND`, with
/// column qualifiers removed as the DML planner removes them from the filters it hands over.
fn unsealed(filters: Vec<Expr>) -> DFResult<Vec<Expr>> {
    use datafusion::common::tree_node::Transformed;
    use datafusion::common::Column;
    use datafusion::logical_expr::utils::split_conjunction_owned;
    let mut out = Vec::new();
    for f in filters {
        let held = match &f {
            Expr::ScalarFunction(call) => call
                .func
                .inner()
                .downcast_ref::<WhereSeal>()
                .map(|s| s.predicate.clone()),
            _ => None,
        };
        let Some(predicate) = held else {
            out.push(f);
            continue;
        };
        let predicate = predicate
            .transform(|e| match e {
                Expr::Column(c) if c.relation.is_some() => Ok(Transformed::yes(Expr::Column(
                    Column::new_unqualified(c.name),
                ))),
                other => Ok(Transformed::no(other)),
            })?
            .data;
        out.extend(split_conjunction_owned(predicate));
    }
    Ok(out)
}

/// Every `WHERE` filter of a change's input, sealed.
fn seal_where(input: LogicalPlan) -> DFResult<LogicalPlan> {
    use datafusion::common::tree_node::Transformed;
    use datafusion::logical_expr::Filter;
    input
        .transform_up(|node| match node {
            LogicalPlan::Filter(f) => Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                seal(f.predicate),
                f.input,
            )?))),
            other => Ok(Transformed::no(other)),
        })
        .map(|t| t.data)
}

impl AnalyzerRule for ChangeShape {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DFResult<LogicalPlan> {
        let mut refusal: Option<String> = None;
        plan.apply(|node| {
            let LogicalPlan::Dml(dml) = node else {
                return Ok(TreeNodeRecursion::Continue);
            };
            if !matches!(dml.op, WriteOp::Delete | WriteOp::Update) {
                return Ok(TreeNodeRecursion::Continue);
            }
            let pulpitum = source_as_provider(&dml.target)
                .map(|p| super::factory::is_pulpitum(&p))
                .unwrap_or(false);
            if !pulpitum {
                return Ok(TreeNodeRecursion::Continue);
            }
            dml.input.apply(|n| {
                let shape_ok = matches!(
                    n,
                    LogicalPlan::TableScan(_)
                        | LogicalPlan::Filter(_)
                        | LogicalPlan::Projection(_)
                        | LogicalPlan::SubqueryAlias(_)
                );
                let subquery = n.expressions().iter().any(|e| {
                    e.exists(|e| {
                        Ok(matches!(
                            e,
                            Expr::InSubquery(_)
                                | Expr::Exists(_)
                                | Expr::ScalarSubquery(_)
                                | Expr::OuterReferenceColumn(..)
                        ))
                    })
                    .unwrap_or(true)
                });
                if !shape_ok || subquery {
                    refusal = Some(format!(
                        "{} on {}: a subquery or another table in the statement is not \
                         supported; name the rows with predicates on the table's own columns",
                        dml.op.name(),
                        dml.table_name
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            Ok(TreeNodeRecursion::Stop)
        })?;
        if let Some(r) = refusal {
            return Err(DataFusionError::Plan(r));
        }
        use datafusion::common::tree_node::Transformed;
        plan.transform_down(|node| {
            let LogicalPlan::Dml(dml) = &node else {
                return Ok(Transformed::no(node));
            };
            let pulpitum = matches!(dml.op, WriteOp::Delete | WriteOp::Update)
                && source_as_provider(&dml.target)
                    .map(|p| super::factory::is_pulpitum(&p))
                    .unwrap_or(false);
            if !pulpitum {
                return Ok(Transformed::no(node));
            }
            let mut dml = dml.clone();
            dml.input = Arc::new(seal_where(dml.input.as_ref().clone())?);
            Ok(Transformed::new(
                LogicalPlan::Dml(dml),
                true,
                TreeNodeRecursion::Jump,
            ))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "pulpitum_change_shape"
    }
}
