//! Re-applying the erasure log at every archiver start.
//!
//! The log is in the archive bucket, the rows and masks in the hot store. A hot-store backup
//! restored from before an erasure brings back what the erasure deleted there: hot rows, or
//! the absence of the masks over archived rows. It can also route buckets to objects the
//! erasure had garbage collection delete early (objects holding erased rows are not kept
//! for the backup retention). Re-applying, for each erasure in the log:
//!
//! 1. Routes to deleted objects are repaired first: a bucket still routed to an object the
//!    log names and that is gone is switched, under a window claim as compaction switches,
//!    to the newest stored object that holds the bucket and none of its erased rows (the
//!    segment compaction wrote when it rewrote the bucket).
//! 2. Every erased key still readable is deleted again through the table, as the request's
//!    `DELETE` did (hot rows deleted, archived rows masked; compaction then rewrites).
//!
//! An erasure whose request failed (no `applied.json`) is left alone: its operator was told,
//! and given no id.
//!
//! Each step is idempotent, so every start runs it whole; an erasure that fails (a bucket
//! being archived refuses changes for a moment) is reported and retried at the next pass.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{by_bucket, erased_rows_in, readable_rows, ErasedKey, ErasureEntry};
use super::{ErasureError, ErasureId};
use crate::archive::{ArchiveStore, RouteManifest};
use crate::model::{BucketId, TableId};
use crate::store::{
    BucketFilter, BucketState, CompactionSource, HotStore, RouteSwitch, RowChange, StoreError,
};
use crate::table::{DurableTable, TableError};

/// Times one erasure's deletes are read and applied before the pass gives up on it.
const ATTEMPTS: u32 = 5;

/// The lease of a window claim taken to repair routes.
const REPAIR_LEASE: Duration = Duration::from_secs(60);

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapplyReport {
    /// Erasures in the log.
    pub erasures: usize,
    /// Erased rows found readable and deleted again.
    pub rows_deleted: u64,
    /// Buckets routed to a deleted erased object, switched to their rewrite.
    pub routes_repaired: u64,
    /// Erasures of tables no longer registered (nothing to re-apply).
    pub skipped: usize,
    /// Erasures whose request failed before it completed: not re-applied.
    pub incomplete: usize,
    /// Erasures that failed, with why (retried at the next pass).
    pub failed: Vec<(ErasureId, String)>,
}

/// One pass over the whole log (see the module comment).
pub async fn reapply_all(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
) -> Result<ReapplyReport, ErasureError> {
    let mut report = ReapplyReport::default();
    let ids = archive.erasure_ids().await?;
    report.erasures = ids.len();
    if ids.is_empty() {
        return Ok(report);
    }
    let mut entries = Vec::new();
    for id in &ids {
        entries.push(archive.read_erasure(id).await?);
    }
    // Erased keys per bucket over every erasure: a repaired route must hold none of them.
    let mut erased: HashMap<BucketId, Vec<ErasedKey>> = HashMap::new();
    let mut tables: BTreeMap<TableId, Option<DurableTable>> = BTreeMap::new();
    // Only completed requests count: a failed one's keys name rows that were never erased.
    for e in entries.iter().filter(|e| e.applied) {
        if !tables.contains_key(&e.table_id) {
            let def = store.table(&e.table_id).await?;
            let table = def.map(|d| DurableTable::new(store.clone(), archive.clone(), d));
            tables.insert(e.table_id.clone(), table);
        }
        if let Some(Some(t)) = tables.get(&e.table_id) {
            let def = t.definition();
            for (_, (bucket, keys)) in by_bucket(&def.table_id, def.strategy, &e.keys) {
                erased.entry(bucket).or_default().extend(keys);
            }
        }
    }
    for (table_id, table) in &tables {
        let Some(table) = table else { continue };
        let logged: HashSet<&str> = entries
            .iter()
            .filter(|e| e.applied && &e.table_id == table_id)
            .flat_map(|e| e.objects.iter().flatten().map(String::as_str))
            .collect();
        match repair_routes(table, &logged, &erased).await {
            Ok(n) => report.routes_repaired += n,
            Err(e) => {
                warn!(table = %table_id, error = %e, "repairing routes to erased objects failed");
                for entry in entries.iter().filter(|e| &e.table_id == table_id) {
                    report.failed.push((entry.id.clone(), e.to_string()));
                }
            }
        }
    }
    for entry in entries {
        let Some(Some(table)) = tables.get(&entry.table_id) else {
            report.skipped += 1;
            continue;
        };
        if report.failed.iter().any(|(id, _)| *id == entry.id) {
            continue;
        }
        // A request that failed (no `applied.json`): its operator was told so, with no id.
        if !entry.applied {
            report.incomplete += 1;
            continue;
        }
        match reapply_one(table, &entry).await {
            Ok(rows) => {
                report.rows_deleted += rows;
                if rows > 0 {
                    info!(erasure = %entry.id, rows, "erased rows found readable were deleted again");
                }
            }
            Err(e) => {
                warn!(erasure = %entry.id, error = %e, "re-applying an erasure failed; retried at the next pass");
                report.failed.push((entry.id.clone(), e.to_string()));
            }
        }
    }
    Ok(report)
}

/// Deletes the erasure's rows still readable; returns how many.
async fn reapply_one(table: &DurableTable, entry: &ErasureEntry) -> Result<u64, ErasureError> {
    let def = table.definition();
    let groups = by_bucket(&def.table_id, def.strategy, &entry.keys);
    let mut attempt = 0;
    let deleted = loop {
        attempt += 1;
        let read_at = table.store_now().await?;
        let mut changes = Vec::new();
        for (bucket, keys) in groups.values() {
            changes.extend(readable(table, bucket, keys).await?);
        }
        if changes.is_empty() {
            break 0;
        }
        match table.apply_changes(read_at, &changes).await {
            Ok(done) => break done.total(),
            Err(e) if attempt < ATTEMPTS && retry(&e) => {
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    Ok(deleted)
}

fn retry(e: &TableError) -> bool {
    matches!(
        e,
        TableError::Store(StoreError::ChangeConflict { .. } | StoreError::BeingArchived { .. })
    ) || e.is_retryable()
}

/// The rows of `keys` (one bucket's) that the table's reads still return, as deletes.
async fn readable(
    table: &DurableTable,
    bucket: &BucketId,
    keys: &[ErasedKey],
) -> Result<Vec<RowChange>, ErasureError> {
    Ok(readable_rows(table, bucket, keys)
        .await?
        .into_iter()
        .map(|r| RowChange {
            partition_key: r.partition_key,
            event_time: r.event_time,
            sort_key: r.sort_key,
            old_value: r.value,
            new_value: None,
        })
        .collect())
}

/// Buckets of `table` routed to an object the log names and that is no longer stored are
/// switched to the newest stored object holding the bucket and none of its erased rows.
async fn repair_routes(
    table: &DurableTable,
    logged: &HashSet<&str>,
    erased: &HashMap<BucketId, Vec<ErasedKey>>,
) -> Result<u64, ErasureError> {
    let store = table.store();
    let archive = table.archive();
    // Only the logged keys are asked about (an index probe each), not every route.
    let asked: Vec<String> = logged.iter().map(|k| k.to_string()).collect();
    let routed: HashSet<String> = store.routed_among(&asked).await?.into_iter().collect();
    let mut gone = HashSet::new();
    for key in logged {
        if routed.contains(*key) && archive.object_dir_is_empty(key).await? {
            gone.insert(key.to_string());
        }
    }
    if gone.is_empty() {
        return Ok(0);
    }
    // Rare (a restore older than an erasure): a full listing of the table is acceptable.
    let mut by_window: BTreeMap<String, (Vec<RouteSwitch>, Vec<CompactionSource>)> =
        BTreeMap::new();
    for meta in table.list_buckets(&BucketFilter::default()).await? {
        let BucketState::Archived { object_key, .. } = &meta.state else {
            continue;
        };
        if !gone.contains(object_key) {
            continue;
        }
        let keys = erased.get(&meta.id).map(Vec::as_slice).unwrap_or(&[]);
        let window = by_window
            .entry(meta.id.bucket_key.window().to_string())
            .or_default();
        match replacement(archive, &meta.id, keys).await? {
            Replacement::Found(to) => window.0.push(RouteSwitch {
                bucket: meta.id.clone(),
                from_object_key: object_key.clone(),
                to_object_key: to,
                // The replacement's manifest is not read here: recorded as not known.
                to_buckets: None,
            }),
            // No stored object holds the bucket at all: the rewrite after the erasure found
            // it empty (every row of it erased) and removed it, which is what is done again.
            Replacement::NoneStored if !keys.is_empty() => {
                let (start, end) = meta.id.bucket_key.bounds();
                window.1.push(CompactionSource {
                    bucket: meta.id.clone(),
                    bucket_start: start,
                    bucket_end: end,
                    object_key: object_key.clone(),
                    masked: true,
                });
            }
            // Objects hold the bucket, but each with erased rows, or nothing holds a bucket
            // no erasure touched: never guessed at, never dropped.
            Replacement::NoneStored | Replacement::OnlyWithErased => {
                return Err(ErasureError::Repair(format!(
                    "{} is routed to {object_key}, an object an erasure had deleted, and no stored object holds its rows; restore the archive's objects or a newer hot-store backup",
                    meta.id
                )))
            }
        }
    }
    let mut repaired = 0;
    for (window_key, (switches, emptied)) in by_window {
        let window = switches
            .first()
            .map(|s| &s.bucket)
            .or(emptied.first().map(|s| &s.bucket))
            .expect("a window listed has a bucket")
            .bucket_key
            .window();
        let (start, end) = window.bounds();
        let Some(claim) = store
            .claim_compaction(
                &table.definition().table_id,
                &window_key,
                start,
                end,
                REPAIR_LEASE,
            )
            .await?
        else {
            return Err(ErasureError::Repair(format!(
                "window {window_key} is being compacted; its routes are repaired at the next pass"
            )));
        };
        let mut done = Ok(0);
        if !switches.is_empty() {
            done = store.switch_routes(&claim, &switches).await;
        }
        if done.is_ok() && !emptied.is_empty() {
            done = store
                .drop_empty_buckets(&claim, &emptied)
                .await
                .map(|n| n + done.unwrap_or(0));
        }
        store.release_compaction(&claim).await?;
        repaired += done?;
        info!(window = %window_key, switched = switches.len(), emptied = emptied.len(), "routes to deleted erased objects repaired");
    }
    Ok(repaired)
}

/// Where a bucket routed to a deleted erased object can go.
enum Replacement {
    /// The newest stored object holding it without erased rows.
    Found(String),
    /// No stored object holds it.
    NoneStored,
    /// Stored objects hold it, each with erased rows.
    OnlyWithErased,
}

/// The newest stored object holding `bucket` and none of `keys`: a segment before a
/// per-bucket archive (compaction moves buckets into segments, never back), then the
/// highest generation.
async fn replacement(
    archive: &ArchiveStore,
    bucket: &BucketId,
    keys: &[ErasedKey],
) -> Result<Replacement, ErasureError> {
    let mut candidates: Vec<(bool, i64, String, RouteManifest)> = archive
        .objects_of_bucket(bucket)
        .await?
        .into_iter()
        .map(|(key, m)| {
            let segment = matches!(m, RouteManifest::Segment(_));
            (segment, generation_of(&key), key, m)
        })
        .collect();
    if candidates.is_empty() {
        return Ok(Replacement::NoneStored);
    }
    candidates.sort_by_key(|c| std::cmp::Reverse((c.0, c.1)));
    for (_, _, key, m) in candidates {
        if keys.is_empty() || erased_rows_in(archive, &m, bucket, keys).await? == 0 {
            return Ok(Replacement::Found(key));
        }
    }
    Ok(Replacement::OnlyWithErased)
}

/// The generation in a manifest key (`.../g7/manifest.json`, `.../s00001-g7/manifest.json`).
fn generation_of(key: &str) -> i64 {
    key.rsplit('/')
        .nth(1)
        .and_then(|dir| dir.rsplit_once('g'))
        .and_then(|(_, g)| g.parse().ok())
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::generation_of;

    #[test]
    fn generations_are_read_from_both_kinds_of_key() {
        assert_eq!(
            generation_of("p/v4/t/01/day:2024-01-01/g3/manifest.json"),
            3
        );
        assert_eq!(
            generation_of("p/v4/t/segments/month:2024-01/s00002-g12/manifest.json"),
            12
        );
        assert_eq!(generation_of("manifest.json"), -1);
    }
}
