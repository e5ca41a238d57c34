//! Orphan garbage collection for the archive prefix.
//!
//! An object is deleted only when no published route references its generation directory,
//! no in-flight claim holds that generation, and it is older than the safety delay. The
//! reads come in one order, each after the last: the object listing, then the in-flight
//! claims, then the published routes. A generation only ever moves forward from Archiving to
//! Archived (publication keeps its key for good), so a generation claimed when the claims
//! are read is either still claimed then or published by the time the routes are read:
//! reading the routes first would let a publication that lands between the two reads slip
//! through both. Objects written after the listing are not candidates at all, ages are
//! measured from before the listing, and anything without a modification time is kept
//! (leak rather than delete when unsure). The delay itself is a second, independent guard:
//! [`super::ArchiverConfig::min_gc_delay`] keeps it above the longest time a generation can
//! wait for its publication.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use tracing::info;

use crate::archive::ArchiveStore;
use crate::store::{BucketFilter, BucketState, HotStore};

use super::{ArchiverError, ArchiverMetrics};

/// What one GC pass saw and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Objects listed under the prefix.
    pub listed: usize,
    /// Objects kept because a route or an in-flight claim references them.
    pub referenced: usize,
    /// Unreferenced objects kept because they are younger than the delay (or undated).
    pub young: usize,
    /// Objects deleted.
    pub deleted: usize,
}

/// The generation directory of an object key (`.../g<generation>/`), the unit of reference.
fn generation_dir(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(dir, _)| dir)
}

/// One GC pass. `delay` is taken as given (a test may pass zero when no worker runs); the
/// archiver passes its validated [`super::ArchiverConfig::gc_delay`].
pub async fn collect_garbage(
    store: &dyn HotStore,
    archive: &ArchiveStore,
    delay: Duration,
    metrics: &ArchiverMetrics,
) -> Result<GcReport, ArchiverError> {
    let now = Utc::now();
    let objects = archive.list_objects().await?;
    // Claims strictly before routes (see the module comment): never the other way round.
    let mut protected: HashSet<String> = HashSet::new();
    for table in store.tables().await? {
        for meta in store
            .list_buckets(&table.table_id, &BucketFilter::default())
            .await?
        {
            if meta.state == BucketState::Archiving {
                protected.insert(
                    generation_dir(&archive.manifest_key(&meta.id, meta.generation)).to_string(),
                );
            }
        }
    }
    protected.extend(
        store
            .referenced_object_keys()
            .await?
            .iter()
            .map(|k| generation_dir(k).to_string()),
    );
    let mut report = GcReport {
        listed: objects.len(),
        ..GcReport::default()
    };
    for obj in objects {
        if protected.contains(generation_dir(&obj.key)) {
            report.referenced += 1;
            continue;
        }
        let old_enough = obj.last_modified.is_some_and(|m| {
            now.signed_duration_since(m)
                .to_std()
                .is_ok_and(|age| age >= delay)
        });
        if !old_enough {
            report.young += 1;
            continue;
        }
        archive.delete_object(&obj.key).await?;
        metrics.gc_deletions.inc();
        info!(key = %obj.key, "deleted orphaned archive object");
        report.deleted += 1;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::generation_dir;

    #[test]
    fn objects_are_grouped_by_generation_directory() {
        assert_eq!(
            generation_dir("p/v4/t/01/day:2024-01-01/g3/manifest.json"),
            "p/v4/t/01/day:2024-01-01/g3"
        );
        assert_eq!(
            generation_dir("p/v4/t/01/day:2024-01-01/g3/payload.parquet"),
            generation_dir("p/v4/t/01/day:2024-01-01/g3/manifest.json")
        );
        assert_ne!(
            generation_dir("a/g3/manifest.json"),
            generation_dir("a/g31/manifest.json")
        );
    }
}
