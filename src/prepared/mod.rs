//! Prepared queries: SQL parsed, analysed and optimised once, then executed many times with
//! positional parameters (`$1`, `$2`, ...).
//!
//! An application that serves the same page shape over and over ("the latest 50 messages of
//! channel $1") should not pay for parsing and logical optimisation on every request. A
//! [`PreparedQuery`] keeps the optimised logical plan with its placeholders; each execution
//! binds the values, plans the physical operators (cheap: no I/O) and runs them. Its scans
//! list buckets at execution ([`ScanPlanning`]), so a plan is never tied to the buckets that
//! existed when it was prepared, and a one-channel page costs one hot-store statement.
//!
//! ```no_run
//! # async fn demo(ctx: datafusion::prelude::SessionContext) -> Result<(), Box<dyn std::error::Error>> {
//! use datafusion::scalar::ScalarValue;
//! let latest = pulpitum::prepared::prepare(
//!     &ctx,
//!     "SELECT * FROM chat WHERE channel_id = $1 ORDER BY timestamp DESC, id DESC LIMIT 50",
//! )
//! .await?;
//! let page = latest.execute(&[ScalarValue::Int64(Some(7))]).await?;
//! # let _ = page;
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::Transformed;
use datafusion::common::ParamValues;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionState;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, Limit, LogicalPlan};
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::{collect, execute_stream, ExecutionPlan};
use datafusion::prelude::SessionContext;
use datafusion::scalar::ScalarValue;

pub mod shapes;

use crate::lru::Lru;
use crate::provider::{PulpitumScanExec, ScanPlanning};

/// Physical plans kept per prepared statement, by bound values (least recently used out).
pub const PLAN_CACHE_CAPACITY: usize = 64;

/// Every way preparing or executing a prepared query can fail.
#[derive(Debug, thiserror::Error)]
pub enum PreparedError {
    /// The statement is not a query or an `INSERT` (DDL, `SET`, `PREPARE`, ...).
    #[error("only queries and INSERT can be prepared, not: {0}")]
    NotAQuery(String),
    /// A parameter that is not positional (`$1`, `$2`, ...) or whose numbering has gaps.
    #[error("parameters must be numbered $1..$n without gaps; found {0}")]
    ParameterNames(String),
    /// The statement does not say what type a parameter has.
    #[error("cannot infer the type of parameter {0}; add a cast, e.g. CAST({0} AS BIGINT)")]
    UntypedParameter(String),
    /// The wrong number of values for the parameters.
    #[error("the query takes {expected} parameters, {got} given")]
    ParameterCount {
        /// Parameters the query has.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A value that cannot be converted to its parameter's type.
    #[error("parameter {id} is {expected}; the value {value} cannot be converted to it")]
    ParameterType {
        /// The parameter (`$2`).
        id: String,
        /// Its type.
        expected: DataType,
        /// The value given.
        value: String,
    },
    /// Planning or execution failed.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
}

/// A query planned once, executed with parameters. Cheap to share (`Arc`) across tasks.
///
/// Physical plans are kept too, per bound values, when nothing in them depends on the
/// moment they were planned: every leaf is a Pulpitum scan that lists its buckets at
/// execution (a statement naming its channels). A hit re-arms the cached plan with
/// [`reset_plan_states`] (fresh operator state and metrics) instead of planning again; so
/// the same page asked for again, the common case of a busy channel, skips planning. Plans
/// whose scans listed buckets while planning, INSERTs, and plans with operators that keep
/// state DataFusion cannot reset (sorts with a limit, joins, aggregates) are planned every
/// time.
#[derive(Debug)]
pub struct PreparedQuery {
    state: SessionState,
    /// The plan as parsed, before analysis: values its typed plan would narrow are
    /// planned from here (see [`PreparedQuery::physical_plan`]).
    parsed: LogicalPlan,
    plan: LogicalPlan,
    /// The statement calls a function that is not immutable (`now()`, `random()`): its
    /// optimiser would fold it to the value at preparation, so each execution optimises
    /// the parsed plan anew instead, and no physical plan is kept.
    unstable: bool,
    params: Vec<DataType>,
    task: Arc<TaskContext>,
    plans: Mutex<Lru<Vec<ScalarValue>, Arc<dyn ExecutionPlan>>>,
    /// The declared tables scanned, with their schema versions at preparation.
    declared: Vec<(datafusion::common::TableReference, u32)>,
    /// The session's time zone at preparation, if it had one set.
    zone: Option<datafusion::arrow::array::timezone::Tz>,
}

/// Operators that keep no state across executions once [`reset_plan_states`] has rebuilt
/// them. Operators with dynamic filters (TopK sorts, joins, some aggregates) are left out:
/// DataFusion does not support executing those plans twice.
const REUSABLE_OPERATORS: [&str; 8] = [
    "ProjectionExec",
    "CooperativeExec",
    "CoalesceBatchesExec",
    "CoalescePartitionsExec",
    "SortPreservingMergeExec",
    "GlobalLimitExec",
    "LocalLimitExec",
    "FilterExec",
];

/// `plan` with each `LIMIT` and `OFFSET` expression (in subqueries too) that `f` replaces
/// replaced; `f` answers `None` to keep one as it is.
pub(crate) fn map_limits(
    plan: LogicalPlan,
    mut f: impl FnMut(&Expr) -> Option<Expr>,
) -> Result<LogicalPlan, DataFusionError> {
    plan.transform_up_with_subqueries(|p| match p {
        LogicalPlan::Limit(Limit { skip, fetch, input }) => {
            let mut changed = false;
            let mut map = |e: Option<Box<Expr>>| {
                e.map(|e| match f(&e) {
                    Some(new) => {
                        changed = true;
                        Box::new(new)
                    }
                    None => e,
                })
            };
            let (skip, fetch) = (map(skip), map(fetch));
            let limit = Limit { skip, fetch, input };
            Ok(Transformed::new_transformed(
                LogicalPlan::Limit(limit),
                changed,
            ))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// `plan` with each `LIMIT` and `OFFSET` that is a cast of a constant folded into the
/// constant. The plan was optimised with its parameters in place, so a `LIMIT $1` bound
/// afterwards is the value under the casts type coercion put around the parameter, which
/// the physical planner does not evaluate ("Unsupported LIMIT expression").
fn constant_limits(plan: LogicalPlan) -> Result<LogicalPlan, DataFusionError> {
    fn constant(e: &Expr) -> Option<ScalarValue> {
        match e {
            Expr::Literal(v, _) => Some(v.clone()),
            Expr::Cast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
            Expr::TryCast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
            _ => None,
        }
    }
    map_limits(plan, |e| match e {
        Expr::Literal(..) => None,
        e => constant(e).map(|v| Expr::Literal(v, None)),
    })
}

/// Whether a physical plan can be executed again later: its leaves are all Pulpitum scans
/// that list buckets when they run (so the plan holds nothing observed while planning),
/// and every operator above them is one of [`REUSABLE_OPERATORS`].
fn reusable(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let children = plan.children();
    if children.is_empty() {
        return plan
            .downcast_ref::<PulpitumScanExec>()
            .is_some_and(|scan| scan.spec().deferred);
    }
    REUSABLE_OPERATORS.contains(&plan.name()) && children.into_iter().all(reusable)
}

/// Whether binding `given` as `converted` (its value in the parameter's type) lost
/// something that decides a comparison: the conversion back does not give the value again.
/// Only numbers and times are checked (and strings naming a time, at nanosecond precision;
/// one outside nanoseconds' range counts as narrowed); other conversions are exact or fail
/// outright.
fn narrows(given: &ScalarValue, converted: &ScalarValue) -> bool {
    use datafusion::arrow::datatypes::TimeUnit;
    let given_type = given.data_type();
    let precise = match (&given_type, converted.data_type()) {
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, DataType::Timestamp(_, tz)) => {
            match given.cast_to(&DataType::Timestamp(TimeUnit::Nanosecond, tz)) {
                Ok(p) => p,
                // An instant nanoseconds cannot hold (before 1677, after 2262): planned with
                // the value itself, which answers as the statement written with it does
                // (break-it finding: bound truncated, it matched a finer instant).
                Err(_) => return true,
            }
        }
        (t, _) if t.is_numeric() || t.is_temporal() => given.clone(),
        _ => return false,
    };
    if precise.data_type() == converted.data_type() {
        return false;
    }
    converted
        .cast_to(&precise.data_type())
        .map_or(true, |back| back != precise)
}

/// Prepares `sql` against the tables of `ctx`. Parameters are `$1..$n`; each one's type is
/// taken from what it is compared with (`channel_id = $1` makes `$1` a BIGINT).
pub async fn prepare(ctx: &SessionContext, sql: &str) -> Result<PreparedQuery, PreparedError> {
    let state = preparing(ctx);
    let plan = crate::provider::defaults::plan_text(ctx, &state, sql).await?;
    finish(state, plan)
}

/// Prepares a statement its caller has parsed already (the wire server, whose parser is
/// PostgreSQL's: parsing its text again with another dialect could read another
/// statement than the one the server judged).
pub async fn prepare_parsed(
    ctx: &SessionContext,
    statement: &datafusion::sql::sqlparser::ast::Statement,
) -> Result<PreparedQuery, PreparedError> {
    let state = preparing(ctx);
    let plan = crate::provider::defaults::plan_statement(ctx, &state, statement).await?;
    finish(state, plan)
}

fn preparing(ctx: &SessionContext) -> SessionState {
    let mut state = ctx.state();
    state.config_mut().set_extension(Arc::new(ScanPlanning {
        list_at_execution: true,
    }));
    state
}

/// Whether `plan` calls a function whose value may change between executions.
fn calls_unstable_functions(plan: &LogicalPlan) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::{Expr, Volatility};
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if f.func.signature().volatility != Volatility::Immutable {
                        found = true;
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    found
}

fn finish(state: SessionState, plan: LogicalPlan) -> Result<PreparedQuery, PreparedError> {
    if matches!(
        plan,
        LogicalPlan::Ddl(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::DescribeTable(_)
            | LogicalPlan::Copy(_)
    ) {
        return Err(PreparedError::NotAQuery(plan.display().to_string()));
    }
    let types = plan.get_parameter_types()?;
    let mut params = Vec::with_capacity(types.len());
    for i in 1..=types.len() {
        let id = format!("${i}");
        match types.get(&id) {
            Some(Some(t)) => params.push(t.clone()),
            Some(None) => return Err(PreparedError::UntypedParameter(id)),
            None => {
                let mut names: Vec<&String> = types.keys().collect();
                names.sort();
                let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
                return Err(PreparedError::ParameterNames(names.join(", ")));
            }
        }
    }
    let parsed = plan.clone();
    // A DELETE or UPDATE is bound and optimized at each execution, like a statement with
    // unstable functions: its WHERE is sealed from the optimizer (`provider::ChangeShape`),
    // and a seal made at preparation would hide the placeholders from the binding.
    let unstable = calls_unstable_functions(&plan) || matches!(plan, LogicalPlan::Dml(_));
    let plan = state.optimize(&plan)?;
    let task = state.task_ctx();
    let declared = declared_scans(&parsed);
    // Strings bound to times with a zone are read in the session's zone
    // ([`crate::provider::zoned`]), the zone the statement was prepared in.
    let zone = state
        .config()
        .options()
        .execution
        .time_zone
        .as_deref()
        .and_then(|z| {
            <datafusion::arrow::array::timezone::Tz as std::str::FromStr>::from_str(z).ok()
        });
    Ok(PreparedQuery {
        zone,
        state,
        parsed,
        plan,
        unstable,
        params,
        task,
        plans: Mutex::new(Lru::new(PLAN_CACHE_CAPACITY)),
        declared,
    })
}

/// The declared tables a plan scans, with the schema version it was planned with.
fn declared_scans(plan: &LogicalPlan) -> Vec<(datafusion::common::TableReference, u32)> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut out = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            if let Ok(provider) = datafusion::datasource::source_as_provider(&scan.source) {
                if let Some(t) = provider.downcast_ref::<crate::provider::PulpitumTable>() {
                    if let crate::provider::Surface::Declared(d) = t.surface() {
                        out.push((scan.table_name.clone(), d.schema.version));
                    }
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

impl PreparedQuery {
    /// Whether every declared table the query scans still has the schema version it was
    /// prepared with, as the session sees it (compared with the registry at most once per
    /// `provider::factory::SCHEMA_RECHECK`, or at once after a statement found a schema
    /// outdated). A query prepared before a schema change must be prepared again: its plan
    /// decodes rows with the older columns.
    pub async fn is_current(&self) -> Result<bool, PreparedError> {
        for (name, version) in &self.declared {
            let schema = self.state.schema_for_ref(name.clone())?;
            let Some(provider) = schema.table(name.table()).await? else {
                return Ok(false);
            };
            let now = provider
                .downcast_ref::<crate::provider::PulpitumTable>()
                .and_then(|t| match t.surface() {
                    crate::provider::Surface::Declared(d) => Some(d.schema.version),
                    _ => None,
                });
            if now != Some(*version) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The parameters' types, `$1` first.
    pub fn parameter_types(&self) -> &[DataType] {
        &self.params
    }

    /// The result's columns.
    pub fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        Arc::new(self.plan.schema().as_arrow().clone())
    }

    /// The optimised logical plan, with its placeholders (what every execution runs).
    pub fn logical_plan(&self) -> &LogicalPlan {
        &self.plan
    }

    /// Whether this is a query (rows out), not an `INSERT` (a count out).
    pub fn is_query(&self) -> bool {
        !matches!(self.plan, LogicalPlan::Dml(_))
    }

    /// The physical plan for these values (for `EXPLAIN`-like inspection and tests).
    ///
    /// A value finer than its parameter's type (a nanosecond instant for a microsecond
    /// `timestamp`, `1.5` for a BIGINT) cannot be bound to the prepared plan: converting it
    /// would change which rows match (`timestamp = $1` would match the truncated instant).
    /// Such an execution plans the parsed statement with the value itself, so the
    /// comparison is answered exactly (see [`crate::provider::literals`]); it is slower
    /// and its plan is not cached.
    pub async fn physical_plan(
        &self,
        values: &[ScalarValue],
    ) -> Result<Arc<dyn ExecutionPlan>, PreparedError> {
        let values = &*self.explicit_times(values);
        let bound = self.bind(values)?;
        let narrowed = values
            .iter()
            .zip(&bound)
            .any(|(given, converted)| narrows(given, converted));
        if narrowed || self.unstable {
            let exact = if narrowed { values.to_vec() } else { bound };
            let logical = self
                .parsed
                .clone()
                .with_param_values(ParamValues::from(exact))?;
            // `now()` is the start of this execution, not of the preparation.
            let mut state = self.state.clone();
            state.mark_start_execution();
            let logical = state.optimize(&logical)?;
            return Ok(state
                .query_planner()
                .create_physical_plan(&logical, &state)
                .await?);
        }
        let cached = self.plans.lock().expect("plan cache lock").get(&bound);
        if let Some(plan) = cached {
            return Ok(reset_plan_states(plan)?);
        }
        let logical = self
            .plan
            .clone()
            .with_param_values(ParamValues::from(bound.clone()))?;
        let logical = constant_limits(logical)?;
        // The logical plan was optimised when prepared; only physical planning remains.
        let plan = self
            .state
            .query_planner()
            .create_physical_plan(&logical, &self.state)
            .await?;
        if reusable(&plan) {
            // The cache keeps an unexecuted copy; this call runs the original.
            let copy = reset_plan_states(plan.clone())?;
            self.plans
                .lock()
                .expect("plan cache lock")
                .insert(bound, copy);
        }
        Ok(plan)
    }

    /// Whether executing with `values` plans nothing: the values bind without narrowing and
    /// a physical plan for them is cached (never the case for a statement that optimises
    /// at every execution, `now()` or `random()`: its plans are not cached). Anything else
    /// runs the optimiser or the physical planner ([`Self::physical_plan`]), which a caller
    /// on an async runtime's worker may want to run elsewhere.
    pub fn plans_nothing(&self, values: &[ScalarValue]) -> bool {
        !matches!(self.ready_plan(values), Ok(None))
    }

    /// Runs the query with these values as a stream of batches if that plans nothing
    /// ([`Self::plans_nothing`]): `None` when it would plan, for the caller to call
    /// [`Self::execute_stream`] where planning may take its time. One binding and one
    /// cache lookup, where asking first and executing after would take two of each.
    pub fn execute_cached(
        &self,
        values: &[ScalarValue],
    ) -> Option<Result<SendableRecordBatchStream, PreparedError>> {
        match self.ready_plan(values) {
            Ok(Some(plan)) => Some(execute_stream(plan, self.task.clone()).map_err(Into::into)),
            Ok(None) => None,
            // Refused at binding, before any planning.
            Err(e) => Some(Err(e)),
        }
    }

    /// The cached physical plan for these values, reset for a new execution; `Ok(None)` when
    /// there is none to use (values that narrow, a statement optimised at every execution,
    /// or values not planned yet).
    fn ready_plan(
        &self,
        values: &[ScalarValue],
    ) -> Result<Option<Arc<dyn ExecutionPlan>>, PreparedError> {
        let values = &*self.explicit_times(values);
        let bound = self.bind(values)?;
        if self.unstable || values.iter().zip(&bound).any(|(g, c)| narrows(g, c)) {
            return Ok(None);
        }
        let cached = self.plans.lock().expect("plan cache lock").get(&bound);
        Ok(cached.map(reset_plan_states).transpose()?)
    }

    /// The session's time zone the query was prepared in, if it had one set: strings for
    /// its times are read there.
    pub fn zone(&self) -> Option<&datafusion::arrow::array::timezone::Tz> {
        self.zone.as_ref()
    }

    /// Physical plans currently cached (for tests and diagnostics).
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().expect("plan cache lock").len()
    }

    /// Runs the query with these values and collects its rows.
    pub async fn execute(&self, values: &[ScalarValue]) -> Result<Vec<RecordBatch>, PreparedError> {
        let plan = self.physical_plan(values).await?;
        Ok(collect(plan, self.task.clone()).await?)
    }

    /// Runs the query with these values as a stream of batches.
    pub async fn execute_stream(
        &self,
        values: &[ScalarValue],
    ) -> Result<SendableRecordBatchStream, PreparedError> {
        let plan = self.physical_plan(values).await?;
        Ok(execute_stream(plan, self.task.clone())?)
    }

    /// `values` with each string bound to a time with a zone made explicit in the session's
    /// zone ([`crate::provider::zoned::in_session_zone`]), as the analyzer makes a string
    /// literal explicit where it was written; `values` itself when there is nothing to do.
    fn explicit_times<'a>(&self, values: &'a [ScalarValue]) -> std::borrow::Cow<'a, [ScalarValue]> {
        let Some(zone) = &self.zone else {
            return values.into();
        };
        let zoned = |(v, t): (&ScalarValue, &DataType)| {
            matches!(t, DataType::Timestamp(_, Some(_)))
                .then(|| crate::provider::zoned::in_session_zone(v, zone))
                .flatten()
        };
        if values.iter().zip(&self.params).all(|p| zoned(p).is_none()) {
            return values.into();
        }
        values
            .iter()
            .zip(&self.params)
            .map(|p| zoned(p).unwrap_or_else(|| p.0.clone()))
            .chain(values.iter().skip(self.params.len()).cloned())
            .collect::<Vec<_>>()
            .into()
    }

    /// The values converted to the parameters' types.
    fn bind(&self, values: &[ScalarValue]) -> Result<Vec<ScalarValue>, PreparedError> {
        if values.len() != self.params.len() {
            return Err(PreparedError::ParameterCount {
                expected: self.params.len(),
                got: values.len(),
            });
        }
        let mut out = Vec::with_capacity(values.len());
        for (i, (v, t)) in values.iter().zip(&self.params).enumerate() {
            if v.data_type() == *t {
                out.push(v.clone());
                continue;
            }
            let converted = v.cast_to(t).ok().filter(|c| c.is_null() == v.is_null());
            match converted {
                Some(c) => out.push(c),
                None => {
                    return Err(PreparedError::ParameterType {
                        id: format!("${}", i + 1),
                        expected: t.clone(),
                        value: v.to_string(),
                    })
                }
            }
        }
        Ok(out)
    }
}
