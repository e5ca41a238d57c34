//! How a Pulpitum scan crosses to a worker: [`ScanCodec`], DataFusion's
//! `PhysicalExtensionCodec` for [`PulpitumScanExec`] and [`TaskScanExec`].
//!
//! A scan travels with everything a worker needs to read exactly what the coordinator
//! planned, and nothing it has to look up: the table's definition (and a declared table's
//! schema, at the version the query was planned with), the projection, the bounds every
//! tier applies, the value predicates, the per-query limits and, per task and partition, the
//! buckets with the routes the coordinator's listing saw. A route's age travels, not its
//! instant (clocks of two processes do not compare): the worker dates it that far back from
//! its own now. The worker binds the scan to its own hot store and archive, so every read is
//! verified there exactly as in one process (digests, row counts, manifests).
//!
//! The bytes are JSON with a format number; a worker refuses a format it does not know, a
//! table id or key it cannot validate, or a schema that does not parse, naming what was
//! wrong, rather than read something else.

use std::io::Cursor;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde::{Deserialize, Serialize};

use super::metrics::WorkerMetrics;
use super::tasks::TaskScanExec;
use super::DistributedError;
use crate::archive::ArchiveStore;
use crate::model::schema::predicate::{CmpOp, Test, ValuePredicate};
use crate::model::schema::TableSchema;
use crate::model::{
    BucketId, BucketKey, BucketStrategy, EventTime, PartitionKey, SortKey, TableId,
};
use crate::model::{ClusteringKey, ScanBounds};
use crate::provider::filters::PushedFilters;
use crate::provider::surface::declared::Declared;
use crate::provider::surface::Surface;
use crate::provider::{PulpitumScanExec, QueryLimits, ScanSpec};
use crate::store::{HotStore, TableDefinition};
use crate::table::{BucketCounts, DurableTable, KeyBuckets, Route, RouteCacheConfig};

/// The wire format this build writes and reads: 2 is format 1's JSON, compressed with zstd.
pub const PLAN_FORMAT: u32 = 2;

/// The largest plan a worker decompresses. A plan lists every bucket of its scan with its
/// route (about 130 bytes each as JSON), so this admits scans of about two million buckets
/// while a malformed or hostile frame cannot make a worker allocate without bound.
pub const MAX_PLAN_BYTES: u64 = 256 << 20;

/// zstd's level for plans: a plan is sent once per task and repeats its table id, bucket
/// key prefixes and object key prefixes in every entry, so even a fast level shrinks it
/// several-fold (the stage's plan bytes go to every task of the stage).
const PLAN_ZSTD_LEVEL: i32 = 3;

/// `json` as it travels.
pub(crate) fn compress(json: &[u8]) -> Result<Vec<u8>, DistributedError> {
    zstd::bulk::compress(json, PLAN_ZSTD_LEVEL)
        .map_err(|e| DistributedError::Plan(format!("compressing a scan: {e}")))
}

/// The JSON a received plan holds, refusing one that is not a zstd frame or that would
/// decompress past [`MAX_PLAN_BYTES`].
pub(crate) fn decompress(buf: &[u8]) -> Result<Vec<u8>, DistributedError> {
    use std::io::Read;
    let refuse = |why: String| DistributedError::Plan(format!("not a Pulpitum scan plan: {why}"));
    let decoder = zstd::stream::read::Decoder::new(buf).map_err(|e| refuse(e.to_string()))?;
    let mut json = Vec::new();
    decoder
        .take(MAX_PLAN_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(|e| refuse(e.to_string()))?;
    if json.len() as u64 > MAX_PLAN_BYTES {
        return Err(DistributedError::Plan(format!(
            "a scan plan larger than {MAX_PLAN_BYTES} bytes decompressed"
        )));
    }
    Ok(json)
}

/// What a decoded scan reads through: this process's own hot store and archive.
#[derive(Clone)]
pub struct Tiers {
    /// The hot store.
    pub store: Arc<dyn HotStore>,
    /// The archive.
    pub archive: Arc<ArchiveStore>,
    /// Archived-route cache bounds of the tables a worker binds.
    pub route_cache: RouteCacheConfig,
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers")
            .field("route_cache", &self.route_cache)
            .finish_non_exhaustive()
    }
}

/// Encodes Pulpitum's scan nodes for a worker, and decodes them there against [`Tiers`].
#[derive(Debug, Clone)]
pub struct ScanCodec {
    tiers: Tiers,
    meter: Option<Arc<WorkerMetrics>>,
}

impl ScanCodec {
    /// A codec whose decoded scans read through `tiers`.
    pub fn new(tiers: Tiers) -> Self {
        Self { tiers, meter: None }
    }

    /// A worker's codec: the split scans it decodes count their runs on `meter`.
    pub(crate) fn metered(tiers: Tiers, meter: Arc<WorkerMetrics>) -> Self {
        Self {
            tiers,
            meter: Some(meter),
        }
    }
}

impl PhysicalExtensionCodec for ScanCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return Err(DistributedError::Plan(format!(
                "a Pulpitum scan has no inputs, this one came with {}",
                inputs.len()
            ))
            .into());
        }
        let plan = decode(buf, &self.tiers)?;
        match (&self.meter, plan.downcast_ref::<TaskScanExec>()) {
            (Some(meter), Some(split)) => Ok(Arc::new(split.metered(meter.clone()))),
            _ => Ok(plan),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DFResult<()> {
        buf.extend(encode(&node)?);
        Ok(())
    }
}

/// The bytes a worker decodes `node` from (a [`PulpitumScanExec`] or a [`TaskScanExec`]).
pub(crate) fn encode(node: &Arc<dyn ExecutionPlan>) -> DFResult<Vec<u8>> {
    let wire = if let Some(scan) = node.downcast_ref::<PulpitumScanExec>() {
        WirePlan {
            format: PLAN_FORMAT,
            split: false,
            scan: WireScan::of(scan.spec())?,
            tasks: vec![groups_to_wire(scan.groups())],
        }
    } else if let Some(tasks) = node.downcast_ref::<TaskScanExec>() {
        WirePlan {
            format: PLAN_FORMAT,
            split: true,
            scan: WireScan::of(tasks.spec())?,
            tasks: tasks
                .tasks()
                .iter()
                .map(|t| groups_to_wire(t.groups()))
                .collect(),
        }
    } else {
        return Err(DataFusionError::NotImplemented(format!(
            "{} cannot be sent to a Pulpitum worker",
            node.name()
        )));
    };
    let json = serde_json::to_vec(&wire)
        .map_err(|e| DistributedError::Plan(format!("encoding a scan: {e}")))?;
    Ok(compress(&json)?)
}

/// Decodes a scan node against `tiers`.
pub(crate) fn decode(
    buf: &[u8],
    tiers: &Tiers,
) -> Result<Arc<dyn ExecutionPlan>, DistributedError> {
    let json = decompress(buf)?;
    let wire: WirePlan = serde_json::from_slice(&json)
        .map_err(|e| DistributedError::Plan(format!("not a Pulpitum scan plan: {e}")))?;
    if wire.format != PLAN_FORMAT {
        return Err(DistributedError::Plan(format!(
            "scan plan format {} is not {PLAN_FORMAT}, the one this build reads \
             (run workers and coordinators of the same release)",
            wire.format
        )));
    }
    let spec = wire.scan.into_spec(tiers)?;
    let id = spec.table.definition().table_id.clone();
    let mut tasks = Vec::with_capacity(wire.tasks.len());
    for groups in wire.tasks {
        let groups = groups
            .into_iter()
            .map(|g| {
                g.into_iter()
                    .map(|k| k.into_model(&id, spec.table.definition().strategy))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut own = spec.clone();
        own.keys = groups.iter().flatten().cloned().collect();
        tasks.push(
            PulpitumScanExec::with_groups(own, groups)
                .map_err(|e| DistributedError::Plan(e.to_string()))?,
        );
    }
    match (wire.split, tasks.len()) {
        (_, 0) => Err(DistributedError::Plan("a scan plan with no task".into())),
        (false, 1) => Ok(Arc::new(tasks.pop().expect("one task"))),
        (false, n) => Err(DistributedError::Plan(format!(
            "an unsplit scan plan with {n} tasks"
        ))),
        (true, _) => Ok(Arc::new(TaskScanExec::new(spec, tasks)?)),
    }
}

fn groups_to_wire(groups: &[Vec<KeyBuckets>]) -> Vec<Vec<WireKey>> {
    groups
        .iter()
        .map(|g| g.iter().map(WireKey::of).collect())
        .collect()
}

#[derive(Serialize, Deserialize)]
struct WirePlan {
    format: u32,
    /// A [`TaskScanExec`] (the coordinator split the scan), not one [`PulpitumScanExec`].
    split: bool,
    scan: WireScan,
    /// Per task, per partition, the buckets it reads.
    tasks: Vec<Vec<Vec<WireKey>>>,
}

#[derive(Serialize, Deserialize)]
struct WireTable {
    id: String,
    strategy: String,
    writable_buckets: Option<u32>,
    record_schema_version: i32,
    surface: String,
    /// A declared table's schema (its JSON), at the version the query was planned with.
    declared: Option<String>,
    /// The declared surface carries each row's stored value last.
    stored_value: bool,
}

#[derive(Serialize, Deserialize)]
struct WireScan {
    table: WireTable,
    projection: Vec<usize>,
    partitions: Option<Vec<String>>,
    bounds: WireBounds,
    empty: bool,
    value_filters: Vec<WireValueFilter>,
    target_partitions: usize,
    counts: [usize; 4],
    deferred: bool,
    limit: Option<usize>,
    descending: bool,
    page_rows: usize,
    max_rows: Option<u64>,
    max_bytes: Option<u64>,
    max_duration_us: Option<u64>,
    local_only: bool,
    unordered: bool,
}

#[derive(Serialize, Deserialize)]
enum WireBound<T> {
    Unbounded,
    Included(T),
    Excluded(T),
}

#[derive(Serialize, Deserialize)]
struct WireBounds {
    time_lower: WireBound<i64>,
    time_upper: WireBound<i64>,
    sort_lower: WireBound<String>,
    sort_upper: WireBound<String>,
    after: Option<(i64, String)>,
    before: Option<(i64, String)>,
}

#[derive(Serialize, Deserialize)]
struct WireKey {
    partition: String,
    buckets: Vec<WireBucket>,
}

#[derive(Serialize, Deserialize)]
struct WireBucket {
    key: String,
    /// The archived route the listing saw; `None`: the hot store (each page reads the route
    /// again beside its rows).
    archived: Option<WireRoute>,
}

#[derive(Serialize, Deserialize)]
struct WireRoute {
    object_key: String,
    /// How long before encoding the route was read.
    age_us: u64,
}

#[derive(Serialize, Deserialize)]
struct WireValueFilter {
    field: u32,
    name: String,
    test: WireTest,
}

#[derive(Serialize, Deserialize)]
enum WireTest {
    Compare { op: String, literal: String },
    AnyOf { literals: String },
    IsNull,
    IsNotNull,
}

fn bound_to_wire<T, U>(b: &Bound<T>, f: impl Fn(&T) -> U) -> WireBound<U> {
    match b {
        Bound::Unbounded => WireBound::Unbounded,
        Bound::Included(v) => WireBound::Included(f(v)),
        Bound::Excluded(v) => WireBound::Excluded(f(v)),
    }
}

fn bound_of_wire<T, U>(
    b: WireBound<U>,
    f: impl Fn(U) -> Result<T, DistributedError>,
) -> Result<Bound<T>, DistributedError> {
    Ok(match b {
        WireBound::Unbounded => Bound::Unbounded,
        WireBound::Included(v) => Bound::Included(f(v)?),
        WireBound::Excluded(v) => Bound::Excluded(f(v)?),
    })
}

fn bad(what: &str, e: impl std::fmt::Display) -> DistributedError {
    DistributedError::Plan(format!("{what}: {e}"))
}

fn time(us: i64) -> Result<EventTime, DistributedError> {
    EventTime::from_micros(us).map_err(|e| bad("event time", e))
}

fn sort_key(hex_bytes: String) -> Result<SortKey, DistributedError> {
    let bytes = hex::decode(&hex_bytes).map_err(|e| bad("sort key", e))?;
    SortKey::new(bytes).map_err(|e| bad("sort key", e))
}

fn partition_key(hex_bytes: &str) -> Result<PartitionKey, DistributedError> {
    let bytes = hex::decode(hex_bytes).map_err(|e| bad("partition key", e))?;
    PartitionKey::new(bytes).map_err(|e| bad("partition key", e))
}

fn clustering_to_wire(k: &ClusteringKey) -> (i64, String) {
    (k.event_time.as_micros(), hex::encode(k.sort_key.as_bytes()))
}

fn clustering_of_wire(k: (i64, String)) -> Result<ClusteringKey, DistributedError> {
    Ok(ClusteringKey {
        event_time: time(k.0)?,
        sort_key: sort_key(k.1)?,
    })
}

impl WireBounds {
    fn of(b: &ScanBounds) -> Self {
        Self {
            time_lower: bound_to_wire(&b.time_lower, |t| t.as_micros()),
            time_upper: bound_to_wire(&b.time_upper, |t| t.as_micros()),
            sort_lower: bound_to_wire(&b.sort_lower, |k| hex::encode(k.as_bytes())),
            sort_upper: bound_to_wire(&b.sort_upper, |k| hex::encode(k.as_bytes())),
            after: b.after.as_ref().map(clustering_to_wire),
            before: b.before.as_ref().map(clustering_to_wire),
        }
    }

    fn into_model(self) -> Result<ScanBounds, DistributedError> {
        Ok(ScanBounds {
            time_lower: bound_of_wire(self.time_lower, time)?,
            time_upper: bound_of_wire(self.time_upper, time)?,
            sort_lower: bound_of_wire(self.sort_lower, sort_key)?,
            sort_upper: bound_of_wire(self.sort_upper, sort_key)?,
            after: self.after.map(clustering_of_wire).transpose()?,
            before: self.before.map(clustering_of_wire).transpose()?,
        })
    }
}

impl WireKey {
    fn of(k: &KeyBuckets) -> Self {
        Self {
            partition: hex::encode(k.partition_key.as_bytes()),
            buckets: k
                .buckets
                .iter()
                .map(|(id, route)| WireBucket {
                    key: id.bucket_key.to_string(),
                    archived: match route {
                        Route::Hot => None,
                        Route::Archived {
                            object_key,
                            read_at,
                        } => Some(WireRoute {
                            object_key: object_key.clone(),
                            age_us: read_at.elapsed().as_micros().min(u64::MAX as u128) as u64,
                        }),
                    },
                })
                .collect(),
        }
    }

    fn into_model(
        self,
        table: &TableId,
        strategy: BucketStrategy,
    ) -> Result<KeyBuckets, DistributedError> {
        let partition = partition_key(&self.partition)?;
        let now = Instant::now();
        let buckets = self
            .buckets
            .into_iter()
            .map(|b| {
                let bucket_key =
                    BucketKey::parse(strategy, &b.key).map_err(|e| bad("bucket key", e))?;
                let route = match b.archived {
                    None => Route::Hot,
                    Some(r) => Route::Archived {
                        object_key: r.object_key,
                        // As old here as it was there (never younger): a route older than
                        // this process has run is dated to its start.
                        read_at: now
                            .checked_sub(Duration::from_micros(r.age_us))
                            .unwrap_or(now),
                    },
                };
                Ok((
                    BucketId {
                        table_id: table.clone(),
                        partition_key: partition.clone(),
                        bucket_key,
                    },
                    route,
                ))
            })
            .collect::<Result<Vec<_>, DistributedError>>()?;
        Ok(KeyBuckets {
            partition_key: partition,
            buckets,
        })
    }
}

fn op_name(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "eq",
        CmpOp::NotEq => "ne",
        CmpOp::Lt => "lt",
        CmpOp::LtEq => "le",
        CmpOp::Gt => "gt",
        CmpOp::GtEq => "ge",
    }
}

fn op_of(name: &str) -> Result<CmpOp, DistributedError> {
    Ok(match name {
        "eq" => CmpOp::Eq,
        "ne" => CmpOp::NotEq,
        "lt" => CmpOp::Lt,
        "le" => CmpOp::LtEq,
        "gt" => CmpOp::Gt,
        "ge" => CmpOp::GtEq,
        other => return Err(bad("comparison", format!("unknown operator {other:?}"))),
    })
}

/// A literal array as one Arrow IPC stream (every Arrow type round-trips exactly).
fn array_to_wire(a: &ArrayRef) -> Result<String, DistributedError> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "v",
        a.data_type().clone(),
        true,
    )]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![a.clone()]).map_err(|e| bad("literal", e))?;
    let mut out = Vec::new();
    {
        let mut w = StreamWriter::try_new(&mut out, &schema).map_err(|e| bad("literal", e))?;
        w.write(&batch).map_err(|e| bad("literal", e))?;
        w.finish().map_err(|e| bad("literal", e))?;
    }
    Ok(hex::encode(out))
}

fn array_of_wire(s: &str) -> Result<ArrayRef, DistributedError> {
    let bytes = hex::decode(s).map_err(|e| bad("literal", e))?;
    let mut r = StreamReader::try_new(Cursor::new(bytes), None).map_err(|e| bad("literal", e))?;
    let batch = r
        .next()
        .ok_or_else(|| bad("literal", "no batch"))?
        .map_err(|e| bad("literal", e))?;
    if batch.num_columns() != 1 {
        return Err(bad("literal", "not one column"));
    }
    Ok(batch.column(0).clone())
}

impl WireScan {
    fn of(s: &ScanSpec) -> Result<Self, DistributedError> {
        let def = s.table.definition();
        let (declared, stored_value) = match &s.surface {
            Surface::Declared(d) => (Some(d.schema.to_json()), d.stored_value()),
            _ => (None, false),
        };
        let value_filters = s
            .value_filters
            .iter()
            .map(|p| {
                Ok(WireValueFilter {
                    field: p.field,
                    name: p.name.clone(),
                    test: match &p.test {
                        Test::Compare(op, lit) => WireTest::Compare {
                            op: op_name(*op).into(),
                            literal: array_to_wire(lit)?,
                        },
                        Test::AnyOf(list) => WireTest::AnyOf {
                            literals: array_to_wire(list)?,
                        },
                        Test::IsNull => WireTest::IsNull,
                        Test::IsNotNull => WireTest::IsNotNull,
                    },
                })
            })
            .collect::<Result<Vec<_>, DistributedError>>()?;
        let c = s.counts;
        Ok(Self {
            table: WireTable {
                id: def.table_id.to_string(),
                strategy: def.strategy.as_str().into(),
                writable_buckets: def.writable_buckets,
                record_schema_version: def.record_schema_version,
                surface: def.surface.clone(),
                declared,
                stored_value,
            },
            projection: s.projection.clone(),
            partitions: s
                .pushed
                .partitions
                .as_ref()
                .map(|p| p.iter().map(|k| hex::encode(k.as_bytes())).collect()),
            bounds: WireBounds::of(&s.pushed.bounds),
            empty: s.pushed.empty,
            value_filters,
            target_partitions: s.target_partitions,
            counts: [c.hot, c.archiving, c.archived, c.pruned],
            deferred: s.deferred,
            limit: s.limit,
            descending: s.descending,
            page_rows: s.page_rows,
            max_rows: s.limits.max_rows,
            max_bytes: s.limits.max_bytes,
            max_duration_us: s
                .limits
                .max_duration
                .map(|d| d.as_micros().min(u64::MAX as u128) as u64),
            local_only: s.local_only,
            unordered: s.unordered,
        })
    }

    fn into_spec(self, tiers: &Tiers) -> Result<ScanSpec, DistributedError> {
        let t = self.table;
        let table_id = TableId::new(t.id).map_err(|e| bad("table id", e))?;
        let strategy: BucketStrategy = t.strategy.parse().map_err(|e| bad("strategy", e))?;
        let surface = match &t.declared {
            Some(json) => {
                let schema = TableSchema::from_json(json).map_err(|e| bad("table schema", e))?;
                Surface::Declared(Arc::new(Declared::new(schema, t.stored_value)))
            }
            None => Surface::parse(&t.surface).map_err(|e| bad("surface", e))?,
        };
        let def = TableDefinition {
            table_id,
            strategy,
            writable_buckets: t.writable_buckets,
            record_schema_version: t.record_schema_version,
            surface: t.surface,
        };
        let width = surface.schema().fields().len();
        if let Some(bad_index) = self.projection.iter().find(|&&i| i >= width) {
            return Err(bad(
                "projection",
                format!("column {bad_index} of a table of {width} columns"),
            ));
        }
        let value_filters = self
            .value_filters
            .into_iter()
            .map(|f| {
                let Surface::Declared(d) = &surface else {
                    return Err(bad(
                        "value filter",
                        "only declared tables have value columns",
                    ));
                };
                let column = d
                    .schema
                    .columns
                    .iter()
                    .find(|c| c.id == f.field && c.name == f.name)
                    .ok_or_else(|| {
                        bad(
                            "value filter",
                            format!("no column {} with field id {}", f.name, f.field),
                        )
                    })?;
                let test = match f.test {
                    WireTest::Compare { op, literal } => {
                        Test::Compare(op_of(&op)?, array_of_wire(&literal)?)
                    }
                    WireTest::AnyOf { literals } => Test::AnyOf(array_of_wire(&literals)?),
                    WireTest::IsNull => Test::IsNull,
                    WireTest::IsNotNull => Test::IsNotNull,
                };
                Ok(ValuePredicate {
                    field: f.field,
                    name: f.name,
                    ty: column.ty,
                    test,
                })
            })
            .collect::<Result<Vec<_>, DistributedError>>()?;
        let partitions = self
            .partitions
            .map(|p| p.iter().map(|k| partition_key(k)).collect())
            .transpose()?;
        let [hot, archiving, archived, pruned] = self.counts;
        Ok(ScanSpec {
            table: DurableTable::with_cache(
                tiers.store.clone(),
                tiers.archive.clone(),
                def,
                tiers.route_cache,
            ),
            surface,
            projection: self.projection,
            pushed: PushedFilters {
                partitions,
                bounds: self.bounds.into_model()?,
                empty: self.empty,
            },
            value_filters: value_filters.into(),
            keys: Vec::new(),
            target_partitions: self.target_partitions.max(1),
            counts: BucketCounts {
                hot,
                archiving,
                archived,
                pruned,
            },
            deferred: self.deferred,
            limit: self.limit,
            descending: self.descending,
            page_rows: self.page_rows.max(1),
            limits: QueryLimits {
                max_rows: self.max_rows,
                max_bytes: self.max_bytes,
                max_duration: self.max_duration_us.map(Duration::from_micros),
            },
            local_only: self.local_only,
            unordered: self.unordered,
        })
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
