//! Erasure with proof: a `DELETE` whose rows must be shown gone from every tier and every
//! stored object, and stay gone after a hot-store restore.
//!
//! An erasure is requested with one `DELETE` statement ([`request`]). Before each attempt of
//! the statement applies its changes, the keys of the rows it is about to delete are written
//! to the erasure log in the archive bucket ([`crate::archive::erasure`]); then the rows are
//! deleted as any `DELETE` deletes them (hot rows at once, archived rows masked and later
//! rewritten by compaction); then the objects that still hold an erased row are recorded.
//! Compaction rewrites those objects' buckets without the rows and retires the objects;
//! garbage collection deletes a retired object that holds erased rows as soon as no reader
//! can still be reading it, without waiting for the backup retention, and logs when.
//!
//! [`report`] answers "is it gone" from what is stored, not from what was recorded: no
//! erased row is readable; no hot copy of an archived bucket still holds one; every object
//! now in the archive that holds one of the erasure's buckets is read, and none holds an
//! erased row; every object the log names is checked absent. Every archiver start runs
//! [`reapply_all`]: a hot-store backup restored from before an erasure brings its rows (or
//! its masks' absence) back, and the log, which the restore did not touch, deletes them
//! again.
//!
//! Layering: [`request`] runs a statement on a DataFusion session (the SQL surface);
//! everything else works on the table, store and archive layers, so the archiver uses it
//! without SQL.

mod proof;
mod reapply;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use chrono::Utc;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{DmlStatement, LogicalPlan, WriteOp};
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;

pub use crate::archive::erasure::{ErasedKey, ErasureEntry, ErasureId};
use crate::archive::{ArchiveError, ArchiveScan, ArchiveScanMetrics, ArchiveStore};
use crate::model::{BucketId, BucketStrategy, ScanBounds, TableId};
use crate::provider::PulpitumTable;
use crate::store::{RowChange, StoreError};
use crate::table::{DurableTable, TableError};
pub use proof::{report, ErasureReport, ObjectState};
pub use reapply::{reapply_all, ReapplyReport};

/// Every way an erasure can fail.
#[derive(Debug, thiserror::Error)]
pub enum ErasureError {
    /// The statement is not one `DELETE` of a Pulpitum table.
    #[error("an erasure is one DELETE statement on a Pulpitum table: {0}")]
    NotADelete(String),
    /// Text that is not an erasure id.
    #[error("{0:?} is not an erasure id (e-YYYYMMDDTHHMMSSZ-xxxxxxxx, as `pulpitum erasure list` shows)")]
    BadId(String),
    /// The log names a table the hot store does not have.
    #[error("erasure {id} is of table {table}, which is not registered in the hot store")]
    UnknownTable {
        /// The erasure.
        id: ErasureId,
        /// Its table.
        table: TableId,
    },
    /// A route to a deleted erased object that cannot be repaired, or a window busy with a
    /// compaction (retried at the next pass).
    #[error("cannot repair a route: {0}")]
    Repair(String),
    /// Rows read for the erasure are not well-formed records.
    #[error("erasure read: {0}")]
    Decode(#[from] crate::model::ModelError),
    /// Reading or writing the log or the archive failed.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The table's reads or changes failed.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The hot store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Planning or running the statement failed.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
}

/// Set on a session's configuration while it runs an erasure's `DELETE`: the change node
/// logs the keys of each attempt's rows before applying them ([`Self::before_apply`]).
#[derive(Debug)]
pub struct ErasureContext {
    id: ErasureId,
    table_id: TableId,
    attempts: std::sync::atomic::AtomicU32,
    keys: Mutex<BTreeSet<ErasedKey>>,
}

impl ErasureContext {
    fn new(id: ErasureId, table_id: TableId) -> Self {
        Self {
            id,
            table_id,
            attempts: std::sync::atomic::AtomicU32::new(0),
            keys: Mutex::new(BTreeSet::new()),
        }
    }

    /// Logs the keys `changes` is about to delete from `table`, create-once, before they are
    /// applied, so the log never misses a row the store deleted. Only a request that
    /// completes (`applied.json`) is re-applied: one that failed was reported to its
    /// operator with no id, and must be run again.
    pub async fn before_apply(
        &self,
        table: &DurableTable,
        changes: &[RowChange],
    ) -> Result<(), ErasureError> {
        if table.definition().table_id != self.table_id {
            return Err(ErasureError::NotADelete(format!(
                "the statement changes {}, not {}",
                table.definition().table_id,
                self.table_id
            )));
        }
        if changes.iter().any(|c| c.new_value.is_some()) {
            return Err(ErasureError::NotADelete(
                "an UPDATE cannot be an erasure".into(),
            ));
        }
        let keys: Vec<ErasedKey> = changes
            .iter()
            .map(|c| {
                ErasedKey::of(&crate::model::Record {
                    partition_key: c.partition_key.clone(),
                    event_time: c.event_time,
                    sort_key: c.sort_key.clone(),
                    value: c.old_value.clone(),
                })
            })
            .collect();
        let attempt = self
            .attempts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        table
            .archive()
            .log_erased_keys(&self.id, attempt, &keys)
            .await?;
        self.keys.lock().expect("keys lock").extend(keys);
        Ok(())
    }

    fn keys(&self) -> Vec<ErasedKey> {
        self.keys
            .lock()
            .expect("keys lock")
            .iter()
            .cloned()
            .collect()
    }
}

/// What [`request`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureReceipt {
    /// The erasure's id (for `pulpitum erasure show`).
    pub id: ErasureId,
    /// The table.
    pub table_id: TableId,
    /// Rows deleted (the statement's count).
    pub rows: u64,
    /// Stored objects that still held an erased row once the statement returned (archived
    /// buckets wait for their rewrite).
    pub objects: usize,
}

/// Runs `sql`, one `DELETE` of a Pulpitum table, as an erasure: logged first, applied,
/// then the objects still holding the rows recorded. `reference` (a ticket number) is kept
/// in the log; it must not itself be personal data.
pub async fn request(
    ctx: &SessionContext,
    sql: &str,
    reference: Option<&str>,
) -> Result<ErasureReceipt, ErasureError> {
    let plan = ctx.state().create_logical_plan(sql).await?;
    let LogicalPlan::Dml(DmlStatement {
        table_name,
        op: WriteOp::Delete,
        ..
    }) = &plan
    else {
        return Err(ErasureError::NotADelete(format!(
            "this statement is planned as {}",
            plan.display()
        )));
    };
    let provider = ctx.table_provider(table_name.clone()).await?;
    let table = provider
        .downcast_ref::<PulpitumTable>()
        .ok_or_else(|| ErasureError::NotADelete(format!("{table_name} is not a Pulpitum table")))?
        .table()
        .clone();
    let def = table.definition().clone();
    let now = Utc::now();
    let id = ErasureId::generate(now);
    table
        .archive()
        .log_erasure_request(&id, &def.table_id, reference, now)
        .await?;
    let erasure = Arc::new(ErasureContext::new(id.clone(), def.table_id.clone()));
    let mut state = ctx.state();
    state.config_mut().set_extension(erasure.clone());
    let run = SessionContext::new_with_state(state);
    let batches = run.execute_logical_plan(plan).await?.collect().await?;
    let rows = batches
        .iter()
        .filter_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
        })
        .map(|a| a.iter().flatten().sum::<u64>())
        .sum();
    let keys = erasure.keys();
    let objects = holding_objects(table.archive(), &def.table_id, def.strategy, &keys).await?;
    table
        .archive()
        .log_erased_objects(&id, &objects, Utc::now())
        .await?;
    // Last: only a request that got this far is re-applied and proven.
    table
        .archive()
        .log_erasure_applied(&id, rows, Utc::now())
        .await?;
    Ok(ErasureReceipt {
        id,
        table_id: def.table_id,
        rows,
        objects: objects.len(),
    })
}

/// The erased keys grouped by bucket, each group sorted.
pub(crate) fn by_bucket(
    table_id: &TableId,
    strategy: BucketStrategy,
    keys: &[ErasedKey],
) -> BTreeMap<(Vec<u8>, String), (BucketId, Vec<ErasedKey>)> {
    let mut groups: BTreeMap<(Vec<u8>, String), (BucketId, Vec<ErasedKey>)> = BTreeMap::new();
    for k in keys {
        let bucket_key = strategy.bucket_of(k.event_time);
        groups
            .entry((k.partition_key.as_bytes().to_vec(), bucket_key.to_string()))
            .or_insert_with(|| {
                (
                    BucketId {
                        table_id: table_id.clone(),
                        partition_key: k.partition_key.clone(),
                        bucket_key,
                    },
                    Vec::new(),
                )
            })
            .1
            .push(k.clone());
    }
    groups
}

/// The time bounds that cover `keys` (non-empty, sorted).
pub(crate) fn covering(keys: &[ErasedKey]) -> ScanBounds {
    use std::ops::Bound;
    let first = keys.iter().map(|k| k.event_time).min().expect("non-empty");
    let last = keys.iter().map(|k| k.event_time).max().expect("non-empty");
    ScanBounds {
        time_lower: Bound::Included(first),
        time_upper: Bound::Included(last),
        ..ScanBounds::all()
    }
}

/// The rows of `keys` (one bucket's) that the table's reads still return (hot pages, or
/// archives with their masks applied): what a query would see.
pub(crate) async fn readable_rows(
    table: &DurableTable,
    bucket: &BucketId,
    keys: &[ErasedKey],
) -> Result<Vec<crate::model::Record>, ErasureError> {
    use futures::StreamExt;
    let wanted: HashMap<(i64, &[u8]), &ErasedKey> = keys
        .iter()
        .map(|k| ((k.event_time.as_micros(), k.sort_key.as_bytes()), k))
        .collect();
    let mut chunks = table.scan_bucket(
        bucket.clone(),
        None,
        crate::table::BucketScan {
            bounds: covering(keys),
            descending: false,
            include_value: true,
            include_keys: true,
            page_rows: 4096,
            limit: None,
            archive_metrics: None,
            value: Default::default(),
        },
    );
    let mut out = Vec::new();
    while let Some(chunk) = chunks.next().await {
        for r in crate::model::batch_to_records(&chunk?.batch)? {
            // The erased row itself: the same key and the erased value, not a row written
            // under its key afterwards.
            let erased = wanted
                .get(&(r.event_time.as_micros(), r.sort_key.as_bytes()))
                .is_some_and(|k| k.matches(&r));
            if erased {
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// How many of `keys` (one bucket's) the stored object `route` holds, read from its bytes
/// (verified as every read is), without masks: what is stored, not what readers see.
pub(crate) async fn erased_rows_in(
    archive: &ArchiveStore,
    route: &crate::archive::RouteManifest,
    bucket: &BucketId,
    keys: &[ErasedKey],
) -> Result<usize, ArchiveError> {
    let wanted: HashMap<(i64, &[u8]), &ErasedKey> = keys
        .iter()
        .map(|k| ((k.event_time.as_micros(), k.sort_key.as_bytes()), k))
        .collect();
    let req = ArchiveScan {
        bounds: covering(keys),
        descending: false,
        include_value: true,
        include_keys: true,
        batch_rows: 8192,
        value: Default::default(),
    };
    let mut batches = archive
        .scan_route(route, bucket, &req, Arc::new(ArchiveScanMetrics::default()))
        .await?;
    let mut found = 0;
    while let Some(batch) = batches.try_next().await? {
        for r in crate::model::batch_to_records(&batch).map_err(|e| ArchiveError::Decode {
            key: bucket.to_string(),
            reason: e.to_string(),
        })? {
            if wanted
                .get(&(r.event_time.as_micros(), r.sort_key.as_bytes()))
                .is_some_and(|k| k.matches(&r))
            {
                found += 1;
            }
        }
    }
    Ok(found)
}

/// The manifest keys of every stored object that holds one of `keys`' rows.
pub(crate) async fn holding_objects(
    archive: &ArchiveStore,
    table_id: &TableId,
    strategy: BucketStrategy,
    keys: &[ErasedKey],
) -> Result<Vec<String>, ArchiveError> {
    let mut out = BTreeSet::new();
    for (_, (bucket, keys)) in by_bucket(table_id, strategy, keys) {
        for (key, route) in archive.objects_of_bucket(&bucket).await? {
            if !out.contains(&key) && erased_rows_in(archive, &route, &bucket, &keys).await? > 0 {
                out.insert(key);
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// The objects of every erasure in the log that are not yet known deleted, with the
/// erasure that named them: garbage collection deletes these once no reader can need them
/// (the readers' bound), not after the backup retention.
pub async fn pending_objects(
    archive: &ArchiveStore,
) -> Result<HashMap<String, ErasureId>, ArchiveError> {
    let mut out = HashMap::new();
    for id in archive.erasure_ids().await? {
        let entry = archive.read_erasure_objects(&id).await?;
        if !entry.applied {
            continue;
        }
        for object in entry.objects.unwrap_or_default() {
            if !entry.deleted.contains_key(&object) {
                out.entry(object).or_insert_with(|| id.clone());
            }
        }
    }
    Ok(out)
}
