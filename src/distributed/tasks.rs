//! Which scans run on workers, and how one is cut into tasks.
//!
//! datafusion-distributed asks every leaf how many tasks it wants
//! ([`desired_task_count`]) and then asks it to split itself into that many
//! ([`scale_up`]). A Pulpitum scan is split only when every bucket it listed is archived
//! ([`ScanSpec::splittable_buckets`]: immutable objects, the same from any process, so a
//! worker reads exactly what the coordinator would) and it was planned without an ordering
//! ([`crate::provider::SplitScans`]: the shuffles above a split scan do not keep one).
//! Any other scan (one listing a Hot or Archiving bucket, a page, a scan that lists at
//! execution, a change's read) answers "at most one task". A plan whose stages are all of
//! one task is not distributed at all: it runs on the coordinator. A one-task scan in a
//! plan that also splits one (recent rows joined with history) is a stage that the engine
//! places on a worker; it reads each hot bucket as one process does, in one statement
//! returning the bucket's route with its rows.
//!
//! A split takes the scan's buckets in `(partition key, time)` order and cuts them into
//! runs of about equal bucket counts, one per task. Segments hold runs of consecutive
//! partitions of one window, so a run of buckets mostly shares its objects with no other
//! task. Each task then groups its run into DataFusion partitions as a scan in one process
//! does, so every partition keeps the scan's declared ordering.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedTaskContext,
    ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse,
};
use futures::StreamExt;

use super::metrics::{Raised, WorkerMetrics};
use super::{DistributedError, DistributedSettings};
use crate::provider::{PulpitumScanExec, ScanSpec};
use crate::table::{plan_groups, KeyBuckets};

/// datafusion-distributed's question to each leaf: how many tasks.
pub(crate) fn desired_task_count(
    ev: DesiredTaskCountEvent<'_>,
) -> Option<DFResult<DesiredTaskCountEventResponse>> {
    let scan = ev.plan.downcast_ref::<PulpitumScanExec>()?;
    let per_task = ev
        .session_config
        .get_extension::<DistributedSettings>()
        .map_or(super::DEFAULT_BUCKETS_PER_TASK, |s| s.buckets_per_task)
        .max(1);
    // Only a scan planned unordered may become several tasks: the stages above an ordered
    // one rely on its order, which a split would not keep.
    Some(Ok(match scan.spec().splittable_buckets() {
        Some(n) if scan.spec().unordered => {
            DesiredTaskCountEventResponse::desired(n.div_ceil(per_task))
        }
        _ => DesiredTaskCountEventResponse::maximum(1),
    }))
}

/// datafusion-distributed's order to a leaf: become `task_count` tasks.
pub(crate) fn scale_up(
    ev: ScaleUpLeafNodeEvent<'_>,
) -> Option<DFResult<ScaleUpLeafNodeEventResponse>> {
    let scan = ev.plan.downcast_ref::<PulpitumScanExec>()?;
    Some(
        split(scan.spec(), ev.task_count)
            .map(|t| ScaleUpLeafNodeEventResponse::new(Arc::new(t)))
            .map_err(DataFusionError::from),
    )
}

/// `spec`'s buckets cut into `tasks` runs of about equal bucket counts, in key and time
/// order; a key whose buckets straddle two runs is read in part by each.
pub fn split(spec: &ScanSpec, tasks: usize) -> Result<TaskScanExec, DistributedError> {
    // An ordered scan is never cut: its one run goes to the first task, the others read
    // nothing, so what the stage above receives is in order.
    let tasks = tasks.max(1);
    let cut = if spec.unordered { tasks } else { 1 };
    let total: usize = spec.keys.iter().map(|k| k.buckets.len()).sum();
    let per_task = total.div_ceil(cut).max(1);
    let mut runs: Vec<Vec<KeyBuckets>> = vec![Vec::new(); tasks];
    let mut taken = 0usize;
    for key in &spec.keys {
        for b in &key.buckets {
            let run = &mut runs[(taken / per_task).min(cut - 1)];
            match run.last_mut() {
                Some(last) if last.partition_key == key.partition_key => {
                    last.buckets.push(b.clone())
                }
                _ => run.push(KeyBuckets {
                    partition_key: key.partition_key.clone(),
                    buckets: vec![b.clone()],
                }),
            }
            taken += 1;
        }
    }
    let scans = runs
        .into_iter()
        .map(|keys| {
            let groups = plan_groups(&keys, spec.target_partitions, false);
            let mut own = spec.clone();
            own.keys = keys;
            PulpitumScanExec::with_groups(own, groups)
                .map_err(|e| DistributedError::Plan(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    TaskScanExec::new(spec.clone(), scans)
}

/// A scan cut into tasks: on a worker running task `i` of its stage, the partitions of the
/// `i`th part. Every task has the same partition count (the largest part's); a part with
/// fewer groups answers its extra partitions with no rows.
#[derive(Debug, Clone)]
pub struct TaskScanExec {
    /// The scan as planned, over all its buckets (what `EXPLAIN` and the codec describe).
    whole: Arc<PulpitumScanExec>,
    tasks: Vec<Arc<PulpitumScanExec>>,
    props: Arc<PlanProperties>,
    /// On a worker, its counters: each partition run is counted with its rows.
    meter: Option<Arc<WorkerMetrics>>,
}

impl TaskScanExec {
    /// The tasks of `spec`; the plan's orderings are those every part's partitions keep.
    pub fn new(spec: ScanSpec, tasks: Vec<PulpitumScanExec>) -> Result<Self, DistributedError> {
        let partitions = tasks
            .iter()
            .map(|t| t.groups().len())
            .max()
            .unwrap_or(0)
            .max(1);
        // The orderings a scan over all these groups declares hold for each of them.
        let all: Vec<Vec<KeyBuckets>> = tasks
            .iter()
            .flat_map(|t| t.groups().iter().cloned())
            .collect();
        let whole = PulpitumScanExec::with_groups(spec, all)
            .map_err(|e| DistributedError::Plan(e.to_string()))?;
        let props = PlanProperties::new(
            whole.properties().equivalence_properties().clone(),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            whole: Arc::new(whole),
            tasks: tasks.into_iter().map(Arc::new).collect(),
            props: Arc::new(props),
            meter: None,
        })
    }

    /// The same scan, counting its runs on `meter` (a worker's).
    pub(crate) fn metered(&self, meter: Arc<WorkerMetrics>) -> Self {
        Self {
            meter: Some(meter),
            ..self.clone()
        }
    }

    /// The scan as planned.
    pub fn spec(&self) -> &ScanSpec {
        self.whole.spec()
    }

    /// The parts, one per task.
    pub fn tasks(&self) -> &[Arc<PulpitumScanExec>] {
        &self.tasks
    }
}

impl DisplayAs for TaskScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let parts: Vec<String> = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let keys = s.spec().keys.len();
                let buckets: usize = s.spec().keys.iter().map(|k| k.buckets.len()).sum();
                format!("t{i}:[keys={keys}, buckets={buckets}]")
            })
            .collect();
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "tasks={}", self.tasks.len())?;
                self.whole.fmt_as(t, f)
            }
            _ => {
                write!(f, "PulpitumTaskScanExec: tasks=[{}], ", parts.join(", "))?;
                self.whole.fmt_as(t, f)
            }
        }
    }
}

impl ExecutionPlan for TaskScanExec {
    fn name(&self) -> &str {
        "PulpitumTaskScanExec"
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
                "PulpitumTaskScanExec has no children".into(),
            ))
        }
    }

    fn reset_state(self: Arc<Self>) -> DFResult<Arc<dyn ExecutionPlan>> {
        let mut tasks = Vec::with_capacity(self.tasks.len());
        for t in &self.tasks {
            let fresh = t.clone().reset_state()?;
            let Some(scan) = fresh.downcast_ref::<PulpitumScanExec>() else {
                return Err(DataFusionError::Internal(
                    "a reset scan is no longer a scan".into(),
                ));
            };
            tasks.push(Arc::new(PulpitumScanExec::with_groups(
                scan.spec().clone(),
                scan.groups().to_vec(),
            )?));
        }
        Ok(Arc::new(Self {
            whole: self.whole.clone(),
            tasks,
            props: self.props.clone(),
            meter: self.meter.clone(),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        // A worker runs one part; the others report nothing there.
        let mut all = MetricsSet::new();
        for t in &self.tasks {
            if let Some(m) = t.metrics() {
                for metric in m.iter() {
                    all.push(metric.clone());
                }
            }
        }
        Some(all)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let task = DistributedTaskContext::from_ctx(&context);
        let Some(part) = self.tasks.get(task.task_index) else {
            return Err(DistributedError::Plan(format!(
                "task {} of a scan split into {} tasks",
                task.task_index,
                self.tasks.len()
            ))
            .into());
        };
        if partition >= part.groups().len() {
            let schema: SchemaRef = self.schema();
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::empty(),
            )));
        }
        let stream = part.execute(partition, context)?;
        let Some(meter) = &self.meter else {
            return Ok(stream);
        };
        meter.scan_tasks.inc();
        let active = Raised::new(&meter.scan_tasks_active);
        let meter = meter.clone();
        let schema = stream.schema();
        let counted = stream.map(move |item| {
            // Lowered when the stream is dropped, finished or abandoned.
            let _running = &active;
            match &item {
                Ok(batch) => {
                    meter.scan_rows.inc_by(batch.num_rows() as u64);
                }
                Err(_) => {
                    meter.scan_errors.inc();
                }
            }
            item
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, counted)))
    }
}
