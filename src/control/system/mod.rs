//! The system tables: `pulpitum_tables` (definitions and policies), `pulpitum_buckets` (the
//! tiering queue: every bucket, its state and whether it is eligible, and why),
//! `pulpitum_jobs` (the archiver's job history), and compaction's two
//! ([`segments`]): `pulpitum_compactions` (window claims) and `pulpitum_retired_objects`.
//! They are ordinary table providers, so they join, filter and aggregate like any table.
//!
//! Filters an operator writes on them are pushed into the store's query where the store can
//! narrow by them (`table_id = ...` on all three, a time range on `bucket_start`/`bucket_end`
//! and on `started_at`) and always re-applied by DataFusion (`Inexact`), so a pushed filter
//! can only save work, never change an answer. The store is read when the plan executes, not
//! when it is planned: `EXPLAIN` touches nothing, and a prepared plan reads fresh state.
//!
//! Eligibility in `pulpitum_buckets` is judged by the registry alone ([`super::queue`]): the
//! pauses, the table's `archive_after`, the retry time, and for a table without a policy the
//! default cutoff (January 1 of the previous UTC year). An archiver started with
//! `ARCHIVER_ELIGIBLE_BEFORE` holds back more than this shows; its metrics show its own
//! backlog.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Int32Array, Int64Array, StringArray,
    TimestampMicrosecondArray, UInt32Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{
    BinaryExpr, Expr, Operator, TableProviderFilterPushDown, TableType,
};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion::prelude::SessionContext;
use futures::stream;

mod segments;

use super::options::{format_duration, format_retention};
use super::queue::Judge;
use super::ControlError;
use crate::model::{EventTime, TableId};

/// Set in a session whose user may not read the job history's error texts and worker names
/// (the wire server's `read` and `write` roles): those columns are then NULL. A session
/// without it (the shell, the embedded API, the server's `admin` role) shows everything.
#[derive(Debug, Clone, Copy)]
pub struct HideJobDetails;
use crate::provider::Surface;
use crate::store::{
    BucketFilter, BucketMeta, BucketState, HotStore, JobFilter, TableDefinition, TablePolicy,
};

/// The system tables' names, as registered in every session.
pub const SYSTEM_TABLES: [&str; 5] = crate::provider::factory::RESERVED_TABLE_NAMES;

/// Registers the system tables in `ctx` over `store`.
pub fn register(ctx: &SessionContext, store: Arc<dyn HotStore>) -> DFResult<()> {
    for kind in [
        Kind::Tables,
        Kind::Buckets,
        Kind::Jobs,
        Kind::Compactions,
        Kind::Retired,
    ] {
        ctx.register_table(
            kind.name(),
            Arc::new(SystemTable {
                kind,
                store: store.clone(),
            }),
        )?;
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tables,
    Buckets,
    Jobs,
    Compactions,
    Retired,
}

pub(super) fn ts(name: &str, nullable: bool) -> Field {
    Field::new(
        name,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        nullable,
    )
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Tables => SYSTEM_TABLES[0],
            Self::Buckets => SYSTEM_TABLES[1],
            Self::Jobs => SYSTEM_TABLES[2],
            Self::Compactions => SYSTEM_TABLES[3],
            Self::Retired => SYSTEM_TABLES[4],
        }
    }

    fn schema(self) -> SchemaRef {
        let text = |n: &str, null| Field::new(n, DataType::Utf8, null);
        let fields = match self {
            Self::Tables => vec![
                text("table_id", false),
                text("surface", false),
                text("bucket_strategy", false),
                Field::new("writable_buckets", DataType::UInt32, true),
                Field::new("record_schema_version", DataType::Int32, false),
                text("archive_after", true),
                text("format", true),
                text("cleanup_delay", true),
                Field::new("paused", DataType::Boolean, false),
                Field::new("store_paused", DataType::Boolean, false),
                ts("policy_updated_at", true),
                text("retain_for", true),
            ],
            Self::Buckets => vec![
                text("table_id", false),
                text("partition", false),
                Field::new("partition_key", DataType::Binary, false),
                text("bucket_key", false),
                ts("bucket_start", false),
                ts("bucket_end", false),
                text("state", false),
                Field::new("generation", DataType::Int64, false),
                text("archive_object", true),
                Field::new("hot_rows_deleted", DataType::Boolean, false),
                ts("published_at", true),
                ts("retry_at", true),
                ts("lease_expires_at", true),
                Field::new("eligible", DataType::Boolean, false),
                text("reason", false),
            ],
            Self::Jobs => vec![
                text("table_id", false),
                text("partition", false),
                Field::new("partition_key", DataType::Binary, false),
                text("bucket_key", false),
                Field::new("generation", DataType::Int64, false),
                text("kind", false),
                // NULL where the session hides job details (see `HideJobDetails`).
                text("worker", true),
                ts("started_at", false),
                ts("finished_at", true),
                text("outcome", false),
                // Signed, so PostgreSQL clients see bigint rather than numeric.
                Field::new("rows", DataType::Int64, true),
                Field::new("bytes", DataType::Int64, true),
                text("error", true),
            ],
            Self::Compactions => segments::compaction_fields(),
            Self::Retired => segments::retired_fields(),
        };
        Arc::new(Schema::new(fields))
    }

    /// The time columns a range on narrows this table's store query.
    fn time_columns(self) -> &'static [&'static str] {
        match self {
            Self::Tables | Self::Compactions | Self::Retired => &[],
            Self::Buckets => &["bucket_start", "bucket_end"],
            Self::Jobs => &["started_at"],
        }
    }
}

/// What the store query is narrowed by (each part a superset of the rows the filters keep).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Pushed {
    table: Option<String>,
    state: Option<String>,
    /// Rows whose time range reaches past this (bucket_end > from; started_at >= from).
    from: Option<EventTime>,
    /// Rows whose time range starts at or before this.
    to: Option<EventTime>,
}

impl Pushed {
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = &self.table {
            parts.push(format!("table_id={t}"));
        }
        if let Some(s) = &self.state {
            parts.push(format!("state={s}"));
        }
        if let Some(f) = self.from {
            parts.push(format!("from={f}"));
        }
        if let Some(t) = self.to {
            parts.push(format!("to={t}"));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A column compared with a literal, the column on the left (`lit < col` is flipped).
fn comparison(e: &Expr) -> Option<(&str, Operator, &ScalarValue)> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
        return None;
    };
    match (left.as_ref(), right.as_ref()) {
        (Expr::Column(c), Expr::Literal(v, _)) => Some((c.name.as_str(), *op, v)),
        (Expr::Literal(v, _), Expr::Column(c)) => Some((c.name.as_str(), op.swap()?, v)),
        _ => None,
    }
}

fn text_literal(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::Utf8View(Some(s))
        | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
        _ => None,
    }
}

fn time_literal(v: &ScalarValue) -> Option<EventTime> {
    let micros = match v {
        ScalarValue::TimestampMicrosecond(Some(us), _) => *us,
        ScalarValue::TimestampNanosecond(Some(ns), _) => ns.div_euclid(1_000),
        ScalarValue::TimestampMillisecond(Some(ms), _) => ms.checked_mul(1_000)?,
        ScalarValue::TimestampSecond(Some(s), _) => s.checked_mul(1_000_000)?,
        _ => return None,
    };
    EventTime::from_micros(micros).ok()
}

/// Folds one filter into `p` if it narrows the store query; whether it did.
fn push_filter(kind: Kind, e: &Expr, p: &mut Pushed) -> bool {
    let Some((col, op, v)) = comparison(e) else {
        return false;
    };
    match (col, op) {
        ("table_id", Operator::Eq) if kind != Kind::Retired => text_literal(v).is_some_and(|t| {
            p.table = Some(t);
            true
        }),
        ("state", Operator::Eq) if kind == Kind::Buckets => text_literal(v).is_some_and(|s| {
            p.state = Some(s);
            true
        }),
        (c, op) if kind.time_columns().contains(&c) => {
            let Some(t) = time_literal(v) else {
                return false;
            };
            let before = |t: EventTime| EventTime::from_micros(t.as_micros() - 1).ok();
            // Each bound is widened to the store filter's own (overlap) semantics: any row
            // the predicate keeps passes it.
            let (from, to) = match (kind, c, op) {
                (Kind::Jobs, _, Operator::Gt | Operator::GtEq) => (Some(t), None),
                (Kind::Jobs, _, Operator::Lt | Operator::LtEq) => (None, Some(t)),
                (_, "bucket_end", Operator::Gt) => (Some(t), None),
                (_, "bucket_end", Operator::GtEq) => (before(t), None),
                (_, "bucket_end", Operator::Lt | Operator::LtEq) => (None, before(t)),
                (_, "bucket_start", Operator::Gt | Operator::GtEq) => (Some(t), None),
                (_, "bucket_start", Operator::LtEq) => (None, Some(t)),
                (_, "bucket_start", Operator::Lt) => (None, before(t)),
                _ => (None, None),
            };
            if from.is_none() && to.is_none() {
                return false;
            }
            if let Some(f) = from {
                p.from = Some(p.from.map_or(f, |x| x.max(f)));
            }
            if let Some(t) = to {
                p.to = Some(p.to.map_or(t, |x| x.min(t)));
            }
            true
        }
        _ => false,
    }
}

struct SystemTable {
    kind: Kind,
    store: Arc<dyn HotStore>,
}

impl fmt::Debug for SystemTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SystemTable({})", self.kind.name())
    }
}

#[async_trait]
impl TableProvider for SystemTable {
    fn schema(&self) -> SchemaRef {
        self.kind.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                if push_filter(self.kind, f, &mut Pushed::default()) {
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let mut pushed = Pushed::default();
        for f in filters {
            push_filter(self.kind, f, &mut pushed);
        }
        let full = self.kind.schema();
        let schema = match projection {
            Some(p) => Arc::new(full.project(p)?),
            None => full,
        };
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Arc::new(SystemScanExec {
            kind: self.kind,
            store: self.store.clone(),
            hide_details: state.config().get_extension::<HideJobDetails>().is_some(),
            pushed,
            projection: projection.cloned(),
            schema,
            props,
        }))
    }
}

/// Reads one system table when executed.
struct SystemScanExec {
    kind: Kind,
    store: Arc<dyn HotStore>,
    hide_details: bool,
    pushed: Pushed,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
}

impl fmt::Debug for SystemScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SystemScanExec({})", self.kind.name())
    }
}

impl DisplayAs for SystemScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let cols: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|c| c.name().as_str())
            .collect();
        write!(
            f,
            "SystemScanExec: table={}, projection=[{}], pushed=[{}]",
            self.kind.name(),
            cols.join(", "),
            self.pushed.describe()
        )
    }
}

impl ExecutionPlan for SystemScanExec {
    fn name(&self) -> &str {
        "SystemScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "SystemScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let (kind, store, pushed) = (self.kind, self.store.clone(), self.pushed.clone());
        let (projection, hide) = (self.projection.clone(), self.hide_details);
        let fut = async move {
            let batch = read(kind, &*store, &pushed, hide)
                .await
                .map_err(DataFusionError::from)?;
            match projection {
                Some(p) => Ok(batch.project(&p)?),
                None => Ok(batch),
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream::once(fut),
        )))
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn micros(t: Option<EventTime>) -> Option<i64> {
    t.map(|t| t.as_micros())
}

pub(super) fn time_array(v: Vec<Option<i64>>) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC"))
}

pub(super) fn text_array<S: Into<String>>(v: Vec<Option<S>>) -> ArrayRef {
    Arc::new(StringArray::from(
        v.into_iter()
            .map(|s| s.map(Into::into))
            .collect::<Vec<Option<String>>>(),
    ))
}

/// A partition key as its surface's partition column reads (the channel id of a chat
/// table); hex for a table whose surface this build does not know.
fn partition_text(surfaces: &HashMap<TableId, Option<Surface>>, t: &TableId, key: &[u8]) -> String {
    match surfaces.get(t).cloned().flatten() {
        Some(s) => s.display_key(crate::provider::surface::Role::Partition, key),
        None => hex::encode(key),
    }
}

async fn read(
    kind: Kind,
    store: &dyn HotStore,
    p: &Pushed,
    hide_details: bool,
) -> Result<RecordBatch, ControlError> {
    let mut tables = store.tables().await?;
    if let Some(t) = &p.table {
        tables.retain(|d| d.table_id.as_str() == t);
    }
    let mut surfaces: HashMap<TableId, Option<Surface>> = HashMap::new();
    for d in &tables {
        let surface = if d.surface == crate::control::schema::DECLARED {
            // A declared table's keys read by its key types; hex if its schema is unreadable.
            store
                .table_schema(&d.table_id)
                .await?
                .and_then(|s| crate::model::schema::TableSchema::from_json(&s.definition).ok())
                .map(Surface::declared)
        } else {
            Surface::parse(&d.surface).ok()
        };
        surfaces.insert(d.table_id.clone(), surface);
    }
    let policies: HashMap<TableId, TablePolicy> = store
        .policies()
        .await?
        .into_iter()
        .map(|p| (p.table_id.clone(), p))
        .collect();
    let store_paused = store.store_paused().await?;
    let schema = kind.schema();
    let columns = match kind {
        Kind::Tables => tables_columns(&tables, &policies, store_paused),
        Kind::Buckets => {
            let now = store.now().await?;
            let mut rows = Vec::new();
            for def in &tables {
                let filter = BucketFilter {
                    from: p.from,
                    to: p.to,
                    ..BucketFilter::default()
                };
                let mut listed = store.list_buckets(&def.table_id, &filter).await?;
                if let Some(s) = &p.state {
                    listed.retain(|m| m.state.name() == s);
                }
                let rule = Judge {
                    now,
                    policy: policies.get(&def.table_id),
                    store_paused,
                };
                rows.extend(listed.into_iter().map(|m| {
                    let (eligible, reason) = rule.judge(&m);
                    (m, eligible, reason)
                }));
            }
            bucket_columns(&rows, &surfaces)
        }
        Kind::Jobs => {
            let filter = JobFilter {
                table: p.table.as_ref().and_then(|t| TableId::new(t.clone()).ok()),
                since: p.from,
                until: p.to,
                limit: None,
            };
            let jobs = if p.table.is_some() && filter.table.is_none() {
                Vec::new()
            } else {
                store.jobs(&filter).await?
            };
            let key = |j: &crate::store::JobRecord| {
                partition_text(
                    &surfaces,
                    &j.bucket.table_id,
                    j.bucket.partition_key.as_bytes(),
                )
            };
            vec![
                text_array(
                    jobs.iter()
                        .map(|j| Some(j.bucket.table_id.to_string()))
                        .collect(),
                ),
                text_array(jobs.iter().map(|j| Some(key(j))).collect()),
                Arc::new(BinaryArray::from(
                    jobs.iter()
                        .map(|j| Some(j.bucket.partition_key.as_bytes()))
                        .collect::<Vec<_>>(),
                )),
                text_array(
                    jobs.iter()
                        .map(|j| Some(j.bucket.bucket_key.to_string()))
                        .collect(),
                ),
                Arc::new(Int64Array::from(
                    jobs.iter().map(|j| j.generation).collect::<Vec<_>>(),
                )),
                text_array(jobs.iter().map(|j| Some(j.kind.name())).collect()),
                text_array(
                    jobs.iter()
                        .map(|j| (!hide_details).then(|| j.worker.clone()))
                        .collect(),
                ),
                time_array(
                    jobs.iter()
                        .map(|j| Some(j.started_at.as_micros()))
                        .collect(),
                ),
                time_array(jobs.iter().map(|j| micros(j.finished_at)).collect()),
                text_array(jobs.iter().map(|j| Some(j.outcome.name())).collect()),
                Arc::new(Int64Array::from(
                    jobs.iter().map(|j| j.rows.map(signed)).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    jobs.iter().map(|j| j.bytes.map(signed)).collect::<Vec<_>>(),
                )),
                text_array(
                    jobs.iter()
                        .map(|j| j.error.clone().filter(|_| !hide_details))
                        .collect(),
                ),
            ]
        }
        Kind::Compactions => {
            let now = store.now().await?;
            let mut claims = store.compaction_claims().await?;
            if let Some(t) = &p.table {
                claims.retain(|c| c.table_id.as_str() == t);
            }
            segments::compaction_columns(&claims, now)
        }
        Kind::Retired => segments::retired_columns(&store.retired_objects().await?),
    };
    Ok(RecordBatch::try_new(schema, columns)?)
}

fn tables_columns(
    tables: &[TableDefinition],
    policies: &HashMap<TableId, TablePolicy>,
    store_paused: bool,
) -> Vec<ArrayRef> {
    let pol = |d: &TableDefinition| policies.get(&d.table_id);
    vec![
        text_array(
            tables
                .iter()
                .map(|d| Some(d.table_id.to_string()))
                .collect(),
        ),
        text_array(tables.iter().map(|d| Some(d.surface.clone())).collect()),
        text_array(tables.iter().map(|d| Some(d.strategy.as_str())).collect()),
        Arc::new(UInt32Array::from(
            tables
                .iter()
                .map(|d| d.writable_buckets)
                .collect::<Vec<_>>(),
        )),
        Arc::new(Int32Array::from(
            tables
                .iter()
                .map(|d| d.record_schema_version)
                .collect::<Vec<_>>(),
        )),
        text_array(
            tables
                .iter()
                .map(|d| pol(d).and_then(|p| p.archive_after).map(format_duration))
                .collect(),
        ),
        text_array(
            tables
                .iter()
                .map(|d| pol(d).and_then(|p| p.format.clone()))
                .collect(),
        ),
        text_array(
            tables
                .iter()
                .map(|d| pol(d).and_then(|p| p.cleanup_delay).map(format_duration))
                .collect(),
        ),
        Arc::new(BooleanArray::from(
            tables
                .iter()
                .map(|d| pol(d).is_some_and(|p| p.paused))
                .collect::<Vec<_>>(),
        )),
        Arc::new(BooleanArray::from(vec![store_paused; tables.len()])),
        time_array(
            tables
                .iter()
                .map(|d| micros(pol(d).and_then(|p| p.updated_at)))
                .collect(),
        ),
        text_array(
            tables
                .iter()
                .map(|d| pol(d).and_then(|p| p.retain_for).map(format_retention))
                .collect(),
        ),
    ]
}

fn bucket_columns(
    rows: &[(BucketMeta, bool, String)],
    surfaces: &HashMap<TableId, Option<Surface>>,
) -> Vec<ArrayRef> {
    let archived = |m: &BucketMeta| match &m.state {
        BucketState::Archived {
            object_key,
            hot_deleted,
        } => (Some(object_key.clone()), *hot_deleted),
        _ => (None, false),
    };
    vec![
        text_array(
            rows.iter()
                .map(|(m, ..)| Some(m.id.table_id.to_string()))
                .collect(),
        ),
        text_array(
            rows.iter()
                .map(|(m, ..)| {
                    Some(partition_text(
                        surfaces,
                        &m.id.table_id,
                        m.id.partition_key.as_bytes(),
                    ))
                })
                .collect(),
        ),
        Arc::new(BinaryArray::from(
            rows.iter()
                .map(|(m, ..)| Some(m.id.partition_key.as_bytes()))
                .collect::<Vec<_>>(),
        )),
        text_array(
            rows.iter()
                .map(|(m, ..)| Some(m.id.bucket_key.to_string()))
                .collect(),
        ),
        time_array(
            rows.iter()
                .map(|(m, ..)| Some(m.id.bucket_key.start().as_micros()))
                .collect(),
        ),
        time_array(
            rows.iter()
                .map(|(m, ..)| Some(m.id.bucket_key.end().as_micros()))
                .collect(),
        ),
        text_array(rows.iter().map(|(m, ..)| Some(m.state.name())).collect()),
        Arc::new(Int64Array::from(
            rows.iter().map(|(m, ..)| m.generation).collect::<Vec<_>>(),
        )),
        text_array(rows.iter().map(|(m, ..)| archived(m).0).collect()),
        Arc::new(BooleanArray::from(
            rows.iter().map(|(m, ..)| archived(m).1).collect::<Vec<_>>(),
        )),
        time_array(rows.iter().map(|(m, ..)| micros(m.published_at)).collect()),
        time_array(rows.iter().map(|(m, ..)| micros(m.retry_at)).collect()),
        time_array(
            rows.iter()
                .map(|(m, ..)| micros(m.lease_expires_at))
                .collect(),
        ),
        Arc::new(BooleanArray::from(
            rows.iter().map(|(_, e, _)| *e).collect::<Vec<_>>(),
        )),
        text_array(rows.iter().map(|(_, _, r)| Some(r.clone())).collect()),
    ]
}
