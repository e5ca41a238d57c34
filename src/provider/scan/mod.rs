//! `PulpitumScanExec`: the physical scan of one table, as DataFusion sees it.
//!
//! The table decides what is read ([`crate::table`]): the provider asked it for the buckets
//! the filters can match, and [`PulpitumScanExec::try_new`] has it group them into
//! DataFusion partitions ([`plan_groups`]). Each partition emits its partition keys in
//! ascending key order and, per key, its buckets in time order (newest first in descending
//! mode). So every partition is sorted by `(partition, time, sort)`, and by `(time, sort)`
//! when it holds one partition key; both orderings are declared, which lets DataFusion drop
//! `SortExec` for `ORDER BY timestamp, id` on one channel and answer `ORDER BY timestamp
//! DESC LIMIT n` through [`ExecutionPlan::try_pushdown_sort`] with a descending scan that
//! stops after `n` rows, reading only the newest buckets it needs.
//!
//! At execution a partition reads its units (buckets, or whole keys listed as it goes) in
//! order through [`DurableTable::scan_unit`], under one row limit the table counts. A
//! limited scan opens a unit only when the previous one is exhausted and the limit is not
//! reached; a scan without a limit reads every unit anyway, so it opens the next one while
//! the current one is still being consumed. What this node adds is DataFusion's side: the
//! plan's properties and `EXPLAIN` text, per-tier metrics, the per-query limits, and the
//! envelope rows turned into the surface's columns.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::{Column, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream, SortOrderPushdownResult,
};
use futures::stream::{self, StreamExt};

use super::metrics::{batch_bytes, TierMetrics};
use super::surface::{Role, Surface};
use super::{ProviderError, QueryLimits};
use crate::archive::ArchiveScanMetrics;
use crate::model::schema::predicate::{ValuePredicate, ValueRead};
use crate::table::{
    plan_groups, scan_units, BucketCounts, BucketScan, DurableTable, KeyBuckets, RowLimit, ScanUnit,
};

mod output;
use output::prefetched;

/// Everything a scan was planned with.
#[derive(Debug, Clone)]
pub struct ScanSpec {
    /// The table.
    pub table: DurableTable,
    /// Its SQL surface.
    pub surface: Surface,
    /// Projected column indices into the surface schema.
    pub projection: Vec<usize>,
    /// Bounds every tier applies, and the filters they came from.
    pub pushed: super::filters::PushedFilters,
    /// Predicates on value columns that columnar archive reads may apply early (SQL applies
    /// them above the scan as well).
    pub value_filters: Arc<[ValuePredicate]>,
    /// Buckets to read, per partition key, in key order.
    pub keys: Vec<KeyBuckets>,
    /// DataFusion's target partitions (the most scan partitions to use).
    pub target_partitions: usize,
    /// What the listing saw.
    pub counts: BucketCounts,
    /// Buckets are listed when the scan runs, per key, with the first page
    /// ([`crate::provider::ScanPlanning`]); `keys` then hold no buckets.
    pub deferred: bool,
    /// Rows per partition the scan may stop after.
    pub limit: Option<usize>,
    /// Newest first.
    pub descending: bool,
    /// Rows per hot page.
    pub page_rows: usize,
    /// Per-query limits.
    pub limits: QueryLimits,
    /// Runs where it was planned, never on a distributed worker: the read of a `DELETE` or
    /// `UPDATE`, whose rows are written back by this process (see [`crate::distributed`]).
    pub local_only: bool,
    /// Declares no ordering: the scan will be split into tasks ([`super::SplitScans`]), and
    /// the stages above it do not keep an order across tasks, so nothing may rely on one.
    pub unordered: bool,
}

impl ScanSpec {
    /// Whether this scan may ever be split into tasks: not a change's read, a page (a
    /// pushed-down limit), a scan that lists at execution, one of contradicting filters,
    /// or one that names its partitions (`channel_id = 1`, `IN (...)`): that is one
    /// channel's history, which one process serves, and its early stop for
    /// `ORDER BY ... LIMIT` (the latest page) is worth more than spreading it.
    fn may_split(&self) -> bool {
        !(self.local_only
            || self.deferred
            || self.limit.is_some()
            || self.pushed.empty
            || self.pushed.partitions.is_some())
    }

    /// The buckets a split into tasks would share out, if this scan may be split
    /// ([`Self::may_split`]) and every bucket it listed is archived (immutable objects, the
    /// same from any process).
    pub fn splittable_buckets(&self) -> Option<usize> {
        if !self.may_split() {
            return None;
        }
        let mut n = 0usize;
        for key in &self.keys {
            for (_, route) in &key.buckets {
                if matches!(route, crate::table::Route::Hot) {
                    return None;
                }
                n += 1;
            }
        }
        (n > 1).then_some(n)
    }

    /// This scan as two that together read exactly its buckets: its archived buckets (a
    /// scan that may be split, when there are more than `buckets_per_task` of them) and its
    /// Hot or Archiving ones (one task); `None` when the scan may not be split at all, or
    /// reads one tier only. Both halves are planned unordered.
    pub fn split_tiers(&self, buckets_per_task: usize) -> Option<(ScanSpec, ScanSpec)> {
        if !self.may_split() {
            return None;
        }
        let (mut archived, mut hot) = (Vec::new(), Vec::new());
        for key in &self.keys {
            let (a, h): (Vec<_>, Vec<_>) = key
                .buckets
                .iter()
                .cloned()
                .partition(|(_, route)| matches!(route, crate::table::Route::Archived { .. }));
            for (list, part) in [(&mut archived, a), (&mut hot, h)] {
                if !part.is_empty() {
                    list.push(KeyBuckets {
                        partition_key: key.partition_key.clone(),
                        buckets: part,
                    });
                }
            }
        }
        let archived_buckets: usize = archived.iter().map(|k| k.buckets.len()).sum();
        if hot.is_empty() || archived_buckets <= buckets_per_task.max(1) {
            return None;
        }
        let c = self.counts;
        let half = |keys: Vec<KeyBuckets>, counts: BucketCounts| ScanSpec {
            keys,
            counts,
            unordered: true,
            ..self.clone()
        };
        Some((
            half(
                archived,
                BucketCounts {
                    archived: c.archived,
                    pruned: c.pruned,
                    ..BucketCounts::default()
                },
            ),
            half(
                hot,
                BucketCounts {
                    hot: c.hot,
                    archiving: c.archiving,
                    ..BucketCounts::default()
                },
            ),
        ))
    }
}

/// The scan plan node.
#[derive(Debug)]
pub struct PulpitumScanExec {
    // Shared, not copied, when a prepared statement re-arms a cached plan for a new execution.
    spec: Arc<ScanSpec>,
    groups: Arc<Vec<Vec<KeyBuckets>>>,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    shared: Arc<QueryCounters>,
    /// The rows the whole scan returns, when its manifests tell exactly
    /// ([`DurableTable::exact_rows`]): what DataFusion answers `count(*)` from. Only the node
    /// the provider plans carries it; any node derived from it (a pushed limit, a reversed
    /// or split scan) states nothing.
    exact_rows: Option<u64>,
    /// Filters a TopK above publishes as it runs (see `super::dynamic`): units whose times
    /// they reject are not read. Dropped when the plan is re-armed for another execution,
    /// whose TopK starts a filter of its own.
    dynamic: Arc<[Arc<dyn PhysicalExpr>]>,
}

/// Counters shared by all partitions of one execution, for the per-query limits.
#[derive(Debug, Default)]
struct QueryCounters {
    rows: AtomicU64,
    bytes: AtomicU64,
    started: OnceLock<Instant>,
}

impl PulpitumScanExec {
    /// Builds the node and computes its properties once.
    pub fn try_new(spec: ScanSpec) -> Result<Self, ProviderError> {
        let groups = plan_groups(
            &spec.keys,
            spec.target_partitions,
            spec.limit.is_some() || spec.deferred,
        );
        Self::with_groups(spec, groups)
    }

    /// The node reading `groups` (one per DataFusion partition, each in the order
    /// [`plan_groups`] gives) instead of the groups `try_new` plans from `spec.keys`: how a
    /// distributed task reads its share of a scan ([`crate::distributed`]).
    pub fn with_groups(
        spec: ScanSpec,
        groups: Vec<Vec<KeyBuckets>>,
    ) -> Result<Self, ProviderError> {
        let full = spec.surface.schema();
        let schema = Arc::new(full.project(&spec.projection)?);
        let eq = equivalence(&spec, &groups, &schema);
        let props = PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(groups.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            spec: Arc::new(spec),
            groups: Arc::new(groups),
            schema,
            props: Arc::new(props),
            metrics: ExecutionPlanMetricsSet::new(),
            shared: Arc::new(QueryCounters::default()),
            exact_rows: None,
            dynamic: Arc::new([]),
        })
    }

    /// This node stating that it returns exactly `rows` rows (see [`Self::exact_rows`]).
    pub fn with_exact_rows(mut self, rows: Option<u64>) -> Self {
        self.exact_rows = rows;
        self
    }

    /// The rows this scan returns, when known exactly before it runs.
    pub fn exact_rows(&self) -> Option<u64> {
        self.exact_rows
    }

    /// The plan's inputs (for tests and tools).
    pub fn spec(&self) -> &ScanSpec {
        &self.spec
    }

    /// The same scan with fresh counters and metrics, asking `dynamic` before each unit.
    fn fresh(&self, dynamic: Arc<[Arc<dyn PhysicalExpr>]>) -> Self {
        Self {
            spec: self.spec.clone(),
            groups: self.groups.clone(),
            schema: self.schema.clone(),
            props: self.props.clone(),
            metrics: ExecutionPlanMetricsSet::new(),
            shared: Arc::new(QueryCounters::default()),
            exact_rows: self.exact_rows,
            dynamic,
        }
    }

    fn with_spec(&self, spec: ScanSpec) -> Arc<dyn ExecutionPlan> {
        Arc::new(Self::try_new(spec).expect("same projection as an existing plan"))
    }

    /// The buckets of each scan partition.
    pub fn groups(&self) -> &[Vec<KeyBuckets>] {
        &self.groups
    }
}

fn sort_options(descending: bool) -> SortOptions {
    SortOptions {
        descending,
        nulls_first: descending,
    }
}

/// The orderings a scan guarantees, over the projected schema.
fn orderings(
    spec: &ScanSpec,
    groups: &[Vec<KeyBuckets>],
    schema: &SchemaRef,
) -> Vec<Vec<PhysicalSortExpr>> {
    if spec.unordered {
        return Vec::new();
    }
    let names = spec.surface.key_names();
    let col = |role_idx: usize, desc: bool| -> Option<PhysicalSortExpr> {
        let idx = schema.index_of(names[role_idx]).ok()?;
        let e: Arc<dyn PhysicalExpr> = Arc::new(Column::new(names[role_idx], idx));
        Some(PhysicalSortExpr::new(e, sort_options(desc)))
    };
    let prefix = |roles: &[(usize, bool)]| -> Vec<PhysicalSortExpr> {
        roles.iter().map_while(|(r, d)| col(*r, *d)).collect()
    };
    let d = spec.descending;
    let mut out = vec![prefix(&[(0, false), (1, d), (2, d)])];
    if groups.iter().all(|g| g.len() <= 1) {
        out.push(prefix(&[(1, d), (2, d)]));
    }
    out.retain(|o| !o.is_empty());
    out
}

fn equivalence(
    spec: &ScanSpec,
    groups: &[Vec<KeyBuckets>],
    schema: &SchemaRef,
) -> EquivalenceProperties {
    EquivalenceProperties::new_with_orderings(schema.clone(), orderings(spec, groups, schema))
}

impl DisplayAs for PulpitumScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let s = &self.spec;
        let c = s.counts;
        let cols: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let keys = s.keys.len();
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "table={}", s.table.definition().table_id)?;
                if s.deferred {
                    writeln!(f, "buckets=at execution")?;
                } else {
                    writeln!(
                        f,
                        "buckets=hot:{} archiving:{} archived:{} pruned:{}",
                        c.hot, c.archiving, c.archived, c.pruned
                    )?;
                }
                write!(
                    f,
                    "limit={}",
                    s.limit.map_or("none".to_string(), |l| l.to_string())
                )
            }
            _ => {
                let buckets = if s.deferred {
                    "at execution".to_string()
                } else {
                    format!(
                        "hot={}, archiving={}, archived={}, pruned={}",
                        c.hot, c.archiving, c.archived, c.pruned
                    )
                };
                write!(
                    f,
                    "PulpitumScanExec: table={}, projection=[{}], filters={}, partitions={}, keys={}, buckets=[{}], order={}, limit={}",
                    s.table.definition().table_id,
                    cols.join(", "),
                    s.pushed.describe(&s.surface),
                    self.groups.len(),
                    keys,
                    buckets,
                    if s.descending { "desc" } else { "asc" },
                    s.limit.map_or("none".to_string(), |l| l.to_string()),
                )?;
                if !s.value_filters.is_empty() {
                    let shown: Vec<String> =
                        s.value_filters.iter().map(ToString::to_string).collect();
                    write!(f, ", archive_value_filters=[{}]", shown.join(", "))?;
                }
                Ok(())
            }
        }
    }
}

impl ExecutionPlan for PulpitumScanExec {
    fn name(&self) -> &str {
        "PulpitumScanExec"
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
                "PulpitumScanExec has no children".into(),
            ))
        }
    }

    fn reset_state(self: Arc<Self>) -> DFResult<Arc<dyn ExecutionPlan>> {
        // Fresh limit counters and metrics for a new execution of the same plan; the rest
        // is immutable and shared (a prepared statement re-arms its cached plan this way).
        Ok(Arc::new(self.fresh(Arc::new([]))))
    }

    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> DFResult<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        // Every filter stays with its parent (the scan only skips units by it); the
        // dynamic ones, TopK's, are kept to ask before each unit.
        let filters: Vec<Arc<dyn PhysicalExpr>> = child_pushdown_result
            .parent_filters
            .into_iter()
            .map(|f| f.filter)
            .collect();
        let answer = vec![PushedDown::No; filters.len()];
        let dynamic: Vec<_> = filters
            .into_iter()
            .filter(|f| {
                phase == FilterPushdownPhase::Post
                    && f.downcast_ref::<DynamicFilterPhysicalExpr>().is_some()
            })
            .collect();
        let mut out = FilterPushdownPropagation::with_parent_pushdown_result(answer);
        if !dynamic.is_empty() {
            let dynamic = self.dynamic.iter().cloned().chain(dynamic).collect();
            out = out.with_updated_node(Arc::new(self.fresh(dynamic)) as Arc<dyn ExecutionPlan>);
        }
        Ok(out)
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> DFResult<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.schema);
        // The whole scan only: its partitions' shares are not known apart.
        if let (None, Some(Ok(rows))) = (args.partition(), self.exact_rows.map(usize::try_from)) {
            stats.num_rows = Precision::Exact(rows);
        }
        Ok(Arc::new(stats))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        let mut spec = ScanSpec::clone(&self.spec);
        spec.limit = match (spec.limit, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Some(self.with_spec(spec))
    }

    fn fetch(&self) -> Option<usize> {
        self.spec.limit
    }

    fn try_pushdown_sort(
        &self,
        order: &[PhysicalSortExpr],
    ) -> DFResult<SortOrderPushdownResult<Arc<dyn ExecutionPlan>>> {
        // Already satisfied as planned?
        let eq = self.props.equivalence_properties();
        if eq.ordering_satisfy(order.iter().cloned())? {
            return Ok(SortOrderPushdownResult::Exact {
                inner: self.with_spec(ScanSpec::clone(&self.spec)),
            });
        }
        // Satisfied by the reverse scan?
        let mut spec = ScanSpec::clone(&self.spec);
        spec.descending = !spec.descending;
        let reversed = Self::try_new(spec.clone()).map_err(DataFusionError::from)?;
        if reversed
            .props
            .equivalence_properties()
            .ordering_satisfy(order.iter().cloned())?
        {
            return Ok(SortOrderPushdownResult::Exact {
                inner: Arc::new(reversed),
            });
        }
        // Newest (or oldest) first across channels: no order of ours satisfies it, but
        // reading each channel in that direction lets a TopK above settle on its rows
        // early and skip the rest by its dynamic filter (`super::dynamic`).
        let by_time = order.first().and_then(|o| {
            let c = o.expr.downcast_ref::<Column>()?;
            let i = *self.spec.projection.get(c.index())?;
            (self.spec.surface.role_at(i) == Role::Time).then_some(o.options.descending)
        });
        match by_time {
            Some(descending) if descending != self.spec.descending => {
                Ok(SortOrderPushdownResult::Inexact {
                    inner: Arc::new(reversed),
                })
            }
            _ => Ok(SortOrderPushdownResult::Unsupported),
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let spec = self.spec.clone();
        let group: Vec<KeyBuckets> = self.groups.get(partition).cloned().unwrap_or_default();
        let metrics = TierMetrics::new(&self.metrics, partition);
        let objects = Arc::new(ArchiveScanMetrics::default());
        let started = *self.shared.started.get_or_init(Instant::now);
        // One limit for everything this partition reads; the table counts it.
        let limit = RowLimit::new(spec.limit);
        let mut units = scan_units(group, spec.deferred, spec.descending);
        let table = spec.table.clone();
        let req = BucketScan {
            bounds: spec.pushed.bounds.clone(),
            descending: spec.descending,
            include_value: spec
                .projection
                .iter()
                .any(|&i| spec.surface.role_at(i) == Role::Value),
            include_keys: spec
                .projection
                .iter()
                .any(|&i| matches!(spec.surface.role_at(i), Role::Time | Role::Sort)),
            page_rows: spec.page_rows,
            limit: None,
            archive_metrics: Some(objects.clone()),
            value: ValueRead {
                fields: spec.surface.value_fields(&spec.projection),
                filters: spec.value_filters.clone(),
            },
        };
        // With a TopK's filter, a unit is opened only when the previous one has been read
        // (the filter tightens as the TopK takes rows), not ahead of it.
        let prefetch = spec.limit.is_none() && units.len() > 1 && self.dynamic.is_empty();
        let unit_limit = limit.clone();
        let open = move |unit: ScanUnit| {
            let (metrics, at_end) = (metrics.clone(), metrics.clone());
            let (objects, objects_at_end) = (objects.clone(), objects.clone());
            table
                .scan_unit(unit, &req, &unit_limit)
                .inspect(move |item| {
                    if let Ok(chunk) = item {
                        metrics.record(chunk, batch_bytes(&chunk.batch));
                    }
                    metrics.sync(&objects);
                })
                // A unit whose reads return no rows (every row group pruned) still counts
                // what it fetched.
                .chain(stream::poll_fn(move |_| {
                    at_end.sync(&objects_at_end);
                    std::task::Poll::Ready(None)
                }))
                .boxed()
        };
        // One unit (a point query on one channel) is read as it is: no layers of iteration
        // and flattening for every wake-up of a latency-bound page.
        if units.len() == 1 && !prefetch {
            let unit = units.pop().expect("one unit");
            return Ok(self.surface_stream(open(unit), limit, started));
        }
        let dynamic = self.dynamic.clone();
        let time = spec
            .projection
            .iter()
            .position(|&i| spec.surface.role_at(i) == Role::Time);
        let per_unit = stream::iter(units)
            .filter(move |unit| {
                let read = dynamic.is_empty()
                    || super::dynamic::may_pass(&dynamic, time, super::dynamic::unit_span(unit));
                std::future::ready(read)
            })
            .map(open);
        let chunks = if prefetch {
            // A scan without a limit reads every unit, so the next one starts (its route,
            // manifest, first block read and verified) while this one is decoded, as
            // DataFusion's file streams open their next file early. Each unit runs in its own
            // task, at most `PREFETCH_CHUNKS` chunks ahead; dropping the scan aborts them.
            per_unit
                .map(|unit| async move { prefetched(unit) })
                .buffered(2)
                .flatten()
                .boxed()
        } else {
            per_unit.flatten().boxed()
        };
        Ok(self.surface_stream(chunks, limit, started))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use std::sync::atomic::Ordering as AtomicOrdering;
    use std::time::Duration;

    use datafusion::arrow::record_batch::RecordBatch;

    use super::output::PREFETCH_CHUNKS;
    use super::*;
    use crate::table::BucketChunk;
    use crate::table::Tier;

    /// Sets its flag when dropped: tells whether a unit's stream is still alive.
    struct DropFlag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, AtomicOrdering::SeqCst);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prefetch_runs_bounded_ahead_and_stops_when_the_scan_is_dropped() {
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let produced = Arc::new(AtomicUsize::new(0));
        let guard = DropFlag(dropped.clone());
        let made = produced.clone();
        // An endless unit, as a scan over a huge range looks from here.
        let unit = stream::repeat_with(move || {
            let _alive = &guard;
            made.fetch_add(1, AtomicOrdering::SeqCst);
            Ok(BucketChunk {
                tier: Tier::Hot,
                pages: 1,
                buckets: 0,
                batch: RecordBatch::new_empty(crate::archive::envelope_schema(false)),
            })
        })
        .boxed();
        let mut rx = prefetched(unit);
        assert!(rx.next().await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Ahead of the consumer by at most the channel's capacity and the chunk in hand.
        let ahead = produced.load(AtomicOrdering::SeqCst);
        assert!(
            ahead <= 1 + PREFETCH_CHUNKS + 1,
            "produced {ahead} chunks for one taken"
        );
        assert!(!dropped.load(AtomicOrdering::SeqCst));
        drop(rx);
        for _ in 0..100 {
            if dropped.load(AtomicOrdering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            dropped.load(AtomicOrdering::SeqCst),
            "the prefetch task still holds its unit after the scan was dropped"
        );
        let after = produced.load(AtomicOrdering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(produced.load(AtomicOrdering::SeqCst), after);
    }
}
